//! Assignment of slices: cut the clusters that are too big for one shard ([`slice_fleet`]),
//! then place every slice with the chosen strategy as if it were a cluster of its own.
//!
//! A cluster that is not cut keeps its own id as its one unit, so that a fleet nothing needs to
//! cut is assigned exactly as without slicing. `legacy-modulo` and `round-robin` never cut (they
//! exist to place clusters as Argo CD does).

use std::collections::{BTreeMap, BTreeSet};

use crate::engine::assign;
use crate::error::AssignError;
use crate::model::{Assignment, Cluster, PreviousPlacement, ShardId, ShardSet};
use crate::slicing::{AppKeys, KeyRange, SliceConfig, Slicing, count_in, slice_fleet};
use crate::strategy::{StrategyConfig, StrategyKind};

/// The unit id of a slice: the cluster's id when the slice is the whole cluster,
/// `<cluster id>#<range>` otherwise.
pub fn slice_id(cluster_id: &str, range: KeyRange) -> String {
    if range == KeyRange::WHOLE {
        cluster_id.to_string()
    } else {
        format!("{cluster_id}#{range}")
    }
}

/// Where every slice went, and how the clusters were cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicedAssignment {
    /// The placement of every slice, by [`slice_id`].
    pub assignment: Assignment,
    pub slicing: Slicing,
    /// Slice ids by cluster id, in range order.
    pub units: BTreeMap<String, Vec<(KeyRange, String)>>,
}

impl SlicedAssignment {
    /// An assignment of whole clusters, seen as one where nothing is cut.
    pub fn uncut(assignment: Assignment) -> Self {
        let units = assignment
            .placements()
            .keys()
            .map(|id| (id.clone(), vec![(KeyRange::WHOLE, id.clone())]))
            .collect();
        Self {
            assignment,
            slicing: Slicing::default(),
            units,
        }
    }

    /// The shards holding a slice of `cluster_id`.
    pub fn shards_of(&self, cluster_id: &str) -> BTreeSet<ShardId> {
        self.units
            .get(cluster_id)
            .into_iter()
            .flatten()
            .filter_map(|(_, unit)| self.assignment.shard_of(unit))
            .collect()
    }

    /// Caches of a cluster beyond its first: the (cluster, shard) pairs beyond one per cluster.
    /// Each costs the replica another watch of that cluster, and its API server another client.
    pub fn cache_copies(&self) -> usize {
        self.units
            .keys()
            .map(|id| self.shards_of(id).len().saturating_sub(1))
            .sum()
    }
}

/// What changed owner between two sliced assignments, counted per app: a slice that is cut or
/// merged moves only the apps whose shard actually changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceMoves {
    /// Clusters with at least one app on another shard.
    pub clusters: u64,
    /// Of those, clusters with an app that left a shard that is still live.
    pub voluntary_clusters: u64,
    pub apps: u64,
    /// Apps that left a shard that is still live (the strategy's choice, not forced).
    pub voluntary_apps: u64,
}

impl SlicedAssignment {
    /// The moves from `before` to `self`. Clusters only in one of them move nothing.
    pub fn moves_since(&self, before: &SlicedAssignment, keys: &AppKeys) -> SliceMoves {
        let live = self.assignment.live_shards();
        let mut moves = SliceMoves::default();
        for (cluster, after) in &self.units {
            let Some(previous) = before.units.get(cluster) else {
                continue;
            };
            let (mut moved, mut voluntary) = (false, false);
            for (range, unit) in after {
                for (earlier_range, earlier_unit) in previous {
                    // Aligned ranges either nest or do not meet.
                    let common = if range.within(*earlier_range) {
                        *range
                    } else if earlier_range.within(*range) {
                        *earlier_range
                    } else {
                        continue;
                    };
                    let (Some(now), Some(then)) = (
                        self.assignment.shard_of(unit),
                        before.assignment.shard_of(earlier_unit),
                    ) else {
                        continue;
                    };
                    if now == then {
                        continue;
                    }
                    let apps = match keys.get(cluster) {
                        Some(k) => count_in(k, common),
                        None => self.assignment.placements().get(unit).map_or(0, |p| p.apps),
                    };
                    moved = true;
                    moves.apps += apps;
                    if live.contains(then) {
                        voluntary = true;
                        moves.voluntary_apps += apps;
                    }
                }
            }
            moves.clusters += u64::from(moved);
            moves.voluntary_clusters += u64::from(voluntary);
        }
        moves
    }
}

/// Whether `kind` may cut clusters.
pub fn slices(kind: StrategyKind) -> bool {
    !matches!(kind, StrategyKind::LegacyModulo | StrategyKind::RoundRobin)
}

