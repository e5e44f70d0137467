//! End-to-end test of cluster credentials in the kubeconfig and Argo CD layouts: a replica pod
//! of the chart reconciles apps through them (a client certificate alone
//! authenticating one), reports a certificate the destination does not trust as Unauthorized,
//! refuses an exec plugin without running it, and never writes a credential to its logs,
//! Events or statuses.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::config::Kubeconfig;
use secrecy::ExposeSecret;
use serde_json::json;
use shardwise_api::{ClusterPhase, FleetApp, FleetCluster, SyncPhase};
use shardwise_e2e::{Identity, wait_for};
use support::{DESTINATION_IDENTITY, Fleet, FleetOptions, NAMESPACE, app_manifests};

const SETTLE: Duration = Duration::from_secs(60);
/// Tokens of identities on the destinations, recognisable in any output.
const KUBECONFIG_TOKEN: &str = "e2e-kubeconfig-token-5ec12e7a";
const ARGOCD_TOKEN: &str = "e2e-argocd-token-5ec12e7b";
/// Credentials of refused Secrets, which must not show either.
const EXEC_SECRET: &str = "e2e-exec-env-5ec12e7c";
const MISBOUND_TOKEN: &str = "e2e-misbound-token-5ec12e7d";

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A labelled Secret in the fleet's namespace.
fn secret(name: &str, label: &str, data: serde_json::Value) -> String {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {label: "cluster"}},
        "stringData": data,
    })
    .to_string()
}

async fn create_cluster_and_app(fleet: &Fleet, name: &str, server: &str, index: u32) {
    let cluster: FleetCluster = serde_json::from_value(json!({
        "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetCluster",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"server": server, "credentials": {"secretRef": {"name": name}}},
    }))
    .unwrap();
    fleet
        .clusters_api()
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let app: FleetApp = serde_json::from_value(json!({
        "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
        "metadata": {"name": format!("app-{index}"), "namespace": NAMESPACE},
        "spec": {
            "destination": {"cluster": name, "namespace": "team-0"},
            "source": {"manifests": app_manifests(index, 1)},
        },
    }))
    .unwrap();
    fleet
        .apps_api()
        .create(&PostParams::default(), &app)
        .await
        .unwrap();
}

/// A FleetCluster's phase and message, once it has a status.
async fn cluster_status(fleet: &Fleet, name: &str) -> Result<(ClusterPhase, String), String> {
    let cluster = fleet
        .clusters_api()
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let status = cluster.status.unwrap_or_default();
    let phase = status.phase.ok_or(format!("{name} has no phase yet"))?;
    Ok((phase, status.message.unwrap_or_default()))
}

/// The client key of a kubeconfig's only user, PEM.
fn client_key(yaml: &str) -> String {
    let kubeconfig = Kubeconfig::from_yaml(yaml).unwrap();
    let auth = kubeconfig.auth_infos[0].auth_info.clone().unwrap();
    assert!(auth.token.is_none(), "the certificate alone authenticates");
    let data = auth.client_key_data.unwrap();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.expose_secret())
        .unwrap();
    String::from_utf8(pem).unwrap()
}

/// A kubeconfig for destination 0 holding a client certificate its CA never signed: one that
/// destination 1 issued to its admin.
fn kubeconfig_with_foreign_certificate(fleet: &Fleet) -> (String, String) {
    let destinations = fleet.env.destinations();
    let yaml = destinations[1]
        .kubeconfig_with_client_certificate(DESTINATION_IDENTITY)
        .unwrap();
    let key_pem = client_key(&yaml);
    let mut kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
    let ca0 = destinations[0].ca_pem();
    for named in &mut kubeconfig.clusters {
        let cluster = named.cluster.get_or_insert_default();
        cluster.server = Some(destinations[0].url_for("kubeconfig-user").unwrap());
        cluster.certificate_authority_data = Some(b64(&ca0));
    }
    // JSON is YAML, and kube's serializer writes the credentials out.
    (serde_json::to_string(&kubeconfig).unwrap(), key_pem)
}

