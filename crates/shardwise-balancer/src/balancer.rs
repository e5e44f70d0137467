//! The balancer's loop: a Lease, passes while it is held, the writes behind its fence.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures::{FutureExt, StreamExt};
use k8s_openapi::jiff::Timestamp;
use shard_assign::{Hysteresis, StrategyConfig, StrategyKind};
use shardwise_runtime::Nouns;
use shardwise_runtime::http::{self, MetricsAccess, Readiness, auth::KubeReviewer};
use shardwise_runtime::lease::{self, Fence, Holding};
use shardwise_runtime::metrics::{
    MemberLabels, Metrics, PlanGauges, ShardLabels, StrategyLabels, Telemetry,
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::changes;
use crate::controllers::Health;
use crate::metrics::{CoverageMetrics, MeasuredMetrics};
use crate::pass::{self, Inputs, KeyWrite, Pass, Pending};
use shardwise_plan::LiveFleet;
use shardwise_plan::api::Connection;
use shardwise_plan::argocd::PARKED_KEY;
use shardwise_plan::coverage;
use shardwise_plan::installation::{self, ControllerPod};
use shardwise_plan::planning::Current;
use shardwise_plan::read::{ArgoCdQuery, Read, read_argocd};
use shardwise_plan::writer;
use thiserror::Error;

use crate::args::{BalanceArgs, Load};
use crate::handover;
use crate::measured::{self, Meter};
use crate::replicas::{self, Action};
use crate::scrape::Scraper;
use shardwise_scale::{Sizing, Stabilizer, Windows};

/// Argo CD's nouns: its clusters are the units, its Applications the items.
const NOUNS: Nouns = Nouns {
    unit: "cluster",
    units: "clusters",
    item: "app",
    items: "apps",
};
/// The `shard` label of the balancer's metrics: it owns no shard.
const METRICS_LABEL: &str = "argocd-balancer";
/// The strategy's name in the metrics' `strategy` label.
const STRATEGY: StrategyKind = StrategyKind::StickyBalanced;

/// Settings that cannot work together (exit code 2).
#[derive(Debug, Error)]
#[error("{0}")]
pub(crate) struct Refused(String);

/// Runs the balancer until SIGTERM or SIGINT.
pub(crate) fn run(args: &BalanceArgs) -> Result<()> {
    let strategy = args.config(STRATEGY);
    strategy.validate().map_err(|e| Refused(e.to_string()))?;
    let band = args.band().map_err(Refused)?;
    let sizing = args.sizing().map_err(Refused)?;
    shardwise_runtime::logging::init(&args.log, args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(balance(args, strategy, band, sizing))
}

async fn balance(
    args: &BalanceArgs,
    strategy: StrategyConfig,
    band: Hysteresis,
    sizing: Sizing,
) -> Result<()> {
    let listeners = http::Listeners::bind(args.metrics_addr, args.health_addr).await?;
    let connection = Connection::new(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let stop = CancellationToken::new();
    on_signal(stop.clone())?;

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::planner_only(METRICS_LABEL, NOUNS, &mut registry);
    let coverage = CoverageMetrics::register(&mut registry);
    let measured_metrics = MeasuredMetrics::register(&mut registry);
    let telemetry = Telemetry {
        registry: std::sync::Arc::new(registry),
        metrics: metrics.clone(),
    };
    let readiness = Readiness::default();
    let server = tokio::spawn(http::serve(
        listeners,
        MetricsAccess::<KubeReviewer>::Open,
        telemetry,
        readiness.clone(),
        stop.clone(),
    ));

    let name = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "balancer".into());
    let identity = format!("{name}_{:016x}", rand::random::<u64>());
    let (holding_tx, holding) = watch::channel(Holding::NotHeld);
    // One writer per Argo CD installation: the Lease is in Argo CD's namespace, whatever the
    // balancer's release is called; `plan --apply` takes the same one.
    let lease_task = tokio::spawn(lease::hold(
        connection.client().clone(),
        args.namespace.clone(),
        writer::writer_lease(identity.clone()),
        holding_tx,
        stop.clone(),
    ));
    // Ready once serving: a standby that waits for the Lease is as ready as the one holding it.
    readiness.set(true);
    info!(
        namespace = %args.namespace,
        lease = %format!("{}/{}", args.namespace, writer::WRITER_LEASE),
        %identity,
        interval_seconds = args.interval,
        dry_run = args.dry_run,
        "balancer started: waiting for the lease"
    );

    let changes = changes::workload(connection.client(), &args.namespace, &args.statefulset);
    let mut balancer = Balancer {
        args,
        strategy,
        connection,
        metrics,
        reported: BTreeSet::new(),
        health: Health::default(),
        band,
        coverage,
        meter: Meter::new(Duration::from_secs(args.load_window.into())),
        measured_metrics,
        sizing,
        stabilizer: stabilizer(args),
        started: Instant::now(),
        scraper: Scraper::new(args.controller_metrics_port),
        changes,
    };
    loop {
        let held = tokio::select! {
            _ = stop.cancelled() => break,
            held = lease::until_held(holding.clone()) => held,
        };
        let Ok(incarnation) = held else {
            break;
        };
        // A leader starts from what it sees itself: since when shards are down and pods Ready,
        // and the needs behind the replica count, are timed afresh (late, never early).
        balancer.health = Health::default();
        balancer.stabilizer = stabilizer(args);
        let fence = Fence::new(holding.clone(), incarnation);
        balancer
            .metrics
            .planner_leader
            .get_or_create(&ShardLabels {
                shard: METRICS_LABEL.into(),
            })
            .set(1);
        info!("lease held: balancing");
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = lease::until_lost(holding.clone(), incarnation) => warn!("lease lost: balancing stopped"),
            _ = balancer.passes(&fence) => {}
        }
        balancer
            .metrics
            .planner_leader
            .get_or_create(&ShardLabels {
                shard: METRICS_LABEL.into(),
            })
            .set(0);
        balancer.metrics.clear_planner();
        balancer.coverage.clear();
        balancer.measured_metrics.clear();
        if stop.is_cancelled() {
            break;
        }
    }
    info!("stopping");
    stop.cancel();
    lease_task.await.context("the lease task failed")?;
    server
        .await
        .context("the HTTP server failed")?
        .context("cannot serve /metrics and the probes")?;
    Ok(())
}

/// The replica count's stabilizer under `--manage-replicas`: up at once, down after the
/// window.
fn stabilizer(args: &BalanceArgs) -> Stabilizer {
    Stabilizer::new(Windows {
        up: Duration::ZERO,
        down: Duration::from_secs(args.scale_down_window.into()),
    })
}

/// Cancels `token` on SIGTERM or SIGINT.
fn on_signal(token: CancellationToken) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

/// How long a handover waits for the controllers to let a parked cluster go before it writes
/// the new key anyway. A controller sees a key change within a second as a rule and within
/// 14 s on a machine loaded past its cores (measured on Argo CD v3.2.11, docs/argocd.md);
/// past that, a controller that still lists the cluster has stopped reading keys, and leaving
/// the cluster parked would leave it unowned for as long.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a pass woken by a change of the controller's workload waits for the changes that
/// come with it (a rollout changes the StatefulSet's status a few times in a second).
const CHANGES_SETTLE: Duration = Duration::from_millis(250);
/// How soon a handover asks the controllers again whether they have let go, at first: the
/// apps are unowned from the moment their holder lets go until the new key is written, and a
/// controller lets go within tens of milliseconds as a rule. Each later ask waits twice as
/// long, up to [`HANDOVER_POLL_MAX`], so a slow controller is not scraped ten times a second
/// (a scrape renders one series per app it owns).
const HANDOVER_POLL_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two asks of a handover.
const HANDOVER_POLL_MAX: Duration = Duration::from_millis(500);

/// The error of a write refused because the Lease is lost, naming what was written.
fn lost(e: impl std::fmt::Display, written: &[String]) -> anyhow::Error {
    anyhow!(
        "the balancer's lease is lost ({e}): stopped after writing [{}]",
        written.join(" ")
    )
}

/// The error of a write that failed, naming what was written before it.
fn failed(e: shardwise_plan::api::WriteError, w: &KeyWrite, written: &[String]) -> anyhow::Error {
    anyhow::Error::from(e).context(format!(
        "cannot write the shard key of Secret {:?}: stopped after writing [{}]",
        w.target.secret,
        written.join(" ")
    ))
}

struct Balancer<'a> {
    args: &'a BalanceArgs,
    strategy: StrategyConfig,
    connection: Connection,
    metrics: Metrics,
    /// The messages of the last pass, so that each is logged once while it lasts.
    reported: BTreeSet<String>,
    /// Since when each shard has had no Ready controller.
    health: Health,
    /// Whether a rebalance is under way, as the last pass left it.
    band: Hysteresis,
    /// Which clusters a live controller reconciles, as last read.
    coverage: CoverageMetrics,
    /// With `--load measured`: what each cluster costs its controller, smoothed.
    meter: Meter,
    /// With `--load measured`: what the last pass measured.
    measured_metrics: MeasuredMetrics,
    /// With `--manage-replicas`: the replicas a load needs.
    sizing: Sizing,
    /// With `--manage-replicas`: the count to set from the needs seen.
    stabilizer: Stabilizer,
    /// The stabilizer's clock's origin.
    started: Instant,
    /// Reads the controllers' metrics: measured load, drains and handovers.
    scraper: Scraper,
    /// Changes of the controller's StatefulSet or Deployment.
    changes: changes::Changes,
}

