//! The sharding protocol of shardwise, as pure logic: no I/O, no clock reads, no Kubernetes
//! types, so that every rule can be tested exhaustively.
//!
//! - [`identity`]: a replica's shard is its StatefulSet pod ordinal, parsed strictly.
//! - [`keys`]: the labels and annotations the protocol is written in.
//! - [`lease`]: lease timing, fencing and expiry as observed on local clocks.
//! - [`drain`]: the planner's per-unit decision and the owner's state machine of a handoff.
//! - [`plan`]: from the observed fleet and membership to the labels the planner must write.
//! - [`slices`]: the protocol on slices of a unit: splits and merges inside one owner.
//!
//! ```
//! use shardwise_handoff::identity::shard_from_pod_name;
//!
//! // A replica's shard is its pod's ordinal, checked against its StatefulSet's name if given.
//! assert_eq!(shard_from_pod_name("shardwise-3", None)?, 3);
//! assert!(shard_from_pod_name("other-3", Some("shardwise")).is_err());
//! # Ok::<(), shardwise_handoff::identity::IdentityError>(())
//! ```

#![deny(missing_docs)]

pub mod drain;
pub mod identity;
pub mod keys;
pub mod lease;
#[cfg(test)]
mod model;
pub mod plan;
pub mod slices;
