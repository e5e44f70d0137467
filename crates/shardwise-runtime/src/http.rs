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
use crate::owner::Readiness;

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
        tls: tokio_rustls::TlsAcceptor,
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

/// Serves `/metrics` on `metrics_addr` and the probes on `health_addr` (the same listener when
/// the addresses are equal, which only open metrics allow), until `stop` is cancelled.
pub async fn serve<R: auth::Reviewer>(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
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
    let metrics_listener = tokio::net::TcpListener::bind(metrics_addr).await?;
    let (tls, gate) = match access {
        MetricsAccess::Open if metrics_addr == health_addr => {
            let app = metrics_router.merge(probes).with_state(state);
            return axum::serve(metrics_listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        }
        MetricsAccess::Open => {
            let health_listener = tokio::net::TcpListener::bind(health_addr).await?;
            let a = axum::serve(metrics_listener, metrics_router.with_state(state.clone()))
                .with_graceful_shutdown(stop.clone().cancelled_owned());
            let b = axum::serve(health_listener, probes.with_state(state))
                .with_graceful_shutdown(stop.cancelled_owned());
            let (a, b) = tokio::join!(a, b);
            return a.and(b);
        }
        MetricsAccess::Secure { tls, gate } => (tls, gate),
    };
    if metrics_addr == health_addr {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "secure metrics need a health address of their own: the kubelet probes over plain HTTP",
        ));
    }
    let health_listener = tokio::net::TcpListener::bind(health_addr).await?;
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
