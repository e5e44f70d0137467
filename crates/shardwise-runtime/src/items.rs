//! A term's caches of items: one per unit it holds records of, each filled by a watch of the
//! items labelled with that unit's token ([`shardwise_handoff::keys::UNIT_LABEL`]), which no move
//! rewrites; and one of the items labelled with this shard, which the planner writes only on
//! items whose unit does not exist (their owner reports that).
//!
//! A unit's cache keeps only the items whose keys fall in the ranges the term held of the unit
//! when its watch started; a range not covered by them starts the watch again (a LIST of the
//! unit's items), a range given up leaves the cache as it is until the unit goes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_runtime::reflector::Store;
use shard_assign::KeyRange;
use shardwise_handoff::plan::ObjectKey;
use tokio_util::task::AbortOnDropHandle;

use crate::objects::{Object, item_key, key_of, reference};

/// The items of one unit, and the watch that keeps them.
struct UnitItems<I: Object> {
    /// The ranges of the unit's keys the cache holds.
    ranges: Vec<KeyRange>,
    store: Store<I>,
    _watch: AbortOnDropHandle<()>,
}

/// The term's item caches.
pub(crate) struct ItemStores<I: Object> {
    units: Mutex<BTreeMap<ObjectKey, UnitItems<I>>>,
    /// Items labelled with this shard: those of units that do not exist.
    orphans: Store<I>,
    /// The unit of an item: the controller's [`crate::Sharded::unit_of`].
    unit_of: fn(&I) -> ObjectKey,
}

/// Whether a cache of `held` ranges has every key of `wanted`.
pub(crate) fn covers(held: &[KeyRange], wanted: &[KeyRange]) -> bool {
    wanted.iter().all(|w| held.iter().any(|&h| w.within(h)))
}

impl<I: Object> ItemStores<I> {
    pub(crate) fn new(orphans: Store<I>, unit_of: fn(&I) -> ObjectKey) -> Self {
        Self {
            units: Mutex::new(BTreeMap::new()),
            orphans,
            unit_of,
        }
    }

