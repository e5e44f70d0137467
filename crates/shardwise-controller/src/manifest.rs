//! An app's manifests as data: parsed from YAML, stamped with their app, compared with what was
//! applied before. No I/O: the destination module sends them.

use std::collections::BTreeSet;

use kube::api::GroupVersionKind;
use serde_json::Value;
use shardwise_api::ResourceRef;
use shardwise_api::keys::{
    APP_ANNOTATION, APP_CLUSTER_LABEL, APP_UID_LABEL, MANAGED_BY, MANIFEST_HASH_ANNOTATION,
};
use shardwise_handoff::keys::unit_token;
use thiserror::Error;
use twox_hash::XxHash3_64;

/// A manifest that cannot be applied as written.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifests are not valid YAML: {0}")]
    Yaml(String),
    #[error("document {index} is not a Kubernetes object: {reason}")]
    NotAnObject { index: usize, reason: String },
    #[error("{0} is declared twice")]
    Duplicate(String),
}

/// One object of an app, as declared.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// The namespace the manifest names, if any.
    pub namespace: Option<String>,
    pub body: Value,
}

impl Manifest {
    /// A manifest with no body, naming the object `reference` names: enough to find its API
    /// resource.
    pub fn reference(reference: &ResourceRef) -> Self {
        Self {
            api_version: reference.api_version.clone(),
            kind: reference.kind.clone(),
            name: reference.name.clone(),
            namespace: reference.namespace.clone(),
            body: Value::Null,
        }
    }

    pub fn gvk(&self) -> GroupVersionKind {
        let (group, version) = match self.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), self.api_version.clone()),
        };
        GroupVersionKind {
            group,
            version,
            kind: self.kind.clone(),
        }
    }
}

/// Parses a multi-document YAML stream; empty documents are skipped. Every document must be an
/// object with `apiVersion`, `kind` and `metadata.name`.
pub fn parse_manifests(text: &str) -> Result<Vec<Manifest>, ManifestError> {
    let documents: Vec<Value> = serde_saphyr::from_str_multiple(text)
        .map_err(|e| ManifestError::Yaml(first_line(&e.to_string())))?;
    let mut seen = BTreeSet::new();
    let mut manifests = Vec::new();
    for (i, body) in documents.into_iter().enumerate() {
        let index = i + 1;
        if body.is_null() {
            continue;
        }
        let not_object = |reason: &str| ManifestError::NotAnObject {
            index,
            reason: reason.to_string(),
        };
        if !body.is_object() {
            return Err(not_object("it is not a mapping"));
        }
        let text_field = |path: &[&str]| -> Option<String> {
            let mut value = &body;
            for part in path {
                value = value.get(part)?;
            }
            value.as_str().filter(|s| !s.is_empty()).map(str::to_string)
        };
        let api_version =
            text_field(&["apiVersion"]).ok_or_else(|| not_object("apiVersion is missing"))?;
        let kind = text_field(&["kind"]).ok_or_else(|| not_object("kind is missing"))?;
        let name = text_field(&["metadata", "name"])
            .ok_or_else(|| not_object("metadata.name is missing"))?;
        let namespace = text_field(&["metadata", "namespace"]);
        let identity = format!(
            "{kind} {api_version} {}/{name}",
            namespace.as_deref().unwrap_or("")
        );
        if !seen.insert(identity) {
            return Err(ManifestError::Duplicate(format!("{kind} {name}")));
        }
        manifests.push(Manifest {
            api_version,
            kind,
            name,
            namespace,
            body,
        });
    }
    Ok(manifests)
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).to_string()
}

/// Whose an applied object is: its app and the FleetCluster it was applied to.
#[derive(Clone, Copy, Debug)]
pub struct Mark<'a> {
    /// The FleetApp's UID.
    pub app_uid: &'a str,
    /// The FleetApp's `namespace/name`.
    pub app: &'a str,
    /// The value of [`APP_CLUSTER_LABEL`] for its FleetCluster ([`cluster_label`]).
    pub cluster: &'a str,
}

/// The value of [`APP_CLUSTER_LABEL`] for the FleetCluster `namespace/name`: a stable hash,
/// since a label value is at most 63 characters and names may be longer. The same token the
/// FleetApps of the cluster carry as their unit label.
pub fn cluster_label(namespace: &str, name: &str) -> String {
    unit_token(namespace, name)
}

/// 16 hex digits of XXH3-64: the same on every platform and version.
fn hash_hex(bytes: &[u8]) -> String {
    format!("{:016x}", XxHash3_64::oneshot(bytes))
}

