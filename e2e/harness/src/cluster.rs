//! Test clusters (one kube-apiserver each) and the environment of a control plane plus
//! destination clusters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;
use shardwise_e2e_node::NodeAgent;
use shardwise_e2e_testkit::{Identity, WriteRecord};

use crate::HarnessError;
use crate::client::client_of;
use crate::faults::Faults;
use crate::nodes::{NodeNetwork, Nodes};
use crate::process::{Process, ProcessSpec};
use crate::real::{RealApiServer, Shared};
use crate::server::ClusterServer;

/// The field manager the harness applies with.
pub const FIELD_MANAGER: &str = "shardwise-e2e";

/// One API server, with a kubeconfig file per identity in the environment's directory.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    server: Box<dyn ClusterServer>,
    dir: PathBuf,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError + '_ {
    move |source| HarnessError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Cluster {
    fn start(
        name: &str,
        identities: &[Identity],
        backend: &Backend,
        dir: &Path,
        runs_pods: bool,
    ) -> Result<Self, HarnessError> {
        let server: Box<dyn ClusterServer> = match backend {
            Backend::Real(shared) => Box::new(RealApiServer::start(
                name, identities, shared, dir, runs_pods,
            )?),
            #[cfg(feature = "test-server")]
            Backend::Test => Box::new(crate::server::TestServer::start(name, identities)?),
        };
        let cluster = Self {
            name: name.to_string(),
            server,
            dir: dir.to_path_buf(),
        };
        cluster.write_kubeconfigs()?;
        Ok(cluster)
    }

    fn identities(&self) -> Vec<Identity> {
        self.server.identities()
    }

    fn write_kubeconfigs(&self) -> Result<(), HarnessError> {
        let all = self.kubeconfig_path_all();
        let yaml = self.server.kubeconfig();
        std::fs::write(&all, yaml).map_err(io_error(&all))?;
        for identity in self.identities() {
            let path = self.path_for(&identity.name);
            let yaml = self.kubeconfig(&identity.name)?;
            std::fs::write(&path, yaml).map_err(io_error(&path))?;
        }
        Ok(())
    }

    fn path_for(&self, identity: &str) -> PathBuf {
        self.dir
            .join(format!("{}.{identity}.kubeconfig", self.name))
    }

    /// The server URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The cluster's kube-apiserver.
    ///
    /// # Panics
    /// On the test server (`make demo`'s default), which no test runs on.
    pub fn server(&self) -> &RealApiServer {
        self.server
            .real()
            .expect("the cluster runs on the test server, which has no kube-apiserver")
    }

    /// The faults injected into the requests of every identity but the harness's `admin`
    /// (each reaches the server through a link of its own), per identity
    /// ([`FaultScope::Identity`](crate::FaultScope::Identity)) or for all
    /// ([`FaultScope::Global`](crate::FaultScope::Global)).
    ///
    /// # Panics
    /// On the test server (`make demo`'s default), which has no links.
    pub fn faults(&self) -> &Faults {
        self.server().faults()
    }

    fn known(&self, identity: &str) -> Result<Identity, HarnessError> {
        self.server
            .identity(identity)
            .ok_or_else(|| HarnessError::UnknownIdentity {
                cluster: self.name.clone(),
                identity: identity.to_string(),
            })
    }

    /// An identity's link, or a pod's ([`crate::pod_link`]): pods authenticate themselves,
    /// and their links open on their first connection.
    fn known_link(&self, link: &str) -> Result<(), HarnessError> {
        if !link.starts_with(&crate::pod_link("")) {
            self.known(link)?;
        }
        Ok(())
    }

    /// Cuts `identity` (or a pod, by its link) off this cluster: its open connections and
    /// watches drop and new ones are dropped unanswered, as if the network were down, until
    /// [`Cluster::heal`].
    pub fn partition(&self, identity: &str) -> Result<(), HarnessError> {
        self.known_link(identity)?;
        self.server.set_partitioned(identity, true)
    }

    /// Ends [`Cluster::partition`] of `identity`.
    pub fn heal(&self, identity: &str) -> Result<(), HarnessError> {
        self.known_link(identity)?;
        self.server.set_partitioned(identity, false)
    }

    /// Delays every request of `identity` to this cluster by `latency` (zero: none).
    pub fn set_latency(
        &self,
        identity: &str,
        latency: std::time::Duration,
    ) -> Result<(), HarnessError> {
        self.known(identity)?;
        self.server.set_latency(identity, latency);
        Ok(())
    }

    /// The URL `identity`'s kubeconfig names: the server's own for the harness's `admin`, the
    /// identity's link for any other.
    pub fn url_for(&self, identity: &str) -> Result<String, HarnessError> {
        self.server.url_for(&self.known(identity)?)
    }

    /// Every write request the server answered, oldest first, from its audit log.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.server.writes()
    }

    /// The CA that signed the server's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.server.ca_pem()
    }

    /// The bearer token of `identity` (e.g. to put in a Secret).
    pub fn token(&self, identity: &str) -> Result<String, HarnessError> {
        Ok(self.known(identity)?.token)
    }

    /// Adds an identity while running and writes its kubeconfig; returns the file. A
    /// ServiceAccount's token comes from the TokenRequest API, and any other identity
    /// authenticates with a client certificate.
    pub fn add_identity(&self, identity: Identity) -> Result<PathBuf, HarnessError> {
        let name = identity.name.clone();
        self.server.add_identity(identity)?;
        self.write_kubeconfigs()?;
        Ok(self.path_for(&name))
    }

    /// A kubeconfig holding only `identity`, as YAML (e.g. to put in a Secret).
    pub fn kubeconfig(&self, identity: &str) -> Result<String, HarnessError> {
        self.server
            .kubeconfig_for(identity)
            .ok_or_else(|| HarnessError::UnknownIdentity {
                cluster: self.name.clone(),
                identity: identity.to_string(),
            })
    }

    /// A kubeconfig holding only `identity`, authenticating with a newly issued client
    /// certificate (CommonName = its user, Organizations = its groups) instead of its token.
    pub fn kubeconfig_with_client_certificate(
        &self,
        identity: &str,
    ) -> Result<String, HarnessError> {
        self.server.kubeconfig_with_client_certificate(identity)
    }

    /// The kubeconfig file of one identity (its context is current).
    pub fn kubeconfig_path(&self, identity: &str) -> Result<PathBuf, HarnessError> {
        self.kubeconfig(identity)?;
        Ok(self.path_for(identity))
    }

    /// The kubeconfig file with every identity (the admin is current).
    pub fn kubeconfig_path_all(&self) -> PathBuf {
        self.dir.join(format!("{}.kubeconfig", self.name))
    }

    /// A kube client authenticated as `identity`.
    pub async fn client(&self, identity: &str) -> Result<kube::Client, HarnessError> {
        client_of(&self.name, &self.kubeconfig(identity)?).await
    }

    /// Server-side applies every document of a multi-document YAML as `identity`
    /// (field manager [`FIELD_MANAGER`], forced), in order; `List` documents are expanded.
    /// Namespaced objects without a namespace go to `default`; after a CustomResourceDefinition,
    /// the next document waits until its kind is served.
    pub async fn apply_yaml(
        &self,
        identity: &str,
        yaml: &str,
    ) -> Result<Vec<DynamicObject>, HarnessError> {
        let client = self.client(identity).await?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(yaml).map_err(|e| HarnessError::Yaml {
                index: 0,
                reason: e.to_string(),
            })?;
        let mut applied = Vec::new();
        for (index, doc) in docs.into_iter().enumerate() {
            let items = match doc {
                Value::Null => continue,
                Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => m
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                other => vec![other],
            };
            for item in items {
                applied.push(apply_one(&client, index, item).await?);
            }
        }
        Ok(applied)
    }

    /// [`Cluster::apply_yaml`] on the contents of a file.
    pub async fn apply_file(
        &self,
        identity: &str,
        path: &Path,
    ) -> Result<Vec<DynamicObject>, HarnessError> {
        let yaml = std::fs::read_to_string(path).map_err(io_error(path))?;
        self.apply_yaml(identity, &yaml).await
    }
}

