//! The owner side of a replica: watch the units labelled with this shard and their items (by
//! their units' tokens, several units to a watch; see [`items`]), reconcile
//! them through the controller, and take part in handoffs. It runs only while the replica holds
//! its shard lease (one *term*); when the lease is lost everything here is cancelled and
//! dropped, and a fresh term (with fresh lists) starts when the lease is held again.

mod events;
pub(crate) mod gate;
pub(crate) mod items;
pub(crate) mod meter;
pub(crate) mod queue;
mod server_selection;
mod workers;

pub(crate) use workers::composed;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::core::{Expression, Selector};
use kube::{Api, Client, Resource};
use kube_runtime::reflector;
use kube_runtime::{WatchStreamExt, watcher};
use shard_assign::{KeyRange, shard_selector};
use shardwise_handoff::drain::{OwnerEffect, OwnerId, UnitRecord};
use shardwise_handoff::keys::{
    DRAINED_ANNOTATION, SHARD_LABEL, SLICES_LABEL, STATEFULSET_LABEL, UNIT_LABEL,
};
use shardwise_handoff::plan::{ObjectKey, RecordKey};
use shardwise_handoff::slices::deepest;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use self::gate::{Gate, Misses, UNIT_KEY};
use self::items::{Batch, ItemStores};
use self::meter::{Meter, MeterSettings};
use self::queue::WorkQueue;
pub(crate) use self::server_selection::selecting_collection;
use self::server_selection::{selecting, server_selects};
use crate::audit::Audit;
use crate::decode::decode_each;
use crate::layout::Layout;
use crate::lease::{Annotations, Fence};
use crate::lenient::Undecodable;
use crate::load::{LoadReport, MAX_REPORTED_RECORDS, RecordLoad};
use crate::metrics::Metrics;
use crate::objects::{
    Object, api_over, item_key, key_of, merge_patch, record_of, reference, unpaged,
};
use crate::settings::{OwnerSettings, WatchScope};
use crate::sharded::{ContextOf, Sharded, TermOf};
use crate::slice::{UnitSlice, slice_name};
use crate::term::{SliceHome, Term, TermContext};

/// Shared readiness: true once this replica's caches are synced and its lease is held.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Makes `/readyz` answer ready, or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// How a term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The lease was lost: work was cancelled at once.
    Fenced,
    /// Shutdown: no new work was started and in-flight work finished (or timed out).
    Shutdown,
}

/// What a term is built from.
#[derive(Clone)]
pub(crate) struct OwnerParts {
    pub me: OwnerId,
    /// The gate every request of this term passes.
    pub fence: Fence,
    /// The control plane, behind the fence.
    pub client: Client,
    pub settings: OwnerSettings,
    pub scope: WatchScope,
    pub metrics: Metrics,
    pub audit: Audit,
    pub readiness: Readiness,
    /// Where this StatefulSet's UnitSlices are.
    pub slices: SliceHome,
    /// What the shard lease's renewals carry: the term publishes its measured load there.
    pub load: watch::Sender<Annotations>,
}

impl std::fmt::Debug for OwnerParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerParts")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// The monotonic clock the workers read the term's fence on: `Instant::now`, but for tests.
type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A program's own controller that takes each term's work ([`crate::kind`]): it is handed the
/// term's owner when the term begins, and the runtime then watches no items and runs no workers
/// of its own.
pub(crate) struct Compose<C: Sharded> {
    pub(crate) run: Arc<dyn Fn(Arc<Owner<C>>) + Send + Sync>,
    /// How the program's objects make units and items.
    pub(crate) layout: Layout,
}

impl<C: Sharded> Clone for Compose<C> {
    fn clone(&self) -> Self {
        Self {
            run: self.run.clone(),
            layout: self.layout,
        }
    }
}

impl<C: Sharded> std::fmt::Debug for Compose<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compose")
    }
}

