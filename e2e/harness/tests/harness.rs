//! The harness itself: environments, kubeconfigs, YAML, processes, metrics, waits, faults.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams};
use shardwise_e2e::{
    BuildError, Environment, FaultScope, HarnessError, Identity, Metrics, MetricsError, Poll,
    ProcessSpec, scrape, wait_for, wait_with,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(10);

const MANIFEST: &str = r#"
# A comment before the first document.
---
apiVersion: v1
kind: Namespace
metadata:
  name: shardwise
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: fleets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: fleets, singular: fleet, kind: Fleet}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
---
apiVersion: example.com/v1
kind: Fleet
metadata:
  name: main
  namespace: shardwise
spec:
  clusters: 3
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: one}
  data: {k: "1"}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: two, namespace: shardwise}
"#;

fn replica() -> Identity {
    Identity::service_account("shardwise-0", "shardwise", "shardwise")
}

#[tokio::test]
async fn environments_with_destinations_and_yaml() {
    let env = Environment::builder()
        .destinations(2)
        .identity(replica())
        .destination_identity(Identity::new("deployer", "deployer"))
        .start()
        .unwrap();
    assert_eq!(env.destinations().len(), 2);
    assert!(env.destination(2).is_none());
    let cp = env.control_plane();
    for identity in ["admin", "shardwise-0"] {
        let path = cp.kubeconfig_path(identity).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains(&format!("current-context: \"{identity}\"")),
            "{text}"
        );
    }
    assert!(
        std::fs::read_to_string(cp.kubeconfig_path_all())
            .unwrap()
            .contains("shardwise-0")
    );
    assert!(matches!(
        cp.kubeconfig_path("deployer"),
        Err(HarnessError::UnknownIdentity { .. })
    ));
    assert!(
        env.destination(1)
            .unwrap()
            .kubeconfig_path("deployer")
            .is_ok()
    );

    let applied = cp.apply_yaml("admin", MANIFEST).await.unwrap();
    let names: Vec<String> = applied
        .iter()
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["shardwise", "fleets.example.com", "main", "one", "two"]
    );
    assert_eq!(applied[2].data["spec"]["clusters"], 3);
    let again = cp.apply_yaml("admin", MANIFEST).await.unwrap();
    assert_eq!(
        again[3].metadata.resource_version, applied[3].metadata.resource_version,
        "re-applying changes nothing"
    );

    let admin = cp.client("admin").await.unwrap();
    let default_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    assert_eq!(
        default_cms.get("one").await.unwrap().data.unwrap()["k"],
        "1"
    );

    // Clusters are independent.
    let dest0: Api<Namespace> =
        Api::all(env.destination(0).unwrap().client("admin").await.unwrap());
    assert!(dest0.get_opt("shardwise").await.unwrap().is_none());
    env.destination(0)
        .unwrap()
        .apply_yaml(
            "admin",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tenant\n",
        )
        .await
        .unwrap();
    let dest1: Api<Namespace> =
        Api::all(env.destination(1).unwrap().client("admin").await.unwrap());
    assert!(dest1.get_opt("tenant").await.unwrap().is_none());

    // RBAC applies to the harness's applies too.
    match cp
        .apply_yaml(
            "shardwise-0",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        )
        .await
    {
        Err(HarnessError::Kube(kube::Error::Api(s))) => assert_eq!(s.code, 403),
        other => panic!("expected 403, got {other:?}"),
    }
    let bad = cp
        .apply_yaml("admin", "apiVersion: v1\nkind: ConfigMap\n")
        .await
        .unwrap_err();
    assert!(matches!(bad, HarnessError::Yaml { .. }), "{bad}");
    let unknown = cp
        .apply_yaml(
            "admin",
            "apiVersion: nope.example.com/v1\nkind: Thing\nmetadata:\n  name: t\n",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(unknown, HarnessError::Discovery { .. }),
        "{unknown}"
    );

    let added = cp.add_identity(Identity::admin("ops")).unwrap();
    assert!(added.exists());
    let ops: Api<Namespace> = Api::all(cp.client("ops").await.unwrap());
    assert!(ops.list(&ListParams::default()).await.unwrap().items.len() >= 5);

    // A client certificate alone authenticates, as its identity.
    let yaml = cp.kubeconfig_with_client_certificate("ops").unwrap();
    assert!(!yaml.contains("token"), "{yaml}");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let by_cert: Api<Namespace> = Api::all(kube::Client::try_from(config).unwrap());
    assert!(
        by_cert
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            >= 5
    );
    assert!(matches!(
        cp.kubeconfig_with_client_certificate("nobody"),
        Err(HarnessError::UnknownIdentity { .. })
    ));
}

