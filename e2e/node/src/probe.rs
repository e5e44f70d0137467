//! Startup, liveness and readiness probes as the kubelet runs them: an HTTP GET (success is a
//! status from 200 to 399) or a TCP connect to the pod's address, every `periodSeconds` after
//! `initialDelaySeconds`, each within `timeoutSeconds`, a result flipping only after
//! `successThreshold` or `failureThreshold` answers in a row. What a probe is comes from the
//! spec ([`Probe::from_spec`]) and the counting is pure ([`Tracker`]); only [`check`] does I/O.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe as ProbeSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a probe does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `GET http://<pod IP>:<port><path>` with these headers.
    Http {
        /// The port.
        port: u16,
        /// The path, with its query.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// A TCP connection to `<pod IP>:<port>`.
    Tcp {
        /// The port.
        port: u16,
    },
}

/// One probe of a container, with the kubelet's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What it does.
    pub action: Action,
    /// Before the first check.
    pub initial_delay: Duration,
    /// Between checks.
    pub period: Duration,
    /// For one check.
    pub timeout: Duration,
    /// Passes in a row that make it succeed.
    pub success_threshold: u32,
    /// Failures in a row that make it fail.
    pub failure_threshold: u32,
    /// For a liveness or startup probe: the grace period of the kill it causes, if its own.
    pub termination_grace: Option<Duration>,
}

/// Why a probe cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Exec and gRPC probes, HTTPS, and ports that name no port of the container.
    #[error("unsupported probe: {0}")]
    Unsupported(String),
}

fn seconds(value: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(
        value
            .and_then(|v| u64::try_from(v).ok())
            .filter(|&v| v > 0)
            .unwrap_or(default),
    )
}

fn count(value: Option<i32>, default: u32) -> u32 {
    value
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

fn port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
            .ok_or_else(|| ProbeError::Unsupported(format!("no port named {name:?}")))?,
    };
    u16::try_from(number).map_err(|_| ProbeError::Unsupported(format!("port {number}")))
}

impl Probe {
    /// The probe `spec` of `container`, its named ports resolved.
    pub fn from_spec(spec: &ProbeSpec, container: &Container) -> Result<Self, ProbeError> {
        let action = if let Some(http) = &spec.http_get {
            if http.scheme.as_deref().is_some_and(|s| s != "HTTP") {
                return Err(ProbeError::Unsupported("HTTPS".into()));
            }
            Action::Http {
                port: port(&http.port, container)?,
                path: http.path.clone().unwrap_or_else(|| "/".into()),
                headers: http
                    .http_headers
                    .iter()
                    .flatten()
                    .map(|h| (h.name.clone(), h.value.clone()))
                    .collect(),
            }
        } else if let Some(tcp) = &spec.tcp_socket {
            Action::Tcp {
                port: port(&tcp.port, container)?,
            }
        } else {
            return Err(ProbeError::Unsupported("exec and gRPC probes".into()));
        };
        Ok(Self {
            action,
            initial_delay: Duration::from_secs(
                spec.initial_delay_seconds
                    .and_then(|v| u64::try_from(v).ok())
                    .unwrap_or(0),
            ),
            period: seconds(spec.period_seconds, 10),
            timeout: seconds(spec.timeout_seconds, 1),
            success_threshold: count(spec.success_threshold, 1),
            failure_threshold: count(spec.failure_threshold, 3),
            termination_grace: spec
                .termination_grace_period_seconds
                .and_then(|v| u64::try_from(v).ok())
                .map(Duration::from_secs),
        })
    }
}

/// A probe's result from its answers in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    success_threshold: u32,
    failure_threshold: u32,
    passes: u32,
    failures: u32,
    result: Option<bool>,
}

impl Tracker {
    /// No result yet.
    pub fn new(probe: &Probe) -> Self {
        Self {
            success_threshold: probe.success_threshold,
            failure_threshold: probe.failure_threshold,
            passes: 0,
            failures: 0,
            result: None,
        }
    }

    /// The result so far: `None` until a threshold is reached once.
    pub fn result(&self) -> Option<bool> {
        self.result
    }

    /// Counts one answer; returns the result when this answer changed it.
    pub fn record(&mut self, passed: bool) -> Option<bool> {
        if passed {
            self.passes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.passes = 0;
        }
        let now = if self.passes >= self.success_threshold {
            Some(true)
        } else if self.failures >= self.failure_threshold {
            Some(false)
        } else {
            self.result
        };
        let changed = now != self.result;
        self.result = now;
        if changed { now } else { None }
    }
}

/// Runs `action` once against `ip`; whether it passed.
pub async fn check(action: &Action, ip: IpAddr, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, attempt(action, ip))
        .await
        .unwrap_or(false)
}

async fn attempt(action: &Action, ip: IpAddr) -> bool {
    match action {
        Action::Tcp { port } => TcpStream::connect(SocketAddr::new(ip, *port)).await.is_ok(),
        Action::Http {
            port,
            path,
            headers,
        } => {
            let Ok(mut stream) = TcpStream::connect(SocketAddr::new(ip, *port)).await else {
                return false;
            };
            let mut request = format!(
                "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
            );
            for (name, value) in headers {
                request.push_str(&format!("{name}: {value}\r\n"));
            }
            request.push_str("\r\n");
            if stream.write_all(request.as_bytes()).await.is_err() {
                return false;
            }
            // The status line is enough: "HTTP/1.1 200 OK".
            let mut head = [0u8; 12];
            if stream.read_exact(&mut head).await.is_err() {
                return false;
            }
            std::str::from_utf8(&head[9..12])
                .ok()
                .and_then(|code| code.parse::<u16>().ok())
                .is_some_and(|code| (200..400).contains(&code))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(successes: u32, failures: u32) -> Probe {
        Probe {
            action: Action::Tcp { port: 1 },
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: successes,
            failure_threshold: failures,
            termination_grace: None,
        }
    }

    #[test]
    fn a_result_flips_only_after_its_threshold_in_a_row() {
        let mut t = Tracker::new(&probe(1, 3));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None, "the failures were not in a row");
        assert_eq!(
            (t.record(false), t.record(false), t.record(false)),
            (None, None, Some(false))
        );
        assert_eq!(t.result(), Some(false));
        let mut two = Tracker::new(&probe(2, 1));
        assert_eq!((two.record(true), two.record(true)), (None, Some(true)));
    }
}
