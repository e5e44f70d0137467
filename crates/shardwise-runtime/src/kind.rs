//! One kind sharded by its own objects, reconciled by the program's own kube-runtime
//! [`Controller`](kube_runtime::Controller). No other kind is needed. Two [`Placement`]s:
//!
//! - [`Placement::Labels`] (the default): each object is placed on a shard by itself. The
//!   elected planner labels it `shardwise.io/shard=<n>` with the holder's lease identity and an
//!   epoch, and moves it with the same drained handoff as any unit (the old owner stops
//!   reconciling it and says so before the new one may start). Every API server selects by
//!   label, so each replica watches only its own objects.
//! - [`Placement::UidRanges`]: a shard owns ranges of the hash of the objects' UIDs, and no
//!   object is written. The ranges are the slices of one unit, the replicas' StatefulSet, always
//!   cut, with their records in UnitSlices (shardwise's CRD must be installed) and the same
//!   drained handoff per range. An API server that serves KEP-5866's `shardSelector`
//!   (Kubernetes 1.36+, gate `ShardedListAndWatch`) sends each replica only its ranges'
//!   objects; others send every object, and the reconcile wrapper keeps to the ranges. The
//!   controller is started again each time the shard's ranges change, so that its watch asks
//!   for the new ones and finds the objects it gained.
//!
//! For each term of ownership (the time the replica holds its shard lease under one identity)
//! the runtime calls the program's function with a [`ShardTerm`], which holds what an existing
//! controller needs to run sharded:
//!
//! - [`ShardTerm::watcher_config`]: the objects this shard owns, for `Controller::new`;
//! - [`ShardTerm::client`]: a client whose requests stop at the term's fence;
//! - [`ShardTerm::reconcile`]: the reconcile function, wrapped so that it runs only on an object
//!   this term owns and is not handing off, recorded in the audit and the metrics.
//!
//! The controller keeps kube-runtime's own `Action`, `ObjectRef`, error policy, `.owns()` and
//! `.watches()`; it runs until the term ends, when the runtime drops it.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::Api;
//! use kube_runtime::controller::{Action, Controller};
//! use shardwise_runtime::kind::{ShardTerm, ShardedKind};
//! use shardwise_runtime::settings::Settings;
//!
//! async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> {
//!     Ok(Action::await_change())
//! }
//!
//! fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<()>) -> Action {
//!     Action::requeue(std::time::Duration::from_secs(1))
//! }
//!
//! async fn control(term: ShardTerm<ConfigMap>) {
//!     let maps = Api::<ConfigMap>::all(term.client());
//!     Controller::new(maps, term.watcher_config())
//!         .run(term.reconcile(reconcile), error_policy, Arc::new(()))
//!         .for_each(|_| async {})
//!         .await;
//! }
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let settings = Settings::builder("ops", "maps-0").build()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! ShardedKind::new(settings, client).run(shutdown, control).await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Client;
use kube::core::Expression;
use kube_runtime::controller::Action;
use kube_runtime::watcher;
use shard_assign::{KeyRange, ShardId, shard_selector};
use shardwise_handoff::keys::SHARD_LABEL;
use shardwise_handoff::plan::ObjectKey;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::{debug, info};

use crate::clients::Connection;
use crate::layout::Layout;
use crate::lease::Fence;
use crate::metrics::Telemetry;
use crate::nouns::Nouns;
use crate::objects::{Object, item_key, key_of};
use crate::owner::gate::UNIT_KEY;
use crate::owner::{Compose, Owner, Readiness, composed, selecting_collection};
use crate::replica::{RunError, ShardedReplica};
use crate::settings::Settings;
use crate::sharded::{self, ContextOf, Sharded, TermOf};

/// The words for a kind sharded by its own objects, in metric labels and the audit:
/// `kind="object"`.
pub const NOUNS: Nouns = Nouns {
    unit: "object",
    units: "objects",
    item: "object",
    items: "objects",
};

/// The words for [`Placement::UidRanges`], in metric labels and the audit: the ranges' unit is
/// the StatefulSet (`kind="statefulset"`), and the program's reconciles count as
/// `kind="object"`.
pub const UID_RANGE_NOUNS: Nouns = Nouns {
    unit: "statefulset",
    units: "statefulsets",
    item: "object",
    items: "objects",
};

