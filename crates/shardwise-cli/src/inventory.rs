//! `--inventory FILE`, or `-` for standard input.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use shard_assign::Cluster;
use shardwise_sim::{InventoryFormat, SimError, parse_inventory};

use crate::limits::{self, Usage};

/// Reads and checks an inventory: a file (JSON for `.json`, YAML otherwise) or, for `-`,
/// standard input read as YAML, which takes JSON too.
pub(crate) fn read(path: &Path) -> Result<Vec<Cluster>> {
    let (text, format, what) = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the inventory from standard input")?;
        (
            text,
            InventoryFormat::Yaml,
            "inventory from standard input".to_string(),
        )
    } else {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read inventory {}", path.display()))?;
        (
            text,
            InventoryFormat::from_path(path),
            format!("inventory {}", path.display()),
        )
    };
    let clusters = parse_inventory(&text, format).map_err(|e| match e {
        SimError::InvalidInventory(reason) => Usage(format!("invalid {what}: {reason}")),
        other => Usage(format!("{what}: {other}")),
    })?;
    let apps = clusters
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.apps));
    limits::fleet(clusters.len(), apps, &what)?;
    Ok(clusters)
}
