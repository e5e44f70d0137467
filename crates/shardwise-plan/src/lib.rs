//! Live fleets read and planned, without a command line: a shardwise fleet (FleetClusters,
//! FleetApps, UnitSlices) or an Argo CD installation (cluster Secrets, Applications, its
//! controller's sharding settings) becomes a [`LiveFleet`] of clusters with their app counts,
//! pins, weights and the shard each one is recorded on; [`planning`] lays out where each
//! strategy would put them and what moves. Its users: the `shardwise plan` command (and its
//! `--apply`), and the Argo CD balancer, whose pass is its own.
//!
//! The modules that turn listed objects into a fleet (`shardwise`, `argocd`, `installation`,
//! `measured`) do no I/O and are tested by feeding them objects; [`api`] lists and writes
//! them, and [`read`] puts the two together.
//!
//! ```no_run
//! # async fn plan() -> Result<(), Box<dyn std::error::Error>> {
//! use shardwise_plan::api::Connection;
//! use shardwise_plan::read::{ShardwiseQuery, read_shardwise};
//!
//! let connection = Connection::new(None, None).await?;
//! let query = ShardwiseQuery {
//!     namespace: "shardwise",
//!     statefulset: "shardwise",
//!     replicas: None,
//!     measured: true,
//! };
//! let read = read_shardwise(&query, &connection).await?;
//! println!("{} clusters on {} replicas", read.fleet.clusters.len(), read.replicas);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod api;
pub mod argocd;
pub mod coverage;
pub mod installation;
pub mod measured;
pub mod planning;
pub mod read;
pub mod shardwise;
pub mod writer;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use shard_assign::{AppKeys, Cluster, KeyRange, ShardId};
use thiserror::Error;

/// Where a fleet is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetSource {
    /// FleetClusters and FleetApps; the current placement is their shard label.
    Shardwise,
    /// Argo CD's cluster Secrets and Applications; the current placement is computed.
    Argocd,
}

/// Clusters of a fleet and where they are now.
#[derive(Debug, Default)]
pub struct LiveFleet {
    /// Every cluster, in name order; `id` is the object's UID.
    pub clusters: Vec<Cluster>,
    /// The shard each cluster is recorded on, by id. Empty when the source records no placement
    /// (Argo CD); clusters missing from it are unplaced. A cut cluster is on the shard that holds
    /// most of its apps, for strategies that place whole clusters.
    pub recorded: BTreeMap<String, ShardId>,
    /// The recorded slices of each cut cluster, by id: ranges that tile the key space, in
    /// order, each with the shard of its UnitSlice.
    pub recorded_cuts: BTreeMap<String, Vec<(KeyRange, ShardId)>>,
    /// Apps that target no known cluster: they move with no cluster and are not counted.
    pub unmatched_apps: u64,
    /// The keys of each cluster's apps (FNV-1a of their UIDs), sorted, by cluster id: what
    /// slicing cuts. A cluster with an app lacking a UID has none, and is never cut.
    pub keys: AppKeys,
    /// Clusters with an app that has no UID (while the fleet is built).
    pub unkeyed: std::collections::BTreeSet<String>,
    /// What a person should know about the objects read (invalid labels, ignored keys, ...).
    pub notes: Vec<String>,
    /// What hurts the fleet as read (Argo CD: clusters no replica reconciles, or reconciled
    /// by all; Applications whose destination fails).
    pub warnings: Vec<String>,
    /// Argo CD: ids of clusters with a negative `shard`, which no replica reconciles.
    pub orphaned: std::collections::BTreeSet<String>,
    /// Argo CD: of the orphaned clusters, those shardwise-balancer parked while it hands them
    /// to another controller ([`argocd::HANDOVER_ANNOTATION`]), with the shard they go to.
    pub parked: BTreeMap<String, ShardId>,
    /// Argo CD: by id, the Applications whose `destination.server` is exactly the cluster's
    /// server, the count Argo CD's consistent-hashing weighs the cluster by.
    pub server_apps: BTreeMap<String, u64>,
    /// Argo CD: by cluster id, the cluster's server (trimmed as Argo CD trims it): how its
    /// controllers' metrics name it.
    pub servers: BTreeMap<String, String>,
    /// Argo CD: by cluster id, the Applications (namespace, name) whose destination resolves to
    /// the cluster: what the balancer asks Argo CD to refresh when the cluster moves.
    pub cluster_apps: BTreeMap<String, Vec<(String, String)>>,
    /// Argo CD: by cluster id, when the oldest sync operation still running on one of its
    /// Applications started (`status.operationState`, phase Running or Terminating): the
    /// balancer does not move such a cluster for a while.
    pub syncing: BTreeMap<String, jiff::Timestamp>,
    /// Argo CD: by cluster id, the other Secrets with the cluster's server and another shard
    /// key. Argo CD keeps one Secret per server, which one is not defined, so the key that
    /// places the cluster is not known.
    pub shadowed: BTreeMap<String, Vec<String>>,
    /// With measured load: where the clusters' weights came from (they are then the planner's
    /// measured weights, in thousandths of an app of average cost).
    pub measured: Option<measured::MeasuredSummary>,
}