/// Cuts the clusters that need it and places every slice. `previous` records earlier
/// placements by unit id, and `previous_slicing` the cut they were made with: a new slice
/// inherits the placement of the slice it was cut from, a merged one that of its heaviest part,
/// and the lower half of a fresh cut stays where its slice was.
pub fn assign_sliced(
    config: &StrategyConfig,
    slice_config: &SliceConfig,
    clusters: &[Cluster],
    keys: &AppKeys,
    shards: &ShardSet,
    previous: Option<&PreviousPlacement>,
    previous_slicing: &Slicing,
) -> Result<SlicedAssignment, AssignError> {
    let slicing = if slices(config.kind) {
        slice_fleet(clusters, keys, shards.len(), previous_slicing, slice_config)
    } else {
        Slicing::default()
    };
    let mut units = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut recorded = PreviousPlacement::new();
    for cluster in clusters {
        let cut = slicing.slices_of(&cluster.id);
        let mut ids = Vec::with_capacity(cut.len());
        for &range in cut {
            let id = slice_id(&cluster.id, range);
            let apps = match keys.get(&cluster.id) {
                Some(k) if range != KeyRange::WHOLE => count_in(k, range),
                _ => cluster.apps,
            };
            let mut pin = cluster.pin;
            if let Some(previous) = previous {
                let before = previous_slicing.slices_of(&cluster.id);
                match inherited(previous, &cluster.id, range, before, keys.get(&cluster.id)) {
                    Inherited::Same(placement) => {
                        recorded.insert(id.clone(), placement.shard, placement.load)
                    }
                    Inherited::From(shard, fresh_lower_half) => {
                        recorded.insert(id.clone(), shard, None);
                        if fresh_lower_half && shards.contains(shard) {
                            pin = Some(shard);
                        }
                    }
                    Inherited::Nothing => {}
                }
            }
            inputs.push(Cluster {
                id: id.clone(),
                name: if range == KeyRange::WHOLE {
                    cluster.name.clone()
                } else {
                    format!("{}#{range}", cluster.name)
                },
                apps,
                pin,
                weight: cluster.weight,
            });
            ids.push((range, id));
        }
        units.insert(cluster.id.clone(), ids);
    }
    if let Some(live) = previous.and_then(PreviousPlacement::live_shards) {
        recorded = recorded.with_live_shards(live.clone());
    }
    let assignment = assign(config, &inputs, shards, previous.map(|_| &recorded))?;
    Ok(SlicedAssignment {
        assignment,
        slicing,
        units,
    })
}

/// What a slice inherits from the previous placement.
enum Inherited {
    /// The same slice was placed before.
    Same(crate::model::RecordedPlacement),
    /// A new slice: the shard of the slice it was cut from (and whether it is the lower half of
    /// a fresh cut, which stays there), or of the heaviest part it merges.
    From(ShardId, bool),
    Nothing,
}

