//! The sharded controller of shardwise, as a library: the binary `shardwise-controller` is a
//! thin wrapper around [`run`], and tests drive the pieces (leases, queues) directly.
//!
//! The replica's shard is its StatefulSet pod ordinal. It holds a Lease for its shard and, while
//! it does, reconciles the FleetClusters and FleetApps labelled with that shard. One replica at a
//! time also holds the planner Lease and decides every label. See `docs/architecture.md`.

pub mod audit;
pub mod clients;
pub mod config;
pub mod decode;
pub mod destination;
pub mod http;
pub mod lease;
pub mod membership;
pub mod metrics;
pub mod owner;
pub mod planner;
pub mod tenancy;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use kube::runtime::events::{Recorder, Reporter};
use shardwise_api::keys::SHARD_LABEL;
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::identity::shard_from_pod_name;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::Config;
use crate::http::MetricsAccess;
use crate::http::auth::{CacheTimes, Gate, KubeReviewer};
use crate::http::tls::CertSource;
use crate::lease::{Fence, Holding, LeaseSpecification, until_held, until_lost};
use crate::membership::{LEASE_KIND_LABEL, LEASE_STATEFULSET_LABEL, ShardLeases};
use crate::metrics::Telemetry;
use crate::owner::{Exit, Readiness};

/// SIGTERM or SIGINT cancels `token`.
fn on_signal(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
        token.cancel();
    });
    Ok(())
}

