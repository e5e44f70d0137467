//! Test clusters (one API server each) and the environment of a control plane plus
//! destination clusters.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;
use shardwise_test_apiserver::{
    ApiServer, CertificateError, FaultScope, Faults, Identity, ServerConfig, WriteRecord,
};

use crate::HarnessError;
use crate::client::client_of;
use crate::process::{Process, ProcessSpec};
use crate::real::{Binaries, Etcd, RealApiServer, Spawner};

/// Which API server the end-to-end suites run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// The in-memory test server (`shardwise-test-apiserver`): starts in milliseconds and
    /// injects HTTP faults.
    Test,
    /// A real kube-apiserver and etcd, built from their Go modules.
    Real,
}

impl ServerKind {
    /// `SHARDWISE_E2E_SERVER`: `test` (the default) or `real`.
    pub fn from_env() -> Result<Self, HarnessError> {
        Self::parse(std::env::var("SHARDWISE_E2E_SERVER").ok().as_deref())
    }

    /// The switch's value: unset or empty is the test server.
    pub fn parse(value: Option<&str>) -> Result<Self, HarnessError> {
        match value {
            None | Some("" | "test") => Ok(Self::Test),
            Some("real") => Ok(Self::Real),
            Some(other) => Err(HarnessError::ServerKind(other.to_string())),
        }
    }
}

#[derive(Debug)]
enum Backend {
    Test(ApiServer),
    Real(Box<RealApiServer>),
}

/// The field manager the harness applies with.
pub const FIELD_MANAGER: &str = "shardwise-e2e";

