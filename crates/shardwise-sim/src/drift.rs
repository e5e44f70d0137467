//! Balance when what a cluster costs drifts: the `apps` load model against `measured`.
//!
//! Every strategy balances a load. Counting apps assumes that every app costs the same; in a
//! real fleet the cost of an app depends on its cluster (its size, its API server's latency)
//! and moves over time. This experiment gives each cluster a true cost per app that follows a
//! random walk (log-normal steps, `drift` per hour), observed at each planning pass with noise
//! (log-normal, `noise`), and plans the fleet every `plan_every` minutes of simulated time:
//!
//! - `apps`: the strategy balances apps, as before;
//! - `measured`: it balances the observed cost (apps × observed cost per app), smoothed by the
//!   planner over `smoothing` minutes (half-life) so that placement follows trends, not
//!   samples. For
//!   `sticky-balanced`, voluntary moves follow the [`Hysteresis`] band (start above `trigger`,
//!   stop at the target), so that noise alone moves nothing; the other strategies re-place from
//!   the observed loads at every pass, as a planner running them does.
//!
//! It reports the balance of the *true* load over time and the apps moved per hour.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use shard_assign::{
    Assignment, Cluster, Hysteresis, Ratio, ShardSet, StrategyConfig, StrategyKind, assign,
    balance_of, previous_for_pass, smoothing_factor,
};

use crate::error::SimError;
use crate::simulate::{FleetDescription, FleetSource};
use crate::stats::Summary;

/// What a strategy balances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadModel {
    /// Apps times the cluster's weight.
    Apps,
    /// What owners measure each cluster to cost.
    Measured,
}

impl LoadModel {
    /// Every model, in report order.
    const ALL: [LoadModel; 2] = [LoadModel::Apps, LoadModel::Measured];
}

/// Resolution of an observed cost per app in a cluster's weight: 1/1000 of the starting cost.
const COST_SCALE: f64 = 1000.0;

/// The experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct Drift {
    /// Where each seed's fleet comes from.
    pub fleet: FleetSource,
    /// Shards throughout.
    pub shards: u32,
    /// The strategies to compare, each under every load model.
    pub strategies: Vec<StrategyConfig>,
    /// Simulated time.
    pub hours: u32,
    /// Minutes between two planning passes.
    pub plan_every: u32,
    /// Standard deviation of the log of a cluster's cost per app after one hour.
    pub drift: f64,
    /// Standard deviation of the log of an observation's error.
    pub noise: f64,
    /// Half-life, in minutes, of the planner's smoothing of the observed costs.
    pub smoothing: u32,
    /// Where `sticky-balanced`'s voluntary moves start with measured loads.
    pub trigger: Ratio,
    /// The first seed; the others follow it.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
}

/// What the experiment reports: its settings and a row per strategy and load model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DriftReport {
    /// The fleet it ran on.
    pub fleet: FleetDescription,
    /// Shards throughout.
    pub shards: u32,
    /// Simulated time.
    pub hours: u32,
    /// Minutes between two planning passes.
    pub plan_every: u32,
    /// Standard deviation of the log of a cluster's cost per app after one hour.
    pub drift: f64,
    /// Standard deviation of the log of an observation's error.
    pub noise: f64,
    /// Half-life, in minutes, of the planner's smoothing of the observed costs.
    pub smoothing: u32,
    /// Where `sticky-balanced`'s voluntary moves start with measured loads.
    pub trigger: f64,
    /// The first seed.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
    /// Each strategy under `apps`, then under `measured`, in the experiment's order.
    pub rows: Vec<DriftRow>,
}

/// One strategy under one load model, over seeds: each seed's median and 95th percentile of
/// the true busiest-over-mean over its passes, and its moves per hour.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DriftRow {
    /// The strategy.
    pub strategy: StrategyKind,
    /// What it balanced.
    pub load_model: LoadModel,
    /// True busiest shard over the mean: each seed's median over its passes.
    pub true_max_over_mean: Summary,
    /// The same with each seed's 95th percentile over its passes.
    pub true_max_over_mean_p95: Summary,
    /// Apps moved per hour, as a share of all apps (0.02 is 2%).
    pub apps_moved_per_hour: Summary,
    /// Clusters moved per hour.
    pub clusters_moved_per_hour: Summary,
}

/// A seed's run of one strategy and model.
struct Run {
    median: f64,
    p95: f64,
    apps_per_hour: f64,
    clusters_per_hour: f64,
}

impl Drift {
    /// The reference fleet on 10 shards for a day, planned every 5 minutes; costs drift by
    /// 10% per hour and are observed within 10%.
    pub fn reference(strategies: Vec<StrategyConfig>) -> Self {
        Self {
            fleet: FleetSource::Synthetic(crate::FleetSpec::REFERENCE),
            shards: 10,
            strategies,
            hours: 24,
            plan_every: 5,
            drift: 0.1,
            noise: 0.1,
            smoothing: 15,
            trigger: Hysteresis::DEFAULT_TRIGGER,
            first_seed: 0,
            seeds: 20,
        }
    }