/// The controller's StatefulSet under `--manage-replicas`, as one pass read it.
struct Managed {
    set: k8s_openapi::api::apps::v1::StatefulSet,
    workload: replicas::Workload,
    /// The replica count the load needs, stabilized.
    wanted: u32,
}

impl Managed {
    /// The count keys are placed for: the one wanted, unless the StatefulSet cannot be
    /// changed (then its own: no shard is emptied for a change that cannot happen).
    fn target(&self) -> u32 {
        if self.workload.rolling {
            self.wanted
        } else {
            self.workload.replicas
        }
    }

    /// The next step of the change, from the pods as read at `now` and what each listed. A
    /// pod holds apps while it lists one of a cluster the balancer moves: the apps of one it
    /// cannot move (Argo CD's own cluster without a Secret, a Secret that keeps its key) wait
    /// for their pod's restart.
    fn plan(
        &self,
        read: (&LiveFleet, &[k8s_openapi::api::core::v1::Secret]),
        pods: &[shardwise_plan::installation::ControllerPod],
        listed: &BTreeMap<String, BTreeSet<String>>,
        health: &Health,
        now: Instant,
    ) -> replicas::Plan {
        let (fleet, secrets) = read;
        let movable = pass::movable(secrets, fleet);
        let balanced: BTreeSet<String> = fleet
            .cluster_apps
            .iter()
            .filter(|(id, _)| movable.contains(*id))
            .flat_map(|(_, apps)| apps)
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect();
        let pods: Vec<replicas::Pod> = pods
            .iter()
            .filter_map(|p| {
                let ordinal = p.ordinal()?;
                Some(replicas::Pod {
                    ordinal,
                    count: p.replicas,
                    updated: self
                        .workload
                        .update_revision
                        .as_ref()
                        .is_none_or(|r| p.revision.as_ref() == Some(r)),
                    settled: p.ready && !p.terminating && health.settled(p, now, replicas::SETTLE),
                    // A pod above its own count serves shard 0 beside shard 0's pod: what it
                    // lists is not its shard's, and replacing it leaves nothing unowned.
                    holding: p.shard == Some(ordinal)
                        && listed
                            .get(&p.uid)
                            .is_none_or(|apps| !apps.is_disjoint(&balanced)),
                })
            })
            .collect();
        let keyed: BTreeSet<_> = fleet
            .clusters
            .iter()
            .filter(|c| movable.contains(&c.id))
            .filter_map(|c| c.pin)
            .collect();
        replicas::plan(self.wanted, &self.workload, &pods, &keyed)
    }

