//! The owner side of a replica: watch the clusters and apps labelled with this shard, reconcile
//! them, and take part in handoffs. It runs only while the replica holds its shard lease; when
//! the lease is lost everything here is cancelled and dropped, and a fresh runtime (with fresh
//! lists) starts when the lease is held again.

mod apps;
mod clusters;

pub(crate) use clusters::condition;
pub mod queue;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use shardwise_api::keys::{
    DRAIN_TO_ANNOTATION, DRAINED_ANNOTATION, EPOCH_ANNOTATION, HOLDER_ANNOTATION, SHARD_LABEL,
    parse_shard,
};
use shardwise_api::lenient::{Lenient, Undecodable};
use shardwise_api::{FleetApp, FleetCluster, FleetPolicy};
use shardwise_handoff::drain::{ClusterRecord, Incarnation, OwnerEffect, OwnerId, OwnerMachine};
use shardwise_handoff::plan::ObjectKey;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::audit::Audit;
use crate::config::Config;
use crate::decode::decode_each;
use crate::destination::Destination;
use crate::lease::Fence;
use crate::metrics::Metrics;
use queue::WorkQueue;

/// How long app arrivals and departures are gathered before a cluster's count is written.
const RECOUNT_DELAY: Duration = Duration::from_secs(2);

/// The placement record of a cluster object.
pub fn record_of(cluster: &FleetCluster) -> ClusterRecord {
    let annotation = |key: &str| cluster.annotations().get(key).map(String::as_str);
    ClusterRecord {
        owner: cluster
            .labels()
            .get(SHARD_LABEL)
            .and_then(|v| parse_shard(v)),
        holder: annotation(HOLDER_ANNOTATION).map(Incarnation::of_identity),
        epoch: annotation(EPOCH_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        drain_to: annotation(DRAIN_TO_ANNOTATION).and_then(parse_shard),
        drained_epoch: annotation(DRAINED_ANNOTATION).and_then(|v| v.parse().ok()),
    }
}

pub fn key_of<K: kube::Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// Per-cluster state of this owner.
#[derive(Debug, Default)]
struct Slot {
    machine: OwnerMachine,
    destination: Option<Arc<Destination>>,
}

/// Everything the workers share.
pub struct Owner {
    /// This shard and the incarnation its lease is held as: only clusters assigned to both are
    /// this owner's.
    pub me: OwnerId,
    /// The gate every destination request of this term passes.
    pub fence: Fence,
    pub client: Client,
    pub config: Arc<Config>,
    pub metrics: Metrics,
    pub audit: Audit,
    clusters: Store<FleetCluster>,
    apps: Store<FleetApp>,
    /// Every FleetPolicy of the namespace (they are few, and any app may name one).
    policies: Store<FleetPolicy>,
    slots: Mutex<BTreeMap<ObjectKey, Slot>>,
    cluster_queue: WorkQueue<ObjectKey>,
    app_queue: WorkQueue<ObjectKey>,
    /// Clusters and apps that workers looked for before the cache had them.
    missing_clusters: Misses,
    missing_apps: Misses,
    /// Cancelled when the lease is lost: every in-flight reconcile is abandoned at once.
    cancel: CancellationToken,
}

/// Keys a worker took from its queue while the cache did not have the object. The reflector
/// shows a (re)list to the cache only at its end, so a key queued from a listed object can
/// reach a worker before its object does; the end of the list queues these keys again.
#[derive(Debug, Default)]
struct Misses(Mutex<BTreeSet<ObjectKey>>);

impl Misses {
    /// `lookup(key)`, noting the key when it finds nothing. The lock spans the lookup, so a
    /// note cannot fall between the cache catching up and [`take`](Self::take).
    fn lookup<T>(
        &self,
        key: &ObjectKey,
        lookup: impl FnOnce(&ObjectKey) -> Option<T>,
    ) -> Option<T> {
        let mut missing = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let found = lookup(key);
        if found.is_none() {
            missing.insert(key.clone());
        }
        found
    }

    /// The keys noted so far; called once the cache has caught up.
    fn take(&self) -> BTreeSet<ObjectKey> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Once the cache has caught up: queues again the noted keys it now has.
    fn requeue_found(&self, found: impl Fn(&ObjectKey) -> bool, queue: &WorkQueue<ObjectKey>) {
        for key in self.take() {
            if found(&key) {
                queue.add(key);
            }
        }
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Why a reconcile did not run.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Admitted,
    /// The cluster is not (or no longer) active here.
    Refused,
}

impl Owner {
    fn slots(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cluster(&self, key: &ObjectKey) -> Option<Arc<FleetCluster>> {
        self.clusters
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    fn app(&self, key: &ObjectKey) -> Option<Arc<FleetApp>> {
        self.apps
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    /// The FleetPolicy `name` in `namespace`, once the policies are listed.
    async fn policy(&self, namespace: &str, name: &str) -> Option<Arc<FleetPolicy>> {
        self.policies.wait_until_ready().await.ok()?;
        self.policies.get(&ObjectRef::new(name).within(namespace))
    }

    /// Queues again the apps of this shard that name the policy `key`.
    fn queue_users_of(&self, key: &ObjectKey) {
        let users = self.apps.state_filter(|a| {
            a.namespace().as_deref() == Some(key.namespace.as_str())
                && a.spec.policy.as_deref() == Some(key.name.as_str())
        });
        for app in users {
            self.app_queue.add(key_of(app.as_ref()));
        }
    }

    /// Apps of this shard that target `cluster`.
    fn apps_of(&self, cluster: &ObjectKey) -> Vec<Arc<FleetApp>> {
        self.apps.state_filter(|a| {
            a.namespace().as_deref() == Some(cluster.namespace.as_str())
                && a.spec.destination.cluster == cluster.name
        })
    }

    /// Admits one reconcile of work belonging to `cluster`, through its gate.
    fn begin(&self, cluster: &ObjectKey) -> Admission {
        if self.cancel.is_cancelled() {
            return Admission::Refused;
        }
        let admitted = self
            .slots()
            .get_mut(cluster)
            .is_some_and(|slot| slot.machine.begin());
        if admitted {
            Admission::Admitted
        } else {
            Admission::Refused
        }
    }

    /// Ends a reconcile admitted by [`begin`](Self::begin).
    fn end(self: &Arc<Self>, cluster: &ObjectKey) {
        let effect = self.slots().get_mut(cluster).and_then(|s| s.machine.end());
        self.apply_effect(cluster, effect);
    }

    fn is_known(&self, cluster: &ObjectKey) -> bool {
        self.slots().contains_key(cluster)
    }

    fn destination(&self, cluster: &ObjectKey) -> Option<Arc<Destination>> {
        self.slots()
            .get(cluster)
            .and_then(|s| s.destination.clone())
    }

    fn set_destination(&self, cluster: &ObjectKey, destination: Option<Arc<Destination>>) {
        if let Some(slot) = self.slots().get_mut(cluster) {
            slot.destination = destination;
        }
    }

    /// Feeds the cluster object (or its disappearance) to its owner machine. `spec_changed` says
    /// whether its generation differs from the last one seen (status writes do not count).
    fn observe(
        self: &Arc<Self>,
        key: &ObjectKey,
        cluster: Option<&FleetCluster>,
        spec_changed: bool,
    ) {
        let record = cluster.map(record_of);
        let (effect, activated, active) = {
            let mut slots = self.slots();
            let slot = slots.entry(key.clone()).or_default();
            let was_active = slot.machine.may_start();
            let effect = slot.machine.observe(self.me, record.as_ref());
            let active = slot.machine.may_start();
            if slot.machine.state().is_none() {
                slots.remove(key);
            }
            (effect, active && !was_active, active)
        };
        self.apply_effect(key, effect);
        if activated {
            info!(cluster = %key, "cluster active on this shard");
        }
        if activated || (active && spec_changed) {
            self.cluster_queue.add(key.clone());
            for app in self.apps_of(key) {
                self.app_queue.add(key_of(app.as_ref()));
            }
        }
    }

    fn apply_effect(self: &Arc<Self>, key: &ObjectKey, effect: Option<OwnerEffect>) {
        match effect {
            None => {}
            Some(OwnerEffect::Forget) => {
                debug!(cluster = %key, "cluster left this shard");
                self.cluster_queue.forget(key);
            }
            Some(OwnerEffect::WriteAck { epoch }) => {
                let owner = self.clone();
                let key = key.clone();
                tokio::spawn(async move { owner.write_ack(key, epoch).await });
            }
        }
    }

    /// Acknowledges the release of `epoch`. The epoch in the value keeps a late write harmless:
    /// the planner only acts on an acknowledgement of the current epoch.
    async fn write_ack(self: Arc<Self>, key: ObjectKey, epoch: u64) {
        let api: Api<FleetCluster> = Api::namespaced(self.client.clone(), &key.namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {DRAINED_ANNOTATION: epoch.to_string()}}});
        let result = api
            .patch(
                &key.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        let mut slots = self.slots();
        match result {
            Ok(_) => {
                info!(cluster = %key, epoch, "released cluster for handoff");
                self.metrics.handoff("drained");
                if let Some(slot) = slots.get_mut(&key) {
                    slot.machine.ack_written(epoch);
                    slot.destination = None;
                }
            }
            Err(e) => {
                warn!(cluster = %key, epoch, error = %e, "could not acknowledge the drain; retrying");
                if let Some(slot) = slots.get_mut(&key) {
                    slot.machine.ack_failed();
                }
                drop(slots);
                let owner = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let current = owner.cluster(&key);
                    owner.observe(&key, current.as_deref(), false);
                });
            }
        }
    }

    /// The apps of `cluster` changed: its status should show the new count. Batched, so that a
    /// burst of arriving apps costs one status write, not one per app.
    fn recount(&self, cluster: ObjectKey) {
        self.cluster_queue.add_after(cluster, RECOUNT_DELAY);
    }

    fn update_gauges(&self) {
        let labels = self.metrics.shard_labels();
        let active = self
            .slots()
            .values()
            .filter(|s| s.machine.may_start())
            .count();
        self.metrics
            .owned_clusters
            .get_or_create(&labels)
            .set(active as i64);
        self.metrics
            .owned_apps
            .get_or_create(&labels)
            .set(self.apps.len() as i64);
        self.metrics
            .queue_depth
            .get_or_create(&self.metrics.kind_labels("cluster"))
            .set(self.cluster_queue.depth() as i64);
        self.metrics
            .queue_depth
            .get_or_create(&self.metrics.kind_labels("app"))
            .set(self.app_queue.depth() as i64);
    }
}

/// Shared readiness: true once this replica's caches are synced and its lease is held.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// How the owner runtime ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The lease was lost: work was cancelled at once.
    Fenced,
    /// Shutdown: no new work was started and in-flight work finished (or timed out).
    Shutdown,
}

/// What the owner side is built from.
#[derive(Clone)]
pub struct Parts {
    pub me: OwnerId,
    /// The gate every destination request of this term passes.
    pub fence: Fence,
    pub client: Client,
    pub config: Arc<Config>,
    pub metrics: Metrics,
    pub audit: Audit,
    pub readiness: Readiness,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Runs the owner side until `fenced` resolves (lease lost) or `shutdown` is cancelled.
pub async fn run(
    parts: Parts,
    fenced: impl std::future::Future<Output = ()>,
    shutdown: CancellationToken,
) -> Exit {
    let Parts {
        me,
        fence,
        client,
        config,
        metrics,
        audit,
        readiness,
    } = parts;
    let shard = me.shard;
    let selector = format!("{SHARD_LABEL}={shard}");
    let cluster_api: Api<Lenient<FleetCluster>> =
        Api::namespaced(client.clone(), &config.namespace);
    let app_api: Api<Lenient<FleetApp>> = Api::namespaced(client.clone(), &config.namespace);
    let policy_api: Api<Lenient<FleetPolicy>> = Api::namespaced(client.clone(), &config.namespace);
    let (cluster_reader, cluster_writer) = reflector::store();
    let (app_reader, app_writer) = reflector::store();
    let (policy_reader, policy_writer) = reflector::store();
    let owner = Arc::new(Owner {
        me,
        fence,
        client,
        config: config.clone(),
        metrics,
        audit,
        clusters: cluster_reader,
        apps: app_reader,
        policies: policy_reader,
        slots: Mutex::new(BTreeMap::new()),
        cluster_queue: WorkQueue::new(),
        app_queue: WorkQueue::new(),
        missing_clusters: Misses::default(),
        missing_apps: Misses::default(),
        cancel: CancellationToken::new(),
    });

    let mut tasks = JoinSet::new();
    let watch_config = watcher::Config::default().labels(&selector);
    // managedFields are the API server's bookkeeping: a replica never reads them, so they are
    // dropped before the cache (for apps they are often bigger than the spec).
    // Objects that cannot be read are left alone here; the planner reports them.
    let unreadable = |what: &'static str| {
        move |bad: &Undecodable| {
            warn!(what, name = ?bad.metadata.name, reason = %bad.reason, "cannot read object; ignoring it");
        }
    };
    let cluster_events = decode_each(
        watcher(cluster_api, watch_config.clone()),
        owner.clusters.clone(),
        unreadable("cluster"),
    )
    .modify(|c: &mut FleetCluster| c.metadata.managed_fields = None)
    .default_backoff();
    let cluster_events = reflector::reflector(cluster_writer, cluster_events);
    let app_events = decode_each(
        watcher(app_api, watch_config),
        owner.apps.clone(),
        unreadable("app"),
    )
    .modify(|a: &mut FleetApp| a.metadata.managed_fields = None)
    .default_backoff();
    let app_events = reflector::reflector(app_writer, app_events);
    let policy_events = decode_each(
        watcher(policy_api, watcher::Config::default()),
        owner.policies.clone(),
        unreadable("policy"),
    )
    .modify(|p: &mut FleetPolicy| p.metadata.managed_fields = None)
    .default_backoff();
    let policy_events = reflector::reflector(policy_writer, policy_events);
    {
        let owner = owner.clone();
        tasks.spawn(async move { clusters::watch_events(owner, cluster_events).await });
    }
    {
        let owner = owner.clone();
        tasks.spawn(async move { apps::watch_events(owner, app_events).await });
    }
    {
        let owner = owner.clone();
        tasks.spawn(async move { apps::watch_policies(owner, policy_events).await });
    }
    for _ in 0..config.cluster_workers {
        let owner = owner.clone();
        tasks.spawn(async move { clusters::worker(owner).await });
    }
    for _ in 0..config.app_workers {
        let owner = owner.clone();
        tasks.spawn(async move { apps::worker(owner).await });
    }
    {
        let owner = owner.clone();
        let readiness = readiness.clone();
        tasks.spawn(async move {
            let synced = owner.clusters.wait_until_ready().await.is_ok()
                && owner.apps.wait_until_ready().await.is_ok()
                && owner.policies.wait_until_ready().await.is_ok();
            if synced {
                readiness.set(true);
                info!(shard = owner.me.shard, "caches synced; ready");
            }
            loop {
                owner.update_gauges();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    let exit = tokio::select! {
        _ = fenced => Exit::Fenced,
        _ = shutdown.cancelled() => Exit::Shutdown,
    };
    readiness.set(false);
    owner.cluster_queue.close();
    owner.app_queue.close();
    match exit {
        Exit::Fenced => {
            warn!(shard, "lease lost: stopping all work now");
            owner.cancel.cancel();
        }
        Exit::Shutdown => {
            // Let in-flight reconciles finish, within the shutdown budget.
            let deadline = Instant::now() + config.shutdown_timeout;
            while owner.slots().values().any(|s| s.machine.in_flight() > 0)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            owner.cancel.cancel();
            let released = owner.slots().len();
            for _ in 0..released {
                owner.metrics.handoff("shutdown");
            }
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let labels = owner.metrics.shard_labels();
    owner.metrics.owned_clusters.get_or_create(&labels).set(0);
    owner.metrics.owned_apps.get_or_create(&labels).set(0);
    exit
}

/// Drains a watch stream, logging (and backing off from) its errors.
async fn for_each_event<K, S, F>(stream: S, what: &'static str, mut handle: F)
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    F: FnMut(watcher::Event<K>),
{
    let mut stream = std::pin::pin!(stream.into_stream());
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => handle(event),
            Err(e) => warn!(what, error = %e, "watch failed; retrying"),
        }
    }
}

/// Runs one reconcile of work that belongs to `cluster`, through the gate, recorded in the
/// audit, abandoned if the lease is lost. `None` when the gate refused it.
async fn gated<T>(
    owner: &Arc<Owner>,
    cluster: &ObjectKey,
    kind: &'static str,
    key: &ObjectKey,
    work: impl std::future::Future<Output = T>,
) -> Option<Result<T, Cancelled>> {
    if owner.begin(cluster) == Admission::Refused {
        return None;
    }
    let interval = owner
        .audit
        .start(&cluster.to_string(), kind, &key.to_string());
    let result = tokio::select! {
        r = work => Ok(r),
        _ = owner.cancel.cancelled() => Err(Cancelled),
    };
    // The interval ends when dropped: here, or wherever the reconcile is abandoned (a worker
    // aborted at fencing drops it mid-way).
    drop(interval);
    owner.end(cluster);
    Some(result)
}

/// A status as a JSON merge patch: fields the status leaves out are set to null so that the
/// patch clears them instead of keeping stale values.
fn status_patch<T: serde::Serialize>(status: &T, fields: &[&str]) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        for field in fields {
            object.entry(*field).or_insert(serde_json::Value::Null);
        }
    }
    value
}

/// The lease was lost while a reconcile was running.
#[derive(Debug)]
struct Cancelled;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("shardwise", name)
    }

    #[test]
    fn misses_note_only_what_the_cache_did_not_have() {
        let misses = Misses::default();
        assert_eq!(misses.lookup(&key("a"), |_| None::<u32>), None);
        assert_eq!(misses.lookup(&key("b"), |_| Some(7)), Some(7));
        assert_eq!(misses.lookup(&key("a"), |_| None::<u32>), None);
        assert_eq!(misses.take(), BTreeSet::from([key("a")]));
        // Taken once: the next list end has nothing to queue again.
        assert!(misses.take().is_empty());
    }

    #[tokio::test]
    async fn the_end_of_a_list_queues_again_only_what_the_cache_now_has() {
        let misses = Misses::default();
        for name in ["listed", "gone"] {
            assert_eq!(misses.lookup(&key(name), |_| None::<()>), None);
        }
        let queue = WorkQueue::new();
        misses.requeue_found(|k| k.name == "listed", &queue);
        assert_eq!(queue.depth(), 1);
        assert_eq!(queue.next().await, Some(key("listed")));
        // Both notes are used up, found or not.
        assert!(misses.take().is_empty());
    }
}
