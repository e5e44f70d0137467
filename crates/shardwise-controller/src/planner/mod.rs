//! The planner: while this replica holds the planner lease, watch the whole fleet and the shard
//! leases, compute the assignment from that one view, and record it as labels (and drain
//! requests) on clusters and apps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use shard_assign::{Balance, StrategyConfig};
use shardwise_api::keys::{
    DRAIN_TO_ANNOTATION, DRAINED_ANNOTATION, EPOCH_ANNOTATION, HOLDER_ANNOTATION, SHARD_LABEL,
    parse_shard,
};
use shardwise_api::lenient::{Lenient, Undecodable};
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_handoff::drain::PlannerAction;
use shardwise_handoff::plan::{
    AppView, ClusterView, Membership, ObjectKey, PlanError, PlanMemory, plan,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::decode::decode_each;
use crate::membership::ShardLeases;
use crate::metrics::{MemberLabels, Metrics, MoveLabels, NoLabels, ShardLabels, StrategyLabels};
use crate::owner::{condition, key_of, record_of};

/// Concurrent label writes to apps.
const APP_WRITE_CONCURRENCY: usize = 16;

#[allow(missing_debug_implementations)]
struct Planner {
    config: Arc<Config>,
    strategy: StrategyConfig,
    client: Client,
    metrics: Metrics,
    recorder: Recorder,
    clusters: Store<FleetCluster>,
    apps: Store<FleetApp>,
    statefulsets: Store<StatefulSet>,
    leases: Arc<ShardLeases>,
    trigger: Notify,
    /// Whether the missing StatefulSet was already reported.
    missing_statefulset: std::sync::atomic::AtomicBool,
}

impl Planner {
    fn membership(&self, now: Instant) -> Option<Membership> {
        let sts = self.statefulsets.state().into_iter().next()?;
        let expected = sts
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .and_then(|r| u32::try_from(r).ok())
            .unwrap_or(1);
        Some(Membership {
            expected,
            alive: self.leases.alive(now),
        })
    }

    fn views(&self) -> (Vec<ClusterView>, Vec<AppView>) {
        let mut clusters: Vec<ClusterView> = self
            .clusters
            .state()
            .iter()
            .filter(|c| c.meta().deletion_timestamp.is_none())
            .map(|c| ClusterView {
                key: key_of(c.as_ref()),
                uid: c.uid().unwrap_or_default(),
                pin: c.spec.shard,
                weight: c.spec.weight,
                record: record_of(c),
            })
            .collect();
        clusters.sort_by(|a, b| a.key.cmp(&b.key));
        let mut apps: Vec<AppView> = self
            .apps
            .state()
            .iter()
            .map(|a| {
                let key = key_of(a.as_ref());
                AppView {
                    cluster: ObjectKey::new(
                        key.namespace.clone(),
                        a.spec.destination.cluster.clone(),
                    ),
                    key,
                    uid: a.uid().unwrap_or_default(),
                    shard: a.labels().get(SHARD_LABEL).and_then(|v| parse_shard(v)),
                }
            })
            .collect();
        apps.sort_by(|a, b| a.key.cmp(&b.key));
        (clusters, apps)
    }
}

/// The patch of a cluster action. `membership` is the one the action was decided on: it names
/// the identity behind an assignment's holder.
fn cluster_patch(
    action: PlannerAction,
    membership: &Membership,
    resource_version: Option<String>,
) -> Option<Value> {
    let metadata = match action {
        PlannerAction::Keep => return None,
        PlannerAction::Assign { shard, epoch, .. } => json!({
            "labels": {SHARD_LABEL: shard.to_string()},
            "annotations": {
                HOLDER_ANNOTATION: membership.identity(shard),
                EPOCH_ANNOTATION: epoch.to_string(),
                DRAIN_TO_ANNOTATION: null,
                DRAINED_ANNOTATION: null,
            },
        }),
        PlannerAction::RequestDrain { to } => {
            json!({"annotations": {DRAIN_TO_ANNOTATION: to.to_string()}})
        }
        PlannerAction::CancelDrain => json!({"annotations": {DRAIN_TO_ANNOTATION: null}}),
    };
    let mut metadata = metadata;
    // The version the decision was made on: a write based on a stale view fails with 409.
    if let (Some(object), Some(rv)) = (metadata.as_object_mut(), resource_version) {
        object.insert("resourceVersion".into(), Value::String(rv));
    }
    Some(json!({ "metadata": metadata }))
}

/// Runs the planner until `lost` resolves (leadership lost) or `shutdown` is cancelled.
pub async fn run(
    client: Client,
    config: Arc<Config>,
    metrics: Metrics,
    recorder: Recorder,
    leases: Arc<ShardLeases>,
    lost: impl std::future::Future<Output = ()>,
    shutdown: CancellationToken,
) {
    let namespace = config.namespace.clone();
    let statefulset = config.statefulset_name();
    let (clusters, cluster_writer) = reflector::store();
    let (apps, app_writer) = reflector::store();
    let (statefulsets, sts_writer) = reflector::store();
    let planner = Arc::new(Planner {
        strategy: config.strategy_config(),
        config: config.clone(),
        client: client.clone(),
        metrics,
        recorder,
        clusters,
        apps,
        statefulsets,
        leases,
        trigger: Notify::new(),
        missing_statefulset: std::sync::atomic::AtomicBool::new(false),
    });
    planner
        .metrics
        .planner_leader
        .get_or_create(&planner.metrics.shard_labels())
        .set(1);
    info!("planner started");

    let mut tasks = tokio::task::JoinSet::new();
    let cluster_api: Api<Lenient<FleetCluster>> = Api::namespaced(client.clone(), &namespace);
    let app_api: Api<Lenient<FleetApp>> = Api::namespaced(client.clone(), &namespace);
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    // Objects that cannot be read are left out of planning and reported on, one at a time.
    let (unreadable, unreadable_queue) = tokio::sync::mpsc::unbounded_channel();
    {
        let p = planner.clone();
        let unreadable = unreadable.clone();
        let stream = decode_each(
            watcher(cluster_api, watcher::Config::default()),
            planner.clusters.clone(),
            move |bad| {
                let _ = unreadable.send((Unreadable::Cluster, bad.clone()));
            },
        );
        let stream = reflector::reflector(cluster_writer, stream).default_backoff();
        tasks.spawn(async move { trigger_on(stream, &p, "clusters").await });
    }
    {
        let p = planner.clone();
        // The planner needs only where each app goes: manifests and status stay out of memory.
        let stream = decode_each(
            watcher(app_api, watcher::Config::default()),
            planner.apps.clone(),
            move |bad| {
                let _ = unreadable.send((Unreadable::App, bad.clone()));
            },
        )
        .modify(|app: &mut FleetApp| {
            app.spec.source = Default::default();
            app.status = None;
            app.metadata.managed_fields = None;
            app.metadata.annotations = None;
        })
        .default_backoff();
        let stream = reflector::reflector(app_writer, stream);
        tasks.spawn(async move { trigger_on(stream, &p, "apps").await });
    }
    {
        let p = planner.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={statefulset}"));
        let stream = reflector::reflector(sts_writer, watcher(sts_api, config)).default_backoff();
        tasks.spawn(async move { trigger_on(stream, &p, "statefulset").await });
    }
    {
        let p = planner.clone();
        tasks.spawn(async move { plan_loop(&p).await });
    }
    {
        let p = planner.clone();
        tasks.spawn(async move { report_unreadable(&p, unreadable_queue).await });
    }

    tokio::select! {
        _ = lost => warn!("planner lease lost: planner stopped"),
        _ = shutdown.cancelled() => info!("planner stopped for shutdown"),
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    planner
        .metrics
        .planner_leader
        .get_or_create(&planner.metrics.shard_labels())
        .set(0);
    planner.metrics.clear_planner();
}

/// What of an object matters to planning: its spec (generation), labels and annotations.
/// Status writes by the owners, which are most of the events, change none of it.
fn planning_fingerprint<K: Resource>(object: &K) -> (Option<i64>, String) {
    let meta = object.meta();
    let text = format!("{:?}{:?}", meta.labels, meta.annotations);
    (meta.generation, text)
}

/// Triggers a pass when an object appears, goes, or changes in a way that matters to planning.
async fn trigger_on<K, S>(stream: S, planner: &Arc<Planner>, what: &'static str)
where
    K: Resource,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut seen: BTreeMap<ObjectKey, (Option<i64>, String)> = BTreeMap::new();
    let mut relisted: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let key = key_of(&object);
                relisted.insert(key.clone());
                let fingerprint = planning_fingerprint(&object);
                if seen.insert(key, fingerprint.clone()).as_ref() != Some(&fingerprint) {
                    planner.trigger.notify_one();
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                seen.remove(&key_of(&object));
                planner.trigger.notify_one();
            }
            Ok(watcher::Event::Init) => relisted.clear(),
            Ok(watcher::Event::InitDone) => {
                // Objects deleted while the watch was down are not in the new list.
                seen.retain(|key, _| relisted.contains(key));
                planner.trigger.notify_one();
            }
            Err(e) => warn!(what, error = %e, "planner watch failed; retrying"),
        }
    }
}

