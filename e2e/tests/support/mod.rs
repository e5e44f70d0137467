//! A shardwise fleet on kube-apiserver and etcd: destination clusters, FleetClusters and
//! FleetApps, and real `shardwise-controller` processes, one per replica: pods of the chart
//! installed by Helm, which the real StatefulSet controller creates and a node agent runs, or
//! processes the harness starts itself (the test server's way, and some benchmarks').

#![allow(dead_code)]

pub mod chart;
pub mod fencing;
pub mod pods;
pub mod prometheus;
pub mod ranges;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use shard_assign::{KeyRange, app_key};
use shardwise_api::{FleetApp, FleetCluster, SyncPhase};
use shardwise_e2e::{
    Environment, Identity, Process, ProcessSpec, free_port, scrape, wait_for, wait_with,
};
use shardwise_handoff::keys::{
    DRAIN_TO_ANNOTATION, SHARD_LABEL, SLICES_LABEL, UNIT_LABEL, unit_token,
};
use shardwise_runtime::slice::UnitSlice;

pub const NAMESPACE: &str = "shardwise";
pub const STATEFULSET: &str = "shardwise";

/// The identity of the controller on destination clusters (cluster admin there).
pub const DESTINATION_IDENTITY: &str = "shardwise-destination";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Who runs the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runner {
    /// charts/shardwise installed by Helm: the real StatefulSet controller creates and deletes
    /// the pods, and a node agent runs each as a process of this workspace's binary.
    #[default]
    Pods,
    /// The harness starts and stops one process per ordinal itself, as the StatefulSet
    /// controller would: the test server's only way (it runs no pods), and that of the
    /// benchmarks whose figures go back to before pods ran here.
    Played,
}

/// How to build a fleet.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Who runs the replicas (always [`Runner::Played`] on the test server).
    pub runner: Runner,
    /// More chart values (`helm --set` pairs) for replicas that run as pods, e.g.
    /// `sizing.autoscale=true`.
    pub values: Vec<String>,
    pub replicas: u32,
    pub clusters: u32,
    pub apps: u32,
    pub destinations: usize,
    /// Extra flags for every replica (pods: the chart's `extraArgs`).
    pub args: Vec<String>,
    /// Record every reconcile interval to a per-replica audit file, and check the fleet's
    /// safety when it ends ([`Fleet::assert_safe`]): on by default, so that no suite forgets.
    pub audit: bool,
    /// Short resync, probe and plan intervals (tests); off, the controller's defaults (benchmarks).
    pub fast: bool,
    /// Latency added to every request to the destination clusters.
    pub destination_latency: Option<Duration>,
    /// Apps of a realistic size (a Deployment, a Service and a ConfigMap) instead of one small
    /// ConfigMap.
    pub realistic_apps: bool,
    /// Metrics over HTTPS for authorized scrapers, as the chart sets them up: a certificate
    /// signed by a CA of the fleet's, and a `scraper` identity bound to deploy/rbac.yaml's
    /// reader role. Off, plain HTTP on the probes' port.
    pub secure_metrics: bool,
    /// The percentage of the apps that target `cluster-0`; the others are spread evenly over
    /// the other clusters. `None`: every cluster gets the same share.
    pub hot_percent: Option<u32>,
    /// The `shardwise-controller` binary every played replica runs; `None`: the workspace's,
    /// built from the current source when the fleet starts
    /// ([`shardwise_e2e::controller_binary`]). The demo names its own. Pods run the image's,
    /// which the node builds from the current source.
    pub controller: Option<PathBuf>,
    /// More identities on every destination cluster, known from the start (a real server reads
    /// its static tokens only then).
    pub destination_identities: Vec<Identity>,
    /// More flags for every kube-apiserver.
    pub apiserver_args: Vec<String>,
    /// More environment variables for every played replica (e.g. `FAILPOINTS`).
    pub replica_env: Vec<(String, String)>,
    /// The in-memory test API server instead of kube-apiserver and etcd: `make demo`'s default,
    /// which then needs no Go build, and the 50,000-app benchmark's, which kube-apiserver bounds
    /// on 2 cores. No test runs on it.
    #[cfg(feature = "test-server")]
    pub test_server: bool,
    /// Apps created with their cluster's token, as in any fleet a planner has run on once (it
    /// writes the token when an app has none); otherwise the planner writes every app's first.
    pub tokened_apps: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            runner: Runner::default(),
            values: Vec::new(),
            replicas: 3,
            clusters: 20,
            apps: 500,
            destinations: 2,
            args: Vec::new(),
            audit: true,
            fast: true,
            destination_latency: None,
            realistic_apps: false,
            secure_metrics: false,
            hot_percent: None,
            controller: None,
            destination_identities: Vec::new(),
            apiserver_args: Vec::new(),
            replica_env: Vec::new(),
            #[cfg(feature = "test-server")]
            test_server: false,
            tokened_apps: false,
        }
    }
}

/// One replica.
pub struct Replica {
    pub metrics_url: String,
    pub ready_url: String,
    /// The name of its link to the control plane: faults scoped to it
    /// (`FaultScope::identity`, `Cluster::partition`) reach this replica alone.
    pub link: String,
    run: Run,
}

enum Run {
    Process(Process),
    Pod(pods::PodRun),
}

impl Replica {
    /// Its process.
    pub fn pid(&self) -> u32 {
        match &self.run {
            Run::Process(process) => process.pid(),
            Run::Pod(pod) => pod.pid,
        }
    }

    /// What it wrote to stdout and stderr (a pod: every run of its container).
    pub fn logs(&self) -> String {
        match &self.run {
            Run::Process(process) => process.stdout() + &process.stderr(),
            Run::Pod(pod) => pod.logs(CONTAINER),
        }
    }

    /// Its logs for a failure message.
    pub fn report(&self) -> String {
        match &self.run {
            Run::Process(process) => process.report(),
            Run::Pod(pod) => format!(
                "--- pod {} ({}):\n{}",
                pod.name,
                pod.uid,
                pod.logs(CONTAINER)
            ),
        }
    }

    /// Freezes its process (SIGSTOP), as a long GC pause or a VM live migration would.
    pub fn pause(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Thaws it (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        send_signal(self.pid(), signal)
    }

    /// Its process, when the harness started it.
    pub fn process_mut(&mut self) -> Option<&mut Process> {
        match &mut self.run {
            Run::Process(process) => Some(process),
            Run::Pod(_) => None,
        }
    }

    /// The pod it runs in, when it does.
    pub fn pod(&self) -> Option<&pods::PodRun> {
        match &self.run {
            Run::Process(_) => None,
            Run::Pod(pod) => Some(pod),
        }
    }
}

fn send_signal(pid: u32, signal: nix::sys::signal::Signal) -> Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid)?), signal)?;
    Ok(())
}

/// The chart's container of the controller.
const CONTAINER: &str = "controller";

