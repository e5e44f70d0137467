//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;

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

/// Serves `/metrics` on `metrics_addr` and the probes on `health_addr` (the same listener when
/// the addresses are equal), until `stop` is cancelled.
pub async fn serve(
    metrics_addr: SocketAddr,
    health_addr: SocketAddr,
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
    if metrics_addr == health_addr {
        let listener = tokio::net::TcpListener::bind(metrics_addr).await?;
        let app = metrics_router.merge(probes).with_state(state);
        return axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    }
    let metrics_listener = tokio::net::TcpListener::bind(metrics_addr).await?;
    let health_listener = tokio::net::TcpListener::bind(health_addr).await?;
    let metrics_app = metrics_router.with_state(state.clone());
    let health_app = probes.with_state(state);
    let a = axum::serve(metrics_listener, metrics_app)
        .with_graceful_shutdown(stop.clone().cancelled_owned());
    let b = axum::serve(health_listener, health_app).with_graceful_shutdown(stop.cancelled_owned());
    let (a, b) = tokio::join!(a, b);
    a.and(b)
}