/// How the objects of a kind sharded by itself are placed on shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Placement {
    /// A label on each object names its shard: one write per object placed or moved, and
    /// every API server sends each replica only its own objects.
    #[default]
    Labels,
    /// Each shard owns ranges of the hash of the objects' UIDs: nothing is written to the
    /// objects. Needs shardwise's UnitSlice CRD; an API server with KEP-5866's
    /// `shardSelector` sends each replica only its ranges' objects.
    UidRanges,
}

/// The runtime's side of [`Placement::Labels`]: each object a unit with no items, reconciled
/// by the program's controller rather than by this type.
struct OwnObjects<K>(PhantomData<fn() -> K>);

impl<K: Object> Sharded for OwnObjects<K> {
    type Unit = K;
    // Never watched: the planner and the owner run without items for this controller.
    type Item = K;
    type State = ();
    type Error = std::convert::Infallible;

    const NOUNS: Nouns = NOUNS;

    fn unit_of(item: &K) -> ObjectKey {
        key_of(item)
    }

    fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), Self::Error> {
        Ok(())
    }

    // The program's controller reconciles, through `ShardTerm::reconcile`: the runtime starts
    // no worker that would call these.
    async fn reconcile_unit(
        &self,
        _: &TermOf<Self>,
        _: Arc<K>,
    ) -> Result<sharded::Action, Self::Error> {
        Ok(sharded::Action::Done(None))
    }

    async fn reconcile_item(
        &self,
        _: &TermOf<Self>,
        _: Arc<K>,
    ) -> Result<sharded::Action, Self::Error> {
        Ok(sharded::Action::Done(None))
    }
}

/// The runtime's side of [`Placement::UidRanges`]: the objects are the items of one unit, the
/// StatefulSet, reconciled by the program's controller.
struct ObjectRanges<K>(PhantomData<fn() -> K>);

impl<K: Object> Sharded for ObjectRanges<K> {
    type Unit = StatefulSet;
    type Item = K;
    type State = ();
    type Error = std::convert::Infallible;

    const NOUNS: Nouns = UID_RANGE_NOUNS;

    // Never asked: the planner gives every object the StatefulSet (`Layout::KeyRanges`), and
    // the owner watches no items.
    fn unit_of(item: &K) -> ObjectKey {
        key_of(item)
    }

    fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), Self::Error> {
        Ok(())
    }

    async fn reconcile_unit(
        &self,
        _: &TermOf<Self>,
        _: Arc<StatefulSet>,
    ) -> Result<sharded::Action, Self::Error> {
        Ok(sharded::Action::Done(None))
    }

    async fn reconcile_item(
        &self,
        _: &TermOf<Self>,
        _: Arc<K>,
    ) -> Result<sharded::Action, Self::Error> {
        Ok(sharded::Action::Done(None))
    }
}

/// The flags of a replica of a kind sharded by its own objects: [`ReplicaArgs`]' and
/// `--placement`.
///
/// [`ReplicaArgs`]: crate::args::ReplicaArgs
#[cfg(feature = "clap")]
#[derive(Clone, Debug, clap::Parser)]
pub struct KindArgs {
    /// The replica's flags.
    #[command(flatten)]
    pub replica: crate::args::ReplicaArgs,
    /// How the objects are placed on shards: `labels`, a label on each (every API server
    /// selects by it), or `uid-ranges`, ranges of the hash of their UIDs (nothing written to
    /// them; needs shardwise's UnitSlice CRD; the API server selects them where it serves
    /// KEP-5866's shardSelector).
    #[arg(
        long,
        env = "SHARDWISE_PLACEMENT",
        value_enum,
        default_value = "labels"
    )]
    pub placement: Placement,
}

#[cfg(feature = "clap")]
impl KindArgs {
    /// A replica of the controller named `controller_name`, watching `scope`, as these flags
    /// say, reaching the control plane through `connection`.
    pub fn replica<K: Object>(
        &self,
        controller_name: &str,
        scope: crate::settings::WatchScope,
        connection: impl Into<Connection>,
    ) -> Result<ShardedKind<K>, crate::args::ArgsError> {
        let settings = self.replica.settings(controller_name, scope)?;
        Ok(ShardedKind::placed_by(self.placement, settings, connection))
    }
}

enum Replica<K: Object> {
    Labels(ShardedReplica<OwnObjects<K>>),
    UidRanges(ShardedReplica<ObjectRanges<K>>),
}

