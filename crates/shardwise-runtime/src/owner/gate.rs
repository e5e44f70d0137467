//! The owner's gate: one handoff state machine per record this term has seen (a unit's, or one
//! slice's of a cut unit), as synchronous state. Watch events feed it records; workers ask it
//! before each reconcile and tell it after; its answers say what to write (a drain
//! acknowledgement) and what to forget.
//!
//! Work on an item is admitted under the deepest record containing the item's key
//! ([`shardwise_handoff::slices::deepest`]), work on a unit under the one containing key 0: of a
//! cut unit, the owner of the slice holding key 0 alone reconciles (and reports on) the unit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use shard_assign::KeyRange;
use shardwise_handoff::drain::{OwnerEffect, OwnerId, OwnerMachine, OwnerState, UnitRecord};
use shardwise_handoff::plan::{ObjectKey, RecordKey};
use shardwise_handoff::slices::deepest;

/// The key whose slice's owner reconciles the unit itself.
pub const UNIT_KEY: u64 = 0;

/// What feeding a record to the gate changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    /// What the owner must do now.
    pub effect: Option<OwnerEffect>,
    /// Work under the record may start, and could not before.
    pub activated: bool,
    /// Work under the record may start.
    pub active: bool,
    /// The record is no longer this term's at all.
    pub removed: bool,
    /// No record of the unit is this term's any more: everything kept for it can go.
    pub unit_removed: bool,
}

type Machines = BTreeMap<ObjectKey, BTreeMap<KeyRange, OwnerMachine>>;

/// The handoff state machines of one term's records.
#[derive(Debug)]
pub struct Gate {
    me: OwnerId,
    machines: Mutex<Machines>,
}

impl Gate {
    pub fn new(me: OwnerId) -> Self {
        Self {
            me,
            machines: Mutex::new(BTreeMap::new()),
        }
    }

