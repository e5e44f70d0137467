//! Pod networking with Debian's CNI plugins: each sandbox gets its own address on the node's
//! bridge, a process in it listens on a fixed port that every sandbox may use, the node
//! reaches it at the pod's address, and nothing is left once sandbox and bridge are dropped.
//! Needs root.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use shardwise_e2e_node::{Bridge, Launch, User};

fn links() -> String {
    String::from_utf8(
        Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

/// busybox's httpd on port 8080 of the sandbox at `netns`, serving `dir`.
fn serve(
    netns: std::path::PathBuf,
    dir: &std::path::Path,
    work: &std::path::Path,
    n: u32,
) -> Child {
    let launch = Launch {
        program: "/usr/bin/busybox".into(),
        argv: vec![
            "httpd".into(),
            "-f".into(),
            "-p".into(),
            "8080".into(),
            "-h".into(),
            dir.display().to_string(),
        ],
        env: Vec::new(),
        mounts: Vec::new(),
        hostname: "web".into(),
        user: User {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        },
        working_dir: "/".into(),
        read_only_root: false,
        no_new_privs: true,
        network_namespace: Some(netns),
    };
    let file = work.join(format!("launch-{n}.json"));
    std::fs::write(&file, serde_json::to_vec(&launch).unwrap()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_shardwise-container-init"))
        .arg(&file)
        .spawn()
        .unwrap()
}

fn get(address: Ipv4Addr) -> Result<String, String> {
    let mut stream = TcpStream::connect_timeout(&(address, 8080).into(), Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

fn eventually(address: Ipv4Addr) -> String {
    let started = Instant::now();
    loop {
        match get(address) {
            Ok(answer) => return answer,
            Err(e) if started.elapsed() > Duration::from_secs(30) => panic!("{address}:8080: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn pods_get_their_own_address_on_the_bridge_and_the_same_port_in_each() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "pod networking needs root"
    );
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    std::fs::create_dir(&site).unwrap();
    std::fs::write(site.join("index.html"), "served from a pod").unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let name = "swe2e-test-sb";
    let bridge = Bridge::create(
        name,
        Ipv4Addr::new(10, 244, 253, 1),
        &dir.path().join("ipam"),
    )
    .unwrap();
    assert!(links().contains(name));
    let (a, b) = (
        bridge.sandbox("pod-a", "a").unwrap(),
        bridge.sandbox("pod-b", "b").unwrap(),
    );
    assert_ne!(a.address(), b.address());
    for sandbox in [&a, &b] {
        let [x, y, z, last] = sandbox.address().octets();
        assert_eq!([x, y, z], [10, 244, 253]);
        assert!((10..=250).contains(&last));
    }
    let mut servers = [
        serve(a.path(), &site, dir.path(), 0),
        serve(b.path(), &site, dir.path(), 1),
    ];
    for sandbox in [&a, &b] {
        let answer = eventually(sandbox.address());
        assert!(
            answer.starts_with("HTTP/1.") && answer.ends_with("served from a pod"),
            "{answer}"
        );
    }
    for server in &mut servers {
        server.kill().unwrap();
        server.wait().unwrap();
    }
    let veths = |text: &str| {
        text.lines()
            .filter(|l| l.contains(&format!("master {name}")))
            .count()
    };
    assert_eq!(veths(&links()), 2);
    drop(a);
    assert_eq!(veths(&links()), 1);
    drop(b);
    drop(bridge);
    assert!(!links().contains(name));
}
