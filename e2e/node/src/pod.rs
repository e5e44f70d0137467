//! One pod on a node, from its binding to its deletion, as a kubelet runs it: the sandbox (a
//! network namespace with an address), the volumes (the ServiceAccount token requested for
//! this pod and refreshed), each container started from its [`Launch`](crate::Launch) and
//! restarted per `restartPolicy` with back-off, the probes, the status after every change,
//! and on deletion SIGTERM, the grace period, SIGKILL, the final status, and the object's
//! removal (with the pod's UID as precondition, as the kubelet deletes it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::container::{Exit, Launcher, Running};
use crate::image::ImageTable;
use crate::plan::{NodeFacts, PlanError, PodContext, plan};
use crate::probe::{Probe, Tracker, check};
use crate::request::bounded;
use crate::sandbox::{Bridge, Sandbox};
use crate::status::{ContainerObservation, PodObservation, State, Termination, status_patch};
use crate::volumes::{VolumeSources, contents, write_atomically};

/// Where a pod reaches the API server: the host and port that become its
/// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, by pod UID (the harness gives each
/// pod a link of its own, where faults scoped to that pod reach it; a pod recreated under the
/// same name is another pod, with another link).
pub type ServiceEndpoint = Arc<dyn Fn(&str) -> Option<(String, u16)> + Send + Sync>;

/// What reaches a pod's worker from the agent.
#[derive(Debug)]
pub(crate) enum PodEvent {
    /// The Pod object changed (e.g. its deletion began).
    Updated(Box<Pod>),
    /// The Pod object is gone (deleted with no grace, or missed while the watch was down).
    Gone,
    /// The agent stops managing the pod and leaves its processes running until shutdown.
    Detach,
    /// The agent stops: kill everything now, write nothing.
    Shutdown,
}

/// The names of the node's pods that have a `subdomain` (a StatefulSet's, under its headless
/// Service), by pod UID: every pod's hosts file lists them, the stand-in for cluster DNS
/// (`<pod>.<service>.<namespace>.svc`), which nothing serves here.
#[derive(Debug, Default)]
pub(crate) struct Hosts {
    entries: parking_lot::Mutex<BTreeMap<String, String>>,
    version: std::sync::atomic::AtomicU64,
}

