//! The planner: while this replica holds the planner lease, watch every unit and item, the
//! StatefulSet and the shard leases; decide each pass from that one view ([`decide`]), write
//! the decision, and record its figures. The decisions are pure code ([`index`], [`decide`]);
//! this module only watches, calls them, writes and counts.

pub mod decide;
pub mod figures;
pub mod index;
mod item_writes;
pub mod measured;
mod report;
pub(crate) mod scaling;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::Expression;
use kube::{Api, Client};
use kube_runtime::events::Recorder;
use kube_runtime::{WatchStreamExt, watcher};
use shard_assign::KeyRange;
use shardwise_handoff::drain::PlannerAction;
use shardwise_handoff::keys::{STATEFULSET_LABEL, UNIT_LABEL, unit_token};
use shardwise_handoff::plan::{Membership, ObjectKey, PlanError, PlanMemory};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::layout::Layout;
use crate::load::MeasuredLoads;
use crate::membership::{ShardLeases, expected_shards};
use crate::metrics::{
    DirectionLabels, MemberLabels, Metrics, NoLabels, PlanGauges, StrategyLabels,
};
use crate::objects::Object;
use crate::objects::{api_over, key_of, merge_patch, metadata_api_over, unpaged};
use crate::settings::{LoadModel, PlannerSettings, Replica, ScaleSettings, WatchScope};
use crate::sharded::{ObjectKind, Sharded};
use crate::slice::UnitSlice;
use decide::{
    ControlPlaneWrite, Decision, ItemWrite, PassMemory, PlacementRules, RecordWrite, decide,
};
use index::{Index, ItemMeta, SliceEntry, UnitEntry, unlabelled_unit};
use item_writes::ItemWrites;
use measured::{AVERAGE_WEIGHT, LoadFigures, MeasuredModel, PassLoads, copy_cost};
use report::Reporter;
use scaling::{Demand, Progress, Scaler, Unsettled};

/// Concurrent label writes to items.
const ITEM_WRITE_CONCURRENCY: usize = 16;
/// Units whose records are written at once (each unit's own records one after another).
const RECORD_WRITE_CONCURRENCY: usize = 16;

/// What a planner term is built from.
#[derive(Clone)]
pub(crate) struct PlannerParts {
    /// The control plane, behind the planner lease's fence.
    pub client: Client,
    pub settings: PlannerSettings,
    pub replica: Replica,
    pub scope: WatchScope,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub leases: Arc<ShardLeases>,
    /// How the objects make units and items.
    pub layout: Layout,
}

impl std::fmt::Debug for PlannerParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannerParts")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

struct Planner<C: Sharded> {
    parts: PlannerParts,
    index: Mutex<Index>,
    trigger: Notify,
    item_writes: ItemWrites,
    reporter: Reporter<C>,
}

impl<C: Sharded> Planner<C> {
    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `update` to the index and plans again if it says so.
    fn update(&self, update: impl FnOnce(&mut Index) -> bool) {
        if update(&mut self.index()) {
            self.trigger.notify_one();
        }
    }
}

