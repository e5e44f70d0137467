//! `FleetCluster`: a destination cluster that apps are deployed to.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A destination cluster: where its API server is, how to authenticate, and optionally which
/// shard must own it.
// kube's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "shardwise.io",
    version = "v1alpha1",
    kind = "FleetCluster",
    plural = "fleetclusters",
    singular = "fleetcluster",
    shortname = "fcl",
    category = "shardwise",
    namespaced,
    status = "FleetClusterStatus",
    derive = "PartialEq",
    doc = "A destination cluster reconciled by the shard that owns it",
    printcolumn(
        name = "Shard",
        type_ = "string",
        json_path = ".metadata.labels.shardwise\\.io/shard",
        description = "Shard that owns the cluster (empty while it is cut into slices)"
    ),
    printcolumn(
        name = "Slices",
        type_ = "string",
        json_path = ".metadata.labels.shardwise\\.io/slices",
        description = "Slices the cluster is cut into, when it is too big for one shard"
    ),
    printcolumn(
        name = "Shards",
        type_ = "string",
        json_path = ".metadata.annotations.shardwise\\.io/slice-shards",
        description = "Shards that own the slices of a cut cluster"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Apps", type_ = "integer", json_path = ".status.appCount"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.serverVersion",
        priority = "1"
    ),
    printcolumn(
        name = "Server",
        type_ = "string",
        json_path = ".spec.server",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FleetClusterSpec {
    /// URL of the cluster's API server, e.g. `https://10.0.0.1:6443`. With `secretRef`, it must
    /// be `https` and equal the `server` key of the Secret.
    pub server: String,
    /// How to authenticate: a Secret, or the controller's own service account.
    #[serde(default)]
    pub credentials: ClusterCredentials,
    /// Pin the cluster to this shard. While the shard is not live the strategy places the
    /// cluster; it returns when the shard does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4_294_967_295u32))]
    pub shard: Option<u32>,
    /// Cost of each app of this cluster relative to others: a whole number from 1 to 1000
    /// (default 1).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "bounded_weight"
    )]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: Option<u32>,
}

/// The largest `spec.weight`. The schema says the same, so the API server refuses a larger one;
/// decoding refuses it too, for objects stored before the schema said so.
pub const MAX_WEIGHT: u32 = 1000;

fn bounded_weight<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let weight = Option::<u32>::deserialize(d)?;
    match weight {
        Some(w) if !(1..=MAX_WEIGHT).contains(&w) => Err(serde::de::Error::custom(format!(
            "spec.weight {w} is out of range: it must be a whole number from 1 to {MAX_WEIGHT}"
        ))),
        w => Ok(w),
    }
}

/// Credentials of a destination cluster. Exactly one of `secretRef` and `inCluster`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCredentials {
    /// A Secret in the FleetCluster's namespace, labelled `shardwise.io/secret-type: cluster`
    /// (or Argo CD's `argocd.argoproj.io/secret-type: cluster`), holding credentials for one
    /// server: a bearer token with `server` and optionally a CA bundle, a kubeconfig (key
    /// `kubeconfig` or `value`), or Argo CD's cluster config (`server` and `config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretCredentials>,
    /// Use the controller's own service account (the cluster it runs in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_cluster: Option<bool>,
    /// Skip verification of the server's certificate, with `inCluster` only (test clusters):
    /// a Secret's credentials are checked as the Secret says.
    #[serde(
        default,
        rename = "insecureSkipTLSVerify",
        skip_serializing_if = "Option::is_none"
    )]
    pub insecure_skip_tls_verify: Option<bool>,
}

/// Where in a Secret the credentials are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretCredentials {
    /// Secret name, in the FleetCluster's namespace.
    pub name: String,
    /// Key of the bearer token (default `token`; a Secret with a bearer token only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_key: Option<String>,
    /// Key of the PEM CA bundle (default `ca.crt`; absent means the system roots; a Secret
    /// with a bearer token only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_key: Option<String>,
}

impl SecretCredentials {
    const DEFAULT_TOKEN_KEY: &'static str = "token";
    const DEFAULT_CA_KEY: &'static str = "ca.crt";

    /// The key of the bearer token: `tokenKey`, or `token` when it is not set.
    pub fn token_key(&self) -> &str {
        self.token_key.as_deref().unwrap_or(Self::DEFAULT_TOKEN_KEY)
    }

    /// The key of the CA bundle: `caKey`, or `ca.crt` when it is not set.
    pub fn ca_key(&self) -> &str {
        self.ca_key.as_deref().unwrap_or(Self::DEFAULT_CA_KEY)
    }
}

/// Reachability of a destination cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ClusterPhase {
    /// The last probe reached the API server.
    Connected,
    /// The last probe failed (network, TLS, timeout).
    Unreachable,
    /// The API server answered but refused the credentials (401 or 403).
    Unauthorized,
    /// The spec cannot work as written (bad URL, missing Secret or key); fix it.
    Invalid,
}

/// What the owning shard last observed of the cluster. Never contains credentials.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetClusterStatus {
    /// Reachability of the cluster at the last probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClusterPhase>,
    /// `gitVersion` of the destination's API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// What went wrong, in words a person can act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Shard that wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4_294_967_295u32))]
    pub shard: Option<u32>,
    /// Apps that target this cluster, as counted by its owner. Not reported for a cluster cut
    /// into slices: each slice's owner sees only its own apps (`shardwise_owned_apps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_count: Option<u64>,
    /// When the owning shard last probed the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// The generation of the FleetCluster that this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (probe result) and `PinHonoured` (false while a pin names a shard that is not live).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    fn spec_with_weight(weight: serde_json::Value) -> Result<FleetClusterSpec, serde_json::Error> {
        serde_json::from_value(serde_json::json!({"server": "https://x", "weight": weight}))
    }

    #[test]
    fn weights_outside_the_schema_do_not_decode() {
        assert_eq!(spec_with_weight(1.into()).unwrap().weight, Some(1));
        assert_eq!(
            spec_with_weight(MAX_WEIGHT.into()).unwrap().weight,
            Some(MAX_WEIGHT)
        );
        for bad in [
            0u64,
            u64::from(MAX_WEIGHT) + 1,
            4_294_967_295,
            4_294_967_296,
        ] {
            let err = spec_with_weight(bad.into()).unwrap_err().to_string();
            assert!(
                err.contains("out of range") || err.contains("u32"),
                "{bad}: {err}"
            );
        }
        assert!(spec_with_weight((-1).into()).is_err());
    }

    #[test]
    fn the_schema_bounds_every_number_as_the_types_do() {
        let crd = serde_json::to_value(FleetCluster::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["weight"]["minimum"], 1.0);
        assert_eq!(spec["weight"]["maximum"], f64::from(MAX_WEIGHT));
        assert_eq!(spec["shard"]["minimum"], 0.0);
        assert_eq!(spec["shard"]["maximum"], f64::from(u32::MAX));
    }
}
