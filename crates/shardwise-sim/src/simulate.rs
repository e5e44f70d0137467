//! Runs every strategy through a scenario over many seeds and summarises balance and churn.

use std::time::Instant;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use shard_assign::{
    AppKeys, Assignment, AssignmentDiff, Balance, Cluster, SliceConfig, SliceSwitch,
    SlicedAssignment, Slicing, StrategyConfig, StrategyKind, assign, assign_sliced, slices,
};

use crate::error::SimError;
use crate::fleet::{FleetSpec, app_keys};
use crate::scenario::{Scenario, Step};
use crate::stats::Summary;

/// Where the fleet of each seed comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum FleetSource {
    /// Drawn anew for every seed.
    Synthetic(FleetSpec),
    /// The same fleet for every seed (seeds then only vary what the scenario draws).
    Inventory(Vec<Cluster>),
}

impl FleetSource {
    /// The fleet of one seed: drawn from `rng`, or the inventory as it is.
    pub fn draw(&self, rng: &mut impl rand::RngCore) -> Vec<Cluster> {
        match self {
            FleetSource::Synthetic(spec) => spec.generate(rng),
            FleetSource::Inventory(clusters) => clusters.clone(),
        }
    }

    /// What a report says about the fleets of this source (a synthetic fleet has exactly its
    /// spec's clusters and apps).
    pub fn description(&self) -> FleetDescription {
        let (clusters, apps, distribution) = match self {
            FleetSource::Synthetic(spec) => (
                u64::from(spec.clusters),
                spec.apps,
                spec.distribution.to_string(),
            ),
            FleetSource::Inventory(c) => (
                c.len() as u64,
                c.iter().map(|c| c.apps).sum(),
                "inventory".to_string(),
            ),
        };
        FleetDescription {
            clusters,
            apps,
            distribution,
        }
    }
}

/// Whether strategies run with clusters cut into slices: as a switch sets it (`auto` slices
/// with `sticky-balanced` only), or every strategy that may cut both with and without, side by
/// side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SliceMode {
    /// Each strategy runs once, sliced if the switch says so for it.
    Switch(SliceSwitch),
    /// Each strategy runs without slices, and again with them if it can cut.
    Both,
}

impl Default for SliceMode {
    fn default() -> Self {
        SliceMode::Switch(SliceSwitch::Auto)
    }
}

/// A simulation: a fleet, a scenario, the strategies to compare and the seeds to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// Where each seed's fleet comes from.
    pub fleet: FleetSource,
    /// The change the strategies absorb.
    pub scenario: Scenario,
    /// The strategies to compare, in report order.
    pub strategies: Vec<StrategyConfig>,
    /// Slicing, for the strategies that slice (never `legacy-modulo` or `round-robin`).
    pub slicing: SliceMode,
    /// The first seed; the others follow it.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
    /// Whether to time every assignment ([`StrategyReport::assign_ms`]); off, a report depends
    /// on its inputs only.
    pub timings: bool,
}

impl Simulation {
    /// The reference experiment (docs/simulator.md): 100 clusters, 10,000 apps at random, 10 shards
    /// scaled to 9, 100 seeds, every strategy with default parameters.
    pub fn reference() -> Self {
        Self {
            fleet: FleetSource::Synthetic(FleetSpec::REFERENCE),
            scenario: Scenario::REFERENCE,
            strategies: StrategyKind::ALL.map(StrategyConfig::new).to_vec(),
            slicing: SliceMode::default(),
            first_seed: 0,
            seeds: 100,
            timings: false,
        }
    }