/// A term of `C`: its context and state, and the controller.
pub(crate) struct Owner<C: Sharded> {
    controller: Arc<C>,
    pub(crate) term: TermOf<C>,
    settings: OwnerSettings,
    /// The records of this shard's slices, as last seen.
    slice_records: Mutex<BTreeMap<(ObjectKey, KeyRange), UnitRecord>>,
    /// What each record's reconciles cost this term.
    meter: Mutex<Meter>,
    load: watch::Sender<Annotations>,
    clock: Clock,
    /// How the objects make units and items.
    pub(crate) layout: Layout,
    /// Counts the records fed to the gate: a program's controller that follows this term's
    /// ranges ([`crate::kind`]) looks at them again after each.
    pub(crate) observed: watch::Sender<u64>,
}

impl<C: Sharded> Owner<C> {
    /// Whether the term is over on the monotonic clock, as the fenced client judges it, even if
    /// the lease task has not run since (a process frozen, then resumed). For good: the lease
    /// task never renews a term past its fence.
    /// How long a shutdown waits for the term's work in flight.
    pub(crate) fn shutdown_timeout(&self) -> Duration {
        self.settings.shutdown_timeout
    }

    pub(crate) fn fence_passed(&self) -> bool {
        self.term.fence().check_at((self.clock)()).is_err()
    }

    /// Feeds a record of `key` (the whole unit's, or one slice's; `None`: gone from this
    /// shard's view) to its machine, and queues the work it lets start. `spec_changed` says
    /// whether the unit's generation differs from the last one seen (status writes do not
    /// count).
    fn observe(
        self: &Arc<Self>,
        key: &ObjectKey,
        range: KeyRange,
        record: Option<&UnitRecord>,
        spec_changed: bool,
    ) {
        if self.observe_only(key, range, record, spec_changed) {
            self.queue_work(key, range);
        }
    }

    /// [`Self::observe`], but returns whether work under the record may start instead of
    /// queueing it: for records from a list under way, whose cache still holds the units
    /// from before the list until it ends.
    #[must_use]
    fn observe_only(
        self: &Arc<Self>,
        key: &ObjectKey,
        range: KeyRange,
        record: Option<&UnitRecord>,
        spec_changed: bool,
    ) -> bool {
        let observed = self.term.gate.observe(key, range, record);
        self.observed.send_modify(|count| *count += 1);
        self.apply_effect(key, range, observed.effect);
        if observed.unit_removed {
            self.term.items.remove(key);
            self.controller.released(&self.term, key);
        } else if observed.activated {
            self.term.items.want(key, self.term.gate.ranges(key));
        }
        if observed.activated {
            if range == KeyRange::WHOLE {
                info!(unit = %key, "{} active on this shard", C::NOUNS.unit);
            } else {
                info!(unit = %key, %range, "slice of {} active on this shard", C::NOUNS.unit);
            }
        }
        // Work under the record may start now; or the record is gone while others of the unit
        // remain (a merge or a split finished), and work it held back now falls to them.
        let handed_down = observed.removed && !observed.unit_removed;
        observed.activated || (observed.active && spec_changed) || handed_down
    }

    /// Queues the unit (if `range` holds its own key) and its items in `range`.
    fn queue_work(&self, key: &ObjectKey, range: KeyRange) {
        // The program's own controller queues its objects itself.
        if range.contains(UNIT_KEY) && !self.layout.composed() {
            self.term.unit_queue.add(key.clone());
        }
        for item in self.term.items_in(key, range) {
            self.term
                .item_queue
                .add_in(key_of(item.as_ref()), key.clone());
        }
    }

