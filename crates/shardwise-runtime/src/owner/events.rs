//! What the owner does with watch events: unit and slice records go to the gate, new or
//! changed items to the item queue.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use futures::StreamExt;
use kube_runtime::watcher;
use shard_assign::KeyRange;
use shardwise_handoff::plan::ObjectKey;
use tracing::{info, warn};

use super::Owner;
use super::items::{ItemSeen, WatchedUnits};
use crate::decode::{for_each_event, for_each_event_until};
use crate::objects::{Revision, key_of, record_of};
use crate::sharded::Sharded;
use crate::slice::UnitSlice;

/// Queues again the noted keys that the cache now has, once it has caught up with a list;
/// returns the others.
fn requeue_found(
    missed: BTreeSet<ObjectKey>,
    found: impl Fn(&ObjectKey) -> bool,
    queue: impl Fn(ObjectKey),
) -> BTreeSet<ObjectKey> {
    let mut unfound = BTreeSet::new();
    for key in missed {
        if found(&key) {
            queue(key);
        } else {
            unfound.insert(key);
        }
    }
    unfound
}

/// Applies the records of units labelled with this shard (their whole records) to the gate.
pub(super) async fn follow_units<C: Sharded>(
    owner: Arc<Owner<C>>,
    events: impl futures::Stream<Item = Result<watcher::Event<C::Unit>, watcher::Error>>,
) {
    let term = &owner.term;
    let mut revisions: BTreeMap<ObjectKey, Revision> = BTreeMap::new();
    let mut listed: BTreeSet<ObjectKey> = BTreeSet::new();
    // Work a list lets start, queued when it ends (see [`follow_items`]); kept over a list
    // that fails part way, whose revisions are already noted.
    let mut after_list: BTreeSet<ObjectKey> = BTreeSet::new();
    for_each_event(events, C::NOUNS.units, |event| match event {
        watcher::Event::Apply(unit) => {
            let key = key_of(&unit);
            let revision = Revision::of(&unit);
            let changed = revisions.insert(key.clone(), revision.clone()) != Some(revision);
            owner.observe(&key, KeyRange::WHOLE, Some(&record_of(&unit)), changed);
        }
        watcher::Event::InitApply(unit) => {
            let key = key_of(&unit);
            let revision = Revision::of(&unit);
            let changed = revisions.insert(key.clone(), revision.clone()) != Some(revision);
            listed.insert(key.clone());
            if owner.observe_only(&key, KeyRange::WHOLE, Some(&record_of(&unit)), changed) {
                after_list.insert(key);
            }
        }
        watcher::Event::Delete(unit) => {
            let key = key_of(&unit);
            revisions.remove(&key);
            // Taken before the record goes, and the unit's cache of items with it.
            let items = term.items_of(&key);
            owner.observe(&key, KeyRange::WHOLE, None, false);
            // Still labelled with this shard: deleted, not moved away. Its items learn it now,
            // not at their next resync (once the planner has labelled them with this shard or
            // another, as items of a unit that does not exist).
            if record_of(&unit).owner == Some(term.shard()) {
                for item in items {
                    term.item_queue.add_in(key_of(item.as_ref()), key.clone());
                }
            }
        }
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitDone => {
            // Units that left while the watch was down are not in the new list.
            for key in term.gate.units() {
                if !listed.contains(&key) && term.gate.ranges(&key).contains(&KeyRange::WHOLE) {
                    revisions.remove(&key);
                    owner.observe(&key, KeyRange::WHOLE, None, false);
                }
            }
            for key in std::mem::take(&mut after_list) {
                owner.queue_work(&key, KeyRange::WHOLE);
            }
            // The cache has caught up with the list: units a worker missed go round again.
            requeue_found(
                term.missing_units.take(),
                |k| term.unit(k).is_some(),
                |key| term.unit_queue.add(key),
            );
        }
    })
    .await;
}

