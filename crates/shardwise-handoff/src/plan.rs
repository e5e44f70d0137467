//! The planner's pass: from what it observes (units with their placement records, items, the
//! shards that exist) to what it must write (unit actions and item labels).

use std::collections::{BTreeMap, BTreeSet};

use shard_assign::{
    AppKeys, AssignError, Cluster, KeyRange, PreviousPlacement, ShardId, ShardSet, SliceConfig,
    SlicedAssignment, Slicing, StrategyConfig, app_key, assign_sliced, count_in, fnv1a_32,
    slice_id,
};

use crate::drain::{Incarnation, UnitRecord};
use crate::keys::unit_token;
use crate::slices::{SliceAction, SliceRecord, slice_actions};

/// Namespace and name of an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Namespace of the object; empty for a cluster-scoped one.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}

impl ObjectKey {
    /// The key of the object `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// A unit as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitView {
    /// Namespace and name of the unit's object.
    pub key: ObjectKey,
    /// UID of the unit's object: what identifies the unit for placement.
    pub uid: String,
    /// The shard the unit is pinned to, if any.
    pub pin: Option<ShardId>,
    /// Cost of each of the unit's items relative to other units' (1 when not set).
    pub weight: Option<u32>,
    /// The record of the whole unit, on the unit's object.
    pub record: UnitRecord,
    /// The unit is cut: the record of the whole unit is gone, its slices have their own.
    pub cut: bool,
    /// The records of its slices other than the whole one, in any order.
    pub slices: Vec<SliceRecord>,
}

impl UnitView {
    /// Every record of the unit: the whole one unless it is cut, and those of its slices.
    pub fn records(&self) -> Vec<SliceRecord> {
        let whole = (!self.cut).then_some(SliceRecord {
            range: KeyRange::WHOLE,
            record: self.record,
        });
        whole
            .into_iter()
            .chain(
                self.slices
                    .iter()
                    .copied()
                    .filter(|s| s.range != KeyRange::WHOLE),
            )
            .collect()
    }
}

/// An item as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemView {
    /// Namespace and name of the item's object.
    pub key: ObjectKey,
    /// UID of the item's object, from which its key is hashed: the key decides which slice of
    /// its unit the item belongs to.
    pub uid: String,
    /// The unit it targets (same namespace as the item).
    pub unit: ObjectKey,
    /// Its shard label (only items of units that do not exist keep one).
    pub shard: Option<ShardId>,
    /// Its unit label ([`crate::keys::UNIT_LABEL`]), as written.
    pub unit_token: Option<String>,
}

/// Which shards exist and which are alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// The StatefulSet's `spec.replicas`: shards `0..expected` are expected.
    pub expected: u32,
    /// Shards whose lease is valid, with the identity holding it.
    pub alive: BTreeMap<ShardId, String>,
}

impl Membership {
    /// Shards that may be given work: expected and alive.
    pub fn live(&self) -> ShardSet {
        self.alive
            .keys()
            .copied()
            .filter(|&s| s < self.expected)
            .collect()
    }

    /// The identity holding the lease of `shard`, if the lease is valid.
    pub fn identity(&self, shard: ShardId) -> Option<&str> {
        self.alive.get(&shard).map(String::as_str)
    }

    /// The incarnation holding the lease of `shard`, if the lease is valid.
    pub fn holder(&self, shard: ShardId) -> Option<Incarnation> {
        self.identity(shard).map(Incarnation::of_identity)
    }
}

/// What the planner remembers of its last pass: the load each slice (by
/// [`shard_assign::slice_id`]) was placed with and the live shards. Given back to the next pass,
/// it lets `sticky-balanced` tell a pass with nothing changed (no extra moves) from one reacting
/// to a change; without it (first pass, or a pass meant to keep converging) every pass may spend
/// the move budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanMemory {
    pub(crate) loads: BTreeMap<String, u64>,
    pub(crate) shards: ShardSet,
}

impl PlanMemory {
    /// The memory a planner would have if it had just placed the fleet as it stands: for a
    /// planner that takes over, so that its first pass spends no move on a fleet that did not
    /// change (a planner failover must not move units).
    pub fn of_current(units: &[UnitView], items: &[ItemView], membership: &Membership) -> Self {
        let fleet = Fleet::of(units, items);
        let mut loads = BTreeMap::new();
        for c in units {
            let weight = u64::from(c.weight.unwrap_or(1));
            for (range, _) in recorded_cut(&c.records()) {
                let items = fleet.items_in(c, range);
                loads.insert(slice_id(&c.uid, range), items.saturating_mul(weight));
            }
        }
        Self {
            loads,
            shards: membership.live(),
        }
    }
}

