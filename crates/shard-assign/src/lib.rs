//! Deterministic assignment of destination clusters to shards.
//!
//! A shard is one replica of the controller's StatefulSet; it reconciles the clusters assigned to
//! it and every app that targets them. This crate decides which shard owns which cluster. It is
//! pure: no I/O, no clock, no Kubernetes types, and the same inputs give the same answer on every
//! replica, platform and release (no `std` hasher, no hash-map iteration order).
//!
//! ```
//! use shard_assign::{assign, Cluster, ShardSet, StrategyConfig, StrategyKind};
//!
//! let clusters = vec![Cluster::new("uid-a", 120), Cluster::new("uid-b", 30), Cluster::new("uid-c", 90)];
//! let shards = ShardSet::contiguous(2);
//! let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
//! let assignment = assign(&config, &clusters, &shards, None)?;
//! assert_eq!(assignment.shard_of("uid-a"), Some(0));
//! assert_eq!(assignment.shard_loads()[&1].apps, 120);
//! # Ok::<(), shard_assign::AssignError>(())
//! ```
//!
//! Strategies ([`StrategyKind`]): `legacy-modulo`, `round-robin`, `greedy-minimum`,
//! `weighted-ring-hash`, `bounded-load` and `sticky-balanced`, plus, by name only,
//! `argocd-consistent-hashing` (Argo CD's own bounded-load ring). Every one of them places each
//! cluster on exactly one live shard, honours pins to live shards, places clusters pinned to a
//! shard that is not live by the strategy (with a [`Warning`]), and ignores input order.

#![deny(missing_docs)]

mod diff;
mod draft;
mod engine;
mod error;
#[cfg(feature = "clap")]
mod flags;
mod hashing;
mod model;
mod ratio;
mod rebalance;
mod sliced;
mod slicing;
mod strategies;
mod strategy;

pub use diff::{AssignmentDiff, Move};
pub use engine::assign;
pub use error::{AssignError, ParseError};
#[cfg(feature = "clap")]
pub use flags::StrategyFlags;
pub use hashing::fnv1a_32;
pub use model::{
    Assignment, Balance, Cluster, Placement, PreviousPlacement, RecordedPlacement, ShardId,
    ShardLoad, ShardSet, Warning,
};
pub use ratio::Ratio;
pub use rebalance::{Hysteresis, balance_of, previous_for_pass, smoothing_factor};
pub use sliced::{SliceMoves, SliceSwitch, SlicedAssignment, assign_sliced, slice_id, slices};
pub use slicing::{
    AppKeys, KeyRange, MAX_SHARD_RANGES, SliceConfig, Slicing, app_key, count_in, recorded_cut,
    shard_selector, slice_fleet,
};
pub use strategy::{StrategyConfig, StrategyKind};
