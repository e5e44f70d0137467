//! Pods as the node agents run them, seen from the test: their directories on the node (volumes
//! and container logs) and their containers' processes.

use std::path::{Path, PathBuf};

/// The directories of every pod of `namespace` whose directory name (`<pod>_<uid>`) starts
/// with `prefix` that node-0 of the environment in `env_dir` ([`crate::Environment::dir`])
/// ran, running or gone.
pub fn pod_dirs(env_dir: &Path, namespace: &str, prefix: &str) -> Vec<PathBuf> {
    let pods = env_dir.join("nodes").join("node-0");
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
