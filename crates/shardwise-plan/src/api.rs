//! Reading a fleet from the Kubernetes API: the only part of `plan` that does I/O. Every
//! failure becomes a [`FetchError`] that says what was being read and why it failed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::de::DeserializeOwned;
use shard_assign::ShardId;
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_wire::slice::UnitSlice;
use thiserror::Error;

use crate::argocd::{CLUSTER_SECRET_SELECTOR, PinTarget};

/// Argo CD's Application resource, read as dynamic objects: the project does not depend on Argo
/// CD's Go types, and reads only the fields it needs.
pub fn application_resource() -> ApiResource {
    ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: "Application".into(),
        plural: "applications".into(),
    }
}

/// Objects per list request, so that a large fleet arrives in pages.
const PAGE: u32 = 500;
/// A plan lists a few resources: an API server that does not answer in this time is down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Who writes `shard` keys, in each Secret's managedFields.
const FIELD_MANAGER: &str = "shardwise";

/// Argo CD's settings ConfigMap, which holds `cluster.inClusterEnabled`.
const ARGOCD_CM: &str = "argocd-cm";
/// Argo CD's annotation that asks its controller to refresh an Application now.
const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";
const IN_CLUSTER_ENABLED_KEY: &str = "cluster.inClusterEnabled";

/// A request to the API server that failed, said so that the user knows what to change.
#[derive(Debug, Error)]
pub enum FetchError {
    /// No kubeconfig, context or in-cluster configuration could be loaded.
    #[error("cannot load a Kubernetes configuration: {0}")]
    Config(String),
    /// The server did not answer.
    #[error("cannot reach the API server at {server}: {reason}")]
    Unreachable {
        /// The server's URL.
        server: String,
        /// Why, as the client said.
        reason: String,
    },
    /// The server refused the credentials.
    #[error(
        "the API server at {server} refused the kubeconfig's credentials (401 Unauthorized): {message}"
    )]
    Unauthorized {
        /// The server's URL.
        server: String,
        /// The server's message.
        message: String,
    },
    /// RBAC refused the request.
    #[error("forbidden (403): cannot {verb} {what}: {message}")]
    Forbidden {
        /// The verb refused.
        verb: &'static str,
        /// What it was asked for.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The server does not serve the resource (its CRD is not installed).
    #[error("{resource} is not served by the API server at {server}: {hint}")]
    NotServed {
        /// The resource.
        resource: &'static str,
        /// The server's URL.
        server: String,
        /// What to install.
        hint: &'static str,
    },
    /// Any other failure.
    #[error("cannot {verb} {what}: {reason}")]
    Other {
        /// The verb that failed.
        verb: &'static str,
        /// What it was asked for.
        what: String,
        /// Why.
        reason: String,
    },
}