impl Hosts {
    fn set(&self, uid: &str, line: Option<String>) {
        let mut entries = self.entries.lock();
        match line {
            Some(line) => entries.insert(uid.to_string(), line),
            None => entries.remove(uid),
        };
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn lines(&self) -> String {
        self.entries
            .lock()
            .values()
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

/// What every pod worker of an agent shares.
pub(crate) struct PodRuntime {
    /// The node's pods' names.
    pub(crate) hosts: Hosts,
    /// Mount points the agent made on the host (missing in it, present in an image), shared
    /// by every pod that mounts there; removed when the agent stops, when no pod uses them.
    pub(crate) created_paths: parking_lot::Mutex<Vec<PathBuf>>,
    /// The node's client.
    pub(crate) client: kube::Client,
    /// The images.
    pub(crate) images: ImageTable,
    /// The node network.
    pub(crate) bridge: Arc<Bridge>,
    /// Starts containers.
    pub(crate) launcher: Launcher,
    /// Where pods' files go.
    pub(crate) dir: PathBuf,
    /// The node's facts.
    pub(crate) node: NodeFacts,
    /// Where each pod reaches the API server.
    pub(crate) service_endpoint: ServiceEndpoint,
    /// The first restart back-off.
    pub(crate) initial_backoff: Duration,
    /// The longest.
    pub(crate) max_backoff: Duration,
}

impl std::fmt::Debug for PodRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodRuntime")
            .field("node", &self.node.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// How often a worker looks at its containers, probes and files.
const TICK: Duration = Duration::from_millis(100);

/// A ServiceAccount token is requested again when this much of its life is left.
const TOKEN_REFRESH_AT: f64 = 0.2;

/// The kubelet's shortest grace period for a pod removed without one.
const MINIMUM_GRACE: Duration = Duration::from_secs(2);

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

struct ProbeSlot {
    probe: Probe,
    tracker: Tracker,
    due: Instant,
    pending: Option<JoinHandle<bool>>,
}

impl ProbeSlot {
    fn new(probe: Probe, started: Instant) -> Self {
        let tracker = Tracker::new(&probe);
        Self {
            due: started + probe.initial_delay,
            probe,
            tracker,
            pending: None,
        }
    }
}

struct Slot {
    spec: Container,
    observation: ContainerObservation,
    running: Option<Running>,
    started_at: String,
    restart_at: Option<Instant>,
    backoff: Duration,
    startup: Option<ProbeSlot>,
    readiness: Option<ProbeSlot>,
    liveness: Option<ProbeSlot>,
    /// Ended for good (its restart policy says so).
    done: bool,
}

struct Worker {
    rt: Arc<PodRuntime>,
    pod: Pod,
    uid: String,
    name: String,
    namespace: String,
    dir: PathBuf,
    sandbox: Option<Sandbox>,
    slots: Vec<Slot>,
    start_time: String,
    last_patch: Option<Value>,
    tokens: BTreeMap<String, String>,
    tokens_refresh_at: Option<Instant>,
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    volumes_ready: bool,
    hosts_file: PathBuf,
    hosts_version: Option<u64>,
}

/// Runs `pod` until it is deleted, gone, or the agent stops.
pub(crate) async fn run_pod(
    rt: Arc<PodRuntime>,
    pod: Pod,
    mut events: UnboundedReceiver<PodEvent>,
) {
    let mut worker = Worker::new(rt, pod);
    if let Err(e) = std::fs::create_dir_all(&worker.dir) {
        tracing::warn!(pod = %worker.name, error = %e, "cannot create the pod's directory");
    }
    worker.report().await;
    loop {
        let event = tokio::select! {
            event = events.recv() => Some(event.unwrap_or(PodEvent::Shutdown)),
            () = tokio::time::sleep(TICK) => None,
        };
        match event {
            Some(PodEvent::Updated(pod)) => {
                let deleting = pod.metadata.deletion_timestamp.is_some();
                worker.pod = *pod;
                if deleting {
                    worker.terminate_gracefully(&mut events).await;
                    return;
                }
            }
            Some(PodEvent::Gone) => {
                worker.stop_all(MINIMUM_GRACE).await;
                worker.teardown();
                return;
            }
            Some(PodEvent::Detach) => {
                // Left running; only the agent's shutdown ends it.
                while let Some(event) = events.recv().await {
                    if matches!(event, PodEvent::Shutdown) {
                        break;
                    }
                }
                worker.stop_all(Duration::ZERO).await;
                worker.teardown();
                return;
            }
            Some(PodEvent::Shutdown) => {
                worker.stop_all(Duration::ZERO).await;
                worker.teardown();
                return;
            }
            None => {
                worker.step().await;
                worker.report().await;
            }
        }
    }
}

impl Worker {
    fn new(rt: Arc<PodRuntime>, pod: Pod) -> Self {
        let meta = &pod.metadata;
        let (uid, name, namespace) = (
            meta.uid.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
            meta.namespace.clone().unwrap_or_default(),
        );
        let dir = rt.dir.join(format!("{namespace}_{name}_{uid}"));
        let slots = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| Slot {
                spec: c.clone(),
                observation: ContainerObservation {
                    name: c.name.clone(),
                    image: c.image.clone().unwrap_or_default(),
                    state: State::Waiting {
                        reason: "ContainerCreating".into(),
                        message: None,
                    },
                    last_termination: None,
                    restart_count: 0,
                    ready: false,
                    started: false,
                },
                running: None,
                started_at: String::new(),
                restart_at: Some(Instant::now()),
                backoff: Duration::ZERO,
                startup: None,
                readiness: None,
                liveness: None,
                done: false,
            })
            .collect();
        Self {
            hosts_file: dir.join("hosts"),
            rt,
            pod,
            uid,
            name,
            namespace,
            dir,
            sandbox: None,
            slots,
            start_time: now(),
            last_patch: None,
            tokens: BTreeMap::new(),
            tokens_refresh_at: None,
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            volumes_ready: false,
            hosts_version: None,
        }
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn waiting_all(&mut self, reason: &str, message: String) {
        for slot in &mut self.slots {
            if slot.running.is_none() && !slot.done {
                slot.observation.state = State::Waiting {
                    reason: reason.into(),
                    message: Some(message.clone()),
                };
            }
        }
    }

    /// One pass: sandbox, volumes, starts and restarts, exits, probes, token refresh.
    async fn step(&mut self) {
        if self.sandbox.is_none() {
            let (bridge, uid, name) = (self.rt.bridge.clone(), self.uid.clone(), self.name.clone());
            match tokio::task::spawn_blocking(move || bridge.sandbox(&uid, &name)).await {
                Ok(Ok(sandbox)) => {
                    let line = self
                        .subdomain_names()
                        .map(|names| format!("{}\t{}", sandbox.address(), names.join(" ")));
                    self.rt.hosts.set(&self.uid, line);
                    self.sandbox = Some(sandbox);
                }
                Ok(Err(e)) => {
                    return self.waiting_all("ContainerCreating", format!("sandbox: {e}"));
                }
                Err(e) => return self.waiting_all("ContainerCreating", format!("sandbox: {e}")),
            }
        }
        let refresh_due = self
            .tokens_refresh_at
            .is_some_and(|at| Instant::now() >= at);
        if !self.volumes_ready || refresh_due {
            match self.prepare_volumes().await {
                Ok(()) => self.volumes_ready = true,
                Err(message) => {
                    if !self.volumes_ready {
                        return self.waiting_all("ContainerCreating", message);
                    }
                    tracing::warn!(pod = %self.name, %message, "volume refresh failed");
                }
            }
        }
        if self.hosts_version != Some(self.rt.hosts.version()) {
            self.write_hosts();
        }
        let address = self.sandbox.as_ref().map(|s| IpAddr::V4(s.address()));
        for index in 0..self.slots.len() {
            self.step_container(index, address).await;
        }
    }

    async fn step_container(&mut self, index: usize, address: Option<IpAddr>) {
        let policy = self.restart_policy();
        let slot = &mut self.slots[index];
        if slot.done {
            return;
        }
        // An exit.
        if let Some(running) = &slot.running
            && let Some(exit) = running.exited()
        {
            slot.running = None;
            let termination = Termination {
                exit,
                started_at: slot.started_at.clone(),
                finished_at: now(),
            };
            let restart = match policy.as_str() {
                "Never" => false,
                "OnFailure" => exit.code != 0,
                _ => true,
            };
            slot.observation.ready = false;
            slot.observation.started = false;
            if restart {
                slot.observation.last_termination = Some(termination);
                slot.restart_at = Some(Instant::now() + slot.backoff);
                slot.observation.state = State::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some(format!(
                        "back-off {}s restarting failed container={} pod={}",
                        slot.backoff.as_secs(),
                        slot.spec.name,
                        self.name
                    )),
                };
                slot.backoff = (slot.backoff * 2)
                    .max(self.rt.initial_backoff)
                    .min(self.rt.max_backoff);
            } else {
                slot.observation.state = State::Terminated(termination);
                slot.done = true;
            }
            return;
        }
        // A start or restart that is due.
        if slot.running.is_none() && slot.restart_at.is_some_and(|at| Instant::now() >= at) {
            let launch = {
                let pod_ip = self.sandbox.as_ref().map(|s| s.address().to_string());
                let service_env = self.service_env();
                let netns = self.sandbox.as_ref().map(Sandbox::path);
                let volumes_dir = self.dir.join("volumes");
                let context = PodContext {
                    node: &self.rt.node,
                    pod_ip: pod_ip.as_deref(),
                    config_maps: &self.config_maps,
                    secrets: &self.secrets,
                    service_env: &service_env,
                    volumes_dir: &volumes_dir,
                    hosts_file: Some(&self.hosts_file),
                    network_namespace: netns.as_deref(),
                };
                plan(
                    &self.pod,
                    &self.slots[index].spec,
                    &self.rt.images,
                    &context,
                )
            };
            let slot = &mut self.slots[index];
            let launch = match launch {
                Ok(launch) => launch,
                Err(e) => {
                    let reason = match e {
                        PlanError::UnknownImage { .. } => "ErrImagePull",
                        _ => "CreateContainerConfigError",
                    };
                    slot.observation.state = State::Waiting {
                        reason: reason.into(),
                        message: Some(e.to_string()),
                    };
                    slot.restart_at = Some(Instant::now() + self.rt.initial_backoff);
                    return;
                }
            };
            for mount in &launch.mounts {
                ensure_mount_point(
                    &mount.source,
                    &mount.target,
                    &mut self.rt.created_paths.lock(),
                );
            }
            let slot = &mut self.slots[index];
            let attempt = slot.observation.restart_count
                + u32::from(slot.observation.last_termination.is_some());
            let files = self.dir.join(&slot.spec.name);
            let _ = std::fs::create_dir_all(&files);
            let spec_file = files.join(format!("{attempt}.json"));
            let log = files.join(format!("{attempt}.log"));
            match self.rt.launcher.start(&launch, &spec_file, &log) {
                Ok(running) => {
                    if slot.observation.last_termination.is_some() {
                        slot.observation.restart_count += 1;
                    }
                    slot.running = Some(running);
                    slot.restart_at = None;
                    slot.started_at = now();
                    slot.observation.state = State::Running {
                        started_at: slot.started_at.clone(),
                    };
                    let started = Instant::now();
                    let probe = |spec: Option<&k8s_openapi::api::core::v1::Probe>| {
                        spec.and_then(|p| Probe::from_spec(p, &slot.spec).ok())
                            .map(|p| ProbeSlot::new(p, started))
                    };
                    slot.startup = probe(slot.spec.startup_probe.as_ref());
                    slot.readiness = probe(slot.spec.readiness_probe.as_ref());
                    slot.liveness = probe(slot.spec.liveness_probe.as_ref());
                    slot.observation.started = slot.startup.is_none();
                    slot.observation.ready = slot.startup.is_none() && slot.readiness.is_none();
                }
                Err(e) => {
                    slot.observation.state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: Some(e.to_string()),
                    };
                    slot.restart_at = Some(Instant::now() + self.rt.initial_backoff);
                }
            }
            return;
        }
        // Probes of a running container.
        let Some(ip) = address else { return };
        if slot.running.is_none() {
            return;
        }
        let pod_grace = self.grace();
        let slot = &mut self.slots[index];
        if let Some(startup) = slot.startup.as_mut()
            && !slot.observation.started
        {
            match run_probe(startup, ip) {
                Some(true) => {
                    slot.observation.started = true;
                    slot.observation.ready = slot.readiness.is_none();
                }
                Some(false) => {
                    let grace = startup.probe.termination_grace.unwrap_or(pod_grace);
                    if let Some(running) = slot.running.as_mut() {
                        running.stop(grace).await;
                    }
                }
                None => {}
            }
            return;
        }
        if let Some(readiness) = slot.readiness.as_mut()
            && let Some(ready) = run_probe(readiness, ip)
        {
            slot.observation.ready = ready;
        }
        if let Some(liveness) = slot.liveness.as_mut()
            && run_probe(liveness, ip) == Some(false)
        {
            let grace = liveness.probe.termination_grace.unwrap_or(pod_grace);
            tracing::info!(pod = %self.name, container = %slot.spec.name, "liveness probe failed; restarting");
            if let Some(running) = slot.running.as_mut() {
                running.stop(grace).await;
            }
        }
    }

    /// The pod's grace period: what its deletion set, else its spec's (30 s by default).
    fn grace(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    fn service_env(&self) -> Vec<(String, String)> {
        let Some((host, port)) = (self.rt.service_endpoint)(&self.uid) else {
            return Vec::new();
        };
        let url = format!("tcp://{host}:{port}");
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
            ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
            ("KUBERNETES_PORT".into(), url.clone()),
            (format!("KUBERNETES_PORT_{port}_TCP"), url),
            (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
            (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
            (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host),
        ]
    }

    fn hostname(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name.clone())
    }

    /// The names cluster DNS would give the pod under its headless Service, if it has one.
    fn subdomain_names(&self) -> Option<Vec<String>> {
        let subdomain = self.pod.spec.as_ref()?.subdomain.clone()?;
        let base = format!("{}.{subdomain}", self.hostname());
        let namespace = &self.namespace;
        Some(vec![
            format!("{base}.{namespace}.svc.cluster.local"),
            format!("{base}.{namespace}.svc"),
            format!("{base}.{namespace}"),
            base,
        ])
    }

    /// `/etc/hosts` of the pod: localhost, its own name, and the node's pods' DNS names.
    /// Rewritten in place (the file is bind-mounted) whenever those change.
    fn write_hosts(&mut self) {
        let Some(sandbox) = &self.sandbox else { return };
        let version = self.rt.hosts.version();
        let text = format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n{}",
            sandbox.address(),
            self.hostname(),
            self.rt.hosts.lines()
        );
        match std::fs::write(&self.hosts_file, text) {
            Ok(()) => self.hosts_version = Some(version),
            Err(e) => {
                tracing::warn!(pod = %self.name, error = %e, "cannot write the pod's hosts file")
            }
        }
    }

    /// Fetches what the volumes and env reference, requests tokens, writes every volume.
    async fn prepare_volumes(&mut self) -> Result<(), String> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let (mut maps, mut secrets) = (BTreeSet::new(), BTreeSet::new());
        let mut audiences: BTreeMap<String, i64> = BTreeMap::new();
        for volume in spec.volumes.iter().flatten() {
            if let Some(cm) = &volume.config_map {
                maps.insert(cm.name.clone());
            }
            if let Some(s) = &volume.secret {
                secrets.extend(s.secret_name.clone());
            }
            for source in volume
                .projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
            {
                if let Some(cm) = &source.config_map {
                    maps.insert(cm.name.clone());
                }
                if let Some(s) = &source.secret {
                    secrets.insert(s.name.clone());
                }
                if let Some(token) = &source.service_account_token {
                    audiences.insert(
                        token.audience.clone().unwrap_or_default(),
                        token.expiration_seconds.unwrap_or(3600).max(600),
                    );
                }
            }
        }
        for container in &spec.containers {
            for from in container.env_from.iter().flatten() {
                maps.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
                secrets.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
            }
            for var in container.env.iter().flatten() {
                if let Some(source) = &var.value_from {
                    maps.extend(source.config_map_key_ref.as_ref().map(|r| r.name.clone()));
                    secrets.extend(source.secret_key_ref.as_ref().map(|r| r.name.clone()));
                }
            }
        }
        let client = &self.rt.client;
        refresh(
            &mut self.config_maps,
            Api::namespaced(client.clone(), &self.namespace),
            maps,
            "configmap",
        )
        .await?;
        refresh(
            &mut self.secrets,
            Api::namespaced(client.clone(), &self.namespace),
            secrets,
            "secret",
        )
        .await?;
        let account = spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let mut shortest = None::<i64>;
        for (audience, seconds) in &audiences {
            let token = self.request_token(&account, audience, *seconds).await?;
            self.tokens.insert(audience.clone(), token);
            shortest = Some(shortest.map_or(*seconds, |s| s.min(*seconds)));
        }
        self.tokens_refresh_at = shortest.map(|s| {
            #[allow(
                clippy::cast_precision_loss,
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss
            )]
            let left = (s as f64 * (1.0 - TOKEN_REFRESH_AT)) as u64;
            Instant::now() + Duration::from_secs(left)
        });
        let sources = VolumeSources {
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            tokens: &self.tokens,
        };
        let group = spec
            .security_context
            .as_ref()
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        for volume in spec.volumes.iter().flatten() {
            let dir = self.dir.join("volumes").join(&volume.name);
            match contents(volume, &self.pod, &sources).map_err(|e| e.to_string())? {
                None => {
                    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    set_mode(&dir, 0o777);
                }
                Some(files) => write_atomically(&dir, &files, group)
                    .map_err(|e| format!("{}: {e}", dir.display()))?,
            }
        }
        // Every directory above the volumes must let the container's user through.
        for dir in [self.dir.as_path(), &self.dir.join("volumes")] {
            set_mode(dir, 0o755);
        }
        Ok(())
    }

    async fn request_token(
        &self,
        account: &str,
        audience: &str,
        seconds: i64,
    ) -> Result<String, String> {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.rt.client.clone(), &self.namespace);
        let mut spec = json!({
            "expirationSeconds": seconds,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid},
        });
        if !audience.is_empty() {
            spec["audiences"] = json!([audience]);
        }
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
        }))
        .map_err(|e| e.to_string())?;
        bounded(accounts.create_token_request(account, &PostParams::default(), &request))
            .await
            .map_err(|e| format!("token for serviceaccount {account}: {e}"))?
            .status
            .map(|s| s.token)
            .ok_or_else(|| format!("token for serviceaccount {account}: no status"))
    }

    /// Patches the status when it changed since the last patch.
    async fn report(&mut self) {
        let observations: Vec<ContainerObservation> =
            self.slots.iter().map(|s| s.observation.clone()).collect();
        let policy = self.restart_policy();
        let pod_ip = self.sandbox.as_ref().map(|s| s.address().to_string());
        let previous: Vec<Value> = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| {
                c.iter()
                    .filter_map(|c| serde_json::to_value(c).ok())
                    .collect()
            })
            .unwrap_or_default();
        let now = now();
        let patch = status_patch(&PodObservation {
            uid: &self.uid,
            restart_policy: &policy,
            sandbox_ready: self.sandbox.is_some(),
            containers: &observations,
            host_ip: &self.rt.node.host_ip,
            pod_ip: pod_ip.as_deref(),
            start_time: &self.start_time,
            now: &now,
            previous_conditions: &previous,
        });
        // Compared without the transition times, which are only news with a change.
        let key = without_times(&patch);
        if self.last_patch.as_ref() == Some(&key) {
            return;
        }
        let pods: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.namespace);
        match bounded(pods.patch_status(
            &self.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        ))
        .await
        {
            Ok(pod) => {
                self.pod.status = pod.status;
                self.last_patch = Some(key);
            }
            Err(e) => tracing::debug!(pod = %self.name, error = %e, "status patch failed"),
        }
    }

    async fn stop_all(&mut self, grace: Duration) {
        let stops = self.slots.iter_mut().filter_map(|slot| {
            let started_at = slot.started_at.clone();
            slot.running.take().map(|mut running| {
                let observation = &mut slot.observation;
                async move {
                    let exit: Exit = if grace.is_zero() {
                        running.kill().await
                    } else {
                        running.stop(grace).await
                    };
                    observation.state = State::Terminated(Termination {
                        exit,
                        started_at,
                        finished_at: now(),
                    });
                    observation.ready = false;
                }
            })
        });
        futures::future::join_all(stops).await;
        for slot in &mut self.slots {
            slot.done = true;
        }
    }

    /// SIGTERM, the grace period, SIGKILL; the final status; the sandbox and files removed;
    /// then the object deleted for good, retried with back-off as the kubelet retries it (an
    /// API server or etcd restarting refuses it for a while), until it is done, the pod is
    /// gone or replaced, or the agent stops.
    async fn terminate_gracefully(&mut self, events: &mut UnboundedReceiver<PodEvent>) {
        let grace = self.grace();
        tracing::debug!(pod = %self.name, ?grace, "deletion seen: stopping the containers");
        self.stop_all(grace).await;
        tracing::debug!(pod = %self.name, "containers stopped: final status, then delete");
        self.report().await;
        self.teardown();
        let pods: Api<Pod> = Api::namespaced(self.rt.client.clone(), &self.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let mut backoff = self.rt.initial_backoff;
        loop {
            match bounded(pods.delete(&self.name, &params)).await {
                // 404: gone; 409: the name now belongs to another pod.
                Ok(_) => {
                    tracing::debug!(pod = %self.name, "deleted");
                    return;
                }
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => return,
                Err(e) => tracing::debug!(pod = %self.name, error = %e, "final delete failed"),
            }
            tokio::select! {
                event = events.recv() => {
                    if matches!(event, None | Some(PodEvent::Shutdown | PodEvent::Gone)) {
                        return;
                    }
                }
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.rt.max_backoff);
        }
    }

    fn teardown(&mut self) {
        self.rt.hosts.set(&self.uid, None);
        self.sandbox = None;
        // The pod's directory (its logs, its emptyDirs: a replica's audit) stays for the test
        // to read; the environment's directory goes with the environment.
    }
}

