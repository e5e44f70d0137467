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
        SimError::InvalidInventory(reason) => {
            Usage(format!("invalid {what}: {}", name_the_alias(&reason)))
        }
        other => Usage(format!("{what}: {other}")),
    })?;
    let apps = clusters
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.apps));
    limits::fleet(clusters.len(), apps, &what)?;
    Ok(clusters)
}

/// serde names a duplicate pin `shard` even when the inventory spells one of the two `pin`,
/// its other name: say both, so that the message names a key the user wrote.
fn name_the_alias(reason: &str) -> String {
    const DUPLICATE_PIN: &str = "duplicate field `shard`";
    match reason.strip_suffix(DUPLICATE_PIN) {
        Some(entry) => format!(
            "{entry}the pin is given twice (`shard` and `pin` are one field; give it once, under either name)"
        ),
        None => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_given_twice_names_both_spellings() {
        let text = "- name: a\n  apps: 4\n  pin: 1\n  shard: 2\n";
        let Err(SimError::InvalidInventory(reason)) = parse_inventory(text, InventoryFormat::Yaml)
        else {
            panic!("a pin given twice is refused");
        };
        assert_eq!(
            name_the_alias(&reason),
            r#"entry 1 ("a"): the pin is given twice (`shard` and `pin` are one field; give it once, under either name)"#
        );
        assert_eq!(
            name_the_alias("entry 1: apps missing"),
            "entry 1: apps missing"
        );
    }
}