/// A failed write of a cluster Secret's `shard` key.
#[derive(Debug, Error)]
pub enum WriteError {
    /// The Secret's resourceVersion is no longer the one read: someone wrote it since.
    #[error("Secret {0:?} changed since it was read (409 Conflict)")]
    Conflict(String),
    /// The write failed as a read would.
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// A client and the server it talks to.
#[derive(Clone)]
pub struct Connection {
    client: Client,
    server: String,
}

/// A resource as named in messages and, for custom resources, what it means when the server
/// does not serve it.
#[derive(Clone, Copy, Debug)]
struct Resource {
    name: &'static str,
    missing: Option<&'static str>,
}

const FLEET_CLUSTERS: Resource = Resource {
    name: "fleetclusters.shardwise.io",
    missing: Some("shardwise's CRDs are not installed (`shardwise crds | kubectl apply -f -`)"),
};
const FLEET_APPS: Resource = Resource {
    name: "fleetapps.shardwise.io",
    missing: Some("shardwise's CRDs are not installed (`shardwise crds | kubectl apply -f -`)"),
};
/// Not being served is no error: shardwise's CRDs from before slices, so nothing is cut.
const UNIT_SLICES: Resource = Resource {
    name: "unitslices.shardwise.io",
    missing: None,
};
const APPLICATIONS: Resource = Resource {
    name: "applications.argoproj.io",
    missing: Some("Argo CD's Application CRD is not installed in this cluster"),
};
const SECRETS: Resource = Resource {
    name: "secrets",
    missing: None,
};
const STATEFULSETS: Resource = Resource {
    name: "statefulsets.apps",
    missing: None,
};
const DEPLOYMENTS: Resource = Resource {
    name: "deployments.apps",
    missing: None,
};
const PODS: Resource = Resource {
    name: "pods",
    missing: None,
};
const CONFIGMAPS: Resource = Resource {
    name: "configmaps",
    missing: None,
};
const LEASES: Resource = Resource {
    name: "leases.coordination.k8s.io",
    missing: None,
};

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects with `kubeconfig` (or kube's inference: `$KUBECONFIG`, `~/.kube/config`, the
    /// in-cluster service account) and `context` (or the current one).
    pub async fn new(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Self, FetchError> {
        let options = KubeConfigOptions {
            context: context.map(str::to_string),
            ..KubeConfigOptions::default()
        };
        let config_error = |e: &dyn std::error::Error| FetchError::Config(describe(e));
        let mut config = match (kubeconfig, context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path).map_err(|e| config_error(&e))?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| config_error(&e))?
            }
            (None, Some(_)) => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| config_error(&e))?,
            (None, None) => Config::infer().await.map_err(|e| config_error(&e))?,
        };
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.read_timeout = Some(READ_TIMEOUT);
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        let client = Client::try_from(config).map_err(|e| config_error(&e))?;
        Ok(Self { client, server })
    }

    /// The client, for what the balancer does besides reading and writing Argo CD (its Lease).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Every FleetCluster of `namespace`.
    pub async fn fleet_clusters(&self, namespace: &str) -> Result<Vec<FleetCluster>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        self.list_all(&api, None, FLEET_CLUSTERS, Some(namespace))
            .await
    }

    /// Every FleetApp of `namespace`.
    pub async fn fleet_apps(&self, namespace: &str) -> Result<Vec<FleetApp>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        self.list_all(&api, None, FLEET_APPS, Some(namespace)).await
    }

    /// The records of the slices of cut FleetClusters; none when the UnitSlice CRD is not
    /// installed (shardwise's CRDs from before slices: nothing can be cut).
    pub async fn unit_slices(&self, namespace: &str) -> Result<Vec<UnitSlice>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        match list_pages(&api, None).await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
            listed => listed.map_err(|e| {
                self.error(
                    e,
                    "list",
                    UNIT_SLICES,
                    listed_what(UNIT_SLICES, Some(namespace)),
                )
            }),
        }
    }

    /// The shard Leases of the replicas of StatefulSet `statefulset`, by the labels the
    /// controller gives them.
    pub async fn shard_leases(
        &self,
        namespace: &str,
        statefulset: &str,
    ) -> Result<Vec<Lease>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        let selector = shardwise_runtime::estimate::shard_lease_selector(statefulset).to_string();
        self.list_all(&api, Some(&selector), LEASES, Some(namespace))
            .await
    }

    /// Argo CD's cluster Secrets.
    pub async fn cluster_secrets(&self, namespace: &str) -> Result<Vec<Secret>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        self.list_all(
            &api,
            Some(CLUSTER_SECRET_SELECTOR),
            SECRETS,
            Some(namespace),
        )
        .await
    }

    /// Sets (`Some`) or removes (`None`) the `shard` key of cluster Secret `name`, on
    /// condition that its resourceVersion is still `resource_version`. A JSON merge patch that
    /// names only `data.shard` changes nothing else; the resourceVersion it carries makes the
    /// API server refuse it (409) when the Secret changed since.
    pub async fn write_shard(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        shard: Option<ShardId>,
    ) -> Result<(), WriteError> {
        self.write_key(namespace, name, resource_version, shard, &BTreeMap::new())
            .await
            .map(|_| ())
    }

    /// [`Connection::write_shard`], with `annotations` set (`Some`) or removed (`None`) in the
    /// same patch, so that the key and what the balancer records about it land together.
    /// Returns the Secret's new resourceVersion.
    pub async fn write_key(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        shard: Option<ShardId>,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<String, WriteError> {
        let value = shard.map(|s| ByteString(s.to_string().into_bytes()));
        self.patch_secret(
            namespace,
            name,
            resource_version,
            annotations,
            Some(serde_json::json!({"shard": value})),
        )
        .await
    }

    /// Parks Secret `name`'s cluster for a handover: `shard` [`crate::argocd::PARKED_KEY`],
    /// which no controller reconciles, and [`crate::argocd::HANDOVER_ANNOTATION`] naming
    /// `to`, in one patch on condition that its resourceVersion is still `resource_version`.
    /// Returns the new resourceVersion.
    pub async fn park_key(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        to: ShardId,
    ) -> Result<String, WriteError> {
        let annotations = BTreeMap::from([(
            crate::argocd::HANDOVER_ANNOTATION.to_string(),
            Some(to.to_string()),
        )]);
        let value = ByteString(crate::argocd::PARKED_KEY.as_bytes().to_vec());
        self.patch_secret(
            namespace,
            name,
            resource_version,
            &annotations,
            Some(serde_json::json!({ "shard": value })),
        )
        .await
    }

    /// Sets (`Some`) or removes (`None`) `annotations` of Secret `name`, on condition that its
    /// resourceVersion is still `resource_version`. Returns the new resourceVersion.
    pub async fn annotate_secret(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, Option<String>>,
    ) -> Result<String, WriteError> {
        self.patch_secret(namespace, name, resource_version, annotations, None)
            .await
    }

    async fn patch_secret(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        annotations: &BTreeMap<String, Option<String>>,
        data: Option<serde_json::Value>,
    ) -> Result<String, WriteError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let mut metadata = serde_json::json!({"resourceVersion": resource_version});
        if !annotations.is_empty() {
            metadata["annotations"] = serde_json::json!(annotations);
        }
        let mut patch = serde_json::json!({"metadata": metadata});
        if let Some(data) = data {
            patch["data"] = data;
        }
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(secret) => Ok(secret.metadata.resource_version.unwrap_or_default()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                Err(WriteError::Conflict(name.to_string()))
            }
            Err(e) => Err(self
                .error(e, "patch", SECRETS, format!("Secret {namespace}/{name}"))
                .into()),
        }
    }

    /// The pods of `namespace` that `selector` (a label selector) matches.
    pub async fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Pod>, FetchError> {
        let api = Api::namespaced(self.client.clone(), namespace);
        self.list_all(&api, Some(selector), PODS, Some(namespace))
            .await
    }

    /// Asks Argo CD to refresh Application `namespace/name` now (the
    /// `argocd.argoproj.io/refresh: normal` annotation, which its controller removes once it has
    /// refreshed the app). A controller that has just taken the app's cluster over reconciles it
    /// at once instead of at its next resync.
    pub async fn refresh_application(&self, namespace: &str, name: &str) -> Result<(), FetchError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &application_resource());
        let patch = serde_json::json!({
            "metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self.error(
                e,
                "patch",
                APPLICATIONS,
                format!("Application {namespace}/{name}"),
            )),
        }
    }

    /// Argo CD Applications of a namespace, or of every namespace when `namespace` is `None`.
    pub async fn applications(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<DynamicObject>, FetchError> {
        let resource = application_resource();
        let api = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        self.list_all(&api, None, APPLICATIONS, namespace).await
    }

    /// The StatefulSet, or `None` when it does not exist.
    pub async fn statefulset(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<StatefulSet>, FetchError> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| {
            self.error(
                e,
                "get",
                STATEFULSETS,
                format!("StatefulSet {namespace}/{name}"),
            )
        })
    }

    /// The Deployment, or `None` when it does not exist.
    pub async fn deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Deployment>, FetchError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| {
            self.error(
                e,
                "get",
                DEPLOYMENTS,
                format!("Deployment {namespace}/{name}"),
            )
        })
    }

    /// The ConfigMap, or `None` when it does not exist.
    pub async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, FetchError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| {
            self.error(
                e,
                "get",
                CONFIGMAPS,
                format!("ConfigMap {namespace}/{name}"),
            )
        })
    }

    /// Argo CD's `cluster.inClusterEnabled` (true unless set to "false"), and a note when
    /// argocd-cm could not be read.
    pub async fn in_cluster_enabled(&self, namespace: &str) -> (bool, Option<String>) {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(ARGOCD_CM).await {
            Ok(cm) => {
                let value = cm
                    .and_then(|cm| cm.data)
                    .and_then(|mut data| data.remove(IN_CLUSTER_ENABLED_KEY));
                (value.as_deref().map(str::trim) != Some("false"), None)
            }
            Err(e) => {
                let error = self.error(
                    e,
                    "get",
                    CONFIGMAPS,
                    format!("ConfigMap {namespace}/{ARGOCD_CM}"),
                );
                let note = format!("{error}; assuming the in-cluster cluster is enabled");
                (true, Some(note))
            }
        }
    }

    async fn list_all<K>(
        &self,
        api: &Api<K>,
        selector: Option<&str>,
        resource: Resource,
        namespace: Option<&str>,
    ) -> Result<Vec<K>, FetchError>
    where
        K: Clone + DeserializeOwned + Debug,
    {
        list_pages(api, selector)
            .await
            .map_err(|e| self.error(e, "list", resource, listed_what(resource, namespace)))
    }

    fn error(
        &self,
        error: kube::Error,
        verb: &'static str,
        resource: Resource,
        what: String,
    ) -> FetchError {
        let server = self.server.clone();
        match error {
            kube::Error::Api(status) => match (status.code, resource.missing) {
                (401, _) => FetchError::Unauthorized {
                    server,
                    message: status.message,
                },
                (403, _) => FetchError::Forbidden {
                    verb,
                    what,
                    message: status.message,
                },
                // A list of a resource the server does not know (a missing namespace gives an
                // empty list, and `get_opt` turns a missing object into `None`).
                (404, Some(hint)) => FetchError::NotServed {
                    resource: resource.name,
                    server,
                    hint,
                },
                (code, _) => FetchError::Other {
                    verb,
                    what,
                    reason: format!("{} ({code} {})", status.message, status.reason),
                },
            },
            e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => FetchError::Unreachable {
                server,
                reason: describe(&e),
            },
            e => FetchError::Other {
                verb,
                what,
                reason: describe(&e),
            },
        }
    }
}