/// Runs one replica until SIGTERM or SIGINT, then hands its work over and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shard = shard_from_pod_name(&config.pod_name, config.statefulset.as_deref())?;
    config.lease_timing().validate()?;
    config.strategy_config().validate()?;
    config.validate().map_err(anyhow::Error::msg)?;
    let config = Arc::new(config);
    let statefulset = config.statefulset_name();
    info!(shard, %statefulset, strategy = %config.strategy, "starting");

    let telemetry = Telemetry::new(shard);
    let metrics = telemetry.metrics.clone();
    let kube_config = kube::Config::infer()
        .await
        .context("cannot configure the Kubernetes client")?;
    // Leases and the owners share one limit; each owner term gets a client of its own behind
    // its fence, so that nothing of a term reaches the control plane after it either.
    let control_limit = clients::RateLimitLayer::new(config.kube_qps, config.kube_burst);
    let client = clients::build_client(
        kube_config.clone(),
        "control-plane",
        &control_limit,
        &metrics,
    )?;
    let audit = audit::Audit::open(shard, config.audit_file.as_deref())
        .with_context(|| format!("cannot open the audit file {:?}", config.audit_file))?;
    let readiness = Readiness::default();
    let shutdown = CancellationToken::new();
    on_signal(shutdown.clone())?;

    let metrics_access = if config.metrics_secure {
        let source = match &config.metrics_cert_dir {
            Some(dir) => CertSource::Directory(dir.clone()),
            // The names a scraper may use: the pod's stable DNS name under the StatefulSet's
            // governing Service, and loopback for a port-forward.
            None => CertSource::SelfSigned(vec![
                format!("{}.{statefulset}.{}.svc", config.pod_name, config.namespace),
                config.pod_name.clone(),
                "localhost".to_string(),
                "127.0.0.1".to_string(),
            ]),
        };
        let tls =
            http::tls::acceptor(&source).context("cannot set up TLS for the metrics endpoint")?;
        // A scrape waits for its reviews: they must fail fast when the API server is away.
        let mut review_config = kube_config.clone();
        review_config.connect_timeout = Some(std::time::Duration::from_secs(5));
        review_config.read_timeout = Some(std::time::Duration::from_secs(5));
        let review_client = clients::build_client(
            review_config,
            "control-plane",
            &clients::RateLimitLayer::new(
                config.metrics_review_qps,
                config.metrics_review_qps.saturating_mul(2),
            ),
            &metrics,
        )?;
        info!(
            certificate = if config.metrics_cert_dir.is_some() {
                "from a directory"
            } else {
                "self-signed"
            },
            "metrics over https, for authorized scrapers only"
        );
        MetricsAccess::Secure {
            tls,
            gate: Arc::new(Gate::new(
                KubeReviewer::new(review_client),
                CacheTimes::default(),
            )),
        }
    } else {
        MetricsAccess::Open
    };
    let http_stop = CancellationToken::new();
    let http = tokio::spawn(http::serve(
        config.metrics_addr,
        config.health_addr,
        metrics_access,
        telemetry.clone(),
        readiness.clone(),
        http_stop.clone(),
    ));

    // Unique per process: a restarted pod must wait for its previous incarnation's lease.
    let identity = format!("{}_{:016x}", config.pod_name, rand::random::<u64>());
    let lease_stop = CancellationToken::new();
    let (shard_tx, shard_rx) = watch::channel(Holding::NotHeld);
    let shard_lease = tokio::spawn(lease::hold(
        client.clone(),
        config.namespace.clone(),
        LeaseSpecification {
            name: format!("{statefulset}-shard-{shard}"),
            labels: BTreeMap::from([
                (LEASE_KIND_LABEL.to_string(), "shard".to_string()),
                (LEASE_STATEFULSET_LABEL.to_string(), statefulset.clone()),
                (SHARD_LABEL.to_string(), shard.to_string()),
            ]),
            identity: identity.clone(),
            timing: config.lease_timing(),
        },
        shard_tx,
        lease_stop.clone(),
    ));
    let (leader_tx, leader_rx) = watch::channel(Holding::NotHeld);
    let leader_lease = tokio::spawn(lease::hold(
        client.clone(),
        config.namespace.clone(),
        LeaseSpecification {
            name: format!("{statefulset}-planner"),
            labels: BTreeMap::from([
                (LEASE_KIND_LABEL.to_string(), "planner".to_string()),
                (LEASE_STATEFULSET_LABEL.to_string(), statefulset.clone()),
            ]),
            identity,
            timing: config.lease_timing(),
        },
        leader_tx,
        lease_stop.clone(),
    ));

    let shard_leases = ShardLeases::new(client.clone(), &config.namespace, &statefulset);
    let lease_watch = tokio::spawn(shard_leases.clone().watch());
    let planner = {
        let leases = shard_leases.clone();
        let config = config.clone();
        let metrics = metrics.clone();
        let shutdown = shutdown.clone();
        let kube_config = kube_config.clone();
        let limit = clients::RateLimitLayer::new(config.planner_qps, config.planner_burst);
        tokio::spawn(async move {
            loop {
                let incarnation = tokio::select! {
                    held = until_held(leader_rx.clone()) => match held {
                        Ok(incarnation) => incarnation,
                        Err(_) => return,
                    },
                    _ = shutdown.cancelled() => return,
                };
                // Each planner term writes through its own fence: a planner frozen past its
                // lease cannot relabel anything once it runs again.
                let client = match clients::build_fenced_client(
                    kube_config.clone(),
                    Fence::new(leader_rx.clone(), incarnation),
                    "control-plane",
                    &limit,
                    &metrics,
                ) {
                    Ok(client) => client,
                    Err(e) => {
                        // The owners' clients are built alike and fail alike: stop the replica
                        // rather than run on without a planner.
                        tracing::error!(error = %e, "cannot build the planner's client; stopping");
                        shutdown.cancel();
                        return;
                    }
                };
                let recorder = Recorder::new(
                    client.clone(),
                    Reporter {
                        controller: "shardwise-controller".into(),
                        instance: Some(config.pod_name.clone()),
                    },
                );
                planner::run(
                    client,
                    config.clone(),
                    metrics.clone(),
                    recorder,
                    leases.clone(),
                    until_lost(leader_rx.clone(), incarnation),
                    shutdown.clone(),
                )
                .await;
            }
        })
    };

    // The owner side runs while the shard lease is held; a lost lease cancels it, and a fresh
    // one starts when the lease is held again.
    let labels = metrics.shard_labels();
    loop {
        metrics.lease_held.get_or_create(&labels).set(0);
        let incarnation = tokio::select! {
            held = until_held(shard_rx.clone()) => match held {
                Ok(incarnation) => incarnation,
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        metrics.lease_held.get_or_create(&labels).set(1);
        let fence = Fence::new(shard_rx.clone(), incarnation);
        let owner_client = clients::build_fenced_client(
            kube_config.clone(),
            fence.clone(),
            "control-plane",
            &control_limit,
            &metrics,
        )?;
        let parts = owner::Parts {
            me: OwnerId { shard, incarnation },
            fence,
            client: owner_client,
            config: config.clone(),
            metrics: metrics.clone(),
            audit: audit.clone(),
            readiness: readiness.clone(),
        };
        let exit = owner::run(
            parts,
            until_lost(shard_rx.clone(), incarnation),
            shutdown.clone(),
        )
        .await;
        match exit {
            Exit::Fenced => {
                metrics.fenced.get_or_create(&labels).inc();
            }
            Exit::Shutdown => break,
        }
    }
    metrics.lease_held.get_or_create(&labels).set(0);

    // Work has stopped: give the leases up so that the planner moves our clusters at once.
    let _ = planner.await;
    lease_watch.abort();
    lease_stop.cancel();
    let _ = tokio::join!(shard_lease, leader_lease);
    http_stop.cancel();
    if let Ok(Err(e)) = http.await {
        return Err(e).context("metrics and health server");
    }
    info!("stopped");
    Ok(())
}
