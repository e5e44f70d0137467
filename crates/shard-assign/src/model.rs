//! The inputs and outputs of an assignment: clusters, shard sets, placements and loads.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::strategy::StrategyKind;

/// A shard is identified by the ordinal of the replica that owns it.
pub type ShardId = u32;

/// What an earlier assignment recorded: each cluster's shard and, when known, the load it was
/// placed with, plus the live shards of that time when known. Only `sticky-balanced` reads it;
/// it tells a re-plan with nothing changed (which must move nothing) from one that reacts to a
/// change. Unknown loads or shards count as changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreviousPlacement {
    clusters: BTreeMap<String, RecordedPlacement>,
    shards: Option<ShardSet>,
}

/// One cluster in a [`PreviousPlacement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedPlacement {
    /// The shard the cluster was on.
    pub shard: ShardId,
    /// The load the cluster had when it was placed, if recorded.
    pub load: Option<u64>,
}

impl PreviousPlacement {
    /// A record of nothing: no cluster, and live shards unknown.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `cluster_id` was on `shard`, with the load it had then if known.
    pub fn insert(&mut self, cluster_id: impl Into<String>, shard: ShardId, load: Option<u64>) {
        self.clusters
            .insert(cluster_id.into(), RecordedPlacement { shard, load });
    }

    /// Records the live shards the earlier assignment was made for.
    pub fn with_live_shards(mut self, shards: ShardSet) -> Self {
        self.shards = Some(shards);
        self
    }

    pub(crate) fn get(&self, cluster_id: &str) -> Option<RecordedPlacement> {
        self.clusters.get(cluster_id).copied()
    }

    pub(crate) fn live_shards(&self) -> Option<&ShardSet> {
        self.shards.as_ref()
    }

    /// Clusters recorded.
    pub fn len(&self) -> usize {
        self.clusters.len()
    }

    /// Whether no cluster is recorded.
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty()
    }
}

impl FromIterator<(String, ShardId)> for PreviousPlacement {
    /// Placements read back without loads (e.g. from shard labels).
    fn from_iter<I: IntoIterator<Item = (String, ShardId)>>(iter: I) -> Self {
        let clusters = iter
            .into_iter()
            .map(|(id, shard)| (id, RecordedPlacement { shard, load: None }))
            .collect();
        Self {
            clusters,
            shards: None,
        }
    }
}

/// A destination cluster, as the assignment sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    /// Stable identity (the cluster object's UID). Placement is a function of it, never of the name.
    pub id: String,
    /// Human-readable name, carried along for reports.
    #[serde(default)]
    pub name: String,
    /// Number of apps that target the cluster.
    pub apps: u64,
    /// Shard the operator pinned the cluster to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<ShardId>,
    /// Cost multiplier per app (at least 1); absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl Cluster {
    /// A cluster with no pin and no weight; `name` defaults to the id.
    pub fn new(id: impl Into<String>, apps: u64) -> Self {
        let id = id.into();
        Self {
            name: id.clone(),
            id,
            apps,
            pin: None,
            weight: None,
        }
    }

    /// The load this cluster puts on its shard: apps times weight.
    pub fn load(&self) -> u64 {
        self.apps
            .saturating_mul(u64::from(self.weight.unwrap_or(1)))
    }
}

/// The set of live shard ids, kept sorted and free of duplicates.
///
/// Shards need not be contiguous: `{0, 1, 3}` is the set left when replica 2 is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShardSet {
    ids: Vec<ShardId>,
}

impl ShardSet {
    /// Shards `0..count`, the live set of a healthy StatefulSet of `count` replicas.
    pub fn contiguous(count: u32) -> Self {
        Self {
            ids: (0..count).collect(),
        }
    }

    /// Number of live shards.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no shard is live.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether `shard` is live.
    pub fn contains(&self, shard: ShardId) -> bool {
        self.ids.binary_search(&shard).is_ok()
    }

    /// The ids, in ascending order.
    pub fn as_slice(&self) -> &[ShardId] {
        &self.ids
    }

    /// The ids, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.ids.iter().copied()
    }
}

impl FromIterator<ShardId> for ShardSet {
    fn from_iter<I: IntoIterator<Item = ShardId>>(iter: I) -> Self {
        let mut ids: Vec<ShardId> = iter.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        Self { ids }
    }
}

impl fmt::Display for ShardSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, id) in self.ids.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{id}")?;
        }
        f.write_str("}")
    }
}

/// Where one cluster went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The shard the cluster is on.
    pub shard: ShardId,
    /// The cluster's apps.
    pub apps: u64,
    /// The cluster's load: apps times weight.
    pub load: u64,
    /// True when the cluster sits on its live pin rather than where the strategy put it.
    pub pinned: bool,
}

/// What one shard carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShardLoad {
    /// Clusters on the shard.
    pub clusters: u64,
    /// Apps of those clusters.
    pub apps: u64,
    /// Apps times cluster weight: the quantity the load-aware strategies balance.
    pub load: u64,
}

/// Something the caller should know about, that did not stop the assignment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Warning {
    /// The cluster is pinned to a shard that is not live, so the strategy placed it.
    PinNotLive {
        /// The cluster's id.
        cluster: String,
        /// The shard it is pinned to.
        pin: ShardId,
        /// The live shard the strategy put it on.
        placed_on: ShardId,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::PinNotLive {
                cluster,
                pin,
                placed_on,
            } => write!(
                f,
                "cluster {cluster:?} is pinned to shard {pin}, which is not live; placed on shard {placed_on} until it is"
            ),
        }
    }
}