    /// Refuses a simulation that cannot run: no strategy or seed, a seed range past
    /// `u64::MAX`, an invalid strategy, an empty fleet or an invalid scenario.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.strategies.is_empty() {
            return Err(SimError::InvalidScenario("no strategy selected".into()));
        }
        if self.seeds == 0 {
            return Err(SimError::InvalidScenario(
                "at least one seed is needed".into(),
            ));
        }
        if self.first_seed.checked_add(u64::from(self.seeds)).is_none() {
            return Err(SimError::InvalidScenario(format!(
                "{} seeds from {} go past the largest seed, {}",
                self.seeds,
                self.first_seed,
                u64::MAX
            )));
        }
        for config in &self.strategies {
            config.validate()?;
        }
        let size = match &self.fleet {
            FleetSource::Synthetic(spec) => spec.clusters as usize,
            FleetSource::Inventory(clusters) => clusters.len(),
        };
        if size == 0 {
            return Err(SimError::InvalidScenario(
                "the fleet has no clusters".into(),
            ));
        }
        self.scenario.validate(size)
    }

    /// Runs the simulation, calling `on_seed` after each seed (for progress reporting).
    pub fn run(&self, mut on_seed: impl FnMut()) -> Result<Report, SimError> {
        self.validate()?;
        let variants = self.variants();
        let mut runs: Vec<StrategyRuns> =
            variants.iter().map(|_| StrategyRuns::default()).collect();
        for seed in self.first_seed..self.first_seed + u64::from(self.seeds) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let fleet = self.fleet.draw(&mut rng);
            let steps = self.scenario.steps(fleet, &mut rng);
            let keys = if variants.iter().any(|(_, sliced)| *sliced) {
                app_keys(steps.iter().flat_map(|s| &s.clusters))
            } else {
                AppKeys::new()
            };
            let slice_config =
                SliceConfig::enabled().with_copy_cost(SliceConfig::MEASURED_COPY_COST_APPS);
            for ((config, sliced), runs) in variants.iter().zip(&mut runs) {
                let slicing = sliced.then_some((&slice_config, &keys));
                let mut run = run_steps(config, slicing, &steps)?;
                if !self.timings {
                    run.assign_ms.clear();
                }
                runs.push(run);
            }
            on_seed();
        }
        Ok(Report {
            scenario: self.scenario,
            fleet: self.fleet.description(),
            first_seed: self.first_seed,
            seeds: self.seeds,
            strategies: variants
                .iter()
                .zip(runs)
                .map(|(&(config, sliced), runs)| runs.summarise(config, sliced, self.timings))
                .collect(),
        })
    }

    /// Every strategy to run, and whether with slices: both in turn under [`SliceMode::Both`].
    pub fn variants(&self) -> Vec<(StrategyConfig, bool)> {
        let mut out = Vec::new();
        for &config in &self.strategies {
            let can = slices(config.kind);
            match self.slicing {
                SliceMode::Switch(switch) => out.push((config, switch.slices(config.kind))),
                SliceMode::Both => {
                    out.push((config, false));
                    if can {
                        out.push((config, true));
                    }
                }
            }
        }
        out
    }
}

/// The outcome of one strategy on one seed.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedRun {
    /// Balance of the initial assignment.
    pub before: Balance,
    /// Balance after each change (one entry per step after the first).
    pub after: Vec<Balance>,
    /// Per step after the first: the diff from the step before.
    pub diffs: Vec<DiffCounts>,
    /// Shard loads of the initial assignment.
    pub loads_before: Vec<u64>,
    /// Shard loads of the final assignment.
    pub loads_after: Vec<u64>,
    /// Duration of every assignment, in milliseconds (empty when the simulation is not timed).
    pub assign_ms: Vec<f64>,
    /// Per step after the first: cache copies (cluster, shard pairs beyond one per cluster) and
    /// slices beyond one per cluster. Zero without slicing.
    pub(crate) cache_copies: Vec<u64>,
    pub(crate) extra_slices: Vec<u64>,
}

/// The counts of an [`AssignmentDiff`] that the reports use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiffCounts {
    /// Clusters that changed shard.
    pub clusters: u64,
    /// Clusters that left a shard that is still live.
    pub clusters_excluding_removed: u64,
    /// Apps that changed shard.
    pub apps: u64,
    /// Apps that left a shard that is still live.
    pub apps_excluding_removed: u64,
}

impl From<&AssignmentDiff> for DiffCounts {
    fn from(diff: &AssignmentDiff) -> Self {
        Self {
            clusters: diff.clusters_moved() as u64,
            clusters_excluding_removed: diff.voluntary_clusters as u64,
            apps: diff.apps_moved(),
            apps_excluding_removed: diff.voluntary_apps,
        }
    }
}