    /// Starts one watch of the items of `batch`'s units (by their tokens), kept to the ranges
    /// of their keys the term held when it was asked for.
    ///
    /// `server_selects`: the server keeps only items of the ranges asked for, if asked
    /// ([`server_selection`]); a watch of slices' items asks for their ranges then.
    fn start_item_watch(self: &Arc<Self>, batch: Batch, server_selects: bool) {
        let term = &self.term;
        let tokens = batch.held.tokens();
        let shard_selector = server_selects
            .then(|| shard_selector(&batch.held.key_ranges()))
            .flatten();
        let client = match &shard_selector {
            Some(selector) => selecting(&term.client, selector),
            None => term.client.clone(),
        };
        let config = unpaged(watcher::Config::default().labels_from(
            &Expression::In(UNIT_LABEL.into(), tokens.iter().cloned().collect()).into(),
        ));
        let (store, writer) = reflector::store();
        let held = batch.held.clone();
        let keeps = held.clone();
        let events = decode_each(
            watcher(api_over::<C::Item>(&client, &term.scope), config),
            store.clone(),
            unreadable(C::NOUNS.item),
        )
        // Keys never change (they hash the UID): an item outside the ranges never enters, and
        // the items of a unit the watch no longer serves stay as they are, unread. Deletions
        // all pass: an item whose token was cleared leaves the watch with no token.
        .filter(move |event| {
            let kept = match event {
                Ok(watcher::Event::Apply(item) | watcher::Event::InitApply(item)) => {
                    keeps.keeps(item)
                }
                _ => true,
            };
            std::future::ready(kept)
        })
        .modify(|item: &mut C::Item| item.meta_mut().managed_fields = None)
        .default_backoff();
        let events = reflector::reflector(writer, events);
        let task = tokio::spawn(events::follow_items(
            self.clone(),
            events,
            Some((batch.id(), held)),
        ));
        debug!(
            units = tokens.len(),
            merges = batch.merges,
            server_selected = shard_selector.is_some(),
            "watching the {} of {}",
            C::NOUNS.items,
            C::NOUNS.units
        );
        term.items
            .insert(batch, store, AbortOnDropHandle::new(task));
    }

    fn apply_effect(
        self: &Arc<Self>,
        key: &ObjectKey,
        range: KeyRange,
        effect: Option<OwnerEffect>,
    ) {
        match effect {
            None => {}
            Some(OwnerEffect::Forget) => {
                debug!(unit = %key, %range, "{} left this shard", C::NOUNS.unit);
                if !self.term.reports_on(key) {
                    self.term.unit_queue.forget(key);
                }
            }
            Some(OwnerEffect::WriteAck { epoch }) => {
                let owner = self.clone();
                let key = key.clone();
                tokio::spawn(async move { owner.write_ack(key, range, epoch).await });
            }
        }
    }