/// One record of a unit: the unit and the range of the slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordKey {
    /// The unit.
    pub unit: ObjectKey,
    /// The keys of the slice ([`KeyRange::WHOLE`] for the record of the whole unit).
    pub range: KeyRange,
}

impl RecordKey {
    /// The record of the whole of `unit`, on the unit's own object.
    pub fn whole(unit: ObjectKey) -> Self {
        Self {
            unit,
            range: KeyRange::WHOLE,
        }
    }
}

/// The outcome of a planning pass.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The strategy's placement of every slice on a live shard, and how units are cut.
    pub assignment: SlicedAssignment,
    /// Writes to the records of units, in unit order (only units that need one).
    pub unit_actions: Vec<(ObjectKey, SliceAction)>,
    /// Items whose unit label is missing or names another unit, or whose shard label must
    /// change, in key order. No move writes one: owners select a unit's items by its token.
    pub item_labels: Vec<ItemLabel>,
    /// Units pinned to a shard that is not live, and where they were placed instead.
    pub unhonoured_pins: Vec<(ObjectKey, ShardId, ShardId)>,
    /// The slices every unit should end with, and their shards, in range order.
    pub layouts: BTreeMap<ObjectKey, Vec<(KeyRange, ShardId)>>,
    /// To give to the next pass.
    pub memory: PlanMemory,
}

/// The labels of an item, where they must change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemLabel {
    /// The item.
    pub item: ObjectKey,
    /// Its object's UID: the write is made to that object only, not to one made again under
    /// the same name since.
    pub uid: String,
    /// Its unit label: [`unit_token`] of its unit; kept as it is on an item of a unit that
    /// does not exist.
    pub unit_token: String,
    /// Its shard label: for an item of a unit that does not exist, the live shard that reports
    /// on it; none for the others (an owner finds them by their unit label).
    pub shard: Option<ShardId>,
}

/// Why a planning pass produced no plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No shard is both expected and alive.
    #[error("no live shard: no replica both exists in the StatefulSet and holds its lease")]
    NoLiveShards,
    /// The strategy could not place the units.
    #[error(transparent)]
    Assign(#[from] AssignError),
}

/// Item counts and keys of every unit.
struct Fleet<'a> {
    counts: BTreeMap<&'a ObjectKey, u64>,
    /// Sorted item keys by unit UID.
    keys: AppKeys,
}

impl<'a> Fleet<'a> {
    fn of(units: &[UnitView], items: &'a [ItemView]) -> Self {
        let uids: BTreeMap<&ObjectKey, &str> =
            units.iter().map(|c| (&c.key, c.uid.as_str())).collect();
        let mut counts: BTreeMap<&ObjectKey, u64> = BTreeMap::new();
        let mut keys: AppKeys = BTreeMap::new();
        for item in items {
            *counts.entry(&item.unit).or_default() += 1;
            if let Some(&uid) = uids.get(&item.unit) {
                let key = app_key(&item.uid);
                // Looked up before inserting: an owned key per item would allocate 200,000 times.
                match keys.get_mut(uid) {
                    Some(list) => list.push(key),
                    None => {
                        keys.insert(uid.to_string(), vec![key]);
                    }
                }
            }
        }
        for list in keys.values_mut() {
            list.sort_unstable();
        }
        Self { counts, keys }
    }

    fn items_in(&self, unit: &UnitView, range: KeyRange) -> u64 {
        match self.keys.get(&unit.uid) {
            Some(keys) if range != KeyRange::WHOLE => count_in(keys, range),
            _ => self.counts.get(&unit.key).copied().unwrap_or(0),
        }
    }
}

/// The cut a unit's records describe ([`shard_assign::recorded_cut`]), with the record of
/// each slice.
fn recorded_cut(records: &[SliceRecord]) -> Vec<(KeyRange, UnitRecord)> {
    let ranges: Vec<KeyRange> = records.iter().map(|r| r.range).collect();
    shard_assign::recorded_cut(&ranges)
        .into_iter()
        .filter_map(|range| {
            let record = records.iter().find(|r| r.range == range)?;
            Some((range, record.record))
        })
        .collect()
}