/// One replica of a controller of kind `K` sharded by its own objects, ready to run: its
/// settings and its way to the control plane. Its metrics and readiness are the program's to
/// serve, as with [`ShardedReplica`].
pub struct ShardedKind<K: Object> {
    replica: Replica<K>,
}

impl<K: Object> std::fmt::Debug for ShardedKind<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedKind").finish_non_exhaustive()
    }
}

impl<K: Object> ShardedKind<K> {
    /// A replica placing objects by [`Placement::Labels`], reaching the control plane through
    /// `connection` (a `kube::Client`, or with the `rustls-tls` feature a `kube::Config`).
    pub fn new(settings: Settings, connection: impl Into<Connection>) -> Self {
        Self::placed_by(Placement::Labels, settings, connection)
    }

    /// A replica placing objects by `placement`.
    pub fn placed_by(
        placement: Placement,
        settings: Settings,
        connection: impl Into<Connection>,
    ) -> Self {
        let replica = match placement {
            Placement::Labels => Replica::Labels(ShardedReplica::new(
                OwnObjects(PhantomData),
                settings,
                connection,
            )),
            Placement::UidRanges => Replica::UidRanges(ShardedReplica::new(
                ObjectRanges(PhantomData),
                settings,
                connection,
            )),
        };
        Self { replica }
    }

    /// The runtime's metrics, to serve at `/metrics`.
    pub fn telemetry(&self) -> &Telemetry {
        match &self.replica {
            Replica::Labels(replica) => replica.telemetry(),
            Replica::UidRanges(replica) => replica.telemetry(),
        }
    }

    /// Whether the replica is ready (it holds its shard and knows which objects it owns), for
    /// `/readyz`.
    pub fn readiness(&self) -> Readiness {
        match &self.replica {
            Replica::Labels(replica) => replica.readiness(),
            Replica::UidRanges(replica) => replica.readiness(),
        }
    }

    /// Runs until `shutdown` is cancelled, then hands the replica's objects over (lets its
    /// reconciles finish, releases its leases) and returns. `control` runs the program's
    /// controller for one term (with [`Placement::UidRanges`], for one set of ranges within a
    /// term); what it returns runs until the term (or the set) ends, when it is dropped.
    pub async fn run<F, Fut>(self, shutdown: CancellationToken, control: F) -> Result<(), RunError>
    where
        F: Fn(ShardTerm<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        match self.replica {
            Replica::Labels(replica) => {
                let compose = Compose {
                    run: Arc::new(move |owner: Arc<Owner<OwnObjects<K>>>| {
                        let work = control(ShardTerm {
                            held: Held::Labels(owner.clone()),
                        });
                        owner.term.spawn(work);
                    }),
                    layout: Layout::OwnObjects,
                };
                replica.composed(compose).run(shutdown).await
            }
            Replica::UidRanges(replica) => {
                let strategy = replica.settings().planner.strategy.kind;
                if !shard_assign::slices(strategy) {
                    return Err(RunError::Uncut(strategy));
                }
                let control = Arc::new(control);
                let compose = Compose {
                    run: Arc::new(move |owner: Arc<Owner<ObjectRanges<K>>>| {
                        owner
                            .term
                            .spawn(follow_ranges(owner.clone(), control.clone()));
                    }),
                    layout: Layout::KeyRanges,
                };
                replica.composed(compose).run(shutdown).await
            }
        }
    }
}

/// How long the ranges of a term wait for more changes before the program's controller starts
/// again on them: a planner's pass writes its records within about this.
const RANGE_CHANGE_BATCHING: Duration = Duration::from_millis(200);

