//! Labels, annotations and names of shardwise's own objects and of what it applies. The keys of
//! the sharding protocol (shard label, holder, epoch, drain) are in `shardwise_handoff::keys`.
//!
//! They are part of the API: renaming one breaks every running fleet.

/// API group of shardwise's custom resources.
pub const GROUP: &str = "shardwise.io";

/// On objects that an app applied in a destination cluster: the UID of the `FleetApp`. Pruning
/// only ever deletes objects that carry the UID of the app being reconciled.
pub const APP_UID_LABEL: &str = "shardwise.io/app-uid";

/// On objects applied in a destination cluster: `namespace/name` of the `FleetApp`, for people,
/// and for the controller to find the app when the object changes.
pub const APP_ANNOTATION: &str = "shardwise.io/app";

/// On objects applied in a destination cluster: a hash of the FleetCluster's `namespace/name`
/// (16 hex digits), so that an owner's cache of a cluster selects that cluster's objects only,
/// even where several FleetClusters name one API server.
pub const APP_CLUSTER_LABEL: &str = "shardwise.io/cluster";

/// On objects applied in a destination cluster: a hash of the manifest as declared (16 hex
/// digits). A manifest that changed, if only by a field removed, no longer matches the live
/// object's hash, so it is applied again.
pub const MANIFEST_HASH_ANNOTATION: &str = "shardwise.io/manifest-hash";

/// `app.kubernetes.io/managed-by` value on applied objects.
pub const MANAGED_BY: &str = "shardwise";

/// Label that marks a Secret as the credentials of a destination cluster; its value must be
/// [`CLUSTER_SECRET_TYPE`]. The controller uses no other Secret, whatever a FleetCluster names.
pub const CLUSTER_SECRET_LABEL: &str = "shardwise.io/secret-type";

/// Value of [`CLUSTER_SECRET_LABEL`] on cluster credentials.
pub const CLUSTER_SECRET_TYPE: &str = "cluster";

/// Key of a cluster Secret that holds the only API server URL its credentials may be sent to.
pub const CLUSTER_SECRET_SERVER_KEY: &str = "server";

/// Argo CD's label on its cluster Secrets; with the value [`CLUSTER_SECRET_TYPE`] it marks a
/// Secret as cluster credentials just as [`CLUSTER_SECRET_LABEL`] does.
pub const ARGOCD_SECRET_LABEL: &str = "argocd.argoproj.io/secret-type";

/// Key of an Argo CD cluster Secret that holds its connection settings (JSON).
pub const ARGOCD_CONFIG_KEY: &str = "config";

/// Keys of a cluster Secret that may hold a kubeconfig: shardwise's own, and Cluster API's.
pub const KUBECONFIG_KEYS: [&str; 2] = ["kubeconfig", "value"];

/// Field manager of every server-side apply shardwise makes.
pub const FIELD_MANAGER: &str = "shardwise";