/// Cut units are in every replica's cache (the records of their slices say who works on
/// them); a change of a cut unit's spec queues what this shard holds of it, and its deletion
/// its items, which learn it now rather than at their next resync.
pub(super) async fn follow_cut_units<C: Sharded>(
    owner: Arc<Owner<C>>,
    events: impl futures::Stream<Item = Result<watcher::Event<C::Unit>, watcher::Error>>,
) {
    let term = &owner.term;
    let mut revisions: BTreeMap<ObjectKey, Revision> = BTreeMap::new();
    let queue_all = |key: &ObjectKey| {
        if term.reports_on(key) {
            term.unit_queue.add(key.clone());
        }
        for item in term.items_of(key) {
            term.item_queue.add_in(key_of(item.as_ref()), key.clone());
        }
    };
    // Changed during a list: queued when it ends (see [`follow_items`]).
    let mut after_list: BTreeSet<ObjectKey> = BTreeSet::new();
    for_each_event(events, C::NOUNS.units, |event| match event {
        watcher::Event::Apply(unit) => {
            let key = key_of(&unit);
            let revision = Revision::of(&unit);
            let changed = revisions.insert(key.clone(), revision.clone()) != Some(revision);
            if changed && term.knows(&key) {
                queue_all(&key);
            }
        }
        watcher::Event::InitApply(unit) => {
            let key = key_of(&unit);
            let revision = Revision::of(&unit);
            if revisions.insert(key.clone(), revision.clone()) != Some(revision) {
                after_list.insert(key);
            }
        }
        watcher::Event::Delete(unit) => {
            let key = key_of(&unit);
            revisions.remove(&key);
            if term.knows(&key) {
                queue_all(&key);
            }
        }
        watcher::Event::Init => {}
        watcher::Event::InitDone => {
            for key in std::mem::take(&mut after_list) {
                if term.knows(&key) {
                    queue_all(&key);
                }
            }
        }
    })
    .await;
}

/// Applies the records of this shard's UnitSlices to the gate. Without their CRD there are
/// none, and nothing is cut.
pub(super) async fn follow_slices<C: Sharded>(
    owner: Arc<Owner<C>>,
    events: impl futures::Stream<Item = Result<watcher::Event<UnitSlice>, watcher::Error>>,
) {
    let mut listed: BTreeSet<(ObjectKey, KeyRange)> = BTreeSet::new();
    let mut events = std::pin::pin!(events);
    let slice_of = |slice: &UnitSlice| Some((slice.spec.unit_key(), slice.spec.key_range()?));
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) => {
                let Some((unit, range)) = slice_of(&slice) else {
                    continue;
                };
                let record = record_of(&slice);
                listed.insert((unit.clone(), range));
                owner.remember_slice(&unit, range, Some(record));
                owner.observe(&unit, range, Some(&record), false);
            }
            Ok(watcher::Event::Delete(slice)) => {
                let Some((unit, range)) = slice_of(&slice) else {
                    continue;
                };
                owner.remember_slice(&unit, range, None);
                owner.observe(&unit, range, None, false);
            }
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitDone) => {
                // Slices that left while the watch was down are not in the new list.
                for (unit, range) in owner.remembered_slices() {
                    if !listed.contains(&(unit.clone(), range)) {
                        owner.remember_slice(&unit, range, None);
                        owner.observe(&unit, range, None, false);
                    }
                }
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.code == 404 || status.code == 403 =>
            {
                info!(
                    code = status.code,
                    "UnitSlices cannot be listed (not installed, or not granted): no unit is cut"
                );
                return;
            }
            Err(e) => warn!(what = "unitslices", error = %e, "watch failed; retrying"),
        }
    }
}

