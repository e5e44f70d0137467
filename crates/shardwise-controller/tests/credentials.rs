//! Cluster Secrets in each layout (bearer token, kubeconfig, Argo CD's cluster config): what
//! they give, what they are refused for, and that no credential ever shows in an error or a
//! configuration's Debug.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::client::ConfigExt;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use secrecy::ExposeSecret;
use shardwise_api::{ClusterCredentials, FleetClusterSpec, SecretCredentials};
use shardwise_controller::credentials::{ClusterConfigError, destination_config};

const SERVER: &str = "https://10.0.0.1:6443";
const TOKEN: &str = "TOKEN-s3cr3t-f00d";
const PASSWORD: &str = "PASSWORD-hunter2-cafe";

/// A client identity and a CA, with the recognisable parts of the key.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn new() -> Self {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Pieces of the private key that must never show: a line of its PEM body, and the start of
    /// its base64 as kubeconfigs and Argo CD hold it.
    fn key_markers(&self) -> Vec<String> {
        let body = self.key_pem.lines().nth(1).unwrap().to_string();
        vec![body[..24].to_string(), b64(&self.key_pem)[..32].to_string()]
    }
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn spec(server: &str) -> FleetClusterSpec {
    FleetClusterSpec {
        server: server.into(),
        credentials: ClusterCredentials {
            secret_ref: Some(SecretCredentials {
                name: "creds".into(),
                token_key: None,
                ca_key: None,
            }),
            ..Default::default()
        },
        shard: None,
        weight: None,
    }
}

/// A Secret labelled `label`=cluster with these entries.
fn labelled(label: &str, entries: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("creds".into()),
            labels: Some(BTreeMap::from([(label.to_string(), "cluster".to_string())])),
            ..Default::default()
        },
        data: Some(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn shardwise_secret(entries: &[(&str, &str)]) -> Secret {
    labelled("shardwise.io/secret-type", entries)
}

fn argocd_secret(server: &str, config: &serde_json::Value) -> Secret {
    labelled(
        "argocd.argoproj.io/secret-type",
        &[
            ("name", "prod"),
            ("server", server),
            ("config", &config.to_string()),
        ],
    )
}

/// A kubeconfig whose current context is cluster `server` and a user with `user` (YAML lines,
/// indented for the user mapping).
fn kubeconfig(server: &str, cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\nclusters:\n- name: c\n  cluster:\n    server: {server}\n{cluster_extra}contexts:\n- name: ctx\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user:\n{user}"
    )
}

fn cert_user(pki: &Pki) -> String {
    format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&pki.cert_pem),
        b64(&pki.key_pem)
    )
}

fn config_of(spec: &FleetClusterSpec, secret: &Secret) -> Result<kube::Config, ClusterConfigError> {
    destination_config(spec, Some(secret), Duration::from_secs(5))
}

