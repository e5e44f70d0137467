//! JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a schema-less strategic merge patch.

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document cannot be decoded (400).
    #[error("{0}")]
    Decode(String),
    /// The patch cannot be applied to the object (422).
    #[error("{0}")]
    Apply(String),
}

/// The patch formats of `PATCH` requests other than server-side apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Strategic,
    Json,
}

pub fn apply(kind: PatchKind, target: &mut Value, body: &[u8]) -> Result<(), PatchError> {
    match kind {
        PatchKind::Json => {
            let ops: Vec<json_patch::PatchOperation> =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(e.to_string()))?;
            json_patch::patch(target, &ops).map_err(|e| PatchError::Apply(e.to_string()))
        }
        PatchKind::Merge => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(e.to_string()))?;
            if !patch.is_object() {
                return Err(PatchError::Decode(
                    "json: cannot unmarshal non-object into Go value of type map[string]interface {}".into(),
                ));
            }
            json_patch::merge(target, &patch);
            Ok(())
        }
        PatchKind::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(e.to_string()))?;
            let Value::Object(p) = &patch else {
                return Err(PatchError::Decode(
                    "json: cannot unmarshal non-object into Go value of type map[string]interface {}".into(),
                ));
            };
            let t = crate::object::ensure_object(target);
            if merge_map(t, p)? {
                t.clear();
            }
            Ok(())
        }
    }
}

/// The merge key of a list field, by field name, when every element carries it. Lists
/// without one are replaced wholesale. The same table drives server-side apply's keyed lists.
pub fn merge_key(field: &str, elements: &[&Value]) -> Option<&'static str> {
    let key = match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "secrets" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => {
            if elements.iter().all(|e| e.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            }
        }
        "hostAliases" => "ip",
        "ownerReferences" => "uid",
        "conditions" => "type",
        "topologySpreadConstraints" => "topologyKey",
        "taints" => "key",
        _ => return None,
    };
    let keyed = !elements.is_empty()
        && elements
            .iter()
            .all(|e| e.as_object().is_some_and(|o| o.contains_key(key)));
    keyed.then_some(key)
}

/// Lists of scalars that strategic merge patch unions rather than replaces.
fn is_merged_scalar_list(field: &str) -> bool {
    field == "finalizers"
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// Merges `patch` into `target`; returns true when the patch asks to delete `target`.
fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<bool, PatchError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = patch
                .iter()
                .filter(|(k, _)| *k != "$patch")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            return Ok(false);
        }
        Some("delete") => return Ok(true),
        Some("merge") | None => {}
        Some(other) => {
            return Err(PatchError::Apply(format!("unknown patch type: {other}")));
        }
    }
    let mut orders: Vec<(&str, &Vec<Value>)> = Vec::new();
    let mut retain: Option<Vec<&str>> = None;
    for (k, v) in patch {
        if k == "$patch" {
            continue;
        }
        if k == "$retainKeys" {
            retain = v
                .as_array()
                .map(|keys| keys.iter().filter_map(Value::as_str).collect());
            continue;
        }
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            if let Some(order) = v.as_array() {
                orders.push((field, order));
            }
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(gone)) = (target.get_mut(field), v.as_array()) {
                list.retain(|item| !gone.contains(item));
            }
            continue;
        }
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(p) => {
                let mut child = match target.remove(k) {
                    Some(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                if !merge_map(&mut child, p)? {
                    target.insert(k.clone(), Value::Object(child));
                }
            }
            Value::Array(p) => {
                let mut list = match target.remove(k) {
                    Some(Value::Array(l)) => l,
                    _ => Vec::new(),
                };
                merge_list(k, &mut list, p)?;
                target.insert(k.clone(), Value::Array(list));
            }
            scalar => {
                target.insert(k.clone(), scalar.clone());
            }
        }
    }
    if let Some(keep) = retain {
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (field, order) in orders {
        if let Some(Value::Array(list)) = target.get_mut(field) {
            reorder(field, list, order);
        }
    }
    Ok(false)
}