/// Runs the planner until `lost` resolves (leadership lost) or `shutdown` is cancelled.
pub(crate) async fn run<C: Sharded>(
    parts: PlannerParts,
    lost: impl std::future::Future<Output = ()>,
    shutdown: CancellationToken,
) {
    let metrics = parts.metrics.clone();
    let layout = parts.layout;
    let index = match layout {
        Layout::UnitsAndItems => Index::default(),
        Layout::OwnObjects => Index::of_own_objects(),
        Layout::KeyRanges => Index::of_key_ranges(),
    };
    let planner = Arc::new(Planner::<C> {
        reporter: Reporter::new(parts.client.clone(), parts.recorder.clone()),
        parts,
        index: Mutex::new(index),
        trigger: Notify::new(),
        item_writes: ItemWrites::default(),
    });
    metrics
        .planner_leader
        .get_or_create(&metrics.shard_labels())
        .set(1);
    info!("planner started");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(follow_units(planner.clone()));
    match layout {
        Layout::UnitsAndItems => {
            tasks.spawn(follow_items(planner.clone()));
            tasks.spawn(follow_unlabelled(planner.clone()));
        }
        // Every object is an item of the one unit: none needs its unit from its spec.
        Layout::KeyRanges => {
            tasks.spawn(follow_items(planner.clone()));
        }
        Layout::OwnObjects => {}
    }
    tasks.spawn(follow_slices(planner.clone()));
    tasks.spawn(follow_statefulset(planner.clone()));
    tasks.spawn(plan_loop(planner.clone()));
    tasks.spawn(write_items(planner.clone()));
    {
        let planner = planner.clone();
        tasks.spawn(async move { planner.reporter.report_unreadable().await });
    }
    tokio::select! {
        _ = lost => warn!("planner lease lost: planner stopped"),
        _ = shutdown.cancelled() => info!("planner stopped for shutdown"),
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    metrics
        .planner_leader
        .get_or_create(&metrics.shard_labels())
        .set(0);
    metrics.clear_planner();
}

/// Feeds a watch of `K` to the index: readable objects through `apply`/`relisted`, objects that
/// cannot be read are left out (as if deleted) and reported.
async fn follow<C: Sharded, K: Object>(
    planner: Arc<Planner<C>>,
    kind: ObjectKind,
    scope: &WatchScope,
    config: watcher::Config,
    handle: impl Fn(&mut Index, Change<K>) -> bool,
) {
    let api = api_over::<K>(&planner.parts.client, scope);
    let events = watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let change = match event {
            Ok(watcher::Event::Init) => Change::Relist,
            Ok(watcher::Event::InitDone) => Change::Relisted,
            Ok(watcher::Event::InitApply(object)) => match object.decoded() {
                Ok(object) => Change::Listed(object),
                Err(bad) => {
                    planner.reporter.unreadable(kind, *bad);
                    continue;
                }
            },
            Ok(watcher::Event::Apply(object)) => match object.decoded() {
                Ok(object) => Change::Applied(object),
                Err(bad) => {
                    let key = key_of_meta(&bad.metadata);
                    planner.reporter.unreadable(kind, *bad);
                    Change::Deleted(key)
                }
            },
            Ok(watcher::Event::Delete(object)) => Change::Deleted(key_of(&object)),
            Err(e) => {
                warn!(kind = ?kind, error = %e, "planner watch failed; retrying");
                continue;
            }
        };
        planner.update(|index| handle(index, change));
    }
}

fn key_of_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A watch event, decoded.
enum Change<K> {
    Relist,
    Listed(K),
    Relisted,
    Applied(K),
    Deleted(ObjectKey),
}

async fn follow_units<C: Sharded>(planner: Arc<Planner<C>>) {
    let parts = &planner.parts;
    let (scope, fields) = parts.layout.unit_watch(
        &parts.replica.namespace,
        &parts.replica.statefulset,
        &parts.scope,
    );
    let config = unpaged(watcher::Config::default());
    let config = match &fields {
        Some(fields) => config.fields(fields),
        None => config,
    };
    follow::<C, C::Unit>(
        planner.clone(),
        ObjectKind::Unit,
        &scope,
        config,
        |index, change| match change {
            Change::Relist => {
                index.relist_units();
                false
            }
            Change::Listed(unit) => {
                index.relisted_unit(UnitEntry::of::<C>(&unit));
                false
            }
            Change::Relisted => index.relisted_units(),
            Change::Applied(unit) => index.apply_unit(UnitEntry::of::<C>(&unit)),
            Change::Deleted(key) => index.delete_unit(&key),
        },
    )
    .await;
}