    fn units(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, UnitItems<I>>> {
        self.units.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the cache of `unit` must (re)start to hold `ranges`: there is none, or it
    /// misses keys of them.
    pub(crate) fn needs_watch(&self, unit: &ObjectKey, ranges: &[KeyRange]) -> bool {
        self.units()
            .get(unit)
            .is_none_or(|held| !covers(&held.ranges, ranges))
    }

    /// Keeps `store`, filled by `watch`, as the cache of `unit`'s items in `ranges`; the
    /// cache it replaces stops.
    pub(crate) fn insert(
        &self,
        unit: ObjectKey,
        ranges: Vec<KeyRange>,
        store: Store<I>,
        watch: AbortOnDropHandle<()>,
    ) {
        self.units().insert(
            unit,
            UnitItems {
                ranges,
                store,
                _watch: watch,
            },
        );
    }

    /// Drops the cache of `unit`, and stops its watch.
    pub(crate) fn remove(&self, unit: &ObjectKey) {
        let removed = self.units().remove(unit);
        drop(removed);
    }

    /// Drops every cache of a unit (the end of the term).
    pub(crate) fn clear(&self) {
        let removed = std::mem::take(&mut *self.units());
        drop(removed);
    }

    /// The ranges of `unit` its cache holds, if it has one.
    #[cfg(test)]
    pub(crate) fn ranges(&self, unit: &ObjectKey) -> Option<Vec<KeyRange>> {
        self.units().get(unit).map(|u| u.ranges.clone())
    }

    fn stores(&self) -> Vec<Store<I>> {
        self.units().values().map(|u| u.store.clone()).collect()
    }

    /// The item `key`: from the cache of a unit, or of those of units that do not exist.
    pub(crate) fn get(&self, key: &ObjectKey) -> Option<Arc<I>> {
        let reference = reference::<I>(key);
        self.stores()
            .iter()
            .find_map(|store| store.get(&reference))
            .or_else(|| self.orphans.get(&reference))
    }

    /// The cached items of `unit` (in its own cache, or labelled with this shard) that
    /// `select` chooses.
    pub(crate) fn of_unit(&self, unit: &ObjectKey, select: impl Fn(&I) -> bool) -> Vec<Arc<I>> {
        let own = self
            .units()
            .get(unit)
            .map(|u| u.store.clone())
            .map(|store| store.state_filter(|i| &(self.unit_of)(i) == unit && select(i)))
            .unwrap_or_default();
        let known: std::collections::BTreeSet<ObjectKey> =
            own.iter().map(|i| key_of(i.as_ref())).collect();
        let orphans = self.orphans.state_filter(|i| {
            &(self.unit_of)(i) == unit && select(i) && !known.contains(&key_of(i))
        });
        own.into_iter().chain(orphans).collect()
    }

    /// The cached items of `unit` with keys in `range`.
    pub(crate) fn in_range(&self, unit: &ObjectKey, range: KeyRange) -> Vec<Arc<I>> {
        self.of_unit(unit, |i| range.contains(item_key(i)))
    }

    /// Every cached item `select` chooses (an item in two caches, twice).
    pub(crate) fn filter(&self, select: impl Fn(&I) -> bool) -> Vec<Arc<I>> {
        let mut items: Vec<Arc<I>> = self
            .stores()
            .iter()
            .flat_map(|store| store.state_filter(&select))
            .collect();
        items.extend(self.orphans.state_filter(&select));
        items
    }

    /// The items in the caches of units.
    pub(crate) fn unit_items(&self) -> Vec<Arc<I>> {
        self.stores().iter().flat_map(Store::state).collect()
    }

    /// How many items the caches of units hold.
    pub(crate) fn len(&self) -> usize {
        self.stores().iter().map(Store::len).sum()
    }

    /// Waits until the cache of items labelled with this shard, and every cache of a unit
    /// there is now, has listed once. False if one of their watches stopped first.
    pub(crate) async fn wait_until_ready(&self) -> bool {
        if self.orphans.wait_until_ready().await.is_err() {
            return false;
        }
        for store in self.stores() {
            if store.wait_until_ready().await.is_err() {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_runtime::reflector;
    use kube_runtime::watcher::Event;

    use super::*;

    fn halves() -> (KeyRange, KeyRange) {
        KeyRange::WHOLE.halves().unwrap()
    }

    #[test]
    fn a_cache_covers_the_ranges_within_those_it_holds() {
        let (low, high) = halves();
        let (low_low, _) = low.halves().unwrap();
        assert!(covers(&[KeyRange::WHOLE], &[low, high]));
        assert!(covers(&[low], &[low_low]));
        assert!(covers(&[low, high], &[low, high]));
        assert!(!covers(&[low], &[high]));
        // Both halves hold every key, but a whole range is not within either: a merge
        // starts the watch again (rare; what it costs is one LIST of the unit's items).
        assert!(!covers(&[low, high], &[KeyRange::WHOLE]));
        assert!(covers(&[low], &[]));
    }

    fn config_map(name: &str, unit: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("fleet".into());
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.labels = Some([("unit".to_string(), unit.to_string())].into());
        c
    }

    fn unit_of(c: &ConfigMap) -> ObjectKey {
        ObjectKey::new("fleet", c.metadata.labels.as_ref().unwrap()["unit"].clone())
    }

    fn filled(items: &[ConfigMap]) -> Store<ConfigMap> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for item in items {
            writer.apply_watcher_event(&Event::InitApply(item.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    fn names(items: &[Arc<ConfigMap>]) -> Vec<String> {
        let mut names: Vec<String> = items
            .iter()
            .map(|i| i.metadata.name.clone().unwrap())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn items_are_found_in_their_units_cache_or_among_those_of_missing_units() {
        let orphans = filled(&[config_map("lost", "gone")]);
        let stores = ItemStores::new(orphans, unit_of);
        let idle = || AbortOnDropHandle::new(tokio::spawn(async {}));
        stores.insert(
            ObjectKey::new("fleet", "a"),
            vec![KeyRange::WHOLE],
            filled(&[config_map("a-1", "a"), config_map("a-2", "a")]),
            idle(),
        );
        stores.insert(
            ObjectKey::new("fleet", "b"),
            vec![KeyRange::WHOLE],
            filled(&[config_map("b-1", "b")]),
            idle(),
        );
        assert!(stores.get(&ObjectKey::new("fleet", "b-1")).is_some());
        assert!(stores.get(&ObjectKey::new("fleet", "lost")).is_some());
        assert!(stores.get(&ObjectKey::new("fleet", "nowhere")).is_none());
        let a = ObjectKey::new("fleet", "a");
        assert_eq!(names(&stores.of_unit(&a, |_| true)), ["a-1", "a-2"]);
        assert_eq!(
            names(&stores.of_unit(&ObjectKey::new("fleet", "gone"), |_| true)),
            ["lost"]
        );
        assert_eq!(stores.len(), 3, "the caches of units, not the orphans");
        assert_eq!(names(&stores.filter(|_| true)).len(), 4);
        // Which half each item of "a" falls in decides what in_range gives.
        let (low, high) = halves();
        let in_low = stores.in_range(&a, low).len();
        let in_high = stores.in_range(&a, high).len();
        assert_eq!(in_low + in_high, 2);
        assert!(!stores.needs_watch(&a, &[KeyRange::WHOLE]));
        assert!(stores.needs_watch(&ObjectKey::new("fleet", "c"), &[low]));
        assert!(stores.wait_until_ready().await);
        stores.remove(&a);
        assert!(stores.get(&ObjectKey::new("fleet", "a-1")).is_none());
        assert_eq!(stores.ranges(&a), None);
        stores.clear();
        assert_eq!(stores.len(), 0);
        assert!(stores.get(&ObjectKey::new("fleet", "lost")).is_some());
    }

    #[tokio::test]
    async fn dropping_a_units_cache_stops_its_watch() {
        let stores = ItemStores::new(filled(&[]), unit_of);
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let watch = AbortOnDropHandle::new(tokio::spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        }));
        let a = ObjectKey::new("fleet", "a");
        stores.insert(a.clone(), vec![KeyRange::WHOLE], filled(&[]), watch);
        assert!(rx.try_recv().is_err(), "still running");
        stores.remove(&a);
        // The task was aborted: its end of the channel is dropped.
        assert!(rx.await.is_err());
    }
}
