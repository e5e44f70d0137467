//! The owner's gate: one handoff state machine per unit this term has seen, as synchronous
//! state. Watch events feed it unit records; workers ask it before each reconcile and tell it
//! after; its answers say what to write (a drain acknowledgement) and what to forget.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use shardwise_handoff::drain::{ClusterRecord, OwnerEffect, OwnerId, OwnerMachine};
use shardwise_handoff::plan::ObjectKey;

/// What feeding a unit's record to the gate changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    /// What the owner must do now.
    pub effect: Option<OwnerEffect>,
    /// Work on the unit may start, and could not before.
    pub activated: bool,
    /// Work on the unit may start.
    pub active: bool,
    /// The unit is no longer this term's at all: everything kept for it can go.
    pub removed: bool,
}

/// The handoff state machines of one term's units.
#[derive(Debug)]
pub struct Gate {
    me: OwnerId,
    machines: Mutex<BTreeMap<ObjectKey, OwnerMachine>>,
}

impl Gate {
    pub fn new(me: OwnerId) -> Self {
        Self {
            me,
            machines: Mutex::new(BTreeMap::new()),
        }
    }

    fn machines(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, OwnerMachine>> {
        self.machines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Feeds the unit's placement record (`None`: the unit is gone).
    pub fn observe(&self, unit: &ObjectKey, record: Option<&ClusterRecord>) -> Observed {
        let mut machines = self.machines();
        let machine = machines.entry(unit.clone()).or_default();
        let was_active = machine.may_start();
        let effect = machine.observe(self.me, record);
        let active = machine.may_start();
        let removed = machine.state().is_none();
        if removed {
            machines.remove(unit);
        }
        Observed {
            effect,
            activated: active && !was_active,
            active,
            removed,
        }
    }

    /// Admits one reconcile of work that belongs to `unit`.
    pub fn begin(&self, unit: &ObjectKey) -> bool {
        self.machines()
            .get_mut(unit)
            .is_some_and(OwnerMachine::begin)
    }

    /// Ends a reconcile that [`begin`](Self::begin) admitted.
    pub fn end(&self, unit: &ObjectKey) -> Option<OwnerEffect> {
        self.machines().get_mut(unit).and_then(OwnerMachine::end)
    }

    /// The acknowledgement of `epoch`'s release was written.
    pub fn ack_written(&self, unit: &ObjectKey, epoch: u64) {
        if let Some(machine) = self.machines().get_mut(unit) {
            machine.ack_written(epoch);
        }
    }

    /// The acknowledgement could not be written; it is written again at the next record.
    pub fn ack_failed(&self, unit: &ObjectKey) {
        if let Some(machine) = self.machines().get_mut(unit) {
            machine.ack_failed();
        }
    }

    /// Whether the unit has a machine here at all (it may be draining or released).
    pub fn knows(&self, unit: &ObjectKey) -> bool {
        self.machines().contains_key(unit)
    }

    /// Units known here.
    pub fn units(&self) -> BTreeSet<ObjectKey> {
        self.machines().keys().cloned().collect()
    }

    /// Units on which work may start.
    pub fn active(&self) -> usize {
        self.machines().values().filter(|m| m.may_start()).count()
    }

    /// Reconciles admitted and not yet ended, over all units.
    pub fn in_flight(&self) -> u32 {
        self.machines().values().map(OwnerMachine::in_flight).sum()
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

    fn assigned(shard: u32, incarnation: u64, epoch: u64) -> ClusterRecord {
        ClusterRecord {
            owner: Some(shard),
            holder: Some(Incarnation(incarnation)),
            epoch,
            ..Default::default()
        }
    }

    #[test]
    fn only_units_stamped_with_this_term_admit_work() {
        let gate = Gate::new(ME);
        let mine = gate.observe(&key("a"), Some(&assigned(1, 7, 1)));
        assert!(mine.activated && mine.active && !mine.removed);
        assert!(gate.begin(&key("a")));
        // The right shard, but a previous incarnation's stamp.
        let stale = gate.observe(&key("b"), Some(&assigned(1, 6, 1)));
        assert!(!stale.active);
        assert!(!gate.begin(&key("b")));
        // Another shard's unit is not kept at all.
        let other = gate.observe(&key("c"), Some(&assigned(2, 9, 1)));
        assert!(other.removed && !gate.knows(&key("c")));
        assert_eq!(gate.active(), 1);
        assert_eq!(gate.in_flight(), 1);
        assert_eq!(gate.end(&key("a")), None);
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn a_drain_is_acknowledged_once_work_has_stopped() {
        let gate = Gate::new(ME);
        gate.observe(&key("a"), Some(&assigned(1, 7, 3)));
        assert!(gate.begin(&key("a")));
        let draining = ClusterRecord {
            drain_to: Some(2),
            ..assigned(1, 7, 3)
        };
        let observed = gate.observe(&key("a"), Some(&draining));
        // Still in flight: nothing to write yet, and no new work.
        assert_eq!(observed.effect, None);
        assert!(!gate.begin(&key("a")));
        assert_eq!(
            gate.end(&key("a")),
            Some(OwnerEffect::WriteAck { epoch: 3 })
        );
        gate.ack_written(&key("a"), 3);
        assert!(!gate.begin(&key("a")));
        // Deleted: gone from the gate.
        assert!(gate.observe(&key("a"), None).removed);
        assert!(gate.units().is_empty());
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