    /// The clusters the balancer cannot move whose apps `change` leaves unowned: those listed
    /// by a pod it restarts (the partition lowered past its ordinal) or removes (at or above
    /// the new count), as "name (apps) on pod ordinal", in name order.
    fn stranded(
        &self,
        change: replicas::Change,
        read: (&LiveFleet, &[k8s_openapi::api::core::v1::Secret]),
        pods: &[shardwise_plan::installation::ControllerPod],
        listed: &BTreeMap<String, BTreeSet<String>>,
    ) -> Vec<String> {
        let (fleet, secrets) = read;
        let movable = pass::movable(secrets, fleet);
        let affected = replicas::restarted(&self.workload, change);
        let mut stranded = Vec::new();
        for cluster in fleet.clusters.iter().filter(|c| !movable.contains(&c.id)) {
            let apps: BTreeSet<String> = fleet
                .cluster_apps
                .get(&cluster.id)
                .into_iter()
                .flatten()
                .map(|(namespace, name)| format!("{namespace}/{name}"))
                .collect();
            for pod in pods {
                let Some(ordinal) = pod.ordinal() else {
                    continue;
                };
                let held = listed
                    .get(&pod.uid)
                    .map_or(0, |l| l.intersection(&apps).count());
                if affected.contains(&ordinal) && held > 0 {
                    stranded.push(format!("{} ({held} apps) on pod {ordinal}", cluster.name));
                }
            }
        }
        stranded
    }
}

