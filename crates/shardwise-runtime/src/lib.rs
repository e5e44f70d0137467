//! Sharding for kube-rs controllers.
//!
//! Run a controller as a StatefulSet of N replicas and give each replica a share of the work:
//! the runtime places **units** (the objects a controller's work divides along, such as
//! clusters or namespaces) on shards, one shard per replica, and every **item** that belongs to
//! a unit follows it. A replica watches only the units labelled with its shard, and the items
//! of those units (each item is labelled once with its unit's token, `shardwise.io/unit`, so that
//! moving a unit writes its record only).
//!
//! What a controller implements is [`Sharded`]: its two kinds, which unit an item belongs to,
//! and how to reconcile each. What it gets:
//!
//! - **Membership**: each replica holds a Lease for its shard (the pod's ordinal); the
//!   StatefulSet's `spec.replicas` says how many shards there are.
//! - **An elected planner**: one replica at a time places the units with a `shard-assign`
//!   strategy (sticky and balanced by default) and writes each placement as a label with the
//!   holder's lease identity; items get the label of their unit.
//! - **Drained handoffs**: a unit changes owner only after its old owner has stopped every
//!   reconcile of it and said so; a dead owner's units move once its lease has expired.
//! - **Slices**: a unit too big for one shard is cut into slices of its items, recorded on
//!   [`slice::UnitSlice`]s and handed off one by one (`--slicing`).
//! - **Measured load**: each owner measures what each of its records (a unit, or a slice)
//!   costs it in reconcile time, smoothed, and publishes it on its shard lease's renewals; the
//!   planner balances on it, smoothed again and within a hysteresis band, unless
//!   `--load-model=apps` ([`load`], [`estimate`]).
//! - **Fencing**: every request of a term (control plane or elsewhere, through
//!   [`TermContext::fence`]) stops when the lease stops being held, even in a process that was
//!   frozen.
//! - **The rest of a controller's plumbing**: label-filtered watches and caches, work queues
//!   with backoff, an audit of every reconcile, Prometheus metrics (over HTTPS for reviewed
//!   scrapers), health probes, and a graceful handoff on SIGTERM.
//!
//! The shortest way in starts from a kube-runtime `Controller` a program already has: [`kind`]
//! shards one kind by its own objects, and hands each term of the shard's lease the watch
//! configuration, the fenced client and the guarded reconcile that run that controller on the
//! shard's objects only ([`kind::ShardedKind`], `examples/configmapgen`). The objects are placed
//! by a label on each, or by ranges of their UIDs with nothing written to them
//! ([`kind::Placement`]).
//!
//! A controller whose work divides along another kind is a [`Sharded`] type and a `main` that hands it to [`run`] with the settings
//! its flags give; this is the shape of `examples/namespace-labeller`, which labels the
//! ConfigMaps of each namespace. A program that keeps its own client, flags, logging, signals
//! and HTTP server builds a [`ShardedReplica`] instead, from [`settings::Settings::builder`],
//! and drives its [`run`](ShardedReplica::run) future.
//!
//! # Features
//!
//! All on by default; without them (`default-features = false`) the runtime needs no clap,
//! HTTP server, TLS stack, procfs or tracing-subscriber.
//!
//! - `clap`: [`args::ReplicaArgs`], every setting as a flag with an environment variable.
//! - `logging`: [`logging::init`].
//! - `rustls-tls`: [`Connection::Config`], clients built from a kube `Config` whose
//!   connections refuse to write once a term's fence has closed.
//! - `server`: [`http`] (metrics over HTTPS for reviewed scrapers, the probes, the process's
//!   CPU and memory) and [`run`].
//!
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use clap::Parser;
//! use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
//! use shardwise_runtime::args::ReplicaArgs;
//! use shardwise_runtime::settings::WatchScope;
//! use shardwise_runtime::{Action, ContextOf, Nouns, ObjectKey, Sharded, TermOf};
//!
//! /// Namespaces are the units; the ConfigMaps in each follow it.
//! struct Labeller;
//!
//! impl Sharded for Labeller {
//!     type Unit = Namespace;
//!     type Item = ConfigMap;
//!     type State = ();
//!     type Error = kube::Error;
//!     const NOUNS: Nouns = Nouns {
//!         unit: "namespace",
//!         units: "namespaces",
//!         item: "configmap",
//!         items: "configmaps",
//!     };
//!
//!     fn unit_of(item: &ConfigMap) -> ObjectKey {
//!         ObjectKey::new("", item.metadata.namespace.clone().unwrap_or_default())
//!     }
//!
//!     fn begin_term(&self, _context: &Arc<ContextOf<Self>>) -> Result<(), kube::Error> {
//!         Ok(())
//!     }
//!
//!     async fn reconcile_unit(
//!         &self,
//!         _term: &TermOf<Self>,
//!         _namespace: Arc<Namespace>,
//!     ) -> Result<Action, kube::Error> {
//!         Ok(Action::Done(None))
//!     }
//!
//!     async fn reconcile_item(
//!         &self,
//!         _term: &TermOf<Self>,
//!         _config_map: Arc<ConfigMap>,
//!     ) -> Result<Action, kube::Error> {
//!         // Patch the ConfigMap through the term's fenced client here.
//!         Ok(Action::Done(None))
//!     }
//! }
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     replica: ReplicaArgs,
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let args = Args::parse();
//!     args.replica.init_logging();
//!     let settings = args.replica.settings("labeller", WatchScope::Cluster)?;
//!     let http = args.replica.http_settings()?;
//!     shardwise_runtime::run(Labeller, settings, http).await?;
//!     Ok(())
//! }
//! ```
//!
//! # The public API
//!
//! - For a kube-runtime controller: [`kind`] ([`kind::ShardedKind`], [`kind::ShardTerm`]).
//! - For a controller of units and items: [`Sharded`] and what it names ([`TermOf`], [`ContextOf`], [`Action`],
//!   [`Nouns`], [`ObjectKey`], [`UnitPlacement`], and what a term's accessors return:
//!   [`ShardId`], [`OwnerId`], [`Incarnation`], [`KeyRange`]), [`ShardedReplica`] and [`Connection`],
//!   [`run`], [`args::ReplicaArgs`] and [`settings`], [`objects`] (keys and typed APIs of watched objects), [`decode`] and
//!   [`lenient`] (objects that do not parse), [`clients`] (fenced, rate-limited clients of
//!   other clusters), [`audit`] (the reconcile log and its overlap check) and [`metrics`] (the
//!   series and their names).
//! - For tools that read a sharded fleet from outside: [`slice::UnitSlice`], [`load`] (the
//!   load reports on shard leases) and [`estimate`] (the planner's conclusions from them).
//! - For another leader-elected process beside the replicas (shardwise's Argo CD balancer):
//!   [`lease`] (hold a Lease, fence on it), [`http`] (metrics and probes) and [`metrics`].
//!
//! Everything else (the planner, membership, the owners' gates and queues, the replica's
//! outline) is the runtime's own.
//!
//! The placement and handoff rules themselves are pure code in `shard-assign` and
//! `shardwise-handoff`; `shard-assign` calls a unit a cluster and an item an app, after the
//! controller it was first written for.