/// One replica, two destinations: a kubeconfig with only a client certificate (the test API
/// server authenticates it as kube-apiserver does: user = CommonName, groups = Organizations)
/// and an Argo CD cluster Secret with a bearer token carry apps to their destination; a
/// kubeconfig with a certificate of the other destination's CA leaves its cluster Unauthorized;
/// a kubeconfig with an exec plugin and an Argo CD Secret bound to another server leave their
/// clusters Invalid, saying why, without the plugin ever running; no credential shows in the
/// controller's logs (at debug level), in Events, or in any status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_and_argo_cd_secrets_reconcile_and_no_credential_leaks() {
    let fleet = Fleet::start(FleetOptions {
        replicas: 1,
        clusters: 0,
        apps: 0,
        destinations: 2,
        args: vec!["--log=debug".to_string()],
        // Only for the emptyDir it mounts, where an exec plugin could write.
        audit: true,
        destination_identities: vec![
            Identity::admin("kubeconfig-user").with_token(KUBECONFIG_TOKEN),
            Identity::admin("argocd-user").with_token(ARGOCD_TOKEN),
        ],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let destinations = fleet.env.destinations();
    // Where each credential's identity reaches its destination (on a real server, its link).
    let url0 = destinations[0].url_for("kubeconfig-user").unwrap();
    let url1 = destinations[1].url_for("argocd-user").unwrap();
    let kubeconfig = destinations[0]
        .kubeconfig_with_client_certificate("kubeconfig-user")
        .unwrap();
    assert!(!kubeconfig.contains(KUBECONFIG_TOKEN));
    let key_pem = client_key(&kubeconfig);
    let (foreign, foreign_key_pem) = kubeconfig_with_foreign_certificate(&fleet);
    let ca1 = destinations[1].ca_pem();
    // Where the plugin would leave its mark: the one place the replica's container may write
    // (the emptyDir of its audit file; its root filesystem is read-only), seen from the node.
    let exec_mark = std::path::Path::new(support::pods::AUDIT_FILE).with_file_name("exec-ran");
    let pod = fleet.replicas[&0].pod().unwrap();
    let exec_ran = pod.dir.join("volumes/audit/exec-ran");
    let exec = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": url0}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/bin/sh",
            "args": ["-c", format!("touch {}", exec_mark.display())],
            "env": [{"name": "SECRET", "value": EXEC_SECRET}],
        }}}],
    });
    let argocd_config = |token: &str| {
        json!({"bearerToken": token, "tlsClientConfig": {"insecure": false, "caData": b64(&ca1)}})
            .to_string()
    };
    let cp = fleet.env.control_plane();
    for yaml in [
        secret(
            "kube-cert",
            "shardwise.io/secret-type",
            json!({"kubeconfig": kubeconfig}),
        ),
        secret(
            "foreign-cert",
            "shardwise.io/secret-type",
            json!({"kubeconfig": foreign}),
        ),
        secret(
            "argo-token",
            "argocd.argoproj.io/secret-type",
            json!({"name": "prod", "server": url1, "config": argocd_config(ARGOCD_TOKEN)}),
        ),
        secret(
            "exec",
            "shardwise.io/secret-type",
            json!({"value": exec.to_string()}),
        ),
        secret(
            "misbound",
            "argocd.argoproj.io/secret-type",
            json!({"name": "other", "server": url0, "config": argocd_config(MISBOUND_TOKEN)}),
        ),
    ] {
        cp.apply_yaml("admin", &yaml).await.unwrap();
    }
    create_cluster_and_app(&fleet, "kube-cert", &url0, 0).await;
    create_cluster_and_app(&fleet, "argo-token", &url1, 1).await;
    create_cluster_and_app(&fleet, "exec", &url0, 2).await;
    create_cluster_and_app(&fleet, "misbound", &url1, 3).await;
    create_cluster_and_app(&fleet, "foreign-cert", &url0, 4).await;

    let misbound = format!("holds credentials for \"{url0}\", not for spec.server \"{url1}\"");
    let expected = [
        ("kube-cert", ClusterPhase::Connected, ""),
        ("argo-token", ClusterPhase::Connected, ""),
        (
            "exec",
            ClusterPhase::Invalid,
            "exec credential plugins are not supported: key \"value\" of Secret \"exec\" sets users[\"u\"].exec",
        ),
        ("misbound", ClusterPhase::Invalid, misbound.as_str()),
        (
            "foreign-cert",
            ClusterPhase::Unauthorized,
            "credentials rejected (401)",
        ),
    ];
    let settled = wait_for(
        "two clusters Connected and their apps Synced, two Invalid, one Unauthorized",
        SETTLE,
        || async {
            for (name, phase, message) in expected {
                let (got, text) = cluster_status(&fleet, name).await?;
                if got != phase || !text.contains(message) {
                    return Err(format!("{name}: {got:?} {text:?}"));
                }
            }
            for app in ["app-0", "app-1"] {
                let status = fleet
                    .apps_api()
                    .get(app)
                    .await
                    .map_err(|e| e.to_string())?
                    .status
                    .unwrap_or_default();
                if status.sync_phase != Some(SyncPhase::Synced) {
                    return Err(format!(
                        "{app}: {:?} {:?}",
                        status.sync_phase, status.message
                    ));
                }
            }
            Ok(())
        },
    )
    .await;
    if let Err(e) = settled {
        panic!("{e}\n{}", fleet.report());
    }
    for (index, destination) in fleet.env.destinations().iter().enumerate() {
        let client = destination.client("admin").await.unwrap();
        let cm = Api::<ConfigMap>::namespaced(client, "team-0")
            .get_opt(&format!("app-{index}"))
            .await
            .unwrap();
        assert!(
            cm.is_some(),
            "app-{index} not applied in destination {index}"
        );
    }
    assert!(!exec_ran.exists(), "the exec plugin of a Secret was run");
    let (_, message) = cluster_status(&fleet, "misbound").await.unwrap();
    assert!(
        message.contains(&format!(
            "holds credentials for \"{url0}\", not for spec.server \"{url1}\""
        )),
        "{message}"
    );

    // What the controller wrote anywhere: its logs, Events (the planner's, of either API), and
    // the statuses of clusters and apps.
    let mut written = fleet.replicas[&0].logs();
    assert!(
        written.contains("probed"),
        "the controller's debug logs, probes included, are among what was checked"
    );
    let core: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(fleet.admin.clone(), NAMESPACE);
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fleet.admin.clone(), NAMESPACE);
    let lp = ListParams::default();
    let core = core.list(&lp).await.unwrap().items;
    let events = events.list(&lp).await.unwrap().items;
    written.push_str(&serde_json::to_string(&core).unwrap());
    written.push_str(&serde_json::to_string(&events).unwrap());
    let clusters = fleet.clusters_api().list(&lp).await.unwrap().items;
    let apps = fleet.apps_api().list(&lp).await.unwrap().items;
    for c in &clusters {
        written.push_str(&serde_json::to_string(&c.status).unwrap());
    }
    for a in &apps {
        written.push_str(&serde_json::to_string(&a.status).unwrap());
    }
    assert!(
        written.contains("exec credential plugins are not supported"),
        "the refusal is among what was checked"
    );
    // Parts of the keys past the encoding's fixed prefix, which every P-256 PKCS#8 key shares.
    let key_line = |pem: &str| pem.lines().nth(2).unwrap()[..24].to_string();
    let key_data = |pem: &str| b64(pem)[160..192].to_string();
    for marker in [
        KUBECONFIG_TOKEN.to_string(),
        ARGOCD_TOKEN.to_string(),
        EXEC_SECRET.to_string(),
        MISBOUND_TOKEN.to_string(),
        key_line(&key_pem),
        key_data(&key_pem),
        key_line(&foreign_key_pem),
        key_data(&foreign_key_pem),
    ] {
        assert!(
            !written.contains(&marker),
            "credential {marker} written by the controller:\n{}",
            fleet.report()
        );
    }
}
