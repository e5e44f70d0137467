//! What shardwise applied to one destination cluster, as the cluster serves it now: one watch
//! per kind in use, selecting only the objects applied there for this FleetCluster (by its
//! [`APP_CLUSTER_LABEL`]), so memory follows the managed objects, not the size of the cluster.
//!
//! A reconcile compares against it instead of writing blindly, and every change or deletion of
//! a managed object on the cluster is reported at once ([`Drift`]), so drift is repaired in
//! seconds rather than at the next resync. The watches stop when the owner drops the
//! destination (the cluster was released, or its credentials changed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, TypeMeta};
use kube::{Api, Client};
use kube_runtime::reflector::{self, ObjectRef, Store};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_api::keys::{APP_ANNOTATION, APP_CLUSTER_LABEL, MANAGED_BY};
use shardwise_runtime::ObjectKey;
use tokio::sync::watch;
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

/// (group, version, kind): one watch each.
type KindKey = (String, String, String);

/// Where the cache of one kind stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Listing {
    /// Not listed yet.
    Pending,
    /// Listed: the store is complete (and kept current while the watch runs).
    Ready,
    /// Listing failed before it ever succeeded (a missing permission, say): the reason.
    Failed(String),
}

/// The cache of one kind on one cluster.
struct KindCache {
    resource: ApiResource,
    store: Store<DynamicObject>,
    listing: watch::Receiver<Listing>,
    _watch: AbortOnDropHandle<()>,
}

/// The managed objects of one destination cluster, kind by kind.
pub struct LiveObjects {
    client: Client,
    selector: String,
    kinds: Mutex<BTreeMap<KindKey, Arc<KindCache>>>,
    drift: DriftSink,
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
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        let mut reference = ObjectRef::new_with(name, self.0.resource.clone());
        if let Some(ns) = namespace {
            reference = reference.within(ns);
        }
        self.0.store.get(&reference)
    }

    /// Every object of the kind in the cache.
    pub fn len(&self) -> usize {
        self.0.store.len()
    }

    /// Whether the cache of the kind holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The label selector of one FleetCluster's managed objects.
pub fn selector(cluster_label: &str) -> String {
    format!("app.kubernetes.io/managed-by={MANAGED_BY},{APP_CLUSTER_LABEL}={cluster_label}")
}

impl LiveObjects {
    /// Watches nothing until a kind is asked for.
    pub fn new(client: Client, cluster_label: &str, drift: DriftSink) -> Self {
        Self {
            client,
            selector: selector(cluster_label),
            kinds: Mutex::new(BTreeMap::new()),
            drift,
        }
    }

    /// The objects of `resource`'s kind once listed, starting its watch on first use; `None`
    /// if they are not listed within `wait`, or listing them failed (the caller then writes
    /// without comparing, as if the cache did not exist).
    pub async fn listed(&self, resource: &ApiResource, wait: Duration) -> Option<LiveKind> {
        let cache = self.cache_of(resource);
        let mut listing = cache.listing.clone();
        let settled = tokio::time::timeout(wait, listing.wait_for(|l| *l != Listing::Pending));
        match settled.await {
            Ok(Ok(state)) if *state == Listing::Ready => Some(LiveKind(cache)),
            _ => None,
        }
    }

    /// How many objects the caches hold, over every kind.
    pub fn cached_objects(&self) -> usize {
        lock(&self.kinds).values().map(|c| c.store.len()).sum()
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
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let config = watcher::Config::default().labels(&self.selector);
        let types = TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        };
        let events = watcher(api, config)
            .modify(move |object| {
                forget_bulk(object);
                // The items of a list carry no apiVersion and kind; watch events do.
                object.types = Some(types.clone());
            })
            .default_backoff();
        let (report, listing) = watch::channel(Listing::Pending);
        let task = follow(
            reflector::reflector(writer, events),
            report,
            self.drift.clone(),
            resource.kind.clone(),
        );
        KindCache {
            resource: resource.clone(),
            store,
            listing,
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

/// Follows one kind's watch: reports the listing and every change.
async fn follow(
    events: impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
    report: watch::Sender<Listing>,
    drift: DriftSink,
    kind: String,
) {
    let mut events = std::pin::pin!(events);
    let mut listed_before = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                if let Some(app) = app_of(&object) {
                    drift(Drift::App(app));
                }
            }
            Ok(watcher::Event::InitDone) => {
                if listed_before {
                    debug!(%kind, "listed again: every app of the cluster looks again");
                    drift(Drift::Relisted);
                }
                listed_before = true;
                report.send_replace(Listing::Ready);
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(e) => {
                // Once listed, the cache stays usable while the watch recovers: the relist
                // that follows reports what changed meanwhile.
                if !listed_before {
                    warn!(%kind, error = %e, "cannot list managed objects; applying without comparing");
                    report.send_replace(Listing::Failed(e.to_string()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(annotations: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "team", "annotations": annotations,
                         "managedFields": [{"manager": "shardwise"}]},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn changes_name_their_app_and_a_second_listing_asks_for_all() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink: DriftSink = {
            let seen = seen.clone();
            Arc::new(move |d| lock(&seen).push(d))
        };
        let with_app = object(json!({APP_ANNOTATION: "fleet/web"}));
        let without = object(json!({}));
        let events = futures::stream::iter([
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(with_app.clone())),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(with_app.clone())),
            Ok(watcher::Event::Delete(without)),
            Ok(watcher::Event::Delete(with_app)),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ]);
        let (report, listing) = watch::channel(Listing::Pending);
        follow(events, report, sink, "ConfigMap".into()).await;
        let web = ObjectKey::new("fleet", "web");
        assert_eq!(
            *lock(&seen),
            vec![Drift::App(web.clone()), Drift::App(web), Drift::Relisted]
        );
        assert_eq!(*listing.borrow(), Listing::Ready);
    }

    #[tokio::test]
    async fn a_failure_before_the_first_listing_is_reported_and_later_ones_are_not() {
        let sink: DriftSink = Arc::new(|_| {});
        let failure = || Err(watcher::Error::NoResourceVersion);
        let (report, listing) = watch::channel(Listing::Pending);
        follow(
            futures::stream::iter([failure()]),
            report,
            sink.clone(),
            "X".into(),
        )
        .await;
        assert!(matches!(*listing.borrow(), Listing::Failed(_)));
        let (report, listing) = watch::channel(Listing::Pending);
        let events = [
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
            failure(),
        ];
        follow(futures::stream::iter(events), report, sink, "X".into()).await;
        assert_eq!(*listing.borrow(), Listing::Ready);
    }

    #[test]
    fn the_cache_keeps_no_managed_fields_and_no_last_applied_copy() {
        let mut o = object(json!({
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            APP_ANNOTATION: "fleet/web",
        }));
        forget_bulk(&mut o);
        assert!(o.metadata.managed_fields.is_none());
        let annotations = o.metadata.annotations.unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), [APP_ANNOTATION]);
        assert_eq!(
            selector("0123"),
            "app.kubernetes.io/managed-by=shardwise,shardwise.io/cluster=0123"
        );
    }
}
