//! What changes between two assignments: the cost of a rebalance.

use serde::Serialize;

use crate::model::{Assignment, ShardId};

/// One cluster that changes shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    /// The cluster's id.
    pub cluster: String,
    /// The shard it leaves.
    pub from: ShardId,
    /// The shard it goes to.
    pub to: ShardId,
    /// Apps the receiving shard takes over (counted in the later assignment).
    pub apps: u64,
    /// True when the cluster had to move because its shard is no longer live.
    pub forced: bool,
}

/// Clusters and apps that change shard between two assignments. Clusters present in only one
/// of them are counted apart: they are arrivals and departures, not moves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AssignmentDiff {
    /// Every move, in cluster id order.
    pub moves: Vec<Move>,
    /// Moves whose old shard left (unavoidable).
    pub forced_clusters: usize,
    /// Apps of the forced moves.
    pub forced_apps: u64,
    /// Moves between two shards that are both still live (the strategy's choice).
    pub voluntary_clusters: usize,
    /// Apps of the voluntary moves.
    pub voluntary_apps: u64,
    /// Clusters only in the later assignment.
    pub added_clusters: usize,
    /// Clusters only in the earlier assignment.
    pub removed_clusters: usize,
}

impl AssignmentDiff {
    /// Compares `before` with `after`, cluster by cluster.
    pub fn between(before: &Assignment, after: &Assignment) -> Self {
        let live_after = after.live_shards();
        let mut diff = AssignmentDiff::default();
        for (id, placed) in after.placements() {
            let Some(previous) = before.placements().get(id) else {
                diff.added_clusters += 1;
                continue;
            };
            if previous.shard == placed.shard {
                continue;
            }
            let forced = !live_after.contains(previous.shard);
            if forced {
                diff.forced_clusters += 1;
                diff.forced_apps += placed.apps;
            } else {
                diff.voluntary_clusters += 1;
                diff.voluntary_apps += placed.apps;
            }
            diff.moves.push(Move {
                cluster: id.clone(),
                from: previous.shard,
                to: placed.shard,
                apps: placed.apps,
                forced,
            });
        }
        diff.removed_clusters = before
            .placements()
            .keys()
            .filter(|id| !after.placements().contains_key(*id))
            .count();
        diff
    }

    /// Clusters that change shard, forced or not.
    pub fn clusters_moved(&self) -> usize {
        self.moves.len()
    }

    /// Apps that change shard, forced or not.
    pub fn apps_moved(&self) -> u64 {
        self.forced_apps + self.voluntary_apps
    }
}