/// One planning pass. Units are identified by UID for placement, slices by
/// [`shard_assign::slice_id`]; item counts and keys come from the items that target each
/// unit. `slicing` says whether units too big for one shard are cut.
pub fn plan(
    strategy: &StrategyConfig,
    slicing: &SliceConfig,
    units: &[UnitView],
    items: &[ItemView],
    membership: &Membership,
    memory: Option<&PlanMemory>,
) -> Result<Plan, PlanError> {
    let live = membership.live();
    if live.is_empty() {
        return Err(PlanError::NoLiveShards);
    }
    let fleet = Fleet::of(units, items);
    let inputs: Vec<Cluster> = units
        .iter()
        .map(|c| Cluster {
            id: c.uid.clone(),
            name: c.key.to_string(),
            apps: fleet.counts.get(&c.key).copied().unwrap_or(0),
            pin: c.pin,
            weight: c.weight,
        })
        .collect();
    // Where each slice is or is going: a drain in progress counts as already decided.
    let mut previous = PreviousPlacement::new();
    let mut previous_slicing = Slicing::default();
    for c in units {
        let cut = recorded_cut(&c.records());
        if cut.len() > 1 {
            let ranges = cut.iter().map(|(range, _)| *range).collect();
            if let Some(with_cut) = previous_slicing.clone().with(c.uid.clone(), ranges) {
                previous_slicing = with_cut;
            }
        }
        for (range, record) in cut {
            if let Some(shard) = record.intended_shard() {
                let id = slice_id(&c.uid, range);
                let load = memory.and_then(|m| m.loads.get(&id).copied());
                previous.insert(id, shard, load);
            }
        }
    }
    if let Some(memory) = memory {
        previous = previous.with_live_shards(memory.shards.clone());
    }
    let assignment = assign_sliced(
        strategy,
        slicing,
        &inputs,
        &fleet.keys,
        &live,
        Some(&previous),
        &previous_slicing,
    )?;
    let memory = PlanMemory {
        loads: assignment
            .assignment
            .placements()
            .iter()
            .map(|(id, p)| (id.clone(), p.load))
            .collect(),
        shards: live.clone(),
    };

    let mut unit_actions = Vec::new();
    let mut unhonoured_pins = Vec::new();
    let mut layouts = BTreeMap::new();
    for c in units {
        let Some(units) = assignment.units.get(&c.uid) else {
            continue;
        };
        let desired: Vec<(KeyRange, ShardId)> = units
            .iter()
            .filter_map(|(range, id)| Some((*range, assignment.assignment.shard_of(id)?)))
            .collect();
        if let (Some(pin), Some(&(_, first))) = (c.pin, desired.first())
            && desired.iter().all(|&(_, s)| s != pin)
        {
            unhonoured_pins.push((c.key.clone(), pin, first));
        }
        let records = c.records();
        let actions = slice_actions(&records, &desired, |s| membership.holder(s));
        unit_actions.extend(actions.into_iter().map(|a| (c.key.clone(), a)));
        layouts.insert(c.key.clone(), desired);
    }

    let existing: BTreeSet<&ObjectKey> = units.iter().map(|u| &u.key).collect();
    let item_labels = item_labels(items, &existing, &live);
    Ok(Plan {
        assignment,
        unit_actions,
        item_labels,
        unhonoured_pins,
        layouts,
        memory,
    })
}

/// The label changes of items: each carries the token of its unit; an item of a unit that does
/// not exist also names a live shard, which reports on it (the one it names if that is live,
/// else one picked by hash, so every planner picks the same); the others name none.
fn item_labels(
    items: &[ItemView],
    existing: &BTreeSet<&ObjectKey>,
    live: &ShardSet,
) -> Vec<ItemLabel> {
    let mut item_labels = Vec::new();
    let mut tokens: BTreeMap<&ObjectKey, String> = BTreeMap::new();
    for item in items {
        let exists = existing.contains(&item.unit);
        let token: &String = match &item.unit_token {
            // The unit of a token that names none is not known from metadata: the token
            // stays (an owner clears a token its item's spec no longer matches).
            Some(token) if !exists => token,
            _ => tokens
                .entry(&item.unit)
                .or_insert_with(|| unit_token(&item.unit.namespace, &item.unit.name)),
        };
        let shard = if exists {
            None
        } else {
            match item.shard.filter(|&s| live.contains(s)) {
                Some(s) => Some(s),
                None => {
                    let ids = live.as_slice();
                    let index = fnv1a_32(item.uid.as_bytes()) as usize % ids.len();
                    Some(ids[index])
                }
            }
        };
        if item.shard != shard || item.unit_token.as_ref() != Some(token) {
            item_labels.push(ItemLabel {
                item: item.key.clone(),
                uid: item.uid.clone(),
                unit_token: token.clone(),
                shard,
            });
        }
    }
    item_labels.sort_by(|a, b| a.item.cmp(&b.item));
    item_labels
}

