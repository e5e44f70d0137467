//! `shardwise simulate`.

use std::io::{IsTerminal, Write};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shard_assign::{SliceSwitch, StrategyKind};
use shardwise_sim::{Convergence, Drift, FleetSource, FleetSpec, Scenario, Simulation, SliceMode};

use crate::cli::{ScenarioKind, SimulateArgs, Slicing};
use crate::limits::{self, Usage};
use crate::plot::PlotFormat;
use crate::{inventory, output};

pub(crate) fn run(args: &SimulateArgs) -> Result<()> {
    // Every option is checked before the first seed runs, so that a refusal comes before any
    // output, and a size too large for this machine before any work.
    check_sizes(args)?;
    if matches!(args.scenario, ScenarioKind::Converge | ScenarioKind::Drift) {
        return experiment(args);
    }
    let plot_format = args.plot.as_deref().map(PlotFormat::check).transpose()?;
    let simulation = simulation(args)?;
    simulation.validate().map_err(Usage::of)?;
    check_scenario(&simulation)?;

    let progress = progress_bar(u64::from(simulation.seeds));
    let report = simulation.run(|| progress.inc(1))?;
    progress.finish_and_clear();

    let mut stdout = std::io::stdout().lock();
    output::write_simulation(&mut stdout, &report, args.format)?;
    stdout.flush()?;
    #[cfg(not(feature = "plot"))]
    let _ = plot_format;
    #[cfg(feature = "plot")]
    if let (Some(path), Some(format)) = (&args.plot, plot_format) {
        crate::plot::draw(&report, path, format)
            .map_err(|e| e.context(format!("cannot draw {}", path.display())))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

/// Each size within its limit.
fn check_sizes(args: &SimulateArgs) -> Result<(), Usage> {
    limits::at_most("--clusters", args.clusters, limits::MAX_CLUSTERS)?;
    limits::at_most("--apps", args.apps, limits::MAX_APPS)?;
    limits::at_most("--from", args.from, limits::MAX_SHARDS)?;
    limits::at_most("--to", args.to, limits::MAX_SHARDS)?;
    limits::at_most("--count", args.count, limits::MAX_CLUSTERS)?;
    limits::at_most("--steps", args.steps, limits::MAX_STEPS)?;
    limits::at_most("--arrivals", args.arrivals, limits::MAX_CLUSTERS)?;
    limits::at_most("--max-lifetime", args.max_lifetime, limits::MAX_STEPS)?;
    limits::at_most("--passes", args.passes, limits::MAX_STEPS)?;
    limits::at_most("--hours", args.hours, limits::MAX_HOURS)?;
    limits::at_most("--plan-every", args.plan_every, limits::MAX_MINUTES)?;
    limits::at_most("--smoothing", args.smoothing, limits::MAX_MINUTES)?;
    limits::at_most("--seeds", args.seeds, limits::MAX_SEEDS)
}

/// The experiments that replay planning passes: `converge` and `drift`. They place whole
/// clusters and have reports of their own.
fn experiment(args: &SimulateArgs) -> Result<()> {
    let refused = |what: &str| {
        Err(Usage(format!(
            "--scenario {} {what}",
            if args.scenario == ScenarioKind::Converge {
                "converge"
            } else {
                "drift"
            }
        ))
        .into())
    };
    if args.plot.is_some() {
        return refused("has no plot: drop --plot");
    }
    if args.timings {
        return refused("is not timed: drop --timings");
    }
    if !matches!(args.slicing, Slicing::Auto | Slicing::Off) {
        return refused("places whole clusters: drop --slicing");
    }
    let simulation = simulation(args)?;
    let strategies = simulation.strategies.clone();
    // Each pass is one assignment per strategy (two for drift: apps and measured).
    let per_seed = match args.scenario {
        ScenarioKind::Converge => u64::from(args.passes) + 1,
        _ => 2 * (u64::from(args.hours) * 60 / u64::from(args.plan_every) + 1),
    };
    let work = per_seed * strategies.len() as u64 * u64::from(args.seeds);
    if work > limits::MAX_EXPERIMENT_ASSIGNMENTS {
        return Err(Usage(format!(
            "the experiment makes {work} assignments, over the limit of {}: fewer --seeds, --passes or --hours, or a longer --plan-every",
            limits::MAX_EXPERIMENT_ASSIGNMENTS
        ))
        .into());
    }
    let mut stdout = std::io::stdout().lock();
    if args.scenario == ScenarioKind::Converge {
        let experiment = Convergence {
            fleet: simulation.fleet,
            from: args.from,
            to: args.to,
            strategies,
            first_seed: args.first_seed,
            seeds: args.seeds,
            max_passes: args.passes,
        };
        experiment.validate().map_err(Usage::of)?;
        output::write_convergence(&mut stdout, &experiment.run()?, args.format)?;
    } else {
        let experiment = Drift {
            fleet: simulation.fleet,
            shards: args.from,
            strategies,
            hours: args.hours,
            plan_every: args.plan_every,
            drift: args.drift,
            noise: args.noise,
            smoothing: args.smoothing,
            trigger: args.trigger,
            first_seed: args.first_seed,
            seeds: args.seeds,
        };
        experiment.validate().map_err(Usage::of)?;
        output::write_drift(&mut stdout, &experiment.run()?, args.format)?;
    }
    stdout.flush()?;
    Ok(())
}

/// What the scenario makes of the fleet within the limits: the clusters of its largest step,
/// the clusters of all its steps (held at once), and the apps of the clusters that join it
/// (each draws up to twice the fleet's mean).
fn check_scenario(simulation: &Simulation) -> Result<(), Usage> {
    let (clusters, apps) = match &simulation.fleet {
        FleetSource::Synthetic(spec) => (u64::from(spec.clusters), spec.apps),
        FleetSource::Inventory(fleet) => (
            fleet.len() as u64,
            fleet.iter().fold(0u64, |sum, c| sum.saturating_add(c.apps)),
        ),
    };
    let (steps, largest, joining) = match simulation.scenario {
        Scenario::Scale { .. } | Scenario::RemoveClusters { .. } => (1, clusters, 0),
        Scenario::AddClusters { count, .. } => (1, clusters + u64::from(count), u64::from(count)),
        Scenario::Churn {
            steps,
            arrivals,
            max_lifetime,
            ..
        } => (
            u64::from(steps),
            clusters + u64::from(arrivals) * u64::from(max_lifetime.min(steps)),
            u64::from(arrivals) * u64::from(steps),
        ),
    };
    if largest > limits::MAX_CLUSTERS {
        return Err(Usage(format!(
            "the scenario grows the fleet to {largest} clusters, over the limit of {}",
            limits::MAX_CLUSTERS
        )));
    }
    let states = largest * (steps + 1);
    if states > limits::MAX_CLUSTER_STATES {
        return Err(Usage(format!(
            "the scenario holds up to {states} clusters over its {} states ({steps} steps and the start), over the limit of {}: fewer --steps, --arrivals or --max-lifetime",
            steps + 1,
            limits::MAX_CLUSTER_STATES
        )));
    }
    let mean = apps / clusters.max(1);
    let reach = apps.saturating_add(joining.saturating_mul(2 * mean));
    if reach > limits::MAX_SCENARIO_APPS {
        return Err(Usage(format!(
            "the scenario may reach {reach} apps ({joining} joining clusters of up to {} apps each), over the limit of {}",
            2 * mean,
            limits::MAX_SCENARIO_APPS
        )));
    }
    Ok(())
}

fn simulation(args: &SimulateArgs) -> Result<Simulation> {
    let fleet = match &args.inventory {
        Some(path) => FleetSource::Inventory(inventory::read(path)?),
        None => FleetSource::Synthetic(FleetSpec {
            clusters: args.clusters,
            apps: args.apps,
            distribution: args.distribution,
        }),
    };
    let scenario = match args.scenario {
        ScenarioKind::Scale => Scenario::Scale {
            from: args.from,
            to: args.to,
        },
        ScenarioKind::AddClusters => Scenario::AddClusters {
            shards: args.from,
            count: args.count,
        },
        ScenarioKind::RemoveClusters => Scenario::RemoveClusters {
            shards: args.from,
            count: args.count,
        },
        ScenarioKind::Churn => Scenario::Churn {
            shards: args.from,
            steps: args.steps,
            arrivals: args.arrivals,
            max_lifetime: args.max_lifetime,
        },
        // The experiments build their own; the fleet and strategies are what they take.
        ScenarioKind::Converge => Scenario::Scale {
            from: args.from,
            to: args.to,
        },
        ScenarioKind::Drift => Scenario::Scale {
            from: args.from,
            to: args.from,
        },
    };
    // Once each, in the order given.
    let mut kinds: Vec<StrategyKind> = Vec::new();
    let asked = if args.strategies.is_empty() {
        &StrategyKind::ALL[..]
    } else {
        &args.strategies[..]
    };
    for &kind in asked {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(Simulation {
        fleet,
        scenario,
        strategies: kinds.into_iter().map(|k| args.strategy.config(k)).collect(),
        slicing: match args.slicing {
            Slicing::Auto => SliceMode::Switch(SliceSwitch::Auto),
            Slicing::On => SliceMode::Switch(SliceSwitch::On),
            Slicing::Off => SliceMode::Switch(SliceSwitch::Off),
            Slicing::Both => SliceMode::Both,
        },
        first_seed: args.first_seed,
        seeds: args.seeds,
        timings: args.timings,
    })
}

/// A bar on stderr, drawn only when a person is watching it.
fn progress_bar(seeds: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(seeds), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(seeds);
    if let Ok(style) = ProgressStyle::with_template("{spinner} seeds {pos}/{len} {wide_bar} {eta}")
    {
        bar.set_style(style);
    }
    bar
}
