//! What a sharded controller implements: its whole contract with the runtime.
//!
//! A controller names two kinds of object. A **unit** is what the planner places on a shard
//! (shardwise's controller: a FleetCluster). An **item** belongs to exactly one unit and follows
//! it to its shard (a FleetApp, which belongs to the cluster it targets). The controller says
//! how to reconcile each; the runtime decides which replica may, and when.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shard_assign::ShardId;
use shardwise_handoff::plan::ObjectKey;

use crate::nouns::Nouns;
use crate::objects::Object;
use crate::term::{Term, TermContext};

/// The [`Term`] of controller `C`.
pub type TermOf<C> = Term<<C as Sharded>::Unit, <C as Sharded>::Item, <C as Sharded>::State>;

/// The [`TermContext`] of controller `C`.
pub type ContextOf<C> = TermContext<<C as Sharded>::Unit, <C as Sharded>::Item>;

/// How a unit weighs in placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitPlacement {
    /// The shard it must go to while that shard is live.
    pub pin: Option<ShardId>,
    /// The load of each of its items (1 when unset).
    pub weight: Option<u32>,
}

/// The kinds of object the runtime reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    /// What the planner places ([`Sharded::Unit`]).
    Unit,
    /// What follows a unit ([`Sharded::Item`]).
    Item,
}

/// What a reconcile ended with: how it counts in the metrics, and when to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Done; reconcile again after the delay, if any (drift correction, a probe).
    Done(Option<Duration>),
    /// Failed in a way only a change can fix: counted as an error and looked at again after
    /// the delay, if any, without backing off.
    Invalid(Option<Duration>),
    /// Failed in a way that may pass by itself: retried with exponential backoff.
    Retry,
}

/// A sharded controller.
///
/// The runtime calls `reconcile_unit` and `reconcile_item` only on the replica that owns the
/// unit, only while it holds its shard lease under the identity the unit is stamped with, and
/// never during a handoff. A unit too big for one shard may be cut into slices of its items
/// (keyed by the FNV-1a hash of their UIDs), each owned and handed off on its own: then
/// `reconcile_item` runs on the owner of the item's slice, and `reconcile_unit` on the owner of
/// the slice holding key 0 only, so that one replica reports on the unit; every request made through [`TermContext::client`] (or a client
/// built with [`TermContext::fence`]) stops at the lease's fence. A controller needs nothing
/// else to be safe: it must not write what belongs to a unit by any other path.
///
/// ```
/// use std::sync::Arc;
///
/// use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
/// use kube::ResourceExt;
/// use shardwise_runtime::{Action, ContextOf, Nouns, ObjectKey, Sharded, TermOf};
///
/// /// Places namespaces; the ConfigMaps in each follow it.
/// struct Labeller;
///
/// impl Sharded for Labeller {
///     type Unit = Namespace;
///     type Item = ConfigMap;
///     type State = ();
///     type Error = kube::Error;
///     const NOUNS: Nouns = Nouns {
///         unit: "namespace",
///         units: "namespaces",
///         item: "configmap",
///         items: "configmaps",
///     };
///
///     fn unit_of(item: &ConfigMap) -> ObjectKey {
///         ObjectKey::new("", item.namespace().unwrap_or_default())
///     }
///
///     fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), kube::Error> {
///         Ok(())
///     }
///
///     async fn reconcile_unit(&self, term: &TermOf<Self>, ns: Arc<Namespace>) -> Result<Action, kube::Error> {
///         let count = term.items_of(&ObjectKey::new("", ns.name_any())).len();
///         tracing::info!(namespace = %ns.name_any(), count, "reconciled");
///         Ok(Action::Done(None))
///     }
///
///     async fn reconcile_item(&self, _: &TermOf<Self>, _: Arc<ConfigMap>) -> Result<Action, kube::Error> {
///         Ok(Action::Done(None))
///     }
/// }
/// ```
pub trait Sharded: Send + Sync + Sized + 'static {
    /// What the planner places on shards.
    type Unit: Object;
    /// What follows a unit to its shard.
    type Item: Object;
    /// What the controller keeps for one term (from taking the shard lease to losing or
    /// releasing it), such as clients behind the term's fence. `()` for nothing.
    type State: Send + Sync + 'static;
    /// What a reconcile fails with.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Words for units and items in metrics, logs and the audit.
    const NOUNS: Nouns;

    /// What holding a unit costs a replica beyond its items, in bytes: its clients and watches
    /// of the unit (shardwise's controller: a destination client and a watch per kind). A cut
    /// puts a unit on one shard more, a cache copy; the planner makes a cut only where it
    /// lowers the busiest shard's load by more than its copies cost. 0: copies are free, and
    /// a cut must only lower the busiest shard.
    const COPY_BYTES: u64 = 0;

    /// The unit an item belongs to. A cluster-scoped unit has an empty namespace.
    fn unit_of(item: &Self::Item) -> ObjectKey;

    /// The unit's pin and weight; neither by default.
    fn placement(unit: &Self::Unit) -> UnitPlacement {
        let _ = unit;
        UnitPlacement::default()
    }

    /// Starts a term: builds its state. Background work of the term (another watch, say) is
    /// started with [`TermContext::spawn`] and stops with the term.
    fn begin_term(&self, term: &Arc<ContextOf<Self>>) -> Result<Self::State, Self::Error>;

    /// Resolves once the term's own caches (beyond units and items) are complete; the replica
    /// reports ready only then.
    fn synced(&self, term: &TermOf<Self>) -> impl Future<Output = ()> + Send {
        let _ = term;
        async {}
    }

    /// Reconciles a unit this term owns.
    fn reconcile_unit(
        &self,
        term: &TermOf<Self>,
        unit: Arc<Self::Unit>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// Reconciles an item of a unit this term owns.
    fn reconcile_item(
        &self,
        term: &TermOf<Self>,
        item: Arc<Self::Item>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// An item labelled for this shard whose unit this term does not hold: its unit may not
    /// exist at all (the planner gives such items to some live shard, so that one replica can
    /// report them). `None`: not this term's business.
    fn reconcile_orphan(
        &self,
        term: &TermOf<Self>,
        item: Arc<Self::Item>,
    ) -> impl Future<Output = Result<Option<Action>, Self::Error>> + Send {
        let _ = (term, item);
        async { Ok(None) }
    }

    /// A unit left this term (released for a handoff, reassigned or deleted; of a cut unit,
    /// the last of its slices this term held): drop what was kept for it.
    fn released(&self, term: &TermOf<Self>, unit: &ObjectKey) {
        let _ = (term, unit);
    }

    /// Bytes this term keeps in memory for `unit` beyond its items (a controller's own cache of
    /// what the unit manages); `None` when it keeps nothing worth counting. Reported with the
    /// unit's measured load, shared among this shard's records of the unit by their items, so
    /// that the planner weighs memory beside busy time (`--load-memory-weight`) and sizes the
    /// fleet by it (`--cache-per-replica`).
    fn cached_bytes(&self, term: &TermOf<Self>, unit: &ObjectKey) -> Option<u64> {
        let _ = (term, unit);
        None
    }

    /// Registers the controller's own metrics, served beside the runtime's on the replica's
    /// metrics endpoint; called once, before the replica starts. `shard` is this replica's.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry, shard: u32) {
        let _ = (registry, shard);
    }

    /// The status the planner writes on an object it cannot read, so that its owner learns
    /// why nothing happens; `None` writes none (the Warning event is always published).
    fn unreadable_status(kind: ObjectKind, reason: &str) -> Option<serde_json::Value> {
        let _ = (kind, reason);
        None
    }
}
