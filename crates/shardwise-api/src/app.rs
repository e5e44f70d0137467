//! `FleetApp`: manifests to keep applied in one namespace of one destination cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An app: these manifests, into that namespace of that FleetCluster.
// kube's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "shardwise.io",
    version = "v1alpha1",
    kind = "FleetApp",
    plural = "fleetapps",
    singular = "fleetapp",
    shortname = "fapp",
    category = "shardwise",
    namespaced,
    status = "FleetAppStatus",
    derive = "PartialEq",
    doc = "Manifests kept applied in a destination cluster by the shard that owns the cluster",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".spec.destination.cluster"
    ),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.destination.namespace",
        priority = "1"
    ),
    printcolumn(
        name = "Shard",
        type_ = "string",
        json_path = ".metadata.labels.shardwise\\.io/shard",
        description = "Shard that owns the app"
    ),
    printcolumn(name = "Sync", type_ = "string", json_path = ".status.syncPhase"),
    printcolumn(name = "Health", type_ = "string", json_path = ".status.health.status"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FleetAppSpec {
    pub destination: Destination,
    pub source: AppSource,
    /// A FleetPolicy (in this namespace) that lists this app and grants it more than its
    /// destination namespace. Without one, the app writes only namespaced objects, only into
    /// `destination.namespace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// Where the manifests go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// Name of a FleetCluster in the FleetApp's namespace.
    pub cluster: String,
    /// Namespace of the destination cluster that namespaced objects are applied to.
    pub namespace: String,
}

/// Where the manifests come from. Exactly one of `manifests` and `configMapRef`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppSource {
    /// Kubernetes objects as YAML (several documents separated by `---`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests: Option<String>,
    /// A ConfigMap in the FleetApp's namespace holding the YAML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapSource>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapSource {
    pub name: String,
    /// Key holding the YAML (default `manifests.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ConfigMapSource {
    pub const DEFAULT_KEY: &'static str = "manifests.yaml";

    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(Self::DEFAULT_KEY)
    }
}

/// Whether the destination matches the manifests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SyncPhase {
    /// Every manifest is applied and nothing left over remains.
    Synced,
    /// The manifests changed and have not been applied yet.
    OutOfSync,
    /// The last attempt failed; `message` says why.
    Failed,
}

/// How the applied objects are doing, by kstatus's conventions (observed generation,
/// conditions, per-kind rules for the built-in workloads). Ordered from best to worst: an app's
/// health is the worst of its objects'.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum Health {
    /// Every object is what its controller was asked for (rolled out, available, ready).
    Healthy,
    /// Some object is still getting there (a rollout, a Pod not Ready yet, being deleted).
    Progressing,
    /// The owner's cache of the cluster cannot tell (not listed yet, or not allowed to list).
    Unknown,
    /// Some object does not exist on the cluster.
    Missing,
    /// Some object failed (a rollout past its deadline, a failed Job, a crash-looping Pod).
    Degraded,
}

/// The app's health and the object that decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppHealth {
    pub status: Health,
    /// Why, naming the object (absent when every object is Healthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One object an app applied: the inventory used for pruning.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetAppStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_phase: Option<SyncPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Objects applied by the last successful sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_resources: Vec<ResourceRef>,
    /// Shard that wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4_294_967_295u32))]
    pub shard: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Synced` (true when the destination matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How the applied objects are doing, as the owner's cache of the cluster sees them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AppHealth>,
}