/// Reads each of `names` into `known`, forgetting the ones that are gone.
async fn refresh<K>(
    known: &mut BTreeMap<String, K>,
    api: Api<K>,
    names: BTreeSet<String>,
    kind: &str,
) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for name in names {
        match bounded(api.get_opt(&name)).await {
            Ok(Some(object)) => {
                known.insert(name, object);
            }
            Ok(None) => {
                known.remove(&name);
            }
            Err(e) => return Err(format!("{kind} {name}: {e}")),
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

/// Runs a due probe in the background and counts a finished one; the result when it changed.
fn run_probe(slot: &mut ProbeSlot, ip: IpAddr) -> Option<bool> {
    if let Some(pending) = &slot.pending
        && pending.is_finished()
    {
        let pending = slot.pending.take()?;
        let passed = futures::FutureExt::now_or_never(pending)
            .and_then(Result::ok)
            .unwrap_or(false);
        return slot.tracker.record(passed);
    }
    if slot.pending.is_none() && Instant::now() >= slot.due {
        slot.due = Instant::now() + slot.probe.period;
        let (action, timeout) = (slot.probe.action.clone(), slot.probe.timeout);
        slot.pending = Some(tokio::spawn(
            async move { check(&action, ip, timeout).await },
        ));
    }
    None
}

/// Makes a missing mount point outside `/run` (which the container gets its own of), noting
/// what it made so that it is removed with the pod.
fn ensure_mount_point(source: &Path, target: &Path, created: &mut Vec<PathBuf>) {
    if target.starts_with("/run") || target.starts_with("/var/run") || target.exists() {
        return;
    }
    let mut missing = Vec::new();
    let mut at = target;
    while !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for (i, path) in missing.iter().rev().enumerate() {
        let is_target = i == missing.len() - 1;
        let made = if is_target && source.is_file() {
            std::fs::write(path, b"")
        } else {
            std::fs::create_dir(path)
        };
        if made.is_ok() {
            created.push(path.clone());
        }
    }
}

fn without_times(patch: &Value) -> Value {
    let mut key = patch.clone();
    if let Some(conditions) = key["status"]["conditions"].as_array_mut() {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastTransitionTime");
            }
        }
    }
    key
}
