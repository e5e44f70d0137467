//! Whether a live object still holds what its app declares: the comparison that decides whether
//! a reconcile writes at all. Pure; fed JSON values in tests.
//!
//! A live object *holds* a declared one when every field the manifest sets has the same value
//! live. Fields the manifest does not set (defaults the server filled in, status, fields of other
//! field managers) are not looked at: server-side apply would not change them either. What the
//! manifest no longer sets is found another way: the stamp carries a hash of the whole manifest
//! ([`crate::manifest::stamp`]), so any change of manifest is a difference.
//!
//! A false difference only costs one server-side apply that changes nothing (and, changing
//! nothing, raises no watch event); a missed one would leave drift in place. So where the server
//! rewrites a value into another form, the comparison errs towards a difference, except for
//! forms common enough to matter: numbers compared as numbers, `null` (meaning "not set"), and a
//! Secret's `stringData`, which the server stores base64-encoded in `data`.

use base64::Engine;
use serde_json::{Map, Value};

/// The first field, as a path such as `.spec.replicas`, where `live` does not hold `desired`;
/// `None` when it holds every field.
pub fn difference(desired: &Value, live: &Value) -> Option<String> {
    let desired = secret_data_encoded(desired);
    let (Some(desired), Some(live)) = (desired.as_object(), live.as_object()) else {
        return Some(String::new());
    };
    for (key, value) in desired {
        // Status is not applied (a subresource), nor are fields the server owns.
        if key == "status" {
            continue;
        }
        if let Some(path) = holds(value, live.get(key)) {
            return Some(format!(".{key}{path}"));
        }
    }
    None
}

/// Where `live` (absent: `None`) does not hold `desired`, relative to this value.
fn holds(desired: &Value, live: Option<&Value>) -> Option<String> {
    match (desired, live) {
        // A manifest's `null` sets nothing (`creationTimestamp: null` of generated YAML).
        (Value::Null, _) => None,
        (_, None) => Some(String::new()),
        (Value::Object(d), Some(Value::Object(l))) => d
            .iter()
            .find_map(|(key, value)| holds(value, l.get(key)).map(|p| format!(".{key}{p}"))),
        (Value::Array(d), Some(Value::Array(l))) => {
            if d.len() != l.len() {
                return Some(format!(" (length {} live, {} declared)", l.len(), d.len()));
            }
            d.iter()
                .zip(l)
                .enumerate()
                .find_map(|(i, (d, l))| holds(d, Some(l)).map(|p| format!("[{i}]{p}")))
        }
        (Value::Number(d), Some(Value::Number(l))) => {
            let same = match (d.as_i64(), l.as_i64()) {
                (Some(d), Some(l)) => d == l,
                _ => d.as_f64() == l.as_f64(),
            };
            (!same).then(String::new)
        }
        (d, Some(l)) => (d != l).then(String::new),
    }
}