fn error_of(spec: &FleetClusterSpec, secret: &Secret) -> String {
    match config_of(spec, secret) {
        Ok(config) => panic!(
            "expected a refusal, got a config for {}",
            config.cluster_url
        ),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_kubeconfig_with_a_client_certificate_gives_a_client_for_its_server() {
    let pki = Pki::new();
    let ca = format!("    certificate-authority-data: {}\n", b64(&pki.ca_pem));
    let secret = shardwise_secret(&[("kubeconfig", &kubeconfig(SERVER, &ca, &cert_user(&pki)))]);
    let config = config_of(&spec(SERVER), &secret).unwrap();
    assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
    assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
    assert!(config.auth_info.token.is_none());
    assert!(!config.accept_invalid_certs);
    assert_eq!(config.read_timeout, Some(Duration::from_secs(5)));
    // kube's TLS setup takes the certificate and key: the client can present them.
    config.rustls_client_config().unwrap();
}

#[test]
fn cluster_api_kubeconfigs_bind_by_their_own_server_and_the_server_key_must_agree() {
    let user = format!("    token: {TOKEN}\n");
    let capi = shardwise_secret(&[("value", &kubeconfig(SERVER, "", &user))]);
    let config = config_of(&spec(SERVER), &capi).unwrap();
    assert_eq!(
        config.auth_info.token.as_ref().unwrap().expose_secret(),
        TOKEN
    );
    assert_eq!(
        error_of(&spec("https://attacker:6443"), &capi),
        "Secret \"creds\" holds credentials for \"https://10.0.0.1:6443\", not for spec.server \"https://attacker:6443\""
    );
    let agreeing = shardwise_secret(&[
        ("server", "https://10.0.0.1:6443/"),
        ("kubeconfig", &kubeconfig(SERVER, "", &user)),
    ]);
    assert!(config_of(&spec(SERVER), &agreeing).is_ok());
    let disagreeing = shardwise_secret(&[
        ("server", "https://10.0.0.2:6443"),
        ("kubeconfig", &kubeconfig(SERVER, "", &user)),
    ]);
    assert!(
        error_of(&spec(SERVER), &disagreeing)
            .contains("holds credentials for \"https://10.0.0.2:6443\"")
    );
    let plain = shardwise_secret(&[("kubeconfig", &kubeconfig("http://10.0.0.1:6443", "", &user))]);
    assert!(
        error_of(&spec(SERVER), &plain).contains("holds credentials for \"http://10.0.0.1:6443\"")
    );
}

#[test]
fn kubeconfigs_that_would_run_a_command_or_read_a_file_are_refused_by_name() {
    let pki = Pki::new();
    let token = format!("    token: {TOKEN}\n");
    let exec = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\n";
    let cases: Vec<(String, &str)> = vec![
        (
            kubeconfig(SERVER, "", exec),
            "exec credential plugins are not supported: key \"kubeconfig\" of Secret \"creds\" sets users[\"u\"].exec, and the controller runs no command or login flow a Secret names: give a bearer token or a client certificate instead",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                "    auth-provider:\n      name: oidc\n      config: {id-token: abc}\n",
            ),
            "auth-provider plugins are not supported: key \"kubeconfig\" of Secret \"creds\" sets users[\"u\"].auth-provider",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
            ),
            "key \"kubeconfig\" of Secret \"creds\" names a file (users[\"u\"].tokenFile): the controller reads no file a Secret names; embed its contents (token) instead",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                "    client-certificate: /tmp/c.crt\n    client-key: /tmp/c.key\n",
            ),
            "names a file (users[\"u\"].client-certificate)",
        ),
        (
            kubeconfig(SERVER, "    certificate-authority: /etc/ca.crt\n", &token),
            "names a file (clusters[\"c\"].certificate-authority)",
        ),
        (
            kubeconfig(SERVER, "    proxy-url: http://proxy:3128\n", &token),
            "clusters[\"c\"].proxy-url in key \"kubeconfig\" of Secret \"creds\" is not supported",
        ),
        (
            kubeconfig(SERVER, "", "    username: admin\n"),
            "key \"kubeconfig\" of Secret \"creds\" sets username but not password",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                &format!("    client-certificate-data: {}\n", b64(&pki.cert_pem)),
            ),
            "sets client-certificate-data but not client-key-data",
        ),
        (
            kubeconfig(SERVER, "", "    {}\n"),
            "key \"kubeconfig\" of Secret \"creds\" holds no credentials: the current context's user needs a token, client-certificate-data and client-key-data, or a username and password",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                &format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    b64(&pki.cert_pem),
                    b64(&pki.cert_pem)
                ),
            ),
            "client-key-data in key \"kubeconfig\" of Secret \"creds\" is not valid base64 of a PEM private key",
        ),
        (
            kubeconfig(
                SERVER,
                "",
                &format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    b64(&pki.key_pem),
                    b64(&pki.key_pem)
                ),
            ),
            "client-certificate-data in key \"kubeconfig\" of Secret \"creds\" is not valid base64 of PEM certificates",
        ),
        (
            kubeconfig(
                SERVER,
                &format!("    certificate-authority-data: {}\n", b64("not pem")),
                &token,
            ),
            "certificate-authority-data in key \"kubeconfig\" of Secret \"creds\" is not valid PEM certificates",
        ),
        (
            kubeconfig(SERVER, "", "    token: two words\n"),
            "token in key \"kubeconfig\" of Secret \"creds\" is not valid bearer token",
        ),
        (
            kubeconfig(SERVER, "", &token)
                .replace("current-context: ctx", "current-context: other"),
            "the kubeconfig in key \"kubeconfig\" of Secret \"creds\" cannot be used: failed to load current context: other",
        ),
        (
            "clusters: [unclosed".to_string(),
            "key \"kubeconfig\" of Secret \"creds\" is not valid kubeconfig (YAML)",
        ),
    ];
    for (kubeconfig, expected) in cases {
        let err = error_of(
            &spec(SERVER),
            &shardwise_secret(&[("kubeconfig", &kubeconfig)]),
        );
        assert!(err.contains(expected), "{err}\nexpected: {expected}");
    }
}

