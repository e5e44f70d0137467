//! Kubernetes clients: rate-limited, counted, and for the work of a term, behind its fence.
//!
//! A replica reaches the control plane through a [`Connection`]: a kube `Config` it builds its
//! clients from (the `rustls-tls` feature), or the program's own `Client`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Request, Response};
use kube::Client;
#[cfg(feature = "rustls-tls")]
use kube::Config;
use kube::client::{Body, ClientBuilder};
use tower::{Layer, Service, ServiceBuilder};
use tower_http::set_header::SetRequestHeaderLayer;

use crate::failpoints;
use crate::lease::Fence;
use crate::metrics::{Metrics, RequestLabels};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Token-bucket limit on requests: `qps` per second on average, up to `burst` at once.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, up to `burst` at once; 0 counts as 1.
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
pub(crate) struct CountLayer {
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
pub(crate) struct Counted<S> {
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

/// How a replica reaches the control plane.
#[derive(Clone)]
pub enum Connection {
    /// Clients built from this configuration: the replica's own, and one per term whose
    /// connections refuse to write once the term's fence has closed, so that a request that
    /// waited for a connection (or in a process frozen meanwhile) never leaves late.
    #[cfg(feature = "rustls-tls")]
    Config(Box<Config>),
    /// The program's client, with its own layers (or a mock). A term's requests pass its fence
    /// before they enter the client; one that passed and then waited inside it (for a pooled
    /// connection, or in a process frozen meanwhile) may still leave after the fence closed.
    /// Give a `Config` where that window matters.
    Client(Client),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "rustls-tls")]
            Connection::Config(config) => write!(f, "Config({})", config.cluster_url),
            Connection::Client(_) => f.write_str("Client"),
        }
    }
}

#[cfg(feature = "rustls-tls")]
impl From<Config> for Connection {
    fn from(config: Config) -> Self {
        Connection::Config(Box::new(config))
    }
}

impl From<Client> for Connection {
    fn from(client: Client) -> Self {
        Connection::Client(client)
    }
}

impl Connection {
    /// A client for the replica's own requests (its leases), with `limit` and counted.
    pub(crate) fn client(
        &self,
        target: &'static str,
        limit: &RateLimitLayer,
        metrics: &Metrics,
    ) -> Result<Client, kube::Error> {
        match self {
            #[cfg(feature = "rustls-tls")]
            Connection::Config(config) => build_client((**config).clone(), target, limit, metrics),
            Connection::Client(client) => Ok(ClientBuilder::new(
                through(client),
                client.default_namespace().to_string(),
            )
            .with_layer(limit)
            .with_layer(&CountLayer::new(target, metrics.clone()))
            .build()),
        }
    }

    /// A client of one term: every request names the term in its User-Agent
    /// ([`term_user_agent`]) and passes `fence`, with `limit` and counted; its writes name
    /// `field_manager` ([`FieldManagerLayer`]).
    pub(crate) fn term_client(
        &self,
        user_agent: http::HeaderValue,
        field_manager: &FieldManagerLayer,
        fence: Fence,
        limit: &RateLimitLayer,
        metrics: &Metrics,
    ) -> Result<Client, kube::Error> {
        match self {
            #[cfg(feature = "rustls-tls")]
            Connection::Config(config) => {
                let mut config = (**config).clone();
                config.headers.push((http::header::USER_AGENT, user_agent));
                connector::fenced_client(
                    config,
                    fence,
                    "control-plane",
                    Some(field_manager),
                    limit,
                    metrics,
                )
            }
            Connection::Client(client) => {
                let service = ServiceBuilder::new()
                    .layer(SetRequestHeaderLayer::overriding(
                        http::header::USER_AGENT,
                        user_agent,
                    ))
                    .layer(FenceLayer::new(fence))
                    .service(through(client));
                Ok(
                    ClientBuilder::new(service, client.default_namespace().to_string())
                        .with_layer(field_manager)
                        .with_layer(limit)
                        .with_layer(&CountLayer::new("control-plane", metrics.clone()))
                        .build(),
                )
            }
        }
    }
}