/// How long between periodic passes: shorter while the fleet is above the target balance.
fn periodic_interval(config: &Config, above_target: bool) -> Duration {
    if above_target {
        config.converge_interval.min(config.plan_interval)
    } else {
        config.plan_interval
    }
}

/// Plans on every trigger (debounced), when a lease may have expired, and periodically.
async fn plan_loop(planner: &Arc<Planner>) {
    // The stores must hold a complete view before the first pass.
    let ready = planner.clusters.wait_until_ready().await.is_ok()
        && planner.apps.wait_until_ready().await.is_ok()
        && planner.statefulsets.wait_until_ready().await.is_ok();
    if !ready {
        return;
    }
    // Every shard lease must have been seen once: an unseen lease would look like a dead shard.
    planner.leases.wait_synced().await;
    let mut memory: Option<PlanMemory> = None;
    let mut last_periodic = Instant::now();
    let mut pins_reported: BTreeSet<(ObjectKey, u32, u32)> = BTreeSet::new();
    // While the fleet is above the strategy's target balance (after a scale-up, say), periodic
    // passes come every converge interval, each spending at most the move budget.
    let mut above_target = false;
    loop {
        let interval = periodic_interval(&planner.config, above_target);
        let periodic = planner.strategy.kind.is_load_aware() && last_periodic.elapsed() >= interval;
        if periodic {
            last_periodic = Instant::now();
        }
        // A periodic pass forgets the previous loads, so that sticky-balanced may spend its
        // budget again while the fleet is above its target balance.
        let remembered = if periodic { None } else { memory.as_ref() };
        match pass(planner, remembered, memory.is_none(), &mut pins_reported).await {
            Ok(Some((m, above))) => {
                memory = Some(m);
                above_target = above;
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, "planning pass failed"),
        }
        let now = Instant::now();
        let next_expiry = planner
            .leases
            .next_expiry(now)
            .map(|at| at + Duration::from_millis(50));
        let periodic_at = last_periodic + periodic_interval(&planner.config, above_target);
        let wake = next_expiry.map_or(periodic_at, |e| e.min(periodic_at));
        tokio::select! {
            _ = planner.leases.changed.notified() => {}
            _ = planner.trigger.notified() => {
                // Debounce bursts of events into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// One planning pass. Returns the memory for the next pass, and whether the plan is above the
/// strategy's target balance.
async fn pass(
    planner: &Arc<Planner>,
    memory: Option<&PlanMemory>,
    first: bool,
    pins_reported: &mut BTreeSet<(ObjectKey, u32, u32)>,
) -> Result<Option<(PlanMemory, bool)>, kube::Error> {
    let strategy_name = planner.strategy.kind.name().to_string();
    planner.leases.confirm_expiries().await?;
    let now = Instant::now();
    let Some(membership) = planner.membership(now) else {
        // Reported once, not at every pass.
        if !planner
            .missing_statefulset
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            warn!(statefulset = %planner.config.statefulset_name(), "StatefulSet not found: not planning");
        }
        return Ok(None);
    };
    planner
        .missing_statefulset
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let metrics = &planner.metrics;
    metrics
        .members
        .get_or_create(&MemberLabels { state: "expected" })
        .set(i64::from(membership.expected));
    metrics
        .members
        .get_or_create(&MemberLabels { state: "live" })
        .set(membership.live().len() as i64);
    let (clusters, apps) = planner.views();
    // A planner that just took over plans as if it had made the current placement itself.
    let takeover;
    let memory = match memory {
        Some(m) => Some(m),
        None if first => {
            takeover = PlanMemory::of_current(&clusters, &apps, &membership);
            Some(&takeover)
        }
        None => None,
    };
    let result = plan(&planner.strategy, &clusters, &apps, &membership, memory);
    let plan = match result {
        Ok(plan) => plan,
        Err(PlanError::NoLiveShards) => {
            metrics
                .planner_runs
                .get_or_create(&StrategyLabels {
                    strategy: strategy_name,
                    result: "no-live-shards",
                })
                .inc();
            debug!(?membership, "no live shard: nothing to plan");
            return Ok(None);
        }
        Err(e) => {
            metrics
                .planner_runs
                .get_or_create(&StrategyLabels {
                    strategy: strategy_name,
                    result: "error",
                })
                .inc();
            warn!(error = %e, "planning failed");
            return Ok(None);
        }
    };

    // Cluster writes first; apps follow only the clusters whose write landed.
    let versions: BTreeMap<ObjectKey, Option<String>> = planner
        .clusters
        .state()
        .iter()
        .map(|c| (key_of(c.as_ref()), c.resource_version()))
        .collect();
    let mut written: BTreeSet<ObjectKey> = BTreeSet::new();
    let mut cluster_moves = 0u64;
    for (key, action) in &plan.cluster_actions {
        let Some(patch) = cluster_patch(*action, &membership, versions.get(key).cloned().flatten())
        else {
            continue;
        };
        let api: Api<FleetCluster> = Api::namespaced(planner.client.clone(), &key.namespace);
        match api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                debug!(cluster = %key, ?action, "cluster updated");
                if let PlannerAction::Assign { shard, .. } = action {
                    info!(cluster = %key, shard, "cluster assigned");
                    cluster_moves += 1;
                }
                written.insert(key.clone());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(cluster = %key, "cluster changed under the planner; next pass retries");
                planner.trigger.notify_one();
            }
            Err(e) => {
                warn!(cluster = %key, error = %e, "could not update cluster");
                planner.trigger.notify_one();
            }
        }
    }
    let labels: Vec<(ObjectKey, u32)> = plan
        .app_labels
        .iter()
        .filter(|l| l.after.as_ref().is_none_or(|c| written.contains(c)))
        .map(|l| (l.app.clone(), l.shard))
        .collect();
    let client = planner.client.clone();
    let app_moves = futures::stream::iter(labels)
        .map(move |(app, shard)| {
            let api: Api<FleetApp> = Api::namespaced(client.clone(), &app.namespace);
            async move {
                let patch = json!({"metadata": {"labels": {SHARD_LABEL: shard.to_string()}}});
                match api
                    .patch(&app.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => 1u64,
                    Err(kube::Error::Api(s)) if s.code == 404 => 0,
                    Err(e) => {
                        warn!(%app, error = %e, "could not label app");
                        0
                    }
                }
            }
        })
        .buffer_unordered(APP_WRITE_CONCURRENCY)
        .fold(0u64, |sum, n| async move { sum + n })
        .await;
    if app_moves < plan.app_labels.len() as u64 {
        planner.trigger.notify_one();
    }

    metrics
        .planner_runs
        .get_or_create(&StrategyLabels {
            strategy: strategy_name.clone(),
            result: "success",
        })
        .inc();
    metrics
        .planner_moves
        .get_or_create(&MoveLabels {
            strategy: strategy_name.clone(),
            kind: "cluster",
        })
        .inc_by(cluster_moves);
    metrics
        .planner_moves
        .get_or_create(&MoveLabels {
            strategy: strategy_name,
            kind: "app",
        })
        .inc_by(app_moves);
    let app_loads: Vec<u64> = plan
        .assignment
        .shard_loads()
        .values()
        .map(|l| l.apps)
        .collect();
    metrics
        .balance
        .get_or_create(&NoLabels {})
        .set(Balance::of_loads(&app_loads).max_over_mean);
    // Shards that left the plan must not keep their last values.
    metrics.assigned_apps.clear();
    metrics.assigned_clusters.clear();
    for (shard, load) in plan.assignment.shard_loads() {
        let labels = ShardLabels {
            shard: shard.to_string(),
        };
        metrics
            .assigned_apps
            .get_or_create(&labels)
            .set(load.apps as i64);
        metrics
            .assigned_clusters
            .get_or_create(&labels)
            .set(load.clusters as i64);
    }
    report_pins(planner, &plan.unhonoured_pins, pins_reported).await;
    let loads: Vec<u64> = plan
        .assignment
        .shard_loads()
        .values()
        .map(|l| l.load)
        .collect();
    let total: u64 = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    let above = planner.strategy.kind.uses_previous()
        && !planner
            .strategy
            .target_balance
            .bounds(max.saturating_mul(loads.len() as u64), total);
    Ok(Some((plan.memory, above)))
}

/// An event on each cluster whose pin cannot be honoured, once per situation.
async fn report_pins(
    planner: &Arc<Planner>,
    pins: &[(ObjectKey, u32, u32)],
    reported: &mut BTreeSet<(ObjectKey, u32, u32)>,
) {
    let current: BTreeSet<(ObjectKey, u32, u32)> = pins.iter().cloned().collect();
    for (key, pin, placed) in current.difference(reported) {
        let Some(cluster) = planner
            .clusters
            .get(&reflector::ObjectRef::new(&key.name).within(&key.namespace))
        else {
            continue;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "PinnedShardNotLive".into(),
            note: Some(format!(
                "pinned to shard {pin}, which is not live; placed on shard {placed} until it returns"
            )),
            action: "Place".into(),
            secondary: None,
        };
        if let Err(e) = planner
            .recorder
            .publish(&event, &cluster.object_ref(&()))
            .await
        {
            debug!(cluster = %key, error = %e, "could not publish event");
        }
    }
    *reported = current;
}

/// The kinds of object the planner reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Unreadable {
    Cluster,
    App,
}

