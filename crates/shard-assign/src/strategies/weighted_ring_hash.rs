//! `weighted-ring-hash`: a consistent-hash ring (the `hashring` crate, hashed with xxHash64 and a
//! fixed seed) whose shards accept clusters less readily as their load grows.
//!
//! Weighting rule. Clusters are taken largest first (ties by id). A cluster probes the ring with
//! the keys `(id, 0)`, `(id, 1)`, …; the probe lands on some shard `s`, which accepts the cluster
//! with probability
//!
//! ```text
//!     p(s) = ((T + N·L_min) / (T + N·L_s))²
//! ```
//!
//! where `T` is the total load of all clusters, `N` the number of live shards, `L_s` the load
//! placed on `s` so far and `L_min` that of the lightest shard. Equivalently, a shard's weight is
//! `(M / (M + L_s))²` with `M = T/N` the final mean, normalised so the lightest shard always
//! accepts: an empty shard keeps its full share of the ring, a shard at the mean keeps a quarter
//! of it. The coin is a hash of `(id, attempt)`, so every replica flips the same coins. After 64
//! rejected probes the lightest shard takes the cluster.
//!
//! Probes keep the ring fixed (no rebuild per cluster): `O(S·V log S·V)` to build, then an
//! expected handful of `O(log S·V)` lookups per cluster.

use std::hash::{Hash, Hasher};

use hashring::HashRing;

use crate::draft::{Draft, LoadOrder};
use crate::hashing::{draw, ring_hasher};
use crate::model::ShardId;
use crate::strategy::StrategyConfig;

const MAX_PROBES: u32 = 64;

/// One point of a shard on the ring. Hashed as two fixed-width integers so that no two
/// (shard, index) pairs can produce the same input bytes.
#[derive(Clone, Copy, Debug)]
struct VirtualNode {
    shard: ShardId,
    index: u32,
    position: usize,
}

impl Hash for VirtualNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.shard.to_le_bytes());
        state.write(&self.index.to_le_bytes());
    }
}

/// The ring key of a cluster's `attempt`-th probe.
#[derive(Clone, Copy, Debug)]
struct Probe<'a> {
    cluster_id: &'a [u8],
    attempt: u32,
}

impl Hash for Probe<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.cluster_id);
        state.write(&self.attempt.to_le_bytes());
    }
}

/// Acceptance probability in units of 2^-32: `((T + N·L_min) / (T + N·L_s))²`, in integers.
fn acceptance(total: u64, shards: u64, lightest: u64, load: u64) -> u128 {
    const ONE: u128 = 1 << 32;
    let numerator = u128::from(total) + u128::from(shards) * u128::from(lightest);
    let denominator = u128::from(total) + u128::from(shards) * u128::from(load);
    if denominator == 0 || numerator >= denominator {
        return ONE;
    }
    let ratio = numerator * ONE / denominator;
    ratio * ratio / ONE
}

pub(crate) fn place(draft: &mut Draft<'_>, config: &StrategyConfig) {
    let mut ring = HashRing::with_hasher(ring_hasher());
    let nodes = (0..draft.shard_count())
        .flat_map(|position| {
            let shard = draft.shard_id(position);
            (0..config.virtual_nodes).map(move |index| VirtualNode {
                shard,
                index,
                position,
            })
        })
        .collect();
    ring.batch_add(nodes);

    let total = draft.total_load();
    let shard_count = draft.shard_count() as u64;
    let mut by_load = LoadOrder::of(draft);
    let mut order = draft.unplaced();
    draft.sort_largest_first(&mut order);
    for index in order {
        let Some((lightest_load, lightest)) = by_load.lightest() else {
            return;
        };
        let id = draft.cluster(index).id.as_str();
        let target = (0..MAX_PROBES)
            .find_map(|attempt| {
                let probe = Probe {
                    cluster_id: id.as_bytes(),
                    attempt,
                };
                let node = ring.get(&probe)?;
                let chance = acceptance(
                    total,
                    shard_count,
                    lightest_load,
                    draft.loads()[node.position],
                );
                let coin = u128::from(draw(id, attempt) >> 32);
                (coin < chance).then_some(node.position)
            })
            .unwrap_or(lightest);
        by_load.place(draft, index, target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lightest_shard_always_accepts_and_heavier_ones_less() {
        let one = 1u128 << 32;
        assert_eq!(acceptance(1000, 10, 50, 50), one);
        // At the mean (L = T/N = 100) with an empty lightest shard: (1000 / 2000)^2 = 1/4.
        assert_eq!(acceptance(1000, 10, 0, 100), one / 4);
        assert!(acceptance(1000, 10, 0, 200) < acceptance(1000, 10, 0, 100));
        assert_eq!(acceptance(0, 10, 0, 0), one);
    }
}
