//! Nodes of an environment's control plane: a node network (a bridge whose address every link
//! of the environment listens on, so that pods reach the servers) and node agents
//! (`shardwise-e2e-node`) that run the pods the scheduler binds to them as local processes.
//! The images they run are this workspace's binaries, built from the current source, and
//! busybox.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use shardwise_e2e_node::{AgentConfig, Bridge, Image, ImageTable, NodeAgent, Programs};

use crate::HarnessError;
use crate::binary::workspace_binary;
use crate::real::RealApiServer;

/// Where the locks that hand out node networks live: one network per environment, whatever
/// process runs it.
const LOCKS: &str = "/run/shardwise-e2e";

/// The name of the link through which the pod of UID `uid` reaches the API server: faults
/// scoped to it (`FaultScope::identity(pod_link(uid))`) reach that pod alone, and not a pod
/// recreated under the same name.
pub fn pod_link(uid: &str) -> String {
    format!("pod/{uid}")
}

/// Whether `pod` is Ready: its `Ready` condition is `True`, as the StatefulSet and disruption
/// controllers count it.
pub fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` is Ready and not being deleted: it serves, and goes on serving until it is
/// told to stop.
pub fn pod_serving(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// The image of the chart (and of the Dockerfile), whose binaries this workspace builds.
pub const SHARDWISE_IMAGE: &str = "ghcr.io/shardwise/shardwise";

fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let path = path.into();
    move |source| HarnessError::Io { path, source }
}

/// One environment's node network: `10.244.<i>.0/24` on bridge `swe2e<i>`, `i` held by a lock
/// for as long as the environment lives.
#[derive(Debug)]
pub(crate) struct NodeNetwork {
    bridge: Arc<Bridge>,
    _lock: Flock<File>,
}

impl NodeNetwork {
    /// Claims the first free network and creates its bridge.
    pub(crate) fn claim(dir: &Path) -> Result<Self, HarnessError> {
        std::fs::create_dir_all(LOCKS).map_err(io(LOCKS))?;
        for index in 0..240u8 {
            let path = Path::new(LOCKS).join(format!("net-{index}.lock"));
            let file = File::create(&path).map_err(io(&path))?;
            let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            let bridge = Bridge::create(
                &format!("swe2e{index}"),
                Ipv4Addr::new(10, 244, index, 1),
                &dir.join("cni-ipam"),
            )
            .map_err(|e| io("node network")(std::io::Error::other(e.to_string())))?;
            return Ok(Self {
                bridge: Arc::new(bridge),
                _lock: lock,
            });
        }
        Err(io(LOCKS)(std::io::Error::other(
            "every node network (240) is taken",
        )))
    }

    /// The node's address on it, where the links listen.
    pub(crate) fn gateway(&self) -> Ipv4Addr {
        self.bridge.gateway()
    }
}

/// The node agents of an environment, on a runtime of their own; dropped, they kill every
/// container and remove every sandbox.
#[derive(Debug)]
pub(crate) struct Nodes {
    agents: Vec<NodeAgent>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The workspace's binaries an image maps, by path in the image, and the package and binary
/// that build each.
type Binaries = [(&'static str, &'static str, &'static str)];

/// The shardwise image's (Dockerfile).
const SHARDWISE_BINARIES: &Binaries = &[
    (
        "/usr/local/bin/shardwise-controller",
        "shardwise-controller",
        "shardwise-controller",
    ),
    (
        "/usr/local/bin/shardwise-balancer",
        "shardwise-balancer",
        "shardwise-balancer",
    ),
    ("/usr/local/bin/shardwise", "shardwise-cli", "shardwise"),
];

/// The image of the example controller (examples/namespace-labeller/Dockerfile).
pub const LABELLER_IMAGE: &str = "ghcr.io/shardwise/namespace-labeller";

const LABELLER_BINARIES: &Binaries = &[(
    "/usr/local/bin/namespace-labeller",
    "namespace-labeller",
    "namespace-labeller",
)];

/// The image of the sharded kube-runtime example (examples/configmapgen/Dockerfile).
const CONFIGMAPGEN_IMAGE: &str = "ghcr.io/shardwise/configmapgen";

const CONFIGMAPGEN_BINARIES: &Binaries = &[(
    "/usr/local/bin/configmapgen-sharded",
    "configmapgen",
    "configmapgen-sharded",
)];

/// An image as the workspace's Dockerfiles build them: `binaries` on distroless, user 65532,
/// `entrypoint` its ENTRYPOINT.
fn distroless(binaries: &Binaries, entrypoint: &str) -> Result<Image, HarnessError> {
    let mut files = std::collections::BTreeMap::new();
    for (path, package, bin) in binaries {
        files.insert(PathBuf::from(path), workspace_binary(package, bin)?);
    }
    Ok(Image {
        entrypoint: vec![entrypoint.into()],
        cmd: Vec::new(),
        env: vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            (
                "SSL_CERT_FILE".into(),
                "/etc/ssl/certs/ca-certificates.crt".into(),
            ),
            ("HOME".into(), "/home/nonroot".into()),
        ],
        uid: 65532,
        gid: 65532,
        working_dir: "/".into(),
        programs: Programs::Files(files),
    })
}

/// The images the agents run: shardwise's (`ENTRYPOINT ["/usr/local/bin/shardwise-controller"]`),
/// the examples' (the labeller, configmapgen), and busybox (the chart's `helm test` pod's).
fn images(dir: &Path) -> Result<ImageTable, HarnessError> {
    let mut table = ImageTable::default();
    table.insert(
        SHARDWISE_IMAGE,
        distroless(SHARDWISE_BINARIES, "/usr/local/bin/shardwise-controller")?,
    );
    table.insert(
        LABELLER_IMAGE,
        distroless(LABELLER_BINARIES, "/usr/local/bin/namespace-labeller")?,
    );
    table.insert(
        CONFIGMAPGEN_IMAGE,
        distroless(CONFIGMAPGEN_BINARIES, "/usr/local/bin/configmapgen-sharded")?,
    );
    // Argo CD's image: one binary that runs the component its argv[0] names, as the image's
    // links to it do; there once scripts/argocd.sh has built it. Its user is the image's
    // (999); HOME is set by the pod, the host having no /home/argocd.
    if let Ok(argocd) = crate::argocd::argocd_binary() {
        table.insert(
            crate::argocd::ARGOCD_IMAGE,
            Image {
                entrypoint: Vec::new(),
                cmd: Vec::new(),
                env: vec![(
                    "PATH".into(),
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                )],
                uid: 999,
                gid: 999,
                working_dir: "/".into(),
                programs: Programs::MultiCall {
                    program: argocd,
                    applets: [
                        "argocd",
                        "argocd-application-controller",
                        "argocd-repo-server",
                        "argocd-server",
                    ]
                    .map(String::from)
                    .to_vec(),
                },
            },
        );
    }
    // Debian's busybox finds its applets only on PATH: a directory of links to it.
    let busybox = PathBuf::from("/usr/bin/busybox");
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .map_err(io(&busybox))?;
    let applets: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let bin = dir.join("busybox-bin");
    std::fs::create_dir_all(&bin).map_err(io(&bin))?;
    for applet in &applets {
        let link = bin.join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink(&busybox, &link).map_err(io(&link))?;
        }
    }
    table.insert(
        "busybox",
        Image {
            entrypoint: Vec::new(),
            cmd: vec!["sh".into()],
            env: vec![("PATH".into(), bin.display().to_string())],
            uid: 0,
            gid: 0,
            working_dir: "/".into(),
            programs: Programs::MultiCall {
                program: busybox,
                applets,
            },
        },
    );
    Ok(table)
}

/// Runs `future` on `runtime` from a thread of its own: the caller may be a test's runtime,
/// which must not block.
fn on<F>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime.block_on(future))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Nodes {
    /// Starts `count` agents (`node-0`, ...) for `server`'s cluster on `network`.
    pub(crate) fn start(
        server: &RealApiServer,
        network: &NodeNetwork,
        count: usize,
        dir: &Path,
    ) -> Result<Self, HarnessError> {
        let images = images(dir)?;
        let init = workspace_binary("shardwise-e2e-node", "shardwise-container-init")?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("node-agents")
            .enable_all()
            .build()
            .map_err(io("node agents' runtime"))?;
        let mut agents = Vec::new();
        for index in 0..count {
            let name = format!("node-{index}");
            let kubeconfig = server.node_kubeconfig(&name)?;
            let pods_dir = dir.join("nodes").join(&name);
            std::fs::create_dir_all(&pods_dir).map_err(io(&pods_dir))?;
            // The container's user must reach its volumes through every directory above them.
            for ancestor in pods_dir
                .ancestors()
                .take_while(|a| a.starts_with(dir) || *a == dir)
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(ancestor, std::fs::Permissions::from_mode(0o755))
                    .map_err(io(ancestor))?;
            }
            let opener = server.link_opener();
            let config = AgentConfig {
                name: name.clone(),
                client: on(&runtime, crate::client::client_of(&name, &kubeconfig))?,
                images: images.clone(),
                bridge: network.bridge.clone(),
                init: init.clone(),
                dir: pods_dir,
                service_endpoint: Arc::new(move |uid| {
                    let port = opener.port(&pod_link(uid)).ok()?;
                    Some((opener.address().to_string(), port))
                }),
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(10),
            };
            let agent = on(&runtime, NodeAgent::start(config)).map_err(|e| {
                io(format!("node agent {name}"))(std::io::Error::other(e.to_string()))
            })?;
            agents.push(agent);
        }
        Ok(Self {
            agents,
            runtime: Some(runtime),
        })
    }

    /// Agent `node-{index}`.
    pub(crate) fn agent(&self, index: usize) -> Option<&NodeAgent> {
        self.agents.get(index)
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let agents = std::mem::take(&mut self.agents);
        on(&runtime, async {
            for agent in agents {
                agent.stop().await;
            }
        });
        runtime.shutdown_background();
    }
}
