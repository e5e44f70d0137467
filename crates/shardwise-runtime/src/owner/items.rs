//! A term's caches of items. Items are found by their unit's token
//! ([`shardwise_handoff::keys::UNIT_LABEL`]), which no move rewrites, so a move costs no write
//! per item: the new owner starts watching the unit's token instead.
//!
//! Units that become active together (one pass of the planner, a drain's end) share one watch,
//! a set-based selector over their tokens; each watch keeps its own cache. A watch stops once
//! none of its units is held any more. When there are [`MAX_WATCHES`] already, the next one
//! selects every unit held instead, and replaces all the others once it has listed: a replica
//! keeps a handful of watches (connections, and LISTs to the control plane) whatever the
//! number of units it owns, and one LIST of all it owns per [`MAX_WATCHES`] changes.
//!
//! A unit's items enter a cache only if their keys fall in the ranges the term held of the unit
//! when the watch started; a range not covered by them watches the unit again. Items of units
//! that do not exist are labelled with this shard by the planner instead, and have a cache of
//! their own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_runtime::reflector::Store;
use shard_assign::KeyRange;
use shardwise_handoff::plan::ObjectKey;
use tokio::sync::Notify;
use tokio_util::task::AbortOnDropHandle;

use shardwise_handoff::keys::{UNIT_LABEL, unit_token};

use crate::objects::{Object, Revision, item_key, key_of, reference};

/// How many watches of units' items a term keeps before it merges them into one.
pub(crate) const MAX_WATCHES: usize = 6;

/// The units a watch serves, with the ranges of their keys it keeps; shared with the watch,
/// which drops the events of items of units no longer in it. An item belongs to the unit whose
/// token it carries: one whose spec names another unit since is still found, and its owner
/// clears the stale token.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchedUnits(Arc<Mutex<Units>>);

#[derive(Debug, Default)]
struct Units {
    ranges: BTreeMap<ObjectKey, Vec<KeyRange>>,
    by_token: BTreeMap<String, ObjectKey>,
}

/// The unit token an item carries.
pub(crate) fn token_of<I: Object>(item: &I) -> Option<&str> {
    item.meta()
        .labels
        .as_ref()
        .and_then(|labels| labels.get(UNIT_LABEL))
        .map(String::as_str)
}

impl WatchedUnits {
    fn new(ranges: BTreeMap<ObjectKey, Vec<KeyRange>>) -> Self {
        let by_token = ranges
            .keys()
            .map(|u| (unit_token(&u.namespace, &u.name), u.clone()))
            .collect();
        Self(Arc::new(Mutex::new(Units { ranges, by_token })))
    }

    fn lock(&self) -> MutexGuard<'_, Units> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The unit the watch serves that `item`'s token names.
    fn unit_of<I: Object>(&self, item: &I) -> Option<ObjectKey> {
        let units = self.lock();
        let unit = units.by_token.get(token_of(item)?)?;
        units.ranges.contains_key(unit).then(|| unit.clone())
    }

    /// Whether the watch keeps `item`: its token names a unit it serves, and its key is in
    /// the ranges it keeps of that unit.
    pub(crate) fn keeps<I: Object>(&self, item: &I) -> bool {
        let units = self.lock();
        token_of(item)
            .and_then(|token| units.by_token.get(token))
            .and_then(|unit| units.ranges.get(unit))
            .is_some_and(|ranges| ranges.iter().any(|r| r.contains(item_key(item))))
    }

    /// Whether the watch serves `unit`.
    pub(crate) fn has(&self, unit: &ObjectKey) -> bool {
        self.lock().ranges.contains_key(unit)
    }

    fn ranges(&self, unit: &ObjectKey) -> Option<Vec<KeyRange>> {
        self.lock().ranges.get(unit).cloned()
    }

    fn units(&self) -> Vec<ObjectKey> {
        self.lock().ranges.keys().cloned().collect()
    }

    /// The tokens of the units it was made for, to select their items by.
    pub(crate) fn tokens(&self) -> Vec<String> {
        self.lock().by_token.keys().cloned().collect()
    }

