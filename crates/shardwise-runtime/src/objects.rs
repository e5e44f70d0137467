//! The runtime's view of Kubernetes objects: what a type needs to be a unit or an item, keys,
//! placement records, and APIs that read leniently.

use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::{Api, Client, Resource};
use kube_runtime::reflector::ObjectRef;
use kube_runtime::watcher;
use serde::de::DeserializeOwned;
use shard_assign::app_key;
use shardwise_handoff::drain::{Incarnation, UnitRecord};
use shardwise_handoff::keys::{
    DRAIN_TO_ANNOTATION, DRAINED_ANNOTATION, EPOCH_ANNOTATION, HOLDER_ANNOTATION, SHARD_LABEL,
    parse_shard,
};
use shardwise_handoff::plan::ObjectKey;

use crate::lenient::Lenient;
use crate::settings::WatchScope;

/// A Kubernetes object type the runtime can watch, cache and label: any kube-rs type with a
/// static type (`k8s-openapi` types, `#[derive(CustomResource)]` types).
pub trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The key of an object: namespace (empty when cluster-scoped) and name.
pub fn key_of<K: kube::Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

/// What marks a change of spec: the generation, or for kinds that keep none (ConfigMaps,
/// Namespaces) the resource version, so that every write counts; and the object's UID, so that
/// one deleted and made again under the same name is a change too, whatever its generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Revision {
    uid: Option<String>,
    spec: SpecMark,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum SpecMark {
    Generation(i64),
    Version(Option<String>),
}

impl Revision {
    pub(crate) fn of(object: &impl Resource) -> Self {
        let meta = object.meta();
        let spec = match meta.generation {
            Some(generation) => SpecMark::Generation(generation),
            None => SpecMark::Version(meta.resource_version.clone()),
        };
        Self {
            uid: meta.uid.clone(),
            spec,
        }
    }
}

/// The placement record of a unit, from its labels and annotations.
pub fn record_of<K: Resource>(unit: &K) -> UnitRecord {
    let meta = unit.meta();
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    UnitRecord {
        owner: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_LABEL))
            .and_then(|v| parse_shard(v)),
        holder: annotation(HOLDER_ANNOTATION).map(Incarnation::of_identity),
        epoch: annotation(EPOCH_ANNOTATION)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        drain_to: annotation(DRAIN_TO_ANNOTATION).and_then(parse_shard),
        drained_epoch: annotation(DRAINED_ANNOTATION).and_then(|v| v.parse().ok()),
    }
}

/// The API of `K` in `namespace`, or across the cluster when it is empty, read leniently.
pub(crate) fn api_in<K: Object>(client: &Client, namespace: &str) -> Api<Lenient<K>> {
    if namespace.is_empty() {
        Api::all_with(client.clone(), &())
    } else {
        Api::namespaced_with(client.clone(), namespace, &())
    }
}

/// The API of `K` over the watch scope, read leniently.
pub fn api_over<K: Object>(client: &Client, scope: &WatchScope) -> Api<Lenient<K>> {
    match scope {
        WatchScope::Namespace(namespace) => api_in(client, namespace),
        WatchScope::Cluster => api_in(client, ""),
    }
}

/// The API of `K`'s metadata over the watch scope: lists and watches return only metadata.
pub(crate) fn metadata_api_over<K: Object>(
    client: &Client,
    scope: &WatchScope,
) -> Api<PartialObjectMeta<Lenient<K>>> {
    match scope {
        WatchScope::Namespace(namespace) if !namespace.is_empty() => {
            Api::namespaced_with(client.clone(), namespace, &())
        }
        _ => Api::all_with(client.clone(), &()),
    }
}

/// The config of a watch of units or items, whose lists come in one response. Served from
/// kube-apiserver's watch cache, a list ignores its page limit anyway. Served from etcd (the
/// cache off, or not ready), every page must be read before etcd compacts the revision of the
/// first, and a label-selected page is read in several chunks at that revision: under
/// frequent compaction a slow paged list fails with 410 again and again, and each retry reads
/// the whole collection again. One unpaged read is a single revision and cannot expire.
pub(crate) fn unpaged(config: watcher::Config) -> watcher::Config {
    watcher::Config {
        page_size: None,
        ..config
    }
}

/// Applies a JSON merge patch to the status of the object `key` of kind `K`.
pub(crate) async fn merge_patch_status<K: Object>(
    client: &Client,
    key: &ObjectKey,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    api_in::<K>(client, &key.namespace)
        .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// Applies a JSON merge patch to the object `key` of kind `K`.
pub(crate) async fn merge_patch<K: Object>(
    client: &Client,
    key: &ObjectKey,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    api_in::<K>(client, &key.namespace)
        .patch(&key.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// The reference of the object `key` in a cache.
pub(crate) fn reference<K: kube::Resource<DynamicType = ()>>(key: &ObjectKey) -> ObjectRef<K> {
    let reference = ObjectRef::new(&key.name);
    if key.namespace.is_empty() {
        reference
    } else {
        reference.within(&key.namespace)
    }
}

/// The key of an item in its unit's key space: 64-bit FNV-1a of its UID.
pub(crate) fn item_key<I: Object>(item: &I) -> u64 {
    app_key(item.meta().uid.as_deref().unwrap_or_default())
}
