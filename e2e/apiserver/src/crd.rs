//! CustomResourceDefinitions: validation, status, the resource they define, and the
//! structural-schema pruning, defaulting and type checking of custom resources.

use serde_json::{Map, Value, json};

use crate::error::FieldError;
use crate::registry::{
    GroupResource, NameRule, PrinterColumn, Registry, ResourceDef, ScalePaths, Special, VersionDef,
};

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn string_list(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Validates a CRD against the registry (for name clashes with other resources).
pub fn validate(crd: &Value, old: Option<&Value>, registry: &Registry) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");
    let kind = s(crd, "/spec/names/kind");
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else if !group.contains('.') {
        errs.push(FieldError::invalid(
            "spec.group",
            group,
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    } else if crate::validation::name(NameRule::Label, plural, false).is_err() {
        errs.push(FieldError::invalid(
            "spec.names.plural",
            plural,
            "a lowercase RFC 1123 label",
        ));
    }
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    let name = crate::object::name(crd);
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = s(crd, "/spec/scope");
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            scope,
            "supported values: \"Cluster\", \"Namespaced\"",
        ));
    }
    if let Some(old) = old
        && s(old, "/spec/scope") != scope
    {
        errs.push(FieldError::invalid(
            "spec.scope",
            scope,
            "field is immutable",
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            Value::Array(vec![]),
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            errs.push(FieldError::invalid(
                "spec.versions",
                Value::Array(versions.clone()),
                "must have exactly one version marked as storage version",
            ));
        }
        let mut seen = Vec::new();
        for (i, v) in versions.iter().enumerate() {
            let vname = v.get("name").and_then(Value::as_str).unwrap_or("");
            if vname.is_empty() {
                errs.push(FieldError::required(format!("spec.versions[{i}].name"), ""));
            } else if seen.contains(&vname) {
                errs.push(FieldError::duplicate(
                    format!("spec.versions[{i}].name"),
                    vname,
                ));
            }
            seen.push(vname);
        }
    }
    if !group.is_empty()
        && !plural.is_empty()
        && let Some(existing) = registry.get(&GroupResource::new(group, plural))
        && !existing.custom
    {
        errs.push(FieldError::invalid(
            "spec.names.plural",
            plural,
            "is already served by a built-in resource",
        ));
    }
    errs
}

fn condition(kind: &str, reason: &str, message: &str, now: &str, old: Option<&Value>) -> Value {
    let previous = old
        .and_then(|o| o.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        })
        .and_then(|c| c.get("lastTransitionTime"))
        .cloned();
    json!({
        "type": kind,
        "status": "True",
        "lastTransitionTime": previous.unwrap_or_else(|| now.into()),
        "reason": reason,
        "message": message,
    })
}

/// The status the server maintains: accepted names, Established/NamesAccepted, stored versions.
pub fn status(crd: &Value, old: Option<&Value>, now: &str) -> Value {
    let kind = s(crd, "/spec/names/kind");
    let singular = match s(crd, "/spec/names/singular") {
        "" => kind.to_lowercase(),
        other => other.to_string(),
    };
    let list_kind = match s(crd, "/spec/names/listKind") {
        "" => format!("{kind}List"),
        other => other.to_string(),
    };
    let mut accepted = json!({
        "plural": s(crd, "/spec/names/plural"),
        "singular": singular,
        "kind": kind,
        "listKind": list_kind,
    });
    for field in ["shortNames", "categories"] {
        let list = string_list(crd, &format!("/spec/names/{field}"));
        if !list.is_empty()
            && let Some(m) = accepted.as_object_mut()
        {
            m.insert(field.into(), list.into());
        }
    }
    let mut stored = old
        .map(|o| string_list(o, "/status/storedVersions"))
        .unwrap_or_default();
    if let Some(storage) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name"))
        .and_then(Value::as_str)
        && !stored.iter().any(|s| s == storage)
    {
        stored.push(storage.to_string());
    }
    json!({
        "acceptedNames": accepted,
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found", now, old),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted", now, old),
        ],
        "storedVersions": stored,
    })
}