/// Runs the program's controller on the term's ranges of the StatefulSet's objects, again each
/// time they change: the running one first starts no more work and is let finish what it
/// runs (within the shutdown timeout, past which it is cut off and its reconciles end at the
/// gate as dropped), then the next starts on the new ranges, its watch asking the API server
/// for them where it selects by range. One controller at a time works on the shard.
async fn follow_ranges<K, F, Fut>(owner: Arc<Owner<ObjectRanges<K>>>, control: Arc<F>)
where
    K: Object,
    F: Fn(ShardTerm<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let home = &owner.term.slices;
    let unit = ObjectKey::new(&home.namespace, &home.statefulset);
    let mut changes = owner.observed.subscribe();
    let server_selects = owner.probe_server_selection().await;
    // Aborted with this task at the end of the term.
    let mut running: Option<(AbortOnDropHandle<()>, Arc<Ranges<K>>)> = None;
    let mut current: Vec<KeyRange> = Vec::new();
    loop {
        let ranges = owner.term.gate.active_ranges(&unit);
        if ranges != current {
            if let Some((controller, held)) = running.take() {
                held.stop(owner.shutdown_timeout()).await;
                controller.abort();
                let _ = controller.await;
            }
            current = ranges;
            if current.is_empty() {
                debug!("no range of the objects held: the controller waits");
            } else {
                info!(
                    ranges = current.len(),
                    "(re)starting the controller on this shard's ranges of the objects"
                );
                let held = Arc::new(Ranges::new(
                    owner.clone(),
                    unit.clone(),
                    current.clone(),
                    server_selects,
                ));
                let term = ShardTerm {
                    held: Held::Ranges(held.clone()),
                };
                let controller = AbortOnDropHandle::new(tokio::spawn(control(term)));
                running = Some((controller, held));
            }
        }
        if changes.changed().await.is_err() {
            break;
        }
        tokio::time::sleep(RANGE_CHANGE_BATCHING).await;
        changes.mark_unchanged();
    }
    if let Some((controller, _)) = running.take() {
        controller.abort();
        let _ = controller.await;
    }
}

/// The ranges of the StatefulSet's objects a term's controller works on.
struct Ranges<K: Object> {
    owner: Arc<Owner<ObjectRanges<K>>>,
    unit: ObjectKey,
    ranges: Vec<KeyRange>,
    client: Client,
    /// Set once the controller is to give way to the next: it starts no more work.
    stopping: CancellationToken,
    /// The controller's reconciles, to wait for.
    reconciles: TaskTracker,
}

impl<K: Object> Ranges<K> {
    fn new(
        owner: Arc<Owner<ObjectRanges<K>>>,
        unit: ObjectKey,
        ranges: Vec<KeyRange>,
        server_selects: bool,
    ) -> Self {
        let fenced = owner.term.client().clone();
        let selector = server_selects.then(|| shard_selector(&ranges)).flatten();
        let client = match selector {
            Some(selector) => {
                let plural = K::plural(&());
                let path = K::url_path(&(), None);
                let prefix = path.strip_suffix(plural.as_ref()).unwrap_or(path.as_str());
                selecting_collection(&fenced, &selector, prefix, &plural)
            }
            None => fenced,
        };
        Self {
            owner,
            unit,
            ranges,
            client,
            stopping: CancellationToken::new(),
            reconciles: TaskTracker::new(),
        }
    }

    /// Starts no more reconciles, and waits up to `timeout` for those under way.
    async fn stop(&self, timeout: Duration) {
        self.stopping.cancel();
        self.reconciles.close();
        if tokio::time::timeout(timeout, self.reconciles.wait())
            .await
            .is_err()
        {
            info!(
                ?timeout,
                "reconciles still running when the controller gave way: cut off"
            );
        }
    }
}

enum Held<K: Object> {
    Labels(Arc<Owner<OwnObjects<K>>>),
    Ranges(Arc<Ranges<K>>),
}

/// One term of ownership of a kind sharded by its own objects: what the program's controller
/// needs to work on this shard's objects, and only while this term owns them.
pub struct ShardTerm<K: Object> {
    held: Held<K>,
}

impl<K: Object> Clone for ShardTerm<K> {
    fn clone(&self) -> Self {
        let held = match &self.held {
            Held::Labels(owner) => Held::Labels(owner.clone()),
            Held::Ranges(ranges) => Held::Ranges(ranges.clone()),
        };
        Self { held }
    }
}

impl<K: Object> std::fmt::Debug for ShardTerm<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("ShardTerm");
        match &self.held {
            Held::Labels(owner) => debug.field("owner", &owner.term.owner()),
            Held::Ranges(held) => debug
                .field("owner", &held.owner.term.owner())
                .field("ranges", &held.ranges),
        };
        debug.finish()
    }
}

/// How soon an object is looked at again when the controller's watch showed it before the
/// term's own record of it ([`Placement::Labels`]: the two watches see the same change within
/// milliseconds), or when a record of this term covers it but admits no work yet
/// ([`Placement::UidRanges`]: a range whose previous owner is draining it, or a slice merged
/// into an active range and not yet deleted).
pub const UNSEEN_RETRY: Duration = Duration::from_secs(1);

/// The future of one reconcile wrapped by [`ShardTerm::reconcile`].
pub type Reconciling<E> = Pin<Box<dyn Future<Output = Result<Action, E>> + Send>>;