#[tokio::test]
async fn processes_get_env_args_and_signals() {
    let env = Environment::builder().start().unwrap();
    let script = r#"trap 'echo got-term; exit 0' TERM; echo "pod=$POD_NAME args=$*"; echo oops >&2; while :; do sleep 0.05; done"#;
    let spec = ProcessSpec::new("shardwise-2", "/bin/sh")
        .args(["-c", script, "sh", "a", "b"])
        .env("POD_NAME", "shardwise-2");
    let mut p = env.spawn(&spec).unwrap();
    assert!(p.pid() > 0);
    wait_for("the process to print its environment", WAIT, || {
        let out = p.stdout();
        async move {
            if out.contains("pod=shardwise-2 args=a b") {
                Ok(())
            } else {
                Err(format!("stdout: {out:?}"))
            }
        }
    })
    .await
    .unwrap();
    assert!(p.is_running());
    assert!(p.stderr().contains("oops"));
    assert!(p.stdout_path().starts_with(env.dir()));
    p.terminate().unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "{status}");
    assert!(p.stdout().contains("got-term"));
    assert!(p.report().contains("exited"), "{}", p.report());

    // Restarting under the same name appends to the same logs.
    let mut again = env.spawn(&spec).unwrap();
    again.kill().unwrap();
    let killed = again.wait(WAIT).await.unwrap();
    assert_eq!(killed.signal(), Some(9));
    assert_eq!(
        again
            .stdout()
            .lines()
            .filter(|l| l.starts_with("==== "))
            .count(),
        2
    );

    let stubborn = ProcessSpec::new("stubborn", "/bin/sh")
        .args(["-c", "trap '' TERM; while :; do sleep 0.05; done"]);
    let mut s = env.spawn(&stubborn).unwrap();
    let still = s.wait(Duration::from_millis(100)).await.unwrap_err();
    assert!(still.to_string().contains("did not exit"), "{still}");
    let stopped = s.stop(Duration::from_millis(300)).await.unwrap();
    assert_eq!(stopped.signal(), Some(9), "SIGKILL after the grace period");

    let missing = env
        .spawn(&ProcessSpec::new("missing", "/definitely/not/here"))
        .unwrap_err();
    assert!(missing.to_string().contains("cannot start"), "{missing}");
}

async fn serve_once(listener: tokio::net::TcpListener, status: &'static str, body: &'static str) {
    let (mut socket, _) = listener.accept().await.expect("a scrape arrives");
    let mut buf = [0u8; 1024];
    let _ = socket.read(&mut buf).await.expect("the request reads");
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket
        .write_all(response.as_bytes())
        .await
        .expect("the response writes");
}

#[tokio::test]
async fn metrics_are_scraped_and_parsed() {
    let body = "# TYPE shardwise_shards_owned gauge\nshardwise_shards_owned{replica=\"shardwise-1\"} 4\nshardwise_shards_owned{replica=\"shardwise-2\"} 5\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let server = tokio::spawn(serve_once(listener, "200 OK", body));
    let metrics = scrape(&url).await.unwrap();
    server.await.unwrap();
    assert_eq!(
        metrics.get("shardwise_shards_owned", &[("replica", "shardwise-2")]),
        Some(5.0)
    );
    assert_eq!(metrics.sum("shardwise_shards_owned", &[]), 9.0);
    assert_eq!(metrics, Metrics::parse(body).unwrap());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let server = tokio::spawn(serve_once(listener, "404 Not Found", "nope"));
    assert!(matches!(
        scrape(&url).await,
        Err(MetricsError::Status { status: 404, .. })
    ));
    server.await.unwrap();

    let closed = format!(
        "http://127.0.0.1:{}/metrics",
        shardwise_e2e::free_port().unwrap()
    );
    assert!(matches!(
        scrape(&closed).await,
        Err(MetricsError::Scrape { .. })
    ));
    assert!(matches!(
        scrape("not a url").await,
        Err(MetricsError::Url { .. })
    ));
}