/// One API server, with a kubeconfig file per identity in the environment's directory.
#[derive(Debug)]
pub struct Cluster {
    name: String,
    backend: Backend,
    dir: PathBuf,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError + '_ {
    move |source| HarnessError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Cluster {
    /// Starts a server named `name` on its own thread (so it keeps serving while a test
    /// blocks) and writes its kubeconfigs into `dir`.
    pub fn start(name: &str, mut config: ServerConfig, dir: &Path) -> Result<Self, HarnessError> {
        config.name = name.to_string();
        let server = ApiServer::start_detached(config).map_err(|source| HarnessError::Start {
            name: name.to_string(),
            source,
        })?;
        let cluster = Self {
            name: name.to_string(),
            backend: Backend::Test(server),
            dir: dir.to_path_buf(),
        };
        cluster.write_kubeconfigs()?;
        Ok(cluster)
    }

    fn start_real(
        name: &str,
        identities: &[Identity],
        control_plane: &RealControlPlane,
        dir: &Path,
    ) -> Result<Self, HarnessError> {
        let server = RealApiServer::start(
            name,
            identities,
            &control_plane.spawner,
            &control_plane.binaries,
            &control_plane.etcd,
            &control_plane.apiserver_args,
            dir,
        )?;
        let cluster = Self {
            name: name.to_string(),
            backend: Backend::Real(Box::new(server)),
            dir: dir.to_path_buf(),
        };
        cluster.write_kubeconfigs()?;
        Ok(cluster)
    }

    fn identities(&self) -> Vec<Identity> {
        match &self.backend {
            Backend::Test(s) => s.identities(),
            Backend::Real(s) => s.identities(),
        }
    }

    fn write_kubeconfigs(&self) -> Result<(), HarnessError> {
        let all = self.kubeconfig_path_all();
        let yaml = match &self.backend {
            Backend::Test(s) => s.kubeconfig(),
            Backend::Real(s) => s.kubeconfig(),
        };
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
        match &self.backend {
            Backend::Test(s) => s.url(),
            Backend::Real(s) => s.url().to_string(),
        }
    }

    /// Which kind of server this cluster is.
    pub fn kind(&self) -> ServerKind {
        match &self.backend {
            Backend::Test(_) => ServerKind::Test,
            Backend::Real(_) => ServerKind::Real,
        }
    }

    /// The real kube-apiserver, when this cluster is one.
    pub fn real_server(&self) -> Option<&RealApiServer> {
        match &self.backend {
            Backend::Test(_) => None,
            Backend::Real(s) => Some(s),
        }
    }

    /// HTTP fault injection (per identity, [`FaultScope::Identity`], or global), which only the
    /// test server has.
    ///
    /// # Panics
    /// On a real server: a suite that injects HTTP faults runs on the test server only, and
    /// checks [`Cluster::kind`] first.
    ///
    /// [`FaultScope::Identity`]: shardwise_test_apiserver::FaultScope::Identity
    pub fn faults(&self) -> &Faults {
        match &self.backend {
            Backend::Test(s) => s.faults(),
            Backend::Real(_) => panic!(
                "{}: HTTP fault injection needs the test server (SHARDWISE_E2E_SERVER=test)",
                self.name
            ),
        }
    }

    /// Cuts `identity` off this cluster: its requests and watches fail as if the network were
    /// down (the test server's partition fault; a real server's link of the identity cut).
    pub fn partition(&self, identity: &str) -> Result<(), HarnessError> {
        match &self.backend {
            Backend::Test(s) => {
                s.faults().partition(FaultScope::identity(identity));
                Ok(())
            }
            Backend::Real(s) => s.partition(identity),
        }
    }

    /// Delays every request of `identity` to this cluster by `latency` (the test server's
    /// latency fault; a real server's link of the identity).
    pub fn set_latency(
        &self,
        identity: &str,
        latency: std::time::Duration,
    ) -> Result<(), HarnessError> {
        match &self.backend {
            Backend::Test(s) => {
                s.faults()
                    .set_latency(FaultScope::identity(identity), latency);
                Ok(())
            }
            Backend::Real(s) => s.set_latency(identity, latency),
        }
    }

    /// The URL `identity`'s kubeconfig names: the server's own, or on a real server the
    /// identity's link (which [`Cluster::partition`] cuts).
    pub fn url_for(&self, identity: &str) -> Result<String, HarnessError> {
        let unknown = || HarnessError::UnknownIdentity {
            cluster: self.name.clone(),
            identity: identity.to_string(),
        };
        match &self.backend {
            Backend::Test(s) => s.identity(identity).map(|_| s.url()).ok_or_else(unknown),
            Backend::Real(s) => s.url_for(&s.identity(identity).ok_or_else(unknown)?),
        }
    }

    /// Ends [`Cluster::partition`] of `identity`.
    pub fn heal(&self, identity: &str) -> Result<(), HarnessError> {
        match &self.backend {
            Backend::Test(s) => {
                s.faults().heal(&FaultScope::identity(identity));
                Ok(())
            }
            Backend::Real(s) => s.heal(identity),
        }
    }

    /// Every write request the server answered, oldest first: the test server's write log, or
    /// a real server's audit log.
    pub fn writes(&self) -> Vec<WriteRecord> {
        match &self.backend {
            Backend::Test(s) => s.writes().records(),
            Backend::Real(s) => s.writes(),
        }
    }

    /// The CA that signed the server's serving certificate, PEM.
    pub fn ca_pem(&self) -> String {
        match &self.backend {
            Backend::Test(s) => s.ca_pem().unwrap_or_default().to_string(),
            Backend::Real(s) => s.ca_pem().to_string(),
        }
    }

    /// The bearer token of `identity` (e.g. to put in a Secret).
    pub fn token(&self, identity: &str) -> Result<String, HarnessError> {
        let found = match &self.backend {
            Backend::Test(s) => s.identity(identity),
            Backend::Real(s) => s.identity(identity),
        };
        found
            .map(|i| i.token)
            .ok_or_else(|| HarnessError::UnknownIdentity {
                cluster: self.name.clone(),
                identity: identity.to_string(),
            })
    }

    /// Adds an identity while running and writes its kubeconfig; returns the file. On a real
    /// server a ServiceAccount's token comes from the TokenRequest API, and any other identity
    /// authenticates with a client certificate.
    pub fn add_identity(&self, identity: Identity) -> Result<PathBuf, HarnessError> {
        let name = identity.name.clone();
        match &self.backend {
            Backend::Test(s) => s.add_identity(identity),
            Backend::Real(s) => s.add_identity(identity)?,
        }
        self.write_kubeconfigs()?;
        Ok(self.path_for(&name))
    }

    /// A kubeconfig holding only `identity`, as YAML (e.g. to put in a Secret).
    pub fn kubeconfig(&self, identity: &str) -> Result<String, HarnessError> {
        let found = match &self.backend {
            Backend::Test(s) => s.kubeconfig_for(identity),
            Backend::Real(s) => s.kubeconfig_for(identity),
        };
        found.ok_or_else(|| HarnessError::UnknownIdentity {
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
        let server = match &self.backend {
            Backend::Test(s) => s,
            Backend::Real(s) => return s.kubeconfig_with_client_certificate(identity),
        };
        server
            .kubeconfig_with_client_certificate(identity)
            .map_err(|source| match source {
                CertificateError::UnknownIdentity(identity) => HarnessError::UnknownIdentity {
                    cluster: self.name.clone(),
                    identity,
                },
                source => HarnessError::Certificate {
                    cluster: self.name.clone(),
                    source,
                },
            })
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
    /// Namespaced objects without a namespace go to `default`.
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
    Ok(api.patch(&name, &params, &Patch::Apply(&obj)).await?)
}

/// Everything one end-to-end test needs: a control plane, destination clusters, a directory
/// for kubeconfigs and process logs.
///
/// The directory is removed on drop unless [`Environment::keep`] was called or
/// `SHARDWISE_E2E_KEEP=1` is set.
#[derive(Debug)]
pub struct Environment {
    // Fields drop in this order: servers first, then etcd, then the directory they wrote to.
    control_plane: Cluster,
    destinations: Vec<Cluster>,
    real: Option<RealControlPlane>,
    kind: ServerKind,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    keep: bool,
}

/// What the kube-apiservers of a real environment share: etcd and the thread that spawns
/// their processes.
#[derive(Debug)]
struct RealControlPlane {
    etcd: Etcd,
    spawner: Spawner,
    binaries: Binaries,
    apiserver_args: Vec<String>,
}

type Configure = Box<dyn Fn(&str, ServerConfig) -> ServerConfig + Send>;

/// Builds an [`Environment`].
pub struct EnvironmentBuilder {
    destinations: usize,
    identities: Vec<Identity>,
    destination_identities: Vec<Identity>,
    rbac: bool,
    configure: Option<Configure>,
    kind: Option<ServerKind>,
    apiserver_args: Vec<String>,
}

impl std::fmt::Debug for EnvironmentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvironmentBuilder")
            .field("destinations", &self.destinations)
            .field("identities", &self.identities)
            .field("destination_identities", &self.destination_identities)
            .field("rbac", &self.rbac)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
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

    /// Enforce RBAC on every cluster.
    pub fn rbac(mut self, enforce: bool) -> Self {
        self.rbac = enforce;
        self
    }

    /// Adjusts each cluster's server configuration; gets the cluster name
    /// (`control-plane`, `dest-N`).
    pub fn configure(
        mut self,
        f: impl Fn(&str, ServerConfig) -> ServerConfig + Send + 'static,
    ) -> Self {
        self.configure = Some(Box::new(f));
        self
    }

    /// More flags for every real kube-apiserver (e.g. `--etcd-compaction-interval=10s`); the
    /// test server ignores them.
    pub fn apiserver_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.apiserver_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The server to run on, instead of `SHARDWISE_E2E_SERVER`'s choice.
    pub fn server(mut self, kind: ServerKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Starts the servers. A real environment runs RBAC always (the `rbac` and `configure`
    /// settings shape only test servers) and takes a few seconds per kube-apiserver.
    pub fn start(self) -> Result<Environment, HarnessError> {
        let kind = match self.kind {
            Some(kind) => kind,
            None => ServerKind::from_env()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("shardwise-e2e-")
            .tempdir()
            .map_err(io_error(&std::env::temp_dir()))?;
        let path = dir.path().to_path_buf();
        let keep = std::env::var("SHARDWISE_E2E_KEEP").is_ok_and(|v| v == "1" || v == "true");
        if kind == ServerKind::Real {
            let binaries = Binaries::locate()?;
            let spawner = Spawner::start()?;
            let etcd = Etcd::start(&spawner, &binaries, &path)?;
            let real = RealControlPlane {
                etcd,
                spawner,
                binaries,
                apiserver_args: self.apiserver_args.clone(),
            };
            let control_plane =
                Cluster::start_real("control-plane", &self.identities, &real, &path)?;
            let destinations = (0..self.destinations)
                .map(|i| {
                    let name = format!("dest-{i}");
                    Cluster::start_real(&name, &self.destination_identities, &real, &path)
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Environment {
                control_plane,
                destinations,
                real: Some(real),
                kind,
                dir: Some(dir),
                path,
                keep,
            });
        }
        let config = |name: &str, identities: &[Identity]| {
            let mut c = ServerConfig::default().rbac(self.rbac);
            for i in identities {
                c = c.identity(i.clone());
            }
            match &self.configure {
                Some(f) => f(name, c),
                None => c,
            }
        };
        let control_plane = Cluster::start(
            "control-plane",
            config("control-plane", &self.identities),
            &path,
        )?;
        let destinations = (0..self.destinations)
            .map(|i| {
                let name = format!("dest-{i}");
                Cluster::start(&name, config(&name, &self.destination_identities), &path)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Environment {
            control_plane,
            destinations,
            real: None,
            kind,
            dir: Some(dir),
            path,
            keep,
        })
    }
}

impl Environment {
    /// A builder for an environment of only a control plane, without RBAC, on the server
    /// `SHARDWISE_E2E_SERVER` chooses.
    pub fn builder() -> EnvironmentBuilder {
        EnvironmentBuilder {
            destinations: 0,
            identities: Vec::new(),
            destination_identities: Vec::new(),
            rbac: false,
            configure: None,
            kind: None,
            apiserver_args: Vec::new(),
        }
    }

    /// Which server the environment runs on.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// Kills etcd (SIGKILL) and starts it again on its data: every kube-apiserver of the
    /// environment loses its storage for a moment.
    ///
    /// # Errors
    /// On the test server, which has no etcd.
    pub fn restart_etcd(&self) -> Result<(), HarnessError> {
        match &self.real {
            Some(real) => real.etcd.restart(),
            None => Err(HarnessError::NeedsRealServer("restarting etcd")),
        }
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
