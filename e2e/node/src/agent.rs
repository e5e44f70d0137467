//! The node agent: registers its Node, keeps the Node's Lease and Ready condition, watches the
//! Pods bound to it and runs each in a sandbox of its own (the `pod` module), as a kubelet
//! does. It talks to the API server as `system:node:<name>`, so the Node authorizer and the
//! NodeRestriction admission hold it to what a kubelet may do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::container::Launcher;
use crate::image::ImageTable;
use crate::plan::NodeFacts;
use crate::pod::{PodEvent, PodRuntime, ServiceEndpoint, run_pod};
use crate::request::bounded;
use crate::sandbox::Bridge;

/// How a node agent is set up.
#[derive(Clone)]
pub struct AgentConfig {
    /// The Node's name.
    pub name: String,
    /// A client authenticated as `system:node:<name>` (group `system:nodes`).
    pub client: kube::Client,
    /// The images it runs.
    pub images: ImageTable,
    /// The node network its pods join.
    pub bridge: Arc<Bridge>,
    /// `shardwise-container-init`.
    pub init: PathBuf,
    /// Where pods' files go (volumes, logs, launch descriptions).
    pub dir: PathBuf,
    /// Where each pod reaches the API server.
    pub service_endpoint: ServiceEndpoint,
    /// The first restart back-off of a container that ended; it doubles up to
    /// `max_backoff` (the kubelet's are 10 s and 300 s).
    pub initial_backoff: Duration,
    /// The longest restart back-off.
    pub max_backoff: Duration,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Why an agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The API server refused or failed a request.
    #[error("node {node}: {source}")]
    Api {
        /// The Node.
        node: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// A local file or thread could not be made.
    #[error("node {node}: {source}")]
    Io {
        /// The Node.
        node: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// How often the Lease is renewed and the Ready condition refreshed (the kubelet's default).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// A running node agent. Dropping it (or [`NodeAgent::stop`]) kills every container it runs
/// and removes every sandbox.
#[derive(Debug)]
pub struct NodeAgent {
    name: String,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    pods: Arc<Mutex<Pods>>,
    runtime: Arc<PodRuntime>,
}

/// The pods an agent runs, by UID, and those it detached (left running, no longer managed).
#[derive(Debug, Default)]
struct Pods {
    managed: BTreeMap<String, PodHandle>,
    detached: BTreeMap<String, PodHandle>,
}

impl Pods {
    fn take_all(&mut self) -> Vec<PodHandle> {
        let mut all: Vec<PodHandle> = std::mem::take(&mut self.managed).into_values().collect();
        all.extend(std::mem::take(&mut self.detached).into_values());
        all
    }
}

#[derive(Debug)]
struct PodHandle {
    name: String,
    events: tokio::sync::mpsc::UnboundedSender<PodEvent>,
    task: JoinHandle<()>,
}

fn rfc3339_now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

impl NodeAgent {
    /// Registers the Node (Ready) and its Lease, then runs the pods bound to it until
    /// stopped.
    pub async fn start(config: AgentConfig) -> Result<Self, AgentError> {
        let api_error = |source| AgentError::Api {
            node: config.name.clone(),
            source,
        };
        let nodes: Api<Node> = Api::all(config.client.clone());
        let facts = NodeFacts {
            name: config.name.clone(),
            host_ip: config.bridge.gateway().to_string(),
            allocatable_cpu: "16".into(),
            allocatable_memory: "64Gi".into(),
        };
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": config.name, "labels": {
                "kubernetes.io/hostname": config.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH,
            }},
        }))
        .map_err(|e| AgentError::Io {
            node: config.name.clone(),
            source: e.into(),
        })?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(api_error(e)),
        }
        let created = nodes.get(&config.name).await.map_err(api_error)?;
        patch_node_status(&nodes, &config.name, &facts, true)
            .await
            .map_err(api_error)?;
        let lease = node_lease(&config, &created);
        let leases: Api<Lease> = Api::namespaced(config.client.clone(), "kube-node-lease");
        leases
            .patch(
                &config.name,
                &PatchParams::apply("shardwise-node").force(),
                &Patch::Apply(&lease),
            )
            .await
            .map_err(api_error)?;

        let (shutdown, stopped) = watch::channel(false);
        let pods = Arc::new(Mutex::new(Pods::default()));
        let heartbeat = tokio::spawn(heartbeat(
            config.clone(),
            facts.clone(),
            lease,
            stopped.clone(),
        ));
        let launcher = Launcher::new(&config.init).map_err(|source| AgentError::Io {
            node: config.name.clone(),
            source,
        })?;
        let runtime = Arc::new(PodRuntime {
            hosts: crate::pod::Hosts::default(),
            created_paths: parking_lot::Mutex::new(Vec::new()),
            client: config.client.clone(),
            images: config.images.clone(),
            bridge: config.bridge.clone(),
            launcher,
            dir: config.dir.clone(),
            node: facts,
            service_endpoint: config.service_endpoint.clone(),
            initial_backoff: config.initial_backoff,
            max_backoff: config.max_backoff,
        });
        let watching = tokio::spawn(watch_pods(
            config.clone(),
            runtime.clone(),
            pods.clone(),
            stopped,
        ));
        Ok(Self {
            name: config.name,
            shutdown,
            tasks: vec![heartbeat, watching],
            pods,
            runtime,
        })
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops managing pod `name` without stopping it, as a node cut off from the API server
    /// would: its processes run on (until the agent stops), and whatever happens to the Pod
    /// object (a forced deletion, a new pod of the same name) no longer reaches them. Returns
    /// whether the agent ran such a pod.
    pub fn detach(&self, name: &str) -> bool {
        let mut pods = self.pods.lock();
        let uid = pods
            .managed
            .iter()
            .find(|(_, h)| h.name == name)
            .map(|(uid, _)| uid.clone());
        let Some(handle) = uid.as_ref().and_then(|uid| pods.managed.remove(uid)) else {
            return false;
        };
        let _ = handle.events.send(PodEvent::Detach);
        pods.detached.insert(uid.unwrap_or_default(), handle);
        true
    }

    /// Kills every container (no grace), removes every sandbox and stops the agent's tasks.
    pub async fn stop(mut self) {
        self.shutdown_now().await;
    }

    async fn shutdown_now(&mut self) {
        let _ = self.shutdown.send(true);
        let handles = self.pods.lock().take_all();
        for handle in &handles {
            let _ = handle.events.send(PodEvent::Shutdown);
        }
        for handle in handles {
            let _ = handle.task.await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.remove_mount_points();
    }

    /// Removes the mount points it made on the host, deepest first, once no pod runs.
    fn remove_mount_points(&self) {
        for path in self.runtime.created_paths.lock().drain(..).rev() {
            let _ = std::fs::remove_dir(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        // Without a runtime to wait on, abort: the launcher thread's end kills every container
        // (their parent-death signal) and the sandboxes go with their files.
        let _ = self.shutdown.send(true);
        for handle in self.pods.lock().take_all() {
            let _ = handle.events.send(PodEvent::Shutdown);
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn node_lease(config: &AgentConfig, node: &Node) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": config.name, "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": config.name,
                                 "uid": node.metadata.uid}],
        },
        "spec": {"holderIdentity": config.name, "leaseDurationSeconds": 40,
                 "renewTime": jiff::Timestamp::now().to_string()},
    }))
    .unwrap_or_default()
}

