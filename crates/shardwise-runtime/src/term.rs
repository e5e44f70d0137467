//! What a controller's reconcilers see of a term (the time a replica holds its shard lease
//! under one identity): the term's identity, its fenced client, the caches of its units and
//! items, and its queues. Generic over the unit type `U`, the item type `I` and the
//! controller's state `S`; [`crate::TermOf`] names it for a controller.

use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use kube::Client;
use kube_runtime::reflector::Store;
use shard_assign::{KeyRange, ShardId};
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::plan::ObjectKey;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::audit::Audit;
use crate::lease::Fence;
use crate::metrics::Metrics;
use crate::objects::{Object, key_of, reference};
use crate::owner::gate::{Gate, Misses};
use crate::owner::items::ItemStores;
use crate::owner::queue::WorkQueue;
use crate::settings::WatchScope;

/// Everything of one term but the controller's own state.
pub struct TermContext<U: Object, I: Object> {
    pub(crate) me: OwnerId,
    pub(crate) fence: Fence,
    pub(crate) client: Client,
    pub(crate) scope: WatchScope,
    pub(crate) metrics: Metrics,
    pub(crate) audit: Audit,
    /// Units labelled with this shard: those whose whole record names it.
    pub(crate) units: Store<U>,
    /// Units cut into slices (all of them: a few, and any may have a slice here).
    pub(crate) cut_units: Store<U>,
    pub(crate) items: ItemStores<I>,
    /// Where this StatefulSet's UnitSlices are.
    pub(crate) slices: SliceHome,
    pub(crate) gate: Gate,
    pub(crate) unit_queue: WorkQueue<ObjectKey>,
    /// Items, in the lanes of their units: each unit's items take turns with the others'.
    pub(crate) item_queue: WorkQueue<ObjectKey, ObjectKey>,
    pub(crate) missing_units: Misses,
    pub(crate) missing_items: Misses,
    /// Cancelled when the term ends: in-flight reconciles are abandoned at once.
    pub(crate) cancel: CancellationToken,
    pub(crate) tasks: Mutex<JoinSet<()>>,
}

impl<U: Object, I: Object> std::fmt::Debug for TermContext<U, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermContext")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl<U: Object, I: Object> TermContext<U, I> {
    /// This replica's shard.
    pub fn shard(&self) -> ShardId {
        self.me.shard
    }

    /// The shard and the incarnation its lease is held under in this term.
    pub fn owner(&self) -> OwnerId {
        self.me
    }

    /// The term's fence: a client built with it ([`crate::clients::build_fenced_client`])
    /// sends nothing once the term is over. No reconcile starts past it, but one under way is
    /// not stopped before its next `await`: work that is not a request of such a client (an
    /// outside API, a file) checks [`Fence::check`] just before it.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// A client of the control plane behind the term's fence.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Where units and items are watched (a controller's other watches usually want the
    /// same).
    pub fn scope(&self) -> &WatchScope {
        &self.scope
    }

    /// The replica's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The unit `key`, if this shard's cache has it (labelled with this shard, or cut).
    pub fn unit(&self, key: &ObjectKey) -> Option<Arc<U>> {
        let reference = reference(key);
        self.units
            .get(&reference)
            .or_else(|| self.cut_units.get(&reference))
    }

    /// The item `key`, if this shard's cache has it.
    pub fn item(&self, key: &ObjectKey) -> Option<Arc<I>> {
        self.items.get(key)
    }

    /// The items of this shard that belong to `unit`.
    pub fn items_of(&self, unit: &ObjectKey) -> Vec<Arc<I>> {
        self.items.of_unit(unit, |_| true)
    }

    /// The ranges of `unit`'s item keys this term knows (owns, or is handing off): the whole
    /// range for a unit that is not cut, its slices' for one that is, none for another term's
    /// unit. A controller that caches what a unit's items need keeps only these keys.
    pub fn ranges(&self, unit: &ObjectKey) -> Vec<KeyRange> {
        self.gate.ranges(unit)
    }

    /// Whether this term knows the unit at all: owns it (or a slice of it), or is handing it
    /// off.
    pub(crate) fn knows(&self, unit: &ObjectKey) -> bool {
        self.gate.knows(unit)
    }

    /// Whether this term reconciles the unit itself (of a cut unit, the owner of the slice
    /// holding key 0 does; the others only reconcile the items of their slices).
    pub(crate) fn reports_on(&self, unit: &ObjectKey) -> bool {
        self.gate.reports_on(unit)
    }

    /// The items of `unit` in `range` of its keys.
    pub(crate) fn items_in(&self, unit: &ObjectKey, range: KeyRange) -> Vec<Arc<I>> {
        self.items.in_range(unit, range)
    }

    /// Reconciles the unit again soon.
    pub fn queue_unit(&self, key: ObjectKey) {
        self.unit_queue.add(key);
    }

    /// Reconciles the item again soon.
    pub fn queue_item(&self, key: ObjectKey) {
        match self.items.noted_unit(&key) {
            Some(unit) => self.item_queue.add_in(key, unit),
            None => self.item_queue.add(key),
        }
    }

    /// Reconciles every item of this shard that `select` chooses again soon.
    pub fn queue_items_where(&self, select: impl Fn(&I) -> bool) {
        for item in self.items.filter(select) {
            self.queue_item(key_of(item.as_ref()));
        }
    }

    /// Runs `task` until the term ends.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spawn(task);
    }

    /// Items in this shard's cache.
    pub(crate) fn item_count(&self) -> usize {
        self.items.len()
    }
}

/// Where a StatefulSet's UnitSlices are: its namespace, named after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceHome {
    pub namespace: String,
    pub statefulset: String,
}

/// One term as a controller's reconcilers see it: the [`TermContext`] and the controller's
/// state `S` for the term.
pub struct Term<U: Object, I: Object, S> {
    context: Arc<TermContext<U, I>>,
    state: Arc<S>,
}

impl<U: Object, I: Object, S> Clone for Term<U, I, S> {
    fn clone(&self) -> Self {
        Self {
            context: self.context.clone(),
            state: self.state.clone(),
        }
    }
}

impl<U: Object, I: Object, S> std::fmt::Debug for Term<U, I, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.context.fmt(f)
    }
}

impl<U: Object, I: Object, S> Term<U, I, S> {
    pub(crate) fn new(context: Arc<TermContext<U, I>>, state: S) -> Self {
        Self {
            context,
            state: Arc::new(state),
        }
    }

    /// The controller's state for this term, as [`crate::Sharded::begin_term`] built it.
    pub fn state(&self) -> &S {
        &self.state
    }
}

impl<U: Object, I: Object, S> Deref for Term<U, I, S> {
    type Target = TermContext<U, I>;

    fn deref(&self) -> &TermContext<U, I> {
        &self.context
    }
}
