//! What the planner knows of the fleet, as synchronous state with no I/O: every unit and item
//! reduced to what placement needs, and the shard count the StatefulSet asks for. Watch events
//! update it (each object applied or deleted, or a kind relisted as a whole); each update says
//! whether planning must run again, so that status writes (most of the events) cost nothing.
//! The records of cut units' slices come from UnitSlices ([`SliceEntry`]).

use std::collections::BTreeMap;

use kube::Resource;
use shard_assign::KeyRange;
use shardwise_handoff::keys::{
    SHARD_LABEL, SLICE_SHARDS_ANNOTATION, SLICES_LABEL, UNIT_LABEL, parse_shard,
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

/// What placement needs of `item`: its unit and its shard label.
pub(crate) fn item_view<C: Sharded>(item: &C::Item) -> ItemView {
    let meta = item.meta();
    ItemView {
        key: key_of(item),
        uid: meta.uid.clone().unwrap_or_default(),
        unit: C::unit_of(item),
        shard: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(SHARD_LABEL))
            .and_then(|v| parse_shard(v)),
        unit_token: meta
            .labels
            .as_ref()
            .and_then(|l| l.get(UNIT_LABEL))
            .cloned(),
    }
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
    items: Listed<ItemView>,
    slices: Listed<SliceEntry>,
    /// UnitSlices cannot be listed (their CRD is not installed): nothing is cut.
    slices_unavailable: bool,
    /// The shards the StatefulSet asks for; `None` while it does not exist.
    expected: Option<u32>,
    statefulset_synced: bool,
}

impl Index {
    pub fn apply_unit(&mut self, entry: UnitEntry) -> bool {
        let key = entry.view.key.clone();
        self.units.apply(key, entry, UnitEntry::plans_like)
    }

    pub fn delete_unit(&mut self, key: &ObjectKey) -> bool {
        self.units.delete(key)
    }

    /// A relist of the units begins.
    pub fn relist_units(&mut self) {
        self.units.relist();
    }

    /// A unit of the relist in progress.
    pub fn relisted_unit(&mut self, entry: UnitEntry) {
        self.units.relisted(entry.view.key.clone(), entry);
    }

    /// The relist of the units is complete.
    pub fn relisted_units(&mut self) -> bool {
        self.units.relist_done()
    }

    pub fn apply_item(&mut self, view: ItemView) -> bool {
        self.items.apply(view.key.clone(), view, PartialEq::eq)
    }

    pub fn delete_item(&mut self, key: &ObjectKey) -> bool {
        self.items.delete(key)
    }

    pub fn relist_items(&mut self) {
        self.items.relist();
    }

    pub fn relisted_item(&mut self, view: ItemView) {
        self.items.relisted(view.key.clone(), view);
    }

    pub fn relisted_items(&mut self) -> bool {
        self.items.relist_done()
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
        self.units.synced && self.items.synced && self.slices.synced && self.statefulset_synced
    }

    /// The unit a UnitSlice belongs to, if it exists and is the one the slice was made for.
    fn unit_of_slice(&self, slice: &SliceEntry) -> Option<&UnitEntry> {
        self.units
            .current
            .get(&slice.unit)
            .filter(|u| u.view.uid == slice.unit_uid)
    }

    /// Units to place (not being deleted, with the records of their slices) and every item,
    /// in key order.
    pub fn views(&self) -> (Vec<UnitView>, Vec<ItemView>) {
        let items = self.items.current.values().cloned().collect();
        (self.unit_views(), items)
    }

    /// The items of each unit that has some.
    pub fn item_counts(&self) -> BTreeMap<ObjectKey, u64> {
        let mut counts = BTreeMap::new();
        for item in self.items.current.values() {
            *counts.entry(item.unit.clone()).or_default() += 1;
        }
        counts
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
        assert!(index.apply_item(item("x", "a", None)));
        assert!(!index.apply_item(item("x", "a", None)));
        assert!(index.apply_item(item("x", "a", Some(1))));
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