fn merge_list(field: &str, target: &mut Vec<Value>, patch: &[Value]) -> Result<(), PatchError> {
    if patch.iter().any(|e| directive(e) == Some("replace")) {
        *target = patch
            .iter()
            .filter(|e| directive(e) != Some("replace"))
            .cloned()
            .collect();
        return Ok(());
    }
    let all: Vec<&Value> = patch.iter().chain(target.iter()).collect();
    if let Some(key) = merge_key(field, &all) {
        for pe in patch {
            let Some(p) = pe.as_object() else { continue };
            let id = p.get(key);
            if directive(pe) == Some("delete") {
                target.retain(|te| te.get(key) != id);
                continue;
            }
            match target
                .iter_mut()
                .find(|te| te.get(key) == id)
                .and_then(Value::as_object_mut)
            {
                Some(existing) => {
                    merge_map(existing, p)?;
                }
                None => {
                    let mut fresh = Map::new();
                    merge_map(&mut fresh, p)?;
                    target.push(Value::Object(fresh));
                }
            }
        }
    } else if is_merged_scalar_list(field) {
        for pv in patch {
            if !target.contains(pv) {
                target.push(pv.clone());
            }
        }
    } else {
        *target = patch.to_vec();
    }
    Ok(())
}

/// Applies `$setElementOrder`: listed elements first in that order, others after.
fn reorder(field: &str, list: &mut Vec<Value>, order: &[Value]) {
    let refs: Vec<&Value> = list.iter().chain(order.iter()).collect();
    let key = merge_key(field, &refs);
    let id = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let mut rest = std::mem::take(list);
    for o in order {
        let want = id(o);
        if let Some(pos) = rest.iter().position(|v| id(v) == want) {
            list.push(rest.remove(pos));
        }
    }
    list.extend(rest);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn smp(target: Value, patch: Value) -> Value {
        let mut t = target;
        apply(PatchKind::Strategic, &mut t, patch.to_string().as_bytes()).unwrap();
        t
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let live = json!({"spec": {"containers": [
            {"name": "app", "image": "a:1", "ports": [{"containerPort": 80}]},
            {"name": "side", "image": "s:1"}
        ]}});
        let out = smp(
            live,
            json!({"spec": {"$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
                "containers": [{"name": "app", "image": "a:2"}]}}),
        );
        assert_eq!(out["spec"]["containers"][0]["image"], "a:2");
        assert_eq!(
            out["spec"]["containers"][0]["ports"][0]["containerPort"],
            80
        );
        assert_eq!(out["spec"]["containers"][1]["name"], "side");
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    #[test]
    fn strategic_directives() {
        let live = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "args": ["1", "2"]}});
        let out = smp(
            live,
            json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}},
                "spec": {"containers": [{"name": "a", "$patch": "delete"}], "args": ["3"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(out["spec"]["containers"], json!([{"name": "b"}]));
        assert_eq!(out["spec"]["args"], json!(["3"]));
        let out = smp(
            out,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}, "spec": {"$patch": "replace", "x": 1}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(out["spec"], json!({"x": 1}));
        let out = smp(
            json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn json_patch_test_failure_is_an_apply_error() {
        let mut t = json!({"a": 1});
        let err = apply(
            PatchKind::Json,
            &mut t,
            br#"[{"op":"test","path":"/a","value":2}]"#,
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Apply(_)));
        apply(
            PatchKind::Json,
            &mut t,
            br#"[{"op":"test","path":"/a","value":1},{"op":"add","path":"/b","value":[1]}]"#,
        )
        .unwrap();
        assert_eq!(t, json!({"a": 1, "b": [1]}));
        assert!(matches!(
            apply(PatchKind::Json, &mut t, b"{}").unwrap_err(),
            PatchError::Decode(_)
        ));
    }

    #[test]
    fn merge_patch_nulls_delete() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        apply(PatchKind::Merge, &mut t, br#"{"a": {"b": null}, "l": [3]}"#).unwrap();
        assert_eq!(t, json!({"a": {"c": 2}, "l": [3]}));
    }
}
