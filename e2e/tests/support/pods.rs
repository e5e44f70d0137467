//! Replicas that run as pods: what a test sees of the containers the node agent runs for the
//! real StatefulSet controller's pods (their processes, logs and audit files on the node), and
//! waits on those pods.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
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

/// The directories of every pod of `namespace` whose directory name (`<pod>_<uid>`) starts
/// with `prefix` that node-0 ran, running or gone.
pub fn pod_dirs(env: &Environment, namespace: &str, prefix: &str) -> Vec<PathBuf> {
    let pods = env.dir().join("nodes").join("node-0");
    let prefix = format!("{namespace}_{prefix}");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(pods)
        .into_iter()
        .flatten()
        .filter_map(|pod| Some(pod.ok()?.path()))
        .filter(|pod| {
            pod.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect();
    dirs.sort();
    dirs
}

/// The audit files ([`AUDIT_FILE`]) of every pod of StatefulSet `statefulset` node-0 ran.
pub fn audit_files(env: &Environment, namespace: &str, statefulset: &str) -> Vec<PathBuf> {
    pod_dirs(env, namespace, &format!("{statefulset}-"))
        .into_iter()
        .map(|pod| pod.join("volumes/audit/audit.jsonl"))
        .filter(|file| file.is_file())
        .collect()
}

/// The logs of every run of container `container` of the pod in `dir`.
pub fn container_logs(dir: &Path, container: &str) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir.join(container))
        .into_iter()
        .flatten()
        .filter_map(|file| Some(file.ok()?.path()))
        .filter(|file| file.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// The parent of process `pid`.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether process `pid` descends from this test process (the node agent runs in it; other
/// tests on the machine may run pods of the same names).
fn ours(pid: u32) -> bool {
    std::iter::successors(parent(pid), |&p| parent(p))
        .take_while(|&p| p > 1)
        .any(|p| p == std::process::id())
}

/// The process running `program` for pod `pod`: among this test process's descendants, the
/// one whose `POD_NAME` is `pod` and, given `uid`, whose output goes to that pod's directory
/// (a pod replaced under the same name has another).
pub fn container_pid(pod: &str, uid: Option<&str>, program: &str) -> Option<u32> {
    let wanted = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
        let named =
            environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) && cmdline.contains(program);
        let of_uid = || {
            uid.is_none_or(|uid| {
                std::fs::read_link(format!("/proc/{pid}/fd/2"))
                    .is_ok_and(|log| log.to_string_lossy().contains(uid))
            })
        };
        (named && of_uid() && ours(pid)).then_some(pid)
    })
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
        let logs: String = pod_dirs(env, namespace, &format!("{name}_"))
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
            Some(pod) if pod.metadata.uid.as_deref() == Some(uid) => {
                Err(format!("pod {name} ({uid}) still exists"))
            }
            _ => Ok(()),
        }
    })
    .await
    .map_err(|e| e.to_string())
}
