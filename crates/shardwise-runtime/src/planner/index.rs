//! What the planner knows of the fleet, as synchronous state with no I/O: every unit and item
//! reduced to what placement needs, and the shard count the StatefulSet asks for. Watch events
//! update it (each object applied or deleted, or a kind relisted as a whole); each update says
//! whether planning must run again, so that status writes (most of the events) cost nothing.
//! The records of cut units' slices come from UnitSlices ([`SliceEntry`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use shard_assign::KeyRange;
use shard_assign::ShardId;
use shardwise_handoff::keys::{
    SHARD_LABEL, SLICE_SHARDS_ANNOTATION, SLICES_LABEL, UNIT_LABEL, parse_shard, unit_token,
};
use shardwise_handoff::plan::{ItemView, ObjectKey, UnitView};
use shardwise_handoff::slices::SliceRecord;

use crate::objects::{key_of, record_of};
use crate::sharded::Sharded;
use crate::slice::UnitSlice;

/// What a cut unit shows people of its slices: the value of [`SLICES_LABEL`] and of
/// [`SLICE_SHARDS_ANNOTATION`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shown {
    pub slices: Option<String>,
    pub shards: Option<String>,
}

/// A unit as the planner keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnitEntry {
    pub view: UnitView,
    /// The version the planner's writes to it are conditioned on.
    pub(crate) resource_version: Option<String>,
    /// Being deleted: left out of planning.
    pub deleting: bool,
    /// What it shows of its slices.
    pub shown: Shown,
}

impl UnitEntry {
    /// What placement needs of `unit`. Its slices' records are added from the UnitSlices.
    pub fn of<C: Sharded>(unit: &C::Unit) -> Self {
        let meta = unit.meta();
        let placement = C::placement(unit);
        let label = meta.labels.as_ref().and_then(|l| l.get(SLICES_LABEL));
        let annotation = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(SLICE_SHARDS_ANNOTATION));
        Self {
            view: UnitView {
                key: key_of(unit),
                uid: meta.uid.clone().unwrap_or_default(),
                pin: placement.pin,
                weight: placement.weight,
                record: record_of(unit),
                cut: label.is_some(),
                slices: Vec::new(),
            },
            resource_version: meta.resource_version.clone(),
            deleting: meta.deletion_timestamp.is_some(),
            shown: Shown {
                slices: label.cloned(),
                shards: annotation.cloned(),
            },
        }
    }

    /// Whether `other` plans differently: anything but the resource version.
    fn plans_like(&self, other: &Self) -> bool {
        self.view == other.view && self.deleting == other.deleting && self.shown == other.shown
    }
}

/// A UnitSlice as the planner keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEntry {
    /// The UnitSlice object.
    pub(crate) key: ObjectKey,
    /// The unit it is a slice of.
    pub unit: ObjectKey,
    /// The UID of the unit it was made for: a unit made again under the same name is another.
    pub unit_uid: String,
    /// Its range and the placement record on it; `None` when its spec names no slice: it is
    /// deleted as a stray.
    pub record: Option<SliceRecord>,
    pub(crate) resource_version: Option<String>,
}

impl SliceEntry {
    /// What the planner keeps of `slice`.
    pub fn of(slice: &UnitSlice) -> Self {
        Self {
            key: key_of(slice),
            unit: slice.spec.unit_key(),
            unit_uid: slice.spec.unit.uid.clone(),
            record: slice.spec.key_range().map(|range| SliceRecord {
                range,
                record: record_of(slice),
            }),
            resource_version: slice.metadata.resource_version.clone(),
        }
    }

    fn plans_like(&self, other: &Self) -> bool {
        (&self.unit, &self.unit_uid, self.record) == (&other.unit, &other.unit_uid, other.record)
    }
}

/// What the planner keeps of an item from its metadata: its UID (whose hash is its key), its
/// shard label and its unit's token. The unit comes from the token (every unit's token is known)
/// or, for an item without one, from the watch of such items in full ([`Index::apply_unlabelled`]).
/// About 200 bytes per item, whatever its spec holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ItemMeta {
    pub key: ObjectKey,
    pub uid: String,
    pub shard: Option<ShardId>,
    pub token: Option<String>,
}

impl ItemMeta {
    /// What the planner keeps of an item whose metadata is `meta`.
    pub fn of(meta: &ObjectMeta) -> Self {
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key));
        Self {
            key: ObjectKey::new(
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            ),
            uid: meta.uid.clone().unwrap_or_default(),
            shard: label(SHARD_LABEL).and_then(|v| parse_shard(v)),
            token: label(UNIT_LABEL).cloned(),
        }
    }
}

