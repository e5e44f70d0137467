//! A real Kubernetes control plane as local processes, as controller-runtime's envtest runs
//! one: etcd and kube-apiserver built from their Go modules (`e2e/control-plane`, by
//! `scripts/control-plane.sh`), on free loopback ports, with generated serving certificates, a
//! client CA, a service-account signing key and issuer, RBAC, and an audit log that serves as
//! the write log. One etcd serves every kube-apiserver of an environment, each under its own
//! key prefix, so each is a cluster of its own. Identities other than the harness's `admin`
//! reach their server through a link of their own, an HTTPS proxy that injects the cluster's
//! [`Faults`](crate::Faults).

mod audit;
mod link;
mod supervisor;
mod workloads;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::RwLock;
use serde_json::json;

use shardwise_e2e_testkit::{
    CertificateAuthority, CertificateError, ClientCertificate, Credential, Identity, WriteRecord,
    kubeconfig_yaml,
};

use crate::HarnessError;
use crate::faults::Faults;
use crate::tls::IssuedCertificates;
use link::{LinkCertificates, Links};
use supervisor::Spawner;
use supervisor::Supervised;
use workloads::Workloads;

/// Where the control plane's binaries are: `$SHARDWISE_CONTROL_PLANE_BIN`, else the
/// workspace's `target/control-plane/`.
#[derive(Clone, Debug)]
struct Binaries {
    kube_apiserver: PathBuf,
    etcd: PathBuf,
    kube_controller_manager: PathBuf,
    kube_scheduler: PathBuf,
}

/// The directory of the control plane's binaries: `$SHARDWISE_CONTROL_PLANE_BIN`, else the
/// workspace's `target/control-plane/`.
fn binaries_dir() -> PathBuf {
    std::env::var_os("SHARDWISE_CONTROL_PLANE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/control-plane"))
}

/// A binary that scripts/control-plane.sh builds (`helm`, `kube-apiserver`, ...), or an
/// error naming where it was expected.
pub fn control_plane_binary(name: &str) -> Result<PathBuf, HarnessError> {
    let program = binaries_dir().join(name);
    present(&program)?;
    Ok(program)
}

