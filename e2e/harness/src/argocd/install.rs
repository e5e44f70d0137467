//! Argo CD itself on the harness's control plane: its application controllers as the pods of a
//! real StatefulSet (or, under dynamic cluster distribution, a real Deployment), with one repo
//! server, Redis and a Git source beside them as local processes.
//!
//! The binary is the one scripts/argocd.sh builds from Argo CD's Go module, with the CRDs and
//! the controller's RBAC of the same module beside it. The StatefulSet
//! `argocd-application-controller` is Argo CD's: kube-controller-manager creates, rolls and
//! replaces its pods, the scheduler binds them, and the node agent runs each as a process with
//! the pod's hostname (Argo CD infers its shard from it), a network namespace and address of
//! its own, the ServiceAccount's projected token for its in-cluster connection, and the
//! readiness probe on the controller's own `/healthz`. The repo server and Redis listen on the
//! node network's address, where the pods reach them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

use super::git::GitServer;
use crate::pods::{container_logs, container_pid, pod_dirs};
use crate::{
    Environment, HarnessError, Metrics, MetricsError, Process, ProcessSpec, free_port, pod_ready,
    pod_serving, scrape, wait_for,
};

/// Argo CD's namespace.
pub const NAMESPACE: &str = "argocd";
/// The StatefulSet of the application controller, also its pods' name prefix.
pub const CONTROLLER: &str = "argocd-application-controller";
/// Argo CD's image, which the node agents map to scripts/argocd.sh's build.
pub const ARGOCD_IMAGE: &str = "quay.io/argoproj/argocd";
/// The controller's metrics and `/healthz` port (Argo CD's default).
const METRICS_PORT: u16 = 8082;

/// The directory of scripts/argocd.sh's build: `$SHARDWISE_ARGOCD_BIN`, else the workspace's
/// `target/argocd/`.
fn build_dir() -> PathBuf {
    std::env::var_os("SHARDWISE_ARGOCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/argocd"))
}

/// The Argo CD binary scripts/argocd.sh builds, or an error saying how to build it.
pub fn argocd_binary() -> Result<PathBuf, HarnessError> {
    let program = build_dir().join("argocd");
    if program.is_file() {
        Ok(program)
    } else {
        Err(HarnessError::ArgoCdMissing { program })
    }
}

/// How Argo CD is set up.
#[derive(Clone, Debug)]
pub struct ArgoCdOptions {
    /// The StatefulSet's replicas, and `ARGOCD_CONTROLLER_REPLICAS` with them.
    pub replicas: u32,
    /// `controller.sharding.algorithm` of `argocd-cmd-params-cm`: `legacy`, `round-robin` or
    /// `consistent-hashing`.
    pub algorithm: String,
    /// The controllers' `--app-resync`: how often each reconciles every app it owns (Argo CD's
    /// default is 120 s, plus up to `--app-resync-jitter`, 60 s by default).
    pub app_resync: Duration,
    /// The controllers' `--app-resync-jitter`: the most a resync is delayed at random.
    pub app_resync_jitter: Duration,
    /// `argocd-cm` `cluster.inClusterEnabled`.
    pub in_cluster_enabled: bool,
    /// Dynamic cluster distribution: the controller is a Deployment whose pods take their
    /// shards in `argocd-app-controller-shard-cm`, and each reads the Deployment's replicas once,
    /// when it starts.
    pub dynamic: bool,
}

impl Default for ArgoCdOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            algorithm: "legacy".into(),
            app_resync: Duration::from_secs(120),
            app_resync_jitter: Duration::from_secs(60),
            in_cluster_enabled: true,
            dynamic: false,
        }
    }
}

/// A running Argo CD. Dropping it stops its processes; its pods go with the environment's
/// node agents.
pub struct ArgoCd {
    env_dir: PathBuf,
    client: kube::Client,
    address: Ipv4Addr,
    redis: Process,
    redis_port: u16,
    repo_server: Process,
    repo_server_port: u16,
    git: GitServer,
    options: ArgoCdOptions,
}

impl std::fmt::Debug for ArgoCd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArgoCd")
            .field("address", &self.address)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Which controllers export each Application in `argocd_app_info`, by `namespace/name`.
pub type Owners = BTreeMap<String, Vec<u32>>;

