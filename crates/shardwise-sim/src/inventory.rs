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
//! A top-level object `{clusters: [...]}` is accepted too, and so is the JSON of `shardwise
//! plan` (`kind: plan`): its clusters' `pin` is the pin, and their current `shard` and `load`
//! are left aside.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;
use shard_assign::Cluster;

use crate::error::SimError;

/// How to read an inventory's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InventoryFormat {
    /// JSON.
    Json,
    /// YAML.
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

/// The `kind` of `shardwise plan --format json`, whose `clusters` list is a fleet too.
const PLAN_KIND: &str = "plan";

/// Keys of a plan's clusters that describe where they are, not what they are: the current
/// shard is no pin (that is `pin`), and the load follows from apps and weight.
const PLAN_PLACEMENT_KEYS: [&str; 2] = ["shard", "load"];

/// Parses an inventory. Every entry is checked; the first problem is reported with the entry's
/// position and name, and the field at fault.
pub fn parse_inventory(text: &str, format: InventoryFormat) -> Result<Vec<Cluster>, SimError> {
    // Read as a generic document first, so that a mistake in one entry is reported for that
    // entry and field rather than as a document that matches no shape.
    let document: Value = match format {
        InventoryFormat::Json => serde_json::from_str(text)
            .map_err(|e| SimError::InvalidInventory(format!("not valid JSON: {e}")))?,
        InventoryFormat::Yaml => serde_saphyr::from_str(text)
            .map_err(|e| SimError::InvalidInventory(format!("not valid YAML: {e}")))?,
    };
    let (values, from_plan) = entry_values(document)?;
    if values.is_empty() {
        return Err(SimError::InvalidInventory("it lists no clusters".into()));
    }
    let entries = values
        .into_iter()
        .enumerate()
        .map(|(position, value)| entry(position, value, from_plan))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = BTreeSet::new();
    entries
        .into_iter()
        .enumerate()
        .map(|(position, entry)| {
            let at = |what: String| at_entry(position, Some(&entry.name), what);
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

fn at_entry(position: usize, name: Option<&str>, what: String) -> SimError {
    SimError::InvalidInventory(match name {
        Some(name) => format!("entry {} ({name:?}): {what}", position + 1),
        None => format!("entry {}: {what}", position + 1),
    })
}

/// The entries of a document: a list, an object with only a `clusters` list, or a plan's JSON
/// (`kind: plan`, whose other keys are the plan). The flag says the latter.
fn entry_values(document: Value) -> Result<(Vec<Value>, bool), SimError> {
    let shape = "an inventory is a list of clusters, or an object with a `clusters` list";
    match document {
        Value::Array(entries) => Ok((entries, false)),
        Value::Object(mut object) => {
            let from_plan = object.get("kind").and_then(Value::as_str) == Some(PLAN_KIND);
            if !from_plan && let Some(key) = object.keys().find(|k| *k != "clusters") {
                return Err(SimError::InvalidInventory(format!(
                    "unknown key `{key}` at the top: {shape}"
                )));
            }
            match object.remove("clusters") {
                Some(Value::Array(entries)) => Ok((entries, from_plan)),
                Some(other) => Err(SimError::InvalidInventory(format!(
                    "`clusters` must be a list, got {}",
                    kind_of(&other)
                ))),
                None => Err(SimError::InvalidInventory(format!(
                    "no `clusters` list: {shape}"
                ))),
            }
        }
        other => Err(SimError::InvalidInventory(format!(
            "{shape}, got {}",
            kind_of(&other)
        ))),
    }
}

/// One entry, with the entry and the field named when it does not fit.
fn entry(position: usize, value: Value, from_plan: bool) -> Result<Entry, SimError> {
    let Value::Object(mut object) = value else {
        return Err(at_entry(
            position,
            None,
            format!(
                "a cluster is a map of name, apps and so on, got {}",
                kind_of(&value)
            ),
        ));
    };
    if from_plan {
        for key in PLAN_PLACEMENT_KEYS {
            object.remove(key);
        }
    }
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string);
    // serde would call this a duplicate `shard`, a key the user may not have written.
    if object.contains_key("shard") && object.contains_key("pin") {
        return Err(at_entry(
            position,
            name.as_deref(),
            "the pin is given twice (`shard` and `pin` are one field; give it once, under either name)"
                .into(),
        ));
    }
    serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| {
        let field = format!("`{}`", e.path());
        let message = e.into_inner().to_string();
        // serde names the field itself for unknown and missing fields, not for wrong types.
        let what = if message.contains(&field) || field == "`.`" {
            message
        } else {
            format!("field {field}: {message}")
        };
        at_entry(position, name.as_deref(), what)
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
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
            (
                "- name: a\n  apps: 1\n- name: b\n  apss: 1\n",
                "entry 2 (\"b\"): unknown field `apss`, expected one of",
            ),
            (
                "- name: a\n  apps: many\n",
                "entry 1 (\"a\"): field `apps`: invalid type: string \"many\"",
            ),
            ("- apps: 1\n", "entry 1: missing field `name`"),
            ("- just-a-name\n", "entry 1: a cluster is a map"),
            ("clusterz: []\n", "unknown key `clusterz` at the top"),
            ("clusters: 3\n", "`clusters` must be a list, got a number"),
            ("a string\n", "got a string"),
            ("- name: a\n  apps: [\n", "not valid YAML"),
            ("[]", "lists no clusters"),
            ("- name: ''\n  apps: 1\n", "name is empty"),
            (
                "- name: a\n  apps: 4\n  pin: 1\n  shard: 2\n",
                "entry 1 (\"a\"): the pin is given twice (`shard` and `pin` are one field; give it once, under either name)",
            ),
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

    #[test]
    fn a_plans_json_is_its_fleet_with_pins_and_without_current_shards() {
        let plan = r#"{
            "version": "0.1.0",
            "kind": "plan",
            "source": "shardwise",
            "fleet": {"clusters": 2, "apps": 15},
            "clusters": [
                {"name": "a", "id": "uid-a", "apps": 10, "weight": 1, "load": 10, "pin": null, "shard": 0},
                {"name": "b", "id": "uid-b", "apps": 5, "weight": 2, "load": 10, "pin": 1, "shard": 3}
            ],
            "strategies": []
        }"#;
        let fleet = parse_inventory(plan, InventoryFormat::Json).unwrap();
        let inventory = "- {name: a, id: uid-a, apps: 10, weight: 1}\n\
                         - {name: b, id: uid-b, apps: 5, weight: 2, pin: 1}\n";
        assert_eq!(
            fleet,
            parse_inventory(inventory, InventoryFormat::Yaml).unwrap()
        );
        assert_eq!(fleet[0].pin, None);
        assert_eq!(fleet[1].pin, Some(1));

        // Without `kind: plan`, other top-level keys are refused, and `shard` is a pin.
        let err = parse_inventory(
            &plan.replace("\"plan\"", "\"other\""),
            InventoryFormat::Json,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown key"), "{err}");
        let pinned = parse_inventory(
            r#"{"clusters": [{"name": "a", "apps": 1, "shard": 2}]}"#,
            InventoryFormat::Json,
        )
        .unwrap();
        assert_eq!(pinned[0].pin, Some(2));
    }
}
