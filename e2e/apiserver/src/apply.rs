//! Server-side apply and `metadata.managedFields` bookkeeping.
//!
//! A simplified structured-merge-diff: maps merge field by field, lists with a known merge key
//! (see [`crate::patch::merge_key`]) merge element by element, every other list is atomic.

use serde_json::{Map, Value, json};

use crate::fieldset::{self, FieldSet};
use crate::patch::merge_key;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

/// Which part of an object a write may own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `status` is excluded when the resource has a status subresource.
    Main { status_subresource: bool },
    /// The status subresource: only `status`.
    Status,
}

impl Scope {
    fn subresource(self) -> &'static str {
        match self {
            Self::Main { .. } => "",
            Self::Status => "status",
        }
    }
}

/// Who writes, for ownership.
#[derive(Clone, Copy, Debug)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub scope: Scope,
    pub now: &'a str,
}

const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// The part of an object that managers can own.
pub fn ownable(obj: &Value, scope: Scope) -> Value {
    let Some(m) = obj.as_object() else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    for (k, v) in m {
        let keep = match scope {
            Scope::Status => k == "status",
            Scope::Main { status_subresource } => {
                !(k == "apiVersion" || k == "kind" || (status_subresource && k == "status"))
            }
        };
        if !keep {
            continue;
        }
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                let rest: Map<String, Value> = meta
                    .iter()
                    .filter(|(mk, _)| !SERVER_METADATA.contains(&mk.as_str()))
                    .map(|(mk, mv)| (mk.clone(), mv.clone()))
                    .collect();
                if !rest.is_empty() {
                    out.insert(k.clone(), Value::Object(rest));
                }
            }
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    Value::Object(out)
}

pub fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|e| {
            let operation = match e.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            Some(Entry {
                manager: e.get("manager")?.as_str()?.to_string(),
                operation,
                api_version: e
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                time: e
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                fields: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            })
        })
        .collect()
}

/// Writes entries into the object, keeping an earlier timestamp for an entry whose fields did
/// not change so that no-op writes stay no-ops.
pub fn write_entries(obj: &mut Value, entries: &[Entry], previous: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let same = previous.iter().find(|p| {
                p.manager == e.manager
                    && p.operation == e.operation
                    && p.subresource == e.subresource
                    && p.api_version == e.api_version
                    && p.fields == e.fields
            });
            let time = same.map(|p| p.time.as_str()).unwrap_or(e.time.as_str());
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation.as_str(),
                "apiVersion": e.api_version,
                "time": time,
                "fieldsType": "FieldsV1",
                "fieldsV1": e.fields.to_fields_v1(),
            });
            if !e.subresource.is_empty()
                && let Some(m) = v.as_object_mut()
            {
                m.insert("subresource".into(), e.subresource.clone().into());
            }
            v
        })
        .collect();
    let meta = crate::object::meta_mut(obj);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

fn is_mine(e: &Entry, w: &Writer<'_>, op: Operation) -> bool {
    e.manager == w.manager && e.operation == op && e.subresource == w.scope.subresource()
}

/// Records the ownership change of a non-apply write (create, update, patch): the writer
/// takes the fields it changed, every manager loses the fields that disappeared.
pub fn track_update(
    old: &Value,
    new: &Value,
    mut entries: Vec<Entry>,
    w: &Writer<'_>,
) -> Vec<Entry> {
    let (changed, removed) = FieldSet::diff(&ownable(old, w.scope), &ownable(new, w.scope));
    if changed.is_empty() && removed.is_empty() {
        return entries;
    }
    for e in &mut entries {
        if !is_mine(e, w, Operation::Update) {
            e.fields.subtract(&changed);
        }
        e.fields.subtract(&removed);
    }
    match entries
        .iter_mut()
        .find(|e| is_mine(e, w, Operation::Update))
    {
        Some(mine) => {
            mine.fields.union(&changed);
            mine.api_version = w.api_version.to_string();
            mine.time = w.now.to_string();
        }
        None if !changed.is_empty() => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: Operation::Update,
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: w.scope.subresource().to_string(),
            fields: changed,
        }),
        None => {}
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

/// A field owned by another manager that the configuration sets to a different value.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    pub manager: String,
    pub field: String,
}

fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, child| !child.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn merge_value(field: &str, live: &mut Value, config: &Value) {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) => {
            for (k, cv) in c {
                match l.get_mut(k) {
                    Some(lv) => merge_value(k, lv, cv),
                    None => {
                        l.insert(k.clone(), cv.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(c)) => {
            let all: Vec<&Value> = l.iter().chain(c.iter()).collect();
            match merge_key(field, &all) {
                Some(key) => {
                    for ce in c {
                        let id = ce.get(key).cloned();
                        match l.iter_mut().find(|le| le.get(key).cloned() == id) {
                            Some(le) => merge_value(field, le, ce),
                            None => l.push(ce.clone()),
                        }
                    }
                }
                None => *l = c.clone(),
            }
        }
        (l, c) => *l = c.clone(),
    }
}

fn has_any_under(set: &FieldSet, path: &[String]) -> bool {
    set.members().iter().any(|m| m.starts_with(path))
}

/// Applies `config` for `w.manager`; returns the new object (without managedFields written)
/// and the new entries, or the conflicts when not forced.
pub fn apply(
    live: &Value,
    entries: Vec<Entry>,
    config: &Value,
    force: bool,
    w: &Writer<'_>,
) -> Result<(Value, Vec<Entry>), Vec<Conflict>> {
    let mut config = ownable(config, w.scope);
    drop_nulls(&mut config);
    let applied = FieldSet::from_object(&config);
    let live_ownable = ownable(live, w.scope);

    let mut entries = entries;
    let mut conflicts = Vec::new();
    let paths = applied.members();
    for e in &mut entries {
        if is_mine(e, w, Operation::Apply) {
            continue;
        }
        let mut lost = FieldSet::default();
        for path in &paths {
            if fieldset::is_element(path) || !e.fields.contains(path) {
                continue;
            }
            let current = fieldset::get(&live_ownable, path);
            if current.is_some() && current != fieldset::get(&config, path) {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    field: fieldset::display(path),
                });
                lost.union(&single(path));
            }
        }
        if force {
            e.fields.subtract(&lost);
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }

    let previous = entries
        .iter()
        .find(|e| is_mine(e, w, Operation::Apply))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut others = FieldSet::default();
    for e in entries.iter().filter(|e| !is_mine(e, w, Operation::Apply)) {
        others.union(&e.fields);
    }

    let mut merged = live.clone();
    merge_value("", &mut merged, &config);
    let mut stale = previous;
    stale.subtract(&applied);
    // Members come parents first; a removed parent takes its children with it.
    let mut doomed: Vec<Vec<String>> = Vec::new();
    for path in stale.members() {
        if !has_any_under(&others, &path) && !doomed.iter().any(|d| path.starts_with(d)) {
            doomed.push(path);
        }
    }
    for path in doomed {
        fieldset::remove(&mut merged, &path, &applied);
    }

    match entries.iter_mut().find(|e| is_mine(e, w, Operation::Apply)) {
        Some(mine) => {
            mine.fields = applied;
            mine.api_version = w.api_version.to_string();
            mine.time = w.now.to_string();
        }
        None => entries.push(Entry {
            manager: w.manager.to_string(),
            operation: Operation::Apply,
            api_version: w.api_version.to_string(),
            time: w.now.to_string(),
            subresource: w.scope.subresource().to_string(),
            fields: applied,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    Ok((merged, entries))
}

/// The set holding exactly one path.
fn single(path: &[String]) -> FieldSet {
    let mut v = Value::Object(Map::new());
    for step in path.iter().rev() {
        let mut m = Map::new();
        m.insert(step.clone(), v);
        v = Value::Object(m);
    }
    FieldSet::from_fields_v1(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: Scope = Scope::Main {
        status_subresource: false,
    };

    fn writer(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "v1",
            scope: MAIN,
            now: "2024-01-01T00:00:00Z",
        }
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}, "data": data})
    }

    #[test]
    fn apply_owns_then_removes_omitted_fields() {
        let live = cm(json!({}));
        let (obj, entries) = apply(
            &live,
            vec![],
            &cm(json!({"a": "1", "b": "2"})),
            false,
            &writer("m"),
        )
        .unwrap();
        assert_eq!(obj["data"], json!({"a": "1", "b": "2"}));
        assert_eq!(entries.len(), 1);
        let (obj, entries) =
            apply(&obj, entries, &cm(json!({"a": "1"})), false, &writer("m")).unwrap();
        assert_eq!(obj["data"], json!({"a": "1"}));
        assert_eq!(
            entries[0].fields.members(),
            vec![vec!["f:data".to_string(), "f:a".to_string()]]
        );
    }

    #[test]
    fn conflicting_managers_and_force() {
        let (obj, entries) = apply(
            &cm(json!({})),
            vec![],
            &cm(json!({"a": "1"})),
            false,
            &writer("one"),
        )
        .unwrap();
        let err = apply(
            &obj,
            entries.clone(),
            &cm(json!({"a": "2"})),
            false,
            &writer("two"),
        )
        .unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "one".into(),
                field: ".data.a".into()
            }]
        );
        // Same value: shared ownership, no conflict.
        let (_, shared) = apply(
            &obj,
            entries.clone(),
            &cm(json!({"a": "1"})),
            false,
            &writer("two"),
        )
        .unwrap();
        assert_eq!(shared.len(), 2);
        let (obj, entries) =
            apply(&obj, entries, &cm(json!({"a": "2"})), true, &writer("two")).unwrap();
        assert_eq!(obj["data"]["a"], "2");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].manager, "two");
    }

    #[test]
    fn keyed_lists_merge_by_name() {
        let live = json!({"spec": {"containers": [{"name": "a", "image": "1"}]}});
        let w = writer("m");
        let (obj, entries) = apply(
            &live,
            vec![],
            &json!({"spec": {"containers": [{"name": "b", "image": "2"}]}}),
            false,
            &w,
        )
        .unwrap();
        assert_eq!(obj["spec"]["containers"].as_array().unwrap().len(), 2);
        let (obj, _) = apply(
            &obj,
            entries,
            &json!({"spec": {"containers": [{"name": "a", "image": "1"}]}}),
            false,
            &w,
        )
        .unwrap();
        let names: Vec<&str> = obj["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["a"]);
    }

    #[test]
    fn updates_take_ownership_without_conflict() {
        let (obj, entries) = apply(
            &cm(json!({})),
            vec![],
            &cm(json!({"a": "1", "b": "1"})),
            false,
            &writer("applier"),
        )
        .unwrap();
        let mut new = obj.clone();
        new["data"]["a"] = json!("2");
        let entries = track_update(&obj, &new, entries, &writer("editor"));
        assert_eq!(entries.len(), 2);
        let editor = entries.iter().find(|e| e.manager == "editor").unwrap();
        assert_eq!(
            editor.fields.members(),
            vec![vec!["f:data".to_string(), "f:a".to_string()]]
        );
        let mut written = new.clone();
        write_entries(&mut written, &entries, &[]);
        assert_eq!(read_entries(&written), entries);
    }
}