    /// The ranges of every unit's keys it keeps.
    pub(crate) fn key_ranges(&self) -> Vec<KeyRange> {
        self.lock().ranges.values().flatten().copied().collect()
    }

    fn all(&self) -> BTreeMap<ObjectKey, Vec<KeyRange>> {
        self.lock().ranges.clone()
    }

    fn remove(&self, unit: &ObjectKey) {
        self.lock().ranges.remove(unit);
    }

    fn is_empty(&self) -> bool {
        self.lock().ranges.is_empty()
    }
}

/// Units to watch together, for [`ItemStores::insert`].
#[derive(Debug)]
pub(crate) struct Batch {
    id: u64,
    /// Every unit held (it replaces the other watches once listed), or only new ones.
    pub(crate) merges: bool,
    pub(crate) held: WatchedUnits,
}

impl Batch {
    /// Which batch it is, for [`ItemStores::listed`].
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The units to select.
    #[cfg(test)]
    fn units(&self) -> Vec<ObjectKey> {
        self.held.units()
    }
}

/// One watch of units' items, and its cache.
struct Watch<I: Object> {
    id: u64,
    /// Whether it serves every unit held when it started.
    merges: bool,
    /// Whether its first list has ended.
    listed: bool,
    held: WatchedUnits,
    store: Store<I>,
    _task: AbortOnDropHandle<()>,
}

/// Whether an item was seen before, at this revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ItemSeen {
    New,
    Changed,
    Same,
}

struct State<I: Object> {
    /// Oldest first: a unit in two watches is read from the older until the newer has listed.
    watches: Vec<Watch<I>>,
    /// Units that want a watch, with their ranges.
    pending: BTreeMap<ObjectKey, Vec<KeyRange>>,
    /// A watch lost its place: the next watch serves every unit held.
    merge_now: bool,
    next_id: u64,
    /// Each cached item's unit and the revision last queued, over every watch: a unit watched
    /// again (a merge, a wider range) does not queue its unchanged items again.
    seen: BTreeMap<ObjectKey, (ObjectKey, Revision)>,
}

/// The term's item caches.
pub(crate) struct ItemStores<I: Object> {
    state: Mutex<State<I>>,
    /// Items labelled with this shard: those of units that do not exist.
    orphans: Store<I>,
    /// The unit of an item: the controller's [`crate::Sharded::unit_of`].
    unit_of: fn(&I) -> ObjectKey,
    wanted: Notify,
}

/// The pending units of one kind: whole ones, or slices of cut ones; the others stay pending
/// for the next batch. One watch has one shard selector, ANDed with its label selector: with a
/// whole unit in it, it could ask the server for no range at all, and the slices' owner would
/// receive every item of their units (the server selects by range where it can).
fn take_alike(
    pending: &mut BTreeMap<ObjectKey, Vec<KeyRange>>,
    wanted: &Notify,
) -> BTreeMap<ObjectKey, Vec<KeyRange>> {
    let whole = |ranges: &Vec<KeyRange>| ranges.contains(&KeyRange::WHOLE);
    let Some(first_whole) = pending.values().next().map(whole) else {
        return BTreeMap::new();
    };
    let (alike, others): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(pending)
        .into_iter()
        .partition(|(_, ranges)| whole(ranges) == first_whole);
    if !others.is_empty() {
        *pending = others;
        wanted.notify_one();
    }
    alike
}

/// Whether a cache of `held` ranges has every key of `wanted`.
pub(crate) fn covers(held: &[KeyRange], wanted: &[KeyRange]) -> bool {
    wanted.iter().all(|w| held.iter().any(|&h| w.within(h)))
}