/// Identities and records of replicas for tests: shard `s` runs as `fleet-s_first`.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn identity(shard: ShardId) -> String {
        format!("fleet-{shard}_first")
    }

    pub fn holder(shard: ShardId) -> Incarnation {
        Incarnation::of_identity(&identity(shard))
    }

    pub fn members(expected: u32, alive: &[ShardId]) -> Membership {
        Membership {
            expected,
            alive: alive.iter().map(|&s| (s, identity(s))).collect(),
        }
    }

    /// Assigned to `owner` (stamped with its incarnation) at epoch 1.
    pub fn unit(name: &str, owner: Option<ShardId>) -> UnitView {
        UnitView {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            pin: None,
            weight: None,
            record: UnitRecord {
                owner,
                holder: owner.map(holder),
                epoch: 1,
                ..Default::default()
            },
            cut: false,
            slices: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{holder, identity, members, unit};
    use super::*;
    use crate::drain::PlannerAction;
    use shard_assign::StrategyKind;

    #[test]
    fn an_item_of_a_missing_unit_keeps_its_token_and_gets_a_live_reporter() {
        // The item's token names a unit that does not exist, and its spec names another that
        // does not exist either: which unit the token meant is not known from metadata, so
        // the token stays; only the shard that reports on it is written.
        let item = ItemView {
            key: ObjectKey::new("fleet", "orphan"),
            uid: "uid-orphan".to_string(),
            unit: ObjectKey::new("fleet", "gone"),
            shard: None,
            unit_token: Some(unit_token("fleet", "renamed")),
        };
        let live = members(2, &[0, 1]).live();
        let labels = item_labels(std::slice::from_ref(&item), &BTreeSet::new(), &live);
        assert_eq!(labels.len(), 1, "{labels:?}");
        assert_eq!(labels[0].unit_token, unit_token("fleet", "renamed"));
        assert!(labels[0].shard.is_some_and(|s| live.contains(s)));
        // Of a unit that exists, the token is its unit's, and no shard is named.
        let exists = ObjectKey::new("fleet", "gone");
        let labels = item_labels(&[item], &BTreeSet::from([&exists]), &live);
        assert_eq!(labels[0].unit_token, unit_token("fleet", "gone"));
        assert_eq!(labels[0].shard, None);
    }

    /// A pass that places whole units only.
    pub(super) fn plan_whole(
        config: &StrategyConfig,
        units: &[UnitView],
        items: &[ItemView],
        membership: &Membership,
        memory: Option<&PlanMemory>,
    ) -> Result<Plan, PlanError> {
        plan(
            config,
            &SliceConfig::disabled(),
            units,
            items,
            membership,
            memory,
        )
    }

    fn whole(action: PlannerAction) -> SliceAction {
        SliceAction::Place {
            range: KeyRange::WHOLE,
            action,
        }
    }

    fn item(name: &str, unit: &str, shard: Option<ShardId>) -> ItemView {
        ItemView {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            unit: ObjectKey::new("fleet", unit),
            shard,
            unit_token: Some(unit_token("fleet", unit)),
        }
    }

    #[test]
    fn live_shards_are_expected_and_alive() {
        let m = members(3, &[0, 2, 3]);
        assert_eq!(m.live(), [0, 2].into_iter().collect());
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let err =
            plan_whole(&config, &[unit("a", None)], &[], &members(0, &[0]), None).unwrap_err();
        assert_eq!(err, PlanError::NoLiveShards);
    }

    /// An item as it is created: no label at all.
    fn new_item(name: &str, unit: &str) -> ItemView {
        ItemView {
            unit_token: None,
            ..item(name, unit, None)
        }
    }

    #[test]
    fn new_clusters_are_placed_and_their_apps_labelled_with_their_token_in_one_pass() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let units = [unit("a", None), unit("b", None)];
        let items = [new_item("x", "a"), new_item("y", "a"), new_item("z", "b")];
        let p = plan_whole(&config, &units, &items, &members(2, &[0, 1]), None).unwrap();
        // a (2 items) goes first to shard 0, b to shard 1.
        assert_eq!(
            p.unit_actions,
            vec![
                (
                    ObjectKey::new("fleet", "a"),
                    whole(PlannerAction::Assign {
                        shard: 0,
                        holder: holder(0),
                        epoch: 2
                    })
                ),
                (
                    ObjectKey::new("fleet", "b"),
                    whole(PlannerAction::Assign {
                        shard: 1,
                        holder: holder(1),
                        epoch: 2
                    })
                ),
            ]
        );
        let token = |unit: &str| unit_token("fleet", unit);
        let labels: Vec<(String, String, Option<ShardId>)> = p
            .item_labels
            .iter()
            .map(|l| (l.item.name.clone(), l.unit_token.clone(), l.shard))
            .collect();
        assert_eq!(
            labels,
            vec![
                ("x".into(), token("a"), None),
                ("y".into(), token("a"), None),
                ("z".into(), token("b"), None)
            ]
        );
    }

    #[test]
    fn a_live_owner_is_asked_to_drain_and_apps_wait() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        // Both on shard 0; greedy wants one on each.
        let units = [unit("a", Some(0)), unit("b", Some(0))];
        let items = [item("x", "a", None), item("z", "b", None)];
        let p = plan_whole(&config, &units, &items, &members(2, &[0, 1]), None).unwrap();
        assert_eq!(p.unit_actions.len(), 1);
        assert_eq!(
            p.unit_actions[0].1,
            whole(PlannerAction::RequestDrain { to: 1 })
        );
        // The items follow their unit's record: nothing of theirs is written.
        assert!(p.item_labels.is_empty());
    }

    #[test]
    fn a_dead_owners_clusters_and_apps_move_at_once() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let units = [unit("a", Some(0)), unit("b", Some(1))];
        let items = [item("x", "a", None), item("z", "b", None)];
        // Shard 1 is expected but its lease expired.
        let p = plan_whole(&config, &units, &items, &members(2, &[0]), None).unwrap();
        assert_eq!(
            p.unit_actions,
            vec![(
                ObjectKey::new("fleet", "b"),
                whole(PlannerAction::Assign {
                    shard: 0,
                    holder: holder(0),
                    epoch: 2
                })
            )]
        );
        // One record written, whatever the unit's items: they follow it by their token.
        assert!(p.item_labels.is_empty());
    }

    #[test]
    fn a_restarted_owner_gets_its_clusters_back_under_its_new_incarnation() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let units = [unit("a", Some(0)), unit("b", Some(1))];
        let items = [item("x", "a", None), item("z", "b", None)];
        // Shard 1 restarted: its lease is valid again, held by a new process.
        let mut membership = members(2, &[0, 1]);
        membership.alive.insert(1, "fleet-1_second".into());
        let p = plan_whole(&config, &units, &items, &membership, None).unwrap();
        assert_eq!(
            p.unit_actions,
            vec![(
                ObjectKey::new("fleet", "b"),
                whole(PlannerAction::Assign {
                    shard: 1,
                    holder: Incarnation::of_identity("fleet-1_second"),
                    epoch: 2
                })
            )]
        );
        assert!(p.item_labels.is_empty());
        assert_eq!(membership.identity(0), Some(identity(0).as_str()));
    }

    #[test]
    fn an_item_gets_its_units_token_once_and_no_move_writes_it_again() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let units = [unit("a", Some(0)), unit("b", Some(1))];
        let fresh = new_item("fresh", "a");
        let mut stale = item("stale", "b", None);
        stale.unit_token = Some(unit_token("fleet", "a"));
        // Labelled with a shard by a planner of an earlier version: the label goes.
        let labelled = item("labelled", "b", Some(1));
        let items = [fresh, stale, labelled, item("settled", "a", None)];
        let p = plan_whole(&config, &units, &items, &members(2, &[0, 1]), None).unwrap();
        let token = |unit: &str| unit_token("fleet", unit);
        assert_eq!(
            p.item_labels,
            vec![
                ItemLabel {
                    item: ObjectKey::new("fleet", "fresh"),
                    uid: "uid-fresh".into(),
                    unit_token: token("a"),
                    shard: None,
                },
                ItemLabel {
                    item: ObjectKey::new("fleet", "labelled"),
                    uid: "uid-labelled".into(),
                    unit_token: token("b"),
                    shard: None,
                },
                ItemLabel {
                    item: ObjectKey::new("fleet", "stale"),
                    uid: "uid-stale".into(),
                    unit_token: token("b"),
                    shard: None,
                },
            ]
        );
        // Once written, a move of "a" to shard 1 (shard 0 died) writes its record only.
        let written = [
            item("fresh", "a", None),
            item("stale", "b", None),
            item("labelled", "b", None),
            item("settled", "a", None),
        ];
        let p = plan_whole(&config, &units, &written, &members(2, &[1]), None).unwrap();
        assert_eq!(p.unit_actions.len(), 1, "{:?}", p.unit_actions);
        assert!(p.item_labels.is_empty(), "{:?}", p.item_labels);
    }

    #[test]
    fn apps_of_missing_clusters_still_get_a_live_owner() {
        let config = StrategyConfig::new(StrategyKind::RoundRobin);
        let items = [
            item("lost", "nowhere", None),
            item("kept", "nowhere", Some(1)),
            item("stale", "nowhere", Some(7)),
        ];
        let p = plan_whole(&config, &[], &items, &members(3, &[0, 1, 2]), None).unwrap();
        let shards: BTreeMap<String, ShardId> = p
            .item_labels
            .iter()
            .filter_map(|l| Some((l.item.name.clone(), l.shard?)))
            .collect();
        assert_eq!(shards.len(), p.item_labels.len(), "each names a shard");
        assert!(!shards.contains_key("kept"), "a live label is kept");
        assert!(shards["lost"] < 3 && shards["stale"] < 3);
        // Deterministic: the same pass gives the same labels.
        let again = plan_whole(&config, &[], &items, &members(3, &[0, 1, 2]), None).unwrap();
        assert_eq!(p.item_labels, again.item_labels);
    }

    #[test]
    fn scale_down_drains_the_departing_shard_while_it_lives() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let units = [unit("a", Some(0)), unit("b", Some(1)), unit("c", Some(2))];
        // replicas 3 -> 2, replica 2 still running.
        let p = plan_whole(&config, &units, &[], &members(2, &[0, 1, 2]), None).unwrap();
        assert_eq!(p.unit_actions.len(), 1);
        assert_eq!(p.unit_actions[0].0.name, "c");
        assert!(matches!(
            p.unit_actions[0].1,
            SliceAction::Place {
                action: PlannerAction::RequestDrain { to: 0 | 1 },
                ..
            }
        ));
    }

    #[test]
    fn unhonoured_pins_are_reported() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let mut pinned = unit("p", Some(0));
        pinned.pin = Some(5);
        let p = plan_whole(&config, &[pinned], &[], &members(2, &[0, 1]), None).unwrap();
        assert_eq!(
            p.unhonoured_pins,
            vec![(ObjectKey::new("fleet", "p"), 5, 0)]
        );
    }
}

