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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Cluster, ShardSet};
    use crate::strategy::StrategyKind;

    /// Every cluster pinned: `(id, apps, shard)` placed exactly there on `shards` live shards.
    fn placed(clusters: &[(&str, u64, ShardId)], shards: u32) -> Assignment {
        let clusters: Vec<Cluster> = clusters
            .iter()
            .map(|&(id, apps, shard)| Cluster {
                pin: Some(shard),
                ..Cluster::new(id, apps)
            })
            .collect();
        crate::assign(
            &StrategyKind::LegacyModulo.into(),
            &clusters,
            &ShardSet::contiguous(shards),
            None,
        )
        .expect("pinned clusters place")
    }

    #[test]
    fn moves_are_forced_when_their_shard_left_and_counted_with_their_new_apps() {
        let before = placed(&[("a", 3, 0), ("b", 5, 1), ("c", 7, 2), ("d", 11, 2)], 3);
        // Shard 2 leaves: c must move (and grew to 13 apps), a moves by choice, b stays, d is
        // gone and e arrives.
        let after = placed(&[("a", 3, 1), ("b", 5, 1), ("c", 13, 0), ("e", 2, 0)], 2);
        let diff = AssignmentDiff::between(&before, &after);
        assert_eq!(
            diff.moves,
            [
                Move {
                    cluster: "a".into(),
                    from: 0,
                    to: 1,
                    apps: 3,
                    forced: false,
                },
                Move {
                    cluster: "c".into(),
                    from: 2,
                    to: 0,
                    apps: 13,
                    forced: true,
                },
            ]
        );
        assert_eq!((diff.forced_clusters, diff.forced_apps), (1, 13));
        assert_eq!((diff.voluntary_clusters, diff.voluntary_apps), (1, 3));
        assert_eq!((diff.added_clusters, diff.removed_clusters), (1, 1));
        assert_eq!((diff.clusters_moved(), diff.apps_moved()), (2, 16));
        assert_eq!(
            AssignmentDiff::between(&after, &after),
            AssignmentDiff::default()
        );
    }
}
