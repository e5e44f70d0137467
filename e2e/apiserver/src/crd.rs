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
            if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
                bad_patterns(
                    schema,
                    &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    &mut errs,
                );
            }
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

/// Every `pattern` of a schema must compile, as the real server checks when a CRD is written.
fn bad_patterns(schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    match schema {
        Value::Object(m) => {
            for (k, child) in m {
                let child_path = format!("{path}.{k}");
                if k == "pattern"
                    && let Some(pattern) = child.as_str()
                    && let Err(e) = regex::Regex::new(pattern)
                {
                    errs.push(FieldError::invalid(
                        child_path,
                        pattern,
                        format!("must be a valid regular expression, but isn't: {e}"),
                    ));
                } else {
                    bad_patterns(child, &child_path, errs);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                bad_patterns(item, &format!("{path}[{i}]"), errs);
            }
        }
        _ => {}
    }
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

/// Prunes unknown fields, applies defaults and checks a custom resource against its version's
/// `openAPIV3Schema`: types, `enum`, `required`, numeric bounds, string lengths and patterns,
/// and the sizes of lists and maps. On an update, `old` is the stored object: a value that did
/// not change is not checked again (the real server's validation ratcheting, GA in 1.33), so an
/// object stored under an older, looser schema can still be written as long as the write does
/// not touch its offending fields.
pub fn apply_schema(obj: &mut Value, schema: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    walk(obj, schema, old, "", true, true, &mut errs);
    errs
}

/// Only prunes unknown fields (for apply configurations, whose defaults nobody owns).
pub fn prune(obj: &mut Value, schema: &Value) {
    walk(obj, schema, None, "", true, false, &mut Vec::new());
}

fn walk(
    v: &mut Value,
    schema: &Value,
    old: Option<&Value>,
    path: &str,
    root: bool,
    defaults: bool,
    errs: &mut Vec<FieldError>,
) {
    // Ratcheting: an unchanged value passes as it is (unknown fields are still pruned below).
    let unchanged = old.is_some_and(|o| o == v);
    let mut found = Vec::new();
    let descend = check_value(v, schema, path, &mut found);
    if !unchanged {
        errs.extend(found);
    }
    if !descend {
        return;
    }
    match v {
        Value::Object(m) => walk_object(m, schema, old, path, root, defaults, errs),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                let old_items = old.and_then(Value::as_array);
                for (i, item) in items.iter_mut().enumerate() {
                    walk(
                        item,
                        item_schema,
                        old_items.and_then(|o| o.get(i)),
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

/// The checks of one value against its schema node; false when its children cannot be
/// checked (wrong type, null, int-or-string).
fn check_value(v: &Value, schema: &Value, path: &str, errs: &mut Vec<FieldError>) -> bool {
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
        return false;
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
        return false;
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
        return false;
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
        Value::Number(n) => check_number(n, v, schema, path, errs),
        Value::String(text) => check_string(text, schema, path, errs),
        Value::Array(items) => check_size(items.len(), v, schema, path, ("Items", "items"), errs),
        Value::Object(m) => {
            check_size(m.len(), v, schema, path, ("Properties", "properties"), errs)
        }
        _ => {}
    }
    true
}

/// `max<Unit>` and `min<Unit>` of a list (`Items`) or a map (`Properties`) of `len` entries.
fn check_size(
    len: usize,
    v: &Value,
    schema: &Value,
    path: &str,
    (unit, noun): (&str, &str),
    errs: &mut Vec<FieldError>,
) {
    if let Some(max) = limit(schema, &format!("max{unit}"))
        && len > max
    {
        errs.push(FieldError::too_many(path, len, max));
    }
    if let Some(min) = limit(schema, &format!("min{unit}"))
        && len < min
    {
        errs.push(FieldError::invalid(
            path,
            v.clone(),
            format!("{path} in body should have at least {min} {noun}"),
        ));
    }
}

/// A non-negative whole number of the schema (`maxLength`, `minItems`...).
fn limit(schema: &Value, name: &str) -> Option<usize> {
    schema
        .get(name)
        .and_then(|l| l.as_u64().or_else(|| l.as_f64().map(|f| f as u64)))
        .and_then(|l| usize::try_from(l).ok())
}

/// A bound as the real server prints it: `10`, not `10.0`.
fn render_bound(bound: f64) -> String {
    if bound.fract() == 0.0 && bound.abs() < 1e18 {
        format!("{}", bound as i64)
    } else {
        bound.to_string()
    }
}

fn check_number(
    n: &serde_json::Number,
    v: &Value,
    schema: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    // Exact comparison for integers, so that 2^53 + 1 is not rounded into range.
    let compare = |bound: &Value| -> Option<std::cmp::Ordering> {
        match (n.as_i64(), n.as_u64(), bound.as_i64()) {
            (Some(x), _, Some(b)) => Some(x.cmp(&b)),
            (None, Some(_), Some(_)) => Some(std::cmp::Ordering::Greater),
            _ => n.as_f64()?.partial_cmp(&bound.as_f64()?),
        }
    };
    // (bound, its exclusive flag, the side a value may not pass it on, the words for the rule)
    let bounds = [
        (
            "maximum",
            "exclusiveMaximum",
            std::cmp::Ordering::Greater,
            "less than",
        ),
        (
            "minimum",
            "exclusiveMinimum",
            std::cmp::Ordering::Less,
            "greater than",
        ),
    ];
    for (name, exclusive, beyond, relation) in bounds {
        let Some(bound) = schema.get(name) else {
            continue;
        };
        let Some(order) = compare(bound) else {
            continue;
        };
        let strict = flag(schema, exclusive);
        if order == beyond || (strict && order.is_eq()) {
            let or_equal = if strict { "" } else { " or equal to" };
            let bound = render_bound(bound.as_f64().unwrap_or_default());
            errs.push(FieldError::invalid(
                path,
                v.clone(),
                format!("{path} in body should be {relation}{or_equal} {bound}"),
            ));
        }
    }
}

fn check_string(text: &str, schema: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(max) = limit(schema, "maxLength")
        && text.len() > max
    {
        errs.push(FieldError::too_long(path, max));
    }
    if let Some(min) = limit(schema, "minLength")
        && text.chars().count() < min
    {
        errs.push(FieldError::invalid(
            path,
            text,
            format!("{path} in body should be at least {min} chars long"),
        ));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        // A pattern that does not compile was refused when the CRD was written; should one
        // get here anyway, it matches nothing, as a broken schema should not pass data.
        let matches = regex::Regex::new(pattern).is_ok_and(|re| re.is_match(text));
        if !matches {
            errs.push(FieldError::invalid(
                path,
                text,
                format!("{path} in body should match '{pattern}'"),
            ));
        }
    }
}

fn walk_object(
    m: &mut Map<String, Value>,
    schema: &Value,
    old: Option<&Value>,
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
                    let old_child = old.and_then(|o| o.get(&k));
                    walk(
                        child,
                        ps,
                        old_child,
                        &child_path(path, &k),
                        false,
                        defaults,
                        errs,
                    );
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
        assert!(apply_schema(&mut obj, &schema, None).is_empty());
        assert_eq!(
            obj["spec"],
            json!({"size": 3, "mode": "a", "free": {"anything": [1]}})
        );
        assert!(obj.get("extra").is_none());
        let mut bad = json!({"spec": {"size": "big", "mode": "c"}});
        let errs = apply_schema(&mut bad, &schema, None);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(errs[0].field, "spec.mode");
        let mut missing = json!({"spec": {}});
        assert_eq!(
            apply_schema(&mut missing, &schema, None)[0].field,
            "spec.size"
        );
        let mut config = json!({"spec": {"size": 1, "junk": 2}});
        prune(&mut config, &schema);
        assert_eq!(config, json!({"spec": {"size": 1}}));
    }

    fn bounded() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "weight": {"type": "integer", "minimum": 1.0, "maximum": 1000},
            "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 1, "exclusiveMaximum": true},
            "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
            "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
            "labels": {"type": "object", "maxProperties": 1, "minProperties": 1, "additionalProperties": {"type": "string"}}}}}})
    }

    fn messages(obj: &mut Value, old: Option<&Value>) -> Vec<String> {
        apply_schema(obj, &bounded(), old)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn bounds_lengths_patterns_and_sizes_are_enforced_with_the_real_messages() {
        let mut good = json!({"spec": {"weight": 1000, "ratio": 0.5, "name": "ab", "tags": ["x"], "labels": {"a": "b"}}});
        assert!(messages(&mut good, None).is_empty());
        let mut bad = json!({"spec": {"weight": 4294967296u64, "ratio": 1, "name": "ABCDEF", "tags": ["x", "y", "z"], "labels": {}}});
        let got = messages(&mut bad, None);
        for expected in [
            "spec.weight: Invalid value: 4294967296: spec.weight in body should be less than or equal to 1000",
            "spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1",
            "spec.name: Too long: may not be more than 5 bytes",
            "spec.name: Invalid value: \"ABCDEF\": spec.name in body should match '^[a-z]+$'",
            "spec.tags: Too many: 3: must have at most 2 items",
            "spec.labels: Invalid value: {}: spec.labels in body should have at least 1 properties",
        ] {
            assert!(
                got.iter().any(|m| m == expected),
                "{expected} not in {got:#?}"
            );
        }
        let mut low = json!({"spec": {"weight": -1, "ratio": 0, "name": "a", "tags": []}});
        let got = messages(&mut low, None);
        for expected in [
            "spec.weight: Invalid value: -1: spec.weight in body should be greater than or equal to 1",
            "spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0",
            "spec.name: Invalid value: \"a\": spec.name in body should be at least 2 chars long",
            "spec.tags: Invalid value: []: spec.tags in body should have at least 1 items",
        ] {
            assert!(
                got.iter().any(|m| m == expected),
                "{expected} not in {got:#?}"
            );
        }
        // 2^63 and beyond are compared exactly, never rounded into range.
        let mut huge = json!({"spec": {"weight": u64::MAX}});
        assert_eq!(messages(&mut huge, None).len(), 1);
    }

    #[test]
    fn unchanged_values_are_not_checked_again() {
        let stored = json!({"spec": {"weight": 5000, "name": "ok"}});
        let mut untouched = json!({"spec": {"weight": 5000, "name": "fine"}});
        assert!(messages(&mut untouched, Some(&stored)).is_empty());
        let mut changed = json!({"spec": {"weight": 5001, "name": "ok"}});
        assert_eq!(messages(&mut changed, Some(&stored)).len(), 1);
        assert_eq!(messages(&mut stored.clone(), None).len(), 1);
    }

    #[test]
    fn a_crd_with_a_broken_pattern_is_refused() {
        let reg = Registry::with_builtins();
        let mut bad = crd();
        bad["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["size"]["pattern"] = json!("([unclosed");
        let errs = validate(&bad, None, &reg);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].field.ends_with(".size.pattern"), "{errs:?}");
    }
}
