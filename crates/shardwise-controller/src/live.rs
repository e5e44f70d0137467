//! What shardwise applied to one destination cluster, as the cluster serves it now: one watch
//! per kind in use, selecting only the objects applied there for this FleetCluster (by its
//! [`APP_CLUSTER_LABEL`]), so memory follows the managed objects, not the size of the cluster.
//!
//! Each object is kept as compact JSON with the few fields a look needs at once (its
//! resourceVersion, app UID and app): a parsed JSON tree takes several times the memory.
//!
//! The owner of slices of a cut cluster keeps only the objects of its slices' apps (by the item
//! key of the app UID each object is labelled with), listing again when it takes another slice.
//!
//! A reconcile compares against it instead of writing blindly, and every change or deletion of
//! a managed object on the cluster is reported at once ([`Drift`]), so drift is repaired in
//! seconds rather than at the next resync. The watches stop when the owner drops the
//! destination (the cluster was released, or its credentials changed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, TypeMeta};
use kube::core::{Expression, Selector};
use kube::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use prometheus_client::metrics::gauge::Gauge;
use shard_assign::{KeyRange, app_key};
use shardwise_api::keys::{APP_ANNOTATION, APP_CLUSTER_LABEL, APP_UID_LABEL, MANAGED_BY};
use shardwise_runtime::ObjectKey;
use tokio::sync::{Notify, watch};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};

/// What the watches of a cluster report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// An object of this app changed or went.
    App(ObjectKey),
    /// A watch listed its kind again (after its history was compacted away, say): objects may
    /// have changed or gone unseen meanwhile, so every app of the cluster should look again.
    Relisted,
}

/// Where [`Drift`] goes.
pub type DriftSink = Arc<dyn Fn(Drift) + Send + Sync>;

/// The ranges of item keys (of apps' UIDs) whose objects the owner keeps: the whole range for a
/// cluster it owns whole, its slices' for a cut one. Asked at each listing.
pub type Holding = Arc<dyn Fn() -> Vec<KeyRange> + Send + Sync>;

/// (group, version, kind): one watch each.
type KindKey = (String, String, String);

/// Where the cache of one kind stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Listing {
    /// Not listed yet.
    Pending,
    /// Listed, keeping the objects of apps whose keys are in these ranges: the store is
    /// complete for them (and kept current while the watch runs).
    Ready(Vec<KeyRange>),
    /// Listing failed before it ever succeeded (a missing permission, say): the reason.
    Failed(String),
}

impl Listing {
    fn keeps(&self, key: u64) -> bool {
        matches!(self, Listing::Ready(ranges) if ranges.iter().any(|r| r.contains(key)))
    }
}

/// One object as the cache keeps it.
#[derive(Debug, PartialEq)]
pub struct LiveObject {
    pub resource_version: Option<String>,
    /// Its [`APP_UID_LABEL`].
    pub app_uid: Option<String>,
    /// Its [`APP_ANNOTATION`]: `namespace/name` of the FleetApp.
    pub app: Option<String>,
    /// The whole object, as compact JSON.
    json: Box<str>,
}

impl LiveObject {
    pub fn new(object: &DynamicObject) -> Self {
        let metadata = &object.metadata;
        Self {
            resource_version: metadata.resource_version.clone(),
            app_uid: metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(APP_UID_LABEL))
                .cloned(),
            app: metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(APP_ANNOTATION))
                .cloned(),
            json: serde_json::to_string(object)
                .unwrap_or_default()
                .into_boxed_str(),
        }
    }

    /// The whole object.
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.json).unwrap_or_default()
    }

    /// Bytes it takes in the cache (its JSON and strings; not the map around it).
    fn size(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        std::mem::size_of::<Self>()
            + self.json.len()
            + text(&self.resource_version)
            + text(&self.app_uid)
            + text(&self.app)
    }
}

/// (namespace, name): where an object is.
type Place = (Option<String>, String);