/// How long the balancer lets Argo CD's controllers see new keys before it refreshes the moved
/// clusters' Applications.
const KEYS_BEFORE_REFRESH: Duration = Duration::from_secs(1);

impl Balancer<'_> {
    /// A pass every `--interval`, and one as soon as the controller's workload changes (a
    /// burst of changes, as a rollout makes, is met by one pass), until cancelled from outside.
    async fn passes(&mut self, fence: &Fence) {
        let mut ticks = tokio::time::interval(Duration::from_secs(self.args.interval.into()));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                Some(()) = self.changes.next() => {
                    tokio::time::sleep(CHANGES_SETTLE).await;
                    while let Some(Some(())) = self.changes.next().now_or_never() {}
                    debug!("the controller's workload changed: a pass now");
                    ticks.reset();
                }
            }
            if let Err(e) = self.pass(fence).await {
                warn!(error = %format!("{e:#}"), "balancing pass failed; trying again at the next one");
                self.metrics
                    .planner_runs
                    .get_or_create(&StrategyLabels {
                        strategy: STRATEGY.to_string(),
                        result: "error",
                    })
                    .inc();
            }
        }
    }

    async fn pass(&mut self, fence: &Fence) -> Result<()> {
        let args = self.args;
        let query = ArgoCdQuery {
            namespace: &args.namespace,
            workload: &args.statefulset,
            replicas: None,
            current_strategy: args.current_strategy,
            app_namespaces: &args.app_namespaces,
            load: args.load.into(),
            tuning: self.strategy,
            controller_pods: true,
        };
        let Read {
            mut fleet,
            replicas,
            replicas_origin,
            to,
            current,
            secrets,
            controller_pods,
            controller_selector,
            workload,
            ..
        } = read_argocd(&query, &self.connection).await?;
        let mut messages: Vec<(bool, String)> =
            fleet.notes.iter().map(|n| (false, n.clone())).collect();
        messages.extend(fleet.warnings.iter().map(|w| (true, w.clone())));
        self.metrics
            .members
            .get_or_create(&MemberLabels { state: "expected" })
            .set(i64::from(replicas));
        if let (Current::Computed(algorithm), Some(Ok(pods))) = (&current, &controller_pods) {
            let coverage = coverage::coverage(&fleet, algorithm, pods)?;
            self.coverage.set(&coverage);
            for cluster in coverage.unreconciled() {
                let why = cluster.why.as_deref().unwrap_or_default();
                messages.push((
                    true,
                    format!(
                        "cluster {:?}: no controller reconciles its {} Application(s): {why}",
                        cluster.name, cluster.apps
                    ),
                ));
            }
        } else {
            self.coverage.clear();
        }
        if let Some(pods) = to.filter(|_| replicas <= 1) {
            // Argo CD that does not shard reconciles every cluster on every pod: keys would
            // mean nothing now and pin everything to shard 0 once it shards.
            messages.push((true, format!(
                "Argo CD does not shard ({replicas_origin}) though it runs {pods} pods: nothing to balance until ARGOCD_CONTROLLER_REPLICAS is set"
            )));
            self.report(messages);
            return Ok(());
        }
        let Current::Computed(algorithm) = current else {
            return Err(anyhow!("Argo CD's algorithm could not be read"));
        };
        let workload = workload.as_deref().unwrap_or(&args.statefulset);
        let pods = match controller_pods {
            Some(Ok(pods)) => pods,
            Some(Err(e)) => {
                return Err(anyhow!(
                    "the pods of Argo CD's application controller ({workload}) could not be listed: {e}"
                ));
            }
            None => {
                return Err(anyhow!(
                    "the pods of Argo CD's application controller ({workload}) could not be read: its selector is unknown"
                ));
            }
        };
        // What each controller pod reconciles, by UID (absent: not read): whether a pod about
        // to restart still holds apps.
        let mut listed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let scraped = if args.load == Load::Measured || args.manage_replicas {
            let mut scraped = self.scraper.controllers(&pods).await;
            for (uid, scrape) in &mut scraped.scrapes {
                listed.insert(uid.clone(), std::mem::take(&mut scrape.apps));
            }
            Some(scraped)
        } else {
            None
        };
        if let Some(scraped) = &scraped {
            let consequence = match (args.load == Load::Measured, args.manage_replicas) {
                (true, true) => {
                    "this pass measures its clusters as before, and --manage-replicas takes its pod to still hold them"
                }
                (true, false) => "this pass measures its clusters as before",
                _ => "--manage-replicas takes its pod to still hold its clusters",
            };
            messages.extend(scraped.failed.iter().map(|f| {
                (
                    false,
                    format!("a controller's metrics could not be read, so {consequence}: {f}"),
                )
            }));
        }
        if let Some(scraped) = scraped.filter(|_| args.load == Load::Measured) {
            self.meter.observe(scraped.scrapes, Instant::now());
            let weighing = measured::weigh(&mut fleet, &self.meter, args.load_memory_weight);
            debug!(?weighing, "clusters weighed by their measured cost");
            let weights: Vec<(String, Option<u32>)> = fleet
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.weight))
                .collect();
            self.measured_metrics.set(
                &weights,
                (weighing.measured, weighing.objects),
                scraped.failed.len(),
            );
            messages.extend(weighing.fallback.map(|why| (false, why)));
        }
        let managed = if args.manage_replicas {
            self.manage(&fleet, &mut messages).await?
        } else {
            None
        };
        let now = Instant::now();
        let mut shards = self.health.observe(
            managed.as_ref().map_or(replicas, Managed::target),
            &pods,
            now,
            Duration::from_secs(args.down_grace.into()),
        );
        let step = managed.map(|m| {
            let step = m.plan((&fleet, &secrets), &pods, &listed, &self.health, now);
            let agreed = shards.agreed;
            for &shard in step.draining.iter().filter(|&&s| s < agreed) {
                shards.drain(shard);
            }
            (m, step)
        });
        let pass = pass::decide(&Inputs {
            fleet: &fleet,
            secrets: &secrets,
            algorithm: &algorithm,
            shards: &shards,
            strategy: &self.strategy,
            band: self.band,
            damping: &args.damping(),
            now: Timestamp::now(),
        })?;
        self.band = pass.band;
        if pass.held_back > 0 {
            messages.push((false, format!(
                "{} cluster(s) would move but moved less than --min-move-interval ({} s) ago, have a sync running (--sync-wait, {} s) or weigh more than --hourly-move-budget ({} %) has left this hour",
                pass.held_back, args.min_move_interval, args.sync_wait, args.hourly_move_budget
            )));
        }
        messages.extend(pass.left_out.iter().map(|l| (false, l.clone())));
        messages.extend(
            pass.held
                .iter()
                .map(|why| (true, format!("nothing written: {why}"))),
        );
        for shard in &shards.dead {
            messages.push((true, format!(
                "no Ready controller has served shard {shard} for {} s or more (--down-grace): its clusters are moved to Ready shards until it is back",
                args.down_grace
            )));
        }
        let change = match step {
            Some((managed, step)) => match step.action {
                Action::Steady => None,
                Action::Wait(why) => {
                    messages.push((false, format!("--manage-replicas: waiting: {why}")));
                    None
                }
                Action::Refuse(why) => {
                    messages.push((
                        true,
                        format!("--manage-replicas: the replica count is left alone: {why}"),
                    ));
                    None
                }
                Action::Write(change) => {
                    let stranded = managed.stranded(change, (&fleet, &secrets), &pods, &listed);
                    if !stranded.is_empty() {
                        messages.push((true, format!(
                            "--manage-replicas: cannot move {} (no cluster Secret, or one that keeps its key): their apps are unowned while the pod restarts or goes; a Secret for the in-cluster cluster lets the balancer move it",
                            stranded.join(", ")
                        )));
                    }
                    Some((managed, change))
                }
            },
            None => None,
        };
        self.report(messages);
        let refreshing = self.args.refresh_moved_apps && !self.args.dry_run;
        let selector = controller_selector.as_deref();
        let (moved, mut written) = self
            .write(&pass, (&fleet, &pods, selector), fence, refreshing)
            .await;
        self.record(&pass);
        if refreshing {
            // Those written before a failure too: their refresh is due all the same.
            self.refresh(&pass.pending, moved, &fleet, fence).await;
        }
        if let (Some((managed, change)), Ok(())) = (change, &written) {
            written = self.change_replicas(&managed, change, fence).await;
        }
        written
    }

    /// With `--manage-replicas`: the controller's StatefulSet and the count its load needs, or
    /// `None` (and a message) when there is no StatefulSet to manage.
    async fn manage(
        &mut self,
        fleet: &LiveFleet,
        messages: &mut Vec<(bool, String)>,
    ) -> Result<Option<Managed>> {
        let args = self.args;
        let Some(set) = self
            .connection
            .statefulset(&args.namespace, &args.statefulset)
            .await?
        else {
            messages.push((true, format!(
                "--manage-replicas: no StatefulSet {}/{} (dynamic cluster distribution runs a Deployment): the replica count is left alone",
                args.namespace, args.statefulset
            )));
            return Ok(None);
        };
        let workload = replicas::Workload::of(&set);
        // The load in the unit of --load: measured weights are thousandths of an average app.
        let load: f64 = fleet
            .clusters
            .iter()
            .map(|c| match (args.load, c.weight) {
                (Load::Measured, Some(w)) => c.apps as f64 * f64::from(w) / 1000.0,
                _ => c.load() as f64,
            })
            .sum();
        let current = workload.replicas;
        let needed = self.sizing.needed(load, current);
        let wanted = self
            .stabilizer
            .recommend(self.started.elapsed(), needed, current);
        self.metrics.set_desired_replicas(wanted);
        Ok(Some(Managed {
            set,
            workload,
            wanted,
        }))
    }

    /// Writes `change` to the controller's StatefulSet, behind the fence.
    async fn change_replicas(
        &self,
        managed: &Managed,
        change: replicas::Change,
        fence: &Fence,
    ) -> Result<()> {
        let args = self.args;
        let what = format!(
            "StatefulSet {}/{}: replicas and {} {}, partition {}{}",
            args.namespace,
            args.statefulset,
            shardwise_plan::installation::REPLICAS_ENV,
            change.replicas,
            change.partition,
            if change.changing { "" } else { ", change over" }
        );
        if args.dry_run {
            info!("dry run: would set {what}");
            return Ok(());
        }
        if fence.check().is_err() {
            return Err(anyhow!("the balancer's lease is lost: {what} not written"));
        }
        let sets: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
            kube::Api::namespaced(self.connection.client().clone(), &args.namespace);
        sets.patch(
            &args.statefulset,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(replicas::patch(&managed.set, change)),
        )
        .await
        .with_context(|| format!("cannot write {what}"))?;
        info!(
            from = managed.workload.replicas,
            to = managed.wanted,
            "--manage-replicas: set {what}"
        );
        Ok(())
    }

    /// Asks Argo CD to refresh the Applications of the clusters moved (`moved`, this pass's
    /// moves, by id: their Secret and its resourceVersion after the write) and of those whose
    /// Secret still says a refresh is pending (`pending`: a move of an earlier pass, or of a
    /// balancer stopped or deposed before its refresh), behind the fence. The controller that
    /// takes a cluster over reconciles its apps only at its next resync otherwise (measured on
    /// Argo CD v3.2.11: about 1.5 times --app-resync, against under a second refreshed). Once
    /// every app of a cluster is refreshed, its [`pass::REFRESH_PENDING_ANNOTATION`] goes; one
    /// that failed stays pending, and the next pass tries again.
    async fn refresh(
        &self,
        pending: &[Pending],
        moved: BTreeMap<String, (String, String)>,
        fleet: &LiveFleet,
        fence: &Fence,
    ) {
        if shardwise_runtime::failpoints::seeded(
            shardwise_runtime::failpoints::SKIP_BALANCER_REFRESH,
        ) {
            return;
        }
        let fresh = !moved.is_empty();
        let mut due: BTreeMap<String, (String, String)> = pending
            .iter()
            .map(|p| (p.id.clone(), (p.secret.clone(), p.resource_version.clone())))
            .collect();
        due.extend(moved);
        if due.is_empty() {
            return;
        }
        if fresh {
            // Each controller sees the keys and the Applications through informers of their
            // own: a refresh seen before the key would be taken (and cleared) by the old owner.
            // The informers deliver within milliseconds; a second is a wide margin.
            tokio::time::sleep(KEYS_BEFORE_REFRESH).await;
        }
        let (mut refreshed, mut clusters) = (0, 0);
        for (id, (secret, version)) in &due {
            let mut failed = false;
            for (namespace, name) in fleet.cluster_apps.get(id).into_iter().flatten() {
                if fence.check().is_err() {
                    return;
                }
                match self.connection.refresh_application(namespace, name).await {
                    Ok(()) => refreshed += 1,
                    Err(e) => {
                        failed = true;
                        warn!(application = %format!("{namespace}/{name}"), error = %e, "could not ask Argo CD to refresh a moved application; trying again at the next pass");
                    }
                }
            }
            if failed || fence.check().is_err() {
                continue;
            }
            let done = BTreeMap::from([(pass::REFRESH_PENDING_ANNOTATION.to_string(), None)]);
            match self
                .connection
                .annotate_secret(&self.args.namespace, secret, version, &done)
                .await
            {
                Ok(_) => clusters += 1,
                Err(e) => {
                    warn!(secret = %secret, error = %e, "could not record a moved cluster's refresh as done; it is refreshed again at the next pass")
                }
            }
        }
        if refreshed > 0 {
            info!(
                applications = refreshed,
                clusters, "asked Argo CD to refresh the moved clusters' applications"
            );
        }
    }

    /// Writes the pass's keys, one at a time, each behind the fence: a balancer that lost its
    /// Lease sends nothing more. A cluster a live controller may have now is handed over
    /// ([`handover`]): its key parked first, and written once no controller of `pods` (listed
    /// again with `selector` while it waits) lists its apps. A write that moves a cluster
    /// marks its refresh pending in the same patch when `refreshing`. Stops at the first
    /// failure (the next pass reads anew, and completes any handover left parked); returns
    /// the moves written, by cluster id (the Secret and its new resourceVersion), and how it
    /// ended.
    async fn write(
        &self,
        pass: &Pass,
        (fleet, pods, selector): (&LiveFleet, &[ControllerPod], Option<&str>),
        fence: &Fence,
        refreshing: bool,
    ) -> (BTreeMap<String, (String, String)>, Result<()>) {
        let mut moved = BTreeMap::new();
        if pass.writes.is_empty() {
            debug!(balance = pass.balance, "balanced: nothing to write");
            return (moved, Ok(()));
        }
        let shown = |w: &KeyWrite| format!("{}={}", w.target.secret, w.shard);
        if self.args.dry_run {
            let shown: Vec<String> = pass.writes.iter().map(shown).collect();
            info!(
                writes = %shown.join(" "),
                moved_clusters = pass.moved_clusters,
                balance = pass.balance,
                "dry run: would write these shard keys"
            );
            return (moved, Ok(()));
        }
        let mut written: Vec<String> = Vec::new();
        // Parked: by cluster id, the write and the Secret's resourceVersion since the park.
        let mut parked: BTreeMap<String, (&KeyWrite, String)> = BTreeMap::new();
        for w in &pass.writes {
            if let Err(e) = fence.check() {
                return (moved, Err(lost(e, &written)));
            }
            if w.handover {
                match self
                    .connection
                    .park_key(
                        &self.args.namespace,
                        &w.target.secret,
                        &w.target.resource_version,
                        w.shard,
                    )
                    .await
                {
                    Ok(version) => {
                        parked.insert(w.target.id.clone(), (w, version));
                        written.push(format!("{}={PARKED_KEY}", w.target.secret));
                    }
                    Err(e) => return (moved, Err(failed(e, w, &written))),
                }
                continue;
            }
            if let Err(e) = self
                .finish(w, &w.target.resource_version, refreshing, &mut moved)
                .await
            {
                return (moved, Err(failed(e, w, &written)));
            }
            written.push(shown(w));
        }
        let parked_at = Instant::now();
        let mut poll = HANDOVER_POLL_FIRST;
        let mut waiting: BTreeSet<String> = parked.keys().cloned().collect();
        while !waiting.is_empty() {
            if let Err(e) = fence.check() {
                return (moved, Err(lost(e, &written)));
            }
            let listed = match selector {
                Some(selector) => self
                    .connection
                    .pods(&self.args.namespace, selector)
                    .await
                    .map(|p| {
                        p.iter()
                            .map(|p| installation::statefulset_pod(p, &BTreeMap::new()))
                            .collect()
                    }),
                None => Ok(pods.to_vec()),
            };
            // Pods that cannot be listed again: those read at the pass's start.
            let pods = listed.unwrap_or_else(|e| {
                warn!(error = %e, "cannot list Argo CD's controller pods again during a handover; asking those read at the pass's start");
                pods.to_vec()
            });
            let scraped = self.scraper.pods(&pods.iter().collect::<Vec<_>>()).await;
            let mut holding = handover::holders(&waiting, fleet, &pods, &scraped);
            let late = parked_at.elapsed() >= HANDOVER_TIMEOUT;
            if late {
                for (id, why) in &holding {
                    warn!(
                        secret = %parked[id].0.target.secret,
                        holders = %why.join("; "),
                        "a parked cluster is still held {} s after its handover began: its new key is written anyway, and until the holder lets go two controllers may reconcile it",
                        HANDOVER_TIMEOUT.as_secs()
                    );
                }
                holding.clear();
            }
            for id in waiting.iter().filter(|id| !holding.contains_key(*id)) {
                let (w, version) = &parked[id];
                if let Err(e) = fence.check() {
                    return (moved, Err(lost(e, &written)));
                }
                if let Err(e) = self.finish(w, version, refreshing, &mut moved).await {
                    return (moved, Err(failed(e, w, &written)));
                }
                written.push(shown(w));
                debug!(secret = %w.target.secret, shard = w.shard, unowned_seconds = parked_at.elapsed().as_secs_f64(), "handed over");
            }
            waiting = holding.into_keys().collect();
            if !waiting.is_empty() {
                tokio::time::sleep(poll).await;
                poll = (poll * 2).min(HANDOVER_POLL_MAX);
            }
        }
        info!(
            writes = %written.join(" "),
            moved_clusters = pass.moved_clusters,
            moved_apps = pass.moved_apps,
            handed_over = parked.len(),
            handover_seconds = if parked.is_empty() { 0.0 } else { parked_at.elapsed().as_secs_f64() },
            balance = pass.balance,
            "shard keys written"
        );
        (moved, Ok(()))
    }

    /// Writes `w`'s key on condition of `version`, with its annotations; records it in `moved`
    /// when its refresh is due.
    async fn finish(
        &self,
        w: &KeyWrite,
        version: &str,
        refreshing: bool,
        moved: &mut BTreeMap<String, (String, String)>,
    ) -> Result<(), shardwise_plan::api::WriteError> {
        let version = self
            .connection
            .write_key(
                &self.args.namespace,
                &w.target.secret,
                version,
                Some(w.shard),
                &w.annotations(refreshing),
            )
            .await?;
        if w.moves && refreshing {
            moved.insert(w.target.id.clone(), (w.target.secret.clone(), version));
        }
        Ok(())
    }

    fn record(&self, pass: &Pass) {
        let (clusters, apps) = if self.args.dry_run {
            (0, 0)
        } else {
            (pass.moved_clusters, pass.moved_apps)
        };
        self.metrics
            .count_pass(&STRATEGY.to_string(), clusters, apps);
        self.metrics.set_plan(&PlanGauges {
            balance: pass.balance,
            shards: &pass.shards,
            cache_copies: 0,
            cut_units: 0,
        });
    }

    /// Logs each of a pass's messages (`true`: a warning) once while it lasts: a message that
    /// goes away and comes back is logged again.
    fn report(&mut self, messages: Vec<(bool, String)>) {
        let mut current = BTreeSet::new();
        for (warning, message) in messages {
            if !self.reported.contains(&message) {
                if warning {
                    warn!("{message}");
                } else {
                    info!("{message}");
                }
            }
            current.insert(message);
        }
        self.reported = current;
    }
}
