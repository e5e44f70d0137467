//! What the `plan` end-to-end tests share: running the binary, and reading its failures.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

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

/// A StatefulSet `namespace/name` of `replicas` whose container has `env` (the inside of its
/// list).
pub fn statefulset(namespace: &str, name: &str, replicas: u32, env: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  replicas: {replicas}\n  serviceName: {name}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: c, image: x, env: [{env}]}}]}}\n"
    )
}

/// A shard Lease of StatefulSet `statefulset` for `shard`, renewed, with `report` as its
/// `shardwise.io/load` annotation.
pub fn shard_lease(statefulset: &str, shard: u32, report: &str) -> String {
    format!(
        "---\napiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {statefulset}-shard-{shard}\n  namespace: shardwise\n  labels: {{shardwise.io/lease: shard, shardwise.io/statefulset: {statefulset}, shardwise.io/shard: \"{shard}\"}}\n  annotations: {{shardwise.io/load: '{report}'}}\nspec: {{holderIdentity: {statefulset}-{shard}, leaseDurationSeconds: 15, renewTime: \"2030-01-01T00:00:00.000000Z\"}}\n"
    )
}
