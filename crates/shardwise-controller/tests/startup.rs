//! What the controller process does when it cannot start as configured.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A replica whose metrics port is taken stops at once and says which address, instead of
/// running on with neither metrics nor probes (its Lease held, its work done, unobserved).
#[test]
fn a_taken_metrics_port_stops_the_replica_at_once() {
    let dir = std::env::temp_dir().join(format!("shardwise-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A control plane that refuses connections: the process would retry it for ever.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
         clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: c, context: {cluster: c, user: u}}]\n",
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardwise-controller"))
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", "shardwise-0")
        .env("POD_NAMESPACE", "shardwise")
        .arg(format!("--metrics-addr={address}"))
        .arg("--health-addr=127.0.0.1:0")
        .arg("--metrics-secure=false")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the replica still runs 20 s after failing to listen on {address}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {address}")),
        "{stderr}"
    );
}
