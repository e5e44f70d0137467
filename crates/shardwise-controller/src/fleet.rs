//! shardwise's controller as a user of the sharding runtime: FleetClusters are the units it
//! places, FleetApps the items that follow them. It probes clusters, applies and prunes apps,
//! and reports on both; the runtime decides which replica does so, and when.

mod apps;
mod clusters;
mod metrics;
mod status;

pub use metrics::FleetMetrics;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use kube::ResourceExt;
use kube_runtime::reflector::{self, ObjectRef, Store};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_api::{FleetApp, FleetCluster, FleetPolicy};
use shardwise_runtime::decode::decode_each;
use shardwise_runtime::objects::api_over;
use shardwise_runtime::settings::RequestLimit;
use shardwise_runtime::{
    Action, ContextOf, Nouns, ObjectKey, ObjectKind, Sharded, TermOf, UnitPlacement,
};
use tracing::warn;

use crate::destination::Destination;
use crate::live::{Drift, DriftSink, Holding};
use metrics::HealthCount;

/// What the controller itself is configured with (the runtime has the rest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetSettings {
    /// Look at every app again this often (drift is seen at once through the watches; this is
    /// the safety net).
    pub resync_interval: Duration,
    /// Probe every destination cluster this often.
    pub probe_interval: Duration,
    /// Requests to each destination cluster.
    pub cluster_limit: RequestLimit,
    /// Timeout of one request to a destination cluster.
    pub cluster_timeout: Duration,
}

/// The Fleet controller.
#[derive(Clone, Debug)]
pub struct FleetController {
    pub settings: FleetSettings,
    pub metrics: FleetMetrics,
}

impl FleetController {
    /// What a reconcile that failed until its spec changes ends with: a look at the next
    /// resync (what it references may have changed meanwhile).
    fn invalid(&self) -> Action {
        Action::Invalid(Some(self.settings.resync_interval))
    }
}

/// What one term keeps: the destination clients of its clusters (behind the term's fence, each
/// with its cache of live objects) and the FleetPolicies of the namespace (they are few, and
/// any app may name one).
pub struct FleetTerm {
    destinations: Mutex<BTreeMap<ObjectKey, Arc<Destination>>>,
    policies: Store<FleetPolicy>,
    /// Where drift on a cluster queues its apps. Weak: the term's context outlives nothing it
    /// keeps, and a destination's watches must not keep the term alive.
    context: Weak<ContextOf<FleetController>>,
    /// The health of the apps this term reconciled, counted for the metrics.
    health: HealthCount,
}

impl std::fmt::Debug for FleetTerm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetTerm").finish_non_exhaustive()
    }
}