/// The status that says an object cannot be read: `phase` or `syncPhase`, a message, and the
/// kind's condition, all naming the field at fault.
fn unreadable_status(kind: Unreadable, reason: &str) -> Value {
    let message = format!("cannot be read, so shardwise ignores it until it is fixed: {reason}");
    let generation = None;
    match kind {
        Unreadable::Cluster => json!({
            "phase": "Invalid",
            "message": message,
            "conditions": [condition("Ready", false, "InvalidSpec", message.clone(), &[], generation)],
        }),
        Unreadable::App => json!({
            "syncPhase": "Failed",
            "message": message,
            "conditions": [condition("Synced", false, "InvalidSpec", message.clone(), &[], generation)],
        }),
    }
}

/// Gives every object that cannot be read a status and a Warning event saying why, once per
/// generation and reason (the status write itself must not cause another report).
async fn report_unreadable(
    planner: &Arc<Planner>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<(Unreadable, Undecodable)>,
) {
    let mut reported: BTreeSet<(Unreadable, String, Option<i64>, String)> = BTreeSet::new();
    while let Some((kind, bad)) = queue.recv().await {
        let uid = bad.metadata.uid.clone().unwrap_or_default();
        let seen = (kind, uid, bad.metadata.generation, bad.reason.clone());
        if !reported.insert(seen) {
            continue;
        }
        let (Some(name), Some(namespace)) = (&bad.metadata.name, &bad.metadata.namespace) else {
            continue;
        };
        let resource = match kind {
            Unreadable::Cluster => ApiResource::erase::<FleetCluster>(&()),
            Unreadable::App => ApiResource::erase::<FleetApp>(&()),
        };
        warn!(kind = %resource.kind, %namespace, %name, reason = %bad.reason, "object cannot be read: left out of planning");
        let api: Api<DynamicObject> =
            Api::namespaced_with(planner.client.clone(), namespace, &resource);
        let patch = json!({"status": unreadable_status(kind, &bad.reason)});
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(%namespace, %name, error = %e, "could not report an unreadable object");
        }
        let reference = ObjectReference {
            api_version: Some(resource.api_version.clone()),
            kind: Some(resource.kind.clone()),
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            uid: bad.metadata.uid.clone(),
            resource_version: bad.metadata.resource_version.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidSpec".into(),
            note: Some(format!("cannot be read: {}", bad.reason)),
            action: "Read".into(),
            secondary: None,
        };
        if let Err(e) = planner.recorder.publish(&event, &reference).await {
            debug!(%namespace, %name, error = %e, "could not publish event");
        }
    }
}
