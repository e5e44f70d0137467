//! `/metrics`, `/healthz` and `/readyz` (the `server` feature).
//!
//! The probes are plain HTTP on their own port: the kubelet calls them without credentials, and
//! they tell nothing but "ok" or "ready". The metrics are served over HTTPS to authorized
//! scrapers only ([`auth`], [`tls`]) unless `--metrics-secure=false`.
//!
//! A program that serves its own metrics leaves this module out and encodes
//! [`ShardedReplica::telemetry`](crate::ShardedReplica::telemetry)'s registry itself.

pub mod auth;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use tokio::task::JoinHandle;
use tracing::info;

use crate::clients::{RateLimitLayer, build_client};
use crate::metrics::{Metrics, Telemetry};
pub use crate::owner::Readiness;
use crate::settings::{Replica, SettingsError};
use auth::{CacheTimes, Gate, KubeReviewer};
use tls::CertSource;

/// How `/metrics` and the probes are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSettings {
    /// Where `/metrics` listens.
    pub metrics_addr: SocketAddr,
    /// Where `/healthz` and `/readyz` listen.
    pub health_addr: SocketAddr,
    /// HTTPS and TokenReview/SubjectAccessReview; plain HTTP otherwise.
    pub metrics_secure: bool,
    /// `tls.crt` and `tls.key`; self-signed when unset.
    pub metrics_cert_dir: Option<PathBuf>,
    /// Reviews per second the metrics endpoint may ask of the API server.
    pub metrics_review_qps: u32,
}

impl Default for HttpSettings {
    /// Metrics on 8080 over HTTPS (self-signed) for reviewed scrapers, the probes on 8081, 5
    /// reviews a second.
    fn default() -> Self {
        Self {
            metrics_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            health_addr: SocketAddr::from(([0, 0, 0, 0], 8081)),
            metrics_secure: true,
            metrics_cert_dir: None,
            metrics_review_qps: 5,
        }
    }
}

impl HttpSettings {
    /// Refuses settings that only fail later.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.metrics_secure && self.metrics_addr == self.health_addr {
            return Err(SettingsError::SharedMetricsPort(self.metrics_addr));
        }
        if !self.metrics_secure && self.metrics_cert_dir.is_some() {
            return Err(SettingsError::UnusedCertificate);
        }
        Ok(())
    }
}

/// Why the metrics and health server could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The metrics endpoint's certificate could not be loaded or made.
    #[error("cannot set up TLS for the metrics endpoint: {0}")]
    Tls(#[source] tls::TlsError),
    /// The metrics or health address could not be bound.
    #[error("metrics and health server: {0}")]
    Listen(#[source] BindError),
    /// The reviews' client could not be built.
    #[error("metrics and health server: cannot build the reviews' client: {0}")]
    Client(#[source] kube::Error),
    /// The server failed while serving.
    #[error("metrics and health server: {0}")]
    Http(#[source] std::io::Error),
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signal() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        cancel.cancel();
    });
    Ok(token)
}

/// Starts serving a replica's metrics and probes on `listeners` until `stop` is cancelled.
pub(crate) fn serve_replica(
    listeners: Listeners,
    settings: &HttpSettings,
    replica: &Replica,
    kube_config: &kube::Config,
    telemetry: &Telemetry,
    readiness: &Readiness,
    stop: &CancellationToken,
) -> Result<JoinHandle<std::io::Result<()>>, ServeError> {
    let access = if settings.metrics_secure {
        secure_metrics(settings, replica, kube_config, &telemetry.metrics)?
    } else {
        MetricsAccess::Open
    };
    Ok(tokio::spawn(serve(
        listeners,
        access,
        telemetry.clone(),
        readiness.clone(),
        stop.clone(),
    )))
}

/// HTTPS with a certificate from the directory (or self-signed), for reviewed scrapers only.
fn secure_metrics(
    settings: &HttpSettings,
    replica: &Replica,
    kube_config: &kube::Config,
    metrics: &Metrics,
) -> Result<MetricsAccess<KubeReviewer>, ServeError> {
    let source = match &settings.metrics_cert_dir {
        Some(dir) => CertSource::Directory(dir.clone()),
        // The names a scraper may use: the pod's stable DNS name under the StatefulSet's
        // governing Service, and loopback for a port-forward.
        None => CertSource::SelfSigned(vec![
            format!(
                "{}.{}.{}.svc",
                replica.pod_name, replica.statefulset, replica.namespace
            ),
            replica.pod_name.clone(),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ]),
    };
    let tls = tls::acceptor(&source).map_err(ServeError::Tls)?;
    // A scrape waits for its reviews: they must fail fast when the API server is away.
    let mut review_config = kube_config.clone();
    review_config.connect_timeout = Some(Duration::from_secs(5));
    review_config.read_timeout = Some(Duration::from_secs(5));
    let qps = settings.metrics_review_qps;
    let review_client = build_client(
        review_config,
        "control-plane",
        &RateLimitLayer::new(qps, qps.saturating_mul(2)),
        metrics,
    )
    .map_err(ServeError::Client)?;
    info!(
        certificate = if settings.metrics_cert_dir.is_some() {
            "from a directory"
        } else {
            "self-signed"
        },
        "metrics over https, for authorized scrapers only"
    );
    Ok(MetricsAccess::Secure {
        tls,
        gate: Arc::new(Gate::new(
            KubeReviewer::new(review_client),
            CacheTimes::default(),
        )),
    })
}

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
