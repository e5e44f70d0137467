//! Kind-specific behaviour on write: the defaulting, derived fields and validation of the
//! built-in kinds that tests are likely to depend on.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::crd;
use crate::error::{ApiError, FieldError};
use crate::object;
use crate::registry::{ResourceDef, Special};
use crate::selectors::LabelSelector;
use crate::store::State;

/// Adjusts and checks `obj` (the new state; `old` is the previous one on update). Returns field
/// errors for a 422; other failures come back as `Err`.
pub fn prepare(
    st: &State,
    def: &ResourceDef,
    old: Option<&Value>,
    obj: &mut Value,
    now: &str,
) -> Result<Vec<FieldError>, ApiError> {
    let mut errs = Vec::new();
    if def.versions.iter().any(|v| v.scale.is_some())
        && !def.custom
        && obj.pointer("/spec/replicas").is_none()
    {
        object::set_path(obj, ".spec.replicas", json!(1));
    }
    match def.special {
        Special::Namespace => namespace(obj),
        Special::Secret => secret(old, obj, &mut errs)?,
        Special::ConfigMap => immutable_data(old, obj, &["data", "binaryData"], &mut errs),
        Special::Service => errs.extend(service(old, obj)),
        Special::StatefulSet => {
            statefulset_defaults(obj);
            errs.extend(selector_matches_template(obj, "statefulset"));
            if let Some(old) = old {
                errs.extend(statefulset_immutable(old, obj));
            }
        }
        Special::Deployment => {
            errs.extend(selector_matches_template(obj, "deployment"));
            if let Some(old) = old
                && old.pointer("/spec/selector") != obj.pointer("/spec/selector")
            {
                errs.push(FieldError::invalid(
                    "spec.selector",
                    obj.pointer("/spec/selector")
                        .cloned()
                        .unwrap_or(Value::Null),
                    "field is immutable",
                ));
            }
        }
        Special::Crd => {
            let found = crd::validate(obj, old, &st.registry);
            if found.is_empty() {
                let status = crd::status(obj, old, now);
                object::ensure_object(obj).insert("status".into(), status);
            }
            errs.extend(found);
        }
        Special::Plain
        | Special::SelfSubjectAccessReview
        | Special::SubjectAccessReview
        | Special::TokenReview => {}
    }
    Ok(errs)
}

fn namespace(obj: &mut Value) {
    let name = object::name(obj).to_string();
    let meta = object::meta_mut(obj);
    let labels = meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    object::ensure_object(labels).insert("kubernetes.io/metadata.name".into(), name.into());
    if obj.pointer("/spec/finalizers").is_none() {
        object::set_path(obj, ".spec.finalizers", json!(["kubernetes"]));
    }
}

fn secret(
    old: Option<&Value>,
    obj: &mut Value,
    errs: &mut Vec<FieldError>,
) -> Result<(), ApiError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let root = object::ensure_object(obj);
    if let Some(Value::Object(string_data)) = root.remove("stringData") {
        let data = root
            .entry("data")
            .or_insert_with(|| Value::Object(Map::new()));
        let data = object::ensure_object(data);
        for (k, v) in string_data {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            data.insert(k, engine.encode(text).into());
        }
    }
    if let Some(Value::Object(data)) = root.get("data") {
        for (k, v) in data {
            let ok = v.as_str().is_some_and(|s| engine.decode(s).is_ok());
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data[{k:?}]"
                )));
            }
        }
    }
    if root
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        root.insert("type".into(), "Opaque".into());
    }
    if let Some(old) = old
        && old.get("type") != obj.get("type")
    {
        errs.push(FieldError::invalid(
            "type",
            obj.get("type").cloned().unwrap_or(Value::Null),
            "field is immutable",
        ));
    }
    immutable_data(old, obj, &["data"], errs);
    Ok(())
}

/// ConfigMaps and Secrets with `immutable: true` reject changes to their data.
fn immutable_data(old: Option<&Value>, obj: &Value, fields: &[&str], errs: &mut Vec<FieldError>) {
    let Some(old) = old else { return };
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return;
    }
    if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
    for f in fields {
        if old.get(*f) != obj.get(*f) {
            errs.push(FieldError::forbidden(
                *f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

fn service(old: Option<&Value>, obj: &mut Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if obj.pointer("/spec/type").is_none() {
        object::set_path(obj, ".spec.type", json!("ClusterIP"));
    }
    if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert_with(|| "TCP".into());
            if let Some(port) = p.get("port").cloned() {
                p.entry("targetPort").or_insert(port);
            }
        }
    }
    let old_ip = old.and_then(|o| o.pointer("/spec/clusterIP")).cloned();
    let new_ip = obj.pointer("/spec/clusterIP").cloned();
    match (old_ip, new_ip) {
        (Some(o), None) => {
            object::set_path(obj, ".spec.clusterIP", o.clone());
            object::set_path(obj, ".spec.clusterIPs", json!([o]));
        }
        (Some(o), Some(n)) if n.as_str() == Some("") => {
            object::set_path(obj, ".spec.clusterIP", o.clone());
            object::set_path(obj, ".spec.clusterIPs", json!([o]));
        }
        (Some(o), Some(n)) if o != n => {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                n,
                "may not change once set",
            ));
        }
        _ => {}
    }
    errs
}

