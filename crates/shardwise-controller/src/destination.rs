//! What an app does to its destination cluster: server-side apply its manifests with
//! shardwise's field manager, and prune what it applied before but no longer declares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::Value;
use shardwise_api::ResourceRef;
use shardwise_api::keys::{APP_ANNOTATION, APP_UID_LABEL, FIELD_MANAGER, MANAGED_BY};
use thiserror::Error;

use crate::manifest::{Manifest, stamp};
use crate::tenancy::{Admission, Object, Refusal};

/// Caches hold only complete entries, so one a panicking thread left behind is still good.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
        401 => "credentials rejected (401): the destination does not accept the token or client certificate".into(),
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
        if let Some(found) = lock(&self.resources).get(&cache_key).cloned() {
            return Ok(found);
        }
        match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok((resource, capabilities)) => {
                let namespaced = capabilities.scope == Scope::Namespaced;
                lock(&self.resources).insert(cache_key, (resource.clone(), namespaced));
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
        if lock(&self.namespaces).contains(namespace) {
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
        lock(&self.namespaces).insert(namespace.to_string());
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
