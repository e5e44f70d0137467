//! The real control plane as the harness runs it: separate clusters on one etcd, real
//! authentication (static tokens, client certificates, ServiceAccount tokens from TokenRequest),
//! RBAC, the audit log as the write log, restarts of kube-apiserver and etcd, and nothing left
//! running or on disk afterwards. Needs the binaries of scripts/control-plane.sh.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use shardwise_e2e::{Environment, Identity, wait_for};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default"},
        "data": {"k": "v"},
    }))
    .unwrap()
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_control_plane_authenticates_authorizes_logs_writes_and_cleans_up() {
    let env = Environment::builder()
        .destinations(1)
        .identity(Identity::service_account(
            "replica-0",
            "shardwise",
            "shardwise",
        ))
        .identity(Identity::service_account(
            "replica-1",
            "shardwise",
            "shardwise",
        ))
        .identity(Identity::new("viewer", "jane"))
        .start()
        .expect("the real control plane starts");
    let cp = env.control_plane();
    let admin = cp.client("admin").await.unwrap();
    let version = admin.apiserver_version().await.unwrap();
    assert!(
        version.git_version.starts_with("v1."),
        "kube-apiserver reports {}",
        version.git_version
    );

    // Each cluster is its own: what one stores the other does not see.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    cms.create(&PostParams::default(), &config_map("only-on-control-plane"))
        .await
        .unwrap();
    let dest = env.destination(0).unwrap().client("admin").await.unwrap();
    let dest_cms: Api<ConfigMap> = Api::namespaced(dest, "default");
    assert!(
        dest_cms
            .get_opt("only-on-control-plane")
            .await
            .unwrap()
            .is_none()
    );

    // RBAC is enforced: the viewer may not read ConfigMaps until a binding says so. (Roles of
    // its own: `view` and `edit` are aggregated by kube-controller-manager, which is not run.)
    cp.apply_yaml(
        "admin",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: configmaps\nrules:\n  - apiGroups: [\"\"]\n    resources: [configmaps]\n    verbs: [get, list, create]\n",
    )
    .await
    .unwrap();
    let viewer: Api<ConfigMap> = Api::namespaced(cp.client("viewer").await.unwrap(), "default");
    match viewer.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("an unbound user listed ConfigMaps: {other:?}"),
    }
    cp.apply_yaml(
        "admin",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: jane-views\n  namespace: default\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: configmaps\nsubjects:\n  - kind: User\n    name: jane\n    apiGroup: rbac.authorization.k8s.io\n",
    )
    .await
    .unwrap();
    wait_for(
        "the binding to take effect",
        Duration::from_secs(10),
        || async {
            viewer
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap();

    // A client certificate from the client CA authenticates as the identity's user.
    let by_certificate = cp.kubeconfig_with_client_certificate("viewer").unwrap();
    assert!(by_certificate.contains("client-certificate-data"));
    assert!(!by_certificate.contains("token:"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&by_certificate).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let cert_client: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    assert!(cert_client.get("only-on-control-plane").await.is_ok());

    // A ServiceAccount added at run time gets a token from TokenRequest, and TokenReview
    // authenticates it as the ServiceAccount.
    cp.add_identity(Identity::service_account(
        "scraper",
        "monitoring",
        "prometheus",
    ))
    .unwrap();
    let token = cp.token("scraper").unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT, not a static token");
    let review: TokenReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token},
    }))
    .unwrap();
    let reviewed = Api::<TokenReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    assert_eq!(
        reviewed.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:monitoring:prometheus")
    );

    // The audit log is the write log: each write names the identity that sent it, even when
    // two identities share one ServiceAccount user.
    cp.apply_yaml(
        "admin",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: shardwise-edits\n  namespace: default\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: configmaps\nsubjects:\n  - kind: ServiceAccount\n    name: shardwise\n    namespace: shardwise\n",
    )
    .await
    .unwrap();
    for replica in ["replica-0", "replica-1"] {
        let api: Api<ConfigMap> = Api::namespaced(cp.client(replica).await.unwrap(), "default");
        wait_for(
            "the edit binding to take effect",
            Duration::from_secs(10),
            || async {
                api.create(
                    &PostParams::default(),
                    &config_map(&format!("from-{replica}")),
                )
                .await
                .map_err(|e| e.to_string())
            },
        )
        .await
        .unwrap();
    }
    let writes = cp.writes();
    for replica in ["replica-0", "replica-1"] {
        let path = "/api/v1/namespaces/default/configmaps";
        assert!(
            writes.iter().any(|w| w.identity == replica
                && w.method == "POST"
                && w.path == path
                && w.code == 201),
            "no POST by {replica} in {writes:#?}"
        );
    }

    // A partition cuts one identity off (the others carry on) until it heals; a latency slows
    // its requests.
    let replica: Api<ConfigMap> = Api::namespaced(cp.client("replica-0").await.unwrap(), "default");
    let other: Api<ConfigMap> = Api::namespaced(cp.client("replica-1").await.unwrap(), "default");
    cp.partition("replica-0").unwrap();
    assert!(
        replica.get("from-replica-0").await.is_err(),
        "a partitioned identity got through"
    );
    assert!(other.get("from-replica-0").await.is_ok());
    cp.heal("replica-0").unwrap();
    wait_for("the partition to heal", Duration::from_secs(10), || async {
        replica
            .get("from-replica-0")
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap();
    cp.set_latency("replica-0", Duration::from_millis(300))
        .unwrap();
    let slow = std::time::Instant::now();
    replica.get("from-replica-0").await.unwrap();
    assert!(
        slow.elapsed() >= Duration::from_millis(300),
        "{:?}",
        slow.elapsed()
    );
    cp.set_latency("replica-0", Duration::ZERO).unwrap();

    // kube-apiserver and etcd restarts keep the data.
    let server = cp.server();
    let old_pid = server.pid();
    server.restart().unwrap();
    assert_ne!(server.pid(), old_pid);
    assert!(!pid_alive(old_pid), "the old kube-apiserver still runs");
    env.restart_etcd().unwrap();
    let admin = cp.client("admin").await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin, "default");
    wait_for(
        "data to survive the restarts",
        Duration::from_secs(60),
        || async { cms.get("from-replica-1").await.map_err(|e| e.to_string()) },
    )
    .await
    .unwrap();

    // Dropping the environment stops every process and removes its directory.
    let pids = [server.pid(), env.destination(0).unwrap().server().pid()];
    let dir = env.dir().to_path_buf();
    drop(env);
    for pid in pids {
        assert!(!pid_alive(pid), "kube-apiserver {pid} still runs");
    }
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// `/api/v1/namespaces/default/configmaps?shardSelector=SELECTOR`, percent-encoded.
fn sharded_list_uri(selector: &str) -> String {
    let encoded: String = selector
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("/api/v1/namespaces/default/configmaps?shardSelector={encoded}")
}

/// The names of the ConfigMaps a list with `selector` gives, and the hash of each one's UID.
async fn sharded_list(client: &kube::Client, selector: &str) -> Vec<(String, u64)> {
    let request = http::Request::get(sharded_list_uri(selector))
        .body(Vec::new())
        .unwrap();
    let list: kube::core::ObjectList<ConfigMap> = client.request(request).await.unwrap();
    keyed(&list.items)
}

/// Each ConfigMap's name and the hash of its UID.
fn keyed(items: &[ConfigMap]) -> Vec<(String, u64)> {
    items
        .iter()
        .map(|cm| {
            let uid = cm.metadata.uid.clone().unwrap();
            (
                cm.metadata.name.clone().unwrap(),
                shard_assign::app_key(&uid),
            )
        })
        .collect()
}

/// KEP-5866 on this kube-apiserver: with the `ShardedListAndWatch` gate on, a list keeps only
/// the objects whose FNV-1a-64 hash of `metadata.uid` is in the range asked for, the very key
/// slices cut by (`shard_assign::app_key`), so the owner of a slice can have the server select
/// its items; with the gate off (the default) the selector is ignored and everything is listed,
/// which is how an owner can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_selects_by_the_hash_slices_cut_by_only_with_its_gate_on() {
    const LOWER_HALF: &str =
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";
    for gate in [true, false] {
        let mut builder = Environment::builder();
        if gate {
            builder = builder.apiserver_args(["--feature-gates=ShardedListAndWatch=true"]);
        }
        let env = builder.start().expect("the real control plane starts");
        let admin = env.control_plane().client("admin").await.unwrap();
        let api: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
        for i in 0..40 {
            api.create(&PostParams::default(), &config_map(&format!("cm-{i}")))
                .await
                .unwrap();
        }
        let everything = keyed(&api.list(&ListParams::default()).await.unwrap().items);
        assert_eq!(everything.len(), 40);
        let lower: Vec<&(String, u64)> = everything.iter().filter(|(_, k)| *k < 1 << 63).collect();
        // 40 random UIDs: both halves hold some, or the check below would prove nothing.
        assert!(!lower.is_empty() && lower.len() < 40, "{lower:?}");
        let selected = sharded_list(&admin, LOWER_HALF).await;
        if gate {
            let mut want: Vec<&String> = lower.iter().map(|(name, _)| name).collect();
            let mut got: Vec<&String> = selected.iter().map(|(name, _)| name).collect();
            want.sort();
            got.sort();
            assert_eq!(
                got, want,
                "the server's lower half is not the slices' lower half"
            );
        } else {
            assert_eq!(
                selected.len(),
                40,
                "with the gate off the selector is ignored"
            );
        }
    }
}
