//! Pod networking as a container runtime sets it up: one Linux bridge per node network, and per
//! pod a network namespace of its own with a veth on the bridge and an address from the
//! subnet, by Debian's CNI plugins (`containernetworking-plugins`: `bridge`, `host-local`,
//! `loopback`). Every pod listens on its own address, so fixed ports (a chart's 8080) work for
//! every replica, and the Services' EndpointSlices list real addresses.
//!
//! A pod's namespace has no name: the agent holds it by an open file, so it (and the pod's end
//! of the veth) vanishes with the agent's process however that ends. Pods get no default route:
//! they reach what is on their bridge (the node's address, where the API servers' links listen,
//! and each other), nothing else.

use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Where Debian installs the CNI plugins.
pub const CNI_PATH: &str = "/usr/lib/cni";

/// Why networking could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A command (`ip`, a CNI plugin) failed or could not run.
    #[error("{command}: {reason}")]
    Command {
        /// What ran.
        command: String,
        /// What it said.
        reason: String,
    },
    /// A namespace or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The CNI plugins are not installed.
    #[error(
        "{CNI_PATH}/bridge is missing: install Debian's containernetworking-plugins (scripts/prerequisites.sh does)"
    )]
    PluginsMissing,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetworkError {
    let what = what.into();
    move |source| NetworkError::Io { what, source }
}

fn run(command: &mut Command, stdin: Option<&str>) -> Result<String, NetworkError> {
    let shown = format!("{command:?}");
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetworkError::Command {
            command: shown.clone(),
            reason: e.to_string(),
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(io(format!("stdin of {shown}")))?;
    }
    let output = child
        .wait_with_output()
        .map_err(io(format!("waiting for {shown}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(NetworkError::Command {
            command: shown,
            reason: format!(
                "{} {stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// A node network: a bridge named `name` holding `gateway`/24, the node's address on it.
#[derive(Debug)]
pub struct Bridge {
    name: String,
    gateway: Ipv4Addr,
    ipam_dir: PathBuf,
}

impl Bridge {
    /// Creates bridge `name` (at most 15 characters) with `gateway`/24 on it, up; pod addresses
    /// are handed out from .10 to .250 of the subnet, their leases kept in `ipam_dir`.
    pub fn create(name: &str, gateway: Ipv4Addr, ipam_dir: &Path) -> Result<Self, NetworkError> {
        if !Path::new(CNI_PATH).join("bridge").is_file() {
            return Err(NetworkError::PluginsMissing);
        }
        // Left over by a process that was killed: a bridge of the same name is replaced.
        let _ = run(Command::new("ip").args(["link", "del", name]), None);
        run(
            Command::new("ip").args(["link", "add", name, "type", "bridge"]),
            None,
        )?;
        let bridge = Self {
            name: name.to_string(),
            gateway,
            ipam_dir: ipam_dir.to_path_buf(),
        };
        run(
            Command::new("ip").args(["addr", "add", &format!("{gateway}/24"), "dev", name]),
            None,
        )?;
        run(Command::new("ip").args(["link", "set", name, "up"]), None)?;
        Ok(bridge)
    }

    /// The node's address on it.
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The bridge plugin's configuration for this network.
    fn config(&self) -> String {
        let [a, b, c, _] = self.gateway.octets();
        let subnet = |last: u8| Ipv4Addr::new(a, b, c, last).to_string();
        json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "bridge",
            "bridge": self.name,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_dir,
                "ranges": [[{
                    "subnet": format!("{}/24", subnet(0)),
                    "rangeStart": subnet(10),
                    "rangeEnd": subnet(250),
                    "gateway": subnet(1),
                }]],
                "routes": [],
            },
        })
        .to_string()
    }

    /// A new pod network namespace on this bridge, for pod `id` (its UID).
    pub fn sandbox(&self, id: &str, pod: &str) -> Result<Sandbox, NetworkError> {
        let namespace = new_network_namespace()?;
        let path = namespace_path(&namespace);
        let cni = |ifname: &str, config: &str| {
            run(
                Command::new(Path::new(CNI_PATH).join(if ifname == "lo" {
                    "loopback"
                } else {
                    "bridge"
                }))
                .env_clear()
                .env("CNI_COMMAND", "ADD")
                .env("CNI_CONTAINERID", id)
                .env("CNI_NETNS", &path)
                .env("CNI_IFNAME", ifname)
                .env("CNI_PATH", CNI_PATH)
                .env("CNI_ARGS", format!("IgnoreUnknown=1;K8S_POD_NAME={pod}")),
                Some(config),
            )
        };
        cni(
            "lo",
            r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#,
        )?;
        let result = cni("eth0", &self.config())?;
        let mut sandbox = Sandbox {
            namespace,
            id: id.to_string(),
            config: self.config(),
            address: None,
        };
        let parsed: Value = serde_json::from_str(&result).map_err(|e| NetworkError::Command {
            command: "bridge ADD".into(),
            reason: format!("unreadable result {result:?}: {e}"),
        })?;
        let address = parsed["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<Ipv4Addr>().ok());
        match address {
            Some(address) => {
                sandbox.address = Some(address);
                Ok(sandbox)
            }
            None => {
                sandbox.remove();
                Err(NetworkError::Command {
                    command: "bridge ADD".into(),
                    reason: format!("no address in {result}"),
                })
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["link", "del", &self.name]), None);
    }
}

/// A network namespace that exists only as long as the returned file: made on a thread of its
/// own (namespaces belong to threads), which ends at once.
fn new_network_namespace() -> Result<File, NetworkError> {
    std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
            NetworkError::Io {
                what: "unshare a network namespace".into(),
                source: e.into(),
            }
        })?;
        File::open("/proc/thread-self/ns/net").map_err(io("/proc/thread-self/ns/net"))
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn namespace_path(namespace: &File) -> PathBuf {
    PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        namespace.as_raw_fd()
    ))
}

/// A pod's network: its namespace, held open, and its address.
#[derive(Debug)]
pub struct Sandbox {
    namespace: File,
    id: String,
    config: String,
    address: Option<Ipv4Addr>,
}

impl Sandbox {
    /// The pod's address.
    pub fn address(&self) -> Ipv4Addr {
        self.address.unwrap_or(Ipv4Addr::UNSPECIFIED)
    }

    /// A path to the namespace that another process may open (the agent's own file of it).
    pub fn path(&self) -> PathBuf {
        namespace_path(&self.namespace)
    }

    /// Releases the address and the veth; the namespace goes when this is dropped.
    fn remove(&mut self) {
        let _ = run(
            Command::new(Path::new(CNI_PATH).join("bridge"))
                .env_clear()
                .env("CNI_COMMAND", "DEL")
                .env("CNI_CONTAINERID", &self.id)
                .env("CNI_NETNS", self.path())
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", CNI_PATH),
            Some(&self.config),
        );
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.remove();
    }
}