#[cfg(test)]
mod memory_tests {
    use super::fixtures::{members, unit};
    use super::tests::plan_whole;
    use super::*;
    use shard_assign::StrategyKind;

    #[test]
    fn with_memory_an_unchanged_fleet_is_left_alone_and_without_it_keeps_converging() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        // Everything on shard 0 of two: far from balanced.
        let units: Vec<UnitView> = (0..6).map(|i| unit(&format!("c{i}"), Some(0))).collect();
        let items: Vec<ItemView> = (0..6)
            .flat_map(|i| {
                (0..=i).map(move |j| ItemView {
                    key: ObjectKey::new("fleet", format!("a{i}-{j}")),
                    uid: format!("item-{i}-{j}"),
                    unit: ObjectKey::new("fleet", format!("c{i}")),
                    shard: Some(0),
                    unit_token: Some(unit_token("fleet", &format!("c{i}"))),
                })
            })
            .collect();
        let members = members(2, &[0, 1]);
        let remembered = PlanMemory {
            loads: units
                .iter()
                .enumerate()
                .map(|(i, c)| (c.uid.clone(), i as u64 + 1))
                .collect(),
            shards: members.live(),
        };
        // What a planner taking over remembers of this fleet: each unit weighs its apps.
        assert_eq!(PlanMemory::of_current(&units, &items, &members), remembered);
        let quiet = plan_whole(&config, &units, &items, &members, Some(&remembered)).unwrap();
        assert!(quiet.unit_actions.is_empty(), "{:?}", quiet.unit_actions);
        let converging = plan_whole(&config, &units, &items, &members, None).unwrap();
        assert!(!converging.unit_actions.is_empty());
        assert!(
            converging.unit_actions.len() <= 3,
            "the budget bounds a pass"
        );
    }
}