/// A Secret's `stringData` as the server keeps it: base64 in `data`, which it wins over.
fn secret_data_encoded(desired: &Value) -> std::borrow::Cow<'_, Value> {
    let is_secret = desired.get("kind").and_then(Value::as_str) == Some("Secret")
        && desired.get("apiVersion").and_then(Value::as_str) == Some("v1");
    let Some(strings) = desired
        .get("stringData")
        .and_then(Value::as_object)
        .filter(|_| is_secret)
    else {
        return std::borrow::Cow::Borrowed(desired);
    };
    let mut encoded = desired.clone();
    let mut data = desired
        .get("data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(Map::new);
    for (key, value) in strings {
        let text = value.as_str().unwrap_or_default();
        let value = base64::engine::general_purpose::STANDARD.encode(text);
        data.insert(key.clone(), Value::String(value));
    }
    if let Some(object) = encoded.as_object_mut() {
        object.remove("stringData");
        object.insert("data".into(), Value::Object(data));
    }
    std::borrow::Cow::Owned(encoded)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "team", "labels": {"app": "web"},
                         "creationTimestamp": null},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80}]}
            ]}}},
        })
    }

    /// The deployment as a server returns it: defaults, server fields and a status added.
    fn served() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "team", "labels": {"app": "web"},
                         "uid": "u-1", "resourceVersion": "7", "generation": 1,
                         "creationTimestamp": "2026-11-25T10:00:00Z"},
            "spec": {"replicas": 2, "progressDeadlineSeconds": 600,
                     "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
                 "ports": [{"containerPort": 80, "protocol": "TCP"}]}
            ]}}},
            "status": {"replicas": 0},
        })
    }

    #[test]
    fn a_served_object_holds_what_was_declared() {
        assert_eq!(difference(&deployment(), &served()), None);
    }

    #[test]
    fn every_kind_of_drift_is_found_with_its_path() {
        type Edit = fn(&mut Value);
        let cases: [(&str, Edit); 6] = [
            (".spec.replicas", |v| v["spec"]["replicas"] = json!(5)),
            (".metadata.labels.app", |v| {
                v["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove("app");
            }),
            (".spec.template.spec.containers[0].image", |v| {
                v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1");
            }),
            (
                ".spec.template.spec.containers (length 2 live, 1 declared)",
                |v| {
                    let extra = json!({"name": "sidecar", "image": "x"});
                    v["spec"]["template"]["spec"]["containers"]
                        .as_array_mut()
                        .unwrap()
                        .push(extra);
                },
            ),
            (
                ".spec.template.spec.containers[0].ports[0].containerPort",
                |v| {
                    v["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
                        json!("80");
                },
            ),
            (".spec", |v| {
                v.as_object_mut().unwrap().remove("spec");
            }),
        ];
        for (path, edit) in cases {
            let mut live = served();
            edit(&mut live);
            assert_eq!(difference(&deployment(), &live).as_deref(), Some(path));
        }
    }

    #[test]
    fn status_and_fields_nobody_declared_are_not_drift() {
        let mut live = served();
        live["status"] = json!({"replicas": 2, "readyReplicas": 2});
        live["spec"]["revisionHistoryLimit"] = json!(10);
        live["metadata"]["labels"]["added-by"] = json!("someone");
        assert_eq!(difference(&deployment(), &live), None);
        let mut declared = deployment();
        declared["status"] = json!({"replicas": 9});
        assert_eq!(difference(&declared, &served()), None);
    }

    #[test]
    fn numbers_compare_as_numbers() {
        let live = json!({"spec": {"weight": 1.0, "count": 3}});
        assert_eq!(
            difference(&json!({"spec": {"weight": 1, "count": 3.0}}), &live),
            None
        );
        assert_eq!(
            difference(&json!({"spec": {"weight": 1.5}}), &live).as_deref(),
            Some(".spec.weight")
        );
    }

    #[test]
    fn secret_string_data_is_compared_as_the_server_stores_it() {
        let declared = json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "stringData": {"password": "hunter2"}, "data": {"user": "YWRtaW4="},
        });
        let live = json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"user": "YWRtaW4=", "password": "aHVudGVyMg=="}, "type": "Opaque",
        });
        assert_eq!(difference(&declared, &live), None);
        let mut changed = live.clone();
        changed["data"]["password"] = json!("b3RoZXI=");
        assert_eq!(
            difference(&declared, &changed).as_deref(),
            Some(".data.password")
        );
        // Only a Secret's: another kind's stringData is an ordinary field.
        let mut not_secret = declared.clone();
        not_secret["kind"] = json!("ConfigMap");
        assert_eq!(difference(&not_secret, &live).as_deref(), Some(".kind"));
    }

    #[test]
    fn what_is_not_an_object_is_a_difference() {
        assert_eq!(difference(&json!([]), &served()).as_deref(), Some(""));
        assert_eq!(difference(&deployment(), &json!(null)).as_deref(), Some(""));
    }
}