/// The unit of an item without a token, from the item in full; `None` for one that has a
/// token (it leaves the watch of such items once the planner has written it).
pub(crate) fn unlabelled_unit<C: Sharded>(item: &C::Item) -> Option<ObjectKey> {
    let labels = item.meta().labels.as_ref();
    let labelled = labels.is_some_and(|l| l.contains_key(UNIT_LABEL));
    (!labelled).then(|| C::unit_of(item))
}

/// The unit an item whose token names no unit is placed under: a name no object can have
/// (names hold no `:`), so the planner treats the unit as missing and leaves the token alone.
fn unknown_unit(namespace: &str, token: &str) -> ObjectKey {
    ObjectKey::new(namespace, format!("token:{token}"))
}

/// Objects of one kind, with the relist in progress (a watch that restarts lists everything
/// again; the new list replaces the old one only once complete).
#[derive(Debug)]
struct Listed<T> {
    current: BTreeMap<ObjectKey, T>,
    relist: Option<BTreeMap<ObjectKey, T>>,
    synced: bool,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Self {
            current: BTreeMap::new(),
            relist: None,
            synced: false,
        }
    }
}

impl<T: Clone> Listed<T> {
    /// Stores `entry`; `true` when planning must run again.
    fn apply(&mut self, key: ObjectKey, entry: T, same: impl Fn(&T, &T) -> bool) -> bool {
        match self.current.insert(key, entry.clone()) {
            Some(previous) => !same(&previous, &entry),
            None => true,
        }
    }

    fn delete(&mut self, key: &ObjectKey) -> bool {
        self.current.remove(key).is_some()
    }

    fn relist(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    fn relisted(&mut self, key: ObjectKey, entry: T) {
        self.relist.get_or_insert_default().insert(key, entry);
    }

    /// The relist is complete: it replaces what was known (objects deleted meanwhile are
    /// not in it). Always `true`: the first list, or a list after a gap, is worth a pass.
    fn relist_done(&mut self) -> bool {
        if let Some(list) = self.relist.take() {
            self.current = list;
        }
        self.synced = true;
        true
    }
}

/// The planner's view of the fleet.
#[derive(Debug, Default)]
pub(crate) struct Index {
    units: Listed<UnitEntry>,
    items: Listed<ItemMeta>,
    /// The units of items without a token, from their spec.
    unlabelled: Listed<ObjectKey>,
    slices: Listed<SliceEntry>,
    /// UnitSlices cannot be listed (their CRD is not installed): nothing is cut.
    slices_unavailable: bool,
    /// The shards the StatefulSet asks for; `None` while it does not exist.
    expected: Option<u32>,
    statefulset_synced: bool,
    /// Each unit is its own only item ([`crate::kind`]): no item is listed, and each unit
    /// weighs one.
    own_items: bool,
}

impl Index {
    /// The index of a kind sharded by its own objects: each unit stands for one item, itself,
    /// which carries its own token already, so that placement weighs it one and writes it no
    /// item label.
    pub fn of_own_objects() -> Self {
        let mut index = Self {
            own_items: true,
            ..Self::default()
        };
        index.unlabelled.relist_done();
        index
    }

    /// The index of one kind placed by ranges of its objects' keys: the planner's watch gives
    /// every object the one unit's token, so none waits for a watch of objects without one.
    pub fn of_key_ranges() -> Self {
        let mut index = Self::default();
        index.unlabelled.relist_done();
        index
    }

    /// The item a unit stands for, for [`Index::of_own_objects`]: none while it is being
    /// deleted (it is placed no more).
    fn own_item(entry: &UnitEntry) -> Option<ItemMeta> {
        let key = &entry.view.key;
        (!entry.deleting).then(|| ItemMeta {
            key: key.clone(),
            uid: entry.view.uid.clone(),
            shard: None,
            token: Some(unit_token(&key.namespace, &key.name)),
        })
    }

    pub fn apply_unit(&mut self, entry: UnitEntry) -> bool {
        let key = entry.view.key.clone();
        if self.own_items {
            match Self::own_item(&entry) {
                Some(item) => self.items.apply(key.clone(), item, PartialEq::eq),
                None => self.items.delete(&key),
            };
        }
        self.units.apply(key, entry, UnitEntry::plans_like)
    }

    pub fn delete_unit(&mut self, key: &ObjectKey) -> bool {
        if self.own_items {
            self.items.delete(key);
        }
        self.units.delete(key)
    }

    /// A relist of the units begins.
    pub fn relist_units(&mut self) {
        if self.own_items {
            self.items.relist();
        }
        self.units.relist();
    }

