//! Convergence over planning passes after a change of the shard count.
//!
//! The one-shot scenarios judge a strategy by its first pass. A planner runs again and again:
//! `sticky-balanced` spends a small move budget per pass, so a scale-up that it leaves at 1.112
//! after its first pass keeps improving over the next ones. This experiment replays the passes
//! a planner makes after `from -> to` (each from the previous pass's placement, with the loads
//! unknown, as the planner's periodic pass does) until the busiest shard is within the target
//! balance or a pass changes nothing, and counts every app moved on the way against the least
//! any placement must move.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use shard_assign::{
    Assignment, Cluster, PreviousPlacement, ShardSet, StrategyConfig, StrategyKind, assign,
};

use crate::error::SimError;
use crate::simulate::{FleetDescription, FleetSource};
use crate::stats::Summary;

/// The experiment: a fleet placed on `from` shards, then planned for `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct Convergence {
    /// Where each seed's fleet comes from.
    pub fleet: FleetSource,
    /// Shards before the change.
    pub from: u32,
    /// Shards after it.
    pub to: u32,
    /// The strategies to compare, in report order.
    pub strategies: Vec<StrategyConfig>,
    /// The first seed; the others follow it.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
    /// Passes replayed at most after the change.
    pub max_passes: u32,
}

/// What it reports per strategy, over seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergenceReport {
    /// The fleet it ran on.
    pub fleet: FleetDescription,
    /// Shards before the change.
    pub from: u32,
    /// Shards after it.
    pub to: u32,
    /// The first seed.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
    /// Passes replayed at most after the change.
    pub max_passes: u32,
    /// One row per strategy, in the experiment's order.
    pub strategies: Vec<ConvergenceRow>,
}

/// One strategy's passes, over seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConvergenceRow {
    /// The strategy.
    pub strategy: StrategyKind,
    /// The balance the strategy aims for: the fleet is within it when the busiest shard is at
    /// or below `target × mean`.
    pub target: f64,
    /// Busiest shard over the mean after the first pass.
    pub first_pass: Summary,
    /// Busiest shard over the mean after the last pass.
    pub last_pass: Summary,
    /// Passes until within the target (those that reach it).
    pub passes: Summary,
    /// Seeds that reached the target.
    pub within_target: u32,
    /// Apps moved over all passes.
    pub apps_moved: Summary,
    /// The least apps any placement on `to` shards must move.
    pub minimum_apps: Summary,
    /// Apps moved over that least (a minimum of 0 counts as 1).
    pub moved_over_minimum: Summary,
}

/// One seed of one strategy.
struct SeedPasses {
    first: f64,
    last: f64,
    passes_to_target: Option<u32>,
    apps_moved: u64,
}

impl Convergence {
    /// 9 shards scaled to 10 on the reference fleet, 100 seeds, every strategy, 50 passes.
    pub fn reference(strategies: Vec<StrategyConfig>) -> Self {
        Self {
            fleet: FleetSource::Synthetic(crate::FleetSpec::REFERENCE),
            from: 9,
            to: 10,
            strategies,
            first_seed: 0,
            seeds: 100,
            max_passes: 50,
        }
    }