/// Every item's metadata: its UID, shard label and unit token are all placement needs (the
/// token names its unit). Not the items in full: an app's manifests are most of its weight.
/// With [`Layout::KeyRanges`] every object is an item of the one unit, whatever it carries.
async fn follow_items<C: Sharded>(planner: Arc<Planner<C>>) {
    let parts = &planner.parts;
    let sole_token = parts
        .layout
        .sole_unit(&parts.replica.namespace, &parts.replica.statefulset)
        .map(|unit| unit_token(&unit.namespace, &unit.name));
    let meta_of = |metadata: &ObjectMeta| {
        let meta = ItemMeta::of(metadata);
        match &sole_token {
            Some(token) => ItemMeta {
                token: Some(token.clone()),
                shard: None,
                ..meta
            },
            None => meta,
        }
    };
    let api = metadata_api_over::<C::Item>(&planner.parts.client, &planner.parts.scope);
    let events = watcher(api, unpaged(watcher::Config::default())).default_backoff();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => planner.index().relist_items(),
            Ok(watcher::Event::InitApply(item)) => {
                planner.index().relisted_item(meta_of(&item.metadata));
            }
            Ok(watcher::Event::InitDone) => planner.update(Index::relisted_items),
            Ok(watcher::Event::Apply(item)) => {
                let meta = meta_of(&item.metadata);
                let echo = planner.item_writes.echoes(
                    &meta.key,
                    &meta.uid,
                    meta.token.as_deref(),
                    meta.shard,
                );
                planner.update(|index| index.apply_item(meta) && !echo);
            }
            Ok(watcher::Event::Delete(item)) => {
                planner.update(|index| index.delete_item(&key_of_meta(&item.metadata)));
            }
            Err(e) => warn!(error = %e, "planner watch of item metadata failed; retrying"),
        }
    }
}

/// Items without a unit token, in full: their unit comes from their spec until the planner has
/// written their token (new items, and those an owner found with a stale one).
async fn follow_unlabelled<C: Sharded>(planner: Arc<Planner<C>>) {
    let config = unpaged(
        watcher::Config::default().labels_from(&Expression::DoesNotExist(UNIT_LABEL.into()).into()),
    );
    let writes = planner.clone();
    let scope = planner.parts.scope.clone();
    follow::<C, C::Item>(
        planner,
        ObjectKind::Item,
        &scope,
        config,
        |index, change| match change {
            Change::Relist => {
                index.relist_unlabelled();
                false
            }
            Change::Listed(item) => {
                index.relisted_unlabelled(key_of(&item), unlabelled_unit::<C>(&item));
                false
            }
            Change::Relisted => index.relisted_unlabelled_done(),
            Change::Applied(item) => {
                let key = key_of(&item);
                writes.item_writes.moved_on(&key);
                index.apply_unlabelled(key, unlabelled_unit::<C>(&item))
            }
            // Gone from this watch because a written token landed: an echo.
            Change::Deleted(key) => {
                let echo = writes.item_writes.echoes_token(&key);
                index.apply_unlabelled(key, None) && !echo
            }
        },
    )
    .await;
}

/// The UnitSlices of this StatefulSet: the records of cut units' slices. Without their CRD
/// the planner plans without them, and cuts nothing.
async fn follow_slices<C: Sharded>(planner: Arc<Planner<C>>) {
    let replica = &planner.parts.replica;
    let api: Api<UnitSlice> = Api::namespaced(planner.parts.client.clone(), &replica.namespace);
    let config = watcher::Config::default().labels_from(
        &Expression::Equal(STATEFULSET_LABEL.into(), replica.statefulset.clone()).into(),
    );
    let events = watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut missing_reported = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => planner.index().relist_slices(),
            Ok(watcher::Event::InitApply(slice)) => {
                planner.index().relisted_slice(SliceEntry::of(&slice));
            }
            Ok(watcher::Event::InitDone) => planner.update(Index::relisted_slices),
            Ok(watcher::Event::Apply(slice)) => {
                planner.update(|index| index.apply_slice(SliceEntry::of(&slice)));
            }
            Ok(watcher::Event::Delete(slice)) => {
                planner.update(|index| index.delete_slice(&key_of(&slice)));
            }
            // Not installed (404), or not granted (403, which RBAC answers before it looks for
            // the resource): a controller that does not cut units needs neither.
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.code == 404 || status.code == 403 =>
            {
                if !std::mem::replace(&mut missing_reported, true) {
                    warn!(
                        code = status.code,
                        "UnitSlices cannot be listed (is their CRD installed, and may this replica list them?): no unit is cut"
                    );
                }
                planner.update(Index::slices_unavailable);
            }
            Err(e) => warn!(error = %e, "planner watch of UnitSlices failed; retrying"),
        }
    }
}

