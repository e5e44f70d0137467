//! Client-certificate authentication, as kube-apiserver's x509 authenticator does it: user =
//! CommonName, groups = Organization values, RBAC applied; an untrusted certificate is a 401
//! unless a bearer token authenticates, and a trusted one wins over any token.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;
use shardwise_test_apiserver::{ApiServer, ClientCertificate};

use crate::common::*;

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A client of `identity`'s kubeconfig with its token replaced by `token` (or none) and
/// `cert` added.
async fn client_with(
    server: &ApiServer,
    identity: &str,
    cert: Option<&ClientCertificate>,
    token: Option<&str>,
) -> Client {
    let yaml = server.kubeconfig_for(identity).expect("identity exists");
    let mut kubeconfig = Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    for named in &mut kubeconfig.auth_infos {
        let auth = named.auth_info.get_or_insert_default();
        auth.token = token.map(|t| t.to_string().into());
        auth.client_certificate_data = cert.map(|c| b64(&c.cert_pem));
        auth.client_key_data = cert.map(|c| b64(&c.key_pem).into());
    }
    client_of(kubeconfig).await
}

/// A certificate the server's CA never signed, claiming to be a cluster admin.
fn untrusted() -> ClientCertificate {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "admin");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    let cert = params.self_signed(&key).expect("self-signed certificate");
    ClientCertificate {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_user_and_groups_go_through_rbac() {
    let server = start_with(with_robot().rbac(true)).await;
    let admin = admin(&server).await;
    let yaml = server
        .kubeconfig_with_client_certificate("robot")
        .expect("robot's certificate");
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    let user = &kubeconfig["users"][0]["user"];
    assert!(user.get("token").is_none(), "{user}");
    assert!(user["client-certificate-data"].is_string());
    let robot = client_of(Kubeconfig::from_yaml(&yaml).unwrap()).await;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "team"}})),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(robot, "team");

    let denied = status(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(denied.code, 403);
    assert!(
        denied
            .message
            .contains("User \"system:serviceaccount:team:robot\" cannot list"),
        "{}",
        denied.message
    );

    // Granted to a group the certificate carries as an Organization, not to the user.
    Api::<Role>::namespaced(admin.clone(), "team")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "cms"}, "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "create"]}]})),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin, "team")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "cms"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cms"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                    "name": "system:serviceaccounts:team"}]})),
        )
        .await
        .unwrap();
    assert!(
        cms.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    cms.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": "c"}})),
    )
    .await
    .unwrap();
    let last = server.writes().records().pop().expect("a write");
    assert_eq!((last.identity.as_str(), last.code), ("robot", 201));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_certificates_are_refused_and_trusted_ones_win_over_tokens() {
    let server = start_with(with_robot().rbac(true)).await;
    let robot_token = server.identity("robot").unwrap().token;
    let bogus = untrusted();

    // Untrusted and alone: 401, even where anonymous requests are allowed.
    let client = client_with(&server, "robot", Some(&bogus), None).await;
    let refused = status(
        Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (401, "Unauthorized")
    );
    assert!(client.apiserver_version().await.is_err());

    // Untrusted with a valid token: the token authenticates (robot may not list namespaces).
    let client = client_with(&server, "robot", Some(&bogus), Some(&robot_token)).await;
    let denied = status(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 403);
    assert!(denied.message.contains("system:serviceaccount:team:robot"));

    // A trusted admin certificate with a wrong token: the certificate authenticates.
    let admin_cert = server.issue_client_certificate("admin").unwrap();
    let client = client_with(&server, "robot", Some(&admin_cert), Some("wrong")).await;
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();

    // No certificate, no token: anonymous, as before.
    let client = client_with(&server, "robot", None, None).await;
    assert!(client.apiserver_version().await.is_ok());
    let refused = status(
        Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_authenticates_with_a_client_certificate() {
    let server = start_with(with_robot().rbac(true)).await;
    let dir = tempfile::tempdir().unwrap();
    let kubectl = |identity: &str, args: &[&str]| {
        let path = dir.path().join(format!("{identity}.kubeconfig"));
        std::fs::write(
            &path,
            server.kubeconfig_with_client_certificate(identity).unwrap(),
        )
        .unwrap();
        let binary = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
        let out = std::process::Command::new(&binary)
            .args(args)
            .env("KUBECONFIG", &path)
            .env("HOME", dir.path())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run {binary} (install kubectl or set KUBECTL): {e}")
            });
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = kubectl("admin", &["get", "namespace", "kube-system", "-o", "name"]);
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(stdout.trim(), "namespace/kube-system");
    let (ok, stdout, stderr) = kubectl("robot", &["get", "configmaps", "-n", "team"]);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("User \"system:serviceaccount:team:robot\" cannot list"),
        "{stderr}"
    );
}
