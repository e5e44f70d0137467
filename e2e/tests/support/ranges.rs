//! The placement of a kind sharded by ranges of its objects' UIDs
//! (`shardwise_runtime::kind::Placement::UidRanges`), read as the owners' gates read it: each
//! record is the StatefulSet's own (the whole key space, before the first cut) or a UnitSlice's,
//! and an object falls under the deepest record whose range holds its key.

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::api::ListParams;
use shard_assign::{KeyRange, app_key};
use shardwise_handoff::keys::{DRAIN_TO_ANNOTATION, HOLDER_ANNOTATION, STATEFULSET_LABEL};
use shardwise_runtime::slice::UnitSlice;

/// One placement record of the StatefulSet's objects.
#[derive(Clone, Debug)]
pub struct RangeRecord {
    pub range: KeyRange,
    /// The shard it names.
    pub shard: Option<u32>,
    /// The lease identity of the term that holds it.
    pub holder: Option<String>,
    /// A handoff is under way.
    pub draining: bool,
}

impl RangeRecord {
    fn of(
        range: KeyRange,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Self {
        let annotations = meta.annotations.clone().unwrap_or_default();
        Self {
            range,
            shard: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(shardwise_handoff::keys::SHARD_LABEL))
                .and_then(|s| s.parse().ok()),
            holder: annotations.get(HOLDER_ANNOTATION).cloned(),
            draining: annotations.contains_key(DRAIN_TO_ANNOTATION),
        }
    }
}

/// Every record of StatefulSet `statefulset` of `namespace`.
pub async fn records(
    client: &kube::Client,
    namespace: &str,
    statefulset: &str,
) -> Result<Vec<RangeRecord>, kube::Error> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let set = sets.get_metadata(statefulset).await?;
    let mut records = vec![RangeRecord::of(KeyRange::WHOLE, &set.metadata)];
    let slices: Api<UnitSlice> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(&format!("{STATEFULSET_LABEL}={statefulset}"));
    for slice in slices.list(&params).await? {
        if let Some(range) = slice.spec.key_range() {
            records.push(RangeRecord::of(range, &slice.metadata));
        }
    }
    Ok(records)
}

/// The record the object with UID `uid` falls under: the deepest that names a shard and whose
/// range holds its key.
pub fn record_of<'a>(records: &'a [RangeRecord], uid: &str) -> Option<&'a RangeRecord> {
    let key = app_key(uid);
    records
        .iter()
        .filter(|r| r.shard.is_some() && r.range.contains(key))
        .max_by_key(|r| r.range.depth())
}