/// Balance of load across shards. Every live shard counts, empty ones included.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Balance {
    /// Heaviest shard over the mean: 1.0 is perfect.
    pub max_over_mean: f64,
    /// (heaviest - lightest) over the mean: 0.0 is perfect.
    pub spread_over_mean: f64,
    /// Coefficient of variation (population standard deviation over the mean).
    pub cv: f64,
}

impl Balance {
    /// Balance of a list of shard loads. No load at all counts as perfectly balanced.
    pub fn of_loads(loads: &[u64]) -> Self {
        let n = loads.len() as f64;
        let total: u64 = loads.iter().sum();
        if loads.is_empty() || total == 0 {
            return Self {
                max_over_mean: 1.0,
                spread_over_mean: 0.0,
                cv: 0.0,
            };
        }
        let mean = total as f64 / n;
        let max = loads.iter().copied().max().unwrap_or(0) as f64;
        let min = loads.iter().copied().min().unwrap_or(0) as f64;
        let variance = loads
            .iter()
            .map(|&l| (l as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        Self {
            max_over_mean: max / mean,
            spread_over_mean: (max - min) / mean,
            cv: variance.sqrt() / mean,
        }
    }
}

/// The result of an assignment: every cluster on exactly one live shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub(crate) strategy: StrategyKind,
    pub(crate) placements: BTreeMap<String, Placement>,
    pub(crate) shards: BTreeMap<ShardId, ShardLoad>,
    pub(crate) warnings: Vec<Warning>,
}

impl Assignment {
    /// The strategy that made this assignment.
    pub fn strategy(&self) -> StrategyKind {
        self.strategy
    }

    /// The shard of a cluster, by id.
    pub fn shard_of(&self, cluster_id: &str) -> Option<ShardId> {
        self.placements.get(cluster_id).map(|p| p.shard)
    }

    /// Every cluster's placement, by cluster id.
    pub fn placements(&self) -> &BTreeMap<String, Placement> {
        &self.placements
    }

    /// Load of every live shard (empty shards included), by shard id.
    pub fn shard_loads(&self) -> &BTreeMap<ShardId, ShardLoad> {
        &self.shards
    }

    /// What the caller should know about: pins to shards that are not live.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The live shards this assignment was computed for.
    pub fn live_shards(&self) -> ShardSet {
        self.shards.keys().copied().collect()
    }

    /// Balance of the weighted load across live shards.
    pub fn balance(&self) -> Balance {
        let loads: Vec<u64> = self.shards.values().map(|s| s.load).collect();
        Balance::of_loads(&loads)
    }

    /// This assignment as the previous one of a later `sticky-balanced` run.
    pub fn to_previous(&self) -> PreviousPlacement {
        let clusters = self
            .placements
            .iter()
            .map(|(id, p)| {
                let recorded = RecordedPlacement {
                    shard: p.shard,
                    load: Some(p.load),
                };
                (id.clone(), recorded)
            })
            .collect();
        PreviousPlacement {
            clusters,
            shards: Some(self.live_shards()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_read_back_from_labels_has_every_cluster_and_no_load() {
        let read: PreviousPlacement = [("a".to_string(), 2), ("b".to_string(), 0)]
            .into_iter()
            .collect();
        assert_eq!((read.len(), read.is_empty()), (2, false));
        assert_eq!(
            read.get("a"),
            Some(RecordedPlacement {
                shard: 2,
                load: None
            })
        );
        assert_eq!(read.get("b").map(|p| p.shard), Some(0));
        assert_eq!(read.live_shards(), None);
        assert!(PreviousPlacement::new().is_empty());
    }

    #[test]
    fn balance_reports_the_heaviest_the_spread_and_the_variation_over_the_mean() {
        let b = Balance::of_loads(&[10, 20, 30]);
        assert_eq!((b.max_over_mean, b.spread_over_mean), (1.5, 1.0));
        assert!(
            (b.cv - (200.0f64 / 3.0).sqrt() / 20.0).abs() < 1e-12,
            "{b:?}"
        );
        let skewed = Balance::of_loads(&[0, 0, 9]);
        assert_eq!((skewed.max_over_mean, skewed.spread_over_mean), (3.0, 3.0));
        assert!((skewed.cv - 18f64.sqrt() / 3.0).abs() < 1e-12, "{skewed:?}");
        let perfect = Balance {
            max_over_mean: 1.0,
            spread_over_mean: 0.0,
            cv: 0.0,
        };
        for loads in [&[][..], &[0, 0], &[5, 5, 5]] {
            assert_eq!(Balance::of_loads(loads), perfect, "{loads:?}");
        }
    }

    #[test]
    fn a_shard_set_lists_its_ids_once_in_order() {
        let set: ShardSet = [4, 0, 2, 4].into_iter().collect();
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(set.to_string(), "{0, 2, 4}");
        assert_eq!(ShardSet::contiguous(1).to_string(), "{0}");
        assert_eq!(ShardSet::contiguous(0).to_string(), "{}");
    }
}