fn inherited(
    previous: &PreviousPlacement,
    cluster_id: &str,
    range: KeyRange,
    before: &[KeyRange],
    keys: Option<&Vec<u64>>,
) -> Inherited {
    if before.contains(&range) {
        return previous
            .get(&slice_id(cluster_id, range))
            .map_or(Inherited::Nothing, Inherited::Same);
    }
    // Cut from an earlier, larger slice.
    if let Some(&ancestor) = before.iter().find(|&&b| range.within(b)) {
        let Some(placement) = previous.get(&slice_id(cluster_id, ancestor)) else {
            return Inherited::Nothing;
        };
        let lower_half = range.start() == ancestor.start();
        return Inherited::From(placement.shard, lower_half);
    }
    // Merged from earlier, smaller slices: where most of its apps were.
    let heaviest = before
        .iter()
        .filter(|b| b.within(range))
        .filter_map(|&b| {
            let placement = previous.get(&slice_id(cluster_id, b))?;
            let apps = keys.map_or(0, |k| count_in(k, b));
            Some((apps, std::cmp::Reverse(b), placement.shard))
        })
        .max();
    heaviest.map_or(Inherited::Nothing, |(_, _, shard)| {
        Inherited::From(shard, false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slicing::app_key;

    /// A UID as the API server makes them: a random (here: derived) version-4 UUID. Only
    /// random UIDs spread evenly over the key space; FNV-1a of `app-1`, `app-2`, ... does not.
    fn uid(cluster: &str, n: u64) -> String {
        let a = app_key(&format!("{cluster}/{n}/a"));
        let b = app_key(&format!("{cluster}/{n}/b"));
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    /// A cluster with `apps` apps, and their keys.
    fn cluster(id: &str, apps: u64, keys: &mut AppKeys) -> Cluster {
        let mut k: Vec<u64> = (0..apps).map(|n| app_key(&uid(id, n))).collect();
        k.sort_unstable();
        keys.insert(id.to_string(), k);
        Cluster::new(id, apps)
    }

    fn sticky() -> StrategyConfig {
        StrategyConfig::new(StrategyKind::StickyBalanced)
    }

    /// A first assignment, with slicing on.
    fn fresh(
        config: &StrategyConfig,
        clusters: &[Cluster],
        keys: &AppKeys,
        shards: &ShardSet,
    ) -> SlicedAssignment {
        let slicing = SliceConfig::enabled();
        assign_sliced(
            config,
            &slicing,
            clusters,
            keys,
            shards,
            None,
            &Slicing::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_hot_cluster_is_cut_and_spread_and_the_rest_stay_whole() {
        let mut keys = AppKeys::new();
        let mut clusters = vec![cluster("hot", 600, &mut keys)];
        for i in 0..8 {
            clusters.push(cluster(&format!("c{i}"), 50, &mut keys));
        }
        let shards = ShardSet::contiguous(4);
        let whole = assign(&sticky(), &clusters, &shards, None).unwrap();
        let sliced = fresh(&sticky(), &clusters, &keys, &shards);
        assert!(whole.balance().max_over_mean > 2.0);
        assert!(
            sliced.assignment.balance().max_over_mean < 1.3,
            "{:?}",
            sliced.assignment.shard_loads()
        );
        let cut = sliced.slicing.slices_of("hot");
        assert!(cut.len() >= 4, "{cut:?}");
        assert_eq!(sliced.slicing.slices_of("c0"), [KeyRange::WHOLE]);
        assert!(sliced.cache_copies() >= 3 && sliced.cache_copies() < cut.len());
        let apps: u64 = sliced
            .assignment
            .placements()
            .values()
            .map(|p| p.apps)
            .sum();
        assert_eq!(apps, 1000, "every app in exactly one slice");
    }

    #[test]
    fn without_need_or_for_argo_cds_strategies_nothing_is_cut() {
        let mut keys = AppKeys::new();
        let clusters: Vec<Cluster> = (0..6)
            .map(|i| cluster(&format!("c{i}"), 100, &mut keys))
            .collect();
        let shards = ShardSet::contiguous(3);
        let sliced = fresh(&sticky(), &clusters, &keys, &shards);
        assert_eq!(sliced.slicing, Slicing::default());
        assert_eq!(
            sliced.assignment,
            assign(&sticky(), &clusters, &shards, None).unwrap()
        );
        let mut hot = clusters.clone();
        hot.push(cluster("hot", 5000, &mut keys));
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let result = fresh(&legacy, &hot, &keys, &shards);
        assert_eq!(result.slicing, Slicing::default());
    }

    #[test]
    fn a_fresh_cut_keeps_its_lower_half_in_place_and_replanning_moves_nothing() {
        let mut keys = AppKeys::new();
        let mut clusters = vec![cluster("hot", 100, &mut keys)];
        for i in 0..6 {
            clusters.push(cluster(&format!("c{i}"), 40, &mut keys));
        }
        let shards = ShardSet::contiguous(3);
        let first = assign(&sticky(), &clusters, &shards, None).unwrap();
        let hot_shard = first.shard_of("hot").unwrap();
        // The hot cluster grows past the per-shard target.
        let mut grown = clusters.clone();
        grown[0] = cluster("hot", 900, &mut keys);
        let cut = assign_sliced(
            &sticky(),
            &SliceConfig::enabled(),
            &grown,
            &keys,
            &shards,
            Some(&first.to_previous()),
            &Slicing::default(),
        )
        .unwrap();
        let slices = cut.slicing.slices_of("hot");
        assert!(slices.len() > 1);
        assert_eq!(
            cut.assignment.shard_of(&slice_id("hot", slices[0])),
            Some(hot_shard)
        );
        // Planning again on its own output, nothing changed: nothing moves, nothing is re-cut.
        let again = assign_sliced(
            &sticky(),
            &SliceConfig::enabled(),
            &grown,
            &keys,
            &shards,
            Some(&cut.assignment.to_previous()),
            &cut.slicing,
        )
        .unwrap();
        assert_eq!(again.slicing, cut.slicing);
        assert_eq!(again.moves_since(&cut, &keys), SliceMoves::default());
        let shards_of = |a: &SlicedAssignment| -> Vec<(String, ShardId)> {
            a.assignment
                .placements()
                .iter()
                .map(|(id, p)| (id.clone(), p.shard))
                .collect()
        };
        assert_eq!(shards_of(&again), shards_of(&cut));
    }
}