pub struct Fleet {
    /// Every state of the shard leases since before the first replica started, so that every
    /// term that wrote anywhere is known (a replica that loses its lease takes it again under a
    /// new identity). First, so that it stops before the control plane does.
    pub leases: fencing::LeaseHistory,
    pub env: Environment,
    pub options: FleetOptions,
    pub admin: Client,
    pub replicas: BTreeMap<u32, Replica>,
    /// Who runs the replicas.
    pub runner: Runner,
    /// Audit files of every played replica incarnation, for the overlap check.
    audits: Vec<PathBuf>,
    /// Pods of replicas that are gone or lost, by UID: a replica started again runs in another.
    retired: BTreeSet<String>,
    /// Pods [`Self::kill_replica`] left behind, by ordinal, as a dead node leaves them.
    lost: BTreeMap<u32, String>,
    /// When the first replica was started.
    pub started: std::time::Instant,
    /// With secure metrics: how to scrape them.
    pub metrics_access: Option<MetricsAccess>,
    /// The `shardwise-controller` binary every played replica runs.
    controller: Option<PathBuf>,
    /// pid -> when [`Self::kill_replica`] killed it: its open reconcile ended then.
    deaths: BTreeMap<u32, u64>,
    /// Processes [`Self::freeze`] froze, and when they ran again.
    freezes: Vec<Freeze>,
    /// [`Self::assert_safe`] ran: the end of the fleet need not run it again.
    safety_checked: std::sync::atomic::AtomicBool,
}

/// A replica process frozen (SIGSTOP) and thawed (SIGCONT), on the audit's clock.
#[derive(Clone, Debug)]
pub struct Freeze {
    pub pid: u32,
    /// Once every thread of it had stopped.
    pub frozen_at: u64,
    /// Just before it was sent SIGCONT; `None` while it is still frozen.
    pub resumed_at: Option<u64>,
    /// When it was first seen running again after SIGCONT (its threads' run time grew): on a
    /// loaded machine the scheduler may take hundreds of milliseconds to give it a CPU.
    pub ran_again_at: std::sync::Arc<std::sync::OnceLock<u64>>,
}

impl Freeze {
    /// From when the process could react to its fence: when it ran again, or if that was not
    /// seen, when it was sent SIGCONT.
    fn running_since(&self) -> Option<u64> {
        self.ran_again_at.get().copied().or(self.resumed_at)
    }
}

/// How long after its term's fence a replica's reconciles in flight may still run, or after a
/// process frozen past its fence runs again (first seen on a CPU after SIGCONT, not merely
/// sent it): they end at their next `await` once the lease task or the term's timer sees the
/// fence (docs/guarantees.md). The bound leaves room for a loaded machine's scheduling of the
/// process's other threads; docs/benchmarks.md has what the suite measured.
pub const FENCE_REACTION: Duration = Duration::from_millis(250);

/// The API groups a replica writes to outside its terms: its leases, and the reviews of its
/// metrics server.
const OUTSIDE_TERMS: [&str; 3] = [
    "/apis/coordination.k8s.io/",
    "/apis/authentication.k8s.io/",
    "/apis/authorization.k8s.io/",
];

/// What [`Fleet::assert_safe`] checked.
#[derive(Debug)]
pub struct Safety {
    /// Every reconcile interval of every replica incarnation's audit.
    pub intervals: Vec<shardwise_runtime::audit::Interval>,
    /// Reconciles frozen in flight that overlapped a successor's and ended at the fence
    /// within [`FENCE_REACTION`] of the resume.
    pub cut_after_resume: usize,
    /// The latest such end after its resume.
    pub slowest_cut: Duration,
    /// Destination writes matched to their term and checked against its lease.
    pub destination_writes: usize,
    /// Control-plane writes of the replicas' terms, checked alike.
    pub control_plane_writes: usize,
}

/// What an authorized scraper of secure metrics has.
#[derive(Clone, Debug)]
pub struct MetricsAccess {
    /// `tls.crt`, `tls.key` and `ca.crt`, as a cert-manager Secret lays them out.
    pub certificates: PathBuf,
    /// The CA of the serving certificates, DER.
    pub ca: Vec<u8>,
    /// A bearer token of the control plane allowed to read `/metrics`.
    pub token: String,
}

/// The identity on the control plane that may read every replica's metrics.
pub const SCRAPER_IDENTITY: &str = "scraper";

/// The Secret of the pods' serving certificate for secure metrics.
const METRICS_SECRET: &str = "shardwise-metrics-tls";

/// The chart's ports of /metrics and of the probes.
const METRICS_PORT: u16 = 8080;
const HEALTH_PORT: u16 = 8081;

/// How long a pod may take to be created and start its container, and to go.
const POD_START: Duration = Duration::from_secs(120);
const POD_STOP: Duration = Duration::from_secs(90);

/// `helm install` of charts/shardwise as release [`STATEFULSET`] in [`NAMESPACE`], with the
/// fleet's options as chart values: its replicas, the fast intervals, the audit file, metrics,
/// `args` as `extraArgs`, then `values`.
fn install_chart(env: &Environment, options: &FleetOptions) -> Result<()> {
    let chart = repo_file("charts/shardwise");
    let mut args: Vec<String> = [
        "install",
        STATEFULSET,
        chart.to_str().ok_or("the chart's path is not UTF-8")?,
        "--namespace",
        NAMESPACE,
    ]
    .map(String::from)
    .to_vec();
    let mut set = |value: String| args.extend(["--set".to_string(), value]);
    set(format!("replicas={}", options.replicas));
    if options.fast {
        for value in [
            "controller.resyncInterval=5s",
            "controller.probeInterval=5s",
            "controller.planInterval=3s",
            r"controller.log=info\,kube=warn",
        ] {
            set(value.to_string());
        }
    }
    if options.audit {
        set(format!("controller.auditFile={}", pods::AUDIT_FILE));
    }
    if options.secure_metrics {
        set(format!("metrics.certSecret={METRICS_SECRET}"));
    } else {
        set("metrics.secure=false".to_string());
    }
    for value in &options.values {
        set(value.clone());
    }
    if options.secure_metrics {
        args.extend([
            "--set-json".to_string(),
            r#"metrics.readers=[{"kind":"ServiceAccount","name":"prometheus","namespace":"monitoring"}]"#.to_string(),
        ]);
    }
    if !options.args.is_empty() {
        args.extend([
            "--set-json".to_string(),
            format!("extraArgs={}", serde_json::to_string(&options.args)?),
        ]);
    }
    // A defect seeded for the matrix (scripts/defects.sh) reaches the pods too: a played
    // replica inherits the variable, a container only gets what its pod spec gives it.
    if let Ok(points) = std::env::var("FAILPOINTS") {
        args.extend([
            "--set-json".to_string(),
            format!(
                "extraEnv={}",
                json!([{"name": "FAILPOINTS", "value": points}])
            ),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    chart::helm(env, &args);
    Ok(())
}

/// A CA and a serving certificate for `hosts` signed by it, written as `tls.crt`, `tls.key`
/// and `ca.crt` into `dir`; returns the CA as DER.
pub fn write_serving_certificate(dir: &std::path::Path, hosts: Vec<String>) -> Result<Vec<u8>> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    std::fs::create_dir_all(dir)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(hosts)?.signed_by(&key, &ca)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    std::fs::write(dir.join("ca.crt"), ca.pem())?;
    Ok(ca.der().to_vec())
}

/// `GET path` of `url` trusting `ca` and sending `token`: the status and the body (or the
/// error, with status 0, when no answer came).
pub async fn get(url: &str, ca: Option<&[u8]>, token: Option<&str>, path: &str) -> (u16, String) {
    let uri = match url.parse() {
        Ok(uri) => uri,
        Err(e) => return (0, format!("{url}: {e}")),
    };
    let mut config = kube::Config::new(uri);
    config.root_cert = ca.map(|der| vec![der.to_vec()]);
    config.auth_info.token = token.map(|t| secrecy::SecretString::from(t.to_string()));
    config.default_retry = false;
    let client = match Client::try_from(config) {
        Ok(client) => client,
        Err(e) => return (0, e.to_string()),
    };
    let request = match http::Request::get(path).body(Vec::new()) {
        Ok(request) => request,
        Err(e) => return (0, e.to_string()),
    };
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => (0, other.to_string()),
    }
}

/// Flags that make a test fleet react in seconds rather than minutes.
pub fn fast_flags() -> Vec<String> {
    [
        "--resync-interval=5s",
        "--probe-interval=5s",
        "--plan-interval=3s",
        "--log=info,kube=warn",
    ]
    .map(String::from)
    .to_vec()
}

/// Client limits raised so that thousands of apps settle in CI's time: what such tests check is
/// where work goes, not how fast (the fleet benchmark keeps the defaults).
pub fn raised_client_limits() -> Vec<String> {
    [
        "--kube-qps=200",
        "--kube-burst=400",
        "--planner-qps=1000",
        "--planner-burst=2000",
        "--cluster-qps=100",
        "--cluster-burst=200",
    ]
    .map(String::from)
    .to_vec()
}

pub fn statefulset_yaml(replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: {STATEFULSET}\n  namespace: {NAMESPACE}\nspec:\n  replicas: {replicas}\n  serviceName: {STATEFULSET}\n  selector:\n    matchLabels:\n      app: shardwise\n  template:\n    metadata:\n      labels:\n        app: shardwise\n    spec:\n      containers:\n        - name: controller\n          image: shardwise:test\n"
    )
}

