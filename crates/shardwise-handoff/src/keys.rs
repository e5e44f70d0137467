//! The labels and annotations of the sharding protocol, and the labels of its leases.
//!
//! The planner records placement in these; replicas select on them. They are part of the API:
//! renaming one breaks every running fleet.

use twox_hash::XxHash3_64;

/// The shard that owns a unit (what the planner places) or an item (what follows a unit), as a
/// decimal ordinal. Written only by the planner; every replica watches with
/// `shardwise.io/shard=<its ordinal>`.
pub const SHARD_LABEL: &str = "shardwise.io/shard";

/// The unit an item targets, as [`unit_token`] of its `namespace/name` (a label value is at most
/// 63 characters and cannot hold `/`). Written by the planner when it sees an item without it
/// or with a token of another unit, and again, unchanged, with the shard label of a move: its
/// value follows the unit, not its shard, so a selection of a unit's items by it holds whichever
/// shard holds the unit.
pub const UNIT_LABEL: &str = "shardwise.io/unit";

/// Ownership epoch of a unit: bumped by the planner at every change of owner, so that
/// an acknowledgement of a drain can never be mistaken for one of a later assignment.
pub const EPOCH_ANNOTATION: &str = "shardwise.io/epoch";

/// The lease holder identity of the replica a unit is assigned to: written by the
/// planner with the shard label. A replica works only on units that name both its shard and
/// the identity it holds its lease as, so that a restarted replica never picks up a unit the
/// planner is giving away on the strength of its predecessor's released lease.
pub const HOLDER_ANNOTATION: &str = "shardwise.io/holder";

/// Set by the planner on a unit it wants to move: the shard it will go to. The owner
/// stops reconciling the unit and its items and acknowledges.
pub const DRAIN_TO_ANNOTATION: &str = "shardwise.io/drain-to";

/// Set by the owner when it has stopped every reconcile of a draining unit: the epoch it
/// released. Only then does the planner give the unit to its new shard.
pub const DRAINED_ANNOTATION: &str = "shardwise.io/drained-epoch";

/// On a unit that is cut into slices: the number of its slices. Its presence says that the
/// record of the whole unit is gone (no shard label, no holder) and that each slice has a
/// record of its own, on a UnitSlice object; every replica watches the units that carry it.
/// Written only by the planner.
pub const SLICES_LABEL: &str = "shardwise.io/slices";

/// On a unit that is cut into slices: the shards its slices should end on, in order and
/// without repeats (`0,2,3`), for people (`kubectl get`). Written only by the planner.
pub const SLICE_SHARDS_ANNOTATION: &str = "shardwise.io/slice-shards";

/// On every Lease and every UnitSlice of the protocol: the StatefulSet whose replicas hold it.
pub const STATEFULSET_LABEL: &str = "shardwise.io/statefulset";

/// On every Lease of the protocol: `shard` or `planner`.
pub const LEASE_KIND_LABEL: &str = "shardwise.io/lease";

/// On a shard Lease: what the records (units, or slices of cut units) of that shard cost it,
/// as measured by its holder (versioned JSON, see `shardwise_wire::load`). Written only by the
/// holder, with its renewals; the planner reads it.
pub const LOAD_ANNOTATION: &str = "shardwise.io/load";

/// The value of [`UNIT_LABEL`] for the unit `name` in `namespace` (empty for a cluster-scoped
/// unit): 16 lowercase hex digits of the XXH3-64 of `namespace/name` (or `name`), the same on
/// every platform and version.
pub fn unit_token(namespace: &str, name: &str) -> String {
    let hash = if namespace.is_empty() {
        XxHash3_64::oneshot(name.as_bytes())
    } else {
        XxHash3_64::oneshot(format!("{namespace}/{name}").as_bytes())
    };
    format!("{hash:016x}")
}

/// Parses a shard label value: a plain decimal ordinal, nothing else.
pub fn parse_shard(value: &str) -> Option<u32> {
    if value.is_empty()
        || !value.bytes().all(|b| b.is_ascii_digit())
        || (value.len() > 1 && value.starts_with('0'))
    {
        return None;
    }
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_token_is_a_fixed_hash_of_namespace_and_name() {
        // Pinned: a token is part of every item of every running fleet.
        assert_eq!(
            unit_token("fleet", "edge-1"),
            format!("{:016x}", XxHash3_64::oneshot(b"fleet/edge-1"))
        );
        assert_eq!(unit_token("fleet", "edge-1"), "390d9dbaa803c3d8");
        // A cluster-scoped unit (a Namespace, say) by its name alone.
        assert_eq!(
            unit_token("", "team-1"),
            format!("{:016x}", XxHash3_64::oneshot(b"team-1"))
        );
        let token = unit_token(&"n".repeat(63), &"c".repeat(253));
        assert_eq!(token.len(), 16);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_ne!(token, unit_token("fleet", "edge-2"));
    }

    #[test]
    fn shard_values_are_strict_decimals() {
        assert_eq!(parse_shard("0"), Some(0));
        assert_eq!(parse_shard("17"), Some(17));
        for bad in ["", "-1", "01", " 1", "1a", "4294967296", "+3"] {
            assert_eq!(parse_shard(bad), None, "{bad:?}");
        }
    }
}
