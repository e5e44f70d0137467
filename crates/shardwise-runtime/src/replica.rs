//! The life of one replica: hold the shard and planner leases, run the planner while elected
//! and owner terms while the shard lease is held, and once told to stop hand everything over
//! before returning. [`run`] (the `server` feature) adds what a program around it needs:
//! a client from the environment, metrics and probes, and SIGTERM.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube_runtime::events::{Recorder, Reporter};
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::keys::{LEASE_KIND_LABEL, SHARD_LABEL, STATEFULSET_LABEL};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::audit::Audit;
use crate::clients::{Connection, FieldManagerLayer, RateLimitLayer, TermRole, term_user_agent};
use crate::layout::Layout;
use crate::lease::{
    self, Annotations, Fence, Holding, LeaseKind, LeaseSpecification, until_held, until_lost,
};
use crate::load::LoadReport;
use crate::membership::ShardLeases;
use crate::metrics::{Metrics, Telemetry};
use crate::owner::{self, Compose, Exit, Readiness};
use crate::planner;
use crate::settings::Settings;
use crate::sharded::Sharded;
use crate::term::SliceHome;

/// Why a replica could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No Kubernetes configuration was found (in-cluster or kubeconfig).
    #[cfg(feature = "server")]
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
    #[cfg(feature = "server")]
    #[error("cannot watch signals: {0}")]
    Signals(#[source] std::io::Error),
    /// The metrics and health server could not start or failed while serving.
    #[cfg(feature = "server")]
    #[error(transparent)]
    Serve(#[from] crate::http::ServeError),
    /// Objects placed by ranges of their UIDs ([`crate::kind::Placement::UidRanges`]) with a
    /// strategy that cannot cut a unit into ranges.
    #[error(
        "objects placed by UID ranges need a strategy that cuts units into ranges; {0} cannot (use sticky-balanced)"
    )]
    Uncut(shard_assign::StrategyKind),
    /// The flags give settings that cannot work ([`crate::args::ReplicaArgs::run`]).
    #[cfg(feature = "clap")]
    #[error(transparent)]
    Args(#[from] crate::args::ArgsError),
}

/// One replica of a sharded controller, ready to run: the controller, its settings and its
/// way to the control plane. Its metrics ([`telemetry`](Self::telemetry)) and readiness
/// ([`readiness`](Self::readiness)) are the program's to serve, which [`run`] does.
///
/// ```no_run
/// # use shardwise_runtime::{ShardedReplica, Sharded};
/// # use shardwise_runtime::settings::Settings;
/// # async fn example<C: Sharded>(controller: C) -> Result<(), Box<dyn std::error::Error>> {
/// let client = kube::Client::try_default().await?;
/// let settings = Settings::builder("ops", "labeller-0").build()?;
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// ShardedReplica::new(controller, settings, client).run(shutdown).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ShardedReplica<C: Sharded> {
    controller: C,
    settings: Settings,
    connection: Connection,
    telemetry: Telemetry,
    readiness: Readiness,
    /// The program's own controller does each term's work ([`crate::kind`]).
    compose: Option<Compose<C>>,
}

impl<C: Sharded> ShardedReplica<C> {
    /// A replica of `controller`, reaching the control plane through `connection` (a
    /// `kube::Client`, or with the `rustls-tls` feature a `kube::Config`).
    pub fn new(controller: C, settings: Settings, connection: impl Into<Connection>) -> Self {
        let shard = settings.replica.shard;
        let telemetry = Telemetry::new(shard, C::NOUNS, |registry| {
            controller.register_metrics(registry, shard);
        });
        Self {
            controller,
            settings,
            connection: connection.into(),
            telemetry,
            readiness: Readiness::default(),
            compose: None,
        }
    }