#[test]
fn argo_cd_cluster_secrets_are_used_as_argo_cd_writes_them() {
    let pki = Pki::new();
    let token = argocd_secret(
        SERVER,
        &serde_json::json!({
            "bearerToken": TOKEN,
            "tlsClientConfig": {"insecure": false, "caData": b64(&pki.ca_pem), "serverName": "api.internal"},
        }),
    );
    let config = config_of(&spec(SERVER), &token).unwrap();
    assert_eq!(config.auth_info.token.unwrap().expose_secret(), TOKEN);
    assert_eq!(config.root_cert.map(|c| c.len()), Some(1));
    assert_eq!(config.tls_server_name.as_deref(), Some("api.internal"));
    assert!(!config.accept_invalid_certs);

    let certificate = argocd_secret(
        SERVER,
        &serde_json::json!({"tlsClientConfig": {
            "certData": b64(&pki.cert_pem), "keyData": b64(&pki.key_pem), "insecure": true,
        }}),
    );
    let config = config_of(&spec(SERVER), &certificate).unwrap();
    assert!(
        config.accept_invalid_certs,
        "Argo CD's insecure is honoured"
    );
    config.rustls_client_config().unwrap();

    let basic = argocd_secret(
        SERVER,
        &serde_json::json!({"username": "admin", "password": PASSWORD, "tlsClientConfig": {"insecure": false}}),
    );
    let config = config_of(&spec(SERVER), &basic).unwrap();
    assert_eq!(config.auth_info.username.as_deref(), Some("admin"));
    assert_eq!(config.auth_info.password.unwrap().expose_secret(), PASSWORD);

    // The Argo CD label alone marks cluster credentials; the binding still holds.
    assert!(
        error_of(&spec("https://10.0.0.9:6443"), &token)
            .contains("holds credentials for \"https://10.0.0.1:6443\", not for spec.server")
    );
}