impl<K: Object> ShardTerm<K> {
    /// This replica's shard.
    pub fn shard(&self) -> ShardId {
        match &self.held {
            Held::Labels(owner) => owner.term.shard(),
            Held::Ranges(held) => held.owner.term.shard(),
        }
    }

    /// The ranges of the hash of the objects' UIDs this controller works on
    /// ([`Placement::UidRanges`]); none with [`Placement::Labels`].
    pub fn key_ranges(&self) -> &[KeyRange] {
        match &self.held {
            Held::Labels(_) => &[],
            Held::Ranges(held) => &held.ranges,
        }
    }

    /// What the controller watches. With [`Placement::Labels`], the objects labelled with this
    /// shard (those being handed to or from it among them; [`reconcile`](Self::reconcile)
    /// tells them apart); with [`Placement::UidRanges`], every object, which
    /// [`client`](Self::client) narrows to this shard's ranges where the server can.
    pub fn watcher_config(&self) -> watcher::Config {
        match &self.held {
            Held::Labels(_) => watcher::Config::default().labels_from(
                &Expression::Equal(SHARD_LABEL.into(), self.shard().to_string()).into(),
            ),
            Held::Ranges(_) => watcher::Config::default(),
        }
    }

    /// A client of the control plane whose every request stops once the term is over. With
    /// [`Placement::UidRanges`] on a server that selects by range, its lists and watches of
    /// `K` ask for this shard's ranges alone.
    pub fn client(&self) -> Client {
        match &self.held {
            Held::Labels(owner) => owner.term.client().clone(),
            Held::Ranges(held) => held.client.clone(),
        }
    }

    /// The term's fence: work that is not a request of [`client`](Self::client) (an outside
    /// API, a file) checks [`Fence::check`] just before it.
    pub fn fence(&self) -> &Fence {
        match &self.held {
            Held::Labels(owner) => owner.term.fence(),
            Held::Ranges(held) => held.owner.term.fence(),
        }
    }

    /// `reconcile`, run only on an object this term owns and is not handing off, and never
    /// past the term's fence; each run recorded in the audit and the metrics. An object being
    /// handed off is left alone (it leaves this shard). With [`Placement::Labels`], one whose
    /// record the term has not seen yet (the controller's watch was first) is looked at again
    /// after [`UNSEEN_RETRY`]; with [`Placement::UidRanges`], one under a record of this term
    /// that admits no work yet is looked at again after [`UNSEEN_RETRY`], and one outside the
    /// term's ranges waits for the controller to start again on new ranges.
    pub fn reconcile<Ctx, E, Fut>(
        &self,
        reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    ) -> impl FnMut(Arc<K>, Arc<Ctx>) -> Reconciling<E> + Send + 'static
    where
        Ctx: Send + Sync + 'static,
        E: Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let held = match &self.held {
            Held::Labels(owner) => Held::Labels(owner.clone()),
            Held::Ranges(held) => Held::Ranges(held.clone()),
        };
        move |object, context| {
            let key = key_of(object.as_ref());
            let at = item_key(object.as_ref());
            let work = reconcile(object, context);
            match &held {
                Held::Labels(owner) => {
                    let owner = owner.clone();
                    Box::pin(async move {
                        match composed(&owner, &key, UNIT_KEY, &key, work).await {
                            Some(result) => result,
                            None if owner.term.knows(&key) => Ok(Action::await_change()),
                            None => Ok(Action::requeue(UNSEEN_RETRY)),
                        }
                    })
                }
                Held::Ranges(held) => {
                    let tracked = held.clone();
                    let held = held.clone();
                    Box::pin(tracked.reconciles.track_future(async move {
                        // Giving way to a controller of new ranges, which lists every object.
                        if held.stopping.is_cancelled() {
                            return Ok(Action::await_change());
                        }
                        match composed(&held.owner, &held.unit, at, &key, work).await {
                            Some(result) => result,
                            // Under a record of this term that is not active yet, or one that
                            // still covers a range merged into an active one: soon admitted.
                            None if held.owner.term.gate.record_for(&held.unit, at).is_some() => {
                                Ok(Action::requeue(UNSEEN_RETRY))
                            }
                            // Another shard's: a controller of new ranges lists it again.
                            None => Ok(Action::await_change()),
                        }
                    }))
                }
            }
        }
    }
}