    /// Refuses an experiment that cannot run: no shard, hour, pass or smoothing, a pass
    /// interval longer than the run, a drift or noise outside 0 to 2, no strategy or seed, or
    /// an invalid strategy.
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |why: String| Err(SimError::InvalidScenario(why));
        if self.shards == 0 {
            return invalid("shard count must be at least 1".into());
        }
        if self.hours == 0 || self.plan_every == 0 || self.smoothing == 0 {
            return invalid(
                "the drift needs at least 1 hour, 1 minute between passes and 1 minute of smoothing"
                    .into(),
            );
        }
        if self.plan_every > 60 * self.hours {
            return invalid(format!(
                "a pass every {} minutes never runs within {} hour(s)",
                self.plan_every, self.hours
            ));
        }
        for (name, value) in [("drift", self.drift), ("noise", self.noise)] {
            if !(0.0..=2.0).contains(&value) {
                return invalid(format!("--{name} must be from 0 to 2, got {value}"));
            }
        }
        if self.strategies.is_empty() || self.seeds == 0 {
            return invalid("at least one strategy and one seed are needed".into());
        }
        for config in &self.strategies {
            config.validate()?;
        }
        Ok(())
    }

    /// Validates the experiment, then plans every strategy under both load models on every
    /// seed, each seed with one history of costs for all of them.
    pub fn run(&self) -> Result<DriftReport, SimError> {
        self.validate()?;
        let variants: Vec<(StrategyConfig, LoadModel)> = self
            .strategies
            .iter()
            .flat_map(|c| LoadModel::ALL.map(|m| (*c, m)))
            .collect();
        let mut runs: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
        for seed in self.first_seed..self.first_seed + u64::from(self.seeds) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let fleet = self.fleet.draw(&mut rng);
            // One history of costs and observations per seed, the same for every variant.
            let history = self.history(fleet.len(), &mut rng);
            for ((config, model), out) in variants.iter().zip(&mut runs) {
                out.push(self.replay(config, *model, &fleet, &history)?);
            }
        }
        let rows = variants
            .iter()
            .zip(runs)
            .map(|((config, model), runs)| {
                let pick =
                    |f: fn(&Run) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>());
                DriftRow {
                    strategy: config.kind,
                    load_model: *model,
                    true_max_over_mean: pick(|r| r.median),
                    true_max_over_mean_p95: pick(|r| r.p95),
                    apps_moved_per_hour: pick(|r| r.apps_per_hour),
                    clusters_moved_per_hour: pick(|r| r.clusters_per_hour),
                }
            })
            .collect();
        Ok(DriftReport {
            fleet: self.fleet.description(),
            shards: self.shards,
            hours: self.hours,
            plan_every: self.plan_every,
            drift: self.drift,
            noise: self.noise,
            smoothing: self.smoothing,
            trigger: self.trigger.as_f64(),
            first_seed: self.first_seed,
            seeds: self.seeds,
            rows,
        })
    }

    fn passes(&self) -> u32 {
        self.hours * 60 / self.plan_every
    }

    /// For each pass (the first at time 0), each cluster's true and observed cost per app.
    fn history(&self, clusters: usize, rng: &mut impl RngCore) -> Vec<Vec<(f64, f64)>> {
        let step = self.drift * (f64::from(self.plan_every) / 60.0).sqrt();
        let mut log_cost = vec![0.0; clusters];
        (0..=self.passes())
            .map(|pass| {
                log_cost
                    .iter_mut()
                    .map(|log| {
                        if pass > 0 {
                            *log += step * standard_normal(rng);
                        }
                        let truth = log.exp();
                        (truth, truth * (self.noise * standard_normal(rng)).exp())
                    })
                    .collect()
            })
            .collect()
    }

    /// One strategy under one model through the history.
    fn replay(
        &self,
        config: &StrategyConfig,
        model: LoadModel,
        fleet: &[Cluster],
        history: &[Vec<(f64, f64)>],
    ) -> Result<Run, SimError> {
        let shards = ShardSet::contiguous(self.shards);
        let sticky = config.kind == StrategyKind::StickyBalanced;
        let mut band = Hysteresis::new(self.trigger, config.target_balance);
        let total_apps: u64 = fleet.iter().map(|c| c.apps).sum();
        let (mut current, mut balances): (Option<Assignment>, Vec<f64>) = (None, Vec::new());
        let (mut apps_moved, mut clusters_moved) = (0u64, 0u64);
        let alpha = smoothing_factor(f64::from(self.plan_every), f64::from(self.smoothing));
        // The planner's estimate of each cluster's cost: its observations, smoothed.
        let mut estimate: Option<Vec<f64>> = None;
        for costs in history {
            let smoothed: Vec<f64> = match &estimate {
                None => costs.iter().map(|(_, observed)| *observed).collect(),
                Some(before) => before
                    .iter()
                    .zip(costs)
                    .map(|(e, (_, observed))| e + alpha * (observed - e))
                    .collect(),
            };
            let seen = with_costs(fleet, &smoothed);
            estimate = Some(smoothed);
            let planned = match (model, &current) {
                (LoadModel::Apps, Some(previous)) if sticky => {
                    assign(config, fleet, &shards, Some(&previous.to_previous()))?
                }
                (LoadModel::Apps, _) => assign(config, fleet, &shards, None)?,
                (LoadModel::Measured, Some(previous)) if sticky => {
                    let balance = balance_of(&seen, |id| previous.shard_of(id), &shards);
                    let allowed = band.allows_moves(balance);
                    let hold =
                        previous_for_pass(&seen, |id| previous.shard_of(id), &shards, allowed);
                    assign(config, &seen, &shards, Some(&hold))?
                }
                (LoadModel::Measured, _) => assign(config, &seen, &shards, None)?,
            };
            if let Some(previous) = &current {
                for (id, placement) in planned.placements() {
                    if previous.shard_of(id) != Some(placement.shard) {
                        apps_moved += placement.apps;
                        clusters_moved += 1;
                    }
                }
            }
            let truth: Vec<f64> = costs.iter().map(|(truth, _)| *truth).collect();
            let truth = with_costs(fleet, &truth);
            balances.push(balance_of(&truth, |id| planned.shard_of(id), &shards));
            current = Some(planned);
        }
        let summary = Summary::of(&balances);
        let hours = f64::from(self.hours);
        Ok(Run {
            median: summary.median,
            p95: summary.p95,
            apps_per_hour: apps_moved as f64 / hours / total_apps.max(1) as f64,
            clusters_per_hour: clusters_moved as f64 / hours,
        })
    }
}