    /// A unit of the relist in progress.
    pub fn relisted_unit(&mut self, entry: UnitEntry) {
        if self.own_items
            && let Some(item) = Self::own_item(&entry)
        {
            self.items.relisted(item.key.clone(), item);
        }
        self.units.relisted(entry.view.key.clone(), entry);
    }

    /// The relist of the units is complete.
    pub fn relisted_units(&mut self) -> bool {
        if self.own_items {
            self.items.relist_done();
        }
        self.units.relist_done()
    }

    pub fn apply_item(&mut self, meta: ItemMeta) -> bool {
        self.items.apply(meta.key.clone(), meta, PartialEq::eq)
    }

    pub fn delete_item(&mut self, key: &ObjectKey) -> bool {
        self.items.delete(key)
    }

    pub fn relist_items(&mut self) {
        self.items.relist();
    }

    pub fn relisted_item(&mut self, meta: ItemMeta) {
        self.items.relisted(meta.key.clone(), meta);
    }

    pub fn relisted_items(&mut self) -> bool {
        self.items.relist_done()
    }

    /// The unit of an item without a token; `None` once it has one.
    pub fn apply_unlabelled(&mut self, key: ObjectKey, unit: Option<ObjectKey>) -> bool {
        match unit {
            Some(unit) => self.unlabelled.apply(key, unit, PartialEq::eq),
            None => self.unlabelled.delete(&key),
        }
    }

    pub fn relist_unlabelled(&mut self) {
        self.unlabelled.relist();
    }

    pub fn relisted_unlabelled(&mut self, key: ObjectKey, unit: Option<ObjectKey>) {
        if let Some(unit) = unit {
            self.unlabelled.relisted(key, unit);
        }
    }

    pub fn relisted_unlabelled_done(&mut self) -> bool {
        self.unlabelled.relist_done()
    }

    /// An item as both watches show it: for tests, which feed whole views.
    #[cfg(test)]
    pub fn apply_view(&mut self, view: ItemView) -> bool {
        let unit = view.unit_token.is_none().then(|| view.unit.clone());
        let unlabelled = self.apply_unlabelled(view.key.clone(), unit);
        let meta = self.apply_item(ItemMeta {
            key: view.key,
            uid: view.uid,
            shard: view.shard,
            token: view.unit_token,
        });
        unlabelled || meta
    }

    pub fn apply_slice(&mut self, entry: SliceEntry) -> bool {
        self.slices
            .apply(entry.key.clone(), entry, SliceEntry::plans_like)
    }

    pub fn delete_slice(&mut self, key: &ObjectKey) -> bool {
        self.slices.delete(key)
    }

    pub fn relist_slices(&mut self) {
        self.slices.relist();
    }

    pub fn relisted_slice(&mut self, entry: SliceEntry) {
        self.slices.relisted(entry.key.clone(), entry);
    }

    pub fn relisted_slices(&mut self) -> bool {
        self.slices_unavailable = false;
        self.slices.relist_done()
    }

    /// UnitSlices cannot be listed: plan without them, and cut nothing.
    pub fn slices_unavailable(&mut self) -> bool {
        let changed = !self.slices_unavailable;
        self.slices_unavailable = true;
        self.slices.relist = None;
        self.slices.current.clear();
        self.slices.synced = true;
        changed
    }

    /// Whether units may be cut: their slices' records can be kept.
    pub fn can_cut(&self) -> bool {
        !self.slices_unavailable
    }

    /// The StatefulSet's shard count, or `None` when it does not exist.
    pub fn set_expected(&mut self, expected: Option<u32>) -> bool {
        self.statefulset_synced = true;
        std::mem::replace(&mut self.expected, expected) != expected
    }

    pub fn expected(&self) -> Option<u32> {
        self.expected
    }

    /// Whether every kind has been listed once: planning on less would move what it missed.
    pub fn synced(&self) -> bool {
        self.units.synced
            && self.items.synced
            && self.unlabelled.synced
            && self.slices.synced
            && self.statefulset_synced
    }

    /// The unit a UnitSlice belongs to, if it exists and is the one the slice was made for.
    fn unit_of_slice(&self, slice: &SliceEntry) -> Option<&UnitEntry> {
        self.units
            .current
            .get(&slice.unit)
            .filter(|u| u.view.uid == slice.unit_uid)
    }

    /// Units to place (not being deleted, with the records of their slices) and every item
    /// whose unit is known, in key order. An item without a token that the watch of such items
    /// has not shown yet waits for it (a pass follows).
    pub fn views(&self) -> (Vec<UnitView>, Vec<ItemView>) {
        (self.unit_views(), self.item_views())
    }

