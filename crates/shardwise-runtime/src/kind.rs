//! One kind sharded by its own objects, reconciled by the program's own kube-runtime
//! [`Controller`](kube_runtime::Controller).
//!
//! Each object of the kind is placed on a shard by itself: the elected planner labels it
//! `shardwise.io/shard=<n>` with the holder's lease identity and an epoch, and moves it with the
//! same drained handoff as any unit (the old owner stops reconciling it and says so before the
//! new one may start). No other kind is needed, and no object is written but the placed one.
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

use kube::Client;
use kube::core::Expression;
use kube_runtime::controller::Action;
use kube_runtime::watcher;
use shard_assign::ShardId;
use shardwise_handoff::keys::SHARD_LABEL;
use shardwise_handoff::plan::ObjectKey;
use tokio_util::sync::CancellationToken;

use crate::clients::Connection;
use crate::lease::Fence;
use crate::metrics::Telemetry;
use crate::nouns::Nouns;
use crate::objects::{Object, key_of};
use crate::owner::gate::UNIT_KEY;
use crate::owner::{Compose, Owner, Readiness, composed};
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

/// The runtime's side of a kind sharded by its own objects: each object a unit with no items,
/// reconciled by the program's controller rather than by this type.
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

/// One replica of a controller of kind `K` sharded by its own objects, ready to run: its
/// settings and its way to the control plane. Its metrics and readiness are the program's to
/// serve, as with [`ShardedReplica`].
pub struct ShardedKind<K: Object> {
    replica: ShardedReplica<OwnObjects<K>>,
}

impl<K: Object> std::fmt::Debug for ShardedKind<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedKind").finish_non_exhaustive()
    }
}

impl<K: Object> ShardedKind<K> {
    /// A replica reaching the control plane through `connection` (a `kube::Client`, or with
    /// the `rustls-tls` feature a `kube::Config`).
    pub fn new(settings: Settings, connection: impl Into<Connection>) -> Self {
        Self {
            replica: ShardedReplica::new(OwnObjects(PhantomData), settings, connection),
        }
    }

    /// The runtime's metrics, to serve at `/metrics`.
    pub fn telemetry(&self) -> &Telemetry {
        self.replica.telemetry()
    }

    /// Whether the replica is ready (it holds its shard and knows which objects it owns), for
    /// `/readyz`.
    pub fn readiness(&self) -> Readiness {
        self.replica.readiness()
    }

    /// Runs until `shutdown` is cancelled, then hands the replica's objects over (lets its
    /// reconciles finish, releases its leases) and returns. `control` runs the program's
    /// controller for one term; what it returns runs until the term ends, when it is dropped.
    pub async fn run<F, Fut>(self, shutdown: CancellationToken, control: F) -> Result<(), RunError>
    where
        F: Fn(ShardTerm<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let compose = Compose(Arc::new(move |owner: Arc<Owner<OwnObjects<K>>>| {
            let work = control(ShardTerm {
                owner: owner.clone(),
            });
            owner.term.spawn(work);
        }));
        self.replica.composed(compose).run(shutdown).await
    }
}

/// One term of ownership of a kind sharded by its own objects: what the program's controller
/// needs to work on this shard's objects, and only while this term owns them.
pub struct ShardTerm<K: Object> {
    owner: Arc<Owner<OwnObjects<K>>>,
}

impl<K: Object> Clone for ShardTerm<K> {
    fn clone(&self) -> Self {
        Self {
            owner: self.owner.clone(),
        }
    }
}

impl<K: Object> std::fmt::Debug for ShardTerm<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardTerm")
            .field("owner", &self.owner.term.owner())
            .finish()
    }
}

/// How soon an object is looked at again when the controller's watch showed it before the
/// term's own record of it: the two watches see the same change within milliseconds.
pub const UNSEEN_RETRY: Duration = Duration::from_secs(1);

/// The future of one reconcile wrapped by [`ShardTerm::reconcile`].
pub type Reconciling<E> = Pin<Box<dyn Future<Output = Result<Action, E>> + Send>>;

impl<K: Object> ShardTerm<K> {
    /// This replica's shard.
    pub fn shard(&self) -> ShardId {
        self.owner.term.shard()
    }

    /// What the controller watches: the objects labelled with this shard. Those being handed
    /// to or from it are among them; [`reconcile`](Self::reconcile) tells them apart.
    pub fn watcher_config(&self) -> watcher::Config {
        watcher::Config::default()
            .labels_from(&Expression::Equal(SHARD_LABEL.into(), self.shard().to_string()).into())
    }

    /// A client of the control plane whose every request stops once the term is over.
    pub fn client(&self) -> Client {
        self.owner.term.client().clone()
    }

    /// The term's fence: work that is not a request of [`client`](Self::client) (an outside
    /// API, a file) checks [`Fence::check`] just before it.
    pub fn fence(&self) -> &Fence {
        self.owner.term.fence()
    }

    /// `reconcile`, run only on an object this term owns and is not handing off, and never
    /// past the term's fence; each run recorded in the audit and the metrics. An object being
    /// handed off is left alone (it leaves this shard); one whose record the term has not
    /// seen yet (the controller's watch was first) is looked at again after
    /// [`UNSEEN_RETRY`].
    pub fn reconcile<Ctx, E, Fut>(
        &self,
        reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    ) -> impl FnMut(Arc<K>, Arc<Ctx>) -> Reconciling<E> + Send + 'static
    where
        Ctx: Send + Sync + 'static,
        E: Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let owner = self.owner.clone();
        move |object, context| {
            let owner = owner.clone();
            let key = key_of(object.as_ref());
            let work = reconcile(object, context);
            Box::pin(async move {
                match composed(&owner, &key, UNIT_KEY, &key, work).await {
                    Some(result) => result,
                    None if owner.term.knows(&key) => Ok(Action::await_change()),
                    None => Ok(Action::requeue(UNSEEN_RETRY)),
                }
            })
        }
    }
}