/// Names the field manager of every write (create, update, patch) that names none, as the
/// program's controller: without it kube-apiserver names it after the User-Agent, which names
/// the term ([`term_user_agent`]), and an object written by several terms keeps a
/// `managedFields` entry for each term that last set some of its fields (the first one's for
/// the fields that never changed since, the latest one's for the rest), which every later
/// read, write and watch event of it carries.
#[derive(Clone, Debug)]
pub(crate) struct FieldManagerLayer {
    /// `fieldManager=<name>`, encoded for a query.
    parameter: Arc<str>,
}

impl FieldManagerLayer {
    /// At most 128 printable ASCII characters, as the API server accepts; others become `_`.
    pub fn new(name: &str) -> Self {
        let name: String = printable(name).chars().take(128).collect();
        let parameter = form_urlencoded::Serializer::new(String::new())
            .append_pair("fieldManager", &name)
            .finish();
        Self {
            parameter: parameter.into(),
        }
    }
}

impl<S> Layer<S> for FieldManagerLayer {
    type Service = FieldManaged<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FieldManaged {
            inner,
            parameter: self.parameter.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct FieldManaged<S> {
    inner: S,
    parameter: Arc<str>,
}

impl<S, B> Service<Request<B>> for FieldManaged<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let writes = matches!(
            *request.method(),
            http::Method::POST | http::Method::PUT | http::Method::PATCH
        );
        let query = request.uri().query().unwrap_or_default();
        let named = form_urlencoded::parse(query.as_bytes()).any(|(key, _)| key == "fieldManager");
        if writes && !named && !failpoints::seeded(failpoints::PER_TERM_FIELD_MANAGER) {
            let path_and_query = match query {
                "" => format!("{}?{}", request.uri().path(), self.parameter),
                query => format!("{}?{query}&{}", request.uri().path(), self.parameter),
            };
            let mut parts = request.uri().clone().into_parts();
            if let Ok(path_and_query) = path_and_query.parse() {
                parts.path_and_query = Some(path_and_query);
                if let Ok(uri) = http::Uri::from_parts(parts) {
                    *request.uri_mut() = uri;
                }
            }
        }
        self.inner.call(request)
    }
}

/// `client` as a tower service, for the runtime's layers to wrap.
fn through(
    client: &Client,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = kube::Error, Future: Send + 'static>
+ Clone
+ Send
+ 'static {
    let client = client.clone();
    tower::service_fn(move |request: Request<Body>| {
        let client = client.clone();
        async move { client.send(request).await }
    })
}

/// Stops requests at the [`Fence`], as the innermost layer: below the rate limiter, the
/// authentication and everything else that may wait, right above the connection pool, so that
/// nothing sent through it leaves after the fence has closed.
#[derive(Clone, Debug)]
pub(crate) struct FenceLayer {
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

/// A service (requests) or connector (new connections, [`FencedConnector`]) behind a
/// [`Fence`].
#[derive(Clone, Debug)]
pub(crate) struct FenceGate<S> {
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
        if let Err(fenced) = gate_check(&self.fence) {
            return Box::pin(std::future::ready(Err(fenced.into())));
        }
        let future = self.inner.call(request);
        let fence = self.fence.clone();
        Box::pin(async move {
            let response = future.await.map_err(Into::into)?;
            // For a connector: a connection that took long to establish (or a process frozen
            // meanwhile) is checked again just before the request goes out on it.
            gate_check(&fence)?;
            Ok(response)
        })
    }
}

