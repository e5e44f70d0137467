//! Containers' signals: a stop sends SIGTERM and waits the grace period, a container that
//! ignores it is killed with its whole group, a kill is immediate, and exit codes read as the
//! kubelet reports them. Needs root (shardwise-container-init).

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use shardwise_e2e_node::{Exit, Launch, Launcher, Running, User};

fn shell(script: &str) -> Launch {
    Launch {
        program: "/usr/bin/busybox".into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        mounts: Vec::new(),
        hostname: "c".into(),
        user: User {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        },
        working_dir: "/".into(),
        read_only_root: false,
        no_new_privs: false,
        network_namespace: None,
    }
}

fn start(launcher: &Launcher, dir: &Path, name: &str, script: &str) -> Running {
    launcher
        .start(
            &shell(script),
            &dir.join(format!("{name}.json")),
            &dir.join(format!("{name}.log")),
        )
        .unwrap()
}

/// Waits until the container has written `marker` to its log (it is running its script).
async fn logged(dir: &Path, name: &str, marker: &str) {
    let log = dir.join(format!("{name}.log"));
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(marker)
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{name} never logged {marker}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[tokio::test]
async fn stops_terminate_then_kill_the_whole_group_and_exit_codes_read_as_the_kubelet_reports_them()
{
    assert!(
        nix::unistd::geteuid().is_root(),
        "containers are started as root"
    );
    let dir = tempfile::tempdir().unwrap();
    let launcher =
        Launcher::new(Path::new(env!("CARGO_BIN_EXE_shardwise-container-init"))).unwrap();

    // A graceful container: exits 0 on SIGTERM, well within its grace period.
    let mut graceful = start(
        &launcher,
        dir.path(),
        "graceful",
        "trap 'echo term; exit 0' TERM; echo up; while true; do sleep 0.1; done",
    );
    logged(dir.path(), "graceful", "up").await;
    let asked = Instant::now();
    assert_eq!(
        graceful.stop(Duration::from_secs(30)).await,
        Exit {
            code: 0,
            signal: None
        }
    );
    assert!(asked.elapsed() < Duration::from_secs(10));
    assert!(
        std::fs::read_to_string(dir.path().join("graceful.log"))
            .unwrap()
            .contains("term")
    );

    // One that ignores SIGTERM and has a child of its own: killed after the grace, child too.
    let mut stubborn = start(
        &launcher,
        dir.path(),
        "stubborn",
        "trap '' TERM; sleep 300 & echo child=$!; wait",
    );
    logged(dir.path(), "stubborn", "child=").await;
    let log = std::fs::read_to_string(dir.path().join("stubborn.log")).unwrap();
    let child: u32 = log.trim().trim_start_matches("child=").parse().unwrap();
    assert!(alive(child));
    let asked = Instant::now();
    assert_eq!(
        stubborn.stop(Duration::from_secs(1)).await,
        Exit {
            code: 137,
            signal: Some(9)
        }
    );
    assert!(asked.elapsed() >= Duration::from_secs(1));
    let started = Instant::now();
    while alive(child) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the container's child {child} survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A kill, as an OOM kill would: at once, 137.
    let mut killed = start(&launcher, dir.path(), "killed", "echo up; sleep 300");
    logged(dir.path(), "killed", "up").await;
    assert_eq!(
        killed.kill().await,
        Exit {
            code: 137,
            signal: Some(9)
        }
    );

    // Its own exit code, and a program that cannot run.
    let mut failing = start(&launcher, dir.path(), "failing", "exit 3");
    assert_eq!(
        failing.wait().await,
        Exit {
            code: 3,
            signal: None
        }
    );
    let mut missing = launcher
        .start(
            &Launch {
                program: "/nonexistent/program".into(),
                ..shell("")
            },
            &dir.path().join("missing.json"),
            &dir.path().join("missing.log"),
        )
        .unwrap();
    assert_eq!(
        missing.wait().await,
        Exit {
            code: 127,
            signal: None
        }
    );
    assert!(
        std::fs::read_to_string(dir.path().join("missing.log"))
            .unwrap()
            .contains("/nonexistent/program")
    );
}