/// The fleet with each cluster's weight set to its cost per app (scaled so that the starting
/// cost is 1000).
fn with_costs(fleet: &[Cluster], costs: &[f64]) -> Vec<Cluster> {
    fleet
        .iter()
        .zip(costs)
        .map(|(c, cost)| {
            let weight = (cost * COST_SCALE).round().clamp(1.0, f64::from(u32::MAX));
            Cluster {
                weight: Some(weight as u32),
                ..c.clone()
            }
        })
        .collect()
}

/// A draw from the standard normal distribution (Box-Muller).
fn standard_normal(rng: &mut impl RngCore) -> f64 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(report: &DriftReport, kind: StrategyKind, model: LoadModel) -> &DriftRow {
        report
            .rows
            .iter()
            .find(|r| r.strategy == kind && r.load_model == model)
            .unwrap()
    }

    #[test]
    fn measured_load_keeps_the_true_balance_that_counting_apps_loses() {
        let mut drift = Drift::reference(vec![StrategyConfig::new(StrategyKind::StickyBalanced)]);
        drift.seeds = 5;
        let report = drift.run().unwrap();
        let apps = row(&report, StrategyKind::StickyBalanced, LoadModel::Apps);
        let measured = row(&report, StrategyKind::StickyBalanced, LoadModel::Measured);
        assert!(measured.true_max_over_mean.median <= 1.10, "{measured:?}");
        assert!(
            apps.true_max_over_mean.median > measured.true_max_over_mean.median,
            "{apps:?} {measured:?}"
        );
        // Counting apps never moves a static fleet; measuring moves a little.
        assert_eq!(apps.apps_moved_per_hour.median, 0.0);
        assert!(measured.apps_moved_per_hour.median <= 0.02, "{measured:?}");
    }

    #[test]
    fn without_drift_or_noise_nothing_moves() {
        let mut drift = Drift::reference(vec![
            StrategyConfig::new(StrategyKind::StickyBalanced),
            StrategyConfig::new(StrategyKind::GreedyMinimum),
        ]);
        (drift.drift, drift.noise, drift.seeds, drift.hours) = (0.0, 0.0, 2, 2);
        let report = drift.run().unwrap();
        for r in &report.rows {
            assert_eq!(r.apps_moved_per_hour.median, 0.0, "{r:?}");
        }
    }

    #[test]
    fn the_history_drifts_by_the_given_rate() {
        let mut drift = Drift::reference(Vec::new());
        (drift.noise, drift.hours, drift.plan_every) = (0.0, 100, 60);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let history = drift.history(2000, &mut rng);
        // After 100 hours the log-costs spread with a standard deviation of 0.1 × √100 = 1.
        let logs: Vec<f64> = history[100].iter().map(|(t, _)| t.ln()).collect();
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        let sd = (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
        assert!((sd - 1.0).abs() < 0.05, "{sd}");
        assert!(history[0].iter().all(|(t, o)| *t == 1.0 && *o == 1.0));
    }
}