/// The ordinal of pod `name` of the controller's StatefulSet.
fn ordinal(name: &str) -> Option<u32> {
    name.strip_prefix(CONTROLLER)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

/// The ConfigMap where controllers under dynamic cluster distribution take their shards.
const SHARD_CM: &str = "argocd-app-controller-shard-cm";

/// The shard of each controller pod, by pod name, as `argocd-app-controller-shard-cm` maps
/// them (its `shardControllerMapping`, a JSON list). Read here on its own rather than with
/// `shardwise_plan::installation::shard_mapping`: the harness is the suite's ground truth for
/// the reader it checks.
fn shard_mapping(cm: &k8s_openapi::api::core::v1::ConfigMap) -> BTreeMap<String, u32> {
    let entries: Vec<serde_json::Value> = cm
        .data
        .as_ref()
        .and_then(|d| d.get("shardControllerMapping"))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    entries
        .iter()
        .filter_map(|e| {
            let name = e
                .get("ControllerName")?
                .as_str()
                .filter(|n| !n.is_empty())?;
            let shard = u32::try_from(e.get("ShardNumber")?.as_u64()?).ok()?;
            Some((name.to_string(), shard))
        })
        .collect()
}

/// Where pods of a controller not (yet) in the shard mapping are numbered from.
pub const UNMAPPED: u32 = 1_000;

impl ArgoCd {
    /// Installs Argo CD in namespace `argocd` of `env`'s control plane (CRDs, RBAC, settings,
    /// the default AppProject, the controller's ServiceAccount and StatefulSet), starts Redis,
    /// the Git server and the repo server, and returns once every controller pod is Ready.
    /// `env` needs nodes ([`crate::EnvironmentBuilder::nodes`]).
    pub async fn install(env: &Environment, options: ArgoCdOptions) -> Result<Self, HarnessError> {
        let address = env.node_address().ok_or_else(|| HarnessError::NeedsNodes {
            what: "Argo CD's application controller".into(),
        })?;
        let binary = argocd_binary()?;
        let control_plane = env.control_plane();
        control_plane
            .apply_yaml(
                "admin",
                &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"),
            )
            .await?;
        for file in ["crds", "rbac"] {
            let dir = build_dir().join(file);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|source| HarnessError::Io {
                    path: dir.clone(),
                    source,
                })?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
                .collect();
            files.sort();
            for path in files {
                control_plane.apply_file("admin", &path).await?;
            }
        }

        let dir = env.dir().join("argocd");
        std::fs::create_dir_all(&dir).map_err(|source| HarnessError::Io {
            path: dir.clone(),
            source,
        })?;
        let listen = address.to_string();
        let redis_port = free_port()?;
        let redis = env.spawn(
            &ProcessSpec::new("argocd-redis", "redis-server")
                .args(["--bind", &listen, "--port", &redis_port.to_string()])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"]),
        )?;
        let git = GitServer::start(env)?;
        let repo_server_port = free_port()?;
        let repo_metrics = free_port()?;
        let repo_server = env.spawn(
            &ProcessSpec::new("argocd-repo-server", &binary)
                .env("ARGOCD_BINARY_NAME", "argocd-repo-server")
                .env("HOME", &dir)
                .env("TMPDIR", &dir)
                .env("ARGOCD_GPG_ENABLED", "false")
                .args(["--address", &listen])
                .args(["--port", &repo_server_port.to_string()])
                .args(["--metrics-address", "127.0.0.1"])
                .args(["--metrics-port", &repo_metrics.to_string()])
                .args(["--redis", &format!("{listen}:{redis_port}")])
                .args(["--disable-tls", "--logformat", "text"]),
        )?;
        let argocd = Self {
            env_dir: env.dir().to_path_buf(),
            client: control_plane.client("admin").await?,
            address,
            redis,
            redis_port,
            repo_server,
            repo_server_port,
            git,
            options,
        };
        control_plane
            .apply_yaml("admin", &argocd.settings())
            .await?;
        argocd.wait_rolled().await?;
        Ok(argocd)
    }

    /// The Git repository Applications take their sources from.
    pub fn git(&self) -> &GitServer {
        &self.git
    }

    /// The options it runs with now.
    pub fn options(&self) -> &ArgoCdOptions {
        &self.options
    }

    /// Expects `replicas` controllers from now on, the StatefulSet being changed by someone
    /// else (the balancer's `--manage-replicas`): [`ArgoCd::rolled`] then waits for that count.
    pub fn follow_replicas(&mut self, replicas: u32) {
        self.options.replicas = replicas;
    }

    /// The controller's pods, by ordinal (under dynamic cluster distribution, by the shard
    /// `argocd-app-controller-shard-cm` maps them to, and from [`UNMAPPED`] on in name order
    /// for pods it does not map): those being deleted too, whose processes still run.
    pub async fn pods(&self) -> Result<BTreeMap<u32, Pod>, HarnessError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let params = ListParams::default().labels(&format!("app.kubernetes.io/name={CONTROLLER}"));
        let pods = api.list(&params).await?.items;
        if !self.options.dynamic {
            return Ok(pods
                .into_iter()
                .filter_map(|p| Some((ordinal(p.metadata.name.as_deref()?)?, p)))
                .collect());
        }
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), NAMESPACE);
        let mapping = maps
            .get_opt(SHARD_CM)
            .await?
            .map(|cm| shard_mapping(&cm))
            .unwrap_or_default();
        let mut unmapped = UNMAPPED;
        let mut by_shard = BTreeMap::new();
        let mut pods = pods;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for pod in pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let shard = mapping
                .get(&name)
                .copied()
                .filter(|s| !by_shard.contains_key(s));
            let key = shard.unwrap_or_else(|| {
                unmapped += 1;
                unmapped - 1
            });
            by_shard.insert(key, pod);
        }
        Ok(by_shard)
    }

    /// Scales the controller's Deployment to `replicas` as `kubectl scale` does (its scale
    /// subresource), and returns: no pod restarts, new ones start (under dynamic cluster
    /// distribution only).
    pub async fn scale(&mut self, replicas: u32) -> Result<(), HarnessError> {
        assert!(self.options.dynamic, "only the Deployment is scaled alone");
        self.options.replicas = replicas;
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        api.patch_scale(CONTROLLER, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The metrics URL of controller `ordinal`'s pod, once it has an address.
    pub async fn metrics_url(&self, ordinal: u32) -> Result<Option<String>, HarnessError> {
        Ok(self
            .pods()
            .await?
            .get(&ordinal)
            .and_then(|p| p.status.as_ref()?.pod_ip.clone())
            .map(|ip| format!("http://{ip}:{METRICS_PORT}/metrics")))
    }

    /// The process of each controller pod that runs one (its pid, for `/proc`), by ordinal.
    pub async fn controller_pids(&self) -> Result<BTreeMap<u32, u32>, HarnessError> {
        Ok(self
            .pods()
            .await?
            .into_iter()
            .filter_map(|(ordinal, pod)| {
                let pid = container_pid(
                    pod.metadata.name.as_deref()?,
                    pod.metadata.uid.as_deref(),
                    CONTROLLER,
                )?;
                Some((ordinal, pid))
            })
            .collect())
    }

    /// The repo server's and Redis's processes (their pids, for `/proc`).
    pub fn shared_processes(&self) -> [&Process; 2] {
        [&self.repo_server, &self.redis]
    }

    /// The metrics of every controller pod whose process runs, by ordinal, scraped side by
    /// side. A pod whose process has exited (or not started) owns nothing and is left out, as is
    /// one that does not listen yet (Argo CD serves its metrics before it reconciles anything).
    /// A Ready pod that is not being deleted has listened (its probe is on the same port): a
    /// refused connection there is retried for up to 2 s, and then fails the scrape, as does
    /// any other failure: an owner must not go unseen.
    pub async fn scrape(&self) -> Result<BTreeMap<u32, Metrics>, HarnessError> {
        let running = |pod: &Pod| {
            container_pid(
                pod.metadata.name.as_deref()?,
                pod.metadata.uid.as_deref(),
                CONTROLLER,
            )
        };
        let scrapes = self.pods().await?.into_iter().filter_map(|(ordinal, pod)| {
            let ip = pod.status.as_ref()?.pod_ip.clone()?;
            running(&pod)?;
            Some(async move {
                let url = format!("http://{ip}:{METRICS_PORT}/metrics");
                let listens = pod_serving(&pod);
                let mut attempts = 0;
                let answer = loop {
                    let answer = scrape(&url).await;
                    match &answer {
                        Err(MetricsError::Scrape { reason, .. })
                            if listens && reason.contains("(Connect)") && attempts < 10 =>
                        {
                            attempts += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        _ => break answer,
                    }
                };
                (ordinal, pod, listens, answer)
            })
        });
        let mut all = BTreeMap::new();
        for (ordinal, pod, listens, answer) in futures::future::join_all(scrapes).await {
            match answer {
                Ok(metrics) => {
                    all.insert(ordinal, metrics);
                }
                Err(_) if running(&pod).is_none() => {}
                Err(MetricsError::Scrape { reason, .. })
                    if reason.contains("(Connect)") && !listens => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(all)
    }

    /// Which controllers own each Application: those that export it in `argocd_app_info`
    /// (Argo CD's metrics list only the apps of the controller's own shard).
    pub async fn owners(&self) -> Result<Owners, HarnessError> {
        Ok(owners_of(&self.scrape().await?))
    }

    /// Sets the StatefulSet's replicas and `ARGOCD_CONTROLLER_REPLICAS` together to `replicas`
    /// and the algorithm of `argocd-cmd-params-cm` to `algorithm`, as a user would, and
    /// returns: the StatefulSet controller rolls the pods ([`ArgoCd::wait_rolled`] waits).
    pub async fn reconfigure(
        &mut self,
        env: &Environment,
        replicas: u32,
        algorithm: &str,
    ) -> Result<(), HarnessError> {
        self.options.replicas = replicas;
        self.options.algorithm = algorithm.to_string();
        env.control_plane()
            .apply_yaml("admin", &self.settings())
            .await
            .map(|_| ())
    }

    /// Whether the StatefulSet has rolled to its spec: every pod of the update revision, none
    /// more, all Ready; if not, what it is at. Under dynamic cluster distribution, whether the
    /// Deployment's pods are as many as its replicas, all of its template and Ready.
    pub async fn rolled(&self) -> Result<(), String> {
        let replicas = self.options.replicas;
        let wanted = i32::try_from(replicas).unwrap_or(i32::MAX);
        if self.options.dynamic {
            let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
            let deployment = deployments
                .get(CONTROLLER)
                .await
                .map_err(|e| e.to_string())?;
            let status = deployment.status.clone().unwrap_or_default();
            let pods = self.pods().await.map_err(|e| e.to_string())?;
            let ready = pods.values().filter(|p| pod_ready(p)).count();
            let rolled = status.observed_generation >= deployment.metadata.generation
                && status.updated_replicas == Some(wanted)
                && status.ready_replicas == Some(wanted)
                && pods.len() == replicas as usize
                && ready == pods.len();
            return if rolled {
                Ok(())
            } else {
                Err(format!("{status:?}; {ready} of {} pods Ready", pods.len()))
            };
        }
        let sets: Api<StatefulSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let set = sets.get(CONTROLLER).await.map_err(|e| e.to_string())?;
        let status = set.status.clone().unwrap_or_default();
        let pods = self.pods().await.map_err(|e| e.to_string())?;
        let ready = pods.values().filter(|p| pod_ready(p)).count();
        let rolled = status.observed_generation >= set.metadata.generation
            && status.update_revision.is_some()
            && status.current_revision == status.update_revision
            && status.updated_replicas == Some(wanted)
            && status.ready_replicas == Some(wanted)
            && pods.len() == replicas as usize
            && ready == pods.len();
        if rolled {
            Ok(())
        } else {
            Err(format!("{status:?}; {ready} of {} pods Ready", pods.len()))
        }
    }

    /// Waits until the StatefulSet has rolled to its spec ([`ArgoCd::rolled`]).
    pub async fn wait_rolled(&self) -> Result<(), HarnessError> {
        wait_for(
            "Argo CD's controller StatefulSet to roll",
            Duration::from_secs(300),
            || self.rolled(),
        )
        .await?;
        Ok(())
    }

    /// Every process's state and the controller pods' last lines of output, for failure
    /// messages.
    pub fn report(&self) -> String {
        let mut parts = vec![self.redis.report(), self.repo_server.report()];
        parts.push(self.git.daemon().report());
        for (log, text) in self.controller_logs() {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            parts.push(format!("{}:\n{tail}", log.display()));
        }
        parts.join("\n")
    }

    /// Every run of every controller pod's container: its log file and what it holds.
    fn controller_logs(&self) -> Vec<(PathBuf, String)> {
        pod_dirs(&self.env_dir, NAMESPACE, &format!("{CONTROLLER}-"))
            .iter()
            .flat_map(|dir| container_logs(dir, CONTROLLER))
            .map(|log| {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                (log, text)
            })
            .collect()
    }

    /// What each controller logged about shards and clusters (its sharding's decisions), pod
    /// by pod: what explains an owner the suite did not expect.
    pub fn sharding_log(&self) -> String {
        let parts: Vec<String> = self
            .controller_logs()
            .into_iter()
            .map(|(log, text)| {
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("shard") || l.contains("Shard"))
                    .collect();
                format!("{}:\n{}", log.display(), lines.join("\n"))
            })
            .collect();
        parts.join("\n")
    }

    /// Argo CD's settings, the controller's ServiceAccount and its StatefulSet, as the options
    /// give them. The StatefulSet passes its settings as Argo CD's manifests do: the replica
    /// count as a literal, the algorithm from `argocd-cmd-params-cm` (and in a pod annotation,
    /// as a chart's checksum annotation does, so that changing it rolls the pods); its probe is
    /// theirs
    /// (`/healthz` of the metrics port), every 2 s rather than 10 s so that the suite's
    /// rollouts take seconds.
    fn settings(&self) -> String {
        let options = &self.options;
        let part_of = "labels: {app.kubernetes.io/part-of: argocd}";
        let replicas = options.replicas;
        let algorithm = &options.algorithm;
        let in_cluster = options.in_cluster_enabled;
        let address = self.address;
        let args = [
            "--metrics-port".to_string(),
            METRICS_PORT.to_string(),
            "--repo-server".into(),
            format!("{address}:{}", self.repo_server_port),
            "--repo-server-plaintext".into(),
            "--redis".into(),
            format!("{address}:{}", self.redis_port),
            "--app-resync".into(),
            options.app_resync.as_secs().to_string(),
            "--app-resync-jitter".into(),
            options.app_resync_jitter.as_secs().to_string(),
            "--logformat".into(),
            "text".into(),
        ];
        let args = serde_json::to_string(&args).unwrap_or_default();
        // A Deployment's pods read its replicas from the API; the flag is what turns it on.
        let (kind, service, replicas_env, replicas_value) = if options.dynamic {
            (
                "Deployment",
                String::new(),
                "ARGOCD_ENABLE_DYNAMIC_CLUSTER_DISTRIBUTION",
                "true".to_string(),
            )
        } else {
            (
                "StatefulSet",
                format!("  serviceName: {CONTROLLER}\n"),
                "ARGOCD_CONTROLLER_REPLICAS",
                replicas.to_string(),
            )
        };
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: argocd-cm, namespace: {NAMESPACE}, {part_of}}}\ndata: {{cluster.inClusterEnabled: \"{in_cluster}\"}}\n\
---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: argocd-cmd-params-cm, namespace: {NAMESPACE}, {part_of}}}\ndata: {{controller.sharding.algorithm: {algorithm}}}\n\
---\napiVersion: v1\nkind: Secret\nmetadata: {{name: argocd-secret, namespace: {NAMESPACE}, {part_of}}}\nstringData: {{server.secretkey: shardwise-e2e}}\n\
---\napiVersion: argoproj.io/v1alpha1\nkind: AppProject\nmetadata: {{name: default, namespace: {NAMESPACE}}}\nspec: {{sourceRepos: ['*'], destinations: [{{server: '*', namespace: '*', name: '*'}}], clusterResourceWhitelist: [{{group: '*', kind: '*'}}]}}\n\
---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {CONTROLLER}, namespace: {NAMESPACE}}}\n\
---\napiVersion: apps/v1\nkind: {kind}\nmetadata: {{name: {CONTROLLER}, namespace: {NAMESPACE}}}\nspec:\n  replicas: {replicas}\n{service}  selector: {{matchLabels: {{app.kubernetes.io/name: {CONTROLLER}}}}}\n  template:\n    metadata:\n      labels: {{app.kubernetes.io/name: {CONTROLLER}}}\n      annotations: {{e2e.shardwise.io/sharding-algorithm: {algorithm}}}\n    spec:\n      serviceAccountName: {CONTROLLER}\n      terminationGracePeriodSeconds: 30\n      containers:\n      - name: {CONTROLLER}\n        image: {ARGOCD_IMAGE}\n        command: [argocd-application-controller]\n        args: {args}\n        ports: [{{name: metrics, containerPort: {METRICS_PORT}}}]\n        readinessProbe: {{httpGet: {{path: /healthz, port: {METRICS_PORT}}}, initialDelaySeconds: 1, periodSeconds: 2}}\n        env:\n        - {{name: {replicas_env}, value: \"{replicas_value}\"}}\n        - name: ARGOCD_CONTROLLER_SHARDING_ALGORITHM\n          valueFrom: {{configMapKeyRef: {{name: argocd-cmd-params-cm, key: controller.sharding.algorithm, optional: true}}}}\n        - name: POD_NAME\n          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}\n        - {{name: HOME, value: /tmp}}\n"
        )
    }
}

/// Which controllers export each Application in `argocd_app_info`, by `namespace/name`.
pub fn owners_of(metrics: &BTreeMap<u32, Metrics>) -> Owners {
    let mut owners = Owners::new();
    for (ordinal, m) in metrics {
        for sample in m.matching("argocd_app_info", &[]) {
            let (Some(namespace), Some(name)) =
                (sample.labels.get("namespace"), sample.labels.get("name"))
            else {
                continue;
            };
            owners
                .entry(format!("{namespace}/{name}"))
                .or_default()
                .push(*ordinal);
        }
    }
    owners
}