/// Every object of `api`, a page at a time.
async fn list_pages<K>(api: &Api<K>, selector: Option<&str>) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut params = ListParams::default().limit(PAGE);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let mut items = Vec::new();
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

/// What a list reads, for messages.
fn listed_what(resource: Resource, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{} in namespace {ns}", resource.name),
        None => format!("{} in all namespaces", resource.name),
    }
}

/// An error and its sources on one line, leaving out sources whose text the message already
/// contains (kube's messages often embed them).
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Writes of `shard` keys that stopped part way: the message names the Secrets written and
/// those not written.
#[derive(Debug, Error)]
#[error("{0}")]
pub struct PinsStopped(pub String);

/// Writes each `(Secret, shard)` in order, on condition of the resourceVersion read, and stops
/// at the first failure, or before the first write `may_write` refuses (the balancer's fence):
/// the error says which Secrets were written and which were not.
pub async fn write_pins(
    connection: &Connection,
    namespace: &str,
    writes: &[(PinTarget, Option<ShardId>)],
    may_write: impl Fn() -> Result<(), String>,
) -> Result<usize, PinsStopped> {
    let names = |part: &[(PinTarget, Option<ShardId>)]| {
        if part.is_empty() {
            "none".to_string()
        } else {
            part.iter()
                .map(|(t, _)| t.secret.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    for (i, (target, shard)) in writes.iter().enumerate() {
        if let Err(why) = may_write() {
            return Err(PinsStopped(format!(
                "{why}: stopped; written: {}; not written: {}",
                names(&writes[..i]),
                names(&writes[i..])
            )));
        }
        if let Err(e) = connection
            .write_shard(namespace, &target.secret, &target.resource_version, *shard)
            .await
        {
            let again = match e {
                WriteError::Conflict(_) => "; run the plan again, which reads the Secrets anew",
                WriteError::Fetch(_) => "",
            };
            return Err(PinsStopped(format!(
                "{e}: stopped; written: {}; not written: {}{again}",
                names(&writes[..i]),
                names(&writes[i..])
            )));
        }
    }
    Ok(writes.len())
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use shardwise_e2e::Environment;

    use super::*;

    #[derive(Debug, Error)]
    #[error("outer ({0})")]
    struct Embeds(#[source] Inner);

    #[derive(Debug, Error)]
    #[error("inner\nreason")]
    struct Inner;

    #[derive(Debug, Error)]
    #[error("outer")]
    struct Wraps(#[source] Inner);

    #[test]
    fn described_errors_are_one_line_without_repeats() {
        assert_eq!(describe(&Embeds(Inner)), "outer (inner reason)");
        assert_eq!(describe(&Wraps(Inner)), "outer: inner reason");
    }

    fn shard_key(secret: &Secret) -> Option<String> {
        let bytes = secret.data.as_ref()?.get("shard")?;
        Some(String::from_utf8_lossy(&bytes.0).into_owned())
    }

    #[tokio::test]
    async fn a_secret_changed_since_it_was_read_stops_the_writes() {
        let env = Environment::builder().start().unwrap();
        let cp = env.control_plane();
        let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}\n");
        for name in ["a", "b", "c"] {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: cluster-{name}, namespace: argocd}}\nstringData: {{server: \"https://{name}.example\"}}\n"
            ));
        }
        cp.apply_yaml("admin", &yaml).await.unwrap();
        let kubeconfig = cp.kubeconfig_path("admin").unwrap();
        let connection = Connection::new(Some(&kubeconfig), None).await.unwrap();
        let api: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
        let read = api.list(&ListParams::default()).await.unwrap().items;
        let writes: Vec<(PinTarget, Option<ShardId>)> = read
            .iter()
            .map(|s| {
                let target = PinTarget {
                    secret: s.name_any(),
                    id: s.uid().unwrap(),
                    cluster: s.name_any(),
                    resource_version: s.resource_version().unwrap(),
                    key: None,
                };
                (target, Some(1))
            })
            .collect();
        assert_eq!(writes.len(), 3);

        // Someone writes cluster-b after the plan read it.
        let label = serde_json::json!({"metadata": {"labels": {"team": "x"}}});
        let changed = api
            .patch("cluster-b", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();

        let error = write_pins(&connection, "argocd", &writes, || Ok(()))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "Secret \"cluster-b\" changed since it was read (409 Conflict): stopped; written: cluster-a; not written: cluster-b, cluster-c; run the plan again, which reads the Secrets anew"
        );
        let now = |name: &str| {
            let api = api.clone();
            let name = name.to_string();
            async move { api.get(&name).await.unwrap() }
        };
        assert_eq!(shard_key(&now("cluster-a").await).as_deref(), Some("1"));
        let b = now("cluster-b").await;
        assert_eq!(shard_key(&b), None);
        assert_eq!(b.resource_version(), changed.resource_version());
        let c = now("cluster-c").await;
        assert_eq!(shard_key(&c), None);
        assert_eq!(c.resource_version(), read[2].resource_version());
    }
}