#![deny(missing_docs)]

#[cfg(feature = "clap")]
pub mod args;
pub mod audit;
pub mod clients;
pub mod decode;
pub mod estimate;
pub mod failpoints;
#[cfg(feature = "server")]
pub mod http;
pub mod kind;
mod layout;
pub mod lease;
pub mod lenient;
#[cfg(feature = "logging")]
pub mod logging;
pub(crate) mod membership;
pub mod metrics;
mod nouns;
pub mod objects;
pub(crate) mod owner;
pub(crate) mod planner;
#[cfg(feature = "bench")]
pub mod planner_bench;
pub(crate) mod replica;
pub mod settings;
mod sharded;
pub(crate) mod term;

pub use clients::Connection;
pub use nouns::Nouns;
pub use objects::{Object, key_of};
pub use owner::Readiness;
#[cfg(feature = "server")]
pub use replica::run;
pub use replica::{RunError, ShardedReplica};
/// What a term's accessors return ([`TermContext::shard`], [`TermContext::owner`],
/// [`TermContext::ranges`]), re-exported on purpose from the placement and protocol crates.
pub use shard_assign::{KeyRange, ShardId};
pub use sharded::{Action, ContextOf, ObjectKind, Sharded, TermOf, UnitPlacement};
pub use shardwise_handoff::drain::{Incarnation, OwnerId};
pub use shardwise_handoff::plan::ObjectKey;
/// The wire formats, re-exported on purpose: a controller's tests and tools read them beside the
/// runtime.
pub use shardwise_wire::{load, slice};
pub use term::{Term, TermContext};
