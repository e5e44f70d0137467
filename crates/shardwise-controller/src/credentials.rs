//! The client configuration of a destination cluster, from its FleetCluster and Secret.
//!
//! A cluster Secret holds one of three layouts, told apart by its keys: a kubeconfig
//! (`kubeconfig`, or Cluster API's `value`), Argo CD's connection settings (`config`), or a
//! bearer token with an optional CA bundle (the keys `secretRef` names). Whatever the layout,
//! credentials go only over https to the server the Secret names, and nothing a Secret says
//! makes the controller read a file or run a command.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::Config;
use kube::config::{AuthInfo, Kubeconfig};
use rustls_pki_types::pem::{PemObject, SectionKind};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use shardwise_api::keys::{
    ARGOCD_CONFIG_KEY, ARGOCD_SECRET_LABEL, CLUSTER_SECRET_LABEL, CLUSTER_SECRET_SERVER_KEY,
    CLUSTER_SECRET_TYPE, KUBECONFIG_KEYS,
};
use shardwise_api::{FleetClusterSpec, SecretCredentials};
use thiserror::Error;
use tracing::warn;

/// Why a FleetCluster's spec cannot give a client. Messages name objects, keys and fields, never
/// credential contents, nor the text of a parser's error (which may quote them).
#[derive(Debug, Error)]
pub enum ClusterConfigError {
    /// `spec.server` is not an http or https URL with a host.
    #[error("spec.server {0:?} is not a valid http(s) URL")]
    BadServer(String),
    /// `spec.credentials` sets neither or both of `secretRef` and `inCluster`.
    #[error("spec.credentials must set exactly one of secretRef and inCluster")]
    NoCredentials,
    /// The Secret `secretRef` names does not exist.
    #[error("Secret {0:?} not found")]
    SecretMissing(String),
    /// The Secret lacks the label that marks cluster credentials (shardwise's or Argo CD's).
    #[error(
        "Secret {0:?} is not cluster credentials: only a Secret labelled {CLUSTER_SECRET_LABEL}={CLUSTER_SECRET_TYPE} or {ARGOCD_SECRET_LABEL}={CLUSTER_SECRET_TYPE} is used"
    )]
    NotClusterSecret(String),
    /// The Secret names no server, and its layout does not either (a kubeconfig does).
    #[error(
        "Secret {0:?} names no server (key {CLUSTER_SECRET_SERVER_KEY:?}): credentials are only sent to the server their Secret names"
    )]
    ServerUnbound(String),
    /// The Secret's credentials are for another server than `spec.server`.
    #[error("Secret {secret:?} holds credentials for {bound:?}, not for spec.server {server:?}")]
    ServerMismatch {
        /// The Secret's name.
        secret: String,
        /// The server the Secret's credentials are for.
        bound: String,
        /// The FleetCluster's `spec.server`.
        server: String,
    },
    /// `spec.server` is plain http, and a Secret's credentials go over https only.
    #[error("spec.server {0:?} is plain http: credentials are only sent over https")]
    PlainHttp(String),
    /// The Secret lacks a key its credentials need.
    #[error("Secret {secret:?} has no key {key:?}")]
    KeyMissing {
        /// The Secret's name.
        secret: String,
        /// The missing key.
        key: String,
    },
    /// A key of the Secret does not hold what its layout needs.
    #[error("key {key:?} of Secret {secret:?} is not valid {what}")]
    BadKey {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// What the key should hold.
        what: &'static str,
    },
    /// A field inside a key of the Secret (in a kubeconfig or Argo CD's config) is not valid.
    #[error("{field} in key {key:?} of Secret {secret:?} is not valid {what}")]
    BadField {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// The field, as a path within the key.
        field: String,
        /// What the field should hold.
        what: &'static str,
    },
    /// The Secret has the keys of more than one layout.
    #[error("Secret {secret:?} holds more than one kind of credentials (keys {keys}): keep one")]
    Ambiguous {
        /// The Secret's name.
        secret: String,
        /// The keys found, quoted and separated by commas.
        keys: String,
    },
    /// `secretRef.tokenKey` or `secretRef.caKey` is set for a Secret in another layout than the
    /// bearer token.
    #[error(
        "secretRef.tokenKey and secretRef.caKey apply to a Secret with a bearer token, and Secret {secret:?} holds {layout}: remove them"
    )]
    KeysNotApplicable {
        /// The Secret's name.
        secret: String,
        /// The layout the Secret holds.
        layout: &'static str,
    },
    /// One of a pair is set without the other: username and password, or client certificate and
    /// key.
    #[error("key {key:?} of Secret {secret:?} sets {present} but not {missing}")]
    Incomplete {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// The one that is set.
        present: &'static str,
        /// The one that is not.
        missing: &'static str,
    },
    /// The key (a kubeconfig or Argo CD's config) holds no credentials.
    #[error("key {key:?} of Secret {secret:?} holds no credentials: {needed}")]
    Empty {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// What the key needs instead.
        needed: &'static str,
    },
    /// The credentials would have the controller run a command or a login flow.
    #[error(
        "{plugin} are not supported: key {key:?} of Secret {secret:?} sets {field}, and the controller runs no command or login flow a Secret names: give a bearer token or a client certificate instead"
    )]
    Plugin {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// The field that asks for it.
        field: String,
        /// The kind of plugin, in the plural.
        plugin: &'static str,
    },
    /// The credentials name a file for the controller to read.
    #[error(
        "key {key:?} of Secret {secret:?} names a file ({field}): the controller reads no file a Secret names; embed its contents ({instead}) instead"
    )]
    FileReference {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// The field that names the file.
        field: String,
        /// The field that would hold the file's contents instead.
        instead: &'static str,
    },
    /// A field the controller does not honour, such as a proxy.
    #[error("{field} in key {key:?} of Secret {secret:?} is not supported: {why}")]
    Unsupported {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// The field, as a path within the key.
        field: String,
        /// Why the controller does not honour it.
        why: &'static str,
    },
    /// kube cannot make a client configuration of the kubeconfig (its current context is
    /// missing, say).
    #[error("the kubeconfig in key {key:?} of Secret {secret:?} cannot be used: {reason}")]
    Kubeconfig {
        /// The Secret's name.
        secret: String,
        /// The key that holds the credentials.
        key: String,
        /// kube's error, which names contexts, clusters and URLs, never credentials.
        reason: String,
    },
    /// Argo CD's entry for the cluster it runs in, which holds no credentials.
    #[error(
        "Secret {secret:?} is Argo CD's entry for the cluster it runs in ({server}) and holds no credentials (Argo CD uses its own service account there): set credentials: {{inCluster: true}} instead"
    )]
    ArgoInCluster {
        /// The Secret's name.
        secret: String,
        /// The in-cluster server the entry names.
        server: String,
    },
    /// `spec.credentials.insecureSkipTLSVerify` is set for a Secret's credentials: only the
    /// Secret may turn off certificate checks.
    #[error(
        "spec.credentials.insecureSkipTLSVerify cannot turn off certificate checks for the credentials of Secret {0:?}: only the Secret can (insecure-skip-tls-verify in its kubeconfig, insecure in Argo CD's config)"
    )]
    InsecureBySpec(String),
    /// `inCluster` is set, and the controller's own service account is not available.
    #[error("inCluster is set but the controller's own service account is not available: {0}")]
    InCluster(String),
}

