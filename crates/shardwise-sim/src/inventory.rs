//! Inventory files: a fleet described by hand (or exported), in YAML or JSON.
//!
//! ```yaml
//! - name: prod-eu-1        # required
//!   id: 3f1c...            # optional, defaults to the name; the cluster object's UID
//!   apps: 120              # required, a non-negative integer
//!   shard: 2               # optional pin
//!   weight: 2              # optional cost multiplier per app, at least 1
//! ```
//!
//! A top-level object `{clusters: [...]}` is accepted too.

use std::collections::BTreeSet;

use serde::Deserialize;
use shard_assign::Cluster;

use crate::error::SimError;

/// How to read an inventory's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InventoryFormat {
    Json,
    Yaml,
}

impl InventoryFormat {
    /// JSON for `.json` files, YAML for everything else.
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(ext) if ext.eq_ignore_ascii_case("json") => InventoryFormat::Json,
            _ => InventoryFormat::Yaml,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Document {
    List(Vec<Entry>),
    Wrapped { clusters: Vec<Entry> },
}

// Numbers are read signed so that a negative count gets its own message rather than a type error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    id: Option<String>,
    apps: i64,
    #[serde(default, alias = "pin")]
    shard: Option<i64>,
    #[serde(default)]
    weight: Option<i64>,
}

/// Parses an inventory. Every entry is checked; the first problem is reported with the entry's
/// position and name.
pub fn parse_inventory(text: &str, format: InventoryFormat) -> Result<Vec<Cluster>, SimError> {
    let document: Document = match format {
        InventoryFormat::Json => serde_json::from_str(text)
            .map_err(|e| SimError::InvalidInventory(format!("not valid JSON: {e}")))?,
        InventoryFormat::Yaml => serde_saphyr::from_str(text)
            .map_err(|e| SimError::InvalidInventory(format!("not valid YAML: {e}")))?,
    };
    let entries = match document {
        Document::List(entries) | Document::Wrapped { clusters: entries } => entries,
    };
    if entries.is_empty() {
        return Err(SimError::InvalidInventory("it lists no clusters".into()));
    }
    let mut seen = BTreeSet::new();
    entries
        .into_iter()
        .enumerate()
        .map(|(position, entry)| {
            let at = |what: String| {
                SimError::InvalidInventory(format!(
                    "entry {} ({:?}): {what}",
                    position + 1,
                    entry.name
                ))
            };
            if entry.name.trim().is_empty() {
                return Err(at("name is empty".into()));
            }
            let id = entry.id.clone().unwrap_or_else(|| entry.name.clone());
            if !seen.insert(id.clone()) {
                return Err(at(format!("id {id:?} is used by an earlier entry")));
            }
            let apps = u64::try_from(entry.apps)
                .map_err(|_| at(format!("apps must be 0 or more, got {}", entry.apps)))?;
            let pin = entry
                .shard
                .map(|s| {
                    u32::try_from(s).map_err(|_| at(format!("shard must be 0 or more, got {s}")))
                })
                .transpose()?;
            let weight = entry
                .weight
                .map(|w| match u32::try_from(w) {
                    Ok(w) if w >= 1 => Ok(w),
                    _ => Err(at(format!(
                        "weight must be a whole number of at least 1, got {w}"
                    ))),
                })
                .transpose()?;
            Ok(Cluster {
                id,
                name: entry.name,
                apps,
                pin,
                weight,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_json_give_the_same_fleet() {
        let yaml =
            "- name: a\n  apps: 10\n- name: b\n  id: uid-b\n  apps: 5\n  shard: 1\n  weight: 2\n";
        let json = r#"{"clusters": [{"name": "a", "apps": 10},
                       {"name": "b", "id": "uid-b", "apps": 5, "pin": 1, "weight": 2}]}"#;
        let from_yaml = parse_inventory(yaml, InventoryFormat::Yaml).unwrap();
        let from_json = parse_inventory(json, InventoryFormat::Json).unwrap();
        assert_eq!(from_yaml, from_json);
        assert_eq!(from_yaml[0].id, "a");
        assert_eq!(from_yaml[1].id, "uid-b");
        assert_eq!(from_yaml[1].pin, Some(1));
        assert_eq!(from_yaml[1].load(), 10);
    }

    #[test]
    fn bad_entries_are_named_in_the_error() {
        let cases = [
            (
                "- name: a\n  apps: -3\n",
                "entry 1 (\"a\"): apps must be 0 or more, got -3",
            ),
            (
                "- name: a\n  apps: 1\n- name: a\n  apps: 2\n",
                "entry 2 (\"a\"): id \"a\" is used",
            ),
            (
                "- name: a\n  apps: 1\n  weight: 0\n",
                "weight must be a whole number of at least 1",
            ),
            (
                "- name: a\n  apps: 1\n  shard: -1\n",
                "shard must be 0 or more",
            ),
            ("- name: a\n  apss: 1\n", "not valid YAML"),
            ("[]", "lists no clusters"),
            ("- name: ''\n  apps: 1\n", "name is empty"),
        ];
        for (text, expected) in cases {
            let err = parse_inventory(text, InventoryFormat::Yaml)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        let err = parse_inventory("{not json", InventoryFormat::Json).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }
}