#[test]
fn argo_cd_secrets_are_refused_for_what_the_controller_will_not_do() {
    let pki = Pki::new();
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            SERVER,
            serde_json::json!({"execProviderConfig": {"command": "argocd-k8s-auth", "args": ["gcp"], "apiVersion": "client.authentication.k8s.io/v1beta1"}}),
            "exec credential plugins are not supported: key \"config\" of Secret \"creds\" sets execProviderConfig",
        ),
        (
            SERVER,
            serde_json::json!({"awsAuthConfig": {"clusterName": "prod", "roleARN": "arn:aws:iam::1:role/x"}}),
            "exec credential plugins are not supported: key \"config\" of Secret \"creds\" sets awsAuthConfig",
        ),
        (
            "https://kubernetes.default.svc",
            serde_json::json!({"tlsClientConfig": {"insecure": false}}),
            "Secret \"creds\" is Argo CD's entry for the cluster it runs in (https://kubernetes.default.svc) and holds no credentials (Argo CD uses its own service account there): set credentials: {inCluster: true} instead",
        ),
        (
            SERVER,
            serde_json::json!({"bearerToken": "", "tlsClientConfig": {"insecure": false}}),
            "key \"config\" of Secret \"creds\" holds no credentials: its config needs bearerToken, tlsClientConfig.certData and keyData, or username and password",
        ),
        (
            SERVER,
            serde_json::json!({"password": PASSWORD}),
            "key \"config\" of Secret \"creds\" sets password but not username",
        ),
        (
            SERVER,
            serde_json::json!({"tlsClientConfig": {"keyData": b64(&pki.key_pem)}}),
            "sets tlsClientConfig.keyData but not tlsClientConfig.certData",
        ),
        (
            SERVER,
            serde_json::json!({"bearerToken": TOKEN, "tlsClientConfig": {"caData": b64("not pem")}}),
            "tlsClientConfig.caData in key \"config\" of Secret \"creds\" is not valid base64 of PEM certificates",
        ),
        (
            SERVER,
            serde_json::json!({"bearerToken": TOKEN, "tlsClientConfig": {"insecure": "yes"}}),
            "tlsClientConfig.insecure in key \"config\" of Secret \"creds\" is not valid Argo CD cluster config (JSON)",
        ),
        (
            SERVER,
            serde_json::json!({"bearerToken": TOKEN, "proxyUrl": "http://proxy:3128"}),
            "proxyUrl in key \"config\" of Secret \"creds\" is not supported",
        ),
    ];
    for (server, config, expected) in cases {
        let err = error_of(&spec(server), &argocd_secret(server, &config));
        assert!(err.contains(expected), "{err}\nexpected: {expected}");
    }
    let unbound = labelled(
        "argocd.argoproj.io/secret-type",
        &[(
            "config",
            &serde_json::json!({"bearerToken": TOKEN}).to_string(),
        )],
    );
    assert!(error_of(&spec(SERVER), &unbound).contains("names no server (key \"server\")"));
    let not_json = argocd_secret(SERVER, &serde_json::json!("x")).clone();
    let mut not_json = not_json;
    not_json
        .data
        .as_mut()
        .unwrap()
        .insert("config".into(), ByteString(b"{not json".to_vec()));
    assert!(
        error_of(&spec(SERVER), &not_json).contains(
            "key \"config\" of Secret \"creds\" is not valid Argo CD cluster config (JSON)"
        )
    );
}

#[test]
fn a_secret_holds_one_layout_and_token_keys_apply_to_the_token_layout_only() {
    let user = format!("    token: {TOKEN}\n");
    let both = shardwise_secret(&[
        ("server", SERVER),
        ("kubeconfig", &kubeconfig(SERVER, "", &user)),
        ("config", "{}"),
    ]);
    assert_eq!(
        error_of(&spec(SERVER), &both),
        "Secret \"creds\" holds more than one kind of credentials (keys \"kubeconfig\", \"config\"): keep one"
    );
    let mut keyed = spec(SERVER);
    if let Some(reference) = keyed.credentials.secret_ref.as_mut() {
        reference.token_key = Some("my-token".into());
    }
    let kube = shardwise_secret(&[("kubeconfig", &kubeconfig(SERVER, "", &user))]);
    assert_eq!(
        error_of(&keyed, &kube),
        "secretRef.tokenKey and secretRef.caKey apply to a Secret with a bearer token, and Secret \"creds\" holds a kubeconfig: remove them"
    );
    let unlabelled = labelled("app", &[("kubeconfig", &kubeconfig(SERVER, "", &user))]);
    assert!(error_of(&spec(SERVER), &unlabelled).contains("is not cluster credentials"));
}

