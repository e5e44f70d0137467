//! An assignment in progress: the state every strategy works on. Strategies depend on this
//! module and the engine on both, so that no module imports one that imports it back.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Assignment, Cluster, Placement, ShardId, ShardLoad, Warning};
use crate::strategy::StrategyKind;

/// Shard positions ordered by load (ties: lowest position, i.e. lowest shard id), kept in step
/// with the draft as clusters are placed.
#[derive(Debug)]
pub(crate) struct LoadOrder {
    by_load: BTreeSet<(u64, usize)>,
}

impl LoadOrder {
    pub(crate) fn of(draft: &Draft<'_>) -> Self {
        Self {
            by_load: draft
                .loads()
                .iter()
                .enumerate()
                .map(|(position, &load)| (load, position))
                .collect(),
        }
    }

    /// The lightest shard: its load and position.
    pub(crate) fn lightest(&self) -> Option<(u64, usize)> {
        self.by_load.first().copied()
    }

    /// Places cluster `index` on `position` and updates the order.
    pub(crate) fn place(&mut self, draft: &mut Draft<'_>, index: usize, position: usize) {
        self.by_load.remove(&(draft.loads()[position], position));
        draft.place(index, position);
        self.by_load.insert((draft.loads()[position], position));
    }
}

/// Assignment in progress. Clusters are addressed by their index in id order, shards by their
/// position in the sorted live set.
#[derive(Debug)]
pub(crate) struct Draft<'a> {
    clusters: Vec<&'a Cluster>,
    shards: &'a [ShardId],
    shard_of: Vec<Option<usize>>,
    pinned: Vec<bool>,
    loads: Vec<u64>,
    total_load: u64,
}

impl<'a> Draft<'a> {
    pub(crate) fn new(clusters: Vec<&'a Cluster>, shards: &'a [ShardId]) -> Self {
        let total_load = clusters
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(c.load()));
        Self {
            shard_of: vec![None; clusters.len()],
            pinned: vec![false; clusters.len()],
            loads: vec![0; shards.len()],
            clusters,
            shards,
            total_load,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.clusters.len()
    }

    pub(crate) fn cluster(&self, index: usize) -> &'a Cluster {
        self.clusters[index]
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn shard_ids(&self) -> &[ShardId] {
        self.shards
    }

    pub(crate) fn shard_id(&self, position: usize) -> ShardId {
        self.shards[position]
    }

    pub(crate) fn position_of(&self, shard: ShardId) -> Option<usize> {
        self.shards.binary_search(&shard).ok()
    }

    /// Sum of every cluster's load, placed or not.
    pub(crate) fn total_load(&self) -> u64 {
        self.total_load
    }

    pub(crate) fn loads(&self) -> &[u64] {
        &self.loads
    }

    pub(crate) fn shard_of(&self, index: usize) -> Option<usize> {
        self.shard_of[index]
    }

    /// Marks cluster `index` as placed by its pin: strategies leave it where it is.
    pub(crate) fn pin(&mut self, index: usize) {
        self.pinned[index] = true;
    }

    pub(crate) fn is_pinned(&self, index: usize) -> bool {
        self.pinned[index]
    }

    /// Indices of the clusters not placed yet, in id order.
    pub(crate) fn unplaced(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.shard_of[i].is_none())
            .collect()
    }

    /// Sorts cluster indices heaviest first, ties by id: the order of largest-first bin packing.
    pub(crate) fn sort_largest_first(&self, indices: &mut [usize]) {
        indices.sort_unstable_by(|&a, &b| {
            self.clusters[b]
                .load()
                .cmp(&self.clusters[a].load())
                .then(a.cmp(&b))
        });
    }

    pub(crate) fn place(&mut self, index: usize, position: usize) {
        if let Some(old) = self.shard_of[index] {
            self.loads[old] -= self.clusters[index].load();
        }
        self.shard_of[index] = Some(position);
        self.loads[position] = self.loads[position].saturating_add(self.clusters[index].load());
    }

    /// The lightest shard position, ties to the lowest shard id.
    pub(crate) fn lightest_shard(&self) -> usize {
        (0..self.loads.len())
            .min_by_key(|&p| (self.loads[p], p))
            .unwrap_or(0)
    }

    pub(crate) fn finish(self, strategy: StrategyKind) -> Assignment {
        let mut shards: BTreeMap<ShardId, ShardLoad> = self
            .shards
            .iter()
            .map(|&s| (s, ShardLoad::default()))
            .collect();
        // Clusters are in id order, so collecting into the map is a linear bulk build.
        let mut placements = Vec::with_capacity(self.clusters.len());
        let mut warnings = Vec::new();
        for (index, cluster) in self.clusters.iter().enumerate() {
            let position = self.shard_of[index].unwrap_or(0);
            let shard = self.shards[position];
            if let Some(pin) = cluster.pin
                && !self.pinned[index]
            {
                warnings.push(Warning::PinNotLive {
                    cluster: cluster.id.clone(),
                    pin,
                    placed_on: shard,
                });
            }
            let load = cluster.load();
            if let Some(entry) = shards.get_mut(&shard) {
                entry.clusters += 1;
                entry.apps = entry.apps.saturating_add(cluster.apps);
                entry.load = entry.load.saturating_add(load);
            }
            placements.push((
                cluster.id.clone(),
                Placement {
                    shard,
                    apps: cluster.apps,
                    load,
                    pinned: self.pinned[index],
                },
            ));
        }
        Assignment {
            strategy,
            placements: placements.into_iter().collect(),
            shards,
            warnings,
        }
    }
}
