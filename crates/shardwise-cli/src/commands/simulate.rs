//! `shardwise simulate`.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shard_assign::{SliceSwitch, StrategyKind};
use shardwise_sim::{
    FleetSource, FleetSpec, InventoryFormat, Scenario, Simulation, SliceMode, parse_inventory,
};

use crate::cli::{ScenarioKind, SimulateArgs, Slicing};
use crate::{output, plot};

pub(crate) fn run(args: &SimulateArgs) -> Result<()> {
    let simulation = simulation(args)?;
    simulation.validate()?;
    let progress = progress_bar(u64::from(simulation.seeds));
    let report = simulation.run(|| progress.inc(1))?;
    progress.finish_and_clear();

    let mut stdout = std::io::stdout().lock();
    output::write_simulation(&mut stdout, &report, args.format)?;
    stdout.flush()?;
    if let Some(path) = &args.plot {
        plot::draw(&report, path).with_context(|| format!("cannot draw {}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}

fn simulation(args: &SimulateArgs) -> Result<Simulation> {
    let fleet = match &args.inventory {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read inventory {}", path.display()))?;
            let clusters = parse_inventory(&text, InventoryFormat::from_path(path))
                .with_context(|| format!("inventory {}", path.display()))?;
            FleetSource::Inventory(clusters)
        }
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
    };
    let kinds: Vec<StrategyKind> = if args.strategies.is_empty() {
        StrategyKind::ALL.to_vec()
    } else {
        let mut kinds = args.strategies.clone();
        kinds.dedup();
        kinds
    };
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