    fn item_views(&self) -> Vec<ItemView> {
        self.resolved(|meta, unit| ItemView {
            key: meta.key.clone(),
            uid: meta.uid.clone(),
            unit: unit.into_owned(),
            shard: meta.shard,
            unit_token: meta.token.clone(),
        })
    }

    /// Each item whose unit is known, with its unit, through `view`.
    fn resolved<'a, T>(&'a self, view: impl Fn(&'a ItemMeta, Cow<'a, ObjectKey>) -> T) -> Vec<T> {
        let units: BTreeMap<String, &ObjectKey> = self
            .units
            .current
            .keys()
            .map(|k| (unit_token(&k.namespace, &k.name), k))
            .collect();
        self.items
            .current
            .values()
            .filter_map(|meta| {
                let unit = match &meta.token {
                    Some(token) => units.get(token).map_or_else(
                        || Cow::Owned(unknown_unit(&meta.key.namespace, token)),
                        |&unit| Cow::Borrowed(unit),
                    ),
                    None => Cow::Borrowed(self.unlabelled.current.get(&meta.key)?),
                };
                Some(view(meta, unit))
            })
            .collect()
    }

    /// The items of each unit that has some.
    pub fn item_counts(&self) -> BTreeMap<ObjectKey, u64> {
        let mut counts: BTreeMap<Cow<'_, ObjectKey>, u64> = BTreeMap::new();
        for unit in self.resolved(|_, unit| unit) {
            *counts.entry(unit).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|(unit, n)| (unit.into_owned(), n))
            .collect()
    }

    /// Units to place, as in [`Index::views`].
    pub fn unit_views(&self) -> Vec<UnitView> {
        let mut slices: BTreeMap<&ObjectKey, Vec<SliceRecord>> = BTreeMap::new();
        for slice in self.slices.current.values() {
            if let Some(record) = slice.record
                && self.unit_of_slice(slice).is_some()
            {
                slices.entry(&slice.unit).or_default().push(record);
            }
        }
        self.units
            .current
            .values()
            .filter(|u| !u.deleting)
            .map(|u| UnitView {
                slices: slices.remove(&u.view.key).unwrap_or_default(),
                ..u.view.clone()
            })
            .collect()
    }

    /// The UnitSlice of `range` of `unit`, as last seen.
    pub fn slice(&self, unit: &ObjectKey, range: KeyRange) -> Option<&SliceEntry> {
        self.slices
            .current
            .values()
            .find(|s| &s.unit == unit && s.record.is_some_and(|r| r.range == range))
    }

    /// UnitSlices that belong to no unit (deleted, or made again under a new UID) or name no
    /// slice: nobody can hold them, and the planner deletes them.
    pub fn stray_slices(&self) -> Vec<&SliceEntry> {
        self.slices
            .current
            .values()
            .filter(|s| s.record.is_none() || self.unit_of_slice(s).is_none())
            .collect()
    }

    /// The unit `key`, as last seen.
    pub fn unit(&self, key: &ObjectKey) -> Option<&UnitEntry> {
        self.units.current.get(key)
    }
}

/// Units, items and members for the planner's tests: shard `s` runs as `fleet-s_first`.
#[cfg(test)]
pub(super) mod fixtures {
    use shard_assign::ShardId;
    use shardwise_handoff::drain::{Incarnation, UnitRecord};
    use shardwise_handoff::keys::unit_token;
    use shardwise_handoff::plan::Membership;

    use super::*;

    pub fn identity(shard: ShardId) -> String {
        format!("fleet-{shard}_first")
    }

    pub fn members(expected: u32, alive: &[ShardId]) -> Membership {
        Membership {
            expected,
            alive: alive.iter().map(|&s| (s, identity(s))).collect(),
        }
    }

    /// Unit `name` at version `rv-<name>`, assigned to `owner` (stamped with its identity) at
    /// epoch 1.
    pub fn unit(name: &str, owner: Option<ShardId>) -> UnitEntry {
        UnitEntry {
            view: UnitView {
                key: ObjectKey::new("fleet", name),
                uid: format!("uid-{name}"),
                pin: None,
                weight: None,
                record: UnitRecord {
                    owner,
                    holder: owner.map(|s| Incarnation::of_identity(&identity(s))),
                    epoch: 1,
                    ..Default::default()
                },
                cut: false,
                slices: Vec::new(),
            },
            resource_version: Some(format!("rv-{name}")),
            deleting: false,
            shown: Default::default(),
        }
    }