/// The manifests of app `index`: one ConfigMap named after the app.
pub fn app_manifests(index: u32, generation: u32) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{index}\ndata:\n  generation: \"{generation}\"\n  payload: \"{}\"\n",
        "x".repeat(64)
    )
}

/// A typical small app: a Deployment, its Service and a ConfigMap of settings (about 2.5 KB).
pub fn realistic_manifests(index: u32) -> String {
    let settings: String = (0..24)
        .map(|k| {
            format!(
                "  SETTING_{k:02}: \"value-{index}-{k:02}-{}\"\n",
                "v".repeat(40)
            )
        })
        .collect();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{index}\n  labels: {{app: app-{index}, tier: web}}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: app-{index}}}\n  template:\n    metadata:\n      labels: {{app: app-{index}, tier: web}}\n    spec:\n      containers:\n        - name: web\n          image: registry.example.com/team/app-{index}:1.0.{index}\n          ports: [{{containerPort: 8080, name: http}}]\n          envFrom: [{{configMapRef: {{name: app-{index}-settings}}}}]\n          resources: {{requests: {{cpu: 100m, memory: 128Mi}}, limits: {{memory: 256Mi}}}}\n          readinessProbe: {{httpGet: {{path: /healthz, port: http}}, periodSeconds: 10}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: app-{index}\nspec:\n  selector: {{app: app-{index}}}\n  ports: [{{name: http, port: 80, targetPort: http}}]\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{index}-settings\ndata:\n{settings}"
    )
}

/// Prints the harness's and node agents' logs into the test's output when `RUST_LOG` is set
/// (e.g. `RUST_LOG=shardwise_e2e_node=debug`): what a node agent did with a pod that would not
/// go is otherwise invisible. Once per test binary; a subscriber already set is kept.
fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

impl Fleet {
    pub async fn start(options: FleetOptions) -> Result<Self> {
        init_logs();
        #[cfg(feature = "test-server")]
        let runner = if options.test_server {
            Runner::Played
        } else {
            options.runner
        };
        #[cfg(not(feature = "test-server"))]
        let runner = options.runner;
        // Built first, and blocking: nothing of the fleet runs or is timed yet.
        let controller = match (&options.controller, runner) {
            (Some(path), _) => Some(path.clone()),
            (None, Runner::Played) => Some(shardwise_e2e::controller_binary()?),
            (None, Runner::Pods) => None,
        };
        let mut builder = Environment::builder()
            .destinations(options.destinations)
            .destination_identity(Identity::admin(DESTINATION_IDENTITY));
        #[cfg(feature = "test-server")]
        if options.test_server {
            builder = builder.test_server();
        }
        builder = builder.apiserver_args(options.apiserver_args.iter().cloned());
        for identity in &options.destination_identities {
            builder = builder.destination_identity(identity.clone());
        }
        match runner {
            Runner::Pods => builder = builder.nodes(1),
            // Two spare identities for restarts and scale-ups, and enough for an autoscaled
            // fleet of 6.
            Runner::Played => {
                for ordinal in 0..(options.replicas + 2).max(6) {
                    builder = builder.identity(Identity::service_account(
                        format!("{STATEFULSET}-{ordinal}"),
                        NAMESPACE,
                        "shardwise",
                    ));
                }
            }
        }
        let env = builder.start()?;
        let cp = env.control_plane();
        let admin = cp.client("admin").await?;
        cp.apply_yaml(
            "admin",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"),
        )
        .await?;
        let metrics_access = if options.secure_metrics {
            Some(Self::metrics_access(&env, runner).await?)
        } else {
            None
        };
        match runner {
            Runner::Played => {
                cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
                    .await?;
                cp.apply_file("admin", &repo_file("deploy/rbac.yaml"))
                    .await?;
                cp.apply_yaml("admin", &statefulset_yaml(options.replicas))
                    .await?;
            }
            // The chart's CRDs first, for the fleet to exist before the replicas start (helm
            // install leaves CRDs that exist alone).
            Runner::Pods => {
                for crd in std::fs::read_dir(repo_file("charts/shardwise/crds"))? {
                    cp.apply_file("admin", &crd?.path()).await?;
                }
            }
        }
        let mut fleet = Self {
            leases: fencing::LeaseHistory::record(admin.clone(), NAMESPACE),
            env,
            options: options.clone(),
            admin: admin.clone(),
            replicas: BTreeMap::new(),
            runner,
            audits: Vec::new(),
            retired: BTreeSet::new(),
            lost: BTreeMap::new(),
            started: std::time::Instant::now(),
            metrics_access,
            controller,
            deaths: BTreeMap::new(),
            freezes: Vec::new(),
            safety_checked: std::sync::atomic::AtomicBool::new(false),
        };
        fleet.create_destination_secrets().await?;
        fleet.create_clusters(0..options.clusters).await?;
        fleet.create_apps(0..options.apps).await?;
        if let Some(latency) = options.destination_latency {
            fleet.set_destination_latency(latency)?;
        }
        fleet.started = std::time::Instant::now();
        if runner == Runner::Pods {
            install_chart(&fleet.env, &options)?;
        }
        for ordinal in 0..options.replicas {
            fleet.spawn_replica(ordinal).await?;
        }
        Ok(fleet)
    }