impl LiveFleet {
    /// Records the key of an app of `cluster_id` (`None`: the app has no UID).
    pub fn add_app_key(&mut self, cluster_id: &str, uid: Option<&str>) {
        match uid {
            Some(uid) => self
                .keys
                .entry(cluster_id.to_string())
                .or_default()
                .push(shard_assign::app_key(uid)),
            // `finish_keys` drops the keys of this cluster.
            None => {
                self.unkeyed.insert(cluster_id.to_string());
            }
        }
    }

    /// Sorts the keys and drops those of clusters with an app lacking a UID.
    pub fn finish_keys(&mut self) {
        for id in std::mem::take(&mut self.unkeyed) {
            self.keys.remove(&id);
        }
        for keys in self.keys.values_mut() {
            keys.sort_unstable();
        }
    }

    /// One more than the highest recorded shard (of a cluster or a slice): the replica count
    /// the labels imply, since a StatefulSet's ordinals are contiguous.
    pub fn shards_in_use(&self) -> Option<u32> {
        self.recorded
            .values()
            .chain(
                self.recorded_cuts
                    .values()
                    .flatten()
                    .map(|(_, shard)| shard),
            )
            .max()
            .map(|&s| s.saturating_add(1))
    }
}

/// Objects that cannot be turned into clusters.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FleetError {
    /// An object has no UID.
    #[error("{kind} {name:?} has no metadata.uid, so it cannot be identified")]
    MissingUid {
        /// The object's kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A FleetCluster weighs nothing.
    #[error("FleetCluster {0:?} has weight 0; a weight must be at least 1")]
    ZeroWeight(String),
}

/// The replica count of a StatefulSet (an unset `spec.replicas` is defaulted to 1 by the API
/// server).
pub fn statefulset_replicas(sts: &StatefulSet) -> u32 {
    sts.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .map_or(1, |r| u32::try_from(r).unwrap_or(0))
}

/// A list of names for a note: the first few, then how many more.
fn some_names(names: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = names
        .iter()
        .take(SHOWN)
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statefulset(json: &str) -> StatefulSet {
        serde_json::from_str(json).unwrap()
    }

    const TEMPLATE: &str = r#""selector": {}, "serviceName": "c""#;

    #[test]
    fn replicas_come_from_the_spec_defaulting_to_one() {
        let sts = statefulset(&format!(
            r#"{{"spec": {{"replicas": 4, {TEMPLATE}, "template": {{}}}}}}"#
        ));
        assert_eq!(statefulset_replicas(&sts), 4);
        let unset = statefulset(&format!(r#"{{"spec": {{{TEMPLATE}, "template": {{}}}}}}"#));
        assert_eq!(statefulset_replicas(&unset), 1);
    }

    #[test]
    fn shards_in_use_is_one_past_the_highest_label() {
        let mut fleet = LiveFleet::default();
        assert_eq!(fleet.shards_in_use(), None);
        fleet.recorded.insert("a".into(), 0);
        fleet.recorded.insert("b".into(), 3);
        assert_eq!(fleet.shards_in_use(), Some(4));
        // A cut cluster is recorded where most of its apps are; a slice may be further out.
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        fleet
            .recorded_cuts
            .insert("b".into(), vec![(low, 3), (high, 5)]);
        assert_eq!(fleet.shards_in_use(), Some(6));
    }

    #[test]
    fn name_lists_are_shortened() {
        let names: Vec<String> = ["a", "b", "c", "d", "e"].map(String::from).to_vec();
        assert_eq!(some_names(&names[..2]), r#""a", "b""#);
        assert_eq!(some_names(&names), r#""a", "b", "c" and 2 more"#);
    }
}