/// Every layout, valid and refused, with recognisable credentials in it: none of them shows in
/// an error's message or Debug, nor in a configuration's Debug.
#[test]
fn credentials_never_show_in_errors_or_debug_output() {
    let pki = Pki::new();
    let mut markers = vec![TOKEN.to_string(), PASSWORD.to_string()];
    markers.extend(pki.key_markers());
    let token_user = format!("    token: {TOKEN}\n");
    let key = b64(&pki.key_pem);
    let cert = b64(&pki.cert_pem);
    let full_user = format!(
        "    token: {TOKEN}\n    username: admin\n    password: {PASSWORD}\n    client-certificate-data: {cert}\n    client-key-data: {key}\n"
    );
    let argo = |config: serde_json::Value| argocd_secret(SERVER, &config);
    let secrets: Vec<(&str, Secret)> = vec![
        (
            SERVER,
            shardwise_secret(&[("server", SERVER), ("token", TOKEN)]),
        ),
        (
            "https://attacker",
            shardwise_secret(&[("server", SERVER), ("token", TOKEN)]),
        ),
        (
            SERVER,
            shardwise_secret(&[
                ("server", SERVER),
                ("token", &format!("{TOKEN} {PASSWORD}")),
            ]),
        ),
        (
            SERVER,
            shardwise_secret(&[("kubeconfig", &kubeconfig(SERVER, "", &full_user))]),
        ),
        (
            "https://attacker",
            shardwise_secret(&[("kubeconfig", &kubeconfig(SERVER, "", &full_user))]),
        ),
        (
            SERVER,
            labelled(
                "app",
                &[("kubeconfig", &kubeconfig(SERVER, "", &full_user))],
            ),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &kubeconfig(
                    SERVER,
                    "",
                    &format!(
                        "{token_user}    exec:\n      command: get-token\n      args: [--password, {PASSWORD}]\n      env: [{{name: KEY, value: {key}}}]\n"
                    ),
                ),
            )]),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &kubeconfig(
                    SERVER,
                    "",
                    &format!(
                        "    auth-provider:\n      name: oidc\n      config: {{id-token: {TOKEN}, client-secret: {PASSWORD}}}\n"
                    ),
                ),
            )]),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &kubeconfig(
                    SERVER,
                    "",
                    &format!(
                        "    client-certificate-data: {cert}\n    client-key-data: {}\n",
                        &key[1..]
                    ),
                ),
            )]),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &kubeconfig(
                    SERVER,
                    "",
                    &format!(
                        "    client-certificate-data: {cert}\n    client-key-data: {}\n",
                        b64(&pki.key_pem.replace("PRIVATE KEY", "SECRET"))
                    ),
                ),
            )]),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &format!("users: [{{name: u, user: {{token: {TOKEN}, password: [{PASSWORD}"),
            )]),
        ),
        (
            SERVER,
            shardwise_secret(&[(
                "kubeconfig",
                &format!("current-context: ctx\nusers: [{{name: u, user: {{token: {TOKEN}}}}}]\n"),
            )]),
        ),
        (
            SERVER,
            argo(
                serde_json::json!({"bearerToken": TOKEN, "username": "admin", "password": PASSWORD, "tlsClientConfig": {"certData": cert, "keyData": key}}),
            ),
        ),
        (
            "https://attacker",
            argo(serde_json::json!({"bearerToken": TOKEN, "password": PASSWORD})),
        ),
        (
            SERVER,
            argo(serde_json::json!({"bearerToken": format!("{TOKEN} x")})),
        ),
        (SERVER, argo(serde_json::json!({"password": PASSWORD}))),
        (
            SERVER,
            argo(
                serde_json::json!({"bearerToken": TOKEN, "tlsClientConfig": {"insecure": PASSWORD}}),
            ),
        ),
        (
            SERVER,
            argo(serde_json::json!({"bearerToken": [TOKEN, PASSWORD]})),
        ),
        (
            SERVER,
            argo(
                serde_json::json!({"bearerToken": TOKEN, "tlsClientConfig": {"certData": cert, "keyData": format!("{key}!")}}),
            ),
        ),
        (
            SERVER,
            argo(
                serde_json::json!({"execProviderConfig": {"command": "x", "env": {"TOKEN": TOKEN}, "args": [PASSWORD]}}),
            ),
        ),
        (
            SERVER,
            argo(serde_json::json!({"awsAuthConfig": {"clusterName": TOKEN}})),
        ),
    ];
    let (mut accepted, mut refused) = (0, 0);
    for (server, secret) in &secrets {
        let outputs = match config_of(&spec(server), secret) {
            Ok(config) => {
                accepted += 1;
                vec![format!("{config:?}")]
            }
            Err(e) => {
                refused += 1;
                vec![e.to_string(), format!("{e:?}")]
            }
        };
        for output in outputs {
            for marker in &markers {
                assert!(
                    !output.contains(marker.as_str()),
                    "{marker} shows in: {output}"
                );
            }
        }
    }
    // Both kinds of outcome were looked at, for every layout.
    assert_eq!((accepted, refused), (3, secrets.len() - 3));
}