    /// Secure metrics as an operator sets them up: a serving certificate signed by a CA of the
    /// fleet's (for a pod, every address of the node network: a Secret the chart's
    /// `metrics.certSecret` names), and a `scraper` identity, Prometheus' ServiceAccount, bound
    /// to the metrics-reader role (deploy/rbac.yaml's, or for pods the chart's, through
    /// `metrics.readers`).
    async fn metrics_access(env: &Environment, runner: Runner) -> Result<MetricsAccess> {
        let cp = env.control_plane();
        let certificates = env.dir().join("metrics-tls");
        let hosts = match (runner, env.node_address()) {
            (Runner::Pods, Some(node)) => {
                let [a, b, c, _] = node.octets();
                (2..255).map(|d| format!("{a}.{b}.{c}.{d}")).collect()
            }
            _ => vec!["127.0.0.1".to_string()],
        };
        let ca = write_serving_certificate(&certificates, hosts)?;
        cp.add_identity(Identity::service_account(
            SCRAPER_IDENTITY,
            "monitoring",
            "prometheus",
        ))?;
        match runner {
            Runner::Played => {
                cp.apply_yaml(
                    "admin",
                    &json!({
                        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": {"name": "prometheus-reads-shardwise"},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                    "name": "shardwise-shardwise-metrics-reader"},
                        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
                    })
                    .to_string(),
                )
                .await?;
            }
            Runner::Pods => {
                let file = |name: &str| std::fs::read_to_string(certificates.join(name));
                cp.apply_yaml(
                    "admin",
                    &json!({
                        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                        "metadata": {"name": METRICS_SECRET, "namespace": NAMESPACE},
                        "stringData": {"tls.crt": file("tls.crt")?, "tls.key": file("tls.key")?,
                                       "ca.crt": file("ca.crt")?},
                    })
                    .to_string(),
                )
                .await?;
            }
        }
        let token = cp.token(SCRAPER_IDENTITY)?;
        Ok(MetricsAccess {
            certificates,
            ca,
            token,
        })
    }

    /// Delays every request of the controller's identity to every destination by `latency`,
    /// from now on (requests already on their way keep the delay they met).
    pub fn set_destination_latency(&self, latency: Duration) -> Result<()> {
        for destination in self.env.destinations() {
            destination.set_latency(DESTINATION_IDENTITY, latency)?;
        }
        Ok(())
    }

    /// The address at which the replicas reach a server the test runs: the node network's (the
    /// host's side of every pod's network), or loopback for played replicas.
    pub fn test_address(&self) -> String {
        match (self.runner, self.env.node_address()) {
            (Runner::Pods, Some(address)) => address.to_string(),
            _ => "127.0.0.1".to_string(),
        }
    }

    /// The server of destination `index` as its credentials Secret names it: where the
    /// controller's identity reaches it (on a real server, through its link).
    pub fn destination_url(&self, index: usize) -> String {
        self.env.destinations()[index]
            .url_for(DESTINATION_IDENTITY)
            .expect("every destination has the controller's identity")
    }