    fn machines(&self) -> MutexGuard<'_, Machines> {
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Feeds the record of `range` of `unit` (`None`: it is gone, or no longer this shard's).
    pub fn observe(
        &self,
        unit: &ObjectKey,
        range: KeyRange,
        record: Option<&UnitRecord>,
    ) -> Observed {
        let mut machines = self.machines();
        let ranges = machines.entry(unit.clone()).or_default();
        let machine = ranges.entry(range).or_default();
        let was_active = machine.may_start();
        let effect = machine.observe(self.me, record);
        let active = machine.may_start();
        let removed = machine.state().is_none();
        if removed {
            ranges.remove(&range);
        }
        let unit_removed = ranges.is_empty();
        if unit_removed {
            machines.remove(unit);
        }
        Observed {
            effect,
            activated: active && !was_active,
            active,
            removed,
            unit_removed,
        }
    }

    /// The record work on `key` of `unit` is admitted under: the deepest this term knows.
    pub fn record_for(&self, unit: &ObjectKey, key: u64) -> Option<KeyRange> {
        let machines = self.machines();
        deepest(machines.get(unit)?.keys().copied(), key)
    }

    /// Admits one reconcile of work on `key` of `unit`: the range it was admitted under.
    pub fn begin(&self, unit: &ObjectKey, key: u64) -> Option<KeyRange> {
        let mut machines = self.machines();
        let ranges = machines.get_mut(unit)?;
        let range = deepest(ranges.keys().copied(), key)?;
        let machine = ranges.get_mut(&range)?;
        let handed_over = matches!(machine.state(), Some(OwnerState::Released { .. }));
        (machine.begin()
            || handed_over
                && crate::failpoints::seeded(crate::failpoints::KEEP_WORKING_AFTER_HANDOVER))
        .then_some(range)
    }

    /// Ends a reconcile that [`begin`](Self::begin) admitted under `range`.
    pub fn end(&self, unit: &ObjectKey, range: KeyRange) -> Option<OwnerEffect> {
        self.machines()
            .get_mut(unit)
            .and_then(|r| r.get_mut(&range))
            .and_then(OwnerMachine::end)
    }

    /// The acknowledgement of `epoch`'s release was written.
    pub fn ack_written(&self, unit: &ObjectKey, range: KeyRange, epoch: u64) {
        if let Some(machine) = self
            .machines()
            .get_mut(unit)
            .and_then(|r| r.get_mut(&range))
        {
            machine.ack_written(epoch);
        }
    }

    /// The acknowledgement could not be written; it is written again at the next record.
    pub fn ack_failed(&self, unit: &ObjectKey, range: KeyRange) {
        if let Some(machine) = self
            .machines()
            .get_mut(unit)
            .and_then(|r| r.get_mut(&range))
        {
            machine.ack_failed();
        }
    }

    /// Whether the unit has a record here at all (it may be draining or released).
    pub fn knows(&self, unit: &ObjectKey) -> bool {
        self.machines().contains_key(unit)
    }

    /// Whether this term reconciles the unit itself: it knows the record containing key 0.
    pub fn reports_on(&self, unit: &ObjectKey) -> bool {
        self.record_for(unit, UNIT_KEY).is_some()
    }

    /// Units known here.
    pub fn units(&self) -> BTreeSet<ObjectKey> {
        self.machines().keys().cloned().collect()
    }

    /// The ranges of `unit` known here.
    pub fn ranges(&self, unit: &ObjectKey) -> Vec<KeyRange> {
        self.machines()
            .get(unit)
            .map(|r| r.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The ranges of `unit` on which work may start.
    pub fn active_ranges(&self, unit: &ObjectKey) -> Vec<KeyRange> {
        self.machines().get(unit).map_or_else(Vec::new, |r| {
            r.iter()
                .filter(|(_, m)| m.may_start())
                .map(|(range, _)| *range)
                .collect()
        })
    }

    /// Every record known here (owned, draining or released), as the planner names them.
    pub fn records(&self) -> BTreeSet<RecordKey> {
        self.machines()
            .iter()
            .flat_map(|(unit, ranges)| {
                ranges.keys().map(|&range| RecordKey {
                    unit: unit.clone(),
                    range,
                })
            })
            .collect()
    }

    /// Units with at least one record on which work may start.
    pub fn active(&self) -> usize {
        self.machines()
            .values()
            .filter(|r| r.values().any(OwnerMachine::may_start))
            .count()
    }

    /// Records of slices of cut units on which work may start.
    pub fn active_slices(&self) -> usize {
        self.machines()
            .values()
            .flat_map(|r| r.iter())
            .filter(|(range, m)| **range != KeyRange::WHOLE && m.may_start())
            .count()
    }

    /// Reconciles admitted and not yet ended, over all records.
    pub fn in_flight(&self) -> u32 {
        self.machines()
            .values()
            .flat_map(|r| r.values())
            .map(OwnerMachine::in_flight)
            .sum()
    }
}

/// Keys a worker took from its queue while the cache did not have the object. The reflector
/// shows a (re)list to the cache only at its end, so a key queued from a listed object can
/// reach a worker before its object does; the end of the list queues these keys again.
#[derive(Debug, Default)]
pub struct Misses(Mutex<BTreeSet<ObjectKey>>);

impl Misses {
    fn keys(&self) -> MutexGuard<'_, BTreeSet<ObjectKey>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `lookup(key)`, noting the key when it finds nothing. The lock spans the lookup, so a
    /// note cannot fall between the cache catching up and [`take`](Self::take).
    pub fn lookup<T>(
        &self,
        key: &ObjectKey,
        lookup: impl FnOnce(&ObjectKey) -> Option<T>,
    ) -> Option<T> {
        let mut missing = self.keys();
        let found = lookup(key);
        if found.is_none() {
            missing.insert(key.clone());
        }
        found
    }

    /// The keys noted so far; called once the cache has caught up.
    pub fn take(&self) -> BTreeSet<ObjectKey> {
        std::mem::take(&mut *self.keys())
    }

    /// Notes `keys` again: taken, but not found yet.
    pub fn restore(&self, keys: BTreeSet<ObjectKey>) {
        self.keys().extend(keys);
    }
}

#[cfg(test)]
mod tests {
    use shardwise_handoff::drain::Incarnation;

    use super::*;

    const ME: OwnerId = OwnerId {
        shard: 1,
        incarnation: Incarnation(7),
    };

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("fleet", name)
    }

    fn assigned(shard: u32, incarnation: u64, epoch: u64) -> UnitRecord {
        UnitRecord {
            owner: Some(shard),
            holder: Some(Incarnation(incarnation)),
            epoch,
            ..Default::default()
        }
    }

    const W: KeyRange = KeyRange::WHOLE;
    const HIGH_KEY: u64 = 0xc000_0000_0000_0000;

    #[test]
    fn only_units_stamped_with_this_term_admit_work() {
        let gate = Gate::new(ME);
        let mine = gate.observe(&key("a"), W, Some(&assigned(1, 7, 1)));
        assert!(mine.activated && mine.active && !mine.removed);
        assert_eq!(gate.begin(&key("a"), 5), Some(W));
        // The right shard, but a previous incarnation's stamp.
        let stale = gate.observe(&key("b"), W, Some(&assigned(1, 6, 1)));
        assert!(!stale.active);
        assert_eq!(gate.begin(&key("b"), 5), None);
        // Another shard's unit is not kept at all.
        let other = gate.observe(&key("c"), W, Some(&assigned(2, 9, 1)));
        assert!(other.removed && other.unit_removed && !gate.knows(&key("c")));
        assert_eq!(gate.active(), 1);
        assert_eq!(gate.in_flight(), 1);
        assert_eq!(gate.end(&key("a"), W), None);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn a_drain_is_acknowledged_once_work_has_stopped() {
        let gate = Gate::new(ME);
        gate.observe(&key("a"), W, Some(&assigned(1, 7, 3)));
        assert!(gate.begin(&key("a"), 1).is_some());
        let draining = UnitRecord {
            drain_to: Some(2),
            ..assigned(1, 7, 3)
        };
        let observed = gate.observe(&key("a"), W, Some(&draining));
        // Still in flight: nothing to write yet, and no new work.
        assert_eq!(observed.effect, None);
        assert_eq!(gate.begin(&key("a"), 1), None);
        assert_eq!(
            gate.end(&key("a"), W),
            Some(OwnerEffect::WriteAck { epoch: 3 })
        );
        gate.ack_written(&key("a"), W, 3);
        assert_eq!(
            gate.begin(&key("a"), 1),
            None,
            "a record handed over (its drain acknowledged) admitted work"
        );
        // Deleted: gone from the gate.
        assert!(gate.observe(&key("a"), W, None).unit_removed);
        assert!(gate.units().is_empty());
    }

    #[test]
    fn work_goes_under_the_deepest_record_and_the_unit_under_key_zero() {
        let gate = Gate::new(ME);
        let (low, high) = W.halves().unwrap();
        gate.observe(&key("a"), W, Some(&assigned(1, 7, 1)));
        gate.observe(&key("a"), high, Some(&assigned(1, 7, 2)));
        // A split under way: the half takes new work at once, the rest stays with the whole.
        assert_eq!(gate.begin(&key("a"), HIGH_KEY), Some(high));
        assert_eq!(gate.begin(&key("a"), 1), Some(W));
        assert!(gate.reports_on(&key("a")));
        // The whole is retired: nothing new under it, and its drain waits for its own work.
        let retiring = UnitRecord {
            drain_to: Some(1),
            ..assigned(1, 7, 1)
        };
        assert_eq!(gate.observe(&key("a"), W, Some(&retiring)).effect, None);
        assert_eq!(gate.begin(&key("a"), 2), None);
        assert_eq!(
            gate.end(&key("a"), W),
            Some(OwnerEffect::WriteAck { epoch: 1 })
        );
        // The whole is deleted; the low half went to another shard: only the high half is here.
        let gone = gate.observe(&key("a"), W, None);
        assert!(gone.removed && !gone.unit_removed);
        assert!(!gate.reports_on(&key("a")), "key 0 is in the low half");
        assert_eq!(gate.ranges(&key("a")), [high]);
        assert_eq!(
            gate.records(),
            BTreeSet::from([RecordKey {
                unit: key("a"),
                range: high
            }])
        );
        assert_eq!(gate.active_slices(), 1);
        assert_eq!(gate.begin(&key("a"), 1), None, "the low half is not ours");
        gate.end(&key("a"), high);
        let other = gate.observe(&key("a"), low, Some(&assigned(2, 9, 2)));
        assert!(other.removed && !other.unit_removed);
        assert!(gate.observe(&key("a"), high, None).unit_removed);
    }

    #[test]
    fn misses_note_only_what_the_cache_did_not_have() {
        let misses = Misses::default();
        assert_eq!(misses.lookup(&key("a"), |_| None::<u32>), None);
        assert_eq!(misses.lookup(&key("b"), |_| Some(7)), Some(7));
        assert_eq!(misses.lookup(&key("a"), |_| None::<u32>), None);
        assert_eq!(misses.take(), BTreeSet::from([key("a")]));
        // Taken once: the next list end has nothing to queue again.
        assert!(misses.take().is_empty());
    }
}