impl SeedRun {
    /// Moves summed over every change of the scenario.
    pub fn total_moves(&self) -> DiffCounts {
        self.diffs
            .iter()
            .fold(DiffCounts::default(), |sum, d| DiffCounts {
                clusters: sum.clusters + d.clusters,
                clusters_excluding_removed: sum.clusters_excluding_removed
                    + d.clusters_excluding_removed,
                apps: sum.apps + d.apps,
                apps_excluding_removed: sum.apps_excluding_removed + d.apps_excluding_removed,
            })
    }
}

fn loads(assignment: &Assignment) -> Vec<u64> {
    assignment.shard_loads().values().map(|l| l.load).collect()
}

/// Assigns every step in turn, each with the previous result as its previous assignment;
/// with `slicing` (and the apps' keys), clusters are cut into slices as they need, and moves are
/// counted per app.
fn run_steps(
    config: &StrategyConfig,
    slicing: Option<(&SliceConfig, &AppKeys)>,
    steps: &[Step],
) -> Result<SeedRun, SimError> {
    let Some(first) = steps.first() else {
        return Err(SimError::InvalidScenario(
            "a scenario has at least one step".into(),
        ));
    };
    let place = |step: &Step, previous: Option<&SlicedAssignment>| {
        let recorded = previous.map(|p| p.assignment.to_previous());
        let start = Instant::now();
        let result = match slicing {
            Some((slice_config, keys)) => assign_sliced(
                config,
                slice_config,
                &step.clusters,
                keys,
                &step.shards,
                recorded.as_ref(),
                previous.map_or(&Slicing::default(), |p| &p.slicing),
            ),
            None => assign(config, &step.clusters, &step.shards, recorded.as_ref())
                .map(SlicedAssignment::uncut),
        };
        Ok::<_, SimError>((result?, start.elapsed().as_secs_f64() * 1e3))
    };
    let (mut current, ms) = place(first, None)?;
    let mut run = SeedRun {
        before: current.assignment.balance(),
        after: Vec::new(),
        diffs: Vec::new(),
        loads_before: loads(&current.assignment),
        loads_after: Vec::new(),
        assign_ms: vec![ms],
        cache_copies: Vec::new(),
        extra_slices: Vec::new(),
    };
    for step in &steps[1..] {
        let (next, ms) = place(step, Some(&current))?;
        run.diffs.push(match slicing {
            Some((_, keys)) => {
                let moves = next.moves_since(&current, keys);
                DiffCounts {
                    clusters: moves.clusters,
                    clusters_excluding_removed: moves.voluntary_clusters,
                    apps: moves.apps,
                    apps_excluding_removed: moves.voluntary_apps,
                }
            }
            None => DiffCounts::from(&AssignmentDiff::between(
                &current.assignment,
                &next.assignment,
            )),
        });
        run.after.push(next.assignment.balance());
        run.assign_ms.push(ms);
        run.cache_copies.push(next.cache_copies() as u64);
        run.extra_slices.push(next.slicing.extra_slices() as u64);
        current = next;
    }
    run.loads_after = loads(&current.assignment);
    Ok(run)
}

#[derive(Debug, Default)]
struct StrategyRuns {
    seeds: Vec<SeedRun>,
}

impl StrategyRuns {
    fn push(&mut self, run: SeedRun) {
        self.seeds.push(run);
    }