#[test]
fn the_fleet_cluster_author_cannot_weaken_the_tls_of_a_secrets_credentials() {
    let pki = Pki::new();
    let secret = shardwise_secret(&[
        ("server", SERVER),
        ("token", TOKEN),
        ("ca.crt", &pki.ca_pem),
    ]);
    let mut insecure = spec(SERVER);
    insecure.credentials.insecure_skip_tls_verify = Some(true);
    assert_eq!(
        error_of(&insecure, &secret),
        "spec.credentials.insecureSkipTLSVerify cannot turn off certificate checks for the credentials of Secret \"creds\": only the Secret can (insecure-skip-tls-verify in its kubeconfig, insecure in Argo CD's config)"
    );
    // Nor drop the admin's CA by naming a key the Secret does not have.
    let mut other_ca = spec(SERVER);
    if let Some(reference) = other_ca.credentials.secret_ref.as_mut() {
        reference.ca_key = Some("no-such-key".into());
    }
    assert!(
        error_of(&other_ca, &secret).contains("has no key \"no-such-key\""),
        "{}",
        error_of(&other_ca, &secret)
    );
    // The default CA key may be absent: the system roots check the server then.
    let without_ca = shardwise_secret(&[("server", SERVER), ("token", TOKEN)]);
    let config = config_of(&spec(SERVER), &without_ca).unwrap();
    assert!(config.root_cert.is_none() && !config.accept_invalid_certs);
    // The Secret itself may ask for it.
    let argo = argocd_secret(
        SERVER,
        &serde_json::json!({"bearerToken": TOKEN, "tlsClientConfig": {"insecure": true}}),
    );
    assert!(
        config_of(&spec(SERVER), &argo)
            .unwrap()
            .accept_invalid_certs
    );
}

#[test]
fn a_broken_argo_cd_config_is_reported_by_its_known_fields_only() {
    let broken = |json: &str| {
        let mut secret = argocd_secret(SERVER, &serde_json::json!({}));
        secret
            .data
            .as_mut()
            .unwrap()
            .insert("config".into(), ByteString(json.as_bytes().to_vec()));
        error_of(&spec(SERVER), &secret)
    };
    // A key of the Secret's own under a known field is not shown, however the JSON breaks.
    let err = broken(&format!("{{\"tlsClientConfig\": {{\"{TOKEN}\": [}}}}"));
    assert!(!err.contains(TOKEN), "{err}");
    assert!(
        err.starts_with("tlsClientConfig in key \"config\""),
        "{err}"
    );
    let err = broken(&format!(
        "{{\"execProviderConfig\": {{\"env\": {{\"{PASSWORD}\": }}}}}}"
    ));
    assert!(!err.contains(PASSWORD), "{err}");
    assert!(err.starts_with("execProviderConfig in key"), "{err}");
    let err = broken(&format!("{{\"{TOKEN}\": [1,"));
    assert!(!err.contains(TOKEN), "{err}");
    assert!(
        err.starts_with("key \"config\" of Secret \"creds\" is not valid"),
        "{err}"
    );
}
