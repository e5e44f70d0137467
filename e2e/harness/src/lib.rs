//! Harness for shardwise's end-to-end tests.
//!
//! Starts a real control plane on loopback (etcd, and one kube-apiserver per cluster: a control
//! plane and destination clusters), writes a kubeconfig per identity, injects faults between
//! each identity and its server, applies YAML, builds the workspace's binaries from the current
//! source ([`controller_binary`]), launches and kills processes with captured output, scrapes
//! their Prometheus metrics, and waits for conditions with failure messages that say what was
//! expected and what was seen.
//!
//! ```no_run
//! # async fn demo() -> Result<(), shardwise_e2e::HarnessError> {
//! use std::time::Duration;
//! use shardwise_e2e::{
//!     Environment, FaultScope, Identity, ProcessSpec, controller_binary, free_port, wait_for,
//! };
//!
//! let env = Environment::builder()
//!     .destinations(2)
//!     .identity(Identity::service_account("shardwise-0", "shardwise", "shardwise"))
//!     .start()?;
//! env.control_plane().apply_yaml("admin", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shardwise\n").await?;
//! let port = free_port()?;
//! let kubeconfig = env.control_plane().kubeconfig_path("shardwise-0")?;
//! let mut replica = env.spawn(
//!     &ProcessSpec::new("shardwise-0", controller_binary()?)
//!         .env("POD_NAME", "shardwise-0")
//!         .env("POD_NAMESPACE", "shardwise")
//!         .env("KUBECONFIG", &kubeconfig)
//!         .arg(format!("--metrics-addr=127.0.0.1:{port}"))
//!         .arg(format!("--health-addr=127.0.0.1:{port}"))
//!         .arg("--metrics-secure=false"),
//! )?;
//! let url = format!("http://127.0.0.1:{port}/metrics");
//! wait_for("replica 0 to hold its shard lease", Duration::from_secs(30), || async {
//!     let m = shardwise_e2e::scrape(&url).await.map_err(|e| e.to_string())?;
//!     match m.get("shardwise_lease_held", &[("shard", "0")]) {
//!         Some(held) if held == 1.0 => Ok(held),
//!         other => Err(format!("shardwise_lease_held = {other:?}")),
//!     }
//! })
//! .await?;
//! env.control_plane().faults().partition(FaultScope::identity("shardwise-0"));
//! replica.kill()?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

pub mod argocd;
mod binary;
mod client;
mod cluster;
mod cost;
mod faults;
mod metrics;
mod nodes;
pub mod pods;
mod process;
pub mod procfs;
mod real;
mod server;
mod tls;
mod wait;

pub use binary::{
    BUILD_FEATURES_VAR, BuildError, CONTROLLER_BIN_VAR, controller_binary, workspace_binary,
    workspace_binary_with_features,
};
pub use cluster::{Cluster, Environment, EnvironmentBuilder, FIELD_MANAGER};
pub use cost::{ControlPlaneCost, ControlPlaneReading, RequestKind};
pub use faults::{ErrorFault, FaultCounters, FaultError, Faults};
pub use metrics::{Metrics, MetricsError, Sample, scrape};
pub use nodes::{LABELLER_IMAGE, SHARDWISE_IMAGE, pod_link, pod_ready, pod_serving};
pub use process::{Process, ProcessError, ProcessSpec};
pub use real::{RealApiServer, control_plane_binary};
pub use shardwise_e2e_node::NodeAgent;
pub use shardwise_e2e_testkit::{
    CertificateAuthority, CertificateError, ClientCertificate, Credential, FaultScope, Identity,
    WriteRecord, kubeconfig_yaml,
};
pub use wait::{Poll, WaitError, wait_for, wait_with};