/// The fence's check, as every gate of the fenced client makes it.
fn gate_check(fence: &Fence) -> Result<(), crate::lease::Fenced> {
    match fence.check() {
        Err(_) if failpoints::seeded(failpoints::WRITE_AFTER_FENCE) => Ok(()),
        checked => checked,
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which lease a term holds: a shard's, or the planner's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermRole {
    /// An owner term of the shard.
    Owner(shard_assign::ShardId),
    /// A planner term.
    Planner,
}

/// The User-Agent of every request a term sends: `<product> (shard <n>; term <hex>)` for an
/// owner term, `<product> (planner; term <hex>)` for a planner term, where the term is the
/// [`Incarnation`](shardwise_handoff::drain::Incarnation) of the lease's holder identity. An API
/// server's audit log then tells which term wrote what, and the lease history whether it wrote
/// after its lease could have expired.
pub fn term_user_agent(
    product: &str,
    role: TermRole,
    incarnation: shardwise_handoff::drain::Incarnation,
) -> http::HeaderValue {
    let role = match role {
        TermRole::Owner(shard) => format!("shard {shard}"),
        TermRole::Planner => "planner".to_string(),
    };
    let text = format!("{product} ({role}; term {:016x})", incarnation.0);
    // A product name from the program (a controller's name) may hold what a header cannot.
    http::HeaderValue::from_str(&text).unwrap_or_else(|_| {
        http::HeaderValue::from_str(&printable(&text))
            .unwrap_or(http::HeaderValue::from_static("shardwise"))
    })
}

/// `text` with every character but printable ASCII and spaces replaced by `_`: what a header
/// value or a field manager's name may hold.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(feature = "rustls-tls")]
mod connector;
#[cfg(feature = "rustls-tls")]
pub(crate) use connector::build_client;
#[cfg(feature = "rustls-tls")]
pub use connector::build_fenced_client;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shardwise_handoff::drain::Incarnation;

    use super::*;
    use crate::lease::Holding;

    fn held(incarnation: u64, for_: Duration) -> crate::lease::Holding {
        Holding::Held {
            fence_at: std::time::Instant::now() + for_,
            incarnation: Incarnation(incarnation),
        }
    }

    #[test]
    fn a_terms_user_agent_names_its_lease_and_identity() {
        let term = Incarnation::of_identity("shardwise-1_abc");
        assert_eq!(
            term_user_agent("shardwise-controller/0.1.0", TermRole::Owner(3), term),
            format!("shardwise-controller/0.1.0 (shard 3; term {:016x})", term.0).as_str()
        );
        assert_eq!(
            term_user_agent("label\nler", TermRole::Planner, Incarnation(0xab)),
            "label_ler (planner; term 00000000000000ab)"
        );
    }

    /// Writes that name no field manager get the program's; one that names its own keeps it;
    /// reads are left as they are.
    #[tokio::test]
    async fn a_terms_writes_name_the_programs_field_manager() {
        use tower::ServiceExt;
        let layer = FieldManagerLayer::new("shardwise controller\n");
        let echo = tower::service_fn(|request: Request<()>| {
            std::future::ready(Ok::<_, BoxError>(request.uri().to_string()))
        });
        let sent = |method: http::Method, uri: &str| {
            let request = Request::builder().method(method).uri(uri).body(()).unwrap();
            layer.layer(echo).oneshot(request)
        };
        let status = "/apis/shardwise.io/v1alpha1/namespaces/a/fleetapps/b/status";
        assert_eq!(
            sent(http::Method::PATCH, status).await.unwrap(),
            format!("{status}?fieldManager=shardwise+controller_"),
            "a write named no field manager"
        );
        assert_eq!(
            sent(
                http::Method::PUT,
                "/apis/coordination.k8s.io/v1/leases/x?dryRun=All"
            )
            .await
            .unwrap(),
            "/apis/coordination.k8s.io/v1/leases/x?dryRun=All&fieldManager=shardwise+controller_"
        );
        assert_eq!(
            sent(
                http::Method::PATCH,
                "/api/v1/configmaps/c?fieldManager=apply&force=true"
            )
            .await
            .unwrap(),
            "/api/v1/configmaps/c?fieldManager=apply&force=true"
        );
        assert_eq!(
            sent(http::Method::GET, "/api/v1/configmaps/c")
                .await
                .unwrap(),
            "/api/v1/configmaps/c"
        );
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
        let fence = Fence::new(rx, Incarnation(7));
        let gate = FenceLayer::new(fence).layer(inner);
        assert_eq!(gate.clone().oneshot(1).await.unwrap(), "sent");
        // The fence reached on the monotonic clock, though the lease task never said so.
        tx.send_replace(held(7, Duration::ZERO));
        let err = gate
            .clone()
            .oneshot(2)
            .await
            .expect_err("a request passed the fence of a term that is over");
        assert!(err.to_string().starts_with("fenced:"), "{err}");
        // Held again, but by a later term: not this one's to use.
        tx.send_replace(held(8, Duration::from_secs(60)));
        assert!(
            gate.clone().oneshot(3).await.is_err(),
            "a request passed the fence of a term that is over (a later term holds the lease)"
        );
        tx.send_replace(Holding::NotHeld);
        assert!(
            gate.clone().oneshot(4).await.is_err(),
            "a request passed the fence of a term that is over (the lease is not held)"
        );
        assert_eq!(
            sent.load(Ordering::SeqCst),
            1,
            "refused requests reached the inner service"
        );
    }
}