impl FleetTerm {
    fn destinations(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, Arc<Destination>>> {
        self.destinations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn destination(&self, cluster: &ObjectKey) -> Option<Arc<Destination>> {
        self.destinations().get(cluster).cloned()
    }

    fn set_destination(&self, cluster: &ObjectKey, destination: Option<Arc<Destination>>) {
        match destination {
            Some(d) => self.destinations().insert(cluster.clone(), d),
            None => self.destinations().remove(cluster),
        };
    }

    /// Queues the apps that drift on `cluster` concerns, while the term lasts.
    fn drift_sink(&self, cluster: &ObjectKey) -> DriftSink {
        let context = self.context.clone();
        let cluster = cluster.clone();
        Arc::new(move |drift| {
            let Some(term) = context.upgrade() else {
                return;
            };
            match drift {
                Drift::App(app) => term.queue_item(app),
                Drift::Relisted => term.queue_items_where(|app| cluster_of(app) == cluster),
            }
        })
    }

    /// The ranges of `cluster`'s item keys this term holds, while the term lasts.
    fn holding(&self, cluster: &ObjectKey) -> Holding {
        let context = self.context.clone();
        let cluster = cluster.clone();
        Arc::new(move || {
            context
                .upgrade()
                .map(|term| term.ranges(&cluster))
                .unwrap_or_default()
        })
    }

    /// The FleetPolicy `name` in `namespace`, once the policies are listed.
    async fn policy(&self, namespace: &str, name: &str) -> Option<Arc<FleetPolicy>> {
        self.policies.wait_until_ready().await.ok()?;
        self.policies.get(&ObjectRef::new(name).within(namespace))
    }
}

/// The FleetCluster an app targets.
pub fn cluster_of(app: &FleetApp) -> ObjectKey {
    ObjectKey::new(
        app.namespace().unwrap_or_default(),
        app.spec.destination.cluster.clone(),
    )
}

impl Sharded for FleetController {
    type Unit = FleetCluster;
    type Item = FleetApp;
    type State = FleetTerm;
    type Error = kube::Error;

    const NOUNS: Nouns = Nouns {
        unit: "cluster",
        units: "clusters",
        item: "app",
        items: "apps",
    };

    /// Measured: holding a cluster more (a destination client and a watch per kind) costs a
    /// replica 273 KiB of resident memory (docs/benchmarks.md, "What a cache copy costs"). In
    /// the currency of the bytes reported (compact JSON, which takes 1.26 resident bytes per
    /// byte: "Memory per replica"), that is 222 KiB.
    const COPY_BYTES: u64 = 222 * 1024;

    fn unit_of(app: &FleetApp) -> ObjectKey {
        cluster_of(app)
    }

    fn placement(cluster: &FleetCluster) -> UnitPlacement {
        UnitPlacement {
            pin: cluster.spec.shard,
            weight: cluster.spec.weight,
        }
    }

    fn begin_term(&self, term: &Arc<ContextOf<Self>>) -> Result<FleetTerm, kube::Error> {
        let (policies, writer) = reflector::store();
        let api = api_over::<FleetPolicy>(term.client(), term.scope());
        let events = decode_each(watcher(api, watcher::Config::default()), policies.clone(), |bad| {
            warn!(name = ?bad.metadata.name, reason = %bad.reason, "cannot read FleetPolicy; ignoring it");
        })
        .modify(|p: &mut FleetPolicy| p.metadata.managed_fields = None)
        .default_backoff();
        let events = reflector::reflector(writer, events);
        term.spawn(apps::follow_policies(term.clone(), events));
        Ok(FleetTerm {
            destinations: Mutex::new(BTreeMap::new()),
            policies,
            context: Arc::downgrade(term),
            health: HealthCount::new(self.metrics.clone()),
        })
    }

    async fn synced(&self, term: &TermOf<Self>) {
        let _ = term.state().policies.wait_until_ready().await;
    }

    async fn reconcile_unit(
        &self,
        term: &TermOf<Self>,
        cluster: Arc<FleetCluster>,
    ) -> Result<Action, kube::Error> {
        clusters::reconcile(self, term, &cluster).await?;
        Ok(Action::Done(Some(self.settings.probe_interval)))
    }

    async fn reconcile_item(
        &self,
        term: &TermOf<Self>,
        app: Arc<FleetApp>,
    ) -> Result<Action, kube::Error> {
        apps::reconcile(self, term, &app).await
    }

    async fn reconcile_orphan(
        &self,
        term: &TermOf<Self>,
        app: Arc<FleetApp>,
    ) -> Result<Option<Action>, kube::Error> {
        apps::report_missing_cluster(self, term, &app).await
    }

    fn released(&self, term: &TermOf<Self>, cluster: &ObjectKey) {
        let state = term.state();
        state.set_destination(cluster, None);
        state.health.forget(cluster, |_| false);
    }

    fn cached_bytes(&self, term: &TermOf<Self>, cluster: &ObjectKey) -> Option<u64> {
        let destination = term.state().destination(cluster)?;
        u64::try_from(destination.cached().1).ok()
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry, shard: u32) {
        self.metrics.register(registry, shard);
    }

    fn unreadable_status(kind: ObjectKind, reason: &str) -> Option<serde_json::Value> {
        Some(status::unreadable(kind, reason))
    }
}