impl Binaries {
    /// Finds kube-apiserver and etcd, or fails naming the first that is missing.
    fn locate() -> Result<Self, HarnessError> {
        let dir = binaries_dir();
        let binaries = Self {
            kube_apiserver: dir.join("kube-apiserver"),
            etcd: dir.join("etcd"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kube_scheduler: dir.join("kube-scheduler"),
        };
        for program in [&binaries.kube_apiserver, &binaries.etcd] {
            present(program)?;
        }
        Ok(binaries)
    }

    /// kube-controller-manager and kube-scheduler, needed only where pods run.
    fn workloads(&self) -> Result<(&Path, &Path), HarnessError> {
        present(&self.kube_controller_manager)?;
        present(&self.kube_scheduler)?;
        Ok((&self.kube_controller_manager, &self.kube_scheduler))
    }
}

fn present(program: &Path) -> Result<(), HarnessError> {
    if program.is_file() {
        Ok(())
    } else {
        Err(HarnessError::ControlPlaneMissing {
            program: program.to_path_buf(),
        })
    }
}

/// Runs `future` to completion on a runtime of its own, on a thread of its own, so that the
/// harness's synchronous constructors may wait for servers from inside a test's runtime.
fn block_on<F>(future: F) -> Result<F::Output, HarnessError>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        let thread = scope.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|runtime| runtime.block_on(future))
        });
        match thread.join() {
            Ok(result) => result.map_err(|source| HarnessError::Io {
                path: "tokio runtime".into(),
                source,
            }),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

fn write(path: &Path, contents: &str) -> Result<(), HarnessError> {
    std::fs::write(path, contents).map_err(|source| HarnessError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn certificate_error(cluster: &str) -> impl Fn(CertificateError) -> HarnessError + '_ {
    move |source| HarnessError::Certificate {
        cluster: cluster.to_string(),
        source,
    }
}

/// etcd, shared by an environment's kube-apiservers.
#[derive(Debug)]
struct Etcd {
    process: Mutex<Supervised>,
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    url: String,
    spawner: Spawner,
}

impl Etcd {
    fn start(spawner: &Spawner, binaries: &Binaries, dir: &Path) -> Result<Self, HarnessError> {
        let (client, peer) = (crate::free_port()?, crate::free_port()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args = vec![
            "--name=shardwise-e2e".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={url}"),
            format!("--advertise-client-urls={url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=shardwise-e2e={peer_url}"),
            // A test's data is thrown away at its end: durability buys nothing but disk waits.
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let process = spawner.spawn("etcd", &binaries.etcd, &args, dir)?;
        Ok(Self {
            process: Mutex::new(process),
            program: binaries.etcd.clone(),
            args,
            dir: dir.to_path_buf(),
            url,
            spawner: spawner.clone(),
        })
    }

    fn url(&self) -> &str {
        &self.url
    }

    fn pid(&self) -> u32 {
        self.process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pid()
    }

    fn restart(&self) -> Result<(), HarnessError> {
        let mut process = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        process.kill();
        *process = self
            .spawner
            .spawn("etcd", &self.program, &self.args, &self.dir)?;
        Ok(())
    }
}

/// How an identity's kubeconfig authenticates on a real server.
#[derive(Clone, Debug)]
enum Credentials {
    /// Its token, from the server's static token file (known at start).
    StaticToken,
    /// A ServiceAccount token issued by the server's TokenRequest API.
    ServiceAccountToken,
    /// A client certificate signed by the client CA.
    Certificate(ClientCertificate),
}

#[derive(Clone, Debug)]
struct RealIdentity {
    identity: Identity,
    credentials: Credentials,
}

impl RealIdentity {
    /// What its kubeconfig carries.
    fn credential(&self) -> Credential<'_> {
        match &self.credentials {
            Credentials::Certificate(cert) => Credential::Certificate(cert),
            Credentials::StaticToken | Credentials::ServiceAccountToken => {
                Credential::Token(&self.identity.token)
            }
        }
    }
}

/// A client certificate for `identity` from `client_ca`, the CA of cluster `cluster`.
fn issue_certificate(
    client_ca: &CertificateAuthority,
    cluster: &str,
    identity: &Identity,
) -> Result<ClientCertificate, HarnessError> {
    client_ca
        .client_certificate(&identity.name, &identity.user, &identity.groups)
        .map_err(|source| HarnessError::Certificate {
            cluster: cluster.to_string(),
            source,
        })
}

/// What the kube-apiservers of an environment share: etcd, the thread that spawns their
/// processes, their binaries and extra flags, and the client certificates issued on any of them
/// (which every link may present).
#[derive(Debug)]
pub(crate) struct Shared {
    etcd: Etcd,
    spawner: Spawner,
    binaries: Binaries,
    apiserver_args: Vec<String>,
    issued: IssuedCertificates,
    /// The node network's gateway, where every link listens when pods run (they reach the
    /// servers there); loopback otherwise.
    link_address: std::net::IpAddr,
}

impl Shared {
    /// Finds the binaries and starts etcd with its data in `dir`; links will listen on
    /// `link_address`.
    pub(crate) fn start(
        apiserver_args: Vec<String>,
        link_address: std::net::IpAddr,
        dir: &Path,
    ) -> Result<Self, HarnessError> {
        let binaries = Binaries::locate()?;
        let spawner = Spawner::start()?;
        let etcd = Etcd::start(&spawner, &binaries, dir)?;
        Ok(Self {
            etcd,
            spawner,
            binaries,
            apiserver_args,
            issued: IssuedCertificates::default(),
            link_address,
        })
    }

    /// Kills etcd (SIGKILL) and starts it again on the same ports and data.
    pub(crate) fn restart_etcd(&self) -> Result<(), HarnessError> {
        self.etcd.restart()
    }

    /// The process ID of etcd (a new one after [`Shared::restart_etcd`]).
    pub(crate) fn etcd_pid(&self) -> u32 {
        self.etcd.pid()
    }

    /// etcd's client URL, where it also serves `/metrics`.
    pub(crate) fn etcd_url(&self) -> &str {
        self.etcd.url()
    }
}

/// One kube-apiserver: a cluster of its own, stored in the shared etcd under its own prefix.
#[derive(Debug)]
pub struct RealApiServer {
    // Dropped first: they are the server's clients.
    workloads: Option<Workloads>,
    name: String,
    url: String,
    dir: PathBuf,
    serving_ca: String,
    client_ca: CertificateAuthority,
    identities: RwLock<Vec<RealIdentity>>,
    process: Mutex<Supervised>,
    program: PathBuf,
    args: Vec<String>,
    spawner: Spawner,
    audit_log: PathBuf,
    links: Links,
}

static VERSION_PRINTED: Once = Once::new();

/// How many ports a kube-apiserver is tried on before its start fails.
const PORT_ATTEMPTS: u32 = 3;

/// How long a kube-apiserver may take to become ready (2 cores, several starting at once).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

impl RealApiServer {
    /// Starts kube-apiserver `name` on the shared etcd, with `identities` (and an `admin`) and
    /// the shared extra flags after its own, and waits until it is ready. A cluster that
    /// `runs_pods` also gets kube-controller-manager and kube-scheduler, and authorizes nodes
    /// as every real cluster does (the Node authorizer and the NodeRestriction admission).
    pub(crate) fn start(
        name: &str,
        identities: &[Identity],
        shared: &Shared,
        dir: &Path,
        runs_pods: bool,
    ) -> Result<Self, HarnessError> {
        let Shared {
            etcd,
            spawner,
            binaries,
            apiserver_args: extra_args,
            issued,
            link_address,
        } = shared;
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|source| HarnessError::Io {
            path: dir.clone(),
            source,
        })?;
        let cert_error = certificate_error(name);
        let serving_ca =
            CertificateAuthority::generate(&format!("{name}-serving-ca")).map_err(&cert_error)?;
        // Pods dial the links at the node network's address, and name the control plane as
        // in-cluster clients do.
        let mut names = Vec::new();
        if !link_address.is_loopback() {
            names.push(link_address.to_string());
            for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
                names.push(name.to_string());
            }
        }
        let serving = serving_ca
            .serving_certificate_for(&format!("{name}-kube-apiserver"), &names)
            .map_err(&cert_error)?;
        let client_ca =
            CertificateAuthority::generate(&format!("{name}-client-ca")).map_err(&cert_error)?;
        let signing_key =
            rcgen::KeyPair::generate().map_err(|e| cert_error(CertificateError::Generate(e)))?;
        let files = [
            ("serving.crt", serving.cert_pem.clone()),
            ("serving.key", serving.key_pem.clone()),
            ("serving-ca.crt", serving_ca.pem()),
            ("client-ca.crt", client_ca.pem()),
            ("service-accounts.key", signing_key.serialize_pem()),
            ("service-accounts.pub", signing_key.public_key_pem()),
            ("audit-policy.yaml", audit::POLICY.to_string()),
        ];
        for (file, contents) in &files {
            write(&dir.join(file), contents)?;
        }

        let mut all = vec![Identity::admin("admin")];
        for identity in identities {
            all.retain(|i| i.name != identity.name);
            all.push(identity.clone());
        }
        // Static tokens carry the identity's name as the user's UID, so the audit log says
        // which identity sent each write even when several share a user.
        let tokens: String = all
            .iter()
            .map(|i| {
                format!(
                    "{},{},{},\"{}\"\n",
                    i.token,
                    i.user,
                    i.name,
                    i.groups.join(",")
                )
            })
            .collect();
        write(&dir.join("tokens.csv"), &tokens)?;
        let identities = all
            .into_iter()
            .map(|identity| {
                let credentials = if identity.is_admin() {
                    Credentials::Certificate(issue_certificate(&client_ca, name, &identity)?)
                } else {
                    Credentials::StaticToken
                };
                Ok(RealIdentity {
                    identity,
                    credentials,
                })
            })
            .collect::<Result<Vec<_>, HarnessError>>()?;

        // A free port may be taken by another process before kube-apiserver binds it (tests
        // run in parallel): then it exits at once, and it is started again on another port.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = crate::free_port()?;
            let url = format!("https://127.0.0.1:{port}");
            let file = |f: &str| dir.join(f).display().to_string();
            let mut args = vec![
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", file("serving.crt")),
                format!("--tls-private-key-file={}", file("serving.key")),
                format!("--cert-dir={}", dir.display()),
                format!("--etcd-servers={}", etcd.url()),
                format!("--etcd-prefix=/{name}"),
                format!("--client-ca-file={}", file("client-ca.crt")),
                format!("--token-auth-file={}", file("tokens.csv")),
                format!("--service-account-issuer={url}"),
                format!(
                    "--service-account-key-file={}",
                    file("service-accounts.pub")
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    file("service-accounts.key")
                ),
                if runs_pods {
                    "--authorization-mode=Node,RBAC"
                } else {
                    "--authorization-mode=RBAC"
                }
                .to_string(),
                // kubeadm's default range: a /24 holds 254 Services, and the fleet benchmark
                // applies one per app (20,000).
                "--service-cluster-ip-range=10.96.0.0/12".to_string(),
                "--allow-privileged=true".to_string(),
                // The server's address is loopback, which no Endpoints object may hold; pods
                // reach it through the address their node agent gives them instead.
                "--endpoint-reconciler-type=none".to_string(),
                format!("--audit-policy-file={}", file("audit-policy.yaml")),
                format!("--audit-log-path={}", file("audit.log")),
                "--audit-log-format=json".to_string(),
                "--audit-log-maxbackup=0".to_string(),
                "--profiling=false".to_string(),
            ];
            if runs_pods {
                args.push("--enable-admission-plugins=NodeRestriction".to_string());
            }
            args.extend(extra_args.iter().cloned());
            let process = spawner.spawn("kube-apiserver", &binaries.kube_apiserver, &args, &dir)?;
            let mut server = Self {
                workloads: None,
                name: name.to_string(),
                url,
                serving_ca: serving_ca.pem(),
                client_ca: client_ca.clone(),
                identities: RwLock::new(identities.clone()),
                process: Mutex::new(process),
                program: binaries.kube_apiserver.clone(),
                args,
                spawner: spawner.clone(),
                audit_log: dir.join("audit.log"),
                links: Links::new(
                    std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                    *link_address,
                    LinkCertificates {
                        serving_cert: &serving.cert_pem,
                        serving_key: &serving.key_pem,
                        serving_ca: &serving_ca.pem(),
                    },
                    issued.clone(),
                )?,
                dir: dir.clone(),
            };
            for identity in &identities {
                if let Credentials::Certificate(cert) = &identity.credentials {
                    server.links.register(cert)?;
                }
            }
            match server.wait_ready() {
                Ok(()) => {
                    if runs_pods {
                        server.workloads = Some(Workloads::start(&server, spawner, binaries)?);
                    }
                    return Ok(server);
                }
                Err(HarnessError::NotReady { log, .. })
                    if attempt < PORT_ATTEMPTS && log.contains("address already in use") =>
                {
                    tracing::info!(cluster = name, attempt, "port taken; starting again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Where its files are: certificates, keys, kubeconfigs of its components, logs.
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// A kubeconfig for one of the cluster's own components (`user`, e.g.
    /// `system:kube-scheduler`, which the default RBAC knows): a new client certificate, and the
    /// server's own address, where no fault reaches.
    fn component_kubeconfig(&self, user: &str) -> Result<String, HarnessError> {
        self.component_kubeconfig_in(user, &[])
    }

    /// A node agent's kubeconfig: `system:node:<node>` in group `system:nodes`, as a kubelet
    /// authenticates, so that the Node authorizer and NodeRestriction judge it.
    pub(crate) fn node_kubeconfig(&self, node: &str) -> Result<String, HarnessError> {
        self.component_kubeconfig_in(&format!("system:node:{node}"), &["system:nodes"])
    }

    /// What opens the link of each pod a node agent starts (the pod's name is its identity,
    /// so faults scoped to it reach it).
    pub(crate) fn link_opener(&self) -> link::LinkOpener {
        self.links.opener()
    }

    fn component_kubeconfig_in(&self, user: &str, groups: &[&str]) -> Result<String, HarnessError> {
        let identity = Identity::new(user, user).with_groups(groups.iter().copied());
        let cert = issue_certificate(&self.client_ca, &self.name, &identity)?;
        Ok(kubeconfig_yaml(
            &self.name,
            &self.url,
            Some(&self.serving_ca),
            &[(user, Credential::Certificate(&cert))],
            user,
        ))
    }

    /// The CA of the serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.serving_ca
    }

    /// The process ID of kube-apiserver (a new one after [`RealApiServer::restart`]).
    pub fn pid(&self) -> u32 {
        self.process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pid()
    }

    fn find(&self, identity: &str) -> Option<RealIdentity> {
        self.identities
            .read()
            .iter()
            .find(|i| i.identity.name == identity)
            .cloned()
    }

    pub(crate) fn identity(&self, name: &str) -> Option<Identity> {
        self.find(name).map(|i| i.identity)
    }

    pub(crate) fn identities(&self) -> Vec<Identity> {
        self.identities
            .read()
            .iter()
            .map(|i| i.identity.clone())
            .collect()
    }

    fn admin_kubeconfig(&self) -> Result<String, HarnessError> {
        self.kubeconfig_for("admin")
            .ok_or_else(|| HarnessError::UnknownIdentity {
                cluster: self.name.clone(),
                identity: "admin".into(),
            })
    }

    /// A kubeconfig holding only `identity`, with its credentials on this server.
    pub fn kubeconfig_for(&self, identity: &str) -> Option<String> {
        let i = self.find(identity)?;
        let url = self.url_for(&i.identity).ok()?;
        Some(kubeconfig_yaml(
            &self.name,
            &url,
            Some(&self.serving_ca),
            &[(identity, i.credential())],
            identity,
        ))
    }

    /// Where `identity` reaches the server: the harness's `admin` directly, any other identity
    /// through a link of its own, where the server's [`Faults`] reach it.
    pub fn url_for(&self, identity: &Identity) -> Result<String, HarnessError> {
        if identity.name == "admin" {
            return Ok(self.url.clone());
        }
        Ok(format!(
            "https://{}:{}",
            self.links.address(),
            self.links.port(&identity.name)?
        ))
    }

    /// The faults its links inject into every identity's requests but the harness's `admin`.
    pub fn faults(&self) -> &Faults {
        self.links.faults()
    }

    /// A kubeconfig with every identity; the admin is current.
    pub fn kubeconfig(&self) -> String {
        let identities = self.identities.read().clone();
        let users: Vec<_> = identities
            .iter()
            .map(|i| (i.identity.name.as_str(), i.credential()))
            .collect();
        kubeconfig_yaml(
            &self.name,
            &self.url,
            Some(&self.serving_ca),
            &users,
            "admin",
        )
    }

    /// A kubeconfig holding only `identity`, authenticating with a newly issued client
    /// certificate from the server's client CA.
    pub fn kubeconfig_with_client_certificate(
        &self,
        identity: &str,
    ) -> Result<String, HarnessError> {
        let i = self
            .identity(identity)
            .ok_or_else(|| HarnessError::UnknownIdentity {
                cluster: self.name.clone(),
                identity: identity.to_string(),
            })?;
        let cert = issue_certificate(&self.client_ca, &self.name, &i)?;
        self.links.register(&cert)?;
        Ok(kubeconfig_yaml(
            &self.name,
            &self.url_for(&i)?,
            Some(&self.serving_ca),
            &[(identity, Credential::Certificate(&cert))],
            identity,
        ))
    }

    /// Adds an identity while the server runs. A ServiceAccount's gets a real token from the
    /// TokenRequest API (the ServiceAccount and its namespace are created if missing); any other
    /// authenticates with a client certificate, since static tokens are read only at start.
    pub fn add_identity(&self, identity: Identity) -> Result<(), HarnessError> {
        let service_account = identity
            .service_account_name()
            .map(|(ns, sa)| (ns.to_string(), sa.to_string()));
        let entry = match service_account {
            Some((namespace, account)) => {
                let token = block_on(self.request_token(&namespace, &account))??;
                RealIdentity {
                    identity: Identity { token, ..identity },
                    credentials: Credentials::ServiceAccountToken,
                }
            }
            None => {
                let cert = issue_certificate(&self.client_ca, &self.name, &identity)?;
                self.links.register(&cert)?;
                RealIdentity {
                    identity,
                    credentials: Credentials::Certificate(cert),
                }
            }
        };
        let mut identities = self.identities.write();
        identities.retain(|i| i.identity.name != entry.identity.name);
        identities.push(entry);
        Ok(())
    }

    async fn admin_client(&self) -> Result<kube::Client, HarnessError> {
        crate::client::client_of(&self.name, &self.admin_kubeconfig()?).await
    }

    async fn request_token(&self, namespace: &str, account: &str) -> Result<String, HarnessError> {
        let client = self.admin_client().await?;
        let apply = PatchParams::apply(crate::FIELD_MANAGER).force();
        Api::<Namespace>::all(client.clone())
            .patch(
                namespace,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": namespace}})),
            )
            .await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, namespace);
        accounts
            .patch(
                account,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                                     "metadata": {"name": account, "namespace": namespace}})),
            )
            .await?;
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86_400},
        }))
        .map_err(|e| HarnessError::Kubeconfig {
            cluster: self.name.clone(),
            reason: e.to_string(),
        })?;
        let issued = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await?;
        Ok(issued.status.map(|s| s.token).unwrap_or_default())
    }

    /// Waits for `/readyz`, then prints the server's version once per test process.
    fn wait_ready(&self) -> Result<(), HarnessError> {
        let started = Instant::now();
        let version = block_on(async {
            let client = self.admin_client().await?;
            let mut last = String::new();
            while started.elapsed() < READY_TIMEOUT {
                if let Some(status) = self
                    .process
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .exited()
                {
                    last = format!("kube-apiserver exited ({status})");
                    break;
                }
                let request = http::Request::get("/readyz").body(Vec::new());
                match request {
                    Ok(request) => match client.request_text(request).await {
                        Ok(_) => return Ok(client.apiserver_version().await?.git_version),
                        Err(e) => last = e.to_string(),
                    },
                    Err(e) => last = e.to_string(),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(HarnessError::NotReady {
                cluster: self.name.clone(),
                waited: started.elapsed(),
                last,
                log: self
                    .process
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .log_tail(30),
            })
        })??;
        // Straight to the process's stderr: the test harness captures only the print macros,
        // and the version a suite ran on belongs in its output.
        VERSION_PRINTED.call_once(|| {
            let _ = writeln!(
                std::io::stderr(),
                "shardwise-e2e: real control plane: kube-apiserver {version} (ready in {:.1} s)",
                started.elapsed().as_secs_f64()
            );
        });
        tracing::info!(cluster = %self.name, %version, ready_after = ?started.elapsed(), "kube-apiserver ready");
        Ok(())
    }

    /// Every write the server answered, from its audit log, oldest first.
    pub fn writes(&self) -> Vec<WriteRecord> {
        let mut requests = self.requests();
        requests.retain(|r| r.method != "LIST");
        requests
    }

    /// Every write and LIST (`method` = `LIST`) the server answered, from its audit log,
    /// oldest first.
    pub fn requests(&self) -> Vec<WriteRecord> {
        let identities = self.identities.read().clone();
        audit::read_requests(&self.audit_log, |user, uid| {
            identities
                .iter()
                .find(|i| !uid.is_empty() && i.identity.name == uid)
                .or_else(|| identities.iter().find(|i| i.identity.user == user))
                .map_or_else(|| user.to_string(), |i| i.identity.name.clone())
        })
    }

    /// The requests received in `[from, to)`, by user and kind, from the audit log.
    pub fn requests_by_user(
        &self,
        from: std::time::SystemTime,
        to: std::time::SystemTime,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<crate::RequestKind, u64>>
    {
        audit::count_requests(&self.audit_log, from, to)
    }

    /// Kills kube-apiserver (SIGKILL), starts it again on the same port, and waits until it
    /// is ready: clients see connections refused, then a server with a new watch cache.
    pub fn restart(&self) -> Result<(), HarnessError> {
        {
            let mut process = self.process.lock().unwrap_or_else(PoisonError::into_inner);
            process.kill();
            *process =
                self.spawner
                    .spawn("kube-apiserver", &self.program, &self.args, &self.dir)?;
        }
        self.wait_ready()
    }
}