    pub fn item(name: &str, unit: &str, shard: Option<ShardId>) -> ItemView {
        ItemView {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            unit: ObjectKey::new("fleet", unit),
            shard,
            unit_token: Some(unit_token("fleet", unit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{item, unit};
    use super::*;

    fn at(version: &str, entry: UnitEntry) -> UnitEntry {
        UnitEntry {
            resource_version: Some(version.into()),
            ..entry
        }
    }

    #[test]
    fn only_changes_that_matter_to_placement_ask_for_a_pass() {
        let mut index = Index::default();
        assert!(index.apply_unit(at("1", unit("a", None))));
        // A status write: new version, same placement.
        assert!(!index.apply_unit(at("2", unit("a", None))));
        assert_eq!(
            index
                .unit(&ObjectKey::new("fleet", "a"))
                .and_then(|u| u.resource_version.as_deref()),
            Some("2"),
            "writes must be conditioned on the latest version"
        );
        assert!(index.apply_unit(at("3", unit("a", Some(1)))));
        assert!(index.apply_view(item("x", "a", None)));
        assert!(!index.apply_view(item("x", "a", None)));
        assert!(index.apply_view(item("x", "a", Some(1))));
        assert!(index.delete_item(&ObjectKey::new("fleet", "x")));
        assert!(!index.delete_item(&ObjectKey::new("fleet", "x")));
        let mut deleting = at("4", unit("a", Some(1)));
        deleting.deleting = true;
        assert!(index.apply_unit(deleting));
        assert!(
            index.views().0.is_empty(),
            "a unit being deleted is not placed"
        );
    }

    #[test]
    fn a_relist_replaces_what_was_known_only_when_complete() {
        let mut index = Index::default();
        index.relist_units();
        index.relisted_unit(unit("a", None));
        index.relisted_unit(unit("b", None));
        assert!(!index.synced());
        assert!(index.relisted_units());
        index.relist_items();
        assert!(index.relisted_items());
        index.relist_unlabelled();
        assert!(index.relisted_unlabelled_done());
        assert!(index.set_expected(Some(3)));
        assert!(!index.synced(), "the slices are not listed yet");
        index.relist_slices();
        assert!(index.relisted_slices());
        assert!(index.synced());
        // The watch restarts; "b" was deleted while it was down.
        index.relist_units();
        index.relisted_unit(at("5", unit("a", None)));
        assert_eq!(
            index.views().0.len(),
            2,
            "the old list stands until the new one ends"
        );
        index.relisted_units();
        let names: Vec<String> = index.views().0.into_iter().map(|u| u.key.name).collect();
        assert_eq!(names, ["a"]);
    }

    #[test]
    fn an_items_unit_comes_from_its_token_or_while_it_has_none_from_its_spec() {
        let mut index = Index::default();
        index.apply_unit(unit("a", Some(0)));
        index.apply_unit(unit("b", None));
        let meta = |name: &str, token: Option<&str>| ItemMeta {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            shard: None,
            token: token.map(|unit| unit_token("fleet", unit)),
        };
        let units = |index: &Index| -> Vec<(String, String)> {
            let (_, items) = index.views();
            items
                .into_iter()
                .map(|i| (i.key.name, i.unit.name))
                .collect()
        };
        assert!(index.apply_item(meta("x", Some("a"))));
        // A token no unit has: the unit is missing, and the token stays.
        index.apply_item(meta("lost", Some("gone")));
        // No token, and not seen in full yet: left out until it is.
        index.apply_item(meta("new", None));
        let lost = format!("token:{}", unit_token("fleet", "gone"));
        assert_eq!(
            units(&index),
            [("lost".into(), lost.clone()), ("x".into(), "a".into())]
        );
        assert!(index.apply_unlabelled(
            ObjectKey::new("fleet", "new"),
            Some(ObjectKey::new("fleet", "b"))
        ));
        assert_eq!(units(&index)[1], ("new".into(), "b".into()));
        // Its token written: it leaves the watch of items without one, and the token names b.
        assert!(index.apply_item(meta("new", Some("b"))));
        assert!(index.apply_unlabelled(ObjectKey::new("fleet", "new"), None));
        assert_eq!(units(&index)[1], ("new".into(), "b".into()));
        assert_eq!(
            index.item_counts().get(&ObjectKey::new("fleet", "b")),
            Some(&1)
        );
    }

    #[test]
    fn the_statefulset_sets_the_expected_shards() {
        let mut index = Index::default();
        assert!(!index.synced());
        assert!(!index.set_expected(None), "still none: nothing changed");
        assert!(index.set_expected(Some(4)));
        assert!(!index.set_expected(Some(4)));
        assert_eq!(index.expected(), Some(4));
        assert!(index.set_expected(None));
    }
}
