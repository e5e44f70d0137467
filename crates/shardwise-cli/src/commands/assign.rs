//! `shardwise assign`.

use std::io::Write;

use anyhow::{Context, Result};
use shard_assign::{ShardSet, assign};
use shardwise_sim::{InventoryFormat, parse_inventory};

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
    let assignment = assign(&config, &clusters, &shards, None)?;
    let mut stdout = std::io::stdout().lock();
    output::write_assignment(&mut stdout, &assignment, &clusters, args.format)?;
    stdout.flush()?;
    for warning in assignment.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(())
}
