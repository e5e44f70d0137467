//! `shardwise balance`: keeps the `shard` keys of a live Argo CD's cluster Secrets balanced.
//!
//! Argo CD places a cluster on the shard its Secret's `shard` key names. The balancer owns those
//! keys: on each pass it reads the installation as `plan --source argocd` does, takes where
//! Argo CD runs each cluster now as the previous placement, lets `sticky-balanced` keep clusters
//! home and spend its move budget only while the busiest shard is above the target, and writes
//! the keys that differ. `decide` is that pass without I/O; `commands::balance` runs it under a
//! Lease, with the planner's metrics.

pub(crate) mod decide;
