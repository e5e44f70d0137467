//! Kubernetes clients: rate-limited, counted, and for the work of a term, behind its fence.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::{Request, Response};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::{Layer, Service};

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

/// A client with the given limit and request counting.
pub(crate) fn build_client(
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

/// A connector whose connections check the [`Fence`] before every write: a request that passed
/// the request-level gate and then waited (for a pooled connection to come free, or in a
/// process frozen meanwhile) cannot leave once the fence has closed.
#[derive(Clone, Debug)]
pub(crate) struct FencedConnector<C> {
    gate: FenceGate<C>,
}

impl<C> FencedConnector<C> {
    pub fn new(inner: C, fence: Fence) -> Self {
        Self {
            gate: FenceGate { inner, fence },
        }
    }
}

impl<C> Service<http::Uri> for FencedConnector<C>
where
    C: Service<http::Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
    C::Response: Send + 'static,
{
    type Response = FencedIo<C::Response>;
    type Error = BoxError;
    type Future = BoxFuture<Result<FencedIo<C::Response>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.gate.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.gate.call(uri);
        let fence = self.gate.fence.clone();
        Box::pin(async move {
            let inner = connecting.await?;
            Ok(FencedIo { inner, fence })
        })
    }
}

/// A connection that refuses to write once its [`Fence`] has closed.
#[derive(Debug)]
pub(crate) struct FencedIo<T> {
    inner: T,
    fence: Fence,
}

impl<T> FencedIo<T> {
    fn fenced(&self) -> Option<std::io::Error> {
        gate_check(&self.fence)
            .err()
            .map(|f| std::io::Error::new(std::io::ErrorKind::PermissionDenied, f))
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for FencedIo<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for FencedIo<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.fenced() {
            return Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if let Some(e) = self.fenced() {
            return Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for FencedIo<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}

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
        let ascii: String = text
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        http::HeaderValue::from_str(&ascii).unwrap_or(http::HeaderValue::from_static("shardwise"))
    })
}

/// A client of one owner term whose every request passes `fence` last, just before it is
/// written to a connection, and whose connections refuse every write once it has closed (a
/// request that waited for a pooled connection, or in a frozen process, does not leave late);
/// with a limit ([`RateLimitLayer`]) and requests counted by target, verb and status code.
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
    let connector = FencedConnector::new(connector, fence.clone());
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

    #[tokio::test]
    async fn a_connection_established_after_the_fence_is_not_used() {
        use tower::ServiceExt;
        let (tx, rx) = tokio::sync::watch::channel(held(7, Duration::from_secs(60)));
        let (connected_tx, connected_rx) = tokio::sync::watch::channel(false);
        let (called_tx, mut called_rx) = tokio::sync::watch::channel(false);
        let connector = tower::service_fn(move |_: http::Uri| {
            let mut connected = connected_rx.clone();
            called_tx.send_replace(true);
            async move {
                let _ = connected.wait_for(|c| *c).await;
                Ok::<_, BoxError>("connection")
            }
        });
        let fence = Fence::new(rx, Incarnation(7));
        let uri = http::Uri::from_static("https://destination.example:6443");
        let connecting = tokio::spawn(FencedConnector::new(connector, fence).oneshot(uri));
        called_rx.wait_for(|c| *c).await.unwrap();
        // The term ends while the handshake is under way (a frozen process, a slow server).
        tx.send_replace(Holding::NotHeld);
        connected_tx.send_replace(true);
        let err = connecting
            .await
            .unwrap()
            .expect_err("a connection made after the fence passed it");
        assert!(err.to_string().starts_with("fenced:"), "{err}");
    }

    /// A request that passed the gates and then waited for a pooled connection (or in a frozen
    /// process) must not go out on it once the fence has closed.
    #[tokio::test]
    async fn a_connection_writes_nothing_once_the_fence_has_closed() {
        use hyper::rt::Write;
        let (tx, rx) = tokio::sync::watch::channel(held(7, Duration::from_secs(60)));
        let (client, mut server) = tokio::io::duplex(1024);
        let mut io = FencedIo {
            inner: hyper_util::rt::TokioIo::new(client),
            fence: Fence::new(rx, Incarnation(7)),
        };
        let write = |io: &mut FencedIo<_>, bytes: &'static [u8]| {
            let waker = futures::task::noop_waker();
            let mut cx = Context::from_waker(&waker);
            std::pin::Pin::new(io).poll_write(&mut cx, bytes)
        };
        assert!(matches!(write(&mut io, b"GET"), Poll::Ready(Ok(3))));
        tx.send_replace(Holding::NotHeld);
        match write(&mut io, b"PATCH") {
            Poll::Ready(Err(e)) => {
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
                assert!(e.to_string().starts_with("fenced:"), "{e}");
            }
            other => panic!("a connection wrote after the fence: {other:?}"),
        }
        let mut received = [0u8; 8];
        let n = tokio::io::AsyncReadExt::read(&mut server, &mut received)
            .await
            .unwrap();
        assert_eq!(&received[..n], b"GET");
    }
}
