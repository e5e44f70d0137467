//! Argo CD itself on the harness's control plane: its application controllers, one repo server,
//! Redis and a Git source, each a local process started the way Argo CD's manifests start it.
//!
//! The binary is the one scripts/argocd.sh builds from Argo CD's Go module, with the CRDs and
//! the controller's RBAC of the same module beside it. Each controller runs as the StatefulSet
//! `argocd-application-controller` would run its pod: the pod's hostname
//! (`argocd-application-controller-<ordinal>`, in a UTS namespace of its own, from which Argo
//! CD infers its shard), `ARGOCD_CONTROLLER_REPLICAS` from the StatefulSet and the sharding
//! algorithm from `argocd-cmd-params-cm`, and the ServiceAccount's token and RBAC. Only the
//! in-cluster connection is a kubeconfig (`ARGOCD_FAKE_IN_CLUSTER`), since the process does not
//! run in a pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::git::GitServer;
use crate::{
    Environment, HarnessError, Identity, Metrics, Process, ProcessSpec, free_port, scrape, wait_for,
};

/// Argo CD's namespace.
pub const NAMESPACE: &str = "argocd";
/// The StatefulSet of the application controller, also its pods' name prefix.
pub const CONTROLLER: &str = "argocd-application-controller";
/// The harness's identity for the controllers: Argo CD's ServiceAccount.
const CONTROLLER_IDENTITY: &str = "argocd-application-controller";

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
}

impl Default for ArgoCdOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            algorithm: "legacy".into(),
            app_resync: Duration::from_secs(120),
            app_resync_jitter: Duration::from_secs(60),
            in_cluster_enabled: true,
        }
    }
}

/// One application controller: its process and metrics port.
#[derive(Debug)]
struct Controller {
    process: Process,
    metrics_port: u16,
}

/// A running Argo CD. Dropping it stops every process.
#[derive(Debug)]
pub struct ArgoCd {
    binary: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    redis: Process,
    redis_port: u16,
    repo_server: Process,
    repo_server_port: u16,
    git: GitServer,
    controllers: BTreeMap<u32, Controller>,
    options: ArgoCdOptions,
}

/// Which controllers export each Application in `argocd_app_info`, by `namespace/name`.
pub type Owners = BTreeMap<String, Vec<u32>>;

