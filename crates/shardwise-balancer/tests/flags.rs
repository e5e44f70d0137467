//! The balancer's command line: settings that cannot work are refused before anything runs,
//! with exit code 2 and a message that says why.

use std::process::{Command, Output};

fn balancer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardwise-balancer"))
        .args(args)
        // Nothing may be reached: a refusal must come before any request.
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .env_remove("POD_NAMESPACE")
        .env_remove("POD_NAME")
        .output()
        .expect("the balancer runs")
}

fn refused(args: &[&str]) -> String {
    let out = balancer(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        out.stdout.is_empty(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

#[test]
fn an_interval_over_an_hour_is_refused_with_the_limit() {
    let err = refused(&["--interval", "5000"]);
    assert!(err.contains("5000 is over the limit of 3600"), "{err}");
    let err = refused(&["--interval", "0"]);
    assert!(
        err.contains("must be a whole number from 1 to 3600, got 0"),
        "{err}"
    );
}

#[test]
fn a_target_below_the_mean_is_refused_in_one_line() {
    let err = refused(&["--target-balance", "0.5"]);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("shardwise-balancer: invalid target balance: 0.5 is below 1"),
        "{err}"
    );
}

#[test]
fn damping_that_cannot_work_is_refused() {
    let err = refused(&["--load-trigger", "1.02"]);
    assert_eq!(
        err.trim_end(),
        "shardwise-balancer: --load-trigger (1.02) is below --target-balance (1.03): moves would start where they must stop"
    );
    let err = refused(&["--hourly-move-budget", "0"]);
    assert!(err.contains("0 is not in 1..=10000"), "{err}");
    let err = refused(&["--min-move-interval", "90000"]);
    assert!(err.contains("90000 is not in 0..=86400"), "{err}");
    let err = refused(&["--sync-wait=86401"]);
    assert!(err.contains("86401 is not in 0..=86400"), "{err}");
}

#[test]
fn an_unknown_argo_cd_algorithm_is_refused_with_the_known_ones() {
    let err = refused(&["--current-strategy", "ring"]);
    assert!(
        err.contains("Argo CD has no sharding algorithm \"ring\"; it has legacy, round-robin and consistent-hashing"),
        "{err}"
    );
}

#[test]
fn failures_while_starting_exit_1_and_say_what_failed() {
    // Its sockets are bound first: a port in use is said once, with the reason.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let address = taken.local_addr().expect("bound").to_string();
    let out = balancer(&["--metrics-addr", &address]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "shardwise-balancer: cannot listen on {address}: Address already in use (os error 98)"
        )
    );
    drop(taken);

    let health = shardwise_e2e::free_port().expect("a port");
    let metrics = shardwise_e2e::free_port().expect("a port");
    let (health, metrics) = (
        format!("127.0.0.1:{health}"),
        format!("127.0.0.1:{metrics}"),
    );
    let out = balancer(&["--health-addr", &health, "--metrics-addr", &metrics]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot load a Kubernetes configuration"),
        "{err}"
    );
}

#[test]
fn a_measured_load_that_cannot_work_is_refused() {
    let err = refused(&["--load", "measured", "--load-memory-weight", "1.5"]);
    assert!(err.contains("must be from 0 to 1, got 1.5"), "{err}");
    let err = refused(&["--load-memory-weight", "half"]);
    assert!(
        err.contains("must be a number from 0 to 1, got \"half\""),
        "{err}"
    );
    let err = refused(&["--load-window", "90000"]);
    assert!(err.contains("90000 is not in 0..=86400"), "{err}");
    let err = refused(&["--load", "cpu"]);
    assert!(
        err.contains("[possible values: apps, resources, measured]"),
        "{err}"
    );
}

#[test]
fn replica_bounds_that_cannot_work_are_refused() {
    let err = refused(&["--manage-replicas", "--min-replicas", "1"]);
    assert!(err.contains("1 is not in 2..=1000"), "{err}");
    let err = refused(&[
        "--manage-replicas",
        "--min-replicas",
        "5",
        "--max-replicas",
        "4",
    ]);
    assert!(
        err.contains("--min-replicas 5, --max-replicas 4")
            && err.contains("1 <= min <= max, got 5..4"),
        "{err}"
    );
    let err = refused(&["--load-per-replica", "0"]);
    assert!(
        err.contains("--load-per-replica 0") && err.contains("positive number"),
        "{err}"
    );
    let err = refused(&["--scale-down-window", "0"]);
    assert!(err.contains("from 1 to 3600"), "{err}");
}