/// The resource a (valid) CRD defines, with its served versions.
pub fn definition(crd: &Value) -> ResourceDef {
    let kind = s(crd, "/spec/names/kind").to_string();
    let versions_json = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut storage_version = String::new();
    let mut versions = Vec::new();
    for v in &versions_json {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage_version = name.clone();
        }
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let scale = v.pointer("/subresources/scale").map(|sc| ScalePaths {
            spec_replicas: s(sc, "/specReplicasPath").to_string(),
            status_replicas: s(sc, "/statusReplicasPath").to_string(),
            label_selector: sc
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .map(String::from),
            selector_is_object: false,
        });
        let columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: s(c, "/name").to_string(),
                        type_: s(c, "/type").to_string(),
                        json_path: s(c, "/jsonPath").to_string(),
                        description: s(c, "/description").to_string(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        versions.push(VersionDef {
            name,
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            status: v.pointer("/subresources/status").is_some(),
            scale,
            columns,
        });
    }
    let singular = match s(crd, "/spec/names/singular") {
        "" => kind.to_lowercase(),
        other => other.to_string(),
    };
    let list_kind = match s(crd, "/spec/names/listKind") {
        "" => format!("{kind}List"),
        other => other.to_string(),
    };
    ResourceDef {
        gr: GroupResource::new(s(crd, "/spec/group"), s(crd, "/spec/names/plural")),
        kind,
        list_kind,
        singular,
        namespaced: s(crd, "/spec/scope") == "Namespaced",
        short_names: string_list(crd, "/spec/names/shortNames"),
        categories: string_list(crd, "/spec/names/categories"),
        versions,
        storage_version,
        generation: true,
        name_rule: NameRule::Subdomain,
        field_labels: Vec::new(),
        special: Special::Plain,
        create_only: false,
        initial_status: None,
        custom: true,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(expected: &str, v: &Value) -> bool {
    match expected {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        _ => true,
    }
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Prunes unknown fields, applies defaults and checks types, enums and required fields of a
/// custom resource against its version's `openAPIV3Schema`.
pub fn apply_schema(obj: &mut Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk(obj, schema, "", true, true, &mut errs);
    errs
}

/// Only prunes unknown fields (for apply configurations, whose defaults nobody owns).
pub fn prune(obj: &mut Value, schema: &Value) {
    walk(obj, schema, "", true, false, &mut Vec::new());
}

fn walk(
    v: &mut Value,
    schema: &Value,
    path: &str,
    root: bool,
    defaults: bool,
    errs: &mut Vec<FieldError>,
) {
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errs.push(FieldError::invalid(
                path,
                type_name(v),
                format!(
                    "{path} in body must be of type int-or-string: {:?}",
                    type_name(v)
                ),
            ));
        }
        return;
    }
    if v.is_null() {
        if !flag(schema, "nullable") && schema.get("type").is_some() {
            errs.push(FieldError::invalid(
                path,
                "null",
                format!(
                    "{path} in body must be of type {}: \"null\"",
                    s(schema, "/type")
                ),
            ));
        }
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_ok(expected, v)
    {
        errs.push(FieldError::invalid(
            path,
            type_name(v),
            format!(
                "{path} in body must be of type {expected}: {:?}",
                type_name(v)
            ),
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
        errs.push(FieldError::not_supported(
            path,
            v.clone(),
            format!("supported values: {}", list.join(", ")),
        ));
    }
    match v {
        Value::Object(m) => walk_object(m, schema, path, root, defaults, errs),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(
                        item,
                        item_schema,
                        &format!("{path}[{i}]"),
                        false,
                        defaults,
                        errs,
                    );
                }
            }
        }
        _ => {}
    }
}

fn walk_object(
    m: &mut Map<String, Value>,
    schema: &Value,
    path: &str,
    root: bool,
    defaults: bool,
    errs: &mut Vec<FieldError>,
) {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let additional = schema.get("additionalProperties");
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = root || flag(schema, "x-kubernetes-embedded-resource");
    for (k, ps) in properties.iter().filter(|_| defaults) {
        if !m.contains_key(k)
            && let Some(default) = ps.get("default")
        {
            m.insert(k.clone(), default.clone());
        }
    }
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(r) {
            errs.push(FieldError::required(child_path(path, r), ""));
        }
    }
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if embedded && (k == "apiVersion" || k == "kind" || k == "metadata") {
            continue;
        }
        let sub_schema = properties
            .get(&k)
            .or_else(|| additional.filter(|a| a.is_object()));
        match sub_schema {
            Some(ps) => {
                if let Some(child) = m.get_mut(&k) {
                    walk(child, ps, &child_path(path, &k), false, defaults, errs);
                }
            }
            None => {
                let keep = preserve || additional.and_then(Value::as_bool) == Some(true);
                if !keep {
                    m.remove(&k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "integer"}, "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}}},
                    {"name": "v1beta1", "served": true, "storage": false}
                ]}
        })
    }

    #[test]
    fn valid_crd_defines_a_resource() {
        let reg = Registry::with_builtins();
        assert!(validate(&crd(), None, &reg).is_empty());
        let def = definition(&crd());
        assert_eq!(def.gr, GroupResource::new("example.com", "widgets"));
        assert_eq!(def.storage_version, "v1");
        assert_eq!(def.versions.len(), 2);
        assert!(def.version("v1").unwrap().status);
        assert!(def.version("v1").unwrap().scale.is_some());
        let st = status(&crd(), None, "now");
        assert_eq!(st["conditions"][1]["type"], "Established");
        assert_eq!(st["storedVersions"], json!(["v1"]));
    }

    #[test]
    fn invalid_crds_are_rejected() {
        let reg = Registry::with_builtins();
        let mut bad = crd();
        bad["metadata"]["name"] = json!("wrong");
        bad["spec"]["versions"][1]["storage"] = json!(true);
        let errs = validate(&bad, None, &reg);
        assert_eq!(errs.len(), 2, "{errs:?}");
        let mut builtin = crd();
        builtin["spec"]["group"] = json!("apps");
        assert!(!validate(&builtin, None, &reg).is_empty());
    }

    #[test]
    fn schema_prunes_defaults_and_checks() {
        let def = definition(&crd());
        let schema = def.version("v1").unwrap().schema.clone().unwrap();
        let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 3, "unknown": 1, "free": {"anything": [1]}}, "extra": true});
        assert!(apply_schema(&mut obj, &schema).is_empty());
        assert_eq!(
            obj["spec"],
            json!({"size": 3, "mode": "a", "free": {"anything": [1]}})
        );
        assert!(obj.get("extra").is_none());
        let mut bad = json!({"spec": {"size": "big", "mode": "c"}});
        let errs = apply_schema(&mut bad, &schema);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(errs[0].field, "spec.mode");
        let mut missing = json!({"spec": {}});
        assert_eq!(apply_schema(&mut missing, &schema)[0].field, "spec.size");
        let mut config = json!({"spec": {"size": 1, "junk": 2}});
        prune(&mut config, &schema);
        assert_eq!(config, json!({"spec": {"size": 1}}));
    }
}
