//! `bounded-load`: consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
//! arXiv 1608.01350).
//!
//! Every live shard puts `virtual_nodes` points on a ring; a cluster hashes to a point and walks
//! clockwise to the first shard that can take it without going over the cap
//! `ceil(c * total_load / shards)`. When no shard can, the lightest shard takes it.
//!
//! Guarantee (checked by property tests): every shard's load is at most
//! `max(pinned load of the shard, cap, floor(total_load / shards) + largest unpinned cluster)`.
//! A cluster placed by the walk leaves its shard within the cap; one placed on the lightest
//! shard finds it at or under the mean of what was placed before it.
//!
//! The ring is built once (`O(S·V log S·V)`); each cluster costs one binary search plus a walk
//! that ends at the first shard with room, and a fallback test in `O(log S)` avoids walking a
//! ring where no shard has room.

use crate::draft::{Draft, LoadOrder};
use crate::hashing::{key_point, virtual_node_point};
use crate::strategy::StrategyConfig;

/// Virtual nodes of the live shards, sorted by point.
#[derive(Debug)]
pub(crate) struct Ring {
    points: Vec<(u64, usize)>,
}

impl Ring {
    pub(crate) fn build(draft: &Draft<'_>, virtual_nodes: u32) -> Self {
        let mut points = Vec::with_capacity(draft.shard_count() * virtual_nodes as usize);
        for position in 0..draft.shard_count() {
            let shard = draft.shard_id(position);
            for vnode in 0..virtual_nodes {
                points.push((virtual_node_point(shard, vnode), position));
            }
        }
        // Ties between equal points (never seen in practice) go to the lower shard id.
        points.sort_unstable();
        Self { points }
    }

    /// Shard positions met walking clockwise from `key`, starting at the first point at or
    /// after it and wrapping around once.
    pub(crate) fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|&(point, _)| point < key);
        self.points[start..]
            .iter()
            .chain(&self.points[..start])
            .map(|&(_, position)| position)
    }
}

/// The cap `ceil(c * total_load / shards)` of the current draft.
pub(crate) fn cap(draft: &Draft<'_>, config: &StrategyConfig) -> u64 {
    config
        .load_factor
        .mul_div_ceil(draft.total_load(), draft.shard_count() as u64)
}

pub(crate) fn place(draft: &mut Draft<'_>, config: &StrategyConfig) {
    let cap = cap(draft, config);
    let ring = Ring::build(draft, config.virtual_nodes);
    let mut order = LoadOrder::of(draft);
    for index in draft.unplaced() {
        let cluster = draft.cluster(index);
        let load = cluster.load();
        let Some((lightest_load, lightest)) = order.lightest() else {
            return;
        };
        let target = if lightest_load.saturating_add(load) > cap {
            lightest
        } else {
            // The lightest shard has room, so the walk ends at the latest on its points.
            ring.walk(key_point(&cluster.id))
                .find(|&position| draft.loads()[position].saturating_add(load) <= cap)
                .unwrap_or(lightest)
        };
        order.place(draft, index, target);
    }
}
