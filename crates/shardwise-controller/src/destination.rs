//! What an app does to its destination cluster: server-side apply what differs from the
//! cluster's live objects with shardwise's field manager, and prune what it applied before but
//! no longer declares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::Value;
use shardwise_api::keys::{FIELD_MANAGER, MANAGED_BY};
use shardwise_api::{AppHealth, Health, ResourceRef};
use thiserror::Error;

use shard_assign::app_key;

use crate::drift::difference;
use crate::health::{Assessment, assess};
use crate::live::{LiveKind, LiveObject, LiveObjects};
use crate::manifest::{Manifest, Mark, stamp};
use crate::tenancy::{Admission, Object, Refusal};

/// Caches hold only complete entries, so one a panicking thread left behind is still good.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// (group, version, kind): a key for the discovery cache.
type KindKey = (String, String, String);

/// A client for one destination cluster, with the discovery answers it needed so far and its
/// cache of the objects shardwise manages there.
pub struct Destination {
    pub client: Client,
    /// What built it: rebuilt when the cluster's spec or Secret changes.
    pub fingerprint: String,
    resources: Mutex<BTreeMap<KindKey, (ApiResource, bool)>>,
    namespaces: Mutex<BTreeSet<String>>,
    live: LiveObjects,
    /// How long a reconcile waits for a kind's first listing before writing without it.
    listing_wait: Duration,
    /// Per object, the resourceVersion the server answered this client's last apply with and
    /// the hash of what was applied: a live object still at that version holds that body,
    /// whatever form the server gave its values (`1000m` served as `1`, say), so it is not
    /// compared again. Without this, a value the server rewrites would look like drift at
    /// every look, and be written again each time.
    applied: Mutex<BTreeMap<ResourceRef, (String, u64)>>,
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

/// Why an object is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The live object differs at this field.
    Differs(String),
    /// There is no live object.
    Missing,
    /// The cluster's cache could not tell (its kind could not be listed).
    Unknown,
}

/// One object to write, and why.
#[derive(Debug)]
struct PendingWrite<'m> {
    target: Target<'m>,
    body: Value,
    why: Change,
    /// The cache of its kind, told of the write so that its echo is not taken for drift.
    kind: Option<LiveKind>,
}

/// What a reconcile will write: [`Destination::plan`], then [`Destination::write`].
#[derive(Debug)]
pub struct Plan<'m> {
    inventory: Vec<ResourceRef>,
    writes: Vec<PendingWrite<'m>>,
}

impl Plan<'_> {
    /// Every object the app declares, sorted: the inventory used for pruning.
    pub fn inventory(&self) -> &[ResourceRef] {
        &self.inventory
    }

    /// What differs, object by object, in words (`ConfigMap team/web: .data.k`).
    pub fn changes(&self) -> Vec<String> {
        self.writes
            .iter()
            .map(|w| {
                let object = w.target.reference();
                match &w.why {
                    Change::Differs(path) => format!("{object}: {path}"),
                    Change::Missing => format!("{object}: missing"),
                    Change::Unknown => format!("{object}: not compared"),
                }
            })
            .collect()
    }

    /// Whether some object was found missing or different: drift, as opposed to objects
    /// written only because their kind could not be compared.
    pub fn finds_drift(&self) -> bool {
        self.writes.iter().any(|w| w.why != Change::Unknown)
    }
}

/// The objects [`Destination::write`] wrote, as the server answered.
#[derive(Debug, Default)]
pub struct Written(BTreeMap<ResourceRef, Arc<DynamicObject>>);

