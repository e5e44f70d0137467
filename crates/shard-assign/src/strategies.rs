//! One module per strategy. Each places the clusters the pins left unplaced.

pub(crate) mod argocd_consistent_hashing;
pub(crate) mod bounded_load;
pub(crate) mod greedy_minimum;
pub(crate) mod legacy_modulo;
pub(crate) mod round_robin;
pub(crate) mod sticky_balanced;
pub(crate) mod weighted_ring_hash;
