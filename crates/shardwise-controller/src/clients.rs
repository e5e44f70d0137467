//! Kubernetes clients: rate-limited and counted, for the control plane and for each destination.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Request, Response};
use k8s_openapi::api::core::v1::Secret;
use kube::client::ClientBuilder;
use kube::{Client, Config};
use secrecy::SecretString;
use shardwise_api::FleetClusterSpec;
use shardwise_api::keys::{CLUSTER_SECRET_LABEL, CLUSTER_SECRET_SERVER_KEY, CLUSTER_SECRET_TYPE};
use thiserror::Error;
use tower::{Layer, Service};

use crate::lease::Fence;
use crate::metrics::{Metrics, RequestLabels};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Token-bucket limit on requests: `qps` per second on average, up to `burst` at once.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    pub fn new(qps: u32, burst: u32) -> Self {
        let qps = std::num::NonZeroU32::new(qps).unwrap_or(std::num::NonZeroU32::MIN);
        let burst = std::num::NonZeroU32::new(burst.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
        Self {
            limiter: Arc::new(RateLimiter::direct(
                Quota::per_second(qps).allow_burst(burst),
            )),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            permit: None,
            ready: false,
        }
    }
}

/// Waits for a token in `poll_ready`, so that a non-cloneable inner service keeps tower's
/// readiness contract.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    permit: Option<BoxFuture<()>>,
    ready: bool,
}

impl<S> std::fmt::Debug for RateLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimited")
            .field("ready", &self.ready)
            .finish()
    }
}

impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.ready {
            let limiter = self.limiter.clone();
            let permit = self
                .permit
                .get_or_insert_with(|| Box::pin(async move { limiter.until_ready().await }));
            if permit.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.permit = None;
            self.ready = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.ready = false;
        self.inner.call(request)
    }
}

/// Counts requests by target, verb (kube's name for the call) and status code.
#[derive(Clone, Debug)]
pub struct CountLayer {
    target: &'static str,
    metrics: Metrics,
}

impl CountLayer {
    pub fn new(target: &'static str, metrics: Metrics) -> Self {
        Self { target, metrics }
    }
}

impl<S> Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    layer: CountLayer,
}

impl<S, B, R> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb: &'static str = request
            .extensions()
            .get::<&'static str>()
            .copied()
            .unwrap_or_else(|| method_verb(request.method()));
        let future = self.inner.call(request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let result = future.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            layer
                .metrics
                .api_requests
                .get_or_create(&RequestLabels {
                    target: layer.target,
                    verb,
                    code,
                })
                .inc();
            result
        })
    }
}

fn method_verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "replace",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// A client with the given limit and request counting.
pub fn build_client(
    config: Config,
    target: &'static str,
    limit: &RateLimitLayer,
    metrics: &Metrics,
) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(limit)
        .with_layer(&CountLayer::new(target, metrics.clone()))
        .build())
}
/// Stops requests at the [`Fence`], as the innermost layer: below the rate limiter, the
/// authentication and everything else that may wait, right above the connection pool, so that
/// nothing sent through it leaves after the fence has closed.
#[derive(Clone, Debug)]
pub struct FenceLayer {
    fence: Fence,
}

impl FenceLayer {
    pub fn new(fence: Fence) -> Self {
        Self { fence }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FenceGate {
            inner,
            fence: self.fence.clone(),
        }
    }
}

/// A service (requests) or connector (new connections) behind a [`Fence`].
#[derive(Clone, Debug)]
pub struct FenceGate<S> {
    inner: S,
    fence: Fence,
}

impl<S, R> Service<R> for FenceGate<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        if let Err(fenced) = self.fence.check() {
            return Box::pin(std::future::ready(Err(fenced.into())));
        }
        let future = self.inner.call(request);
        let fence = self.fence.clone();
        Box::pin(async move {
            let response = future.await.map_err(Into::into)?;
            // For a connector: a connection that took long to establish (or a process frozen
            // meanwhile) is checked again just before the request goes out on it.
            fence.check()?;
            Ok(response)
        })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client of one owner term whose every request passes `fence` last, just before it is
/// written to a connection, and whose every new connection passes it again once established;
/// with a limit and request counting as [`build_client`].
pub fn build_fenced_client(
    config: Config,
    fence: Fence,
    target: &'static str,
    limit: &RateLimitLayer,
    metrics: &Metrics,
) -> Result<Client, kube::Error> {
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let connector = FenceLayer::new(fence.clone()).layer(connector);
    let pool = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(connector);
    // No retry layer: a retried request would leave after the fence was checked. Failed
    // reconciles are retried, through the fence, by the owner's queue.
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(FenceLayer::new(fence))
        .service(pool);
    Ok(
        ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(limit)
            .with_layer(&CountLayer::new(target, metrics.clone()))
            .build(),
    )
}

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

    fn held(incarnation: u64, for_: Duration) -> crate::lease::Holding {
        crate::lease::Holding::Held {
            fence_at: std::time::Instant::now() + for_,
            incarnation: shardwise_handoff::drain::Incarnation(incarnation),
        }
    }

    #[tokio::test]
    async fn nothing_passes_the_fence_of_a_term_that_is_over() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tower::ServiceExt;
        let (tx, rx) = tokio::sync::watch::channel(held(7, Duration::from_secs(60)));
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        let inner = tower::service_fn(move |_: u32| {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, BoxError>("sent"))
        });
        let fence = Fence::new(rx, shardwise_handoff::drain::Incarnation(7));
        let gate = FenceLayer::new(fence).layer(inner);
        assert_eq!(gate.clone().oneshot(1).await.unwrap(), "sent");
        // The fence reached on the monotonic clock, though the lease task never said so.
        tx.send_replace(held(7, Duration::ZERO));
        let err = gate.clone().oneshot(2).await.unwrap_err();
        assert!(err.to_string().starts_with("fenced:"), "{err}");
        // Held again, but by a later term: not this one's to use.
        tx.send_replace(held(8, Duration::from_secs(60)));
        assert!(gate.clone().oneshot(3).await.is_err());
        tx.send_replace(crate::lease::Holding::NotHeld);
        assert!(gate.clone().oneshot(4).await.is_err());
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "refused requests reached the inner service"
        );
    }

    #[tokio::test]
    async fn a_connection_established_after_the_fence_is_not_used() {
        use tower::ServiceExt;
        let (tx, rx) = tokio::sync::watch::channel(held(7, Duration::from_secs(60)));
        let (connected_tx, connected_rx) = tokio::sync::watch::channel(false);
        let (called_tx, mut called_rx) = tokio::sync::watch::channel(false);
        let connector = tower::service_fn(move |_: u32| {
            let mut connected = connected_rx.clone();
            called_tx.send_replace(true);
            async move {
                let _ = connected.wait_for(|c| *c).await;
                Ok::<_, BoxError>("connection")
            }
        });
        let fence = Fence::new(rx, shardwise_handoff::drain::Incarnation(7));
        let connecting = tokio::spawn(FenceLayer::new(fence).layer(connector).oneshot(1));
        called_rx.wait_for(|c| *c).await.unwrap();
        // The term ends while the handshake is under way (a frozen process, a slow server).
        tx.send_replace(crate::lease::Holding::NotHeld);
        connected_tx.send_replace(true);
        let err = connecting.await.unwrap().unwrap_err();
        assert!(err.to_string().starts_with("fenced:"), "{err}");
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