/// What the token layout accepts as a bearer token.
const TOKEN: &str = "bearer token (printable ASCII without spaces)";
/// What a client certificate must be, in the kubeconfig and Argo CD layouts.
const CLIENT_CERTIFICATE: &str = "base64 of PEM certificates";
/// What a client key must be: the PEM kinds kube's TLS setup reads.
const CLIENT_KEY: &str = "base64 of a PEM private key (PKCS#8, PKCS#1 or SEC1)";
/// The client configuration of a destination cluster.
pub fn destination_config(
    spec: &FleetClusterSpec,
    secret: Option<&Secret>,
    timeout: Duration,
) -> Result<Config, ClusterConfigError> {
    let credentials = &spec.credentials;
    let insecure = credentials.insecure_skip_tls_verify == Some(true);
    let mut config = match (&credentials.secret_ref, credentials.in_cluster) {
        (None, Some(true)) => {
            Config::incluster().map_err(|e| ClusterConfigError::InCluster(e.to_string()))?
        }
        // The Secret's credentials are the admin's: whoever writes the FleetCluster may not
        // send them to a server nobody verified.
        (Some(reference), None | Some(false)) if insecure => {
            return Err(ClusterConfigError::InsecureBySpec(reference.name.clone()));
        }
        (Some(reference), None | Some(false)) => secret_config(&spec.server, reference, secret)?,
        _ => return Err(ClusterConfigError::NoCredentials),
    };
    if insecure {
        config.accept_invalid_certs = true;
    }
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(config)
}

