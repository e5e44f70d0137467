//! `argocd-consistent-hashing`: Argo CD's `consistent-hashing` sharding algorithm (v3.5.1,
//! `controller/sharding/consistent/consistent.go` and `createConsistentHashingWithBoundLoads` in
//! `controller/sharding/sharding.go`), reproduced bit for bit for live shards `0..N`.
//!
//! The rule:
//! - Shard position `p` is named by its decimal digits and puts 1000 points on a ring, the
//!   BLAKE2b points of `"{p}{i}"` for `i` in `0..1000`. Names are concatenated without a
//!   separator, so from 12 shards on some keys coincide (`"1"+"10"` is `"11"+"0"`); such a point
//!   belongs to the higher position, which Argo CD adds last and so overwrites.
//! - Every cluster, pinned or not, is taken in byte order of its id. It starts at the first point
//!   strictly after the point of its id (wrapping around) and walks clockwise to the first shard
//!   whose app count is under `ceil(1.25 · max(1, ⌊(placed + 1) / N⌋))`, where `placed` is the
//!   number of apps placed so far. Its apps then count on that shard.
//! - A live pin wins over the ring, but the pinned cluster's apps still count on the shard the
//!   ring gave it. A pin to a shard that is not live sends the cluster to the first live shard,
//!   as Argo CD sends a pin at or above the replica count to shard 0.
//!
//! Load is the app count: Argo CD has no weights, so [`Cluster::weight`](crate::Cluster) is
//! ignored here, as are the ring size and load factor of the configuration (Argo CD's are fixed).
//! Argo CD rebuilds the ring and replays every cluster for each lookup; all lookups of one
//! snapshot give the same map, so building it once gives the same placement. With a gap in the
//! live set, positions index the sorted live shards, as in `legacy-modulo`.

use crate::draft::Draft;
use crate::hashing::blake2b_point;

/// Points per shard (`replicationFactor` of Argo CD's `consistent.New`).
const VIRTUAL_NODES: u32 = 1000;

/// The distinct points of every shard position, sorted.
#[derive(Debug)]
struct Ring {
    points: Vec<(u64, usize)>,
}

impl Ring {
    fn build(shard_count: usize) -> Self {
        let mut points = Vec::with_capacity(shard_count * VIRTUAL_NODES as usize);
        for position in 0..shard_count {
            for vnode in 0..VIRTUAL_NODES {
                let key = format!("{position}{vnode}");
                points.push((blake2b_point(key.as_bytes()), position));
            }
        }
        // One owner per point: the highest position, the last one Argo CD wrote.
        points.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        points.dedup_by_key(|&mut (point, _)| point);
        Self { points }
    }

    /// Shard positions met walking clockwise from the first point strictly after `key`,
    /// wrapping around once.
    fn walk(&self, key: u64) -> impl Iterator<Item = usize> + '_ {
        let start = self.points.partition_point(|&(point, _)| point <= key);
        self.points[start..]
            .iter()
            .chain(&self.points[..start])
            .map(|&(_, position)| position)
    }
}

/// The bound of Argo CD's `loadOK`: a shard takes a cluster while its app count is under
/// `ceil(1.25 · max(1, ⌊(placed + 1) / shards⌋))`. Go computes the product in float64, which is
/// exact for any count below 2^50, where it equals this integer form.
fn cap(placed: u64, shard_count: usize) -> u64 {
    let mean = (placed.saturating_add(1) / shard_count as u64).max(1);
    mean.saturating_add(mean.div_ceil(4))
}

/// The shard the ring gives each cluster (by index), replaying Argo CD's walk over all of them.
fn ring_positions(draft: &Draft<'_>) -> Vec<usize> {
    let shard_count = draft.shard_count();
    let ring = Ring::build(shard_count);
    let mut apps = vec![0u64; shard_count];
    let mut placed = 0u64;
    (0..draft.len())
        .map(|index| {
            let cluster = draft.cluster(index);
            let cap = cap(placed, shard_count);
            // The lightest shard is always under the cap (its count is at most the mean) and
            // keeps points of its own (its one-digit keys never coincide), so the walk ends
            // within one turn; the fallback only keeps this total.
            let position = ring
                .walk(blake2b_point(cluster.id.as_bytes()))
                .find(|&position| apps[position] < cap)
                .unwrap_or_else(|| lightest(&apps));
            apps[position] = apps[position].saturating_add(cluster.apps);
            placed = placed.saturating_add(cluster.apps);
            position
        })
        .collect()
}

fn lightest(apps: &[u64]) -> usize {
    (0..apps.len()).min_by_key(|&p| (apps[p], p)).unwrap_or(0)
}

pub(crate) fn place(draft: &mut Draft<'_>) {
    let positions = ring_positions(draft);
    for index in draft.unplaced() {
        // Unplaced and pinned means pinned to a shard that is not live.
        let position = if draft.cluster(index).pin.is_some() {
            0
        } else {
            positions[index]
        };
        draft.place(index, position);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_follows_argo_cds_float_formula() {
        for shards in 1..20usize {
            for placed in 0..2000u64 {
                let mean = ((placed + 1) / shards as u64).max(1) as f64;
                let expected = (mean * 1.25).ceil() as u64;
                assert_eq!(
                    cap(placed, shards),
                    expected,
                    "{placed} apps, {shards} shards"
                );
            }
        }
    }

    #[test]
    fn coinciding_keys_belong_to_the_higher_shard() {
        let ring = Ring::build(13);
        // Shard 1's key "1"+"i" is shard 11's "11"+"j" when i is "1j" (i in 10..=19 and
        // 110..=199), and shard 12's when i is "2j": 200 keys, leaving 800. Shard 10 takes none
        // (i would start with 0), and shards above 1 have no longer-named successor here.
        let owned = |p: usize| ring.points.iter().filter(|&&(_, q)| q == p).count();
        assert_eq!(owned(1), 800);
        assert_eq!(owned(0), 1000);
        assert_eq!(owned(12), 1000);
        let point = blake2b_point(b"110");
        let at = ring.points.partition_point(|&(q, _)| q < point);
        assert_eq!(ring.points[at], (point, 11));
    }

    #[test]
    fn the_walk_starts_strictly_after_the_key() {
        let ring = Ring::build(3);
        // "17" is vnode 7 of shard 1: the walk must not start on that point.
        let key = blake2b_point(b"17");
        let at = ring.points.partition_point(|&(q, _)| q < key);
        assert_eq!(ring.points[at], (key, 1));
        let next = ring.points[(at + 1) % ring.points.len()].1;
        assert_eq!(ring.walk(key).next(), Some(next));
    }
}
