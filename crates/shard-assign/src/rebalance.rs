//! When a planner may move clusters for balance alone, when loads are measured.
//!
//! Measured loads are noisy and drift. A planner that let `sticky-balanced` improve balance at
//! every pass would move clusters back and forth on noise. [`Hysteresis`] keeps a band:
//!
//! - A *voluntary* move (one that no change of the fleet forces) may start only once the
//!   busiest shard is above `trigger × mean`.
//! - Once started, passes keep improving, each within the strategy's move budget, until the
//!   busiest shard is at or below `target × mean` (sticky-balanced's target balance); then they
//!   stop until the trigger is crossed again.
//!
//! Between the two, nothing moves for balance: a fleet measured at 1.05 stays put whether it
//! got there by improving from 1.20 or by drifting up from 1.00. Forced placements (a cluster
//! that joins, a shard that leaves, a pin) never wait for the trigger.
//!
//! [`previous_for_pass`] turns the decision into what `sticky-balanced` reads: a previous
//! placement with the current loads recorded (inputs unchanged, so only forced placements
//! happen) or without loads (so improvement steps run).

use crate::model::{Cluster, PreviousPlacement, ShardId, ShardSet};
use crate::ratio::Ratio;

/// The band between the trigger and the target, and whether a rebalance is under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hysteresis {
    trigger: Ratio,
    target: Ratio,
    active: bool,
}

impl Hysteresis {
    /// The trigger used when none is given: 10% above the mean, the middle of the thresholds
    /// Dicer's policies publish (2.5%, 10%, 40%).
    pub const DEFAULT_TRIGGER: Ratio = Ratio::from_thousandths(1100);

    /// A band from `target` up to `trigger`; a trigger below the target is raised to it (then
    /// there is no band: every pass above the target may move).
    pub fn new(trigger: Ratio, target: Ratio) -> Self {
        Self {
            trigger: trigger.max(target),
            target,
            active: false,
        }
    }

    /// Whether this pass may move clusters for balance, given the busiest shard over the mean
    /// of the current placement under the current loads. Updates the state.
    pub fn allows_moves(&mut self, balance: f64) -> bool {
        if balance > self.trigger.as_f64() {
            self.active = true;
        } else if balance <= self.target.as_f64() {
            self.active = false;
        }
        self.active
    }

    /// Whether a rebalance is under way (the trigger was crossed and the target not reached).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The balance (busiest shard over the mean) above which a rebalance starts.
    pub fn trigger(&self) -> Ratio {
        self.trigger
    }
}

/// The weight of a new observation in an exponentially weighted average that halves an old
/// one's weight every `half_life`, for observations `interval` apart (both in one unit):
/// `estimate += factor × (observed - estimate)`. A planner smooths measured loads so that
/// placement follows trends rather than samples.
pub fn smoothing_factor(interval: f64, half_life: f64) -> f64 {
    if half_life <= 0.0 {
        return 1.0;
    }
    1.0 - 0.5f64.powf(interval / half_life)
}

/// The previous placement a pass gives `sticky-balanced`: each cluster of `clusters` that
/// `shard_of` places, on that shard, with its current load recorded when `moves_allowed` is
/// false (nothing looks changed, so nothing moves but what must) and without when it is true
/// (improvement steps run, within the move budget). `shards` are the live shards the
/// placement was made for.
pub fn previous_for_pass(
    clusters: &[Cluster],
    shard_of: impl Fn(&str) -> Option<ShardId>,
    shards: &ShardSet,
    moves_allowed: bool,
) -> PreviousPlacement {
    let mut previous = PreviousPlacement::new();
    for cluster in clusters {
        if let Some(shard) = shard_of(&cluster.id) {
            let load = (!moves_allowed).then(|| cluster.load());
            previous.insert(cluster.id.clone(), shard, load);
        }
    }
    previous.with_live_shards(shards.clone())
}

/// The busiest live shard over the mean, with each cluster of `clusters` on the shard
/// `shard_of` gives (clusters on no live shard are left out): the balance the trigger is
/// judged on.
pub fn balance_of(
    clusters: &[Cluster],
    shard_of: impl Fn(&str) -> Option<ShardId>,
    shards: &ShardSet,
) -> f64 {
    let mut loads = vec![0u64; shards.len()];
    for cluster in clusters {
        if let Some(position) =
            shard_of(&cluster.id).and_then(|s| shards.as_slice().binary_search(&s).ok())
        {
            loads[position] = loads[position].saturating_add(cluster.load());
        }
    }
    crate::model::Balance::of_loads(&loads).max_over_mean
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StrategyConfig, StrategyKind, assign};

    #[test]
    fn moves_start_above_the_trigger_and_stop_at_the_target() {
        let mut band =
            Hysteresis::new(Ratio::from_thousandths(1100), Ratio::from_thousandths(1030));
        // Drifting up from balanced: nothing moves until the trigger is crossed.
        assert!(!band.allows_moves(1.00));
        assert!(!band.allows_moves(1.08));
        assert!(!band.allows_moves(1.10));
        assert!(band.allows_moves(1.12));
        // Improving: moves go on inside the band, until the target.
        assert!(band.allows_moves(1.07));
        assert!(band.is_active());
        assert!(!band.allows_moves(1.03));
        assert!(!band.allows_moves(1.06));
        assert!(!band.is_active());
    }

    #[test]
    fn an_observation_weighs_half_after_one_half_life() {
        assert_eq!(smoothing_factor(15.0, 15.0), 0.5);
        assert_eq!(smoothing_factor(1.0, 0.0), 1.0);
        // Three observations a third of a half-life apart leave the old estimate half its say.
        let keep = 1.0 - smoothing_factor(5.0, 15.0);
        assert!((keep.powi(3) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_trigger_below_the_target_is_the_target() {
        let mut band = Hysteresis::new(Ratio::ONE, Ratio::from_thousandths(1030));
        assert_eq!(band.trigger(), Ratio::from_thousandths(1030));
        assert!(band.allows_moves(1.031));
        assert!(!band.allows_moves(1.03));
    }

    fn fleet(loads: &[u64]) -> Vec<Cluster> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &apps)| Cluster::new(format!("c{i}"), apps))
            .collect()
    }

    #[test]
    fn holding_moves_nothing_and_improving_spends_the_budget() {
        let shards = ShardSet::contiguous(2);
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let before = fleet(&[10, 10, 10, 10]);
        let placed = assign(&config, &before, &shards, None).unwrap();
        // The loads drift: both clusters of shard 0 triple.
        let after: Vec<Cluster> = before
            .iter()
            .map(|c| {
                let apps = if placed.shard_of(&c.id) == Some(0) {
                    30
                } else {
                    10
                };
                Cluster::new(c.id.clone(), apps)
            })
            .collect();
        let shard_of = |id: &str| placed.shard_of(id);
        let skewed = balance_of(&after, shard_of, &shards);
        assert!((skewed - 1.5).abs() < 1e-9, "{skewed}");

        let hold = previous_for_pass(&after, shard_of, &shards, false);
        let held = assign(&config, &after, &shards, Some(&hold)).unwrap();
        for c in &after {
            assert_eq!(held.shard_of(&c.id), placed.shard_of(&c.id));
        }
        let improve = previous_for_pass(&after, shard_of, &shards, true);
        let improved = assign(&config, &after, &shards, Some(&improve)).unwrap();
        assert!(improved.balance().max_over_mean < skewed);
        assert!((balance_of(&after, |id| improved.shard_of(id), &shards) - 1.0).abs() < 1e-9);
    }
}