#[cfg(test)]
mod slicing_tests {
    use super::fixtures::{holder, members, unit};
    use super::*;
    use shard_assign::StrategyKind;

    /// Applies a pass's writes to the views, as the API server would, and lets every owner
    /// acknowledge every drain at once (no work in flight anywhere).
    fn apply(units: &mut [UnitView], items: &mut [ItemView], plan: &Plan) {
        for (key, action) in &plan.unit_actions {
            let Some(c) = units.iter_mut().find(|c| &c.key == key) else {
                continue;
            };
            let mut records = c.records();
            let range = action.range();
            let at = records.iter().position(|r| r.range == range);
            match (*action, at) {
                (
                    SliceAction::Create {
                        owner,
                        epoch,
                        drain_to,
                        ..
                    },
                    None,
                ) => records.push(SliceRecord {
                    range,
                    record: UnitRecord {
                        owner: owner.map(|o| o.0),
                        holder: owner.map(|o| o.1),
                        epoch,
                        drain_to,
                        drained_epoch: None,
                    },
                }),
                (SliceAction::Retire { .. }, Some(i)) => {
                    records[i].record.drain_to = records[i].record.owner;
                }
                (SliceAction::Delete { .. }, Some(i)) => {
                    records.remove(i);
                }
                (SliceAction::Place { action, .. }, Some(i)) => {
                    crate::drain::tests::apply(&mut records[i].record, action);
                }
                other => panic!("cannot apply {other:?}"),
            }
            for r in &mut records {
                if r.record.drain_to.is_some() {
                    r.record.drained_epoch = Some(r.record.epoch);
                }
            }
            let whole = records.iter().find(|r| r.range == KeyRange::WHOLE);
            c.cut = whole.is_none();
            if let Some(w) = whole {
                c.record = w.record;
            }
            c.slices = records
                .into_iter()
                .filter(|r| r.range != KeyRange::WHOLE)
                .collect();
        }
        for label in &plan.item_labels {
            if let Some(item) = items.iter_mut().find(|a| a.key == label.item) {
                item.shard = label.shard;
                item.unit_token = Some(label.unit_token.clone());
            }
        }
    }