/// The objects of one kind, replaced whole when a listing completes.
#[derive(Debug)]
struct Objects {
    current: RwLock<BTreeMap<Place, Arc<LiveObject>>>,
    /// The bytes `current`'s objects take, kept with every change (under its write lock), so
    /// that the metrics and load reports read it without walking every object.
    bytes: AtomicUsize,
    /// The resourceVersion each of this client's own writes left, until the watch brings it
    /// back: that event is the echo of the write, not drift, and queues nothing.
    own_writes: Mutex<BTreeMap<Place, String>>,
    /// The shard's gauges of every cache, moved with each change of this one.
    gauges: CacheGauges,
    /// Writes of this client waiting for their answer, by place. The watch often brings a
    /// write's event before the write's answer comes: such an event waits for the answer, which
    /// says whether it was the echo.
    in_flight: Mutex<BTreeMap<Place, InFlight>>,
}

/// The objects and bytes of every cache of a shard's clusters. Each cache moves them with each
/// change it takes in, and takes its share away when it goes, so they are right at any moment
/// (not only after the next reconcile).
#[derive(Clone, Debug, Default)]
pub struct CacheGauges {
    pub objects: Gauge,
    pub bytes: Gauge,
}

impl CacheGauges {
    fn moved(&self, objects: i64, bytes: i64) {
        self.objects.inc_by(objects);
        self.bytes.inc_by(bytes);
    }
}

