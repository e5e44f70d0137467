//! What travels between the replicas of a controller on `shardwise-runtime`, its planner, and
//! the tools that read a sharded fleet from outside (`shardwise plan`, the Argo CD balancer):
//!
//! - [`slice`](mod@slice): the `UnitSlice` custom resource, the record of one slice of a cut unit;
//! - [`load`](mod@load): the measured load each owner publishes on its shard Lease, and its reading.
//!
//! The labels and annotations these are written in are `shardwise_handoff::keys`. Pure types
//! and their encodings: no client, no clock. A change of what is written here is a change of
//! the wire between versions (docs/releasing.md).
//!
//! ```
//! use shardwise_wire::load::LoadReport;
//!
//! // An owner that measured nothing yet publishes an empty report, which reads back as one.
//! let published = LoadReport::default().annotations();
//! assert!(!published.is_empty());
//! ```

#![deny(missing_docs)]

pub mod load;
pub mod slice;