    /// Hands each term's work to `compose` instead of the runtime's own watches of items and
    /// workers.
    pub(crate) fn composed(self, compose: Compose<C>) -> Self {
        Self {
            compose: Some(compose),
            ..self
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The runtime's metrics and the controller's, to serve at `/metrics`.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Whether the replica is ready (it holds its shard and its caches are synced), for
    /// `/readyz`.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Runs until `shutdown` is cancelled, then hands the replica's work over (drains its
    /// reconciles, releases its leases) and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunError> {
        let Self {
            controller,
            settings,
            connection,
            telemetry,
            readiness,
            compose,
        } = self;
        let replica = settings.replica.clone();
        info!(shard = replica.shard, statefulset = %replica.statefulset, strategy = %settings.planner.strategy.kind, "starting");
        let metrics = telemetry.metrics.clone();
        let control_limit =
            RateLimitLayer::new(settings.control_plane.qps, settings.control_plane.burst);
        let client = connection
            .client("control-plane", &control_limit, &metrics)
            .map_err(RunError::Client)?;
        let audit = Audit::open(replica.shard, C::NOUNS.unit, settings.audit_file.as_deref())
            .map_err(|source| RunError::Audit {
                path: settings.audit_file.clone(),
                source,
            })?;

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
        let shard_leases =
            ShardLeases::new(client.clone(), &replica.namespace, &replica.statefulset);
        let lease_watch = tokio::spawn(shard_leases.clone().watch());
        let planner = tokio::spawn(plan_while_elected::<C>(
            connection.clone(),
            settings.clone(),
            metrics.clone(),
            shard_leases,
            planner_holding,
            compose.as_ref().map_or(Layout::UnitsAndItems, |c| c.layout),
            shutdown.clone(),
        ));
        let owners = Owners {
            controller: Arc::new(controller),
            connection,
            settings,
            control_limit,
            metrics,
            audit,
            readiness,
            load,
            compose,
        };
        let owned = own_while_held(&owners, shard_holding, &shutdown).await;

        // Work has stopped: give the leases up so that the planner moves our units at once.
        let _ = planner.await;
        lease_watch.abort();
        lease_stop.cancel();
        let _ = tokio::join!(shard_lease, planner_lease);
        owned?;
        info!("stopped");
        Ok(())
    }
}

/// Runs one replica of `controller` as a program does: a client from the environment
/// (in-cluster, or the kubeconfig), metrics and probes served as `http` says, until SIGTERM or
/// SIGINT; then hands its work over and returns.
#[cfg(feature = "server")]
pub async fn run<C: Sharded>(
    controller: C,
    settings: Settings,
    http: crate::http::HttpSettings,
) -> Result<(), RunError> {
    let shutdown = crate::http::shutdown_on_signal().map_err(RunError::Signals)?;
    // Bound before any work: a taken port stops the process at once.
    let listeners = crate::http::Listeners::bind(http.metrics_addr, http.health_addr)
        .await
        .map_err(crate::http::ServeError::Listen)?;
    let config = kube::Config::infer().await.map_err(RunError::Kubeconfig)?;
    let replica = ShardedReplica::new(controller, settings, config.clone());
    let http_stop = CancellationToken::new();
    let server = crate::http::serve_replica(
        listeners,
        &http,
        &replica.settings.replica,
        &config,
        replica.telemetry(),
        &replica.readiness(),
        &http_stop,
    )?;
    let ran = replica.run(shutdown).await;
    http_stop.cancel();
    let served = match server.await {
        Ok(Err(e)) => Err(RunError::Serve(crate::http::ServeError::Http(e))),
        _ => Ok(()),
    };
    ran?;
    served
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
    connection: Connection,
    settings: Settings,
    metrics: Metrics,
    leases: Arc<ShardLeases>,
    holding: watch::Receiver<Holding>,
    layout: Layout,
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
        let user_agent = term_user_agent(&settings.controller_name, TermRole::Planner, incarnation);
        let field_manager = FieldManagerLayer::new(&settings.controller_name);
        let client =
            match connection.term_client(user_agent, &field_manager, fence, &limit, &metrics) {
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
            layout,
        };
        planner::run::<C>(
            parts,
            until_lost(holding.clone(), incarnation),
            shutdown.clone(),
        )
        .await;
    }
}

/// What every owner term of a replica is built from.
struct Owners<C: Sharded> {
    controller: Arc<C>,
    connection: Connection,
    settings: Settings,
    /// Shared by the leases and every term: one budget for the control plane.
    control_limit: RateLimitLayer,
    metrics: Metrics,
    audit: Audit,
    readiness: Readiness,
    /// What the shard lease's renewals carry.
    load: watch::Sender<Annotations>,
    compose: Option<Compose<C>>,
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
        let user_agent = term_user_agent(
            &settings.controller_name,
            TermRole::Owner(settings.replica.shard),
            incarnation,
        );
        let client = match owners.connection.term_client(
            user_agent,
            &FieldManagerLayer::new(&settings.controller_name),
            fence.clone(),
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
        match owner::run(
            owners.controller.clone(),
            parts,
            owners.compose.clone(),
            fenced,
            shutdown.clone(),
        )
        .await
        {
            Exit::Fenced => metrics.fenced.get_or_create(&labels).inc(),
            Exit::Shutdown => break Ok(()),
        };
    };
    metrics.lease_held.get_or_create(&labels).set(0);
    result
}
