//! `shardwise assign`.

use std::io::Write;

use anyhow::Result;
use shard_assign::{AppKeys, ShardSet, Slicing, assign_sliced};
use shardwise_sim::app_keys;

use crate::cli::AssignArgs;
use crate::limits::{self, Usage};
use crate::{inventory, output};
use shardwise_plan::planning::argocd_pin_rule;

pub(crate) fn run(args: &AssignArgs) -> Result<()> {
    // Options first, then the inventory: every refusal comes before any work.
    if let Some(count) = args.shards {
        limits::at_most("--shards", count, limits::MAX_SHARDS)?;
    }
    for &id in &args.live_shards {
        limits::at_most("--live-shards", id, limits::MAX_SHARDS - 1)?;
    }
    let config = args.strategy_args.config(args.strategy);
    config.validate().map_err(Usage::of)?;
    let clusters = inventory::read(&args.inventory)?;
    let shards: ShardSet = match args.shards {
        Some(count) => ShardSet::contiguous(count),
        None => args.live_shards.iter().copied().collect(),
    };
    let switch = shard_assign::SliceSwitch::from(args.slicing);
    let keys = if switch.slices(args.strategy) {
        app_keys(&clusters)
    } else {
        AppKeys::new()
    };
    let (placed, redirected) = argocd_pin_rule(args.strategy, &clusters, &shards);
    let sliced = assign_sliced(
        &config,
        &switch
            .config_for(args.strategy)
            .with_copy_cost(shard_assign::SliceConfig::MEASURED_COPY_COST_APPS),
        &placed,
        &keys,
        &shards,
        None,
        &Slicing::default(),
    )?;
    let mut stdout = std::io::stdout().lock();
    output::write_assignment(&mut stdout, &sliced, &clusters, &redirected, args.format)?;
    stdout.flush()?;
    for warning in sliced.assignment.warnings().iter().chain(&redirected) {
        eprintln!("warning: {warning}");
    }
    Ok(())
}
