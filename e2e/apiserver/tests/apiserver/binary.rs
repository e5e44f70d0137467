//! The `shardwise-test-apiserver` binary: picks a port, prints it, writes a kubeconfig.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::status;

async fn client(kubeconfig: &Kubeconfig, context: &str) -> kube::Client {
    let options = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .expect("kubeconfig is usable");
    kube::Client::try_from(config).expect("client builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_and_writes_a_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_shardwise-test-apiserver"))
        .args(["--port", "0", "--rbac", "--kubeconfig"])
        .arg(&path)
        .args([
            "--identity",
            "shardwise-0=system:serviceaccount:shardwise:shardwise",
        ])
        .args(["--token", "shardwise-0=fixed-token"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let port: u16 = first
        .rsplit_once("(port ")
        .and_then(|(_, p)| p.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no port in {first:?}"));
    assert!(port > 0);
    assert!(
        first.contains(&format!("https://127.0.0.1:{port}")),
        "{first}"
    );

    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    assert_eq!(kubeconfig.current_context.as_deref(), Some("admin"));
    let contexts: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(contexts, ["admin", "shardwise-0"]);
    let token = kubeconfig.auth_infos[1]
        .auth_info
        .as_ref()
        .unwrap()
        .token
        .as_ref()
        .unwrap();
    assert_eq!(secrecy::ExposeSecret::expose_secret(token), "fixed-token");

    let admin: Api<Namespace> = Api::all(client(&kubeconfig, "admin").await);
    assert_eq!(
        admin
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        4
    );
    let replica: Api<ConfigMap> =
        Api::namespaced(client(&kubeconfig, "shardwise-0").await, "default");
    assert_eq!(
        status(replica.list(&ListParams::default()).await.unwrap_err()).code,
        403
    );
    child.kill().await.unwrap();
}
