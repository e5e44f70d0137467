//! The worker pools: take a key, look the object up, reconcile it through the gate (recorded in
//! the audit, abandoned if the term ends), and schedule what comes next. No reconcile starts
//! past the term's fence: a controller's work that no request of the fenced client carries (an
//! outside API, a file) must not start while another replica may own the unit.

use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use shard_assign::KeyRange;
use shardwise_handoff::keys::{UNIT_LABEL, unit_token};
use shardwise_handoff::plan::{ObjectKey, RecordKey};
use tracing::{debug, warn};

use super::Owner;
use super::gate::UNIT_KEY;
use super::meter::Running;
use super::queue::WorkQueue;
use crate::failpoints;
use crate::objects::{item_key, merge_patch};
use crate::sharded::{Action, Sharded};

/// How a reconcile went, as the metrics count it.
enum Ran<E> {
    /// Not this term's to do (the gate refused it, or the object is gone).
    Skipped,
    /// The term ended while it ran.
    Cancelled,
    Finished(Result<Action, E>),
}

/// What became of a reconcile offered to [`gated`].
enum Gated<T> {
    /// Not started: the term's fence has passed.
    Fenced,
    /// Not started: the gate refused it, or the term is ending.
    Refused,
    /// Started; the term ended while it ran.
    Cancelled,
    Finished(T),
}

/// Runs one reconcile of work on `at` (an item's key in its unit's key space, or
/// [`UNIT_KEY`] for the unit itself) of `unit`, through the gate, recorded in the audit,
/// abandoned if the term ends.
async fn gated<C: Sharded, T>(
    owner: &Arc<Owner<C>>,
    unit: &ObjectKey,
    at: u64,
    kind: &'static str,
    key: &ObjectKey,
    work: impl std::future::Future<Output = T>,
) -> Gated<T> {
    let term = &owner.term;
    if term.cancel.is_cancelled() {
        return Gated::Refused;
    }
    // Ahead of the gate: an item the gate refuses may go on to `reconcile_orphan`, controller
    // code too.
    if owner.fence_passed() && !failpoints::seeded(failpoints::SKIP_FENCE_CHECK) {
        return Gated::Fenced;
    }
    let Some(range) = term.gate.begin(unit, at) else {
        return Gated::Refused;
    };
    let interval = term
        .audit
        .start(&unit.to_string(), range, kind, &key.to_string());
    let record = RecordKey {
        unit: unit.clone(),
        range,
    };
    let _active = term.metrics.running(kind);
    let admitted = Admitted {
        owner,
        unit,
        range,
        running: Some(owner.meter().begin(record, Instant::now())),
    };
    let result = tokio::select! {
        r = work => Some(r),
        _ = term.cancel.cancelled() => None,
    };
    // The interval ends when dropped: here, or wherever the reconcile is abandoned (a worker
    // aborted at the end of the term drops it mid-way; the meter goes with the term).
    drop(interval);
    drop(admitted);
    match result {
        Some(result) => Gated::Finished(result),
        None => Gated::Cancelled,
    }
}

/// A reconcile the gate admitted, ended at the gate and the meter when dropped: when it ran to
/// its end, and also when the program's controller drops it mid-way within the term (a
/// controller restarted on new ranges, [`crate::kind`]), so that a drain never waits on work
/// that no longer runs.
struct Admitted<'a, C: Sharded> {
    owner: &'a Arc<Owner<C>>,
    unit: &'a ObjectKey,
    range: KeyRange,
    running: Option<Running>,
}

impl<C: Sharded> Drop for Admitted<'_, C> {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.owner.meter().end(running, Instant::now());
        }
        let effect = self.owner.term.gate.end(self.unit, self.range);
        // An ended term acknowledges nothing: its lease is released or lost, and the planner
        // moves its records without it (an acknowledgement could only fail at the fence, and
        // be retried for nothing). Nor can a task start once the runtime is gone.
        if !self.owner.term.cancel.is_cancelled() && tokio::runtime::Handle::try_current().is_ok() {
            self.owner.apply_effect(self.unit, self.range, effect);
        }
    }
}

