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
    /// The FleetCluster and the namespace in it that the manifests are applied to.
    pub destination: Destination,
    /// Where the manifests come from. Exactly one of `manifests` and `configMapRef`.
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

/// A ConfigMap that holds an app's manifests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapSource {
    /// ConfigMap name, in the FleetApp's namespace.
    pub name: String,
    /// Key holding the YAML (default `manifests.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ConfigMapSource {
    const DEFAULT_KEY: &'static str = "manifests.yaml";

    /// The key holding the YAML: `key`, or `manifests.yaml` when it is not set.
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
    /// How the applied objects are doing: the worst health among them, by kstatus's
    /// conventions.
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
    /// API version of the object, e.g. `apps/v1`.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Namespace of the object; absent for a cluster-scoped one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the object.
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

/// What the owning shard last observed of the app.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetAppStatus {
    /// Whether the destination matches the manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_phase: Option<SyncPhase>,
    /// Why the app is not synced: what changed, or what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Objects applied by the last successful sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_resources: Vec<ResourceRef>,
    /// When a sync last found the destination matching the manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// The generation of the FleetApp that this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Synced` (true when the destination matches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How the applied objects are doing, as the owner's cache of the cluster sees them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AppHealth>,
}
