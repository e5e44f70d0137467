//! What the `plan` end-to-end tests share: running the binary, and reading its failures.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

pub mod argocd;

use std::path::Path;
use std::process::{Command, Output};

/// Exit code of a failure while running (the API server, the kubeconfig, the fleet read).
pub const RUNTIME: i32 = 1;
/// Exit code of a command line refused as given.
pub const USAGE: i32 = 2;

/// `shardwise plan --kubeconfig KUBECONFIG ARGS`, ignoring any `$KUBECONFIG` of the caller.
pub fn shardwise(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardwise"))
        .arg("plan")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("the shardwise binary runs")
}

/// The one line an error gives, checked to be alone on stderr with its exit code and no stdout.
pub fn failure(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(output.stdout.is_empty(), "partial output on failure");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}
