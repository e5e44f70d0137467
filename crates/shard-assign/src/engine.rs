//! The entry point: checks input, puts clusters in canonical order, places pins, and hands the
//! rest to the chosen strategy.

use crate::draft::Draft;
use crate::error::AssignError;
use crate::model::{Assignment, Cluster, PreviousPlacement, ShardSet};
use crate::strategies;
use crate::strategy::{StrategyConfig, StrategyKind};

/// Places every cluster on exactly one live shard.
///
/// Clusters pinned to a live shard go there and count toward its load; the strategy places the
/// rest. The result depends only on the set of clusters (not their order in `clusters`), the
/// live shards, the configuration and, for `sticky-balanced`, `previous`.
pub fn assign(
    config: &StrategyConfig,
    clusters: &[Cluster],
    shards: &ShardSet,
    previous: Option<&PreviousPlacement>,
) -> Result<Assignment, AssignError> {
    config.validate()?;
    if shards.is_empty() {
        return Err(AssignError::NoLiveShards);
    }
    let mut ordered: Vec<&Cluster> = clusters.iter().collect();
    ordered.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    if let Some(pair) = ordered.windows(2).find(|w| w[0].id == w[1].id) {
        return Err(AssignError::DuplicateClusterId(pair[0].id.clone()));
    }
    if let Some(c) = ordered.iter().find(|c| c.weight == Some(0)) {
        return Err(AssignError::ZeroWeight(c.id.clone()));
    }

    let mut draft = Draft::new(ordered, shards.as_slice());
    for index in 0..draft.len() {
        if let Some(pin) = draft.cluster(index).pin
            && let Some(position) = draft.position_of(pin)
        {
            draft.place(index, position);
            draft.pin(index);
        }
    }
    match config.kind {
        StrategyKind::LegacyModulo => strategies::legacy_modulo::place(&mut draft),
        StrategyKind::RoundRobin => strategies::round_robin::place(&mut draft),
        StrategyKind::GreedyMinimum => strategies::greedy_minimum::place(&mut draft),
        StrategyKind::WeightedRingHash => strategies::weighted_ring_hash::place(&mut draft, config),
        StrategyKind::BoundedLoad => strategies::bounded_load::place(&mut draft, config),
        StrategyKind::StickyBalanced => {
            strategies::sticky_balanced::place(&mut draft, config, previous)
        }
        StrategyKind::ArgoCdConsistentHashing => {
            strategies::argocd_consistent_hashing::place(&mut draft)
        }
    }
    // A strategy that left a cluster out is a bug; debug builds fail on it, release builds still
    // give the cluster an owner rather than leave it unreconciled.
    for index in draft.unplaced() {
        debug_assert!(false, "{} left a cluster unplaced", config.kind);
        let lightest = draft.lightest_shard();
        draft.place(index, lightest);
    }
    Ok(draft.finish(config.kind))
}
