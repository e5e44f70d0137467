//! shardwise's custom resources.
//!
//! - [`FleetCluster`] (`fleetclusters.shardwise.io`, short name `fcl`): a destination cluster.
//! - [`FleetApp`] (`fleetapps.shardwise.io`, short name `fapp`): manifests kept applied in one
//!   namespace of one destination cluster.
//! - [`FleetPolicy`] (`fleetpolicies.shardwise.io`, short name `fpol`): what a platform admin
//!   lets named apps write beyond their destination namespace.
//!
//! The plural names differ from Argo CD's `applications.argoproj.io` and Cluster API's
//! `clusters.cluster.x-k8s.io`, so `kubectl get` stays unambiguous when they are installed side
//! by side. [`keys`] holds the labels and annotations of what shardwise applies.
//!
//! ```
//! // The CustomResourceDefinitions to install, as `shardwise crds` prints them.
//! let names: Vec<String> = shardwise_api::crds()
//!     .into_iter()
//!     .filter_map(|crd| crd.metadata.name)
//!     .collect();
//! assert!(names.contains(&"fleetclusters.shardwise.io".to_string()));
//! ```

#![deny(missing_docs)]

mod app;
mod cluster;
pub mod keys;
mod policy;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde::Serialize;

pub use app::{
    AppHealth, AppSource, ConfigMapSource, Destination, FleetApp, FleetAppSpec, FleetAppStatus,
    Health, ResourceRef, SyncPhase,
};
pub use cluster::{
    ClusterCredentials, ClusterPhase, FleetCluster, FleetClusterSpec, FleetClusterStatus,
    MAX_WEIGHT, SecretCredentials,
};
pub use policy::{FleetPolicy, FleetPolicySpec, GroupKind, PolicyDestination, matches};

/// The CRDs of shardwise's own kinds (the runtime adds its UnitSlice: `shardwise crds` prints
/// them all, and `deploy/crds.yaml` holds them).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![FleetCluster::crd(), FleetApp::crd(), FleetPolicy::crd()]
}

/// CRDs as a multi-document YAML stream.
pub fn crds_yaml(
    crds: &[CustomResourceDefinition],
) -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&to_yaml(crd)?);
    }
    Ok(out)
}

fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(value)
}