    fn summarise(self, config: StrategyConfig, sliced: bool, timed: bool) -> StrategyReport {
        let after: Vec<Balance> = self
            .seeds
            .iter()
            .flat_map(|s| s.after.iter().copied())
            .collect();
        let before: Vec<Balance> = self.seeds.iter().map(|s| s.before).collect();
        let totals: Vec<DiffCounts> = self.seeds.iter().map(SeedRun::total_moves).collect();
        let field = |f: fn(&DiffCounts) -> u64| -> Summary {
            Summary::of(&totals.iter().map(|d| f(d) as f64).collect::<Vec<_>>())
        };
        let times: Vec<f64> = self
            .seeds
            .iter()
            .flat_map(|s| s.assign_ms.iter().copied())
            .collect();
        let step_count = self.seeds.first().map_or(0, |s| s.after.len());
        let per_step = (0..step_count)
            .map(|i| StepSummary {
                step: i as u32 + 1,
                max_over_mean: Summary::of(
                    &self
                        .seeds
                        .iter()
                        .map(|s| s.after[i].max_over_mean)
                        .collect::<Vec<_>>(),
                ),
                apps_moved: Summary::of(
                    &self
                        .seeds
                        .iter()
                        .map(|s| s.diffs[i].apps as f64)
                        .collect::<Vec<_>>(),
                ),
            })
            .collect();
        let per_seed_last = |f: fn(&SeedRun) -> &Vec<u64>| {
            Summary::of(
                &self
                    .seeds
                    .iter()
                    .map(|s| f(s).last().copied().unwrap_or(0) as f64)
                    .collect::<Vec<_>>(),
            )
        };
        StrategyReport {
            strategy: config.kind,
            config,
            sliced,
            cache_copies: per_seed_last(|s| &s.cache_copies),
            extra_slices: per_seed_last(|s| &s.extra_slices),
            balance: BalanceSummary::of(&after),
            balance_before: BalanceSummary::of(&before),
            moves: MovesSummary {
                clusters: field(|d| d.clusters),
                clusters_excluding_removed: field(|d| d.clusters_excluding_removed),
                apps: field(|d| d.apps),
                apps_excluding_removed: field(|d| d.apps_excluding_removed),
            },
            assign_ms: timed.then(|| Summary::of(&times)),
            per_step,
            runs: self.seeds,
        }
    }
}

/// What a report says about the fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetDescription {
    /// Clusters in a fleet.
    pub clusters: u64,
    /// Apps over all clusters of a fleet.
    pub apps: u64,
    /// How apps are spread (`random`, `zipf:1.5`), or `inventory` for a fleet read from one.
    pub distribution: String,
}

/// The result of a simulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The scenario simulated.
    pub scenario: Scenario,
    /// The fleet it ran on.
    pub fleet: FleetDescription,
    /// The first seed.
    pub first_seed: u64,
    /// Number of seeds.
    pub seeds: u32,
    /// One report per strategy run, in the simulation's order.
    pub strategies: Vec<StrategyReport>,
}

/// Balance statistics over seeds (and over steps, for multi-step scenarios).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BalanceSummary {
    /// Busiest shard's load over the mean.
    pub max_over_mean: Summary,
    /// Busiest minus lightest shard's load, over the mean.
    pub spread_over_mean: Summary,
    /// Coefficient of variation of the shard loads.
    pub cv: Summary,
}

impl BalanceSummary {
    fn of(values: &[Balance]) -> Self {
        let pick = |f: fn(&Balance) -> f64| Summary::of(&values.iter().map(f).collect::<Vec<_>>());
        Self {
            max_over_mean: pick(|b| b.max_over_mean),
            spread_over_mean: pick(|b| b.spread_over_mean),
            cv: pick(|b| b.cv),
        }
    }
}

/// Churn statistics over seeds; multi-step scenarios sum the moves of every step of a seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MovesSummary {
    /// Clusters that changed shard.
    pub clusters: Summary,
    /// Clusters that left a shard that is still live.
    pub clusters_excluding_removed: Summary,
    /// Apps that changed shard.
    pub apps: Summary,
    /// Apps that left a shard that is still live.
    pub apps_excluding_removed: Summary,
}

/// One step of a multi-step scenario, over seeds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepSummary {
    /// The step, from 1 (the first change).
    pub step: u32,
    /// Busiest shard's load over the mean after the step.
    pub max_over_mean: Summary,
    /// Apps that changed shard in the step.
    pub apps_moved: Summary,
}

/// One strategy's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyReport {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Its full configuration.
    pub config: StrategyConfig,
    /// Whether clusters were cut into slices.
    pub sliced: bool,
    /// After the last change: (cluster, shard) pairs beyond one per cluster.
    pub cache_copies: Summary,
    /// After the last change: slices beyond one per cluster.
    pub extra_slices: Summary,
    /// After the change (every step after the first, for multi-step scenarios).
    pub balance: BalanceSummary,
    /// Of the initial assignment.
    pub balance_before: BalanceSummary,
    /// Moves over the whole scenario.
    pub moves: MovesSummary,
    /// Time of one assignment, in milliseconds, when the simulation was timed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assign_ms: Option<Summary>,
    /// Each step after the first, in order.
    pub per_step: Vec<StepSummary>,
    /// Raw per-seed results, for plots and checks.
    #[serde(skip)]
    pub runs: Vec<SeedRun>,
}