/// How a cluster Secret lays out its credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    Token,
    /// A kubeconfig, in this key.
    Kubeconfig(&'static str),
    ArgoCd,
}

impl Layout {
    fn describe(self) -> &'static str {
        match self {
            Self::Token => "a bearer token",
            Self::Kubeconfig(_) => "a kubeconfig",
            Self::ArgoCd => "Argo CD's cluster config",
        }
    }
}

/// The entries of one Secret, and its name for messages.
struct Entries<'a> {
    name: &'a str,
    secret: &'a Secret,
}

impl<'a> Entries<'a> {
    fn get(&self, key: &str) -> Option<&'a [u8]> {
        self.secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| b.0.as_slice())
    }

    /// The layout its keys say, when they say one only.
    fn layout(&self) -> Result<Layout, ClusterConfigError> {
        let mut found: Vec<(&'static str, Layout)> = KUBECONFIG_KEYS
            .iter()
            .map(|&key| (key, Layout::Kubeconfig(key)))
            .chain([(ARGOCD_CONFIG_KEY, Layout::ArgoCd)])
            .filter(|(key, _)| self.get(key).is_some())
            .collect();
        match found.len() {
            0 => Ok(Layout::Token),
            1 => Ok(found.remove(0).1),
            _ => Err(ClusterConfigError::Ambiguous {
                secret: self.name.to_string(),
                keys: found
                    .iter()
                    .map(|(key, _)| format!("{key:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Only admins label Secrets so; Argo CD's label says the same of its cluster Secrets.
    fn is_cluster_credentials(&self) -> bool {
        let labels = self.secret.metadata.labels.as_ref();
        [CLUSTER_SECRET_LABEL, ARGOCD_SECRET_LABEL]
            .iter()
            .any(|label| {
                labels
                    .and_then(|l| l.get(*label))
                    .is_some_and(|v| v == CLUSTER_SECRET_TYPE)
            })
    }
}

/// One key of a Secret, for messages.
#[derive(Clone, Copy)]
struct Source<'a> {
    secret: &'a str,
    key: &'a str,
}

impl Source<'_> {
    fn bad_key(self, what: &'static str) -> ClusterConfigError {
        ClusterConfigError::BadKey {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            what,
        }
    }

    fn bad_field(self, field: impl Into<String>, what: &'static str) -> ClusterConfigError {
        ClusterConfigError::BadField {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            field: field.into(),
            what,
        }
    }

    fn incomplete(self, present: &'static str, missing: &'static str) -> ClusterConfigError {
        ClusterConfigError::Incomplete {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            present,
            missing,
        }
    }

    fn plugin(self, plugin: &'static str, field: impl Into<String>) -> ClusterConfigError {
        ClusterConfigError::Plugin {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            field: field.into(),
            plugin,
        }
    }

    fn file(self, field: impl Into<String>, instead: &'static str) -> ClusterConfigError {
        ClusterConfigError::FileReference {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            field: field.into(),
            instead,
        }
    }

    fn unsupported(self, field: impl Into<String>, why: &'static str) -> ClusterConfigError {
        ClusterConfigError::Unsupported {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            field: field.into(),
            why,
        }
    }

    fn empty(self, needed: &'static str) -> ClusterConfigError {
        ClusterConfigError::Empty {
            secret: self.secret.to_string(),
            key: self.key.to_string(),
            needed,
        }
    }
}

/// The configuration a cluster Secret gives for `server`.
fn secret_config(
    server: &str,
    reference: &SecretCredentials,
    secret: Option<&Secret>,
) -> Result<Config, ClusterConfigError> {
    let uri = parse_server(server)?;
    if uri.scheme_str() != Some("https") {
        return Err(ClusterConfigError::PlainHttp(server.to_string()));
    }
    let entries = Entries {
        name: &reference.name,
        secret: secret.ok_or_else(|| ClusterConfigError::SecretMissing(reference.name.clone()))?,
    };
    // Nothing of a Secret is read before it is known to be cluster credentials, and they go
    // only to the server the Secret names: a FleetCluster's author chooses neither.
    if !entries.is_cluster_credentials() {
        return Err(ClusterConfigError::NotClusterSecret(reference.name.clone()));
    }
    let layout = entries.layout()?;
    if layout != Layout::Token && (reference.token_key.is_some() || reference.ca_key.is_some()) {
        return Err(ClusterConfigError::KeysNotApplicable {
            secret: reference.name.clone(),
            layout: layout.describe(),
        });
    }
    let bound = entries
        .get(CLUSTER_SECRET_SERVER_KEY)
        .and_then(|b| std::str::from_utf8(b).ok())
        .map(str::trim)
        .filter(|b| !b.is_empty());
    let mismatch = |bound: &str| ClusterConfigError::ServerMismatch {
        secret: reference.name.clone(),
        bound: bound.to_string(),
        server: server.to_string(),
    };
    match bound {
        // A kubeconfig names its server itself; the `server` key may repeat it.
        None if matches!(layout, Layout::Kubeconfig(_)) => {}
        None => return Err(ClusterConfigError::ServerUnbound(reference.name.clone())),
        Some(bound) if !same_server(&uri, bound) => return Err(mismatch(bound)),
        Some(_) => {}
    }
    let config = match layout {
        Layout::Token => token_config(uri, reference, &entries)?,
        Layout::Kubeconfig(key) => {
            let source = Source {
                secret: &reference.name,
                key,
            };
            let config = kubeconfig_config(source, entries.get(key).unwrap_or_default())?;
            let bound = config.cluster_url.to_string();
            if !same_server(&uri, &bound) {
                return Err(mismatch(bound.trim_end_matches('/')));
            }
            config
        }
        Layout::ArgoCd => {
            let source = Source {
                secret: &reference.name,
                key: ARGOCD_CONFIG_KEY,
            };
            let data = entries.get(ARGOCD_CONFIG_KEY).unwrap_or_default();
            argocd_config(uri, source, data)?
        }
    };
    if config.accept_invalid_certs {
        warn!(
            secret = %reference.name,
            %server,
            "a cluster Secret turns off verification of the server's certificate: its credentials \
             go to whoever answers at that address"
        );
    }
    Ok(config)
}

/// A bearer token and an optional CA bundle, in the keys `secretRef` names.
fn token_config(
    uri: http::Uri,
    reference: &SecretCredentials,
    entries: &Entries<'_>,
) -> Result<Config, ClusterConfigError> {
    let token =
        entries
            .get(reference.token_key())
            .ok_or_else(|| ClusterConfigError::KeyMissing {
                secret: reference.name.clone(),
                key: reference.token_key().to_string(),
            })?;
    let source = |key| Source {
        secret: &reference.name,
        key,
    };
    let token = bearer_token(token).ok_or_else(|| source(reference.token_key()).bad_key(TOKEN))?;
    let mut config = Config::new(uri);
    config.auth_info.token = Some(token);
    match entries.get(reference.ca_key()) {
        Some(ca) => {
            let certs = pem_certificates(ca)
                .ok_or_else(|| source(reference.ca_key()).bad_key("PEM certificates"))?;
            config.root_cert = Some(certs);
        }
        // Only the default key may be absent (the system roots then): a key the FleetCluster
        // names must be there, or its author could drop the CA the admin put in the Secret.
        None if reference.ca_key.is_some() => {
            return Err(ClusterConfigError::KeyMissing {
                secret: reference.name.clone(),
                key: reference.ca_key().to_string(),
            });
        }
        None => {}
    }
    Ok(config)
}

/// A kubeconfig, read by kube; its current context gives the server and credentials.
fn kubeconfig_config(source: Source<'_>, data: &[u8]) -> Result<Config, ClusterConfigError> {
    // A parser's error quotes the text it stopped at, which may be a credential: none is shown.
    let kubeconfig = std::str::from_utf8(data)
        .ok()
        .and_then(|text| Kubeconfig::from_yaml(text).ok())
        .ok_or_else(|| source.bad_key("kubeconfig (YAML)"))?;
    refuse_files_and_plugins(source, &kubeconfig)?;
    // kube's own errors here name contexts, clusters and URLs, never credentials.
    let mut config = Config::try_from(kubeconfig).map_err(|e| ClusterConfigError::Kubeconfig {
        secret: source.secret.to_string(),
        key: source.key.to_string(),
        reason: e.to_string(),
    })?;
    if config.root_cert.as_ref().is_some_and(Vec::is_empty) {
        return Err(source.bad_field("certificate-authority-data", "PEM certificates"));
    }
    check_user(source, &mut config.auth_info)?;
    // kube fills the proxy from the controller's environment; the other layouts use none.
    config.proxy_url = None;
    Ok(config)
}

/// Refuses, anywhere in the kubeconfig, what would make the controller read its own files, run
/// a command or go through a proxy: a Secret's author may ask for none of these.
fn refuse_files_and_plugins(
    source: Source<'_>,
    kubeconfig: &Kubeconfig,
) -> Result<(), ClusterConfigError> {
    for named in &kubeconfig.clusters {
        let Some(cluster) = &named.cluster else {
            continue;
        };
        let field = |name: &str| format!("clusters[{:?}].{name}", named.name);
        if cluster.certificate_authority.is_some() {
            return Err(source.file(field("certificate-authority"), "certificate-authority-data"));
        }
        if cluster.proxy_url.is_some() {
            return Err(source.unsupported(
                field("proxy-url"),
                "the controller connects to destination clusters directly",
            ));
        }
    }
    for named in &kubeconfig.auth_infos {
        let Some(user) = &named.auth_info else {
            continue;
        };
        let field = |name: &str| format!("users[{:?}].{name}", named.name);
        if user.exec.is_some() {
            return Err(source.plugin("exec credential plugins", field("exec")));
        }
        if user.auth_provider.is_some() {
            return Err(source.plugin("auth-provider plugins", field("auth-provider")));
        }
        let files = [
            (&user.token_file, "tokenFile", "token"),
            (
                &user.client_certificate,
                "client-certificate",
                "client-certificate-data",
            ),
            (&user.client_key, "client-key", "client-key-data"),
        ];
        if let Some((_, name, instead)) = files.iter().find(|(path, _, _)| path.is_some()) {
            return Err(source.file(field(name), instead));
        }
    }
    Ok(())
}

/// Checks the credentials of the kubeconfig's current user and keeps only what kube uses.
fn check_user(source: Source<'_>, user: &mut AuthInfo) -> Result<(), ClusterConfigError> {
    if let Some(token) = &user.token {
        let token = bearer_token(token.expose_secret().as_bytes())
            .ok_or_else(|| source.bad_field("token", TOKEN))?;
        user.token = Some(token);
    }
    let basic = match (&user.username, &user.password) {
        (Some(_), Some(_)) => true,
        (Some(_), None) => return Err(source.incomplete("username", "password")),
        (None, Some(_)) => return Err(source.incomplete("password", "username")),
        (None, None) => false,
    };
    let identity = match (&user.client_certificate_data, &user.client_key_data) {
        (Some(cert), Some(key)) => {
            check_identity(
                source,
                ("client-certificate-data", cert),
                ("client-key-data", key.expose_secret()),
            )?;
            true
        }
        (Some(_), None) => {
            return Err(source.incomplete("client-certificate-data", "client-key-data"));
        }
        (None, Some(_)) => {
            return Err(source.incomplete("client-key-data", "client-certificate-data"));
        }
        (None, None) => false,
    };
    if user.token.is_none() && !basic && !identity {
        return Err(source.empty(
            "the current context's user needs a token, client-certificate-data and client-key-data, or a username and password",
        ));
    }
    // Kept by kube for round trips, used by nothing, and printed by Debug.
    user.other.clear();
    user.extensions = None;
    Ok(())
}

/// Argo CD's `config` key: what Argo CD's `ClusterConfig` holds.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArgoConfig {
    bearer_token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    tls_client_config: Option<ArgoTls>,
    exec_provider_config: Option<serde_json::Value>,
    aws_auth_config: Option<serde_json::Value>,
    proxy_url: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ArgoTls {
    ca_data: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
    insecure: Option<bool>,
    server_name: Option<String>,
}

/// Argo CD leaves out empty fields, and reads an empty one as absent.
fn set(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// The fields of Argo CD's config that a decoding error's path names, up to the first one that
/// is not a field of ours: below an unknown key, or inside `execProviderConfig`, a key may be
/// anything the Secret holds.
fn known_path(path: &serde_path_to_error::Path) -> String {
    const TOP: [&str; 7] = [
        "bearerToken",
        "username",
        "password",
        "tlsClientConfig",
        "execProviderConfig",
        "awsAuthConfig",
        "proxyUrl",
    ];
    const TLS: [&str; 5] = ["caData", "certData", "keyData", "insecure", "serverName"];
    let mut shown: Vec<&str> = Vec::new();
    for segment in path.iter() {
        let fields: &[&str] = match shown.as_slice() {
            [] => &TOP,
            ["tlsClientConfig"] => &TLS,
            _ => &[],
        };
        match segment {
            serde_path_to_error::Segment::Map { key } if fields.contains(&key.as_str()) => {
                shown.push(key);
            }
            _ => break,
        }
    }
    shown.join(".")
}

/// Argo CD's cluster config, for the server of its Secret.
fn argocd_config(
    uri: http::Uri,
    source: Source<'_>,
    data: &[u8],
) -> Result<Config, ClusterConfigError> {
    const WHAT: &str = "Argo CD cluster config (JSON)";
    // Only the path of a decoding error is shown: its message may quote a value.
    let argo: ArgoConfig = serde_path_to_error::deserialize(
        &mut serde_json::Deserializer::from_slice(data),
    )
    .map_err(|e| match known_path(e.path()) {
        path if path.is_empty() => source.bad_key(WHAT),
        path => source.bad_field(path, WHAT),
    })?;
    if argo.exec_provider_config.is_some() {
        return Err(source.plugin("exec credential plugins", "execProviderConfig"));
    }
    if argo.aws_auth_config.is_some() {
        return Err(source.plugin(
            "exec credential plugins",
            "awsAuthConfig (which Argo CD runs as the command argocd-k8s-auth)",
        ));
    }
    if set(argo.proxy_url).is_some() {
        return Err(source.unsupported(
            "proxyUrl",
            "the controller connects to destination clusters directly",
        ));
    }
    let tls = argo.tls_client_config.unwrap_or_default();
    let mut config = Config::new(uri);
    if let Some(token) = set(argo.bearer_token) {
        let token =
            bearer_token(token.as_bytes()).ok_or_else(|| source.bad_field("bearerToken", TOKEN))?;
        config.auth_info.token = Some(token);
    }
    match (set(argo.username), set(argo.password)) {
        (Some(username), Some(password)) => {
            config.auth_info.username = Some(username);
            config.auth_info.password = Some(SecretString::from(password));
        }
        (Some(_), None) => return Err(source.incomplete("username", "password")),
        (None, Some(_)) => return Err(source.incomplete("password", "username")),
        (None, None) => {}
    }
    match (set(tls.cert_data), set(tls.key_data)) {
        (Some(cert), Some(key)) => {
            check_identity(
                source,
                ("tlsClientConfig.certData", &cert),
                ("tlsClientConfig.keyData", &key),
            )?;
            // kube reads both as base64 of PEM, as Argo CD stores them.
            config.auth_info.client_certificate_data = Some(cert);
            config.auth_info.client_key_data = Some(SecretString::from(key));
        }
        (Some(_), None) => {
            return Err(source.incomplete("tlsClientConfig.certData", "tlsClientConfig.keyData"));
        }
        (None, Some(_)) => {
            return Err(source.incomplete("tlsClientConfig.keyData", "tlsClientConfig.certData"));
        }
        (None, None) => {}
    }
    if let Some(ca) = set(tls.ca_data) {
        let certs = decode(&ca)
            .and_then(|pem| pem_certificates(&pem))
            .ok_or_else(|| {
                source.bad_field("tlsClientConfig.caData", "base64 of PEM certificates")
            })?;
        config.root_cert = Some(certs);
    }
    config.accept_invalid_certs = tls.insecure.unwrap_or(false);
    config.tls_server_name = set(tls.server_name);
    let auth = &config.auth_info;
    if auth.token.is_none() && auth.username.is_none() && auth.client_key_data.is_none() {
        // Argo CD's own entry for its cluster: it needs no credentials there, the controller does.
        if config.cluster_url.host() == Some("kubernetes.default.svc") {
            return Err(ClusterConfigError::ArgoInCluster {
                secret: source.secret.to_string(),
                server: config
                    .cluster_url
                    .to_string()
                    .trim_end_matches('/')
                    .to_string(),
            });
        }
        return Err(source.empty(
            "its config needs bearerToken, tlsClientConfig.certData and keyData, or username and password",
        ));
    }
    Ok(config)
}

/// A token as an HTTP header carries it: printable ASCII, no spaces. Anything else could not be
/// sent, and a client would go on without it.
fn bearer_token(bytes: &[u8]) -> Option<SecretString> {
    std::str::from_utf8(bytes)
        .ok()
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .map(|t| SecretString::from(t.to_string()))
}

/// Base64 as kube decodes it (standard alphabet, padded).
fn decode(data: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

/// The sections of a PEM bundle that rustls knows (certificates and keys), as kube's TLS set-up
/// reads them; `None` when the PEM is malformed.
fn pem_sections(pem: &[u8]) -> Option<Vec<(SectionKind, Vec<u8>)>> {
    <(SectionKind, Vec<u8>)>::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()
}

/// The DER of the certificates in a PEM bundle; none is an error.
fn pem_certificates(pem: &[u8]) -> Option<Vec<Vec<u8>>> {
    let certs: Vec<Vec<u8>> = pem_sections(pem)?
        .into_iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| der)
        .collect();
    (!certs.is_empty()).then_some(certs)
}

/// A client certificate and key that kube's TLS setup will read: base64 of PEM, certificates
/// only in the one, one private key of a kind it knows in the other. Checked here so that a bad
/// one is reported by field, and kube's decoding errors (which quote a byte) never are.
fn check_identity(
    source: Source<'_>,
    (cert_field, cert): (&'static str, &str),
    (key_field, key): (&'static str, &str),
) -> Result<(), ClusterConfigError> {
    let certs_only = decode(cert)
        .and_then(|pem| pem_sections(&pem))
        .is_some_and(|sections| {
            !sections.is_empty()
                && sections
                    .iter()
                    .all(|(kind, _)| *kind == SectionKind::Certificate)
        });
    if !certs_only {
        return Err(source.bad_field(cert_field, CLIENT_CERTIFICATE));
    }
    let one_key = decode(key)
        .and_then(|pem| pem_sections(&pem))
        .is_some_and(|sections| {
            matches!(
                sections.as_slice(),
                [(
                    SectionKind::PrivateKey
                        | SectionKind::RsaPrivateKey
                        | SectionKind::EcPrivateKey,
                    _
                )]
            )
        });
    if !one_key {
        return Err(source.bad_field(key_field, CLIENT_KEY));
    }
    Ok(())
}

fn parse_server(server: &str) -> Result<http::Uri, ClusterConfigError> {
    let uri: http::Uri = server
        .parse()
        .map_err(|_| ClusterConfigError::BadServer(server.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(ClusterConfigError::BadServer(server.to_string()));
    }
    Ok(uri)
}

/// The same endpoint: scheme, host (any case), port (defaulted) and path (without a trailing
/// slash) all equal.
fn same_server(server: &http::Uri, bound: &str) -> bool {
    let Ok(bound) = bound.parse::<http::Uri>() else {
        return false;
    };
    let port = |u: &http::Uri| {
        u.port_u16().or_else(|| match u.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        })
    };
    let path = |u: &http::Uri| u.path().trim_end_matches('/').to_string();
    server.scheme_str() == bound.scheme_str()
        && server
            .host()
            .zip(bound.host())
            .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
        && port(server) == port(&bound)
        && path(server) == path(&bound)
        && bound.query().is_none()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use shardwise_api::{ClusterCredentials, SecretCredentials};

    use super::*;

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

    /// A cluster Secret (labelled) for `https://x` with these entries besides `server`.
    fn secret(entries: &[(&str, &[u8])]) -> Secret {
        bound_secret("https://x", entries)
    }

    fn bound_secret(server: &str, entries: &[(&str, &[u8])]) -> Secret {
        let mut secret = marked(unmarked_secret(entries));
        secret
            .data
            .get_or_insert_default()
            .insert("server".into(), ByteString(server.as_bytes().to_vec()));
        secret
    }

    /// The cluster label, and nothing else of a cluster Secret.
    fn marked(mut secret: Secret) -> Secret {
        secret.metadata.labels = Some(BTreeMap::from([(
            CLUSTER_SECRET_LABEL.to_string(),
            CLUSTER_SECRET_TYPE.to_string(),
        )]));
        secret
    }

    fn unmarked_secret(entries: &[(&str, &[u8])]) -> Secret {
        let data: BTreeMap<String, ByteString> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
            .collect();
        Secret {
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn a_token_secret_gives_a_config_without_leaking_the_token() {
        let s = bound_secret("https://10.0.0.1:6443/", &[("token", b"s3cr3t-token\n")]);
        let config = destination_config(
            &spec("https://10.0.0.1:6443"),
            Some(&s),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
        assert!(config.auth_info.token.is_some());
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }

    #[test]
    fn credentials_go_only_over_https_to_the_server_their_secret_names() {
        let token: &[(&str, &[u8])] = &[("token", b"t")];
        let accepted = [
            ("https://api.example.com", "https://API.example.com:443/"),
            ("https://10.0.0.1:6443/k8s/", "https://10.0.0.1:6443/k8s"),
        ];
        for (server, bound) in accepted {
            let s = bound_secret(bound, token);
            assert!(
                destination_config(&spec(server), Some(&s), Duration::from_secs(1)).is_ok(),
                "{server} with a Secret for {bound}"
            );
        }
        let refused = [
            (
                "https://attacker:8080",
                bound_secret("https://10.0.0.1:6443", token),
                "holds credentials for \"https://10.0.0.1:6443\", not for spec.server \"https://attacker:8080\"",
            ),
            (
                "https://10.0.0.1:6444",
                bound_secret("https://10.0.0.1:6443", token),
                "not for spec.server",
            ),
            (
                "https://10.0.0.1:6443/other",
                bound_secret("https://10.0.0.1:6443", token),
                "not for spec.server",
            ),
            (
                "http://attacker:8080",
                bound_secret("http://attacker:8080", token),
                "is plain http: credentials are only sent over https",
            ),
            (
                "https://x",
                unmarked_secret(&[("password", b"hunter2"), ("server", b"https://x")]),
                "Secret \"creds\" is not cluster credentials: only a Secret labelled shardwise.io/secret-type=cluster or argocd.argoproj.io/secret-type=cluster is used",
            ),
            (
                "https://x",
                {
                    let mut s = secret(token);
                    s.metadata.labels = Some(BTreeMap::from([(
                        CLUSTER_SECRET_LABEL.to_string(),
                        "opaque".to_string(),
                    )]));
                    s
                },
                "is not cluster credentials",
            ),
            (
                "https://x",
                marked(unmarked_secret(token)),
                "names no server (key \"server\")",
            ),
        ];
        for (server, secret, expected) in refused {
            let err = destination_config(&spec(server), Some(&secret), Duration::from_secs(1))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{server}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn bad_specs_say_what_to_fix() {
        let s = secret(&[("token", b"t")]);
        let cases: Vec<(FleetClusterSpec, Option<Secret>, &str)> = vec![
            (
                spec("not a url"),
                Some(s.clone()),
                "is not a valid http(s) URL",
            ),
            (
                spec("ftp://x"),
                Some(s.clone()),
                "is not a valid http(s) URL",
            ),
            (spec("https://x"), None, "Secret \"creds\" not found"),
            (spec("https://x"), Some(secret(&[])), "has no key \"token\""),
            (
                spec("https://x"),
                Some(secret(&[("token", b"t"), ("ca.crt", b"garbage")])),
                "not valid PEM",
            ),
            (
                spec("https://x"),
                Some(secret(&[("token", "jeton-à-accent".as_bytes())])),
                "key \"token\" of Secret \"creds\" is not valid bearer token",
            ),
            (
                spec("https://x"),
                Some(secret(&[("token", b"two words")])),
                "is not valid bearer token",
            ),
            (
                spec("https://x"),
                Some(secret(&[("token", b" \n")])),
                "is not valid bearer token",
            ),
            (
                FleetClusterSpec {
                    credentials: ClusterCredentials::default(),
                    ..spec("https://x")
                },
                Some(s.clone()),
                "exactly one of secretRef and inCluster",
            ),
        ];
        for (spec, secret, expected) in cases {
            let err =
                destination_config(&spec, secret.as_ref(), Duration::from_secs(1)).unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
