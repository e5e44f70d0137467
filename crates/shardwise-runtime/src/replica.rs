//! The life of one replica: serve metrics and probes, hold the shard and planner leases, run
//! the planner while elected and owner terms while the shard lease is held, and on SIGTERM hand
//! everything over before returning.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube_runtime::events::{Recorder, Reporter};
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::keys::{LEASE_KIND_LABEL, SHARD_LABEL, STATEFULSET_LABEL};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::audit::Audit;
use crate::clients::{
    RateLimitLayer, TermRole, build_client, build_fenced_client, term_user_agent,
};
use crate::http::auth::{CacheTimes, Gate, KubeReviewer};
use crate::http::tls::CertSource;
use crate::http::{self, MetricsAccess};
use crate::lease::{
    self, Annotations, Fence, Holding, LeaseKind, LeaseSpecification, until_held, until_lost,
};
use crate::load::LoadReport;
use crate::membership::ShardLeases;
use crate::metrics::{Metrics, Telemetry};
use crate::owner::{self, Exit, Readiness};
use crate::planner;
use crate::settings::{HttpSettings, Replica, Settings};
use crate::sharded::Sharded;
use crate::term::SliceHome;

/// Why a replica could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No Kubernetes configuration was found (in-cluster or kubeconfig).
    #[error("cannot configure the Kubernetes client: {0}")]
    Kubeconfig(#[source] kube::config::InferConfigError),
    /// A Kubernetes client could not be built from the configuration.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The audit file could not be opened for appending.
    #[error("cannot open the audit file {path:?}: {source}")]
    Audit {
        /// The file (`--audit-file`).
        path: Option<std::path::PathBuf>,
        /// Why it could not be opened.
        #[source]
        source: std::io::Error,
    },
    /// SIGTERM and SIGINT could not be listened for.
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
    /// The metrics endpoint's certificate could not be loaded or made.
    #[error("cannot set up TLS for the metrics endpoint: {0}")]
    Tls(#[source] http::tls::TlsError),
    /// The metrics or health address could not be bound.
    #[error("metrics and health server: {0}")]
    Listen(#[source] http::BindError),
    /// The metrics and health server failed while serving.
    #[error("metrics and health server: {0}")]
    Http(#[source] std::io::Error),
}

/// Runs one replica of `controller` until SIGTERM or SIGINT, then hands its work over and
/// returns.
pub async fn run<C: Sharded>(controller: C, settings: Settings) -> Result<(), RunError> {
    let shutdown = CancellationToken::new();
    on_signal(shutdown.clone())?;
    run_until(controller, settings, shutdown).await
}

/// [`run`], until `shutdown` is cancelled (for tests and embedding).
pub async fn run_until<C: Sharded>(
    controller: C,
    settings: Settings,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let replica = settings.replica.clone();
    let listeners = http::Listeners::bind(settings.http.metrics_addr, settings.http.health_addr)
        .await
        .map_err(RunError::Listen)?;
    info!(shard = replica.shard, statefulset = %replica.statefulset, strategy = %settings.planner.strategy.kind, "starting");
    let telemetry = Telemetry::new(replica.shard, C::NOUNS, |registry| {
        controller.register_metrics(registry, replica.shard);
    });
    let metrics = telemetry.metrics.clone();
    let kube_config = kube::Config::infer().await.map_err(RunError::Kubeconfig)?;
    let control_limit =
        RateLimitLayer::new(settings.control_plane.qps, settings.control_plane.burst);
    let client = build_client(
        kube_config.clone(),
        "control-plane",
        &control_limit,
        &metrics,
    )
    .map_err(RunError::Client)?;
    let audit = Audit::open(replica.shard, C::NOUNS.unit, settings.audit_file.as_deref()).map_err(
        |source| RunError::Audit {
            path: settings.audit_file.clone(),
            source,
        },
    )?;
    let readiness = Readiness::default();
    let http_stop = CancellationToken::new();
    let http = serve_http(
        listeners,
        &settings.http,
        &replica,
        &kube_config,
        &telemetry,
        &readiness,
        &http_stop,
    )?;

    // Unique per process: a restarted pod must wait for its previous incarnation's lease.
    let identity = format!("{}_{:016x}", replica.pod_name, rand::random::<u64>());
    let lease_stop = CancellationToken::new();
    // The shard lease always carries a load report, empty until a term measures something:
    // a report left on the lease by a previous process must not pass for this one's.
    let (load, carried) = watch::channel(LoadReport::default().annotations());
    let (shard_lease, shard_holding) = hold_lease(
        &client,
        &settings,
        LeaseKind::Shard,
        &identity,
        Some(carried),
        &lease_stop,
    );
    let (planner_lease, planner_holding) = hold_lease(
        &client,
        &settings,
        LeaseKind::Planner,
        &identity,
        None,
        &lease_stop,
    );
    let shard_leases = ShardLeases::new(client.clone(), &replica.namespace, &replica.statefulset);
    let lease_watch = tokio::spawn(shard_leases.clone().watch());
    let planner = tokio::spawn(plan_while_elected::<C>(
        kube_config.clone(),
        settings.clone(),
        metrics.clone(),
        shard_leases,
        planner_holding,
        shutdown.clone(),
    ));
    let owners = Owners {
        controller: Arc::new(controller),
        kube_config,
        settings,
        control_limit,
        metrics,
        audit,
        readiness,
        load,
    };
    let owned = own_while_held(&owners, shard_holding, &shutdown).await;

    // Work has stopped: give the leases up so that the planner moves our units at once.
    let _ = planner.await;
    lease_watch.abort();
    lease_stop.cancel();
    let _ = tokio::join!(shard_lease, planner_lease);
    http_stop.cancel();
    let served = match http.await {
        Ok(Err(e)) => Err(RunError::Http(e)),
        _ => Ok(()),
    };
    owned?;
    served?;
    info!("stopped");
    Ok(())
}

/// SIGTERM or SIGINT cancels `token`.
fn on_signal(token: CancellationToken) -> Result<(), RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        token.cancel();
    });
    Ok(())
}