    pub fn clusters_api(&self) -> Api<FleetCluster> {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    pub fn apps_api(&self) -> Api<FleetApp> {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    async fn create_destination_secrets(&self) -> Result<()> {
        for (index, destination) in self.env.destinations().iter().enumerate() {
            let token = destination.token(DESTINATION_IDENTITY)?;
            let ca = destination.ca_pem();
            let secret = json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": format!("dest-{index}-credentials"),
                    "namespace": NAMESPACE,
                    "labels": {"shardwise.io/secret-type": "cluster"},
                },
                "stringData": {"server": destination.url_for(DESTINATION_IDENTITY)?, "token": token, "ca.crt": ca},
            });
            self.env
                .control_plane()
                .apply_yaml("admin", &serde_json::to_string(&secret)?)
                .await?;
        }
        Ok(())
    }

    /// FleetClusters `cluster-N`, spread over the destinations.
    pub async fn create_clusters(&self, range: std::ops::Range<u32>) -> Result<()> {
        let api = self.clusters_api();
        for i in range {
            let d = i as usize % self.env.destinations().len();
            let cluster: FleetCluster = serde_json::from_value(json!({
                "apiVersion": "shardwise.io/v1alpha1",
                "kind": "FleetCluster",
                "metadata": {"name": format!("cluster-{i}"), "namespace": NAMESPACE},
                "spec": {
                    "server": self.destination_url(d),
                    "credentials": {"secretRef": {"name": format!("dest-{d}-credentials")}},
                },
            }))?;
            api.create(&PostParams::default(), &cluster).await?;
        }
        Ok(())
    }

    /// The cluster app `index` targets: `cluster-(index mod clusters)`, or with a hot cluster,
    /// `cluster-0` for the first `hot_percent` of the apps and the others in turn.
    pub fn cluster_of_app(&self, index: u32) -> u32 {
        let clusters = self.options.clusters.max(1);
        match self.options.hot_percent {
            Some(percent) if clusters > 1 => {
                let hot = u64::from(self.options.apps) * u64::from(percent) / 100;
                if u64::from(index) < hot {
                    0
                } else {
                    1 + index % (clusters - 1)
                }
            }
            _ => index % clusters,
        }
    }

    /// FleetApps `app-N` on [`Self::cluster_of_app`], each applying into namespace
    /// `team-(N mod 5)` one ConfigMap `app-N` (or, realistic, a Deployment, Service and
    /// ConfigMap). Created 32 at a time.
    pub async fn create_apps(&self, range: std::ops::Range<u32>) -> Result<()> {
        use futures::StreamExt;
        let api = self.apps_api();
        let realistic = self.options.realistic_apps;
        let tokened = self.options.tokened_apps;
        let results: Vec<Result<()>> = futures::stream::iter(range)
            .map(|i| {
                let api = api.clone();
                let cluster = self.cluster_of_app(i);
                async move {
                    let manifests = if realistic { realistic_manifests(i) } else { app_manifests(i, 1) };
                    let labels = if tokened {
                        json!({UNIT_LABEL: unit_token(NAMESPACE, &format!("cluster-{cluster}"))})
                    } else {
                        json!({})
                    };
                    let app: FleetApp = serde_json::from_value(json!({
                        "apiVersion": "shardwise.io/v1alpha1",
                        "kind": "FleetApp",
                        "metadata": {"name": format!("app-{i}"), "namespace": NAMESPACE, "labels": labels},
                        "spec": {
                            "destination": {"cluster": format!("cluster-{cluster}"), "namespace": format!("team-{}", i % 5)},
                            "source": {"manifests": manifests},
                        },
                    }))?;
                    api.create(&PostParams::default(), &app).await?;
                    Ok(())
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Deletes apps `app-i`, 32 at a time.
    pub async fn delete_apps(&self, range: std::ops::Range<u32>) -> Result<()> {
        use futures::StreamExt;
        let api = self.apps_api();
        let results: Vec<Result<()>> = futures::stream::iter(range)
            .map(|i| {
                let api = api.clone();
                async move {
                    api.delete(&format!("app-{i}"), &Default::default()).await?;
                    Ok(())
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// New manifests (`app_manifests(i, generation)`) for apps `app-i`, 32 patches at a time.
    pub async fn update_apps(&self, range: std::ops::Range<u32>, generation: u32) -> Result<()> {
        use futures::StreamExt;
        let api = self.apps_api();
        let results: Vec<Result<()>> = futures::stream::iter(range)
            .map(|i| {
                let api = api.clone();
                async move {
                    let patch =
                        json!({"spec": {"source": {"manifests": app_manifests(i, generation)}}});
                    api.patch(
                        &format!("app-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                    Ok(())
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Starts replica `ordinal` (again, after a stop). Pods: waits until the StatefulSet
    /// controller's pod of that ordinal runs its container, in a new pod after a stop or a
    /// kill (the pod a kill left behind is force-deleted first, as an operator does for a dead
    /// node's).
    pub async fn spawn_replica(&mut self, ordinal: u32) -> Result<()> {
        match self.runner {
            Runner::Played => self.spawn_process(ordinal),
            Runner::Pods => self.wait_for_pod(ordinal).await,
        }
    }

    fn spawn_process(&mut self, ordinal: u32) -> Result<()> {
        let name = format!("{STATEFULSET}-{ordinal}");
        let controller = self
            .controller
            .clone()
            .ok_or("a played replica needs a controller binary")?;
        let port = free_port()?;
        let health_port = if self.metrics_access.is_some() {
            free_port()?
        } else {
            port
        };
        let kubeconfig = self.env.control_plane().kubeconfig_path(&name)?;
        let audit = self.options.audit.then(|| {
            self.env
                .dir()
                .join(format!("audit-{ordinal}-{}.jsonl", self.audits.len()))
        });
        let mut spec = ProcessSpec::new(name.clone(), &controller)
            .env("POD_NAME", &name)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("KUBECONFIG", &kubeconfig)
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .arg(format!("--health-addr=127.0.0.1:{health_port}"))
            .args(match &self.metrics_access {
                Some(access) => vec![format!(
                    "--metrics-cert-dir={}",
                    access.certificates.display()
                )],
                None => vec!["--metrics-secure=false".to_string()],
            })
            .args(if self.options.fast {
                fast_flags()
            } else {
                Vec::new()
            })
            .args(self.options.args.clone());
        for (name, value) in &self.options.replica_env {
            spec = spec.env(name, value);
        }
        if let Some(path) = &audit {
            spec = spec.arg(format!("--audit-file={}", path.display()));
            self.audits.push(path.clone());
        }
        let process = self.env.spawn(&spec)?;
        self.replicas.insert(
            ordinal,
            Replica {
                metrics_url: match self.metrics_access {
                    Some(_) => format!("https://127.0.0.1:{port}/metrics"),
                    None => format!("http://127.0.0.1:{port}/metrics"),
                },
                ready_url: format!("http://127.0.0.1:{health_port}/readyz"),
                link: name,
                run: Run::Process(process),
            },
        );
        Ok(())
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    async fn wait_for_pod(&mut self, ordinal: u32) -> Result<()> {
        let name = format!("{STATEFULSET}-{ordinal}");
        if let Some(uid) = self.lost.remove(&ordinal) {
            self.delete_pod(&name, &uid, Some(0)).await?;
        }
        let run = pods::wait_running(
            &self.env,
            &self.admin,
            (NAMESPACE, &name),
            (CONTAINER, "shardwise-controller"),
            &self.retired,
            POD_START,
        )
        .await?;
        let scheme = if self.metrics_access.is_some() {
            "https"
        } else {
            "http"
        };
        self.replicas.insert(
            ordinal,
            Replica {
                metrics_url: format!("{scheme}://{}:{METRICS_PORT}/metrics", run.ip),
                ready_url: format!("http://{}:{HEALTH_PORT}/readyz", run.ip),
                link: shardwise_e2e::pod_link(&run.uid),
                run: Run::Pod(run),
            },
        );
        Ok(())
    }

    /// Stops replica `ordinal` gracefully and waits until it is gone: SIGTERM to a played
    /// process (which must then exit successfully); a pod is deleted, unless the StatefulSet's
    /// replicas went below it and its controller deletes it itself (the node agent sends
    /// SIGTERM, then SIGKILL after the grace period).
    pub async fn stop_replica(&mut self, ordinal: u32) -> Result<()> {
        let Some(replica) = self.replicas.remove(&ordinal) else {
            return Ok(());
        };
        match replica.run {
            Run::Process(mut process) => {
                let status = process.stop(Duration::from_secs(30)).await?;
                if !status.success() {
                    return Err(format!(
                        "replica {ordinal} exited with {status}:\n{}",
                        process.report()
                    )
                    .into());
                }
            }
            Run::Pod(pod) => {
                self.retired.insert(pod.uid.clone());
                self.delete_pod_unless_scaled_away(ordinal, &pod).await?;
                pods::wait_gone(&self.pods_api(), &pod.name, &pod.uid, POD_STOP).await?;
            }
        }
        Ok(())
    }

    /// Deletes the pod of `ordinal` (gracefully), unless the StatefulSet's replicas went below
    /// it: its controller deletes that one itself.
    async fn delete_pod_unless_scaled_away(&self, ordinal: u32, pod: &pods::PodRun) -> Result<()> {
        if ordinal < self.statefulset_replicas().await? {
            self.delete_pod(&pod.name, &pod.uid, None).await?;
        }
        Ok(())
    }

    /// Deletes pod `name` if it is still the one of UID `uid`, with `grace` seconds (`None`:
    /// its own grace period); a pod already gone or replaced is no error.
    async fn delete_pod(&self, name: &str, uid: &str, grace: Option<u32>) -> Result<()> {
        let params = DeleteParams {
            grace_period_seconds: grace,
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.pods_api().delete(name, &params).await {
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(()),
        }
    }

    /// Starts stopping replica `ordinal` gracefully without waiting for it: SIGTERM to a played
    /// process; a pod is deleted, unless the StatefulSet's replicas went below it (its
    /// controller deletes it). [`Self::stop_replica`] then waits for the end.
    pub async fn terminate_replica(&mut self, ordinal: u32) -> Result<()> {
        let Some(replica) = self.replicas.get_mut(&ordinal) else {
            return Ok(());
        };
        match &mut replica.run {
            Run::Process(process) => process.terminate()?,
            Run::Pod(pod) => {
                let pod = pod.clone();
                self.delete_pod_unless_scaled_away(ordinal, &pod).await?;
            }
        }
        Ok(())
    }

    /// Kills replica `ordinal` with SIGKILL, and nothing starts it again until
    /// [`Self::spawn_replica`]: a pod's node stops managing it first, as when a node dies with
    /// its pod (the Pod object stays, and the StatefulSet controller does not replace it).
    pub fn kill_replica(&mut self, ordinal: u32) -> Result<()> {
        let Some(replica) = self.replicas.remove(&ordinal) else {
            return Ok(());
        };
        self.deaths
            .insert(replica.pid(), shardwise_runtime::audit::now_nanos());
        match replica.run {
            Run::Process(mut process) => process.kill()?,
            Run::Pod(pod) => {
                let node = self.env.node(0).ok_or("no node")?;
                if !node.detach(&pod.name) {
                    return Err(format!("node-0 does not run pod {}", pod.name).into());
                }
                send_signal(pod.pid, nix::sys::signal::Signal::SIGKILL)?;
                self.retired.insert(pod.uid.clone());
                self.lost.insert(ordinal, pod.uid);
            }
        }
        Ok(())
    }

    /// Whether `link` is one through which a replica (of any incarnation) reached the control
    /// plane: the played ones' identities, or any pod's (only the fleet's run on the node).
    pub fn is_replica_link(&self, link: &str) -> bool {
        match self.runner {
            Runner::Played => link.starts_with(&format!("{STATEFULSET}-")),
            Runner::Pods => link.starts_with(&shardwise_e2e::pod_link("")),
        }
    }

    /// The audit files of every replica incarnation.
    pub fn audit_files(&self) -> Vec<PathBuf> {
        match self.runner {
            Runner::Played => self.audits.clone(),
            Runner::Pods => pods::audit_files(&self.env, NAMESPACE, STATEFULSET),
        }
    }

    pub async fn scale(&self, replicas: u32) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.admin.clone(), NAMESPACE);
        api.patch(
            STATEFULSET,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await?;
        Ok(())
    }

    /// The reconcile intervals of every replica incarnation's audit, after checking the fleet's
    /// safety ([`Self::assert_safe`]).
    pub fn audited_without_overlap(&self) -> Vec<shardwise_runtime::audit::Interval> {
        self.assert_safe(0).intervals
    }

    /// Freezes replica `ordinal` (SIGSTOP), as a long GC pause or a VM live migration would,
    /// and waits until every thread of it has stopped (one busy with a reconcile may run on for
    /// tens of milliseconds after the signal); returns when, on the audit's clock.
    pub async fn freeze(&mut self, ordinal: u32, timeout: Duration) -> Result<u64> {
        let replica = self
            .replicas
            .get(&ordinal)
            .ok_or_else(|| format!("no replica {ordinal}"))?;
        let pid = replica.pid();
        replica.pause()?;
        wait_for("the frozen replica's threads to stop", timeout, || async {
            if shardwise_e2e::procfs::stopped(pid) {
                Ok(())
            } else {
                Err("a thread still runs".to_string())
            }
        })
        .await?;
        let frozen_at = shardwise_runtime::audit::now_nanos();
        self.freezes.push(Freeze {
            pid,
            frozen_at,
            resumed_at: None,
            ran_again_at: std::sync::Arc::default(),
        });
        Ok(frozen_at)
    }

    /// How long after SIGCONT frozen process `pid` was first seen on a CPU.
    pub fn resume_delay(&self, pid: u32) -> Option<Duration> {
        let freeze = self.freezes.iter().find(|f| f.pid == pid)?;
        let ran = *freeze.ran_again_at.get()?;
        Some(Duration::from_nanos(ran.saturating_sub(freeze.resumed_at?)))
    }

    /// Thaws replica `ordinal` (SIGCONT); returns when, on the audit's clock (just before the
    /// signal).
    pub fn thaw(&mut self, ordinal: u32) -> Result<u64> {
        let replica = self
            .replicas
            .get(&ordinal)
            .ok_or_else(|| format!("no replica {ordinal}"))?;
        let pid = replica.pid();
        let ran_before = shardwise_e2e::procfs::runtime_nanos(pid);
        let resumed_at = shardwise_runtime::audit::now_nanos();
        replica.resume()?;
        let ran_again_at = std::sync::Arc::new(std::sync::OnceLock::new());
        for freeze in self.freezes.iter_mut().filter(|f| f.pid == pid) {
            freeze.resumed_at.get_or_insert(resumed_at);
            freeze.ran_again_at = ran_again_at.clone();
        }
        // Watched from a thread of its own, so that the test's runtime being busy does not
        // delay the reading.
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if shardwise_e2e::procfs::runtime_nanos(pid) > ran_before {
                    let _ = ran_again_at.set(shardwise_runtime::audit::now_nanos());
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Ok(resumed_at)
    }

    /// The safety check of everything the fleet did so far; panics, naming the broken promise,
    /// unless all of it holds:
    /// - **one owner at a time**: no two processes reconciled one cluster (or slices of it that
    ///   nest) at once, in the merged audit of every replica incarnation. A killed process's
    ///   open reconcile ended at its death; a frozen one's reconciles in flight may overlap a
    ///   successor's only if they started before the freeze and ended within
    ///   [`FENCE_REACTION`] of the resume;
    /// - **no write after the lease**: every write a destination received from the controller,
    ///   and every control-plane write of a replica but its lease renewals, names its term and
    ///   lease, and none arrived after that term's last renewal plus the lease duration;
    /// - at least `destination_writes` destination writes were checked.
    ///
    /// Runs when the fleet ends, if the test did not run it.
    pub fn assert_safe(&self, destination_writes: usize) -> Safety {
        self.check_safety(destination_writes, true)
    }

    /// [`Self::assert_safe`]; with `worked`, the audit must have recorded a reconcile (a test
    /// that asks knows its fleet worked; one that ends before the fleet did anything has
    /// nothing to check).
    fn check_safety(&self, destination_writes: usize, worked: bool) -> Safety {
        use shardwise_runtime::audit;
        self.safety_checked
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let intervals = audit::read(&self.audit_files(), "cluster").expect("the audits read");
        assert!(
            !worked || !intervals.is_empty(),
            "the audit recorded no reconcile: nothing to check"
        );
        let (cut_after_resume, slowest_cut) = self.assert_no_overlap(&intervals);
        let destination = self.assert_no_late_writes(
            "destination",
            self.env
                .destinations()
                .iter()
                .flat_map(|d| d.writes())
                .filter(|w| w.identity == DESTINATION_IDENTITY)
                .collect(),
        );
        assert!(
            destination >= destination_writes,
            "only {destination} destination writes checked, {destination_writes} expected"
        );
        // Not a term's: a replica's lease renewals (its lease task writes them) and the token
        // and access reviews of its metrics server, which store nothing.
        let control_plane = self.assert_no_late_writes(
            "control-plane",
            self.env
                .control_plane()
                .writes()
                .into_iter()
                .filter(|w| self.is_replica_link(&w.identity))
                .filter(|w| !OUTSIDE_TERMS.iter().any(|api| w.path.starts_with(api)))
                .collect(),
        );
        eprintln!(
            "safety: {} reconciles audited, no overlap ({cut_after_resume} frozen in flight cut within {slowest_cut:?} of their process running again); {destination} destination and {control_plane} control-plane writes checked, none late",
            intervals.len()
        );
        Safety {
            intervals,
            cut_after_resume,
            slowest_cut,
            destination_writes: destination,
            control_plane_writes: control_plane,
        }
    }

    /// Panics at any overlap but those of reconciles frozen in flight and cut within
    /// [`FENCE_REACTION`] of their resume; returns how many of those, and the slowest cut.
    fn assert_no_overlap(
        &self,
        intervals: &[shardwise_runtime::audit::Interval],
    ) -> (usize, Duration) {
        use shardwise_runtime::audit;
        let overlaps = audit::overlaps(intervals, &self.deaths);
        let frozen_in_flight = |i: &audit::Interval| {
            self.freezes.iter().find_map(|f| {
                let resumed = f.running_since()?;
                let end = i.end?;
                (i.pid == f.pid && i.start < f.frozen_at && end >= resumed)
                    .then(|| Duration::from_nanos(end - resumed))
            })
        };
        let mut cut = BTreeMap::new();
        let mut shown = Vec::new();
        for o in &overlaps {
            let frozen = |i| frozen_in_flight(i).map(|after| (i, after));
            match (frozen(&o.first), frozen(&o.second)) {
                (Some((i, after)), None) | (None, Some((i, after))) if after <= FENCE_REACTION => {
                    cut.insert((i.pid, i.key.clone(), i.start), after);
                }
                (Some((_, after)), _) | (_, Some((_, after))) => shown.push(format!(
                    "{o}: a reconcile frozen in flight ran {after:?} after its process ran again, past the fence (at most {FENCE_REACTION:?})"
                )),
                (None, None) => shown.push(o.to_string()),
            }
        }
        assert!(
            shown.is_empty(),
            "{} overlaps: two replicas reconciled one cluster at once, e.g.\n{}",
            shown.len(),
            shown[..shown.len().min(5)].join("\n")
        );
        let slowest = cut.values().copied().max().unwrap_or_default();
        (cut.len(), slowest)
    }

    /// Panics if a write of `writes` names no term, or arrived after its term's lease could
    /// have expired; returns how many were checked.
    fn assert_no_late_writes(
        &self,
        server: &str,
        writes: Vec<shardwise_e2e::WriteRecord>,
    ) -> usize {
        fencing::assert_no_late_writes(&writes, &self.leases.renewals(), STATEFULSET, server)
    }

    /// The StatefulSet's `spec.replicas`.
    pub async fn statefulset_replicas(&self) -> Result<u32> {
        let api: Api<StatefulSet> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let sts = api.get(STATEFULSET).await?;
        let replicas = sts.spec.and_then(|s| s.replicas).unwrap_or(1);
        Ok(u32::try_from(replicas)?)
    }

    /// Follows `spec.replicas`: played, does what the StatefulSet controller does when it
    /// changes (starts the missing ordinals below it, stops those at or above it gracefully,
    /// highest first); with pods, waits for its controller to have done so. Returns the
    /// replicas it followed.
    pub async fn follow_statefulset(&mut self) -> Result<u32> {
        let replicas = self.statefulset_replicas().await?;
        for ordinal in 0..replicas {
            if !self.replicas.contains_key(&ordinal) {
                self.spawn_replica(ordinal).await?;
            }
        }
        let extra: Vec<u32> = self
            .replicas
            .range(replicas..)
            .map(|(&o, _)| o)
            .rev()
            .collect();
        for ordinal in extra {
            self.stop_replica(ordinal).await?;
        }
        Ok(replicas)
    }

    /// Every app Synced, and every cluster (or, of a cluster cut into slices, every slice) and
    /// app owned by exactly one live shard, none of them draining, with each app on its
    /// cluster's (or slice's) shard and its status written by that shard.
    pub async fn check_settled(&self, live: &[u32]) -> std::result::Result<(), String> {
        self.check_settled_but(live, &[]).await
    }

    /// [`Self::check_settled`], but the apps named in `broken` must have failed instead (with
    /// a message), wherever they are.
    pub async fn check_settled_but(
        &self,
        live: &[u32],
        broken: &[&str],
    ) -> std::result::Result<(), String> {
        let placement = self.placement().await.map_err(|e| e.to_string())?;
        for (cluster, slices) in &placement.clusters {
            for (range, shard, draining) in slices {
                if !live.contains(shard) {
                    return Err(format!(
                        "cluster {cluster} ({range}) is on shard {shard}, not one of {live:?}"
                    ));
                }
                if *draining {
                    return Err(format!("cluster {cluster} ({range}) is still draining"));
                }
            }
        }
        let apps = self
            .apps_api()
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut not_synced = Vec::new();
        for a in &apps.items {
            if broken.contains(&a.name_any().as_str()) {
                let status = a.status.clone().unwrap_or_default();
                if status.sync_phase != Some(SyncPhase::Failed) || status.message.is_none() {
                    return Err(format!(
                        "broken app {} is {:?}, not Failed with a message",
                        a.name_any(),
                        status.sync_phase
                    ));
                }
                continue;
            }
            // Every app names its cluster by the token its owner selects it by, and carries
            // no shard: it follows its cluster's (or slice's) record, wherever that is.
            let cluster = &a.spec.destination.cluster;
            let token = unit_token(NAMESPACE, cluster);
            if a.labels().get(UNIT_LABEL) != Some(&token) {
                return Err(format!(
                    "app {} has unit label {:?}, not its cluster {cluster}'s {token}",
                    a.name_any(),
                    a.labels().get(UNIT_LABEL),
                ));
            }
            if placement.owner_of(a).is_some()
                && let Some(shard) = shard_label(a)
            {
                return Err(format!(
                    "app {} of an existing cluster still labelled with shard {shard}",
                    a.name_any()
                ));
            }
            let status = a.status.clone().unwrap_or_default();
            if status.sync_phase != Some(SyncPhase::Synced)
                || status.observed_generation != a.metadata.generation
            {
                // Its owner and key, to find its reconciles in that replica's log.
                not_synced.push(format!(
                    "{} (shard {:?}, key {:016x}): {:?} {:?}",
                    a.name_any(),
                    placement.owner_of(a),
                    app_key(&a.uid().unwrap_or_default()),
                    status.sync_phase,
                    status.message
                ));
            }
        }
        if !not_synced.is_empty() {
            return Err(format!(
                "{} of {} apps not synced, e.g. {}",
                not_synced.len(),
                apps.items.len(),
                not_synced
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        self.check_destinations(&apps.items, broken).await
    }

    /// Every app of [`app_manifests`]'s shape (those [`Self::create_apps`] made), Synced at its
    /// generation in this same read of the apps, has its ConfigMap in its destination with the
    /// content that generation of its manifests declares: a status that says Synced over a
    /// write that never landed is caught here.
    async fn check_destinations(
        &self,
        apps: &[FleetApp],
        broken: &[&str],
    ) -> std::result::Result<(), String> {
        let mut live: BTreeMap<(usize, String, String), Option<String>> = BTreeMap::new();
        for (d, destination) in self.env.destinations().iter().enumerate() {
            let client = destination
                .client("admin")
                .await
                .map_err(|e| e.to_string())?;
            let maps: Api<ConfigMap> = Api::all(client);
            for map in maps
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
            {
                let generation = map
                    .data
                    .as_ref()
                    .and_then(|data| data.get("generation"))
                    .cloned();
                live.insert(
                    (d, map.namespace().unwrap_or_default(), map.name_any()),
                    generation,
                );
            }
        }
        let mut wrong = Vec::new();
        let mut checked = 0usize;
        for app in apps {
            if broken.contains(&app.name_any().as_str()) || !is_synced(app) {
                continue;
            }
            let Some((index, generation)) = declared(app) else {
                continue;
            };
            let Some(cluster) = app
                .spec
                .destination
                .cluster
                .strip_prefix("cluster-")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let d = cluster % self.env.destinations().len();
            let namespace = app.spec.destination.namespace.clone();
            let found = live.get(&(d, namespace.clone(), format!("app-{index}")));
            checked += 1;
            if found != Some(&Some(generation.to_string())) {
                wrong.push(format!(
                    "{} (Synced at generation {generation}): ConfigMap {namespace}/app-{index} holds {found:?}",
                    app.name_any()
                ));
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {checked} apps Synced without their content in the destination (a write dropped, its status written), e.g. {}",
                wrong.len(),
                wrong[..wrong.len().min(3)].join("; ")
            ))
        }
    }

    /// Where every cluster is, as its records say: its own labels, or the UnitSlices of a
    /// cluster cut into slices.
    pub async fn placement(&self) -> Result<Placement> {
        let clusters = self.clusters_api().list(&ListParams::default()).await?;
        let slices: Api<UnitSlice> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let slices = slices.list(&ListParams::default()).await?;
        let mut placement = Placement::default();
        for c in &clusters.items {
            let draining = |meta: &ObjectMeta| {
                meta.annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(DRAIN_TO_ANNOTATION))
            };
            let mut records = Vec::new();
            if c.labels().contains_key(SLICES_LABEL) {
                for s in &slices.items {
                    if s.spec.unit.name != c.name_any()
                        || s.spec.unit.uid != c.uid().unwrap_or_default()
                    {
                        continue;
                    }
                    let range = s.spec.key_range().ok_or("a UnitSlice names no slice")?;
                    let shard = shard_label(s)
                        .ok_or_else(|| format!("slice {} has no shard label", s.name_any()))?;
                    records.push((range, shard, draining(&s.metadata)));
                }
                records.sort();
                let ranges = records.iter().map(|(r, _, _)| *r).collect();
                if shard_assign::Slicing::default().with("c", ranges).is_none() {
                    return Err(format!(
                        "the slices of {} do not tile its keys: {records:?}",
                        c.name_any()
                    )
                    .into());
                }
            } else {
                let shard = shard_label(c)
                    .ok_or_else(|| format!("cluster {} has no shard label", c.name_any()))?;
                records.push((KeyRange::WHOLE, shard, draining(&c.metadata)));
            }
            placement.clusters.insert(c.name_any(), records);
        }
        Ok(placement)
    }

    /// How often a check of the whole fleet (every app read) runs while waiting: each reads
    /// every app from kube-apiserver, which on 2 cores competes with the fleet it waits for
    /// (checked back to back in one 2,000-app chaos scenario, kube-apiserver used 53 s of CPU
    /// and the test process 20 s; every 500 ms, 46 s and 17 s; a 4,000-app fleet checked every
    /// 2 s, the test process still used a third of a core). So the bigger the fleet, the longer
    /// the pause: a millisecond per app, 500 ms at least.
    pub fn settle_poll(&self, timeout: Duration) -> shardwise_e2e::Poll {
        let pause = Duration::from_millis(u64::from(self.options.apps));
        shardwise_e2e::Poll::timeout(timeout).every(pause.max(Duration::from_millis(500)))
    }

    pub async fn wait_settled(&self, live: &[u32], timeout: Duration) -> Result<()> {
        wait_with(
            "every app Synced and owned by a live shard",
            self.settle_poll(timeout),
            || self.check_settled(live),
        )
        .await?;
        Ok(())
    }

    /// The ConfigMap of app `index` in its destination, if present.
    pub async fn destination_config_map(&self, index: u32) -> Result<Option<ConfigMap>> {
        let cluster = self.cluster_of_app(index);
        let d = cluster as usize % self.env.destinations().len();
        let client = self.env.destinations()[d].client("admin").await?;
        let api: Api<ConfigMap> = Api::namespaced(client, &format!("team-{}", index % 5));
        Ok(api.get_opt(&format!("app-{index}")).await?)
    }

    /// The metrics of replica `ordinal`, as an authorized scraper reads them when they are
    /// secure.
    pub async fn scrape(&self, ordinal: u32) -> Result<shardwise_e2e::Metrics> {
        let replica = self
            .replicas
            .get(&ordinal)
            .ok_or_else(|| format!("no replica {ordinal}"))?;
        let Some(access) = &self.metrics_access else {
            return Ok(scrape(&replica.metrics_url).await?);
        };
        let base = replica.metrics_url.trim_end_matches("/metrics");
        match get(base, Some(&access.ca), Some(&access.token), "/metrics").await {
            (200, body) => Ok(shardwise_e2e::Metrics::parse(&body)?),
            (code, body) => Err(format!("{} answered {code}: {body}", replica.metrics_url).into()),
        }
    }

    /// Sum of a metric over every replica.
    pub async fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let mut total = 0.0;
        for &ordinal in self.replicas.keys() {
            total += self.scrape(ordinal).await?.sum(name, labels);
        }
        Ok(total)
    }

    /// The ordinal of the replica that plans (reports `shardwise_planner_leader` 1).
    pub async fn planner(&self, timeout: Duration) -> Result<u32> {
        let ordinal = wait_for("a planner", timeout, || async {
            for &ordinal in self.replicas.keys() {
                let m = self.scrape(ordinal).await.map_err(|e| e.to_string())?;
                if m.sum("shardwise_planner_leader", &[]) == 1.0 {
                    return Ok(ordinal);
                }
            }
            Err("no replica reports planner_leader = 1".into())
        })
        .await?;
        Ok(ordinal)
    }

    /// Reasons of the Events about object `name` in the fleet's namespace.
    pub async fn event_reasons(&self, name: &str) -> Result<Vec<String>> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.admin.clone(), NAMESPACE);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason)
            .collect())
    }

    /// Logs of every replica, for failure messages.
    pub fn report(&self) -> String {
        self.replicas
            .values()
            .map(Replica::report)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The safety check runs when a fleet with an audit ends, unless the test ran it: a suite
/// cannot forget it. Not while a test is already failing (its own message comes first).
impl Drop for Fleet {
    fn drop(&mut self) {
        if self.options.audit
            && !std::thread::panicking()
            && !self
                .safety_checked
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.check_safety(0, false);
        }
    }
}

/// Every cluster's slices (one whole one when it is not cut): range, shard, draining.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub clusters: BTreeMap<String, Vec<(KeyRange, u32, bool)>>,
}

impl Placement {
    /// The shard of the slice of `app`'s cluster that holds the app; `None` when its cluster
    /// does not exist.
    pub fn owner_of(&self, app: &FleetApp) -> Option<u32> {
        let key = app_key(app.metadata.uid.as_deref().unwrap_or_default());
        self.clusters
            .get(&app.spec.destination.cluster)?
            .iter()
            .find(|(range, _, _)| range.contains(key))
            .map(|(_, shard, _)| *shard)
    }

    /// Clusters cut into slices, with the shards of their slices.
    pub fn cut(&self) -> BTreeMap<&str, std::collections::BTreeSet<u32>> {
        self.clusters
            .iter()
            .filter(|(_, slices)| slices.len() > 1)
            .map(|(name, slices)| (name.as_str(), slices.iter().map(|s| s.1).collect()))
            .collect()
    }
}

pub fn shard_label<K: kube::Resource>(object: &K) -> Option<u32> {
    object
        .meta()
        .labels
        .as_ref()?
        .get(SHARD_LABEL)?
        .parse()
        .ok()
}

/// The index and manifest generation of an app whose manifests are exactly
/// [`app_manifests`]`(index, generation)`.
fn declared(app: &FleetApp) -> Option<(u32, u32)> {
    let manifests = app.spec.source.manifests.as_deref()?;
    let index = app.name_any().strip_prefix("app-")?.parse().ok()?;
    let generation = manifests
        .split("generation: \"")
        .nth(1)?
        .split('"')
        .next()?
        .parse()
        .ok()?;
    (manifests == app_manifests(index, generation)).then_some((index, generation))
}

/// Whether an app is Synced at its current generation.
pub fn is_synced(app: &FleetApp) -> bool {
    app.status.as_ref().is_some_and(|s| {
        s.sync_phase == Some(SyncPhase::Synced) && s.observed_generation == app.metadata.generation
    })
}

/// Waits until `total` apps are Synced, following them with one watch. Listing every app every
/// 50 ms instead cost kube-apiserver 1.5 cores (229 s of CPU while one replica synced 5,000
/// apps in 122 s): the measurement took the CPU the fleet it measured needed.
pub async fn wait_synced(fleet: &Fleet, total: usize, timeout: Duration) {
    use futures::StreamExt;
    use kube_runtime::{WatchStreamExt, watcher};
    let events = watcher(fleet.apps_api(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut events = std::pin::pin!(events);
    let mut synced_apps = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while synced_apps.len() < total {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{total} apps Synced: {} after {timeout:?}",
                    synced_apps.len()
                )
            });
        match event {
            Some(Ok(app)) if is_synced(&app) => {
                synced_apps.insert(app.name_any());
            }
            Some(Ok(app)) => {
                synced_apps.remove(&app.name_any());
            }
            Some(Err(_)) => {}
            None => panic!("the watch of the apps ended"),
        }
    }
}