    /// Refuses an experiment that cannot run: a shard count of 0 or no change, no pass,
    /// strategy or seed, or an invalid strategy.
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |why: &str| Err(SimError::InvalidScenario(why.into()));
        if self.from == 0 || self.to == 0 {
            return invalid("shard counts must be at least 1");
        }
        if self.from == self.to {
            return invalid(
                "convergence needs a change of the shard count (--from differs from --to)",
            );
        }
        if self.max_passes == 0 {
            return invalid("at least one pass is needed");
        }
        if self.strategies.is_empty() || self.seeds == 0 {
            return invalid("at least one strategy and one seed are needed");
        }
        for config in &self.strategies {
            config.validate()?;
        }
        Ok(())
    }

    /// Validates the experiment, then replays the passes of every strategy on every seed.
    pub fn run(&self) -> Result<ConvergenceReport, SimError> {
        self.validate()?;
        let mut rows: Vec<Vec<(SeedPasses, u64)>> =
            self.strategies.iter().map(|_| Vec::new()).collect();
        for seed in self.first_seed..self.first_seed + u64::from(self.seeds) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let fleet = self.fleet.draw(&mut rng);
            for (config, row) in self.strategies.iter().zip(&mut rows) {
                row.push(self.passes(config, &fleet)?);
            }
        }
        let strategies = self
            .strategies
            .iter()
            .zip(rows)
            .map(|(config, seeds)| {
                let pick = |f: &dyn Fn(&(SeedPasses, u64)) -> f64| {
                    Summary::of(&seeds.iter().map(f).collect::<Vec<_>>())
                };
                let reached: Vec<f64> = seeds
                    .iter()
                    .filter_map(|(s, _)| s.passes_to_target.map(f64::from))
                    .collect();
                ConvergenceRow {
                    strategy: config.kind,
                    target: config.target_balance.as_f64(),
                    first_pass: pick(&|(s, _)| s.first),
                    last_pass: pick(&|(s, _)| s.last),
                    passes: Summary::of(&reached),
                    within_target: reached.len() as u32,
                    apps_moved: pick(&|(s, _)| s.apps_moved as f64),
                    minimum_apps: pick(&|(_, m)| *m as f64),
                    moved_over_minimum: pick(&|(s, m)| s.apps_moved as f64 / (*m).max(1) as f64),
                }
            })
            .collect();
        Ok(ConvergenceReport {
            fleet: self.fleet.description(),
            from: self.from,
            to: self.to,
            first_seed: self.first_seed,
            seeds: self.seeds,
            max_passes: self.max_passes,
            strategies,
        })
    }

    /// The passes of one strategy on one fleet, and the least any placement must move.
    fn passes(
        &self,
        config: &StrategyConfig,
        fleet: &[Cluster],
    ) -> Result<(SeedPasses, u64), SimError> {
        let before = assign(config, fleet, &ShardSet::contiguous(self.from), None)?;
        let minimum = minimum_apps(fleet, &before, self.from, self.to);
        let shards = ShardSet::contiguous(self.to);
        let target = config.target_balance.as_f64();
        let (mut current, mut apps_moved) = (before, 0u64);
        let mut result = SeedPasses {
            first: 0.0,
            last: 0.0,
            passes_to_target: None,
            apps_moved: 0,
        };
        for pass in 1..=self.max_passes {
            // The planner's periodic pass: the previous placement without loads, so that the
            // strategy may spend its move budget again.
            let previous: PreviousPlacement = current
                .placements()
                .iter()
                .map(|(id, p)| (id.clone(), p.shard))
                .collect();
            let next = assign(config, fleet, &shards, Some(&previous))?;
            let moved = moved_apps(&current, &next);
            apps_moved += moved;
            let balance = next.balance().max_over_mean;
            if pass == 1 {
                result.first = balance;
            }
            result.last = balance;
            current = next;
            if balance <= target + 1e-12 {
                result.passes_to_target = Some(pass);
                break;
            }
            if moved == 0 && pass > 1 {
                break;
            }
        }
        result.apps_moved = apps_moved;
        Ok((result, minimum))
    }
}

/// Apps whose shard differs between two placements of the same fleet.
fn moved_apps(before: &Assignment, after: &Assignment) -> u64 {
    after
        .placements()
        .iter()
        .filter(|(id, p)| before.shard_of(id) != Some(p.shard))
        .map(|(_, p)| p.apps)
        .sum()
}

/// The least any placement must move: on a scale-up, the new shards' share of the apps at the
/// mean; on a scale-down, the apps of the shards that leave.
fn minimum_apps(fleet: &[Cluster], before: &Assignment, from: u32, to: u32) -> u64 {
    let total: u64 = fleet.iter().map(|c| c.apps).sum();
    if to > from {
        (u128::from(total) * u128::from(to - from) / u128::from(to)) as u64
    } else {
        before
            .placements()
            .values()
            .filter(|p| p.shard >= to)
            .map(|p| p.apps)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kinds: &[StrategyKind], seeds: u32) -> ConvergenceReport {
        let mut experiment =
            Convergence::reference(kinds.iter().map(|&k| StrategyConfig::new(k)).collect());
        experiment.seeds = seeds;
        experiment.run().unwrap()
    }

    #[test]
    fn sticky_balanced_keeps_improving_after_its_first_pass() {
        let report = run(
            &[StrategyKind::StickyBalanced, StrategyKind::GreedyMinimum],
            10,
        );
        let sticky = &report.strategies[0];
        // Its first pass moves little and leaves the fleet above the target; later passes
        // bring it within, moving little more than the least any placement moves: the new
        // shard is filled with the old shards' excess, and whole clusters cannot make it up
        // exactly.
        assert!(sticky.first_pass.median > sticky.target, "{sticky:?}");
        assert_eq!(sticky.within_target, 10, "{sticky:?}");
        assert!(sticky.passes.median > 1.0, "{sticky:?}");
        assert!(sticky.moved_over_minimum.median <= 1.2, "{sticky:?}");
        // Partitioning from scratch is balanced at once but moves most of the fleet.
        let greedy = &report.strategies[1];
        assert_eq!(greedy.passes.median, 1.0, "{greedy:?}");
        assert!(greedy.moved_over_minimum.median > 5.0, "{greedy:?}");
    }

    #[test]
    fn the_minimum_is_the_new_shards_share_or_the_leaving_shards_apps() {
        let fleet: Vec<Cluster> = (0..4).map(|i| Cluster::new(format!("c{i}"), 10)).collect();
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let on_four = assign(&config, &fleet, &ShardSet::contiguous(4), None).unwrap();
        assert_eq!(minimum_apps(&fleet, &on_four, 4, 2), 20);
        let on_two = assign(&config, &fleet, &ShardSet::contiguous(2), None).unwrap();
        assert_eq!(minimum_apps(&fleet, &on_two, 2, 4), 20);
    }

    #[test]
    fn no_change_of_the_shard_count_is_refused() {
        let mut experiment =
            Convergence::reference(vec![StrategyConfig::new(StrategyKind::StickyBalanced)]);
        experiment.to = experiment.from;
        assert!(experiment.run().is_err());
    }
}
