//! `shardwise assign`.

use std::io::Write;

use anyhow::{Context, Result};
use shard_assign::{AppKeys, ShardSet, Slicing, assign_sliced};
use shardwise_sim::{InventoryFormat, app_keys, parse_inventory};

use crate::cli::AssignArgs;
use crate::output;

pub(crate) fn run(args: &AssignArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.inventory)
        .with_context(|| format!("cannot read inventory {}", args.inventory.display()))?;
    let clusters = parse_inventory(&text, InventoryFormat::from_path(&args.inventory))
        .with_context(|| format!("inventory {}", args.inventory.display()))?;
    let shards: ShardSet = match args.shards {
        Some(count) => ShardSet::contiguous(count),
        None => args.live_shards.iter().copied().collect(),
    };
    let config = args.strategy_args.config(args.strategy);
    let switch = shard_assign::SliceSwitch::from(args.slicing);
    let keys = if switch.slices(args.strategy) {
        app_keys(&clusters)
    } else {
        AppKeys::new()
    };
    let sliced = assign_sliced(
        &config,
        &switch.config_for(args.strategy),
        &clusters,
        &keys,
        &shards,
        None,
        &Slicing::default(),
    )?;
    let mut stdout = std::io::stdout().lock();
    output::write_assignment(&mut stdout, &sliced, &clusters, args.format)?;
    stdout.flush()?;
    for warning in sliced.assignment.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(())
}
