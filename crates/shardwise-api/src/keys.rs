//! Labels, annotations and names that tie shardwise's objects together.
//!
//! The planner records placement in these; replicas select on them. They are part of the API:
//! renaming one breaks every running fleet.

/// API group of shardwise's custom resources.
pub const GROUP: &str = "shardwise.io";

/// The shard that owns a `FleetCluster` or a `FleetApp`, as a decimal ordinal. Written only by
/// the planner; every replica watches with `shardwise.io/shard=<its ordinal>`.
pub const SHARD_LABEL: &str = "shardwise.io/shard";

/// Ownership epoch of a `FleetCluster`: bumped by the planner at every change of owner, so that
/// an acknowledgement of a drain can never be mistaken for one of a later assignment.
pub const EPOCH_ANNOTATION: &str = "shardwise.io/epoch";

/// The lease holder identity of the replica a `FleetCluster` is assigned to: written by the
/// planner with the shard label. A replica works only on clusters that name both its shard and
/// the identity it holds its lease as, so that a restarted replica never picks up a cluster the
/// planner is giving away on the strength of its predecessor's released lease.
pub const HOLDER_ANNOTATION: &str = "shardwise.io/holder";

/// Set by the planner on a `FleetCluster` it wants to move: the shard it will go to. The owner
/// stops reconciling the cluster and its apps and acknowledges.
pub const DRAIN_TO_ANNOTATION: &str = "shardwise.io/drain-to";

/// Set by the owner when it has stopped every reconcile of a draining cluster: the epoch it
/// released. Only then does the planner give the cluster to its new shard.
pub const DRAINED_ANNOTATION: &str = "shardwise.io/drained-epoch";

/// On objects that an app applied in a destination cluster: the UID of the `FleetApp`. Pruning
/// only ever deletes objects that carry the UID of the app being reconciled.
pub const APP_UID_LABEL: &str = "shardwise.io/app-uid";

/// On objects applied in a destination cluster: `namespace/name` of the `FleetApp`, for people.
pub const APP_ANNOTATION: &str = "shardwise.io/app";

/// `app.kubernetes.io/managed-by` value on applied objects.
pub const MANAGED_BY: &str = "shardwise";

/// Label that marks a Secret as the credentials of a destination cluster; its value must be
/// [`CLUSTER_SECRET_TYPE`]. The controller uses no other Secret, whatever a FleetCluster names.
pub const CLUSTER_SECRET_LABEL: &str = "shardwise.io/secret-type";

/// Value of [`CLUSTER_SECRET_LABEL`] on cluster credentials.
pub const CLUSTER_SECRET_TYPE: &str = "cluster";

/// Key of a cluster Secret that holds the only API server URL its credentials may be sent to.
pub const CLUSTER_SECRET_SERVER_KEY: &str = "server";

/// Field manager of every server-side apply shardwise makes.
pub const FIELD_MANAGER: &str = "shardwise";

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
    fn shard_values_are_strict_decimals() {
        assert_eq!(parse_shard("0"), Some(0));
        assert_eq!(parse_shard("17"), Some(17));
        for bad in ["", "-1", "01", " 1", "1a", "4294967296", "+3"] {
            assert_eq!(parse_shard(bad), None, "{bad:?}");
        }
    }
}