impl<I: Object> ItemStores<I> {
    pub(crate) fn new(orphans: Store<I>, unit_of: fn(&I) -> ObjectKey) -> Self {
        Self {
            state: Mutex::new(State {
                watches: Vec::new(),
                pending: BTreeMap::new(),
                merge_now: false,
                next_id: 0,
                seen: BTreeMap::new(),
            }),
            orphans,
            unit_of,
            wanted: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for `unit`'s items in `ranges` to be watched, unless a watch (or one about to
    /// start) has them.
    pub(crate) fn want(&self, unit: &ObjectKey, ranges: Vec<KeyRange>) {
        if ranges.is_empty() {
            return;
        }
        let mut state = self.state();
        let covered = state
            .pending
            .get(unit)
            .is_some_and(|held| covers(held, &ranges))
            || state.watches.iter().any(|w| {
                w.held
                    .ranges(unit)
                    .is_some_and(|held| covers(&held, &ranges))
            });
        if !covered {
            state.pending.insert(unit.clone(), ranges);
            self.wanted.notify_one();
        }
    }

    /// Waits until some unit wants a watch.
    pub(crate) async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// A watch that had listed must list again (its place in the history is gone): it stops,
    /// its cache still serving reads, and one watch of every unit held replaces all of them.
    /// Watches tend to lose their place together (a cut link, a compaction), and each list of a
    /// label-selected subset costs the server a scan of the whole collection: one list per
    /// replica, not one per watch.
    /// `id`: the watch that must list again. Nothing to do if a merge started after it, which
    /// serves its units and replaces it once listed.
    pub(crate) fn relist_merged(&self, id: u64) {
        let mut state = self.state();
        if !state.watches.iter().any(|w| w.id > id && w.merges) {
            state.merge_now = true;
            self.wanted.notify_one();
        }
    }

    /// The units that want a watch, to watch together; with every other unit held when the
    /// term has [`MAX_WATCHES`] already, or a watch must list again.
    pub(crate) fn take_batch(&self) -> Option<Batch> {
        let mut state = self.state();
        if state.pending.is_empty() && !state.merge_now {
            return None;
        }
        let merge_now = std::mem::take(&mut state.merge_now);
        let merges = merge_now || state.watches.len() >= MAX_WATCHES;
        let pending = if merges {
            std::mem::take(&mut state.pending)
        } else {
            take_alike(&mut state.pending, &self.wanted)
        };
        let units = if merges {
            let mut all = BTreeMap::new();
            for watch in &state.watches {
                all.extend(watch.held.all());
            }
            all.extend(pending);
            all
        } else {
            pending
        };
        if units.is_empty() {
            return None;
        }
        state.next_id += 1;
        Some(Batch {
            id: state.next_id,
            merges,
            held: WatchedUnits::new(units),
        })
    }

    /// Keeps `store`, filled by `task`'s watch of `batch`'s units.
    pub(crate) fn insert(&self, batch: Batch, store: Store<I>, task: AbortOnDropHandle<()>) {
        self.state().watches.push(Watch {
            id: batch.id,
            merges: batch.merges,
            listed: false,
            held: batch.held,
            store,
            _task: task,
        });
    }

    /// Once the watch of batch `id` has listed: older watches give its units up, and those
    /// left with none stop.
    pub(crate) fn listed(&self, id: u64) {
        let mut state = self.state();
        let Some(units) = state.watches.iter_mut().find(|w| w.id == id).map(|w| {
            w.listed = true;
            w.held.units()
        }) else {
            return;
        };
        for watch in state.watches.iter().filter(|w| w.id < id) {
            for unit in &units {
                watch.held.remove(unit);
            }
        }
        state.watches.retain(|w| w.id >= id || !w.held.is_empty());
    }

    /// Whether a watch has not ended its first list yet, or units wait for one.
    pub(crate) fn listing(&self) -> bool {
        let state = self.state();
        !state.pending.is_empty() || state.watches.iter().any(|w| !w.listed)
    }

    /// Drops `unit` from every watch (stopping those left with none) and forgets its items.
    pub(crate) fn remove(&self, unit: &ObjectKey) {
        let mut state = self.state();
        state.pending.remove(unit);
        for watch in &state.watches {
            watch.held.remove(unit);
        }
        let stopped: Vec<Watch<I>> = {
            let (kept, stopped) = std::mem::take(&mut state.watches)
                .into_iter()
                .partition(|w| !w.held.is_empty());
            state.watches = kept;
            stopped
        };
        state.seen.retain(|_, (of, _)| of != unit);
        drop(state);
        drop(stopped);
    }

    /// Drops every watch (the end of the term).
    pub(crate) fn clear(&self) {
        let mut state = self.state();
        let watches = std::mem::take(&mut state.watches);
        state.pending.clear();
        state.seen.clear();
        drop(state);
        drop(watches);
    }

    /// Notes the revision of the item `key` of `unit`: whether it is new to the term, changed,
    /// or the same.
    pub(crate) fn note(&self, key: ObjectKey, unit: ObjectKey, revision: Revision) -> ItemSeen {
        match self.state().seen.insert(key, (unit, revision.clone())) {
            None => ItemSeen::New,
            Some((_, seen)) if seen == revision => ItemSeen::Same,
            Some(_) => ItemSeen::Changed,
        }
    }

    /// The unit of the item `key`, as last noted.
    pub(crate) fn noted_unit(&self, key: &ObjectKey) -> Option<ObjectKey> {
        self.state().seen.get(key).map(|(unit, _)| unit.clone())
    }

    /// Forgets the item `key` (deleted), so that it counts as new if it comes back.
    pub(crate) fn forget(&self, key: &ObjectKey) {
        self.state().seen.remove(key);
    }

    /// After a watch's list: forgets the items it serves that the list did not have (they left
    /// while it was down), and returns them. `held`: the units of a watch of units; `None`: the
    /// watch of items of missing units, which serves those of units no watch holds.
    pub(crate) fn forget_unlisted(
        &self,
        held: Option<&WatchedUnits>,
        listed: &BTreeMap<ObjectKey, (ObjectKey, Revision)>,
    ) -> Vec<ObjectKey> {
        let mut state = self.state();
        let watched: BTreeSet<ObjectKey> = match held {
            Some(_) => BTreeSet::new(),
            None => state.watches.iter().flat_map(|w| w.held.units()).collect(),
        };
        let serves = |unit: &ObjectKey| match held {
            Some(held) => held.has(unit),
            None => !watched.contains(unit),
        };
        let mut gone = Vec::new();
        state.seen.retain(|key, (unit, _)| {
            let kept = listed.contains_key(key) || !serves(unit);
            if !kept {
                gone.push(key.clone());
            }
            kept
        });
        gone
    }

    /// The caches to read, oldest first, each with the units it serves that no older one
    /// does.
    fn readable(&self) -> Vec<(Store<I>, WatchedUnits, BTreeSet<ObjectKey>)> {
        let state = self.state();
        let mut claimed = BTreeSet::new();
        let mut caches = Vec::new();
        for watch in &state.watches {
            let units: BTreeSet<ObjectKey> = watch
                .held
                .units()
                .into_iter()
                .filter(|u| claimed.insert(u.clone()))
                .collect();
            if !units.is_empty() {
                caches.push((watch.store.clone(), watch.held.clone(), units));
            }
        }
        caches
    }

    /// The item `key`: from a cache of the unit its token names (the newer one may hold keys
    /// the older lacks while it lists), or of those of units that do not exist.
    pub(crate) fn get(&self, key: &ObjectKey) -> Option<Arc<I>> {
        let reference = reference::<I>(key);
        let caches: Vec<(Store<I>, WatchedUnits)> = self
            .state()
            .watches
            .iter()
            .map(|w| (w.store.clone(), w.held.clone()))
            .collect();
        caches
            .iter()
            .find_map(|(store, held)| store.get(&reference).filter(|i| held.keeps(i.as_ref())))
            .or_else(|| self.orphans.get(&reference))
    }

    /// The cached items of `unit` (in the cache serving it, or labelled with this shard) that
    /// `select` chooses.
    pub(crate) fn of_unit(&self, unit: &ObjectKey, select: impl Fn(&I) -> bool) -> Vec<Arc<I>> {
        let token = unit_token(&unit.namespace, &unit.name);
        let own = self
            .readable()
            .into_iter()
            .find(|(_, _, units)| units.contains(unit))
            .map(|(store, _, _)| {
                store.state_filter(|i| token_of(i) == Some(token.as_str()) && select(i))
            })
            .unwrap_or_default();
        let known: BTreeSet<ObjectKey> = own.iter().map(|i| key_of(i.as_ref())).collect();
        let orphans = self.orphans.state_filter(|i| {
            &(self.unit_of)(i) == unit && select(i) && !known.contains(&key_of(i))
        });
        own.into_iter().chain(orphans).collect()
    }

    /// The cached items of `unit` with keys in `range`.
    pub(crate) fn in_range(&self, unit: &ObjectKey, range: KeyRange) -> Vec<Arc<I>> {
        self.of_unit(unit, |i| range.contains(item_key(i)))
    }

    /// The items in the caches of units that `select` chooses, each once.
    fn served(&self, select: impl Fn(&I) -> bool) -> Vec<Arc<I>> {
        self.readable()
            .iter()
            .flat_map(|(store, held, units)| {
                store.state_filter(|i| {
                    held.unit_of(i).is_some_and(|u| units.contains(&u)) && select(i)
                })
            })
            .collect()
    }

    /// Every cached item `select` chooses (one of a unit that does not exist and also in a
    /// unit's cache, twice).
    pub(crate) fn filter(&self, select: impl Fn(&I) -> bool) -> Vec<Arc<I>> {
        let mut items = self.served(&select);
        items.extend(self.orphans.state_filter(&select));
        items
    }

    /// The items in the caches of units.
    pub(crate) fn unit_items(&self) -> Vec<Arc<I>> {
        self.served(|_| true)
    }

    /// How many items the caches of units hold for the units they serve.
    pub(crate) fn len(&self) -> usize {
        self.unit_items().len()
    }

    /// Waits until the cache of items labelled with this shard, and every cache of units
    /// there is now, has listed once. False if one of their watches stopped first.
    pub(crate) async fn wait_until_ready(&self) -> bool {
        if self.orphans.wait_until_ready().await.is_err() {
            return false;
        }
        let stores: Vec<Store<I>> = self
            .state()
            .watches
            .iter()
            .map(|w| w.store.clone())
            .collect();
        for store in stores {
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
        // watches the unit again (rare; what it costs is one LIST of the unit's items).
        assert!(!covers(&[low, high], &[KeyRange::WHOLE]));
        assert!(covers(&[low], &[]));
    }

    fn config_map(name: &str, unit: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("fleet".into());
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.resource_version = Some("1".into());
        c.metadata.labels = Some(
            [
                ("unit".to_string(), unit.to_string()),
                (UNIT_LABEL.to_string(), unit_token("fleet", unit)),
            ]
            .into(),
        );
        c
    }

    fn unit_of(c: &ConfigMap) -> ObjectKey {
        ObjectKey::new("fleet", c.metadata.labels.as_ref().unwrap()["unit"].clone())
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("fleet", name)
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

    fn idle() -> AbortOnDropHandle<()> {
        AbortOnDropHandle::new(tokio::spawn(async {}))
    }

    /// Watches what is wanted now, its cache filled with `items`.
    fn watch(stores: &ItemStores<ConfigMap>, items: &[ConfigMap]) {
        let batch = stores.take_batch().expect("units wanted");
        stores.insert(batch, filled(items), idle());
    }

    #[tokio::test]
    async fn items_are_found_in_their_units_cache_or_among_those_of_missing_units() {
        let stores = ItemStores::new(filled(&[config_map("lost", "gone")]), unit_of);
        stores.want(&key("a"), vec![KeyRange::WHOLE]);
        stores.want(&key("b"), vec![KeyRange::WHOLE]);
        let batch = stores.take_batch().unwrap();
        assert_eq!(batch.units(), [key("a"), key("b")], "one watch for both");
        let mut tokens = vec![unit_token("fleet", "a"), unit_token("fleet", "b")];
        tokens.sort();
        assert_eq!(batch.held.tokens(), tokens, "what the watch selects by");
        assert!(!batch.merges);
        stores.insert(
            batch,
            filled(&[
                config_map("a-1", "a"),
                config_map("a-2", "a"),
                config_map("b-1", "b"),
            ]),
            idle(),
        );
        assert!(stores.take_batch().is_none(), "nothing else wanted");
        assert!(stores.get(&key("b-1")).is_some());
        assert!(stores.get(&key("lost")).is_some());
        assert!(stores.get(&key("nowhere")).is_none());
        assert_eq!(names(&stores.of_unit(&key("a"), |_| true)), ["a-1", "a-2"]);
        assert_eq!(names(&stores.of_unit(&key("gone"), |_| true)), ["lost"]);
        assert_eq!(stores.len(), 3, "the caches of units, not the orphans");
        assert_eq!(names(&stores.filter(|_| true)).len(), 4);
        // Which half each item of "a" falls in decides what in_range gives.
        let (low, high) = halves();
        let in_low = stores.in_range(&key("a"), low).len();
        let in_high = stores.in_range(&key("a"), high).len();
        assert_eq!(in_low + in_high, 2);
        // Covered already: no new watch.
        stores.want(&key("a"), vec![low]);
        assert!(stores.take_batch().is_none());
        assert!(stores.wait_until_ready().await);
        // "a" leaves: its items are gone from reads, though its watch goes on for "b".
        stores.remove(&key("a"));
        assert!(stores.get(&key("a-1")).is_none());
        assert_eq!(stores.len(), 1);
        stores.clear();
        assert_eq!(stores.len(), 0);
        assert!(stores.get(&key("lost")).is_some());
    }

    #[test]
    fn whole_units_and_slices_of_cut_ones_are_watched_apart() {
        let stores = ItemStores::<ConfigMap>::new(filled(&[]), unit_of);
        let (low, _) = halves();
        stores.want(&key("a"), vec![KeyRange::WHOLE]);
        stores.want(&key("hot"), vec![low]);
        stores.want(&key("b"), vec![KeyRange::WHOLE]);
        let first = stores.take_batch().unwrap();
        assert_eq!(first.units(), [key("a"), key("b")]);
        let second = stores
            .take_batch()
            .expect("the slice, in a watch of its own");
        assert_eq!(second.units(), [key("hot")]);
        assert_eq!(second.held.key_ranges(), [low], "a range to select by");
        assert!(stores.take_batch().is_none());
    }

    #[tokio::test]
    async fn a_watch_that_must_list_again_is_replaced_by_one_of_every_unit() {
        let stores = ItemStores::new(filled(&[]), unit_of);
        let (low, high) = halves();
        stores.want(&key("a"), vec![low]);
        watch(&stores, &[config_map("a-1", "a")]);
        stores.want(&key("b"), vec![KeyRange::WHOLE]);
        watch(&stores, &[config_map("b-1", "b")]);
        let first = stores.state().watches[0].id;
        stores.listed(first);
        assert!(stores.take_batch().is_none(), "nothing wanted");
        stores.relist_merged(first);
        let merge = stores.take_batch().expect("a merge");
        assert!(merge.merges);
        assert_eq!(merge.units(), [key("a"), key("b")]);
        assert_eq!(
            merge.held.ranges(&key("a")),
            Some(vec![low]),
            "the ranges held"
        );
        let merge_id = merge.id();
        stores.insert(merge, filled(&[]), idle());
        // The others lose their place too, before the merge has listed: it serves them.
        stores.relist_merged(first + 1);
        assert!(stores.take_batch().is_none(), "one merge is enough");
        // Until it has listed, the old caches serve reads; then it alone remains.
        assert!(stores.get(&key("b-1")).is_some());
        stores.listed(merge_id);
        let ids: Vec<u64> = stores.state().watches.iter().map(|w| w.id).collect();
        assert_eq!(ids, [merge_id]);
        // A watch that loses its place with no merge after it gets one, even with nothing
        // new wanted; a unit wanted meanwhile joins it.
        stores.want(&key("c"), vec![high]);
        stores.relist_merged(merge_id);
        let again = stores.take_batch().expect("a merge");
        assert_eq!(again.units(), [key("a"), key("b"), key("c")]);
    }

    #[tokio::test]
    async fn a_watch_stops_once_none_of_its_units_is_held() {
        let stores = ItemStores::new(filled(&[]), unit_of);
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        }));
        stores.want(&key("a"), vec![KeyRange::WHOLE]);
        stores.want(&key("b"), vec![KeyRange::WHOLE]);
        let batch = stores.take_batch().unwrap();
        stores.insert(batch, filled(&[]), task);
        stores.remove(&key("a"));
        assert!(rx.try_recv().is_err(), "still running for b");
        stores.remove(&key("b"));
        // The task was aborted: its end of the channel is dropped.
        assert!(rx.await.is_err());
    }

    #[tokio::test]
    async fn past_the_limit_one_watch_of_every_unit_replaces_the_others_once_listed() {
        let stores = ItemStores::new(filled(&[]), unit_of);
        for i in 0..MAX_WATCHES {
            let unit = format!("u{i}");
            stores.want(&key(&unit), vec![KeyRange::WHOLE]);
            watch(&stores, &[config_map(&format!("{unit}-item"), &unit)]);
        }
        assert_eq!(stores.len(), MAX_WATCHES);
        stores.want(&key("new"), vec![KeyRange::WHOLE]);
        let batch = stores.take_batch().unwrap();
        assert!(batch.merges);
        let mut expected: Vec<ObjectKey> =
            (0..MAX_WATCHES).map(|i| key(&format!("u{i}"))).collect();
        expected.push(key("new"));
        expected.sort();
        assert_eq!(batch.units(), expected, "every unit held, and the new one");
        let id = batch.id();
        let mut all: Vec<ConfigMap> = (0..MAX_WATCHES)
            .map(|i| config_map(&format!("u{i}-item"), &format!("u{i}")))
            .collect();
        all.push(config_map("new-item", "new"));
        stores.insert(batch, filled(&all), idle());
        assert!(stores.listing(), "misses wait for its list");
        // Listing: the old caches still serve their units, each item once.
        assert_eq!(stores.len(), MAX_WATCHES + 1);
        // A unit leaves meanwhile: gone from the new watch too.
        stores.remove(&key("u0"));
        assert_eq!(stores.state().watches.len(), MAX_WATCHES);
        stores.listed(id);
        assert!(!stores.listing());
        assert_eq!(stores.state().watches.len(), 1, "the older watches stopped");
        assert_eq!(stores.len(), MAX_WATCHES);
        assert!(stores.get(&key("u3-item")).is_some());
        assert!(stores.get(&key("u0-item")).is_none());
    }

    #[tokio::test]
    async fn a_unit_watched_again_keeps_its_items_revisions() {
        let stores = ItemStores::new(filled(&[]), unit_of);
        let item = config_map("a-1", "a");
        let note = |item: &ConfigMap| stores.note(key_of(item), unit_of(item), Revision::of(item));
        assert_eq!(note(&item), ItemSeen::New);
        assert_eq!(note(&item), ItemSeen::Same, "seen by a second watch");
        let mut changed = item.clone();
        changed.metadata.resource_version = Some("2".into());
        assert_eq!(note(&changed), ItemSeen::Changed);
        // A watch of "a" lists without the item: it left while the watch was down.
        stores.want(&key("a"), vec![KeyRange::WHOLE]);
        let batch = stores.take_batch().unwrap();
        let held = batch.held.clone();
        stores.insert(batch, filled(&[]), idle());
        assert_eq!(
            stores.forget_unlisted(Some(&held), &BTreeMap::new()),
            [key("a-1")]
        );
        // The orphans' watch does not forget items of units another watch serves.
        note(&item);
        assert!(stores.forget_unlisted(None, &BTreeMap::new()).is_empty());
        // The unit leaves: its items are new again if it comes back.
        stores.remove(&key("a"));
        assert_eq!(note(&item), ItemSeen::New);
    }
}