    /// Acknowledges the release of `epoch` of a record. The epoch in the value keeps a late
    /// write harmless: the planner only acts on an acknowledgement of the current epoch.
    async fn write_ack(self: Arc<Self>, key: ObjectKey, range: KeyRange, epoch: u64) {
        let patch = serde_json::json!({"metadata": {"annotations": {DRAINED_ANNOTATION: epoch.to_string()}}});
        let client = &self.term.client;
        let result = if range == KeyRange::WHOLE {
            merge_patch::<C::Unit>(client, &key, &patch).await
        } else {
            let home = &self.term.slices;
            let slice = ObjectKey::new(&home.namespace, slice_name(&home.statefulset, &key, range));
            merge_patch::<UnitSlice>(client, &slice, &patch).await
        };
        match result {
            Ok(_) => {
                info!(unit = %key, %range, epoch, "released {} for handoff", C::NOUNS.unit);
                self.term.metrics.handoff("drained");
                self.term.gate.ack_written(&key, range, epoch);
                if !self.term.knows(&key) {
                    self.controller.released(&self.term, &key);
                }
            }
            Err(e) => {
                warn!(unit = %key, %range, epoch, error = %e, "could not acknowledge the drain; retrying");
                self.term.gate.ack_failed(&key, range);
                let owner = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let current = owner.current_record(&key, range);
                    owner.observe(&key, range, current.as_ref(), false);
                });
            }
        }
    }

    /// Keeps (or, `None`, forgets) the record of a slice of this shard as last seen.
    fn remember_slice(&self, key: &ObjectKey, range: KeyRange, record: Option<UnitRecord>) {
        let mut records = self
            .slice_records
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match record {
            Some(record) => records.insert((key.clone(), range), record),
            None => records.remove(&(key.clone(), range)),
        };
    }

    /// The slices of this shard whose records are kept.
    fn remembered_slices(&self) -> Vec<(ObjectKey, KeyRange)> {
        self.slice_records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// The record of `range` of `key` as this term last saw it: the whole unit's from the
    /// units labelled with this shard, a slice's from its UnitSlice.
    fn current_record(&self, key: &ObjectKey, range: KeyRange) -> Option<UnitRecord> {
        if range == KeyRange::WHOLE {
            self.term
                .units
                .get(&reference::<C::Unit>(key))
                .map(|u| record_of(u.as_ref()))
        } else {
            self.slice_records
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&(key.clone(), range))
                .copied()
        }
    }

    /// The items of `unit` changed: it is reconciled again, so that it can report on them.
    /// Batched, so that a burst of arriving items costs one reconcile, not one per item.
    fn recount(&self, unit: ObjectKey) {
        self.term
            .unit_queue
            .add_after(unit, self.settings.item_change_delay);
    }

    fn meter(&self) -> MutexGuard<'_, Meter> {
        self.meter.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes the measured load of the records this term holds: on the shard lease (its
    /// next renewal carries it) and in the gauges.
    fn publish_load(&self, now: Instant) {
        let owned = self.term.gate.records();
        let measured: Vec<(RecordKey, f64)> = {
            let mut meter = self.meter();
            meter.own(&owned, now);
            meter
                .measured()
                .map(|(k, busy)| (k.clone(), busy))
                .collect()
        };
        self.term
            .metrics
            .set_measured(measured.iter().map(|(_, busy)| busy).sum(), measured.len());
        let items = self.items_per_record(&owned);
        let bytes = self.bytes_per_record(&owned, &items);
        let report = LoadReport::top(
            measured.into_iter().map(|(key, busy)| {
                let load = RecordLoad {
                    bytes: bytes.get(&key).copied(),
                    ..RecordLoad::new(busy, items.get(&key).copied().unwrap_or(0))
                };
                (key, load)
            }),
            MAX_REPORTED_RECORDS,
        );
        self.load.send_replace(report.annotations());
    }

    /// What the controller keeps for each unit of `records`, shared among the unit's records
    /// here by their `items` (evenly when none holds an item).
    fn bytes_per_record(
        &self,
        records: &BTreeSet<RecordKey>,
        items: &BTreeMap<RecordKey, u64>,
    ) -> BTreeMap<RecordKey, u64> {
        let mut by_unit: BTreeMap<&ObjectKey, Vec<&RecordKey>> = BTreeMap::new();
        for record in records {
            by_unit.entry(&record.unit).or_default().push(record);
        }
        let mut shares = BTreeMap::new();
        for (unit, records) in by_unit {
            let Some(bytes) = self.controller.cached_bytes(&self.term, unit) else {
                continue;
            };
            let counts: Vec<u64> = records
                .iter()
                .map(|r| items.get(*r).copied().unwrap_or(0))
                .collect();
            let total: u64 = counts.iter().sum();
            let n = records.len() as u64;
            for (record, count) in records.into_iter().zip(counts) {
                let share = if total == 0 {
                    bytes / n
                } else {
                    (u128::from(bytes) * u128::from(count) / u128::from(total)) as u64
                };
                shares.insert(record.clone(), share);
            }
        }
        shares
    }

    /// The items of this shard's cache under each of `records` (the deepest that holds the
    /// item's key, as the gate admits work).
    fn items_per_record(&self, records: &BTreeSet<RecordKey>) -> BTreeMap<RecordKey, u64> {
        // The program's controller holds the objects: each record counts as one.
        if self.layout.composed() {
            return records.iter().map(|record| (record.clone(), 1)).collect();
        }
        let mut ranges: BTreeMap<&ObjectKey, Vec<KeyRange>> = BTreeMap::new();
        for record in records {
            ranges.entry(&record.unit).or_default().push(record.range);
        }
        let mut counts = BTreeMap::new();
        for item in self.term.items.unit_items() {
            let unit = C::unit_of(&item);
            let Some(unit_ranges) = ranges.get(&unit) else {
                continue;
            };
            if let Some(range) = deepest(unit_ranges.iter().copied(), item_key(item.as_ref())) {
                *counts.entry(RecordKey { unit, range }).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Whether the API server selects items by key range; a failed probe counts as no (the
    /// replica keeps only its ranges' items either way).
    pub(crate) async fn probe_server_selection(&self) -> bool {
        let term = &self.term;
        let selects = match server_selects(&term.client, &term.slices.namespace).await {
            Ok(selects) => selects,
            Err(e) => {
                warn!(error = %e, "cannot tell whether the API server selects {} by key range", C::NOUNS.items);
                false
            }
        };
        if selects {
            info!(
                "the API server selects the {} of slices by key range (KEP-5866)",
                C::NOUNS.items
            );
        } else {
            info!(
                "the API server does not select {} by key range: each watch of slices' {} keeps their ranges itself",
                C::NOUNS.items,
                C::NOUNS.items
            );
        }
        term.metrics
            .server_shard_selection
            .get_or_create(&term.metrics.shard_labels())
            .set(i64::from(selects));
        selects
    }

    fn update_gauges(&self) {
        let metrics = &self.term.metrics;
        let labels = metrics.shard_labels();
        metrics
            .owned_units
            .get_or_create(&labels)
            .set(self.term.gate.active() as i64);
        metrics
            .owned_items
            .get_or_create(&labels)
            .set(self.term.item_count() as i64);
        metrics
            .owned_slices
            .get_or_create(&labels)
            .set(self.term.gate.active_slices() as i64);
        metrics
            .queue_depth
            .get_or_create(&metrics.kind_labels(C::NOUNS.unit))
            .set(self.term.unit_queue.depth() as i64);
        metrics
            .queue_depth
            .get_or_create(&metrics.kind_labels(C::NOUNS.item))
            .set(self.term.item_queue.depth() as i64);
    }
}

/// Runs one term of `controller` until `fenced` resolves (lease lost) or `shutdown` is
/// cancelled; the program's own controller does the term's work if `compose` is given.
pub(crate) async fn run<C: Sharded>(
    controller: Arc<C>,
    parts: OwnerParts,
    compose: Option<Compose<C>>,
    fenced: impl std::future::Future<Output = ()>,
    shutdown: CancellationToken,
) -> Exit {
    let OwnerParts {
        me,
        fence,
        client,
        settings,
        scope,
        metrics,
        audit,
        readiness,
        slices,
        load,
    } = parts;
    let (units, unit_writer) = reflector::store();
    let (cut_units, cut_unit_writer) = reflector::store();
    let (orphans, orphan_writer) = reflector::store();
    let context: Arc<ContextOf<C>> = Arc::new(ContextOf::<C> {
        me,
        fence,
        client: client.clone(),
        scope: scope.clone(),
        metrics,
        audit,
        units,
        cut_units,
        items: ItemStores::new(orphans, C::unit_of),
        slices,
        gate: Gate::new(me),
        unit_queue: WorkQueue::new(),
        item_queue: WorkQueue::new(),
        missing_units: Misses::default(),
        missing_items: Misses::default(),
        cancel: CancellationToken::new(),
        tasks: Mutex::new(JoinSet::new()),
    });
    let state = match controller.begin_term(&context) {
        Ok(state) => state,
        Err(e) => {
            // Nothing of the term can work; the lease is kept so that no other replica takes
            // the shard's units, and the next term tries again.
            warn!(error = %e, "cannot begin the term; waiting for the next one");
            let exit = wait_for_end(fenced, &shutdown).await;
            end_term(&context).await;
            return exit;
        }
    };
    let owner = Arc::new(Owner {
        controller,
        term: Term::new(context.clone(), state),
        settings: settings.clone(),
        slice_records: Mutex::new(BTreeMap::new()),
        meter: Mutex::new(Meter::new(MeterSettings::DEFAULT, Instant::now())),
        load: load.clone(),
        clock: Arc::new(Instant::now),
        observed: watch::channel(0).0,
        layout: compose.as_ref().map_or(Layout::UnitsAndItems, |c| c.layout),
    });
    let writers = Writers {
        units: unit_writer,
        cut_units: cut_unit_writer,
        orphans: orphan_writer,
    };
    let items = compose.is_none();
    start_watches(&owner, &client, &scope, writers, items);
    match compose {
        None => start_workers(&owner),
        Some(compose) => (compose.run)(owner.clone()),
    }
    context.spawn(report_ready(owner.clone(), readiness.clone(), items));
    context.spawn(report_load(owner.clone(), settings.load_report_interval));

    let exit = wait_for_end(fenced, &shutdown).await;
    readiness.set(false);
    context.unit_queue.close();
    context.item_queue.close();
    match exit {
        Exit::Fenced => {
            warn!(shard = me.shard, "lease lost: stopping all work now");
        }
        Exit::Shutdown => finish_in_flight(&owner, settings.shutdown_timeout).await,
    }
    context.cancel.cancel();
    end_term(&context).await;
    let labels = context.metrics.shard_labels();
    context.metrics.owned_units.get_or_create(&labels).set(0);
    context.metrics.owned_items.get_or_create(&labels).set(0);
    context.metrics.owned_slices.get_or_create(&labels).set(0);
    // Nothing is this term's any more; the next term measures afresh.
    context.metrics.set_measured(0.0, 0);
    load.send_replace(LoadReport::default().annotations());
    exit
}

async fn wait_for_end(
    fenced: impl std::future::Future<Output = ()>,
    shutdown: &CancellationToken,
) -> Exit {
    tokio::select! {
        _ = fenced => Exit::Fenced,
        _ = shutdown.cancelled() => Exit::Shutdown,
    }
}

/// Stops every task of the term and waits for them.
async fn end_term<U: Object, I: Object>(context: &TermContext<U, I>) {
    let mut tasks =
        std::mem::take(&mut *context.tasks.lock().unwrap_or_else(PoisonError::into_inner));
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    // Their watches hold the owner: dropping them ends both.
    context.items.clear();
}

/// On shutdown: lets in-flight reconciles finish, within the budget; what is still owned
/// counts as handed off.
async fn finish_in_flight<C: Sharded>(owner: &Owner<C>, budget: Duration) {
    let gate = &owner.term.gate;
    let deadline = Instant::now() + budget;
    while gate.in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in gate.units() {
        owner.term.metrics.handoff("shutdown");
    }
}

/// Where the term's watches feed their caches.
struct Writers<C: Sharded> {
    units: reflector::store::Writer<C::Unit>,
    cut_units: reflector::store::Writer<C::Unit>,
    /// Items labelled with this shard: those of units that do not exist.
    orphans: reflector::store::Writer<C::Item>,
}

/// Logs an object that cannot be read, and leaves it alone (the planner reports it).
fn unreadable(what: &'static str) -> impl FnMut(&Undecodable) + Send + 'static {
    move |bad: &Undecodable| {
        warn!(what, name = ?bad.metadata.name, reason = %bad.reason, "cannot read object; ignoring it");
    }
}

/// The label-filtered watches of units and (`items`) items, the watch of cut units and that of
/// this shard's UnitSlices (managedFields dropped before the cache: a replica never reads them,
/// and they are often bigger than the spec).
fn start_watches<C: Sharded>(
    owner: &Arc<Owner<C>>,
    client: &Client,
    scope: &WatchScope,
    writers: Writers<C>,
    items: bool,
) {
    let shard = Expression::Equal(SHARD_LABEL.into(), owner.term.shard().to_string());
    let config = unpaged(watcher::Config::default().labels_from(&shard.clone().into()));
    let home = &owner.term.slices;
    let (unit_scope, unit_fields) =
        owner
            .layout
            .unit_watch(&home.namespace, &home.statefulset, scope);
    let unit_watch = |config: watcher::Config, writer| {
        let config = match &unit_fields {
            Some(fields) => config.fields(fields),
            None => config,
        };
        let events = decode_each(
            watcher(api_over::<C::Unit>(client, &unit_scope), config),
            owner.term.units.clone(),
            unreadable(C::NOUNS.unit),
        )
        .modify(|unit: &mut C::Unit| unit.meta_mut().managed_fields = None)
        .default_backoff();
        reflector::reflector(writer, events)
    };
    let unit_events = unit_watch(config.clone(), writers.units);
    let cut_events = unit_watch(
        unpaged(
            watcher::Config::default().labels_from(&Expression::Exists(SLICES_LABEL.into()).into()),
        ),
        writers.cut_units,
    );
    let slice_events = watcher(
        Api::<UnitSlice>::namespaced(client.clone(), &home.namespace),
        watcher::Config::default().labels_from(&Selector::from_iter([
            shard,
            Expression::Equal(STATEFULSET_LABEL.into(), home.statefulset.clone()),
        ])),
    )
    .default_backoff();
    let term = &owner.term;
    term.spawn(events::follow_units(owner.clone(), unit_events));
    term.spawn(events::follow_cut_units(owner.clone(), cut_events));
    term.spawn(events::follow_slices(owner.clone(), slice_events));
    if items {
        let orphan_events = decode_each(
            watcher(api_over::<C::Item>(client, scope), config),
            writers.orphans.as_reader(),
            unreadable(C::NOUNS.item),
        )
        .modify(|item: &mut C::Item| item.meta_mut().managed_fields = None)
        .default_backoff();
        let orphan_events = reflector::reflector(writers.orphans, orphan_events);
        term.spawn(events::follow_items(owner.clone(), orphan_events, None));
        term.spawn(watch_items(owner.clone()));
    }
}

/// How long a unit that becomes active waits for others to share its watch: a planner's pass
/// writes its records within about this.
const ITEM_WATCH_BATCHING: Duration = Duration::from_millis(100);

/// Starts the watches of units' items as units become active, several units to a watch.
async fn watch_items<C: Sharded>(owner: Arc<Owner<C>>) {
    // Asked once a term, before its first watch of items.
    let mut server_selects = None;
    loop {
        owner.term.items.wanted().await;
        tokio::time::sleep(ITEM_WATCH_BATCHING).await;
        if let Some(batch) = owner.term.items.take_batch() {
            let selects = match server_selects {
                Some(selects) => selects,
                None => *server_selects.insert(owner.probe_server_selection().await),
            };
            owner.start_item_watch(batch, selects);
        }
    }
}

fn start_workers<C: Sharded>(owner: &Arc<Owner<C>>) {
    for _ in 0..owner.settings.unit_workers {
        owner.term.spawn(workers::units(owner.clone()));
    }
    for _ in 0..owner.settings.item_workers {
        owner.term.spawn(workers::items(owner.clone()));
    }
}

/// Publishes the measured load every `interval`.
async fn report_load<C: Sharded>(owner: Arc<Owner<C>>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        owner.publish_load(Instant::now());
    }
}

/// Reports ready once every cache of the term is complete (of items, if it watches them), then
/// keeps the gauges current.
async fn report_ready<C: Sharded>(owner: Arc<Owner<C>>, readiness: Readiness, items: bool) {
    let term = &owner.term;
    let synced = term.units.wait_until_ready().await.is_ok()
        && (!items || term.items.wait_until_ready().await);
    if synced {
        owner.controller.synced(term).await;
        readiness.set(true);
        info!(shard = term.shard(), "caches synced; ready");
    }
    loop {
        owner.update_gauges();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
