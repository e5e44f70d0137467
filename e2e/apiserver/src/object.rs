//! Helpers over objects held as `serde_json::Value`.

use serde_json::{Map, Value};

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// Makes `v` an object (replacing anything else) and returns its map.
pub fn ensure_object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("the value was just made an object"),
    }
}

/// The `metadata` map, created if missing.
pub fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    let meta = ensure_object(v)
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    ensure_object(meta)
}

pub fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get("metadata")?.get(field)?.as_str()
}

pub fn name(v: &Value) -> &str {
    meta_str(v, "name").unwrap_or("")
}

pub fn namespace(v: &Value) -> &str {
    meta_str(v, "namespace").unwrap_or("")
}

pub fn key(v: &Value) -> Key {
    (namespace(v).to_string(), name(v).to_string())
}

pub fn uid(v: &Value) -> &str {
    meta_str(v, "uid").unwrap_or("")
}

pub fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_deleting(v: &Value) -> bool {
    meta_str(v, "deletionTimestamp").is_some()
}

/// Now as RFC 3339 with second precision, like `metav1.Time`.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Splits a simple JSON path (`.spec.replicas`, `.status.conditions[0].type`) into steps. As in
/// Kubernetes' JSONPath, `\.` is a dot within a field name
/// (`.metadata.labels.example\.com/tier`).
fn path_steps(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    for part in split_unescaped(path.trim_start_matches('.')) {
        let part = part.as_str();
        if part.is_empty() {
            return None;
        }
        let (field, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !field.is_empty() {
            steps.push(Step::Field(field.to_string()));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let end = inner.find(']')?;
            steps.push(Step::Index(inner[..end].parse().ok()?));
            rest = &inner[end + 1..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(steps)
}

/// `path` split at dots not escaped by a backslash, with `\.` unescaped.
fn split_unescaped(path: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => parts.push(String::new()),
            c => {
                let c = if c == '\\' && chars.peek() == Some(&'.') {
                    chars.next();
                    '.'
                } else {
                    c
                };
                if let Some(p) = parts.last_mut() {
                    p.push(c);
                }
            }
        }
    }
    parts
}

enum Step {
    Field(String),
    Index(usize),
}

pub fn get_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for step in path_steps(path)? {
        cur = match step {
            Step::Field(f) => cur.get(f.as_str())?,
            Step::Index(i) => cur.get(i)?,
        };
    }
    Some(cur)
}

/// Sets a dotted field path, creating intermediate objects; index steps are not supported.
pub fn set_path(v: &mut Value, path: &str, value: Value) -> bool {
    let Some(steps) = path_steps(path) else {
        return false;
    };
    let mut cur = v;
    let count = steps.len();
    for (i, step) in steps.into_iter().enumerate() {
        let Step::Field(f) = step else { return false };
        let map = ensure_object(cur);
        if i + 1 == count {
            map.insert(f, value);
            return true;
        }
        cur = map.entry(f).or_insert_with(|| Value::Object(Map::new()));
    }
    false
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn paths() {
        let mut v = json!({"spec": {"replicas": 2}, "status": {"conditions": [{"type": "Ready"}]}});
        assert_eq!(get_path(&v, ".spec.replicas"), Some(&json!(2)));
        assert_eq!(
            get_path(&v, ".status.conditions[0].type"),
            Some(&json!("Ready"))
        );
        assert!(set_path(&mut v, ".status.replicas", json!(3)));
        assert_eq!(v["status"]["replicas"], 3);
        assert!(set_path(&mut v, ".a.b.c", json!(true)));
        assert_eq!(v["a"]["b"]["c"], true);
        // Escaped dots belong to the field name, as in printer columns of label values.
        let labelled = json!({"metadata": {"labels": {"shardwise.io/shard": "2"}}});
        assert_eq!(
            get_path(&labelled, r".metadata.labels.shardwise\.io/shard"),
            Some(&json!("2"))
        );
        assert_eq!(
            get_path(&labelled, ".metadata.labels.shardwise.io/shard"),
            None
        );
    }
}
