//! shardwise-container-init carrying out a Launch: the program sees exactly the argv and
//! environment given, its volumes at their paths (read-only where asked) over a private
//! `/run`, a read-only root, its own hostname and user, and the host sees none of its mounts.
//! Needs root, as the node agent does.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use shardwise_e2e_node::{Launch, Mount, User};

#[test]
fn a_container_starts_with_its_argv_env_mounts_user_and_hostname_and_leaves_the_host_alone() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the node agent's container init needs root (namespaces, mounts, a user change)"
    );
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("volume");
    std::fs::create_dir(&volume).unwrap();
    std::fs::write(volume.join("token"), "t0ken").unwrap();
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    // Written by the container's user.
    std::fs::set_permissions(
        &scratch,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let script = "echo \"argv0=$0 arg=$1\"; echo \"env=$GREETING path=$PATH\"; \
                  echo \"token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\"; \
                  echo \"id=$(id -u):$(id -g) groups=$(id -G)\"; echo \"host=$(hostname)\"; \
                  touch /var/run/secrets/kubernetes.io/serviceaccount/x 2>/dev/null || echo volume-read-only; \
                  touch /etc/shardwise-e2e-probe 2>/dev/null || echo root-read-only; \
                  echo ok > /mnt/out && echo scratch-written";
    let launch = Launch {
        program: "/usr/bin/busybox".into(),
        // busybox runs its `sh` only when argv[0] says so.
        argv: vec![
            "sh".into(),
            "-c".into(),
            script.into(),
            "zero".into(),
            "one".into(),
        ],
        env: vec![
            ("GREETING".into(), "hello".into()),
            ("PATH".into(), "/usr/bin:/bin".into()),
        ],
        mounts: vec![
            Mount {
                source: volume.clone(),
                target: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                read_only: true,
            },
            Mount {
                source: scratch.clone(),
                target: "/mnt".into(),
                read_only: false,
            },
        ],
        hostname: "shardwise-2".into(),
        user: User {
            uid: 65532,
            gid: 65532,
            groups: vec![65532, 4242],
        },
        working_dir: "/".into(),
        read_only_root: true,
        no_new_privs: true,
        network_namespace: None,
    };
    // /mnt exists on the host; the scratch dir is mounted there only for the container.
    assert!(Path::new("/mnt").is_dir());
    let file = dir.path().join("launch.json");
    std::fs::write(&file, serde_json::to_vec(&launch).unwrap()).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_shardwise-container-init"))
        .arg(&file)
        .env("LEAKED", "from the agent")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "argv0=zero arg=one",
            "env=hello path=/usr/bin:/bin",
            "token=t0ken",
            "id=65532:65532 groups=65532 4242",
            "host=shardwise-2",
            "volume-read-only",
            "root-read-only",
            "scratch-written",
        ]
    );
    assert_eq!(
        std::fs::read_to_string(scratch.join("out")).unwrap(),
        "ok\n"
    );
    // Nothing reached the host: no /run/secrets, no mount on /mnt, the hostname unchanged.
    assert!(!Path::new("/run/secrets/kubernetes.io").exists());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&*scratch.to_string_lossy()), "{mounts}");
    assert_ne!(nix::unistd::gethostname().unwrap(), "shardwise-2");
}

#[test]
fn a_launch_that_cannot_be_carried_out_exits_127_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("launch.json");
    std::fs::write(&file, "{\"program\": 3}").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_shardwise-container-init"))
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("launch.json") && stderr.contains("invalid type"),
        "{stderr}"
    );
}