    /// A fleet of four shards where unit `hot` holds 300 of 400 items, all on shard 0.
    fn skewed() -> (Vec<UnitView>, Vec<ItemView>) {
        let mut units = vec![unit("hot", Some(0))];
        let mut items = Vec::new();
        for i in 0..300 {
            items.push(ItemView {
                key: ObjectKey::new("fleet", format!("hot-{i}")),
                uid: format!("6b1c{i:04}-00aa-4c1e-9f00-{:012x}", i * 7919),
                unit: ObjectKey::new("fleet", "hot"),
                shard: None,
                unit_token: Some(unit_token("fleet", "hot")),
            });
        }
        for c in 0..4 {
            units.push(unit(&format!("c{c}"), Some(c)));
            for i in 0..25 {
                items.push(ItemView {
                    key: ObjectKey::new("fleet", format!("c{c}-{i}")),
                    uid: format!("0d5e{c:02}{i:02}-11bb-4d2f-8e11-{:012x}", i * 104_729),
                    unit: ObjectKey::new("fleet", format!("c{c}")),
                    shard: None,
                    unit_token: Some(unit_token("fleet", &format!("c{c}"))),
                });
            }
        }
        (units, items)
    }

    #[test]
    fn a_hot_cluster_is_cut_moved_in_halves_and_then_left_alone() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let slicing = SliceConfig::enabled();
        let (mut units, mut items) = skewed();
        let members = members(4, &[0, 1, 2, 3]);
        let mut passes = 0;
        // Passes without memory, as the planner's periodic ones: each may spend the move budget
        // while the fleet is above its target balance.
        loop {
            let p = plan(&config, &slicing, &units, &items, &members, None).unwrap();
            if p.unit_actions.is_empty() && p.item_labels.is_empty() {
                break;
            }
            apply(&mut units, &mut items, &p);
            passes += 1;
            assert!(passes < 20, "no convergence: {units:#?}");
        }
        let hot = &units[0];
        assert!(hot.cut, "the hot unit is cut: {hot:#?}");
        let shards: std::collections::BTreeSet<ShardId> =
            hot.slices.iter().filter_map(|s| s.record.owner).collect();
        assert!(shards.len() >= 3, "spread over shards: {hot:#?}");
        // Its records tile the key space, and each names the live holder of its shard.
        let ranges: Vec<KeyRange> = hot.slices.iter().map(|s| s.range).collect();
        assert!(Slicing::default().with("hot", ranges).is_some());
        for s in &hot.slices {
            assert_eq!(s.record.holder, s.record.owner.map(holder));
            assert_eq!(s.record.drain_to, None);
        }
        // Every item's slice has an owner, and no item has had a label written: they follow
        // their slices by their unit's token. The busiest shard is near the mean.
        let mut per_shard = BTreeMap::new();
        for item in &items {
            let c = units.iter().find(|c| c.key == item.unit).unwrap();
            let key = app_key(&item.uid);
            let owner = c
                .records()
                .iter()
                .find(|r| r.range.contains(key))
                .and_then(|r| r.record.owner);
            assert!(owner.is_some(), "{}", item.key);
            assert_eq!(item.shard, None, "{}", item.key);
            *per_shard.entry(owner).or_insert(0u64) += 1;
        }
        let max = per_shard.values().copied().max().unwrap();
        assert!(max <= 115, "max {max} of a mean of 100: {per_shard:?}");
        // A planner that takes over moves nothing either. Its memory weighs each slice of the
        // hot unit by the apps in the slice's range, which add up to the unit's.
        let takeover = PlanMemory::of_current(&units, &items, &members);
        let hot_apps: Vec<u64> = items
            .iter()
            .filter(|i| i.unit == hot.key)
            .map(|i| app_key(&i.uid))
            .collect();
        for s in &hot.slices {
            let inside = hot_apps.iter().filter(|k| s.range.contains(**k)).count() as u64;
            assert_eq!(
                takeover.loads.get(&slice_id(&hot.uid, s.range)),
                Some(&inside),
                "{:?}",
                s.range
            );
        }
        assert_eq!(takeover.shards, members.live());
        // The hot unit loses a quarter of its apps but stays heavy: its standing cut stays
        // (a fresh halving of what is left would be coarser), and no slice is made or retired.
        let fewer: Vec<ItemView> = items
            .iter()
            .enumerate()
            .filter(|(n, i)| i.unit != hot.key || n % 4 != 0)
            .map(|(_, i)| i.clone())
            .collect();
        let p = plan(&config, &slicing, &units, &fewer, &members, Some(&takeover)).unwrap();
        assert!(
            p.unit_actions.iter().all(|(key, action)| *key != hot.key
                || !matches!(
                    action,
                    SliceAction::Create { .. } | SliceAction::Retire { .. }
                )),
            "{:?}",
            p.unit_actions
        );
        let p = plan(&config, &slicing, &units, &items, &members, Some(&takeover)).unwrap();
        assert!(p.unit_actions.is_empty(), "{:?}", p.unit_actions);
        assert!(p.item_labels.is_empty());
    }

    /// The first pass of sticky-balanced over the skewed fleet on four shards.
    fn first_pass(slicing: SliceConfig) -> Plan {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let (units, items) = skewed();
        plan(
            &config,
            &slicing,
            &units,
            &items,
            &members(4, &[0, 1, 2, 3]),
            None,
        )
        .unwrap()
    }

    #[test]
    fn slicing_off_places_the_hot_cluster_whole() {
        let p = first_pass(SliceConfig::disabled());
        assert!(
            p.unit_actions
                .iter()
                .all(|(_, a)| a.range() == KeyRange::WHOLE)
        );
        assert!(p.layouts.values().all(|l| l.len() == 1));
    }

    #[test]
    fn a_split_names_where_each_half_goes_and_apps_wait_for_it() {
        let p = first_pass(SliceConfig::enabled());
        let creates: Vec<&SliceAction> = p
            .unit_actions
            .iter()
            .filter(|(k, _)| k.name == "hot")
            .map(|(_, a)| a)
            .collect();
        assert!(creates.len() >= 2, "{creates:?}");
        for action in &creates {
            let SliceAction::Create { owner, .. } = action else {
                panic!("a split only creates at first: {action:?}");
            };
            assert_eq!(*owner, Some((0, holder(0))), "created on the owner");
        }
        assert!(
            creates.iter().any(|a| matches!(
                a,
                SliceAction::Create {
                    drain_to: Some(_),
                    ..
                }
            )),
            "some half is headed elsewhere"
        );
        // Nobody has moved yet, so no item of the hot unit changes label.
        assert!(
            p.item_labels
                .iter()
                .all(|l| !l.item.name.starts_with("hot"))
        );
    }
}
