//! Replicas that run as pods: what a test sees of the containers the node agent runs for the
//! real StatefulSet controller's pods (their processes, logs and audit files on the node), and
//! waits on those pods.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
pub use shardwise_e2e::pods::{container_logs, container_pid, pod_dirs};
use shardwise_e2e::{Environment, wait_for};

/// Where a replica's audit file is in its container (`controller.auditFile`); the chart
/// mounts an emptyDir named `audit` on its directory.
pub const AUDIT_FILE: &str = "/var/log/shardwise/audit.jsonl";

/// One run of a replica pod: the pod, and its container's process.
#[derive(Clone, Debug)]
pub struct PodRun {
    pub name: String,
    pub uid: String,
    /// The pod's IP, where its metrics and probes listen.
    pub ip: String,
    /// The container's process.
    pub pid: u32,
    /// The pod's directory on the node: its volumes, and its containers' logs.
    pub dir: PathBuf,
}

impl PodRun {
    /// What every run of container `container` wrote to stdout and stderr.
    pub fn logs(&self, container: &str) -> String {
        container_logs(&self.dir, container)
            .iter()
            .filter_map(|log| std::fs::read_to_string(log).ok())
            .collect()
    }
}

/// The audit files ([`AUDIT_FILE`]) of every pod of StatefulSet `statefulset` node-0 ran.
pub fn audit_files(env: &Environment, namespace: &str, statefulset: &str) -> Vec<PathBuf> {
    pod_dirs(env.dir(), namespace, &format!("{statefulset}-"))
        .into_iter()
        .map(|pod| pod.join("volumes/audit/audit.jsonl"))
        .filter(|file| file.is_file())
        .collect()
}

/// Waits until pod `name` of `namespace`, under another UID than those in `not`, runs
/// `program` in container `container` with an IP; returns that run. On a timeout, the error
/// holds what the pod's containers of that name logged.
pub async fn wait_running(
    env: &Environment,
    client: &kube::Client,
    (namespace, name): (&str, &str),
    (container, program): (&str, &str),
    not: &BTreeSet<String>,
    timeout: Duration,
) -> Result<PodRun, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let nodes = env.dir().join("nodes").join("node-0");
    let running = wait_for(&format!("pod {name} running"), timeout, || async {
        let pod = pods
            .get_opt(name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no pod {name}"))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if not.contains(&uid) || pod.metadata.deletion_timestamp.is_some() {
            return Err(format!("pod {name} is still the old one ({uid})"));
        }
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .ok_or_else(|| format!("pod {name} has no IP yet"))?;
        let pid = container_pid(name, Some(&uid), program)
            .ok_or_else(|| format!("pod {name} ({uid}) runs no {program} yet"))?;
        Ok(PodRun {
            name: name.to_string(),
            dir: nodes.join(format!("{namespace}_{name}_{uid}")),
            uid,
            ip,
            pid,
        })
    })
    .await;
    running.map_err(|e| {
        let logs: String = pod_dirs(env.dir(), namespace, &format!("{name}_"))
            .iter()
            .flat_map(|dir| container_logs(dir, container))
            .filter_map(|log| std::fs::read_to_string(log).ok())
            .collect();
        format!("{e}; its {container} containers logged:\n{logs}")
    })
}

/// Waits until no pod `name` of UID `uid` exists any more.
pub async fn wait_gone(
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
    timeout: Duration,
) -> Result<(), String> {
    wait_for(&format!("pod {name} ({uid}) gone"), timeout, || async {
        match pods.get_opt(name).await.map_err(|e| e.to_string())? {
            Some(pod) if pod.metadata.uid.as_deref() == Some(uid) => Err(format!(
                "pod {name} ({uid}) still exists: {}",
                describe_stop(&pod)
            )),
            _ => Ok(()),
        }
    })
    .await
    .map_err(|e| e.to_string())
}

/// Where a pod is on its way out: whether it was deleted (and when), its phase, and each
/// container's state, so that a pod that does not go says whether nobody deleted it or its
/// node has not finished stopping it.
fn describe_stop(pod: &Pod) -> String {
    let deleted = pod.metadata.deletion_timestamp.as_ref().map_or_else(
        || "not deleted".to_string(),
        |t| {
            format!(
                "deleted at {} with {}s grace",
                t.0,
                pod.metadata
                    .deletion_grace_period_seconds
                    .unwrap_or_default()
            )
        },
    );
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<String> = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| {
            let state = c.state.clone().unwrap_or_default();
            let state = if state.running.is_some() {
                "running".to_string()
            } else if let Some(t) = state.terminated {
                format!("terminated ({})", t.exit_code)
            } else {
                "waiting".to_string()
            };
            format!("{} {state}", c.name)
        })
        .collect();
    format!(
        "{deleted}, phase {}, containers [{}]",
        status.phase.unwrap_or_default(),
        containers.join(", ")
    )
}
