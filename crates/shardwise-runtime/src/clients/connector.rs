//! Clients built from a kube `Config` (the `rustls-tls` feature): the replica's own, and each
//! term's, whose connections check the term's fence before every write.

use std::task::{Context, Poll};

use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::Service;

use super::{
    BoxError, BoxFuture, CountLayer, FenceGate, FenceLayer, FieldManagerLayer, RateLimitLayer,
    gate_check,
};
use crate::lease::Fence;
use crate::metrics::Metrics;

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
    fenced_client(config, fence, target, None, limit, metrics)
}

/// [`build_fenced_client`], whose writes name `field_manager` when it is given.
pub(crate) fn fenced_client(
    config: Config,
    fence: Fence,
    target: &'static str,
    field_manager: Option<&FieldManagerLayer>,
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
    // As kube's own client does: a write resets the read timer, so that a slow upload is not
    // taken for a server that stopped answering.
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let connector = FencedConnector::new(connector, fence.clone());
    let pool = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(connector);
    // No retry layer: a retried request would leave after the fence was checked. Failed
    // reconciles are retried, through the fence, by the owner's queue.
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // kube's request spans (at debug), as its own client has them.
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(FenceLayer::new(fence))
        .service(pool);
    Ok(
        ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&tower::util::option_layer(field_manager.cloned()))
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

    fn held(incarnation: u64, for_: Duration) -> Holding {
        Holding::Held {
            fence_at: std::time::Instant::now() + for_,
            incarnation: Incarnation(incarnation),
        }
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