/// The StatefulSet's `spec.replicas` is the number of shards expected.
async fn follow_statefulset<C: Sharded>(planner: Arc<Planner<C>>) {
    let replica = &planner.parts.replica;
    let api: Api<StatefulSet> = Api::namespaced(planner.parts.client.clone(), &replica.namespace);
    let config =
        watcher::Config::default().fields(&format!("metadata.name={}", replica.statefulset));
    let events = watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut listed = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = None,
            Ok(watcher::Event::InitApply(sts)) => listed = Some(expected_shards(&sts)),
            Ok(watcher::Event::InitDone) => planner.update(|index| {
                // The first list is worth a pass even if it found nothing.
                let synced = index.synced();
                index.set_expected(listed) || !synced
            }),
            Ok(watcher::Event::Apply(sts)) => {
                planner.update(|index| index.set_expected(Some(expected_shards(&sts))));
            }
            Ok(watcher::Event::Delete(_)) => planner.update(|index| index.set_expected(None)),
            Err(e) => warn!(error = %e, "planner watch of the StatefulSet failed; retrying"),
        }
    }
}

/// Plans on every trigger (debounced), when a lease may have expired, and periodically.
async fn plan_loop<C: Sharded>(planner: Arc<Planner<C>>) {
    let settings = planner.parts.settings.clone();
    let leases = planner.parts.leases.clone();
    // Every kind must have been listed and every shard lease seen once: planning on less
    // would move what it missed, and an unseen lease would look like a dead shard.
    while !planner.index().synced() {
        planner.trigger.notified().await;
    }
    leases.wait_synced().await;
    let mut memory: Option<PlanMemory> = None;
    let load = settings.load;
    // The ranges of one kind's objects weigh their objects: the program's controller reports no
    // cost per object that a measured model could use.
    let measures = load.model == LoadModel::Measured && planner.parts.layout != Layout::KeyRanges;
    let mut measured = measures.then(|| {
        MeasuredModel::new(
            load.trigger,
            settings.strategy.target_balance,
            load.smoothing,
        )
        .with_memory_weight(load.memory_weight)
    });
    let began = Instant::now();
    let mut scaler = match Scaler::new(&settings.scale) {
        Ok(scaler) => Some(scaler),
        Err(e) => {
            warn!(error = %e, "the replica count cannot be sized: no shardwise_desired_replicas, no autoscaling");
            None
        }
    };
    let mut waiting_reported = None;
    let mut last_periodic = Instant::now();
    let mut pins_reported = BTreeSet::new();
    let mut statefulset_missing = false;
    // While the fleet is above the strategy's target balance (after a scale-up, say), periodic
    // passes come every converge interval, each spending at most the move budget.
    let mut above_target = false;
    loop {
        let interval = settings.periodic_interval(above_target);
        let periodic =
            settings.strategy.kind.is_load_aware() && last_periodic.elapsed() >= interval;
        if periodic {
            last_periodic = Instant::now();
        }
        let passed = pass(
            &planner,
            memory.as_ref(),
            periodic,
            measured.as_mut(),
            &mut statefulset_missing,
        );
        match passed.await {
            Ok(Some(Passed {
                decision,
                progress,
                demand,
            })) => {
                above_target = match &mut measured {
                    Some(model) => {
                        model.placed(decision.plan.assignment.clone());
                        model.rebalancing()
                    }
                    None => decision.figures.above_target,
                };
                planner
                    .reporter
                    .pins(&decision.plan.unhonoured_pins, &mut pins_reported, |key| {
                        planner.index().unit(key).map(|u| u.view.uid.clone())
                    })
                    .await;
                if let Some(scaler) = &mut scaler {
                    let now = began.elapsed();
                    scale(
                        &planner,
                        scaler,
                        demand,
                        progress,
                        now,
                        &mut waiting_reported,
                    )
                    .await;
                }
                memory = Some(decision.plan.memory);
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, "planning pass failed"),
        }
        let now = Instant::now();
        let next_expiry = leases
            .next_expiry(now)
            .map(|at| at + Duration::from_millis(50));
        let periodic_at = last_periodic + settings.periodic_interval(above_target);
        let wake = next_expiry.map_or(periodic_at, |e| e.min(periodic_at));
        tokio::select! {
            _ = leases.changed.notified() => {}
            _ = planner.trigger.notified() => {
                // Debounce bursts of events into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// What a pass remembers: nothing on a planner's first pass (it takes over the placement as it
/// stands), the previous pass's memory on the others. With measured load, the model says
/// whether this pass may move units for balance; with counted load, every periodic pass may.
fn recall<'a>(
    memory: Option<&'a PlanMemory>,
    periodic: bool,
    loads: Option<&PassLoads>,
) -> PassMemory<'a> {
    let moves_allowed = loads.map_or(periodic, |l| l.moves_allowed);
    match memory {
        None => PassMemory::Takeover,
        Some(_) if moves_allowed => PassMemory::Forgotten,
        Some(memory) => PassMemory::Remembered(memory),
    }
}

/// A pass's decision, where the fleet stood with its changes when it was made, and what it
/// asked of its replicas.
struct Passed {
    decision: Decision,
    progress: Progress,
    demand: Demand,
}

/// One planning pass: decide, write, record. `None` when there was nothing to plan.
async fn pass<C: Sharded>(
    planner: &Arc<Planner<C>>,
    memory: Option<&PlanMemory>,
    periodic: bool,
    measured: Option<&mut MeasuredModel>,
    statefulset_missing: &mut bool,
) -> Result<Option<Passed>, kube::Error> {
    let parts = &planner.parts;
    let strategy = parts.settings.strategy.kind.name().to_string();
    // One instant for both: a lease that looks expired only later than the check was not
    // read again (the handoff model's `a_pass_decides_on_the_leases_as_it_checked_them`).
    let checked_at = Instant::now();
    parts.leases.confirm_expiries(checked_at).await?;
    let Some(membership) = membership(planner, statefulset_missing, checked_at) else {
        // No decision: none of an earlier one's item writes still counts.
        planner.item_writes.replace(&[]);
        return Ok(None);
    };
    let live = membership.live();
    // Read once: for the load model, for sizing by busy time or cache, and for the cost of a
    // cache copy (which follows the bytes reported, under either model).
    let reports = parts.leases.measured_loads();
    let (decided, loads, draining) =
        decide_pass(planner, &membership, &reports, memory, periodic, measured);
    let decision = match decided {
        Ok(decision) => decision,
        Err(e) => {
            count_failure(&parts.metrics, strategy, &e, &membership);
            planner.item_writes.replace(&[]);
            return Ok(None);
        }
    };
    // Item labels wait for no record (no move writes one).
    planner.item_writes.replace(&decision.item_writes);
    let written = write_records(planner, &decision).await;
    let assignment = &decision.plan.assignment;
    let load = match &loads {
        Some(loads) => LoadFigures::of_measured(assignment, loads, &live),
        None => LoadFigures::of_apps(assignment, &live),
    };
    if loads.is_some_and(|l| l.moves_allowed) {
        parts
            .metrics
            .planner_rebalances
            .get_or_create(&NoLabels {})
            .inc();
    }
    record(
        &parts.metrics,
        &strategy,
        &decision,
        &load,
        written.moves,
        written.item_moves,
    );
    let progress = Progress {
        expected: membership.expected,
        live: live.len() as u32,
        writes: decision.record_writes.len() + planner.item_writes.outstanding(),
        draining,
    };
    let demand = demand(&parts.settings.scale, &decision, &reports);
    Ok(Some(Passed {
        decision,
        progress,
        demand,
    }))
}

/// The pass's decision on the index as it stands (held only while deciding), with the measured
/// model's loads for the pass and the records draining before it.
fn decide_pass<C: Sharded>(
    planner: &Planner<C>,
    membership: &Membership,
    reports: &MeasuredLoads,
    memory: Option<&PlanMemory>,
    periodic: bool,
    measured: Option<&mut MeasuredModel>,
) -> (Result<Decision, PlanError>, Option<PassLoads>, usize) {
    let parts = &planner.parts;
    let item_weight = if measured.is_some() {
        AVERAGE_WEIGHT
    } else {
        1
    };
    let index = planner.index();
    let units = index.unit_views();
    let draining = Progress::draining_in(&units);
    let loads = measured.map(|model| {
        model.pass(
            &units,
            &index.item_counts(),
            reports,
            &membership.live(),
            periodic,
            Instant::now(),
        )
    });
    let rules = PlacementRules {
        strategy: &parts.settings.strategy,
        slicing: parts.layout.slicing(parts.settings.slicing),
        namespace: &parts.replica.namespace,
        statefulset: &parts.replica.statefulset,
        weights: loads.as_ref().map(|l| &l.placing),
        copy_cost: parts.layout.copy_cost(|| {
            copy_cost(
                C::COPY_BYTES,
                reports,
                item_weight,
                parts.settings.load.memory_weight,
            )
        }),
    };
    let recall = recall(memory, periodic, loads.as_ref());
    let deciding = Instant::now();
    let decision = decide(&rules, &index, membership, recall);
    parts
        .metrics
        .set_pass_time(deciding.elapsed().as_secs_f64());
    (decision, loads, draining)
}

/// Counts (and logs) a pass that could not plan.
fn count_failure(metrics: &Metrics, strategy: String, error: &PlanError, membership: &Membership) {
    let result = match error {
        PlanError::NoLiveShards => "no-live-shards",
        _ => "error",
    };
    metrics
        .planner_runs
        .get_or_create(&StrategyLabels { strategy, result })
        .inc();
    match error {
        PlanError::NoLiveShards => debug!(?membership, "no live shard: nothing to plan"),
        e => warn!(error = %e, "planning failed"),
    }
}

/// What the fleet asks of its replicas after a decision: its items, and the busy time and cache
/// bytes reported when sizing counts them.
fn demand(sizing: &ScaleSettings, decision: &Decision, reports: &MeasuredLoads) -> Demand {
    let reported = (!reports.is_empty()).then_some(reports);
    Demand {
        items: decision.figures.shards.values().map(|f| f.items).sum(),
        busy: reported
            .filter(|_| sizing.busy_per_replica.is_some())
            .map(|reports| reports.iter().map(|(_, m)| m.load.busy).sum()),
        bytes: reported
            .filter(|_| sizing.cache_per_replica.is_some())
            .map(|reports| reports.iter().filter_map(|(_, m)| m.load.bytes).sum()),
    }
}

/// Sizes the fleet after a pass: exports the count needed and, with `--autoscale`, sets the
/// StatefulSet's replicas when the needs seen call for a change and the fleet is settled.
async fn scale<C: Sharded>(
    planner: &Planner<C>,
    scaler: &mut Scaler,
    demand: Demand,
    progress: Progress,
    now: Duration,
    waiting_reported: &mut Option<(u32, Unsettled)>,
) {
    let parts = &planner.parts;
    let verdict = scaler.assess(now, demand, progress);
    parts
        .metrics
        .desired_replicas
        .get_or_create(&NoLabels {})
        .set(i64::from(verdict.needed));
    match (verdict.scale_to, verdict.waiting) {
        (Some(to), _) => {
            *waiting_reported = None;
            set_replicas(planner, progress.expected, to, demand).await;
        }
        (None, Some(why)) if parts.settings.scale.autoscale => {
            let waiting = (verdict.recommended, why);
            if waiting_reported.replace(waiting) != Some(waiting) {
                info!(
                    replicas = progress.expected,
                    to = verdict.recommended,
                    waiting_for = ?why,
                    "replica count to change once the fleet is settled"
                );
            }
        }
        _ => *waiting_reported = None,
    }
}

/// Sets the StatefulSet's replicas from `from` to `to` through its scale subresource: read,
/// checked against what the pass planned on, and written back with the version read, so that
/// a change by anyone else in between wins.
/// Whatever the outcome, the StatefulSet's watch brings its new count and plans again.
async fn set_replicas<C: Sharded>(planner: &Planner<C>, from: u32, to: u32, demand: Demand) {
    let replica = &planner.parts.replica;
    let api: Api<StatefulSet> = Api::namespaced(planner.parts.client.clone(), &replica.namespace);
    let result = async {
        let mut scale = api.get_scale(&replica.statefulset).await?;
        let spec = scale.spec.get_or_insert_default();
        if spec.replicas != Some(from as i32) {
            debug!(seen = ?spec.replicas, planned_on = from, "the StatefulSet's replicas changed meanwhile; the next pass decides");
            return Ok(false);
        }
        spec.replicas = Some(to as i32);
        api.replace_scale(&replica.statefulset, &PostParams::default(), &scale)
            .await
            .map(|_| true)
    };
    match result.await {
        Ok(true) => {
            info!(from, to, items = demand.items, busy = ?demand.busy, statefulset = %replica.statefulset, "replicas set");
            let direction = if to > from { "up" } else { "down" };
            planner
                .parts
                .metrics
                .replica_changes
                .get_or_create(&DirectionLabels { direction })
                .inc();
        }
        Ok(false) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            debug!("the StatefulSet changed under the planner; the next pass decides");
        }
        Err(e) => warn!(error = %e, from, to, "could not set the StatefulSet's replicas"),
    }
}

/// The membership to plan with: the StatefulSet's shard count and the leases live at `at`;
/// `None` (reported once) while the StatefulSet does not exist.
fn membership<C: Sharded>(
    planner: &Planner<C>,
    missing: &mut bool,
    at: Instant,
) -> Option<Membership> {
    let parts = &planner.parts;
    let expected = planner.index().expected();
    let Some(expected) = expected else {
        if !std::mem::replace(missing, true) {
            warn!(statefulset = %parts.replica.statefulset, "StatefulSet not found: not planning");
        }
        return None;
    };
    *missing = false;
    let membership = parts.leases.membership(expected, at);
    let metrics = &parts.metrics;
    metrics
        .members
        .get_or_create(&MemberLabels { state: "expected" })
        .set(i64::from(membership.expected));
    metrics
        .members
        .get_or_create(&MemberLabels { state: "live" })
        .set(membership.live().len() as i64);
    Some(membership)
}

/// How many record writes that landed changed owner, and the items under those.
#[derive(Default)]
struct Written {
    moves: u64,
    item_moves: u64,
}

/// Makes one request.
async fn send<C: Sharded>(client: &Client, write: &ControlPlaneWrite) -> Result<(), kube::Error> {
    match write {
        ControlPlaneWrite::Unit { key, patch } => merge_patch::<C::Unit>(client, key, patch).await,
        ControlPlaneWrite::CreateSlice(slice) => {
            let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
            let api: Api<UnitSlice> = Api::namespaced(client.clone(), namespace);
            api.create(&PostParams::default(), slice).await.map(drop)
        }
        ControlPlaneWrite::PatchSlice { key, patch } => {
            merge_patch::<UnitSlice>(client, key, patch).await
        }
        ControlPlaneWrite::DeleteSlice {
            key,
            resource_version,
        } => {
            let api: Api<UnitSlice> = Api::namespaced(client.clone(), &key.namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: resource_version.clone(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&key.name, &params).await {
                Ok(_) => Ok(()),
                // Already gone: what the write wanted.
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

/// Record writes first, then the others; a conflict or failure plans again. The records of one
/// unit (its own, its slices') are written one at a time in the decision's order, those of
/// different units [`RECORD_WRITE_CONCURRENCY`] units at a time: a pass that moves many units
/// (a kind sharded by its own objects moves each object) is not one request's latency per unit.
async fn write_records<C: Sharded>(planner: &Planner<C>, decision: &Decision) -> Written {
    let mut by_unit: BTreeMap<&ObjectKey, Vec<&RecordWrite>> = BTreeMap::new();
    for write in &decision.record_writes {
        by_unit.entry(&write.record.unit).or_default().push(write);
    }
    let units: Vec<_> = by_unit
        .into_values()
        .map(|writes| write_unit_records(planner, writes))
        .collect();
    let written = futures::stream::iter(units)
        .buffer_unordered(RECORD_WRITE_CONCURRENCY)
        .fold(Written::default(), |total, written| async move {
            Written {
                moves: total.moves + written.moves,
                item_moves: total.item_moves + written.item_moves,
            }
        })
        .await;
    let client = &planner.parts.client;
    for write in &decision.other_writes {
        if let Err(e) = send::<C>(client, write).await {
            debug!(error = %e, ?write, "write failed; next pass retries");
            planner.trigger.notify_one();
        }
    }
    written
}

/// The record writes of one unit, in order.
async fn write_unit_records<C: Sharded>(
    planner: &Planner<C>,
    writes: Vec<&RecordWrite>,
) -> Written {
    let mut written = Written::default();
    let client = &planner.parts.client;
    for write in writes {
        let record = &write.record;
        match send::<C>(client, &write.write).await {
            Ok(()) => {
                debug!(unit = %record.unit, range = %record.range, action = ?write.action, "record updated");
                if let Some(PlannerAction::Assign { shard, .. }) = write.placement() {
                    if record.range == KeyRange::WHOLE {
                        info!(unit = %record.unit, shard, "{} assigned", C::NOUNS.unit);
                    } else {
                        info!(unit = %record.unit, range = %record.range, shard, "slice of {} assigned", C::NOUNS.unit);
                    }
                }
                if write.moves() {
                    written.moves += 1;
                    written.item_moves += write.items;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(unit = %record.unit, range = %record.range, "record changed under the planner; next pass retries");
                planner.trigger.notify_one();
            }
            Err(e) => {
                warn!(unit = %record.unit, range = %record.range, error = %e, "could not write record");
                planner.trigger.notify_one();
            }
        }
    }
    written
}

/// Writes the item labels the passes decide, [`ITEM_WRITE_CONCURRENCY`] at a time, beside the
/// passes ([`item_writes`]). Failed writes start one pass a second at most: the next pass
/// decides them again (one that fails for good, refused by a webhook say, must not make the
/// planner spin).
async fn write_items<C: Sharded>(planner: Arc<Planner<C>>) {
    let mut running = futures::stream::FuturesUnordered::new();
    let mut failed = false;
    let mut retries = tokio::time::interval(Duration::from_secs(1));
    retries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            settled = running.next(), if !running.is_empty() => failed |= settled == Some(false),
            write = planner.item_writes.next(), if running.len() < ITEM_WRITE_CONCURRENCY => {
                running.push(write_item(&planner, write));
            }
            _ = retries.tick() => {
                if std::mem::take(&mut failed) {
                    planner.trigger.notify_one();
                }
            }
        }
    }
}

/// One item's labels; false if they did not land and are still wanted.
async fn write_item<C: Sharded>(planner: &Planner<C>, write: ItemWrite) -> bool {
    let result = merge_patch::<C::Item>(&planner.parts.client, &write.key, &write.patch()).await;
    let landed = result.is_ok();
    planner.item_writes.finished(&write.key, landed);
    match result {
        Ok(()) => true,
        // Gone: the next pass will not decide it again.
        Err(kube::Error::Api(s)) if s.code == 404 => true,
        // Another object of that name (the UID in the patch is a precondition, as the
        // kubelet's status patches use it): its creation is a change the next pass decides on.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            debug!(item = %write.key, "item made again since the pass: not labelled");
            true
        }
        Err(e) => {
            warn!(item = %write.key, error = %e, "could not label item");
            false
        }
    }
}

/// The pass's counters and the plan's gauges.
fn record(
    metrics: &Metrics,
    strategy: &str,
    decision: &Decision,
    load: &LoadFigures,
    unit_moves: u64,
    item_moves: u64,
) {
    metrics.count_pass(strategy, unit_moves, item_moves);
    let figures = &decision.figures;
    metrics.set_plan(&PlanGauges {
        balance: figures.balance,
        shards: &figures.shards,
        cache_copies: figures.cache_copies,
        cut_units: figures.cut_units,
    });
    metrics.set_load(&load.shards, load.balance);
}