/// The health of one object as served, with the object named in the message.
fn assessed(object: &ResourceRef, live: &Value) -> (Health, String) {
    let Assessment { health, message } = assess(live);
    (health, format!("{object}: {message}"))
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

/// What a write of one object found live: nothing known (no cache of the kind), or the cache's
/// answer.
type Found = Option<Option<Arc<LiveObject>>>;

/// A hash of an applied body (serde_json's maps are ordered, so equal bodies hash alike).
fn body_hash(body: &Value) -> u64 {
    twox_hash::XxHash3_64::oneshot(body.to_string().as_bytes())
}

impl Destination {
    pub fn new(
        client: Client,
        fingerprint: String,
        live: LiveObjects,
        listing_wait: Duration,
    ) -> Self {
        Self {
            client,
            fingerprint,
            resources: Mutex::new(BTreeMap::new()),
            namespaces: Mutex::new(BTreeSet::new()),
            live,
            listing_wait,
            applied: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether `live` is still what this client's last apply of `body` left.
    fn left_as_applied(&self, object: &ResourceRef, live: &LiveObject, body: &Value) -> bool {
        let Some(version) = &live.resource_version else {
            return false;
        };
        lock(&self.applied)
            .get(object)
            .is_some_and(|(v, hash)| v == version && *hash == body_hash(body))
    }

    /// How many objects the cluster's cache holds, and the bytes they take.
    pub fn cached(&self) -> (usize, usize) {
        self.live.cached()
    }

    /// The cache of a kind, once listed with the objects of the app whose UID is `app_uid`.
    async fn live_kind(&self, resource: &ApiResource, app_uid: &str) -> Option<LiveKind> {
        self.live
            .listed(resource, app_key(app_uid), self.listing_wait)
            .await
    }

    /// The live object at `reference` as the cache has it, or as a GET finds it where the
    /// cache cannot tell (no cache of the kind, or an object applied before it carried its
    /// cluster's label).
    async fn live_object(
        &self,
        api: &Api<DynamicObject>,
        found: &Found,
        name: &str,
        reference: String,
    ) -> Result<Option<Arc<LiveObject>>, ApplyError> {
        if let Some(Some(live)) = found {
            return Ok(Some(live.clone()));
        }
        api.get_opt(name)
            .await
            .map(|o| o.map(|o| Arc::new(LiveObject::new(&o))))
            .map_err(|e| api_error(reference, e))
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
        found: &Found,
        app_uid: &str,
    ) -> Result<Option<(String, String)>, ApplyError> {
        let api = self.api(&target.resource, target.namespace.as_deref());
        let reference = target.reference().to_string();
        let Some(live) = self
            .live_object(&api, found, &target.manifest.name, reference)
            .await?
        else {
            return Ok(None);
        };
        Ok(live
            .app_uid
            .as_ref()
            .filter(|uid| *uid != app_uid)
            .map(|uid| (live.app.clone().unwrap_or_default(), uid.clone())))
    }

    fn api(&self, resource: &ApiResource, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        }
    }

    /// Works out what to write: every manifest whose live object does not already hold it (see
    /// [`crate::drift`]), or is missing.
    ///
    /// An object that is neither in `previous` (what this app applied before) nor free is
    /// another app's: the whole app is refused with [`ApplyError::Conflict`] before anything is
    /// written, unless that app is `adopt_from` (the caller found it gone). Only objects new to
    /// the app, and not in the cache, cost a read. An object outside what `admission` allows
    /// refuses the app before anything is written.
    pub async fn plan<'m>(
        &self,
        manifests: &'m [Manifest],
        namespace: &str,
        admission: &Admission<'_>,
        mark: Mark<'_>,
        previous: &[ResourceRef],
        adopt_from: Option<&str>,
    ) -> Result<Plan<'m>, ApplyError> {
        let targets = self.resolve(manifests, namespace, admission).await?;
        let mut found: Vec<Found> = Vec::with_capacity(targets.len());
        let mut kinds = Vec::with_capacity(targets.len());
        for target in &targets {
            let kind = self.live_kind(&target.resource, mark.app_uid).await;
            found.push(
                kind.as_ref()
                    .map(|k| k.get(target.namespace.as_deref(), &target.manifest.name)),
            );
            kinds.push(kind);
        }
        let known: BTreeSet<&ResourceRef> = previous.iter().collect();
        for (target, found) in targets.iter().zip(&found) {
            if known.contains(&target.reference()) {
                continue;
            }
            if let Some((other, other_uid)) =
                self.managed_by_other(target, found, mark.app_uid).await?
                && adopt_from != Some(other_uid.as_str())
            {
                return Err(ApplyError::Conflict {
                    object: target.reference().to_string(),
                    other,
                    other_uid,
                });
            }
        }
        let mut inventory: Vec<ResourceRef> = targets.iter().map(Target::reference).collect();
        inventory.sort();
        let mut writes = Vec::new();
        for ((target, found), kind) in targets.into_iter().zip(found).zip(kinds) {
            let body = stamp(target.manifest, target.namespace.as_deref(), mark);
            let why = match &found {
                Some(Some(live)) if self.left_as_applied(&target.reference(), live, &body) => {
                    continue;
                }
                Some(Some(live)) => match difference(&body, &live.value()) {
                    None => continue,
                    Some(path) => Change::Differs(path),
                },
                Some(None) => Change::Missing,
                None => Change::Unknown,
            };
            // Seeded, the write is dropped where it is planned: nothing is written, no drift
            // is seen, and the app is reported Synced all the same.
            if shardwise_runtime::failpoints::seeded(
                shardwise_runtime::failpoints::DROP_DESTINATION_WRITE,
            ) {
                continue;
            }
            writes.push(PendingWrite {
                target,
                body,
                why,
                kind,
            });
        }
        Ok(Plan { inventory, writes })
    }

    /// Server-side applies what `plan` found different; the namespace of each namespaced
    /// object is created first if this client has not seen it. Returns the objects as the
    /// server answered, for the health of what was just written.
    pub async fn write(&self, plan: Plan<'_>) -> Result<Written, ApplyError> {
        let mut written = BTreeMap::new();
        for PendingWrite {
            target, body, kind, ..
        } in plan.writes
        {
            let manifest = target.manifest;
            if let Some(ns) = &target.namespace {
                self.ensure_namespace(ns).await?;
            }
            let api = self.api(&target.resource, target.namespace.as_deref());
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let writing = kind
                .as_ref()
                .map(|k| k.writing(target.namespace.as_deref(), &manifest.name));
            let answer = api
                .patch(&manifest.name, &params, &Patch::Apply(&body))
                .await
                .map_err(|e| api_error(format!("{} {}", manifest.kind, manifest.name), e))?;
            if let Some(version) = answer.metadata.resource_version.clone() {
                if let Some(writing) = writing {
                    writing.wrote(version.clone());
                }
                lock(&self.applied).insert(target.reference(), (version, body_hash(&body)));
            }
            written.insert(target.reference(), Arc::new(answer));
        }
        Ok(Written(written))
    }

    /// The app's health: the worst of its objects', from what was just written or else the
    /// cache.
    pub async fn health(
        &self,
        inventory: &[ResourceRef],
        written: &Written,
        app_uid: &str,
    ) -> AppHealth {
        let mut worst: Option<(Health, String)> = None;
        for object in inventory {
            let (health, message) = match written.0.get(object) {
                Some(answer) => assessed(
                    object,
                    &serde_json::to_value(answer.as_ref()).unwrap_or_default(),
                ),
                None => self.assess_cached(object, app_uid).await,
            };
            if worst.as_ref().is_none_or(|(w, _)| health > *w) {
                worst = Some((health, message));
            }
        }
        match worst {
            Some((status, message)) if status != Health::Healthy => AppHealth {
                status,
                message: Some(message),
            },
            _ => AppHealth {
                status: Health::Healthy,
                message: None,
            },
        }
    }

    async fn assess_cached(&self, object: &ResourceRef, app_uid: &str) -> (Health, String) {
        let resource = match self.resource(&Manifest::reference(object)).await {
            Ok((resource, _)) => resource,
            Err(e) => return (Health::Unknown, format!("{object}: {e}")),
        };
        let Some(kind) = self.live_kind(&resource, app_uid).await else {
            return (
                Health::Unknown,
                format!("{object}: its kind cannot be listed"),
            );
        };
        match kind.get(object.namespace.as_deref(), &object.name) {
            Some(live) => assessed(object, &live.value()),
            None => (Health::Missing, format!("{object} does not exist")),
        }
    }

    /// Deletes objects the app applied before and no longer declares; only those that still
    /// carry the app's UID label, so that nothing the app does not own is ever deleted.
    pub async fn prune(&self, stale: &[ResourceRef], app_uid: &str) -> Result<usize, ApplyError> {
        let mut deleted = 0;
        for object in stale {
            lock(&self.applied).remove(object);
            let resource = match self.resource(&Manifest::reference(object)).await {
                Ok((resource, _)) => resource,
                // The kind is gone from the cluster, and its objects with it.
                Err(ApplyError::UnknownKind { .. }) => continue,
                Err(e) => return Err(e),
            };
            let api = self.api(&resource, object.namespace.as_deref());
            let target = object.to_string();
            let found = self
                .live_kind(&resource, app_uid)
                .await
                .map(|k| k.get(object.namespace.as_deref(), &object.name));
            let Some(live) = self
                .live_object(&api, &found, &object.name, target.clone())
                .await?
            else {
                continue;
            };
            if live.app_uid.as_deref() != Some(app_uid) {
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
