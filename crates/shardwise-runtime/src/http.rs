//! `/metrics`, `/healthz` and `/readyz`.
//!
//! The probes are plain HTTP on their own port: the kubelet calls them without credentials, and
//! they tell nothing but "ok" or "ready". The metrics are served over HTTPS to authorized
//! scrapers only ([`auth`], [`tls`]) unless `--metrics-secure=false`.

pub mod auth;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::Telemetry;
pub use crate::owner::Readiness;

#[derive(Clone, Debug)]
struct AppState {
    telemetry: Telemetry,
    readiness: Readiness,
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match state.telemetry.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.get() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: lease not held or caches not synced",
        )
    }
}

/// How `/metrics` is protected.
pub enum MetricsAccess<R> {
    /// Plain HTTP, open to anyone who reaches the port.
    Open,
    /// HTTPS, and only for requests the gate allows.
    Secure {
        /// The TLS configuration connections are accepted with.
        tls: tokio_rustls::TlsAcceptor,
        /// Who may read the metrics.
        gate: Arc<auth::Gate<R>>,
    },
}

impl<R> std::fmt::Debug for MetricsAccess<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MetricsAccess::Open => "Open",
            MetricsAccess::Secure { .. } => "Secure",
        })
    }
}

/// A socket that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}")]
pub struct BindError {
    /// The address asked for.
    pub(crate) addr: SocketAddr,
    /// Why the operating system refused it.
    #[source]
    pub(crate) source: std::io::Error,
}

/// The sockets of `/metrics` and the probes, bound before the process starts any work: a
/// taken port stops it at once instead of leaving it running with neither metrics nor probes.
#[derive(Debug)]
pub struct Listeners {
    metrics: tokio::net::TcpListener,
    /// `None` when the probes share the metrics socket (which only open metrics allow).
    health: Option<tokio::net::TcpListener>,
}

impl Listeners {
    /// Binds `metrics_addr`, and `health_addr` when it differs.
    pub async fn bind(
        metrics_addr: SocketAddr,
        health_addr: SocketAddr,
    ) -> Result<Self, BindError> {
        let bind = |addr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| BindError { addr, source })
        };
        let metrics = bind(metrics_addr).await?;
        let health = if health_addr == metrics_addr {
            None
        } else {
            Some(bind(health_addr).await?)
        };
        Ok(Self { metrics, health })
    }
}

/// Serves `/metrics` and the probes on `listeners` until `stop` is cancelled.
pub async fn serve<R: auth::Reviewer>(
    listeners: Listeners,
    access: MetricsAccess<R>,
    telemetry: Telemetry,
    readiness: Readiness,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let state = AppState {
        telemetry,
        readiness,
    };
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let metrics_router = Router::new().route("/metrics", get(metrics));
    let Listeners {
        metrics: metrics_listener,
        health,
    } = listeners;
    let (tls, gate, health_listener) = match (access, health) {
        (MetricsAccess::Open, None) => {
            let app = metrics_router.merge(probes).with_state(state);
            return axum::serve(metrics_listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        }
        (MetricsAccess::Open, Some(health_listener)) => {
            let a = axum::serve(metrics_listener, metrics_router.with_state(state.clone()))
                .with_graceful_shutdown(stop.clone().cancelled_owned());
            let b = axum::serve(health_listener, probes.with_state(state))
                .with_graceful_shutdown(stop.cancelled_owned());
            let (a, b) = tokio::join!(a, b);
            return a.and(b);
        }
        (MetricsAccess::Secure { .. }, None) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "secure metrics need a health address of their own: the kubelet probes over plain HTTP",
            ));
        }
        (MetricsAccess::Secure { tls, gate }, Some(health_listener)) => {
            (tls, gate, health_listener)
        }
    };
    let guarded = metrics_router
        .layer(axum::middleware::from_fn_with_state(
            gate,
            auth::require_access::<R>,
        ))
        .with_state(state.clone());
    let a = axum::serve(tls::TlsListener::new(metrics_listener, tls)?, guarded)
        .with_graceful_shutdown(stop.clone().cancelled_owned());
    let b = axum::serve(health_listener, probes.with_state(state))
        .with_graceful_shutdown(stop.cancelled_owned());
    let (a, b) = tokio::join!(a, b);
    a.and(b)
}
