//! What an app does to its destination cluster: parse its manifests, server-side apply them with
//! shardwise's field manager, and prune what it applied before but no longer declares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::Value;
use shardwise_api::ResourceRef;
use shardwise_api::keys::{APP_ANNOTATION, APP_UID_LABEL, FIELD_MANAGER, MANAGED_BY};
use thiserror::Error;

use crate::tenancy::{Admission, Object, Refusal};

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

/// Adds the labels and annotation that tie an applied object to its app, and sets the namespace
/// of namespaced objects that do not name one.
pub fn stamp(manifest: &Manifest, namespace: Option<&str>, app_uid: &str, app: &str) -> Value {
    let mut body = manifest.body.clone();
    if let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(ns) = namespace {
            metadata.insert("namespace".into(), Value::String(ns.to_string()));
        }
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(APP_UID_LABEL.into(), Value::String(app_uid.to_string()));
            labels.insert(
                "app.kubernetes.io/managed-by".into(),
                Value::String(MANAGED_BY.into()),
            );
        }
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(APP_ANNOTATION.into(), Value::String(app.to_string()));
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

/// (group, version, kind): a key for the discovery cache.
type KindKey = (String, String, String);

/// A client for one destination cluster, with the discovery answers it needed so far.
pub struct Destination {
    pub client: Client,
    /// What built it: rebuilt when the cluster's spec or Secret changes.
    pub fingerprint: String,
    resources: Mutex<BTreeMap<KindKey, (ApiResource, bool)>>,
    namespaces: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The fingerprint is left out: it is derived from credentials.
        f.debug_struct("Destination").finish_non_exhaustive()
    }
}

/// Failures of a destination operation, worded for a status message.
#[derive(Debug, Error)]
pub enum ApplyError {
    #[error("{kind} {api_version} is not served by the destination cluster")]
    UnknownKind { api_version: String, kind: String },
    #[error("{0} is declared twice (after defaulting its namespace)")]
    Duplicate(String),
    #[error("{target}: {message}")]
    Api { target: String, message: String },
    #[error(
        "{object} is managed by FleetApp {other}: two apps cannot manage one object, so this \
         one leaves it alone"
    )]
    Conflict {
        object: String,
        /// `namespace/name` of the app that manages it.
        other: String,
        /// Its UID.
        other_uid: String,
    },
    #[error("{target}: {}", rejection(*.code))]
    CredentialsRejected { target: String, code: u16 },
    #[error("the destination cluster is unreachable: {0}")]
    Unreachable(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
}

impl ApplyError {
    /// Whether it may pass by itself (retry with backoff) rather than need a change of spec.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable(_) | Self::CredentialsRejected { .. }
        )
    }
}

/// A 401 or 403 in plain words.
pub fn rejection(code: u16) -> String {
    match code {
        401 => "credentials rejected (401): the destination does not accept the token".into(),
        _ => format!("credentials rejected ({code}): the destination does not allow this"),
    }
}

/// The status code of an API answer that refused the credentials.
pub fn rejected(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) if matches!(status.code, 401 | 403) => Some(status.code),
        _ => None,
    }
}

fn api_error(target: String, e: kube::Error) -> ApplyError {
    if let Some(code) = rejected(&e) {
        return ApplyError::CredentialsRejected { target, code };
    }
    match e {
        kube::Error::Api(status) => ApplyError::Api {
            target,
            message: status.message.clone(),
        },
        other => ApplyError::Unreachable(other.to_string()),
    }
}

/// Where one manifest goes: its API resource and namespace (none for cluster-scoped kinds).
#[derive(Debug)]
struct Target<'m> {
    manifest: &'m Manifest,
    resource: ApiResource,
    namespace: Option<String>,
}

impl Target<'_> {
    fn reference(&self) -> ResourceRef {
        ResourceRef {
            api_version: self.manifest.api_version.clone(),
            kind: self.manifest.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.manifest.name.clone(),
        }
    }
}

impl Destination {
    pub fn new(client: Client, fingerprint: String) -> Self {
        Self {
            client,
            fingerprint,
            resources: Mutex::new(BTreeMap::new()),
            namespaces: Mutex::new(BTreeSet::new()),
        }
    }

