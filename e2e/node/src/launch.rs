//! What starting one container means, fully resolved: the host program and its argv, the
//! environment, the mounts, the user, the namespaces. The agent computes it from the pod spec
//! ([`crate::plan()`]); `shardwise-container-init` carries it out and executes the program, so
//! this is the whole contract between the two (serialized as JSON).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One container's start, as `shardwise-container-init` performs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The program on the host that the image's path maps to.
    pub program: PathBuf,
    /// The argv, `argv[0]` included (a multi-call binary like busybox dispatches on it).
    pub argv: Vec<String>,
    /// The whole environment, in order; nothing of the agent's own is inherited.
    pub env: Vec<(String, String)>,
    /// Bind mounts into the container's own mount namespace, in order.
    pub mounts: Vec<Mount>,
    /// The hostname in the container's own UTS namespace.
    pub hostname: String,
    /// Who the process runs as.
    pub user: User,
    /// The working directory.
    pub working_dir: PathBuf,
    /// `readOnlyRootFilesystem`: `/` is remounted read-only in the container's namespace.
    pub read_only_root: bool,
    /// `allowPrivilegeEscalation: false`: the process may never gain privileges (no_new_privs).
    pub no_new_privs: bool,
    /// The pod's network namespace (a path the agent keeps open), if it has one.
    pub network_namespace: Option<PathBuf>,
}

/// A bind mount of a host path (a volume's directory or file) at `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The host path.
    pub source: PathBuf,
    /// Where the container sees it.
    pub target: PathBuf,
    /// Whether it is mounted read-only.
    pub read_only: bool,
}

/// The user and groups a container runs as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// `runAsUser`, else the image's.
    pub uid: u32,
    /// `runAsGroup`, else the image's.
    pub gid: u32,
    /// `fsGroup` and `supplementalGroups`.
    pub groups: Vec<u32>,
}