/// Everything that can go wrong in the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The test API server could not start or do what was asked (`make demo`'s default).
    #[cfg(feature = "test-server")]
    #[error("test server of {cluster}: {reason}")]
    TestServer {
        /// The cluster.
        cluster: String,
        /// What went wrong.
        reason: String,
    },
    /// Argo CD has not been built.
    #[error(
        "{program} is missing: build Argo CD with scripts/argocd.sh (make argocd), or set SHARDWISE_ARGOCD_BIN"
    )]
    ArgoCdMissing {
        /// Where the binary was expected.
        program: std::path::PathBuf,
    },
    /// Something that runs as pods was asked of an environment without nodes.
    #[error("{what} runs as pods: start the environment with nodes(1)")]
    NeedsNodes {
        /// What was asked.
        what: String,
    },
    /// A binary of the control plane has not been built.
    #[error(
        "{program} is missing: build the control plane with scripts/control-plane.sh (or set SHARDWISE_CONTROL_PLANE_BIN)"
    )]
    ControlPlaneMissing {
        /// Where the binary was expected.
        program: std::path::PathBuf,
    },
    /// A kube-apiserver did not become ready in time, or exited while starting.
    #[error("kube-apiserver of {cluster} not ready after {waited:?}: {last}\n{log}")]
    NotReady {
        /// The cluster the server was for.
        cluster: String,
        /// How long the harness waited.
        waited: std::time::Duration,
        /// The last answer to the readiness check (or how the process exited).
        last: String,
        /// The last lines of the server's log.
        log: String,
    },
    /// An identity the cluster does not know.
    #[error("cluster {cluster} has no identity {identity:?}")]
    UnknownIdentity {
        /// The cluster asked.
        cluster: String,
        /// The identity's name.
        identity: String,
    },
    /// A client certificate could not be generated or signed.
    #[error("cannot issue a client certificate on {cluster}: {source}")]
    Certificate {
        /// The cluster whose CA was to sign it.
        cluster: String,
        /// Why it failed.
        #[source]
        source: CertificateError,
    },
    /// A kubeconfig that kube cannot read or turn into a client configuration.
    #[error("invalid kubeconfig for {cluster}: {reason}")]
    Kubeconfig {
        /// The cluster the kubeconfig is for.
        cluster: String,
        /// What kube reported.
        reason: String,
    },
    /// A file (or socket) operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file, or what was being set up instead (a port range, the tokio runtime).
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A YAML document that cannot be parsed or applied.
    #[error("YAML document {index}: {reason}")]
    Yaml {
        /// Its position in the stream, from 0.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The server does not serve an object's kind.
    #[error("cannot resolve {api_version} {kind}: {source}")]
    Discovery {
        /// The object's `apiVersion`.
        api_version: String,
        /// The object's `kind`.
        kind: String,
        /// What discovery reported.
        #[source]
        source: kube::Error,
    },
    /// A request to an API server failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// Starting, signalling or waiting for a process failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A metrics scrape failed.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// A condition did not hold in time.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// A binary of the workspace could not be built.
    #[error(transparent)]
    Build(#[from] BuildError),
}

/// A free TCP port on 127.0.0.1 for a process to listen on (e.g. its metrics endpoint).
///
/// It is chosen below the kernel's ephemeral range, which `bind(0)` and every outgoing
/// connection draw from: there, the client side of any connection on the machine could take the
/// port before its process binds it (a replica's metrics port once went that way, and the replica
/// ran without it). Below the range only another listener can, so a process-wide cursor hands
/// each port out once, starting at a place of its own per process, and skips ports in use.
pub fn free_port() -> Result<u16, HarnessError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 10_000;
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);

    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOWEST).max(1);
    let start = std::process::id().wrapping_mul(7_919) % span;
    let _ = CURSOR.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    let mut last = None;
    for _ in 0..span.min(1_000) {
        let offset = CURSOR.fetch_add(1, Ordering::Relaxed) % span;
        let Ok(port) = u16::try_from(LOWEST + offset) else {
            continue;
        };
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => return Ok(port),
            Err(e) => last = Some(e),
        }
    }
    Err(HarnessError::Io {
        path: format!("127.0.0.1:{LOWEST}-{}", LOWEST + span - 1).into(),
        source: last.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::AddrNotAvailable)),
    })
}