async fn apply_one(
    client: &kube::Client,
    index: usize,
    obj: Value,
) -> Result<DynamicObject, HarnessError> {
    let field = |pointer: &str| {
        obj.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (api_version, kind, name) = (
        field("/apiVersion"),
        field("/kind"),
        field("/metadata/name"),
    );
    if api_version.is_empty() || kind.is_empty() || name.is_empty() {
        return Err(HarnessError::Yaml {
            index,
            reason: "apiVersion, kind and metadata.name are required".into(),
        });
    }
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| HarnessError::Discovery {
            api_version: api_version.clone(),
            kind: kind.clone(),
            source,
        })?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = match field("/metadata/namespace") {
                ns if ns.is_empty() => "default".to_string(),
                ns => ns,
            };
            Api::namespaced_with(client.clone(), &ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api.patch(&name, &params, &Patch::Apply(&obj)).await?;
    if kind == "CustomResourceDefinition" {
        served(client, &applied).await?;
    }
    Ok(applied)
}

/// Waits until every version a CustomResourceDefinition serves is in discovery, so that the
/// documents after it may be of its kind: kube-apiserver serves a new kind a moment after the
/// CRD is written, once it is established and discovery has caught up.
async fn served(client: &kube::Client, crd: &DynamicObject) -> Result<(), HarnessError> {
    let spec = &crd.data["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let kind = spec["names"]["kind"].as_str().unwrap_or_default();
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    for version in versions.iter().filter(|v| v["served"] == true) {
        let gvk = GroupVersionKind::gvk(group, version["name"].as_str().unwrap_or_default(), kind);
        crate::wait_for(
            &format!("{kind}.{group}/{} to be served", gvk.version),
            std::time::Duration::from_secs(30),
            || async {
                kube::discovery::pinned_kind(client, &gvk)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
    }
    Ok(())
}

/// Everything one end-to-end test needs: a control plane, destination clusters, a directory
/// for kubeconfigs and process logs.
///
/// The directory is removed on drop unless [`Environment::keep`] was called or
/// `SHARDWISE_E2E_KEEP=1` is set.
#[derive(Debug)]
pub struct Environment {
    // Fields drop in this order: node agents (and their pods) first, then servers, then etcd,
    // then the node network, then the directory they wrote to.
    nodes: Option<Nodes>,
    control_plane: Cluster,
    destinations: Vec<Cluster>,
    backend: Backend,
    network: Option<NodeNetwork>,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    keep: bool,
}

/// What an environment's clusters run on.
#[derive(Debug)]
enum Backend {
    /// kube-apiserver, one per cluster, on a shared etcd.
    Real(Box<Shared>),
    /// The in-memory test API server, one per cluster (`make demo`'s default, and the scale
    /// benchmark's).
    #[cfg(feature = "test-server")]
    Test,
}

/// Builds an [`Environment`].
#[derive(Debug)]
pub struct EnvironmentBuilder {
    destinations: usize,
    identities: Vec<Identity>,
    destination_identities: Vec<Identity>,
    apiserver_args: Vec<String>,
    runs_pods: bool,
    nodes: usize,
    #[cfg(feature = "test-server")]
    test_server: bool,
}

impl EnvironmentBuilder {
    /// How many destination clusters (`dest-0`, `dest-1`, ...) to start.
    pub fn destinations(mut self, n: usize) -> Self {
        self.destinations = n;
        self
    }

    /// An identity on the control plane (besides `admin`).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identities.push(identity);
        self
    }

    /// An identity on every destination cluster (besides `admin`).
    pub fn destination_identity(mut self, identity: Identity) -> Self {
        self.destination_identities.push(identity);
        self
    }

    /// More flags for every kube-apiserver (e.g. `--etcd-compaction-interval=10s`).
    pub fn apiserver_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.apiserver_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The control plane runs workloads as a real cluster does: kube-controller-manager (the
    /// StatefulSet, Deployment, ReplicaSet, garbage-collector, namespace, ServiceAccount and
    /// token, ClusterRole-aggregation, disruption, EndpointSlice and node-lifecycle controllers)
    /// and kube-scheduler start beside its kube-apiserver, which then authorizes nodes.
    pub fn runs_pods(mut self) -> Self {
        self.runs_pods = true;
        self
    }

    /// The control plane runs pods ([`EnvironmentBuilder::runs_pods`]) on `n` nodes
    /// (`node-0`, ...): a node network, and node agents that run each pod bound to them as
    /// local processes in a network namespace of the pod's own. Every link then listens on the
    /// node network's address (see [`Cluster::url_for`]), which pods reach. Needs root.
    pub fn nodes(mut self, n: usize) -> Self {
        self.runs_pods = true;
        self.nodes = n;
        self
    }

    /// Runs every cluster on the in-memory test API server instead of kube-apiserver: it starts
    /// at once and needs no Go build (`make demo`'s default, and the scale benchmark's, which
    /// kube-apiserver bounds on 2 cores; no test runs on it).
    #[cfg(feature = "test-server")]
    pub fn test_server(mut self) -> Self {
        self.test_server = true;
        self
    }

    /// Starts etcd and the servers: a few seconds per kube-apiserver.
    pub fn start(self) -> Result<Environment, HarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("shardwise-e2e-")
            .tempdir()
            .map_err(io_error(&std::env::temp_dir()))?;
        let path = dir.path().to_path_buf();
        let keep = std::env::var("SHARDWISE_E2E_KEEP").is_ok_and(|v| v == "1" || v == "true");
        let network = if self.nodes > 0 {
            Some(NodeNetwork::claim(&path)?)
        } else {
            None
        };
        let link_address: std::net::IpAddr = network
            .as_ref()
            .map_or([127, 0, 0, 1].into(), |n| n.gateway().into());
        #[cfg(feature = "test-server")]
        let backend = if self.test_server {
            Backend::Test
        } else {
            Backend::Real(Box::new(Shared::start(
                self.apiserver_args,
                link_address,
                &path,
            )?))
        };
        #[cfg(not(feature = "test-server"))]
        let backend = Backend::Real(Box::new(Shared::start(
            self.apiserver_args,
            link_address,
            &path,
        )?));
        // The servers start side by side: each spends most of its few seconds waiting for
        // its own start-up hooks, not on a core.
        let (control_plane, destinations) = std::thread::scope(|scope| {
            let destinations: Vec<_> = (0..self.destinations)
                .map(|i| {
                    let (identities, backend, path) =
                        (&self.destination_identities, &backend, &path);
                    scope.spawn(move || {
                        Cluster::start(&format!("dest-{i}"), identities, backend, path, false)
                    })
                })
                .collect();
            let control_plane = Cluster::start(
                "control-plane",
                &self.identities,
                &backend,
                &path,
                self.runs_pods,
            );
            let destinations = destinations
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect::<Result<Vec<_>, _>>();
            (control_plane, destinations)
        });
        let (control_plane, destinations) = (control_plane?, destinations?);
        let nodes = match &network {
            Some(network) => Some(Nodes::start(
                control_plane.server(),
                network,
                self.nodes,
                &path,
            )?),
            None => None,
        };
        Ok(Environment {
            nodes,
            network,
            control_plane,
            destinations,
            backend,
            dir: Some(dir),
            path,
            keep,
        })
    }
}

impl Environment {
    /// A builder for an environment of only a control plane.
    pub fn builder() -> EnvironmentBuilder {
        EnvironmentBuilder {
            destinations: 0,
            identities: Vec::new(),
            destination_identities: Vec::new(),
            apiserver_args: Vec::new(),
            runs_pods: false,
            nodes: 0,
            #[cfg(feature = "test-server")]
            test_server: false,
        }
    }

    /// Kills etcd (SIGKILL) and starts it again on its data: every kube-apiserver of the
    /// environment loses its storage for a moment.
    pub fn restart_etcd(&self) -> Result<(), HarnessError> {
        match &self.backend {
            Backend::Real(shared) => shared.restart_etcd(),
            #[cfg(feature = "test-server")]
            Backend::Test => Err(HarnessError::TestServer {
                cluster: self.control_plane.name.clone(),
                reason: "the test server has no etcd to restart".into(),
            }),
        }
    }

    /// etcd's process and URL; an error on the test server, which has none.
    pub(crate) fn etcd(&self) -> Result<(u32, String), HarnessError> {
        match &self.backend {
            Backend::Real(shared) => Ok((shared.etcd_pid(), shared.etcd_url().to_string())),
            #[cfg(feature = "test-server")]
            Backend::Test => Err(HarnessError::TestServer {
                cluster: self.control_plane.name.clone(),
                reason: "the test server has no etcd to measure".into(),
            }),
        }
    }

    /// The requests the control plane's kube-apiserver received in `[from, to)`, by user and
    /// kind, from its audit log (none on the test server).
    pub(crate) fn requests_by_user(
        &self,
        from: std::time::SystemTime,
        to: std::time::SystemTime,
    ) -> BTreeMap<String, BTreeMap<crate::RequestKind, u64>> {
        match &self.backend {
            Backend::Real(_) => self.control_plane.server().requests_by_user(from, to),
            #[cfg(feature = "test-server")]
            Backend::Test => BTreeMap::new(),
        }
    }

    /// The processes that serve the environment's API requests, for measuring their CPU: etcd
    /// and every kube-apiserver; on the test server, which runs in this process, this process.
    pub fn server_processes(&self) -> Vec<u32> {
        match &self.backend {
            Backend::Real(shared) => std::iter::once(shared.etcd_pid())
                .chain(
                    std::iter::once(&self.control_plane)
                        .chain(&self.destinations)
                        .map(|cluster| cluster.server().pid()),
                )
                .collect(),
            #[cfg(feature = "test-server")]
            Backend::Test => vec![std::process::id()],
        }
    }

    /// The nodes' address, where pods reach every server's links, when the environment has
    /// [`EnvironmentBuilder::nodes`].
    pub fn node_address(&self) -> Option<std::net::Ipv4Addr> {
        self.network.as_ref().map(NodeNetwork::gateway)
    }

    /// Node agent `node-{index}`, when the environment has [`EnvironmentBuilder::nodes`].
    pub fn node(&self, index: usize) -> Option<&NodeAgent> {
        self.nodes.as_ref().and_then(|n| n.agent(index))
    }

    /// The control-plane cluster (`control-plane`).
    pub fn control_plane(&self) -> &Cluster {
        &self.control_plane
    }

    /// The destination clusters, `dest-0` first.
    pub fn destinations(&self) -> &[Cluster] {
        &self.destinations
    }

    /// Destination cluster `dest-{index}`, if there is one.
    pub fn destination(&self, index: usize) -> Option<&Cluster> {
        self.destinations.get(index)
    }

    /// The environment's directory (kubeconfigs, logs, files).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory after the environment is dropped (e.g. on failure).
    pub fn keep(&mut self) -> &Path {
        self.keep = true;
        &self.path
    }

    /// Writes a file into the environment's directory.
    pub fn write_file(&self, name: &str, contents: &str) -> Result<PathBuf, HarnessError> {
        let path = self.path.join(name);
        std::fs::write(&path, contents).map_err(io_error(&path))?;
        Ok(path)
    }

    /// Starts a process whose output goes to `<dir>/<name>.stdout.log` and `.stderr.log`.
    pub fn spawn(&self, spec: &ProcessSpec) -> Result<Process, HarnessError> {
        Ok(Process::spawn(spec, &self.path)?)
    }
}

impl Drop for Environment {
    fn drop(&mut self) {
        if self.keep
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("shardwise-e2e: kept {}", kept.display());
        }
    }
}
