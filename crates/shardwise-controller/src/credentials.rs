//! The client configuration of a destination cluster, from its FleetCluster and Secret.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Config;
use secrecy::SecretString;
use shardwise_api::FleetClusterSpec;
use shardwise_api::keys::{CLUSTER_SECRET_LABEL, CLUSTER_SECRET_SERVER_KEY, CLUSTER_SECRET_TYPE};
use thiserror::Error;

/// Why a FleetCluster's spec cannot give a client. Messages name objects and keys, never
/// credential contents.
#[derive(Debug, Error)]
pub enum ClusterConfigError {
    #[error("spec.server {0:?} is not a valid http(s) URL")]
    BadServer(String),
    #[error("spec.credentials must set exactly one of secretRef and inCluster")]
    NoCredentials,
    #[error("Secret {0:?} not found")]
    SecretMissing(String),
    #[error(
        "Secret {0:?} is not cluster credentials: only a Secret labelled {CLUSTER_SECRET_LABEL}={CLUSTER_SECRET_TYPE} is used"
    )]
    NotClusterSecret(String),
    #[error(
        "Secret {0:?} names no server (key {CLUSTER_SECRET_SERVER_KEY:?}): credentials are only sent to the server their Secret names"
    )]
    ServerUnbound(String),
    #[error("Secret {secret:?} holds credentials for {bound:?}, not for spec.server {server:?}")]
    ServerMismatch {
        secret: String,
        bound: String,
        server: String,
    },
    #[error("spec.server {0:?} is plain http: credentials are only sent over https")]
    PlainHttp(String),
    #[error("Secret {secret:?} has no key {key:?}")]
    KeyMissing { secret: String, key: String },
    #[error("key {key:?} of Secret {secret:?} is not valid {what}")]
    BadKey {
        secret: String,
        key: String,
        what: &'static str,
    },
    #[error("inCluster is set but the controller's own service account is not available: {0}")]
    InCluster(String),
}

/// The client configuration of a destination cluster.
pub fn destination_config(
    spec: &FleetClusterSpec,
    secret: Option<&Secret>,
    timeout: Duration,
) -> Result<Config, ClusterConfigError> {
    let credentials = &spec.credentials;
    let mut config = match (&credentials.secret_ref, credentials.in_cluster) {
        (None, Some(true)) => {
            Config::incluster().map_err(|e| ClusterConfigError::InCluster(e.to_string()))?
        }
        (Some(reference), None | Some(false)) => {
            let uri = parse_server(&spec.server)?;
            if uri.scheme_str() != Some("https") {
                return Err(ClusterConfigError::PlainHttp(spec.server.clone()));
            }
            let secret =
                secret.ok_or_else(|| ClusterConfigError::SecretMissing(reference.name.clone()))?;
            // Nothing of a Secret is read before it is known to be cluster credentials, and
            // they go only to the server the Secret names: a FleetCluster's author chooses
            // neither.
            let marked = secret
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CLUSTER_SECRET_LABEL))
                .is_some_and(|v| v == CLUSTER_SECRET_TYPE);
            if !marked {
                return Err(ClusterConfigError::NotClusterSecret(reference.name.clone()));
            }
            let data = secret.data.as_ref();
            let key = |name: &str| data.and_then(|d| d.get(name)).map(|b| b.0.as_slice());
            let bound = key(CLUSTER_SECRET_SERVER_KEY)
                .and_then(|b| std::str::from_utf8(b).ok())
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .ok_or_else(|| ClusterConfigError::ServerUnbound(reference.name.clone()))?;
            if !same_server(&uri, bound) {
                return Err(ClusterConfigError::ServerMismatch {
                    secret: reference.name.clone(),
                    bound: bound.to_string(),
                    server: spec.server.clone(),
                });
            }
            let token =
                key(reference.token_key()).ok_or_else(|| ClusterConfigError::KeyMissing {
                    secret: reference.name.clone(),
                    key: reference.token_key().to_string(),
                })?;
            // A token travels in an HTTP header: printable ASCII, no spaces. Anything else
            // could not be sent, and a client would go on without it.
            let token = std::str::from_utf8(token)
                .map(|t| t.trim().to_string())
                .ok()
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| ClusterConfigError::BadKey {
                    secret: reference.name.clone(),
                    key: reference.token_key().to_string(),
                    what: "bearer token (printable ASCII without spaces)",
                })?;
            let mut config = Config::new(uri);
            config.auth_info.token = Some(SecretString::from(token));
            if let Some(ca) = key(reference.ca_key()) {
                let certs = pem::parse_many(ca)
                    .ok()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| ClusterConfigError::BadKey {
                        secret: reference.name.clone(),
                        key: reference.ca_key().to_string(),
                        what: "PEM certificates",
                    })?;
                config.root_cert = Some(certs.into_iter().map(|c| c.into_contents()).collect());
            }
            config
        }
        _ => return Err(ClusterConfigError::NoCredentials),
    };
    config.accept_invalid_certs = credentials.insecure_skip_tls_verify.unwrap_or(false);
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(config)
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
                "Secret \"creds\" is not cluster credentials: only a Secret labelled shardwise.io/secret-type=cluster is used",
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