/// Queues items that are new to this shard or whose spec changed (not status writes).
/// `batch`: the id and units of a watch of units' items; `None` for the watch of items of
/// missing units.
pub(super) async fn follow_items<C: Sharded>(
    owner: Arc<Owner<C>>,
    events: impl futures::Stream<Item = Result<watcher::Event<C::Item>, watcher::Error>>,
    batch: Option<(u64, WatchedUnits)>,
) {
    let term = &owner.term;
    // The items of the list under way, noted only when it ends: until then the cache still
    // holds the versions from before the list (kube's reflector swaps them in at its end), so
    // a worker queued earlier would reconcile a stale copy and the new revision, already
    // noted, would never be queued again. A list that fails part way notes nothing.
    let mut listed: BTreeMap<ObjectKey, (ObjectKey, Revision)> = BTreeMap::new();
    let queue_if_changed = |key: ObjectKey, unit: ObjectKey, revision: Revision| match term
        .items
        .note(key.clone(), unit.clone(), revision)
    {
        ItemSeen::Same => {}
        noted => {
            if noted == ItemSeen::New {
                owner.recount(unit.clone());
            }
            term.item_queue.add_in(key, unit);
        }
    };
    // Whether the watch's first list has ended: an Init after it means the watch lost its
    // place in the history and must list again.
    let mut has_listed = false;
    for_each_event_until(events, C::NOUNS.items, |event| match event {
        watcher::Event::Apply(item) => {
            queue_if_changed(key_of(&item), C::unit_of(&item), Revision::of(&item));
            ControlFlow::Continue(())
        }
        watcher::Event::InitApply(item) => {
            listed.insert(key_of(&item), (C::unit_of(&item), Revision::of(&item)));
            ControlFlow::Continue(())
        }
        watcher::Event::Delete(item) => {
            let key = key_of(&item);
            // Gone from this watch only when another cache still keeps it: an item of a
            // missing unit loses its shard label once the unit exists, and leaves the orphans'
            // watch for its unit's, which may have seen it first. Forgetting it then would drop
            // its queued reconcile, and its unit's watch has nothing new to queue it again.
            if term.item(&key).is_none() {
                term.items.forget(&key);
                term.item_queue.forget(&key);
            }
            owner.recount(C::unit_of(&item));
            ControlFlow::Continue(())
        }
        watcher::Event::Init => match &batch {
            Some((id, _)) if has_listed => {
                info!(
                    "a watch of {} must list again: one watch of every {} held replaces the term's",
                    C::NOUNS.items,
                    C::NOUNS.unit
                );
                term.items.relist_merged(*id);
                ControlFlow::Break(())
            }
            _ => {
                listed.clear();
                ControlFlow::Continue(())
            }
        },
        watcher::Event::InitDone => {
            has_listed = true;
            // Items that left while the watch was down are not in the new list: forget them,
            // so that they count as new if they come back.
            let held = batch.as_ref().map(|(_, held)| held);
            let listed = std::mem::take(&mut listed);
            for key in term.items.forget_unlisted(held, &listed) {
                term.item_queue.forget(&key);
            }
            // Before the items are read: the watches it replaces give its units up.
            if let Some((id, _)) = &batch {
                term.items.listed(*id);
            }
            for (key, (unit, revision)) in listed {
                queue_if_changed(key, unit, revision);
            }
            // The cache has caught up with the list: items a worker missed go round again.
            // Those still missing may be in a list another watch has not finished: they wait
            // for it (the misses are the term's, and that watch's end would find none).
            let unfound = requeue_found(
                term.missing_items.take(),
                |k| term.item(k).is_some(),
                |key| term.queue_item(key),
            );
            if term.items.listing() {
                term.missing_items.restore(unfound);
            }
            ControlFlow::Continue(())
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::queue::WorkQueue;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("shardwise", name)
    }

    #[test]
    fn a_kind_without_generations_changes_with_every_write() {
        use k8s_openapi::api::apps::v1::Deployment;
        use k8s_openapi::api::core::v1::ConfigMap;
        let mut config_map = ConfigMap::default();
        config_map.metadata.resource_version = Some("1".into());
        let before = Revision::of(&config_map);
        config_map.metadata.resource_version = Some("2".into());
        assert_ne!(Revision::of(&config_map), before);
        // With a generation, a write that leaves the spec alone (status, annotations) is no
        // change.
        let mut deployment = Deployment::default();
        deployment.metadata.generation = Some(3);
        deployment.metadata.resource_version = Some("1".into());
        let before = Revision::of(&deployment);
        deployment.metadata.resource_version = Some("2".into());
        assert_eq!(Revision::of(&deployment), before);
        // Deleted and made again under its name: a change, at the same generation.
        deployment.metadata.uid = Some("another".into());
        assert_ne!(Revision::of(&deployment), before);
    }

    #[tokio::test]
    async fn the_end_of_a_list_queues_again_only_what_the_cache_now_has() {
        let queue: WorkQueue<ObjectKey> = WorkQueue::new();
        let unfound = requeue_found(
            BTreeSet::from([key("listed"), key("gone")]),
            |k| k.name == "listed",
            |k| queue.add(k),
        );
        assert_eq!(unfound, BTreeSet::from([key("gone")]));
        assert_eq!(queue.depth(), 1);
        assert_eq!(queue.next().await, Some(key("listed")));
    }
}