/// One reconcile by the program's own controller ([`crate::kind`]) of object `key`, which is
/// `unit` itself (`at` is [`UNIT_KEY`]) or an item of it at key `at`: through the gate,
/// audited, metered and counted as the runtime's own workers' are. `None` when it did not run
/// to its end: past the term's fence, refused by the gate (not this term's, or being handed
/// off), or cut off by the term's end.
pub(crate) async fn composed<C: Sharded, T, E>(
    owner: &Arc<Owner<C>>,
    unit: &ObjectKey,
    at: u64,
    key: &ObjectKey,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Option<Result<T, E>> {
    let kind = if unit == key {
        C::NOUNS.unit
    } else {
        C::NOUNS.item
    };
    let started = Instant::now();
    // The term is ending: a shutdown lets the work in flight finish and starts none, as the
    // runtime's workers find their queue closed.
    if owner.term.unit_queue.is_closed() {
        owner.term.metrics.reconciled(kind, "skipped", 0.0);
        return None;
    }
    let gated = gated(owner, unit, at, kind, key, work).await;
    let (result, outcome) = match gated {
        Gated::Fenced | Gated::Refused => (None, "skipped"),
        Gated::Cancelled => (None, "cancelled"),
        Gated::Finished(Ok(done)) => (Some(Ok(done)), "success"),
        Gated::Finished(Err(e)) => (Some(Err(e)), "error"),
    };
    let seconds = started.elapsed().as_secs_f64();
    owner.term.metrics.reconciled(kind, outcome, seconds);
    result
}

/// A worker that found the term's fence passed: `key`, taken but not started, goes back to the
/// front of its queue, and the worker stops (nothing of the term may start any more; whoever
/// holds the unit next reconciles it).
fn stop_at_fence<L: Ord + Clone>(queue: &WorkQueue<ObjectKey, L>, key: ObjectKey) {
    debug!(%key, "the term's fence has passed: not started");
    queue.put_back(key);
}

/// Counts the reconcile and schedules the key's next one.
fn settle<C: Sharded, L: Ord + Clone>(
    owner: &Owner<C>,
    queue: &WorkQueue<ObjectKey, L>,
    kind: &'static str,
    key: &ObjectKey,
    ran: Ran<C::Error>,
    started: Instant,
) {
    let metrics = &owner.term.metrics;
    let seconds = started.elapsed().as_secs_f64();
    match ran {
        Ran::Skipped => metrics.reconciled(kind, "skipped", seconds),
        Ran::Cancelled => metrics.reconciled(kind, "cancelled", seconds),
        Ran::Finished(Ok(Action::Done(after))) => {
            metrics.reconciled(kind, "success", seconds);
            queue.succeeded(key);
            if let Some(after) = after {
                queue.add_after(key.clone(), after);
            }
        }
        Ran::Finished(Ok(Action::Invalid(after))) => {
            metrics.reconciled(kind, "error", seconds);
            debug!(kind, %key, "invalid; waiting for a change");
            if let Some(after) = after {
                queue.add_after(key.clone(), after);
            }
        }
        Ran::Finished(Ok(Action::Retry)) => {
            metrics.reconciled(kind, "error", seconds);
            let delay = queue.add_after_failure(key.clone());
            debug!(kind, %key, retry_in = ?delay, "failed; retrying");
        }
        Ran::Finished(Err(e)) => {
            metrics.reconciled(kind, "error", seconds);
            let delay = queue.add_after_failure(key.clone());
            warn!(kind, %key, error = %e, retry_in = ?delay, "reconcile failed");
        }
    }
}

/// A worker of units.
pub(super) async fn units<C: Sharded>(owner: Arc<Owner<C>>) {
    let term = &owner.term;
    let kind = C::NOUNS.unit;
    while let Some(key) = term.unit_queue.next().await {
        let started = Instant::now();
        let ran = match term.missing_units.lookup(&key, |k| term.unit(k)) {
            None => Ran::Skipped,
            Some(unit) => {
                let work = owner.controller.reconcile_unit(term, unit);
                match gated(&owner, &key, UNIT_KEY, kind, &key, work).await {
                    Gated::Fenced => {
                        stop_at_fence(&term.unit_queue, key);
                        return;
                    }
                    Gated::Refused => Ran::Skipped,
                    Gated::Cancelled => Ran::Cancelled,
                    Gated::Finished(result) => Ran::Finished(result),
                }
            }
        };
        settle(&owner, &term.unit_queue, kind, &key, ran, started);
        term.unit_queue.done(&key);
    }
}

/// Whether `item` carries the token of another unit than its own: its unit changed, and the
/// planner, which reads only items' metadata, cannot see that.
fn stale_token<C: Sharded>(item: &C::Item) -> bool {
    let unit = C::unit_of(item);
    item.meta()
        .labels
        .as_ref()
        .and_then(|labels| labels.get(UNIT_LABEL))
        .is_some_and(|token| *token != unit_token(&unit.namespace, &unit.name))
}

/// Removes the stale token of item `key`: the planner then reads the item in full and writes
/// its unit's token, which its owner watches. Retried with the item's next event if it fails.
async fn clear_token<C: Sharded>(owner: &Owner<C>, key: &ObjectKey) {
    let patch = serde_json::json!({"metadata": {"labels": {UNIT_LABEL: null}}});
    match merge_patch::<C::Item>(&owner.term.client, key, &patch).await {
        Ok(()) => debug!(item = %key, "cleared a stale unit token"),
        Err(e) => warn!(item = %key, error = %e, "cannot clear a stale unit token"),
    }
}

/// A worker of items.
pub(super) async fn items<C: Sharded>(owner: Arc<Owner<C>>) {
    let term = &owner.term;
    let kind = C::NOUNS.item;
    while let Some(key) = term.item_queue.next().await {
        let started = Instant::now();
        let ran = match term.missing_items.lookup(&key, |k| term.item(k)) {
            None => Ran::Skipped,
            Some(item) if stale_token::<C>(&item) => {
                clear_token::<C>(&owner, &key).await;
                Ran::Skipped
            }
            Some(item) => {
                let unit = C::unit_of(&item);
                let at = item_key(item.as_ref());
                let work = owner.controller.reconcile_item(term, item.clone());
                match gated(&owner, &unit, at, kind, &key, work).await {
                    Gated::Fenced => {
                        stop_at_fence(&term.item_queue, key);
                        return;
                    }
                    Gated::Cancelled => Ran::Cancelled,
                    Gated::Finished(result) => Ran::Finished(result),
                    Gated::Refused if term.knows(&unit) || term.cancel.is_cancelled() => {
                        Ran::Skipped
                    }
                    // Not a unit of this term at all: the item's unit may not exist.
                    Gated::Refused => match owner.controller.reconcile_orphan(term, item).await {
                        Ok(None) => Ran::Skipped,
                        Ok(Some(action)) => Ran::Finished(Ok(action)),
                        Err(e) => Ran::Finished(Err(e)),
                    },
                }
            }
        };
        settle(&owner, &term.item_queue, kind, &key, ran, started);
        term.item_queue.done(&key);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Client;
    use kube_runtime::reflector::{self, Store};
    use kube_runtime::watcher::Event;
    use shard_assign::KeyRange;
    use shardwise_handoff::drain::{Incarnation, OwnerId, UnitRecord};
    use tokio::sync::watch;
    use tokio::task::JoinSet;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::AbortOnDropHandle;

    use super::*;
    use crate::audit::Audit;
    use crate::layout::Layout;
    use crate::lease::{Annotations, Fence, Holding};
    use crate::metrics::Metrics;
    use crate::nouns::Nouns;
    use crate::owner::events;
    use crate::owner::gate::{Gate, Misses};
    use crate::owner::items::ItemStores;
    use crate::owner::meter::{Meter, MeterSettings};
    use crate::settings::{OwnerSettings, WatchScope};
    use crate::sharded::{ContextOf, TermOf};
    use crate::term::{SliceHome, Term};

    const ME: OwnerId = OwnerId {
        shard: 1,
        incarnation: Incarnation(7),
    };

    /// Counts the reconciles the runtime starts; units and items are ConfigMaps, an item's unit
    /// named by its label `unit`.
    #[derive(Default)]
    struct Counting {
        units: AtomicUsize,
        items: AtomicUsize,
        orphans: AtomicUsize,
    }

    impl Counting {
        fn calls(&self) -> [usize; 3] {
            [&self.units, &self.items, &self.orphans].map(|n| n.load(Ordering::SeqCst))
        }
    }

    impl Sharded for Counting {
        type Unit = ConfigMap;
        type Item = ConfigMap;
        type State = ();
        type Error = Infallible;
        const NOUNS: Nouns = Nouns {
            unit: "unit",
            units: "units",
            item: "item",
            items: "items",
        };

        fn unit_of(item: &ConfigMap) -> ObjectKey {
            let labels = item.metadata.labels.clone().unwrap_or_default();
            ObjectKey::new("fleet", labels.get("unit").cloned().unwrap_or_default())
        }

        fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), Infallible> {
            Ok(())
        }

        async fn reconcile_unit(
            &self,
            _: &TermOf<Self>,
            _: Arc<ConfigMap>,
        ) -> Result<Action, Infallible> {
            self.units.fetch_add(1, Ordering::SeqCst);
            Ok(Action::Done(None))
        }

        async fn reconcile_item(
            &self,
            _: &TermOf<Self>,
            _: Arc<ConfigMap>,
        ) -> Result<Action, Infallible> {
            self.items.fetch_add(1, Ordering::SeqCst);
            Ok(Action::Done(None))
        }

        async fn reconcile_orphan(
            &self,
            _: &TermOf<Self>,
            _: Arc<ConfigMap>,
        ) -> Result<Option<Action>, Infallible> {
            self.orphans.fetch_add(1, Ordering::SeqCst);
            Ok(Some(Action::Done(None)))
        }
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("fleet", name)
    }

    fn config_map(name: &str, unit: Option<&str>) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("fleet".into());
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.resource_version = Some("1".into());
        c.metadata.labels = unit.map(|u| BTreeMap::from([("unit".to_string(), u.to_string())]));
        c
    }

    fn filled(objects: &[ConfigMap]) -> Store<ConfigMap> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for object in objects {
            writer.apply_watcher_event(&Event::InitApply(object.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    /// A client with no cluster behind it: every request fails at once.
    fn no_cluster() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, Box<dyn std::error::Error + Send + Sync>>(
                "no cluster in a unit test".into(),
            )
        });
        Client::new(service, "fleet")
    }

    /// A term of [`Counting`], as a worker finds it after a freeze: the lease task last said
    /// the lease is held until `fence_at` and has not run since, and the workers' clock reads
    /// `now`. Queued: unit `a` (active, stamped for this term), its item `app-a`, and
    /// `app-lost` of a unit that does not exist (an orphan), first if `orphan_first`.
    struct Frozen {
        owner: Arc<Owner<Counting>>,
        controller: Arc<Counting>,
        audit: tempfile::NamedTempFile,
        /// The cache of items labelled with this shard, as its watch's reflector writes it.
        orphans: reflector::store::Writer<ConfigMap>,
        /// The lease task's side, kept so that the fence stays as it was set.
        _holding: watch::Sender<Holding>,
    }

    impl Frozen {
        fn new(fence_at: Instant, now: Instant, orphan_first: bool) -> Self {
            let (holding, holding_rx) = watch::channel(Holding::Held {
                fence_at,
                incarnation: ME.incarnation,
            });
            let audit = tempfile::NamedTempFile::new().unwrap();
            let gate = Gate::new(ME);
            let stamped = UnitRecord {
                owner: Some(ME.shard),
                holder: Some(ME.incarnation),
                epoch: 1,
                ..Default::default()
            };
            assert!(
                gate.observe(&key("a"), KeyRange::WHOLE, Some(&stamped))
                    .active
            );
            let (orphan_store, mut orphans) = reflector::store();
            orphans.apply_watcher_event(&Event::Init);
            for item in [
                config_map("app-a", Some("a")),
                config_map("app-lost", Some("gone")),
            ] {
                orphans.apply_watcher_event(&Event::InitApply(item));
            }
            orphans.apply_watcher_event(&Event::InitDone);
            let context = Arc::new(ContextOf::<Counting> {
                me: ME,
                fence: Fence::new(holding_rx, ME.incarnation),
                client: no_cluster(),
                scope: WatchScope::Namespace("fleet".into()),
                metrics: Metrics::new(ME.shard, Counting::NOUNS, &mut Default::default()),
                audit: Audit::open(ME.shard, "unit", Some(audit.path())).unwrap(),
                units: filled(&[config_map("a", None)]),
                cut_units: filled(&[]),
                items: ItemStores::new(orphan_store, Counting::unit_of),
                slices: SliceHome {
                    namespace: "fleet".into(),
                    statefulset: "shardwise".into(),
                },
                gate,
                unit_queue: WorkQueue::new(),
                item_queue: WorkQueue::new(),
                missing_units: Misses::default(),
                missing_items: Misses::default(),
                cancel: CancellationToken::new(),
                tasks: Mutex::new(JoinSet::new()),
            });
            context.unit_queue.add(key("a"));
            if orphan_first {
                context.item_queue.add(key("app-lost"));
            }
            context.item_queue.add_in(key("app-a"), key("a"));
            context.item_queue.add(key("app-lost"));
            let controller = Arc::new(Counting::default());
            let owner = Arc::new(Owner {
                controller: controller.clone(),
                term: Term::new(context, ()),
                settings: OwnerSettings {
                    unit_workers: 1,
                    item_workers: 2,
                    shutdown_timeout: Duration::from_secs(1),
                    item_change_delay: Duration::from_secs(1),
                    load_report_interval: Duration::from_secs(1),
                },
                slice_records: Mutex::new(BTreeMap::new()),
                meter: Mutex::new(Meter::new(MeterSettings::DEFAULT, Instant::now())),
                load: watch::channel(Annotations::new()).0,
                clock: Arc::new(move || now),
                observed: watch::channel(0).0,
                layout: Layout::UnitsAndItems,
            });
            Self {
                owner,
                controller,
                audit,
                orphans,
                _holding: holding,
            }
        }

        /// Starts the term's workers, as many as its settings say.
        fn workers(&self) -> JoinSet<()> {
            let mut workers = JoinSet::new();
            for _ in 0..self.owner.settings.unit_workers {
                workers.spawn(units(self.owner.clone()));
            }
            for _ in 0..self.owner.settings.item_workers {
                workers.spawn(items(self.owner.clone()));
            }
            workers
        }

        /// The keys of the reconciles the audit recorded as started.
        fn started(&self) -> Vec<String> {
            std::fs::read_to_string(self.audit.path())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|l| l["event"] == "start")
                .map(|l| l["key"].as_str().unwrap().to_string())
                .collect()
        }

        /// `item` leaves the watch of items labelled with this shard: as its reflector does,
        /// out of the cache first, then the event.
        async fn leaves_orphans(&mut self, item: ConfigMap) {
            self.orphans
                .apply_watcher_event(&Event::Delete(item.clone()));
            let events = futures::stream::iter([Ok(Event::Delete(item))]);
            events::follow_items(self.owner.clone(), events, None).await;
        }

        fn depths(&self) -> [usize; 2] {
            let term = &self.owner.term;
            [term.unit_queue.depth(), term.item_queue.depth()]
        }
    }

    /// Resolves once every worker has returned.
    async fn all_stopped(mut workers: JoinSet<()>) {
        while let Some(stopped) = workers.join_next().await {
            stopped.unwrap();
        }
    }

    /// A process frozen past its fence resumes: its workers start nothing of the term, though
    /// the lease task has not said the lease is lost and the gate would admit the work.
    #[tokio::test]
    async fn past_the_fence_no_reconcile_starts_and_the_work_stays_queued() {
        // A worker stops at the first key it finds fenced: the orphan first, then the item of
        // unit `a` first, so that each kind of work is offered once.
        for orphan_first in [true, false] {
            // Ahead on the real clock, which the lease task and the gate read; behind on the
            // workers' clock.
            let fence_at = Instant::now() + Duration::from_secs(60);
            let term = Frozen::new(fence_at, fence_at + Duration::from_millis(1), orphan_first);
            assert_eq!(term.depths(), [1, 2]);
            let stopped =
                tokio::time::timeout(Duration::from_secs(2), all_stopped(term.workers())).await;
            assert_eq!(
                term.controller.calls(),
                [0, 0, 0],
                "units, items and orphans reconciled past the fence (orphan first: {orphan_first})"
            );
            assert_eq!(term.started(), Vec::<String>::new(), "audited as started");
            assert_eq!(term.depths(), [1, 2], "the work stays queued");
            assert!(stopped.is_ok(), "the workers kept taking work");
        }
    }

    /// The same term with its fence ahead on the workers' clock: everything starts (the test
    /// above is not passing for want of work the gate admits).
    #[tokio::test]
    async fn before_the_fence_the_same_work_starts() {
        let now = Instant::now();
        let term = Frozen::new(now + Duration::from_secs(60), now, false);
        let workers = term.workers();
        let done = || term.controller.calls() == [1, 1, 1];
        tokio::time::timeout(Duration::from_secs(10), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the unit, its item and the orphan reconciled");
        let mut started = term.started();
        started.sort();
        // The orphan's reconcile is not a unit's work: it is not in the audit.
        assert_eq!(started, ["fleet/a", "fleet/app-a"]);
        assert_eq!(term.depths(), [0, 0]);
        term.owner.term.unit_queue.close();
        term.owner.term.item_queue.close();
        all_stopped(workers).await;
    }

    /// A program's own controller ([`crate::kind`]) passes the same gate and fence as the
    /// runtime's workers: an object the term holds is reconciled and audited; one the term does
    /// not know, any once the term is shutting down, or any past the fence, is not run at all.
    #[tokio::test]
    async fn a_programs_reconcile_runs_only_under_the_gate_before_the_fence_and_shutdown() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = AtomicUsize::new(0);
        let work = || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<u8, std::convert::Infallible>(7)
        };
        let now = Instant::now();
        let term = Frozen::new(now + Duration::from_secs(60), now, false);
        let held = composed(&term.owner, &key("a"), UNIT_KEY, &key("a"), work()).await;
        assert_eq!(held.map(|r| r.unwrap_or_default()), Some(7));
        let unknown = composed(&term.owner, &key("b"), UNIT_KEY, &key("b"), work()).await;
        assert!(unknown.is_none(), "an object the gate does not know ran");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(term.started(), ["fleet/a"]);
        // A shutdown closes the term's queue: nothing more starts, though the gate would admit.
        term.owner.term.unit_queue.close();
        let stopping = composed(&term.owner, &key("a"), UNIT_KEY, &key("a"), work()).await;
        assert!(
            stopping.is_none(),
            "a reconcile started during the shutdown"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let fence_at = Instant::now() + Duration::from_secs(60);
        let frozen = Frozen::new(fence_at, fence_at + Duration::from_millis(1), false);
        let fenced = composed(&frozen.owner, &key("a"), UNIT_KEY, &key("a"), work()).await;
        assert!(fenced.is_none(), "a reconcile ran past the fence");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(frozen.started(), Vec::<String>::new());
    }

    /// A program's controller restarted within the term ([`crate::kind`], on new ranges) drops
    /// its reconciles mid-way: each dropped one ends at the gate and the meter, so that a drain
    /// of its range does not wait for work that no longer runs.
    #[tokio::test]
    async fn a_reconcile_dropped_mid_way_ends_at_the_gate() {
        let now = Instant::now();
        let term = Frozen::new(now + Duration::from_secs(60), now, false);
        let never = std::future::pending::<Result<(), std::convert::Infallible>>();
        let a = key("a");
        let mut running = Box::pin(composed(&term.owner, &a, UNIT_KEY, &a, never));
        assert!(futures::poll!(running.as_mut()).is_pending());
        assert_eq!(term.owner.term.gate.in_flight(), 1);
        drop(running);
        assert_eq!(
            term.owner.term.gate.in_flight(),
            0,
            "a dropped reconcile still counts as in flight"
        );
        assert_eq!(term.started(), ["fleet/a"]);
    }

    /// An item of a unit that did not exist was labelled with this shard; the unit now exists
    /// and is this term's, and the planner removed the label: the item leaves the watch of
    /// items labelled with this shard (a deletion there) while its unit's watch keeps it. Its
    /// queued reconcile stays. An item that leaves every cache is forgotten.
    #[tokio::test]
    async fn an_item_that_leaves_the_orphans_watch_for_its_units_stays_queued() {
        let now = Instant::now();
        let mut term = Frozen::new(now + Duration::from_secs(60), now, false);
        let mut app = config_map("app-a", Some("a"));
        app.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(UNIT_LABEL.to_string(), unit_token("fleet", "a"));
        let items = &term.owner.term.items;
        items.want(&key("a"), vec![KeyRange::WHOLE]);
        let batch = items.take_batch().expect("a watch of a");
        let idle = AbortOnDropHandle::new(tokio::spawn(async {}));
        items.insert(batch, filled(std::slice::from_ref(&app)), idle);
        assert_eq!(term.depths(), [1, 2]);
        term.leaves_orphans(app).await;
        assert_eq!(term.depths(), [1, 2], "app-a stays queued");
        assert!(term.owner.term.item(&key("app-a")).is_some());
        term.leaves_orphans(config_map("app-lost", Some("gone")))
            .await;
        assert_eq!(
            term.depths(),
            [1, 1],
            "app-lost, in no cache now, is forgotten"
        );
    }
}