/// Fills `spec.clusterIP` of a new Service from the store's allocator.
pub fn allocate_cluster_ip(st: &mut State, obj: &mut Value) {
    let wants_ip = obj.pointer("/spec/type").and_then(Value::as_str) != Some("ExternalName");
    let missing = obj
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    if wants_ip && missing {
        let ip = st.next_cluster_ip();
        object::set_path(obj, ".spec.clusterIP", json!(ip));
        object::set_path(obj, ".spec.clusterIPs", json!([ip]));
    }
}

fn statefulset_defaults(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("podManagementPolicy")
        .or_insert_with(|| "OrderedReady".into());
    spec.entry("revisionHistoryLimit")
        .or_insert_with(|| 10.into());
    spec.entry("updateStrategy")
        .or_insert_with(|| json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
}

fn selector_matches_template(obj: &Value, kind: &str) -> Vec<FieldError> {
    let Some(selector) = obj.pointer("/spec/selector") else {
        return vec![FieldError::required("spec.selector", "")];
    };
    let parsed = match LabelSelector::from_object(selector) {
        Ok(s) => s,
        Err(e) => return vec![FieldError::invalid("spec.selector", selector.clone(), e.0)],
    };
    if parsed.is_empty() {
        return vec![FieldError::invalid(
            "spec.selector",
            selector.clone(),
            format!("empty selector is invalid for {kind}"),
        )];
    }
    let labels = obj
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object);
    if parsed.matches(labels) {
        Vec::new()
    } else {
        vec![FieldError::invalid(
            "spec.template.metadata.labels",
            labels.cloned().map(Value::Object).unwrap_or(Value::Null),
            "`selector` does not match template `labels`",
        )]
    }
}

fn statefulset_immutable(old: &Value, new: &Value) -> Vec<FieldError> {
    const MUTABLE: &[&str] = &[
        "replicas",
        "ordinals",
        "template",
        "updateStrategy",
        "revisionHistoryLimit",
        "persistentVolumeClaimRetentionPolicy",
        "minReadySeconds",
    ];
    let strip = |v: &Value| -> Map<String, Value> {
        v.get("spec")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !MUTABLE.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    if strip(old) == strip(new) {
        Vec::new()
    } else {
        vec![FieldError::forbidden(
            "spec",
            "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
        )]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{GroupResource, Registry};
    use crate::store::Store;

    fn def(group: &str, resource: &str) -> ResourceDef {
        ResourceDef::clone(
            Registry::with_builtins()
                .get(&GroupResource::new(group, resource))
                .unwrap(),
        )
    }

    #[test]
    fn secrets_fold_string_data() {
        let store = Store::new(10, 10);
        let st = store.read();
        let mut s = json!({"metadata": {"name": "s"}, "stringData": {"k": "v"}});
        let errs = prepare(&st, &def("", "secrets"), None, &mut s, "now").unwrap();
        assert!(errs.is_empty());
        assert_eq!(
            s,
            json!({"metadata": {"name": "s"}, "data": {"k": "dg=="}, "type": "Opaque"})
        );
        let mut bad = json!({"data": {"k": "!!"}});
        assert_eq!(
            prepare(&st, &def("", "secrets"), None, &mut bad, "now")
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn statefulsets_default_and_validate() {
        let store = Store::new(10, 10);
        let st = store.read();
        let d = def("apps", "statefulsets");
        let mut ok = json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}});
        assert!(prepare(&st, &d, None, &mut ok, "now").unwrap().is_empty());
        assert_eq!(ok["spec"]["replicas"], 1);
        let mut scaled = ok.clone();
        scaled["spec"]["replicas"] = json!(3);
        assert!(
            prepare(&st, &d, Some(&ok), &mut scaled, "now")
                .unwrap()
                .is_empty()
        );
        let mut renamed = ok.clone();
        renamed["spec"]["serviceName"] = json!("other");
        assert_eq!(
            prepare(&st, &d, Some(&ok), &mut renamed, "now")
                .unwrap()
                .len(),
            1
        );
        let mut mismatch = json!({"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "y"}}}}});
        assert_eq!(
            prepare(&st, &d, None, &mut mismatch, "now").unwrap().len(),
            1
        );
    }

    #[test]
    fn immutable_configmaps() {
        let store = Store::new(10, 10);
        let st = store.read();
        let d = def("", "configmaps");
        let old = json!({"immutable": true, "data": {"a": "1"}});
        let mut new = json!({"immutable": true, "data": {"a": "2"}});
        assert_eq!(
            prepare(&st, &d, Some(&old), &mut new, "now").unwrap().len(),
            1
        );
    }
}