/// Adds the labels and annotations that tie an applied object to its app and cluster (and the
/// hash of the manifest as declared), and sets the namespace of namespaced objects that do not
/// name one.
pub fn stamp(manifest: &Manifest, namespace: Option<&str>, mark: Mark<'_>) -> Value {
    let mut body = manifest.body.clone();
    // serde_json's maps are ordered by key, so equal manifests serialise (and hash) alike.
    let declared = hash_hex(manifest.body.to_string().as_bytes());
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(ns) = namespace {
            metadata.insert("namespace".into(), Value::String(ns.to_string()));
        }
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(
                APP_UID_LABEL.into(),
                Value::String(mark.app_uid.to_string()),
            );
            labels.insert(
                APP_CLUSTER_LABEL.into(),
                Value::String(mark.cluster.to_string()),
            );
            labels.insert(
                "app.kubernetes.io/managed-by".into(),
                Value::String(MANAGED_BY.into()),
            );
        }
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(APP_ANNOTATION.into(), Value::String(mark.app.to_string()));
            annotations.insert(MANIFEST_HASH_ANNOTATION.into(), Value::String(declared));
        }
    }
    body
}

/// Objects in `previous` that `current` no longer has: what to prune.
pub fn stale(previous: &[ResourceRef], current: &[ResourceRef]) -> Vec<ResourceRef> {
    let keep: BTreeSet<&ResourceRef> = current.iter().collect();
    previous
        .iter()
        .filter(|r| !keep.contains(r))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_from_a_multi_document_stream() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  k: v\n---\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: other\n";
        let m = parse_manifests(text).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[0].gvk(),
            GroupVersionKind {
                group: "".into(),
                version: "v1".into(),
                kind: "ConfigMap".into()
            }
        );
        assert_eq!(m[1].gvk().group, "apps");
        assert_eq!(m[1].namespace.as_deref(), Some("other"));
        assert!(parse_manifests("").unwrap().is_empty());
    }

    #[test]
    fn malformed_manifests_say_which_document_and_why() {
        let cases = [
            (
                "kind: ConfigMap\nmetadata: {name: a}\n",
                "document 1 is not a Kubernetes object: apiVersion is missing",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
                "metadata.name is missing",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n- just\n- a list\n",
                "document 2 is not a Kubernetes object: it is not a mapping",
            ),
            ("apiVersion: v1\nkind: [unclosed\n", "not valid YAML"),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
                "ConfigMap a is declared twice",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_manifests(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn stamping_ties_objects_to_their_app() {
        let m = &parse_manifests(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {tier: web}\n",
        )
        .unwrap()[0];
        let mark = Mark {
            app_uid: "uid-1",
            app: "fleet/app",
            cluster: &cluster_label("fleet", "prod"),
        };
        let body = stamp(m, Some("team-a"), mark);
        assert_eq!(body["metadata"]["namespace"], "team-a");
        assert_eq!(body["metadata"]["labels"]["tier"], "web");
        assert_eq!(body["metadata"]["labels"][APP_UID_LABEL], "uid-1");
        assert_eq!(body["metadata"]["annotations"][APP_ANNOTATION], "fleet/app");
        let cluster_scoped = stamp(m, None, mark);
        assert!(cluster_scoped["metadata"].get("namespace").is_none());
        // The cluster's label fits a label value and tells clusters apart, whatever their names.
        let label = body["metadata"]["labels"][APP_CLUSTER_LABEL]
            .as_str()
            .unwrap();
        assert_eq!(label.len(), 16);
        let long = "x".repeat(253);
        assert_eq!(cluster_label("fleet", &long).len(), 16);
        assert_ne!(
            cluster_label("fleet", "prod"),
            cluster_label("fleet2", "prod")
        );
        // What objects already applied carry: it must not change.
        assert_eq!(
            cluster_label("fleet", "prod"),
            format!("{:016x}", XxHash3_64::oneshot(b"fleet/prod"))
        );
    }

    #[test]
    fn the_manifest_hash_changes_with_the_manifest_only() {
        let hash = |text: &str| {
            let m = &parse_manifests(text).unwrap()[0];
            let mark = Mark {
                app_uid: "uid-1",
                app: "fleet/app",
                cluster: "c",
            };
            stamp(m, Some("team-a"), mark)["metadata"]["annotations"][MANIFEST_HASH_ANNOTATION]
                .as_str()
                .unwrap()
                .to_string()
        };
        let base =
            hash("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v, x: y}\n");
        // Key order and layout are not changes.
        assert_eq!(
            base,
            hash("kind: ConfigMap\napiVersion: v1\ndata:\n  x: y\n  k: v\nmetadata:\n  name: a\n")
        );
        // A removed field is.
        assert_ne!(
            base,
            hash("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n")
        );
    }

    #[test]
    fn stale_objects_are_those_no_longer_declared() {
        let r = |name: &str| ResourceRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("n".into()),
            name: name.into(),
        };
        assert_eq!(stale(&[r("a"), r("b")], &[r("b"), r("c")]), vec![r("a")]);
        assert!(stale(&[], &[r("a")]).is_empty());
    }
}