    /// The API resource of a kind and whether it is namespaced, asking discovery once.
    async fn resource(&self, manifest: &Manifest) -> Result<(ApiResource, bool), ApplyError> {
        let gvk = manifest.gvk();
        let cache_key = (gvk.group.clone(), gvk.version.clone(), gvk.kind.clone());
        if let Some(found) = self
            .resources
            .lock()
            .ok()
            .and_then(|r| r.get(&cache_key).cloned())
        {
            return Ok(found);
        }
        match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, capabilities)) => {
                let namespaced = capabilities.scope == Scope::Namespaced;
                if let Ok(mut cache) = self.resources.lock() {
                    cache.insert(cache_key, (resource.clone(), namespaced));
                }
                Ok((resource, namespaced))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Err(ApplyError::UnknownKind {
                api_version: manifest.api_version.clone(),
                kind: manifest.kind.clone(),
            }),
            Err(kube::Error::Discovery(_)) => Err(ApplyError::UnknownKind {
                api_version: manifest.api_version.clone(),
                kind: manifest.kind.clone(),
            }),
            Err(e) => Err(api_error(
                format!("discovery of {} {}", manifest.kind, manifest.api_version),
                e,
            )),
        }
    }

    /// Resolves where every manifest goes before anything is written, and refuses an app that
    /// declares one object twice once namespaces are defaulted (`namespace: team` and no
    /// namespace into destination `team` are the same object): each resync would write it twice,
    /// and only one of the two could ever be what is live. Every object must be one the app may
    /// write ([`Admission`]), or the app is refused.
    async fn resolve<'m>(
        &self,
        manifests: &'m [Manifest],
        namespace: &str,
        admission: &Admission<'_>,
    ) -> Result<Vec<Target<'m>>, ApplyError> {
        let mut targets = Vec::with_capacity(manifests.len());
        let mut seen = BTreeSet::new();
        for manifest in manifests {
            let (resource, namespaced) = self.resource(manifest).await?;
            let target_ns = namespaced.then(|| {
                manifest
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace.to_string())
            });
            // One object whatever version it is declared at: group, kind, namespace, name.
            let identity = (
                resource.group.clone(),
                manifest.kind.clone(),
                target_ns.clone(),
                manifest.name.clone(),
            );
            admission.check(&Object {
                group: &resource.group,
                kind: &manifest.kind,
                namespace: target_ns.as_deref(),
                name: &manifest.name,
            })?;
            let target = Target {
                manifest,
                resource,
                namespace: target_ns,
            };
            if !seen.insert(identity) {
                return Err(ApplyError::Duplicate(target.reference().to_string()));
            }
            targets.push(target);
        }
        Ok(targets)
    }

    /// Creates the namespace if this client has not seen it yet.
    async fn ensure_namespace(&self, namespace: &str) -> Result<(), ApplyError> {
        if self.namespaces.lock().is_ok_and(|n| n.contains(namespace)) {
            return Ok(());
        }
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"app.kubernetes.io/managed-by": MANAGED_BY}},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch(namespace, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| api_error(format!("Namespace {namespace}"), e))?;
        if let Ok(mut seen) = self.namespaces.lock() {
            seen.insert(namespace.to_string());
        }
        Ok(())
    }

    /// The app, other than `app_uid`, that manages the live object of `target`, if any.
    async fn managed_by_other(
        &self,
        target: &Target<'_>,
        app_uid: &str,
    ) -> Result<Option<(String, String)>, ApplyError> {
        let api: Api<DynamicObject> = match &target.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &target.resource),
            None => Api::all_with(self.client.clone(), &target.resource),
        };
        let reference = target.reference().to_string();
        let Some(live) = api
            .get_opt(&target.manifest.name)
            .await
            .map_err(|e| api_error(reference, e))?
        else {
            return Ok(None);
        };
        let label = |key: &str| live.metadata.labels.as_ref()?.get(key).cloned();
        let annotation = |key: &str| live.metadata.annotations.as_ref()?.get(key).cloned();
        Ok(label(APP_UID_LABEL)
            .filter(|uid| uid != app_uid)
            .map(|uid| (annotation(APP_ANNOTATION).unwrap_or_default(), uid)))
    }

    /// Server-side applies every manifest; returns the inventory of what was applied.
    ///
    /// An object that is neither in `previous` (what this app applied before) nor free is
    /// another app's: the whole app is refused with [`ApplyError::Conflict`] before anything is
    /// written, unless that app is `adopt_from` (the caller found it gone). Only objects new to
    /// the app cost a read, so a steady resync costs nothing extra. An object outside what
    /// `admission` allows refuses the app before anything is written; a namespace is created
    /// only for objects admitted into it.
    pub async fn apply_all(
        &self,
        manifests: &[Manifest],
        namespace: &str,
        admission: &Admission<'_>,
        (app_uid, app): (&str, &str),
        previous: &[ResourceRef],
        adopt_from: Option<&str>,
    ) -> Result<Vec<ResourceRef>, ApplyError> {
        let targets = self.resolve(manifests, namespace, admission).await?;
        let known: BTreeSet<&ResourceRef> = previous.iter().collect();
        for target in &targets {
            if known.contains(&target.reference()) {
                continue;
            }
            if let Some((other, other_uid)) = self.managed_by_other(target, app_uid).await?
                && adopt_from != Some(other_uid.as_str())
            {
                return Err(ApplyError::Conflict {
                    object: target.reference().to_string(),
                    other,
                    other_uid,
                });
            }
        }
        let mut inventory = Vec::with_capacity(targets.len());
        for target in &targets {
            let manifest = target.manifest;
            let api: Api<DynamicObject> = match &target.namespace {
                Some(ns) => {
                    self.ensure_namespace(ns).await?;
                    Api::namespaced_with(self.client.clone(), ns, &target.resource)
                }
                None => Api::all_with(self.client.clone(), &target.resource),
            };
            let body = stamp(manifest, target.namespace.as_deref(), app_uid, app);
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&manifest.name, &params, &Patch::Apply(&body))
                .await
                .map_err(|e| api_error(format!("{} {}", manifest.kind, manifest.name), e))?;
            inventory.push(target.reference());
        }
        inventory.sort();
        Ok(inventory)
    }

    /// Deletes objects the app applied before and no longer declares; only those that still
    /// carry the app's UID label, so that nothing the app does not own is ever deleted.
    pub async fn prune(&self, stale: &[ResourceRef], app_uid: &str) -> Result<usize, ApplyError> {
        let mut deleted = 0;
        for object in stale {
            let manifest = Manifest {
                api_version: object.api_version.clone(),
                kind: object.kind.clone(),
                name: object.name.clone(),
                namespace: object.namespace.clone(),
                body: Value::Null,
            };
            let resource = match self.resource(&manifest).await {
                Ok((resource, _)) => resource,
                // The kind is gone from the cluster, and its objects with it.
                Err(ApplyError::UnknownKind { .. }) => continue,
                Err(e) => return Err(e),
            };
            let api: Api<DynamicObject> = match &object.namespace {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                None => Api::all_with(self.client.clone(), &resource),
            };
            let target = object.to_string();
            let Some(live) = api
                .get_opt(&object.name)
                .await
                .map_err(|e| api_error(target.clone(), e))?
            else {
                continue;
            };
            let ours = live
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(APP_UID_LABEL))
                .is_some_and(|uid| uid == app_uid);
            if !ours {
                continue;
            }
            match api.delete(&object.name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api_error(target, e)),
            }
        }
        Ok(deleted)
    }
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
        let body = stamp(m, Some("team-a"), "uid-1", "fleet/app");
        assert_eq!(body["metadata"]["namespace"], "team-a");
        assert_eq!(body["metadata"]["labels"]["tier"], "web");
        assert_eq!(body["metadata"]["labels"][APP_UID_LABEL], "uid-1");
        assert_eq!(body["metadata"]["annotations"][APP_ANNOTATION], "fleet/app");
        let cluster_scoped = stamp(m, None, "uid-1", "fleet/app");
        assert!(cluster_scoped["metadata"].get("namespace").is_none());
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