async fn patch_node_status(
    nodes: &Api<Node>,
    name: &str,
    facts: &NodeFacts,
    ready: bool,
) -> Result<(), kube::Error> {
    let now = rfc3339_now();
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({"type": kind, "status": status, "reason": reason,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let capacity = json!({"cpu": facts.allocatable_cpu, "memory": facts.allocatable_memory,
                          "pods": "110", "ephemeral-storage": "100Gi"});
    let status = json!({"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition("Ready", if ready { "True" } else { "False" }, "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [{"type": "InternalIP", "address": facts.host_ip},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "",
            "kernelVersion": "", "osImage": "shardwise-e2e",
            "containerRuntimeVersion": "shardwise-node://0.1.0",
            "kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
        },
    }});
    bounded(nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status)))
        .await
        .map(|_| ())
}

/// Renews the Lease and the Ready condition until stopped.
async fn heartbeat(
    config: AgentConfig,
    facts: NodeFacts,
    mut lease: Lease,
    mut stopped: watch::Receiver<bool>,
) {
    let nodes: Api<Node> = Api::all(config.client.clone());
    let leases: Api<Lease> = Api::namespaced(config.client.clone(), "kube-node-lease");
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep(HEARTBEAT) => {}
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                jiff::Timestamp::now(),
            ));
        }
        lease.metadata.managed_fields = None;
        lease.metadata.resource_version = None;
        if let Err(e) = bounded(leases.patch(
            &config.name,
            &PatchParams::apply("shardwise-node").force(),
            &Patch::Apply(&lease),
        ))
        .await
        {
            tracing::warn!(node = %config.name, error = %e, "cannot renew the node lease");
        }
        if let Err(e) = patch_node_status(&nodes, &config.name, &facts, true).await {
            tracing::warn!(node = %config.name, error = %e, "cannot update the node status");
        }
    }
}

/// Watches the pods bound to the node and hands each to a worker of its own.
async fn watch_pods(
    config: AgentConfig,
    runtime: Arc<PodRuntime>,
    pods: Arc<Mutex<Pods>>,
    mut stopped: watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::all(config.client.clone());
    let selector = format!("spec.nodeName={}", config.name);
    // Backed off as client-go's reflector is: without it, a kube-apiserver that is down turns
    // the watch into a loop of refused connections that keeps a core busy.
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    // The UIDs seen in the current list, to find pods deleted while the watch was down.
    let mut listing: Option<Vec<String>> = None;
    loop {
        let event = tokio::select! {
            _ = stopped.changed() => return,
            event = events.next() => event,
        };
        let Some(event) = event else { return };
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(node = %config.name, error = %e, "pod watch error");
                continue;
            }
        };
        match event {
            watcher::Event::Init => listing = Some(Vec::new()),
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if let Some(seen) = listing.as_mut() {
                    seen.push(uid.clone());
                }
                let mut pods = pods.lock();
                if let Some(handle) = pods.managed.get(&uid) {
                    let _ = handle.events.send(PodEvent::Updated(Box::new(pod)));
                } else if !pods.detached.contains_key(&uid) {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let task = tokio::spawn(run_pod(runtime.clone(), pod, rx));
                    pods.managed.insert(
                        uid,
                        PodHandle {
                            name,
                            events: tx,
                            task,
                        },
                    );
                }
            }
            watcher::Event::Delete(pod) => {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                if let Some(handle) = pods.lock().managed.get(&uid) {
                    let _ = handle.events.send(PodEvent::Gone);
                }
            }
            watcher::Event::InitDone => {
                let seen = listing.take().unwrap_or_default();
                for (uid, handle) in &pods.lock().managed {
                    if !seen.contains(uid) {
                        let _ = handle.events.send(PodEvent::Gone);
                    }
                }
            }
        }
        // Workers that finished (their pod is gone) leave the map.
        pods.lock().managed.retain(|_, h| !h.task.is_finished());
    }
}