/// A size as a gauge's value.
fn signed(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The writes of one place under way, and the events that came meanwhile.
#[derive(Debug, Default)]
struct InFlight {
    writes: usize,
    /// The resourceVersions of the events that came before the answer.
    early: Vec<Option<String>>,
    /// The app those events name.
    app: Option<ObjectKey>,
}

impl Objects {
    fn new(gauges: CacheGauges) -> Self {
        Self {
            current: RwLock::default(),
            bytes: AtomicUsize::new(0),
            own_writes: Mutex::default(),
            gauges,
            in_flight: Mutex::default(),
        }
    }

    /// Whether an event bringing `place` at `version` is the echo of this client's write
    /// (then forgotten: a later event at another version is news).
    fn is_echo(&self, place: &Place, version: Option<&str>) -> bool {
        let mut own = lock(&self.own_writes);
        let echo = version.is_some() && own.get(place).map(String::as_str) == version;
        if echo {
            own.remove(place);
        }
        echo
    }

    /// Whether an event bringing `place` at `version` waits for the answer of a write under
    /// way, which then judges it.
    fn held_for_answer(
        &self,
        place: &Place,
        version: Option<&str>,
        app: Option<ObjectKey>,
    ) -> bool {
        let mut in_flight = lock(&self.in_flight);
        let Some(pending) = in_flight.get_mut(place) else {
            return false;
        };
        pending.early.push(version.map(str::to_string));
        pending.app = app.or(pending.app.take());
        true
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Place, Arc<LiveObject>>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Place, Arc<LiveObject>>> {
        self.current.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `object` at `place`.
    fn insert(&self, place: Place, object: Arc<LiveObject>) {
        let mut current = self.write();
        let added = object.size();
        self.bytes.fetch_add(added, Ordering::Relaxed);
        let old = current.insert(place, object);
        let removed = old.as_ref().map_or(0, |o| o.size());
        self.bytes.fetch_sub(removed, Ordering::Relaxed);
        self.gauges
            .moved(i64::from(old.is_none()), signed(added) - signed(removed));
    }

    /// Forgets the object at `place`.
    fn remove(&self, place: &Place) {
        let mut current = self.write();
        if let Some(old) = current.remove(place) {
            self.bytes.fetch_sub(old.size(), Ordering::Relaxed);
            self.gauges.moved(-1, -signed(old.size()));
        }
    }

    /// Replaces every object by those of a listing.
    fn replace(&self, listed: BTreeMap<Place, Arc<LiveObject>>) {
        let mut current = self.write();
        let bytes = listed.values().map(|o| o.size()).sum();
        let (before, before_bytes) = (current.len(), self.bytes.load(Ordering::Relaxed));
        let after = listed.len();
        *current = listed;
        self.bytes.store(bytes, Ordering::Relaxed);
        self.gauges.moved(
            signed(after) - signed(before),
            signed(bytes) - signed(before_bytes),
        );
    }

    /// How many objects there are, and the bytes they take.
    fn held(&self) -> (usize, usize) {
        let current = self.read();
        (current.len(), self.bytes.load(Ordering::Relaxed))
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        let (objects, bytes) = self.held();
        self.gauges.moved(-signed(objects), -signed(bytes));
    }
}

fn place(object: &DynamicObject) -> Place {
    (
        object.metadata.namespace.clone(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// The cache of one kind on one cluster.
struct KindCache {
    resource: ApiResource,
    objects: Arc<Objects>,
    listing: watch::Receiver<Listing>,
    /// Asks the watch to list again, with the ranges held now.
    relist: Arc<Notify>,
    /// Where an event held for a write's answer goes if it was not the echo.
    drift: DriftSink,
    _watch: AbortOnDropHandle<()>,
}

/// The managed objects of one destination cluster, kind by kind.
pub struct LiveObjects {
    client: Client,
    selector: Selector,
    kinds: Mutex<BTreeMap<KindKey, Arc<KindCache>>>,
    drift: DriftSink,
    holding: Holding,
    gauges: CacheGauges,
}

impl std::fmt::Debug for LiveObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveObjects")
            .field("selector", &self.selector)
            .field("kinds", &lock(&self.kinds).keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One kind's objects, listed and kept current.
#[derive(Clone)]
pub struct LiveKind(Arc<KindCache>);

impl std::fmt::Debug for LiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LiveKind")
            .field(&self.0.resource.kind)
            .finish()
    }
}

impl LiveKind {
    /// The object `name` (in `namespace` for namespaced kinds) as last seen, if it exists.
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<LiveObject>> {
        let place = (namespace.map(str::to_string), name.to_string());
        self.0.objects.read().get(&place).cloned()
    }

    /// This client is about to write the object; [`Writing::wrote`] takes the server's
    /// answer, and the watch event at its version is the write's echo and queues nothing,
    /// whether it comes before the answer or after.
    pub fn writing(&self, namespace: Option<&str>, name: &str) -> Writing {
        let place = (namespace.map(str::to_string), name.to_string());
        lock(&self.0.objects.in_flight)
            .entry(place.clone())
            .or_default()
            .writes += 1;
        Writing {
            kind: self.clone(),
            place,
            finished: false,
        }
    }
}

/// A write of this client under way ([`LiveKind::writing`]). Dropped without an answer (the
/// write failed), the events that came meanwhile are drift.
#[must_use = "a write under way holds back the watch events of its object"]
pub struct Writing {
    kind: LiveKind,
    place: Place,
    finished: bool,
}

impl Writing {
    /// The server answered the write with `version`.
    pub fn wrote(mut self, version: String) {
        self.finish(Some(version));
    }

    fn finish(&mut self, answer: Option<String>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let cache = &self.kind.0;
        let (early, app) = {
            let mut in_flight = lock(&cache.objects.in_flight);
            let Some(pending) = in_flight.get_mut(&self.place) else {
                return;
            };
            pending.writes = pending.writes.saturating_sub(1);
            let taken = (std::mem::take(&mut pending.early), pending.app.take());
            if pending.writes == 0 {
                in_flight.remove(&self.place);
            }
            taken
        };
        match answer {
            // The echo is still to come.
            Some(version) if early.is_empty() => {
                lock(&cache.objects.own_writes).insert(self.place.clone(), version);
            }
            // It came first, and nothing else did.
            Some(version) if early.iter().all(|v| v.as_deref() == Some(version.as_str())) => {}
            _ if early.is_empty() => {}
            _ => {
                if let Some(app) = app {
                    (cache.drift)(Drift::App(app));
                }
            }
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.finish(None);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The label selector of one FleetCluster's managed objects.
pub fn selector(cluster_label: &str) -> Selector {
    Selector::from_iter([
        Expression::Equal("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
        Expression::Equal(APP_CLUSTER_LABEL.into(), cluster_label.into()),
    ])
}

/// The item key of the app an object was applied for, from its UID label.
fn key_of_object(object: &DynamicObject) -> Option<u64> {
    let uid = object.metadata.labels.as_ref()?.get(APP_UID_LABEL)?;
    Some(app_key(uid))
}

impl LiveObjects {
    /// Watches nothing until a kind is asked for. `gauges`: the shard's, which this cluster's
    /// caches move.
    pub fn new(
        client: Client,
        cluster_label: &str,
        drift: DriftSink,
        holding: Holding,
        gauges: CacheGauges,
    ) -> Self {
        Self {
            client,
            selector: selector(cluster_label),
            kinds: Mutex::new(BTreeMap::new()),
            drift,
            holding,
            gauges,
        }
    }

    /// The objects of `resource`'s kind, once listed with the objects of the app whose item
    /// key is `key`, starting its watch on first use (and listing again if the app's key was
    /// not held at the last listing: a slice taken since). `None` if that does not happen
    /// within `wait`, or listing failed: the caller then writes without comparing, as if
    /// there were no cache.
    pub async fn listed(
        &self,
        resource: &ApiResource,
        key: u64,
        wait: Duration,
    ) -> Option<LiveKind> {
        let cache = self.cache_of(resource);
        let mut listing = cache.listing.clone();
        if matches!(*listing.borrow(), Listing::Ready(_)) && !listing.borrow().keeps(key) {
            cache.relist.notify_one();
        }
        let settled = listing.wait_for(|l| l.keeps(key) || matches!(l, Listing::Failed(_)));
        match tokio::time::timeout(wait, settled).await {
            Ok(Ok(state)) if state.keeps(key) => Some(LiveKind(cache.clone())),
            _ => None,
        }
    }

    /// How many objects the caches hold, and the bytes they take, over every kind.
    pub fn cached(&self) -> (usize, usize) {
        lock(&self.kinds).values().fold((0, 0), |(n, bytes), c| {
            let (objects, size) = c.objects.held();
            (n + objects, bytes + size)
        })
    }

    fn cache_of(&self, resource: &ApiResource) -> Arc<KindCache> {
        let key = (
            resource.group.clone(),
            resource.version.clone(),
            resource.kind.clone(),
        );
        lock(&self.kinds)
            .entry(key)
            .or_insert_with(|| Arc::new(self.watch(resource)))
            .clone()
    }

    fn watch(&self, resource: &ApiResource) -> KindCache {
        let objects = Arc::new(Objects::new(self.gauges.clone()));
        let (report, listing) = watch::channel(Listing::Pending);
        let relist = Arc::new(Notify::new());
        let task = follow(
            Source {
                api: Api::all_with(self.client.clone(), resource),
                config: watcher::Config::default().labels_from(&self.selector),
                types: TypeMeta {
                    api_version: resource.api_version.clone(),
                    kind: resource.kind.clone(),
                },
            },
            Follow {
                objects: objects.clone(),
                listing: None,
                report,
                drift: self.drift.clone(),
                holding: self.holding.clone(),
                relist: relist.clone(),
            },
        );
        KindCache {
            resource: resource.clone(),
            objects,
            listing,
            relist,
            drift: self.drift.clone(),
            _watch: AbortOnDropHandle::new(tokio::spawn(task)),
        }
    }
}

/// What the cache does not need: managed fields and kubectl's copy of the last applied
/// configuration are often larger than the rest of the object.
fn forget_bulk(object: &mut DynamicObject) {
    object.metadata.managed_fields = None;
    if let Some(annotations) = object.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// The app an applied object names in its annotation.
fn app_of(object: &DynamicObject) -> Option<ObjectKey> {
    let annotation = object.metadata.annotations.as_ref()?.get(APP_ANNOTATION)?;
    let (namespace, name) = annotation.split_once('/')?;
    Some(ObjectKey::new(namespace, name))
}

/// Where one kind's objects come from.
struct Source {
    api: Api<DynamicObject>,
    config: watcher::Config,
    /// The items of a list carry no apiVersion and kind; watch events do.
    types: TypeMeta,
}

impl Source {
    fn events(
        &self,
    ) -> impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>> + use<>
    {
        let types = self.types.clone();
        watcher(self.api.clone(), self.config.clone())
            .modify(move |object| {
                forget_bulk(object);
                object.types = Some(types.clone());
            })
            .default_backoff()
    }
}

/// What one kind's watch feeds.
struct Follow {
    objects: Arc<Objects>,
    /// The objects of a listing under way, until it completes.
    listing: Option<BTreeMap<Place, Arc<LiveObject>>>,
    report: watch::Sender<Listing>,
    drift: DriftSink,
    holding: Holding,
    relist: Arc<Notify>,
}

impl Follow {
    /// Takes in one event of a listing that keeps `ranges`; `relisted` once a listing was
    /// complete before (this one then reports [`Drift::Relisted`] when it completes).
    fn event(
        &mut self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
        ranges: &[KeyRange],
        relisted: bool,
        kind: &str,
    ) {
        let kept = |object: &DynamicObject| {
            key_of_object(object).is_some_and(|key| ranges.iter().any(|r| r.contains(key)))
        };
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object))
                if !kept(&object) => {}
            Ok(watcher::Event::Init) => self.listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(object)) => {
                let listing = self.listing.get_or_insert_default();
                listing.insert(place(&object), Arc::new(LiveObject::new(&object)));
            }
            Ok(watcher::Event::InitDone) => {
                self.objects
                    .replace(self.listing.take().unwrap_or_default());
                if relisted {
                    debug!(%kind, "listed again: every app of the cluster looks again");
                    (self.drift)(Drift::Relisted);
                }
                self.report.send_replace(Listing::Ready(ranges.to_vec()));
            }
            Ok(watcher::Event::Apply(object)) => {
                let place = place(&object);
                let version = object.metadata.resource_version.as_deref();
                let echo = self.objects.is_echo(&place, version);
                let held = !echo
                    && self
                        .objects
                        .held_for_answer(&place, version, app_of(&object));
                let live = Arc::new(LiveObject::new(&object));
                self.objects.insert(place, live);
                if !echo && !held {
                    self.report_app(&object);
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                let place = place(&object);
                lock(&self.objects.own_writes).remove(&place);
                self.objects.remove(&place);
                if kept(&object) {
                    self.report_app(&object);
                }
            }
            Err(e) => {
                // Once listed, the cache stays usable while the watch recovers: the relist
                // that follows reports what changed meanwhile.
                if matches!(*self.report.borrow(), Listing::Pending) {
                    warn!(%kind, error = %e, "cannot list managed objects; applying without comparing");
                    self.report.send_replace(Listing::Failed(e.to_string()));
                }
            }
        }
    }

    /// Queues the app that applied `object`, which changed or went.
    fn report_app(&self, object: &DynamicObject) {
        if let Some(app) = app_of(object) {
            (self.drift)(Drift::App(app));
        }
    }

    fn listed_before(&self) -> bool {
        matches!(*self.report.borrow(), Listing::Ready(_))
    }
}

/// Follows one kind's watch, listing again (with the ranges held then) when asked.
async fn follow(source: Source, mut state: Follow) {
    loop {
        let ranges = (state.holding)();
        let mut events = std::pin::pin!(source.events());
        let mut relisted = state.listed_before();
        loop {
            tokio::select! {
                () = state.relist.notified() => break,
                event = events.next() => match event {
                    Some(event) => {
                        let done = matches!(event, Ok(watcher::Event::InitDone));
                        state.event(event, &ranges, relisted, &source.types.kind);
                        relisted |= done;
                    }
                    None => return,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(name: &str, uid: &str, annotations: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "team", "annotations": annotations,
                         "labels": {APP_UID_LABEL: uid},
                         "managedFields": [{"manager": "shardwise"}]},
        }))
        .unwrap()
    }

    /// What a [`Follow`] reports, and its store.
    type Seen = Arc<Mutex<Vec<Drift>>>;

    /// A [`Follow`] that records what it reports, and its objects.
    fn follower() -> (Follow, Arc<Objects>, watch::Receiver<Listing>, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink: DriftSink = {
            let seen = seen.clone();
            Arc::new(move |d| lock(&seen).push(d))
        };
        let objects = Arc::new(Objects::new(CacheGauges::default()));
        let (report, listing) = watch::channel(Listing::Pending);
        let follow = Follow {
            objects: objects.clone(),
            listing: None,
            report,
            drift: sink,
            holding: Arc::new(|| vec![KeyRange::WHOLE]),
            relist: Arc::new(Notify::new()),
        };
        (follow, objects, listing, seen)
    }

    #[test]
    fn changes_name_their_app_and_a_second_listing_asks_for_all() {
        let (mut follow, store, listing, seen) = follower();
        let with_app = object("a", "u-1", json!({APP_ANNOTATION: "fleet/web"}));
        let without = object("b", "u-2", json!({}));
        let whole = [KeyRange::WHOLE];
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(with_app.clone()),
            watcher::Event::InitDone,
        ] {
            follow.event(Ok(event), &whole, false, "ConfigMap");
        }
        assert_eq!(*listing.borrow(), Listing::Ready(whole.to_vec()));
        assert_eq!(store.read().len(), 1);
        for event in [
            watcher::Event::Apply(with_app.clone()),
            watcher::Event::Delete(without),
            watcher::Event::Delete(with_app),
        ] {
            follow.event(Ok(event), &whole, false, "ConfigMap");
        }
        assert_eq!(store.read().len(), 0);
        assert!(follow.listed_before());
        follow.event(Ok(watcher::Event::Init), &whole, true, "ConfigMap");
        follow.event(Ok(watcher::Event::InitDone), &whole, true, "ConfigMap");
        let web = ObjectKey::new("fleet", "web");
        assert_eq!(
            *lock(&seen),
            vec![Drift::App(web.clone()), Drift::App(web), Drift::Relisted]
        );
    }

    #[test]
    fn the_bytes_held_follow_every_change_without_a_walk() {
        let objects = Objects::new(CacheGauges::default());
        let walked = |o: &Objects| {
            let current = o.read();
            (
                current.len(),
                current.values().map(|x| x.size()).sum::<usize>(),
            )
        };
        let live = |name: &str, data: &str| {
            let mut o = object(name, "u-1", json!({APP_ANNOTATION: "fleet/web"}));
            o.data = json!({"data": {"k": data}});
            Arc::new(LiveObject::new(&o))
        };
        let place = |name: &str| (Some("team".to_string()), name.to_string());
        objects.insert(place("a"), live("a", "short"));
        objects.insert(place("a"), live("a", &"long".repeat(100)));
        objects.insert(place("b"), live("b", "x"));
        assert_eq!(objects.held(), walked(&objects));
        assert_eq!(objects.held().0, 2);
        objects.remove(&place("a"));
        objects.remove(&place("missing"));
        assert_eq!(objects.held(), walked(&objects));
        objects.replace(BTreeMap::from([(place("c"), live("c", "listed"))]));
        assert_eq!(objects.held(), walked(&objects));
        assert_eq!(objects.held().0, 1);
        assert!(objects.held().1 > 0);
    }

    #[test]
    fn the_shard_gauges_follow_every_cache_and_lose_one_that_goes() {
        let gauges = CacheGauges::default();
        let cache = || Objects::new(gauges.clone());
        let live = |name: &str, data: &str| {
            let mut o = object(name, "u-1", json!({APP_ANNOTATION: "fleet/web"}));
            o.data = json!({"data": {"k": data}});
            Arc::new(LiveObject::new(&o))
        };
        let place = |name: &str| (Some("team".to_string()), name.to_string());
        let total = |caches: &[&Objects]| {
            caches.iter().fold((0, 0), |(n, b), c| {
                let (cn, cb) = c.held();
                (n + signed(cn), b + signed(cb))
            })
        };
        let shown = || (gauges.objects.get(), gauges.bytes.get());
        let (one, two) = (cache(), cache());
        one.insert(place("a"), live("a", "short"));
        one.insert(place("a"), live("a", &"long".repeat(50)));
        two.replace(BTreeMap::from([
            (place("b"), live("b", "x")),
            (place("c"), live("c", "y")),
        ]));
        assert_eq!(shown(), total(&[&one, &two]));
        assert_eq!(shown().0, 3);
        two.remove(&place("b"));
        two.remove(&place("missing"));
        two.replace(BTreeMap::from([(place("d"), live("d", "z"))]));
        assert_eq!(shown(), total(&[&one, &two]));
        drop(two);
        assert_eq!(shown(), total(&[&one]));
        drop(one);
        assert_eq!(shown(), (0, 0));
    }

    #[tokio::test]
    async fn the_echo_of_an_own_write_is_no_drift_and_a_later_change_is() {
        let (mut follow, store, _, seen) = follower();
        let kind = LiveKind(Arc::new(KindCache {
            resource: ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            objects: store.clone(),
            listing: watch::channel(Listing::Pending).1,
            relist: Arc::new(Notify::new()),
            drift: {
                let seen = seen.clone();
                Arc::new(move |d| lock(&seen).push(d))
            },
            _watch: AbortOnDropHandle::new(tokio::spawn(async {})),
        }));
        let at = |version: &str| {
            let mut o = object("a", "u-1", json!({APP_ANNOTATION: "fleet/web"}));
            o.metadata.resource_version = Some(version.into());
            watcher::Event::Apply(o)
        };
        let whole = [KeyRange::WHOLE];
        kind.writing(Some("team"), "a").wrote("7".into());
        // Our write's own event, then a hand edit, then the same version again (a relist's
        // replay: the echo was consumed, so it counts).
        for event in [at("7"), at("8"), at("7")] {
            follow.event(Ok(event), &whole, false, "ConfigMap");
        }
        let web = ObjectKey::new("fleet", "web");
        assert_eq!(
            *lock(&seen),
            vec![Drift::App(web.clone()), Drift::App(web.clone())]
        );
        assert_eq!(store.read().len(), 1);
        // An event that comes before the write's answer waits for it: the echo is no drift.
        lock(&seen).clear();
        let writing = kind.writing(Some("team"), "a");
        follow.event(Ok(at("9")), &whole, false, "ConfigMap");
        assert!(lock(&seen).is_empty(), "held until the answer");
        writing.wrote("9".into());
        assert!(lock(&seen).is_empty(), "the echo came first");
        assert_eq!(store.read().len(), 1, "the cache has it all the same");
        // Another version before the answer is drift, and so is anything seen meanwhile by a
        // write that failed.
        let writing = kind.writing(Some("team"), "a");
        follow.event(Ok(at("10")), &whole, false, "ConfigMap");
        writing.wrote("11".into());
        assert_eq!(*lock(&seen), vec![Drift::App(web)]);
        let writing = kind.writing(Some("team"), "a");
        follow.event(Ok(at("12")), &whole, false, "ConfigMap");
        drop(writing);
        assert_eq!(lock(&seen).len(), 2);
        // A deletion forgets the write: the same version afterwards is news.
        kind.writing(Some("team"), "a").wrote("13".into());
        let gone = object("a", "u-1", json!({APP_ANNOTATION: "fleet/web"}));
        follow.event(Ok(watcher::Event::Delete(gone)), &whole, false, "ConfigMap");
        follow.event(Ok(at("13")), &whole, false, "ConfigMap");
        assert_eq!(lock(&seen).len(), 4);
        assert!(lock(&store.in_flight).is_empty() && lock(&store.own_writes).is_empty());
    }

    #[test]
    fn only_the_objects_of_held_slices_are_kept_and_reported() {
        let (mut follow, store, listing, seen) = follower();
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        // Two apps, one in each half of the key space.
        let uid_in = |range: KeyRange| {
            (0..)
                .map(|i| format!("uid-{i}"))
                .find(|uid| range.contains(app_key(uid)))
                .unwrap()
        };
        let mine = object("mine", &uid_in(low), json!({APP_ANNOTATION: "fleet/mine"}));
        let theirs = object(
            "theirs",
            &uid_in(high),
            json!({APP_ANNOTATION: "fleet/theirs"}),
        );
        let held = [low];
        follow.event(Ok(watcher::Event::Init), &held, false, "ConfigMap");
        for o in [&mine, &theirs] {
            follow.event(
                Ok(watcher::Event::InitApply(o.clone())),
                &held,
                false,
                "ConfigMap",
            );
        }
        follow.event(Ok(watcher::Event::InitDone), &held, false, "ConfigMap");
        assert_eq!(store.read().len(), 1);
        assert!(listing.borrow().keeps(app_key(&uid_in(low))));
        assert!(!listing.borrow().keeps(app_key(&uid_in(high))));
        for o in [&mine, &theirs] {
            follow.event(
                Ok(watcher::Event::Apply(o.clone())),
                &held,
                false,
                "ConfigMap",
            );
        }
        assert_eq!(
            *lock(&seen),
            vec![Drift::App(ObjectKey::new("fleet", "mine"))]
        );
        assert_eq!(store.read().len(), 1);
    }

    #[test]
    fn a_failure_before_the_first_listing_is_reported_and_later_ones_are_not() {
        let failure = || Err(watcher::Error::NoResourceVersion);
        let whole = [KeyRange::WHOLE];
        let (mut follow, _, listing, _) = follower();
        follow.event(failure(), &whole, false, "X");
        assert!(matches!(*listing.borrow(), Listing::Failed(_)));
        let (mut follow, _, listing, _) = follower();
        follow.event(Ok(watcher::Event::Init), &whole, false, "X");
        follow.event(Ok(watcher::Event::InitDone), &whole, false, "X");
        follow.event(failure(), &whole, false, "X");
        assert_eq!(*listing.borrow(), Listing::Ready(whole.to_vec()));
    }

    #[test]
    fn an_object_is_kept_as_compact_json_with_what_a_look_needs_at_once() {
        let mut o = object("a", "u-1", json!({APP_ANNOTATION: "fleet/web"}));
        o.metadata.resource_version = Some("42".into());
        forget_bulk(&mut o);
        let live = LiveObject::new(&o);
        assert_eq!(
            (
                live.resource_version.as_deref(),
                live.app_uid.as_deref(),
                live.app.as_deref()
            ),
            (Some("42"), Some("u-1"), Some("fleet/web"))
        );
        assert_eq!(live.value(), serde_json::to_value(&o).unwrap());
        let json = serde_json::to_string(&o).unwrap().len();
        assert!(
            live.size() >= json && live.size() < json + 200,
            "{}",
            live.size()
        );
    }

    #[test]
    fn the_cache_keeps_no_managed_fields_and_no_last_applied_copy() {
        let mut o = object(
            "a",
            "u",
            json!({
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                APP_ANNOTATION: "fleet/web",
            }),
        );
        forget_bulk(&mut o);
        assert!(o.metadata.managed_fields.is_none());
        let annotations = o.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), [APP_ANNOTATION]);
        assert_eq!(
            selector("0123").to_string(),
            "app.kubernetes.io/managed-by=shardwise,shardwise.io/cluster=0123"
        );
    }
}