/// Starts the metrics and health server.
fn serve_http(
    listeners: http::Listeners,
    settings: &HttpSettings,
    replica: &Replica,
    kube_config: &kube::Config,
    telemetry: &Telemetry,
    readiness: &Readiness,
    stop: &CancellationToken,
) -> Result<JoinHandle<std::io::Result<()>>, RunError> {
    let access = if settings.metrics_secure {
        secure_metrics(settings, replica, kube_config, &telemetry.metrics)?
    } else {
        MetricsAccess::Open
    };
    Ok(tokio::spawn(http::serve(
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
) -> Result<MetricsAccess<KubeReviewer>, RunError> {
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
    let tls = http::tls::acceptor(&source).map_err(RunError::Tls)?;
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
    .map_err(RunError::Client)?;
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

/// Holds the replica's shard lease or the shared planner lease until `stop` is cancelled; its
/// renewals carry what `annotations` holds, if given.
fn hold_lease(
    client: &kube::Client,
    settings: &Settings,
    kind: LeaseKind,
    identity: &str,
    annotations: Option<watch::Receiver<Annotations>>,
    stop: &CancellationToken,
) -> (JoinHandle<()>, watch::Receiver<Holding>) {
    let replica = &settings.replica;
    let mut labels = BTreeMap::from([
        (LEASE_KIND_LABEL.to_string(), kind.label().to_string()),
        (STATEFULSET_LABEL.to_string(), replica.statefulset.clone()),
    ]);
    let name = match kind {
        LeaseKind::Shard => {
            labels.insert(SHARD_LABEL.to_string(), replica.shard.to_string());
            replica.shard_lease()
        }
        LeaseKind::Planner => replica.planner_lease(),
    };
    let (holding_tx, holding_rx) = watch::channel(Holding::NotHeld);
    let spec = LeaseSpecification {
        name,
        labels,
        identity: identity.to_string(),
        timing: settings.leases,
        statefulset: Some(replica.statefulset.clone()),
    };
    let client = client.clone();
    let namespace = replica.namespace.clone();
    let task = match annotations {
        Some(annotations) => tokio::spawn(lease::hold_annotated(
            client,
            namespace,
            spec,
            annotations,
            holding_tx,
            stop.clone(),
        )),
        None => tokio::spawn(lease::hold(
            client,
            namespace,
            spec,
            holding_tx,
            stop.clone(),
        )),
    };
    (task, holding_rx)
}

/// Runs a planner term each time the planner lease is held, until shutdown.
async fn plan_while_elected<C: Sharded>(
    kube_config: kube::Config,
    settings: Settings,
    metrics: Metrics,
    leases: Arc<ShardLeases>,
    holding: watch::Receiver<Holding>,
    shutdown: CancellationToken,
) {
    let limit = RateLimitLayer::new(settings.planner.limit.qps, settings.planner.limit.burst);
    loop {
        let incarnation = tokio::select! {
            held = until_held(holding.clone()) => match held {
                Ok(incarnation) => incarnation,
                Err(_) => return,
            },
            _ = shutdown.cancelled() => return,
        };
        // Each planner term writes through its own fence: a planner frozen past its lease
        // cannot relabel anything once it runs again.
        let fence = Fence::new(holding.clone(), incarnation);
        let client = match build_fenced_client(
            term_config(&kube_config, &settings, TermRole::Planner, incarnation),
            fence,
            "control-plane",
            &limit,
            &metrics,
        ) {
            Ok(client) => client,
            Err(e) => {
                // The owners' clients are built alike and fail alike: stop the replica
                // rather than run on without a planner.
                error!(error = %e, "cannot build the planner's client; stopping");
                shutdown.cancel();
                return;
            }
        };
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: settings.controller_name.clone(),
                instance: Some(settings.replica.pod_name.clone()),
            },
        );
        let parts = planner::PlannerParts {
            client,
            settings: settings.planner.clone(),
            replica: settings.replica.clone(),
            scope: settings.scope.clone(),
            metrics: metrics.clone(),
            recorder,
            leases: leases.clone(),
        };
        planner::run::<C>(
            parts,
            until_lost(holding.clone(), incarnation),
            shutdown.clone(),
        )
        .await;
    }
}

/// The control plane's client configuration for a term: every request names the term in its
/// User-Agent.
fn term_config(
    kube_config: &kube::Config,
    settings: &Settings,
    role: TermRole,
    incarnation: shardwise_handoff::drain::Incarnation,
) -> kube::Config {
    let mut config = kube_config.clone();
    config.headers.push((
        ::http::header::USER_AGENT,
        term_user_agent(&settings.controller_name, role, incarnation),
    ));
    config
}

/// What every owner term of a replica is built from.
struct Owners<C> {
    controller: Arc<C>,
    kube_config: kube::Config,
    settings: Settings,
    /// Shared by the leases and every term: one budget for the control plane.
    control_limit: RateLimitLayer,
    metrics: Metrics,
    audit: Audit,
    readiness: Readiness,
    /// What the shard lease's renewals carry.
    load: watch::Sender<Annotations>,
}

/// Runs an owner term each time the shard lease is held: a lost lease ends the term at once,
/// and a fresh one starts when the lease is held again.
async fn own_while_held<C: Sharded>(
    owners: &Owners<C>,
    holding: watch::Receiver<Holding>,
    shutdown: &CancellationToken,
) -> Result<(), RunError> {
    let metrics = &owners.metrics;
    let settings = &owners.settings;
    let labels = metrics.shard_labels();
    let result = loop {
        metrics.lease_held.get_or_create(&labels).set(0);
        let incarnation = tokio::select! {
            held = until_held(holding.clone()) => match held {
                Ok(incarnation) => incarnation,
                Err(_) => break Ok(()),
            },
            _ = shutdown.cancelled() => break Ok(()),
        };
        metrics.lease_held.get_or_create(&labels).set(1);
        let fence = Fence::new(holding.clone(), incarnation);
        let client = match build_fenced_client(
            term_config(
                &owners.kube_config,
                settings,
                TermRole::Owner(settings.replica.shard),
                incarnation,
            ),
            fence.clone(),
            "control-plane",
            &owners.control_limit,
            metrics,
        ) {
            Ok(client) => client,
            Err(e) => {
                shutdown.cancel();
                break Err(RunError::Client(e));
            }
        };
        let parts = owner::OwnerParts {
            me: OwnerId {
                shard: settings.replica.shard,
                incarnation,
            },
            fence,
            client,
            settings: settings.owner.clone(),
            scope: settings.scope.clone(),
            metrics: metrics.clone(),
            audit: owners.audit.clone(),
            readiness: owners.readiness.clone(),
            slices: SliceHome {
                namespace: settings.replica.namespace.clone(),
                statefulset: settings.replica.statefulset.clone(),
            },
            load: owners.load.clone(),
        };
        let fenced = until_lost(holding.clone(), incarnation);
        match owner::run(owners.controller.clone(), parts, fenced, shutdown.clone()).await {
            Exit::Fenced => metrics.fenced.get_or_create(&labels).inc(),
            Exit::Shutdown => break Ok(()),
        };
    };
    metrics.lease_held.get_or_create(&labels).set(0);
    result
}