#[tokio::test]
async fn waits_say_what_was_expected_and_seen() {
    let err = wait_for("three replicas", Duration::from_millis(200), || async {
        Err::<(), _>("2 replicas".to_string())
    })
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("timed out after 200ms waiting for three replicas; last seen: 2 replicas"),
        "{text}"
    );
    assert!(err.attempts >= 2);

    // A check that hangs (here: on a paused link) still ends at the deadline.
    let env = Environment::builder()
        .identity(Identity::admin("operator"))
        .start()
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(
        env.control_plane().client("operator").await.unwrap(),
        "default",
    );
    env.control_plane().faults().pause();
    let started = std::time::Instant::now();
    let hung = wait_for(
        "a list on a paused link",
        Duration::from_millis(300),
        || async {
            cms.list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(hung.last_seen.contains("did not finish"), "{hung}");
    env.control_plane().faults().resume();
    cms.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_wait_cut_short_reports_what_the_check_said_before() {
    // The first check answers at once; the next ones outlast the deadline.
    let calls = std::sync::atomic::AtomicU32::new(0);
    let err = wait_with(
        "apps synced",
        Poll {
            timeout: Duration::from_millis(300),
            interval: Duration::from_millis(10),
        },
        || {
            let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if call > 0 {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err::<(), _>("3 of 20 apps not synced".to_string())
            }
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.last_seen,
        "3 of 20 apps not synced (the last check did not finish before the deadline)"
    );
}

#[tokio::test]
async fn faults_and_external_processes() {
    let env = Environment::builder()
        .identity(Identity::admin("operator"))
        .start()
        .unwrap();
    let cp = env.control_plane();
    let cms: Api<ConfigMap> = Api::namespaced(cp.client("operator").await.unwrap(), "default");
    cp.faults().partition(FaultScope::identity("operator"));
    assert!(cms.list(&ListParams::default()).await.is_err());
    cp.faults().clear_all();
    cms.list(&ListParams::default()).await.unwrap();

    // A separate process reaches the cluster with a kubeconfig file.
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();
    let spec = ProcessSpec::new("kubectl", kubectl)
        .args(["get", "namespaces", "-o", "name", "--cache-dir"])
        .arg(env.dir().join("kubectl-cache"))
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", env.dir());
    let mut p = env.spawn(&spec).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "{}", p.report());
    assert!(p.stdout().contains("namespace/default"), "{}", p.report());
}

#[test]
fn free_ports_are_distinct_and_out_of_reach_of_outgoing_connections() {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let ephemeral: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
    // An outgoing connection takes its local port from the ephemeral range.
    let outgoing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(outgoing.local_addr().unwrap()).unwrap();
    assert!(client.local_addr().unwrap().port() >= ephemeral);

    let ports: Vec<u16> = (0..200)
        .map(|_| shardwise_e2e::free_port().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    for &port in &ports {
        assert!(port < ephemeral, "{port} is in the ephemeral range");
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}

#[test]
fn workspace_binaries_are_built_once_and_a_failed_build_says_why() {
    let controller =
        shardwise_e2e::workspace_binary("shardwise-controller", "shardwise-controller").unwrap();
    assert!(controller.is_file(), "{}", controller.display());
    assert!(
        controller.ends_with("shardwise-controller"),
        "{}",
        controller.display()
    );
    // This test's own profile.
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    assert!(
        controller.parent().unwrap().ends_with(profile),
        "{}",
        controller.display()
    );
    assert_eq!(
        shardwise_e2e::workspace_binary("shardwise-controller", "shardwise-controller"),
        Ok(controller)
    );
    // The same build from a shell (without what Cargo set for this test) finds everything
    // fresh: the harness's build did not rebuild the workspace for its own environment.
    let mut shell_build = std::process::Command::new(std::env::var_os("CARGO").unwrap());
    shell_build
        .args([
            "build",
            "--locked",
            "--message-format=json",
            "-p",
            "shardwise-controller",
            "--bin",
            "shardwise-controller",
        ])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    for (name, _) in std::env::vars() {
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || name == "CARGO_CRATE_NAME"
            || name == "CARGO_TARGET_TMPDIR"
        {
            shell_build.env_remove(name);
        }
    }
    let output = shell_build.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let rebuilt: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["fresh"] == false)
        .map(|m| m["package_id"].to_string())
        .collect();
    assert!(rebuilt.is_empty(), "rebuilt from a shell: {rebuilt:?}");

    match shardwise_e2e::workspace_binary("no-such-package", "no-such-bin") {
        Err(BuildError::Failed {
            command, stderr, ..
        }) => {
            assert!(command.contains("-p no-such-package"), "{command}");
            assert!(stderr.contains("no-such-package"), "{stderr}");
        }
        other => panic!("{other:?}"),
    }
}