impl ArgoCd {
    /// Installs Argo CD in namespace `argocd` of `env`'s control plane (CRDs, RBAC, settings,
    /// the default AppProject, the StatefulSet's object) and starts Redis, the Git server, the
    /// repo server and `options.replicas` controllers; returns when every controller serves
    /// its metrics.
    pub async fn install(env: &Environment, options: ArgoCdOptions) -> Result<Self, HarnessError> {
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
        control_plane
            .apply_yaml("admin", &settings(&options))
            .await?;
        let kubeconfig = control_plane.add_identity(Identity::service_account(
            CONTROLLER_IDENTITY,
            NAMESPACE,
            CONTROLLER,
        ))?;

        let dir = env.dir().join("argocd");
        std::fs::create_dir_all(&dir).map_err(|source| HarnessError::Io {
            path: dir.clone(),
            source,
        })?;
        let redis_port = free_port()?;
        let redis = env.spawn(
            &ProcessSpec::new("argocd-redis", "redis-server")
                .args(["--bind", "127.0.0.1", "--port", &redis_port.to_string()])
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
                .args(["--address", "127.0.0.1"])
                .args(["--port", &repo_server_port.to_string()])
                .args(["--metrics-address", "127.0.0.1"])
                .args(["--metrics-port", &repo_metrics.to_string()])
                .args(["--redis", &format!("127.0.0.1:{redis_port}")])
                .args(["--disable-tls", "--logformat", "text"]),
        )?;
        let mut argocd = Self {
            binary,
            dir,
            kubeconfig,
            redis,
            redis_port,
            repo_server,
            repo_server_port,
            git,
            controllers: BTreeMap::new(),
            options,
        };
        for ordinal in 0..argocd.options.replicas {
            argocd.start_controller(env, ordinal).await?;
        }
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

    /// Ordinals of the controllers running.
    pub fn ordinals(&self) -> Vec<u32> {
        self.controllers.keys().copied().collect()
    }

    /// The metrics URL of controller `ordinal`.
    pub fn metrics_url(&self, ordinal: u32) -> Option<String> {
        self.controllers
            .get(&ordinal)
            .map(|c| format!("http://127.0.0.1:{}/metrics", c.metrics_port))
    }

    /// The process of controller `ordinal` (its pid, for `/proc`).
    pub fn controller(&self, ordinal: u32) -> Option<&Process> {
        self.controllers.get(&ordinal).map(|c| &c.process)
    }

    /// The repo server's and Redis's processes (their pids, for `/proc`).
    pub fn shared_processes(&self) -> [&Process; 2] {
        [&self.repo_server, &self.redis]
    }

    /// Every controller's metrics, by ordinal.
    pub async fn scrape(&self) -> Result<BTreeMap<u32, Metrics>, HarnessError> {
        let mut all = BTreeMap::new();
        for (ordinal, c) in &self.controllers {
            let url = format!("http://127.0.0.1:{}/metrics", c.metrics_port);
            all.insert(*ordinal, scrape(&url).await?);
        }
        Ok(all)
    }

    /// Which controllers own each Application: those that export it in `argocd_app_info`
    /// (Argo CD's metrics list only the apps of the controller's own shard).
    pub async fn owners(&self) -> Result<Owners, HarnessError> {
        Ok(owners_of(&self.scrape().await?))
    }

    /// Sets the StatefulSet's replicas and `ARGOCD_CONTROLLER_REPLICAS` together to `replicas`
    /// and the algorithm of `argocd-cmd-params-cm` to `algorithm`, then does what the
    /// StatefulSet controller and a `kubectl rollout restart` do: removes pods from the highest
    /// ordinal (or adds the missing ones), then replaces the remaining ones, one at a time from
    /// the highest ordinal, each new one serving before the next goes.
    pub async fn reconfigure(
        &mut self,
        env: &Environment,
        replicas: u32,
        algorithm: &str,
    ) -> Result<(), HarnessError> {
        let before = self.options.replicas;
        self.options.replicas = replicas;
        self.options.algorithm = algorithm.to_string();
        env.control_plane()
            .apply_yaml("admin", &settings(&self.options))
            .await?;
        for ordinal in (replicas..before).rev() {
            self.stop_controller(ordinal).await?;
        }
        for ordinal in before..replicas {
            self.start_controller(env, ordinal).await?;
        }
        for ordinal in (0..before.min(replicas)).rev() {
            self.stop_controller(ordinal).await?;
            self.start_controller(env, ordinal).await?;
        }
        Ok(())
    }

    async fn stop_controller(&mut self, ordinal: u32) -> Result<(), HarnessError> {
        if let Some(mut c) = self.controllers.remove(&ordinal) {
            c.process.stop(Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    /// Starts controller `ordinal` as the StatefulSet's pod and waits until it serves metrics.
    async fn start_controller(
        &mut self,
        env: &Environment,
        ordinal: u32,
    ) -> Result<(), HarnessError> {
        let metrics_port = free_port()?;
        let hostname = format!("{CONTROLLER}-{ordinal}");
        let spec = ProcessSpec::new(&hostname, "unshare")
            // A UTS namespace with the pod's hostname: Argo CD takes its shard from it.
            .args(["--uts", "--", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
            .arg(&hostname)
            .arg(&self.binary)
            .args(["--namespace", NAMESPACE])
            .args(["--metrics-port", &metrics_port.to_string()])
            .args([
                "--repo-server",
                &format!("127.0.0.1:{}", self.repo_server_port),
            ])
            .arg("--repo-server-plaintext")
            .args(["--redis", &format!("127.0.0.1:{}", self.redis_port)])
            .args([
                "--app-resync",
                &self.options.app_resync.as_secs().to_string(),
            ])
            .args(["--logformat", "text"])
            .env("ARGOCD_BINARY_NAME", "argocd-application-controller")
            .env(
                "ARGOCD_CONTROLLER_REPLICAS",
                self.options.replicas.to_string(),
            )
            .env(
                "ARGOCD_CONTROLLER_SHARDING_ALGORITHM",
                &self.options.algorithm,
            )
            .env("ARGOCD_FAKE_IN_CLUSTER", "true")
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.dir)
            .env("TMPDIR", &self.dir);
        let process = env.spawn(&spec)?;
        let url = format!("http://127.0.0.1:{metrics_port}/metrics");
        let started = wait_for(
            &format!("{hostname} to serve its metrics"),
            Duration::from_secs(60),
            || async { scrape(&url).await.map_err(|e| e.to_string()) },
        )
        .await;
        self.controllers.insert(
            ordinal,
            Controller {
                process,
                metrics_port,
            },
        );
        started.map(|_| ()).map_err(HarnessError::from)
    }

    /// Every process's state and last lines of output, for failure messages.
    pub fn report(&self) -> String {
        let mut parts = vec![self.redis.report(), self.repo_server.report()];
        parts.push(self.git.daemon().report());
        parts.extend(self.controllers.values().map(|c| c.process.report()));
        parts.join("\n")
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

/// Argo CD's settings and the StatefulSet's object, as `options` give them. The StatefulSet
/// passes its settings as Argo CD's manifests do: the replica count as a literal, the algorithm
/// from `argocd-cmd-params-cm`. No StatefulSet controller runs it here; the harness does.
fn settings(options: &ArgoCdOptions) -> String {
    let part_of = "labels: {app.kubernetes.io/part-of: argocd}";
    let replicas = options.replicas;
    let algorithm = &options.algorithm;
    let in_cluster = options.in_cluster_enabled;
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: argocd-cm, namespace: {NAMESPACE}, {part_of}}}\ndata: {{cluster.inClusterEnabled: \"{in_cluster}\"}}\n\
---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: argocd-cmd-params-cm, namespace: {NAMESPACE}, {part_of}}}\ndata: {{controller.sharding.algorithm: {algorithm}}}\n\
---\napiVersion: v1\nkind: Secret\nmetadata: {{name: argocd-secret, namespace: {NAMESPACE}, {part_of}}}\nstringData: {{server.secretkey: shardwise-e2e}}\n\
---\napiVersion: argoproj.io/v1alpha1\nkind: AppProject\nmetadata: {{name: default, namespace: {NAMESPACE}}}\nspec: {{sourceRepos: ['*'], destinations: [{{server: '*', namespace: '*', name: '*'}}], clusterResourceWhitelist: [{{group: '*', kind: '*'}}]}}\n\
---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: {CONTROLLER}, namespace: {NAMESPACE}}}\nspec:\n  replicas: {replicas}\n  serviceName: {CONTROLLER}\n  selector: {{matchLabels: {{app.kubernetes.io/name: {CONTROLLER}}}}}\n  template:\n    metadata: {{labels: {{app.kubernetes.io/name: {CONTROLLER}}}}}\n    spec:\n      serviceAccountName: {CONTROLLER}\n      containers:\n      - name: {CONTROLLER}\n        image: quay.io/argoproj/argocd\n        command: [argocd-application-controller]\n        env:\n        - {{name: ARGOCD_CONTROLLER_REPLICAS, value: \"{replicas}\"}}\n        - name: ARGOCD_CONTROLLER_SHARDING_ALGORITHM\n          valueFrom: {{configMapKeyRef: {{name: argocd-cmd-params-cm, key: controller.sharding.algorithm, optional: true}}}}\n"
    )
}
