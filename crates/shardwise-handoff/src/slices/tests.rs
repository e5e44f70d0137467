//! Splits and merges with cooperative owners, and a randomized model of planner, owners,
//! restarts, partitions (undelivered watches, unwritten acknowledgements), fencing and recuts
//! that checks, per item: never do two replicas work on it at once, it always has a slice, and
//! a calm period brings every slice to its owner.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::drain::tests::apply;
use crate::drain::{OwnerEffect, OwnerId, OwnerMachine};

fn range(depth: u8, index: u64) -> KeyRange {
    KeyRange::new(depth, index).expect("a valid range")
}

/// Desired cuts and shards the planner switches between: whole, halves, quarters and mixes.
fn layouts() -> Vec<Vec<(KeyRange, ShardId)>> {
    let (w, l, h) = (KeyRange::WHOLE, range(1, 0), range(1, 1));
    let (ll, lh, hl, hh) = (range(2, 0), range(2, 1), range(2, 2), range(2, 3));
    vec![
        vec![(w, 0)],
        vec![(w, 1)],
        vec![(l, 0), (h, 1)],
        vec![(l, 1), (h, 0)],
        vec![(l, 0), (h, 0)],
        vec![(l, 0), (hl, 1), (hh, 0)],
        vec![(ll, 1), (lh, 0), (h, 1)],
        vec![(ll, 0), (lh, 1), (hl, 0), (hh, 1)],
    ]
}

/// One item in each quarter of the key space.
const ITEMS: [u64; 4] = [
    0x1000_0000_0000_0000,
    0x5000_0000_0000_0000,
    0x9000_0000_0000_0000,
    0xd000_0000_0000_0000,
];

#[derive(Clone, Copy, Debug)]
enum Event {
    Upsert(KeyRange, UnitRecord),
    Remove(KeyRange),
}

#[derive(Clone, Debug)]
struct Replica {
    shard: ShardId,
    incarnation: Incarnation,
    running: bool,
    /// Watch events not delivered yet, in order (a partition delays them).
    inbox: Vec<Event>,
    view: BTreeMap<KeyRange, UnitRecord>,
    machines: BTreeMap<KeyRange, OwnerMachine>,
    /// Work in flight: the item and the record it was admitted under.
    in_flight: Vec<(usize, KeyRange)>,
    /// Acknowledgements to write: the record and its epoch.
    acks: Vec<(KeyRange, u64)>,
}

impl Replica {
    fn me(&self) -> OwnerId {
        OwnerId {
            shard: self.shard,
            incarnation: self.incarnation,
        }
    }

    fn reset(&mut self) {
        self.view.clear();
        self.machines.clear();
        self.in_flight.clear();
        self.acks.clear();
    }

    fn effect(&mut self, range: KeyRange, effect: Option<OwnerEffect>) {
        if let Some(OwnerEffect::WriteAck { epoch }) = effect {
            self.acks.push((range, epoch));
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The planner's desired layout changes (a re-plan that cuts or merges).
    Retarget(usize),
    /// A planning pass toward the current layout, on the planner's view of the leases.
    Decide,
    /// A whole pass: decide, then write everything decided.
    Pass,
    WriteNext,
    PlannerSees(usize),
    Deliver(usize),
    /// Every event waiting for the replica, in order.
    DeliverAll(usize),
    Begin(usize, usize),
    End(usize),
    WriteAck(usize),
    Fence(usize),
    Expire(usize),
    Stop(usize),
    Restart(usize),
}

/// A planner write and the version of the record it was decided on (`None`: must not exist).
type Write = (SliceAction, Option<u64>);

#[derive(Clone, Debug)]
struct World {
    /// The records on the API server, with a version bumped on every write.
    server: BTreeMap<KeyRange, (UnitRecord, u64)>,
    version: u64,
    replicas: Vec<Replica>,
    leases: Vec<Option<Incarnation>>,
    seen: Vec<Option<Incarnation>>,
    /// Decided, not written yet: written one at a time, so a pass can stop half way.
    pending: Vec<Write>,
    /// The layout the planner works toward.
    target: usize,
}

impl World {
    fn new() -> Self {
        let replicas: Vec<Replica> = (0..2u32)
            .map(|shard| Replica {
                shard,
                incarnation: Incarnation(u64::from(shard) * 1000),
                running: true,
                inbox: Vec::new(),
                view: BTreeMap::new(),
                machines: BTreeMap::new(),
                in_flight: Vec::new(),
                acks: Vec::new(),
            })
            .collect();
        let mut world = Self {
            server: BTreeMap::new(),
            version: 0,
            leases: replicas.iter().map(|r| Some(r.incarnation)).collect(),
            seen: vec![None, None],
            replicas,
            pending: Vec::new(),
            target: 0,
        };
        // The unit before any cut: one unassigned record.
        world.set(KeyRange::WHOLE, Some(UnitRecord::default()));
        world
    }

    fn set(&mut self, range: KeyRange, record: Option<UnitRecord>) {
        self.version += 1;
        let event = match record {
            Some(record) => {
                self.server.insert(range, (record, self.version));
                Event::Upsert(range, record)
            }
            None => {
                self.server.remove(&range);
                Event::Remove(range)
            }
        };
        for replica in &mut self.replicas {
            replica.inbox.push(event);
        }
    }

    fn records(&self) -> Vec<SliceRecord> {
        self.server
            .iter()
            .map(|(&range, &(record, _))| SliceRecord { range, record })
            .collect()
    }

    /// Replicas with work in flight on `item`.
    fn working_on(&self, item: usize) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.in_flight.iter().any(|&(a, _)| a == item))
            .count()
    }

    fn write(&mut self, (action, base): Write) {
        let range = action.range();
        let current = self.server.get(&range).copied();
        // The precondition: the version decided on (or absence, for a create).
        if current.map(|(_, v)| v) != base {
            return;
        }
        let record = current.map(|(r, _)| r);
        match (action, record) {
            (
                SliceAction::Create {
                    owner,
                    epoch,
                    drain_to,
                    ..
                },
                None,
            ) => {
                let record = UnitRecord {
                    owner: owner.map(|o| o.0),
                    holder: owner.map(|o| o.1),
                    epoch,
                    drain_to,
                    drained_epoch: None,
                };
                self.set(range, Some(record));
            }
            (SliceAction::Retire { .. }, Some(mut record)) => {
                record.drain_to = record.owner;
                self.set(range, Some(record));
            }
            (SliceAction::Delete { .. }, Some(_)) => self.set(range, None),
            (SliceAction::Place { action, .. }, Some(mut record)) => {
                apply(&mut record, action);
                self.set(range, Some(record));
            }
            _ => {}
        }
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Retarget(layout) => self.target = layout,
            Step::Decide => {
                let seen = self.seen.clone();
                let actions = slice_actions(&self.records(), &layouts()[self.target], |s| {
                    seen[s as usize]
                });
                self.pending = actions
                    .into_iter()
                    .map(|action| {
                        let base = self.server.get(&action.range()).map(|&(_, v)| v);
                        (action, base)
                    })
                    .collect();
            }
            Step::Pass => {
                self.step(Step::Decide);
                while !self.pending.is_empty() {
                    self.step(Step::WriteNext);
                }
            }
            Step::DeliverAll(i) => {
                while self.replicas[i].running && !self.replicas[i].inbox.is_empty() {
                    self.step(Step::Deliver(i));
                }
            }
            Step::WriteNext => {
                if !self.pending.is_empty() {
                    let write = self.pending.remove(0);
                    self.write(write);
                }
            }
            Step::PlannerSees(i) => self.seen[i] = self.leases[i],
            Step::Deliver(i) => {
                let r = &mut self.replicas[i];
                if !r.running || r.inbox.is_empty() {
                    return;
                }
                let me = r.me();
                match r.inbox.remove(0) {
                    Event::Upsert(range, record) => {
                        r.view.insert(range, record);
                        let effect = r
                            .machines
                            .entry(range)
                            .or_default()
                            .observe(me, Some(&record));
                        r.effect(range, effect);
                    }
                    Event::Remove(range) => {
                        r.view.remove(&range);
                        let effect = r.machines.entry(range).or_default().observe(me, None);
                        r.effect(range, effect);
                    }
                }
            }
            Step::Begin(i, item) => {
                let r = &mut self.replicas[i];
                if !r.running {
                    return;
                }
                let Some(range) = deepest(r.view.keys().copied(), ITEMS[item]) else {
                    return;
                };
                if r.machines.entry(range).or_default().begin() {
                    r.in_flight.push((item, range));
                }
            }
            Step::End(i) => {
                let r = &mut self.replicas[i];
                if r.in_flight.is_empty() {
                    return;
                }
                let (_, range) = r.in_flight.remove(0);
                let effect = r.machines.entry(range).or_default().end();
                r.effect(range, effect);
            }
            Step::WriteAck(i) => {
                if !self.replicas[i].running || self.replicas[i].acks.is_empty() {
                    return;
                }
                let (range, epoch) = self.replicas[i].acks.remove(0);
                let shard = self.replicas[i].shard;
                match self.server.get(&range).copied() {
                    Some((mut record, _))
                        if record.owner == Some(shard) && record.epoch == epoch =>
                    {
                        record.drained_epoch = Some(epoch);
                        self.set(range, Some(record));
                        if let Some(m) = self.replicas[i].machines.get_mut(&range) {
                            m.ack_written(epoch);
                        }
                    }
                    _ => {
                        if let Some(m) = self.replicas[i].machines.get_mut(&range) {
                            m.ack_failed();
                        }
                    }
                }
            }
            Step::Fence(i) => {
                // Renew deadline passed: work cancelled, state dropped; the lease stays valid
                // on the server until it expires.
                let r = &mut self.replicas[i];
                r.running = false;
                r.reset();
            }
            Step::Expire(i) => {
                if !self.replicas[i].running {
                    self.leases[i] = None;
                }
            }
            Step::Stop(i) => {
                let r = &mut self.replicas[i];
                r.running = false;
                r.reset();
                self.leases[i] = None;
            }
            Step::Restart(i) => {
                if self.replicas[i].running || self.leases[i].is_some() {
                    return;
                }
                let listed: Vec<Event> = self
                    .server
                    .iter()
                    .map(|(&range, &(record, _))| Event::Upsert(range, record))
                    .collect();
                let r = &mut self.replicas[i];
                r.incarnation = Incarnation(r.incarnation.0 + 1);
                r.running = true;
                r.inbox = listed;
                self.leases[i] = Some(r.incarnation);
            }
        }
    }

    /// Everything delivered, written and finished, until the layout holds (or `rounds` pass).
    fn settle(&mut self, layout: usize, rounds: usize) {
        for _ in 0..rounds {
            for i in 0..self.replicas.len() {
                self.step(Step::PlannerSees(i));
            }
            self.step(Step::Retarget(layout));
            self.step(Step::Decide);
            while !self.pending.is_empty() {
                self.step(Step::WriteNext);
            }
            for i in 0..self.replicas.len() {
                while !self.replicas[i].inbox.is_empty() && self.replicas[i].running {
                    self.step(Step::Deliver(i));
                }
                while !self.replicas[i].in_flight.is_empty() {
                    self.step(Step::End(i));
                }
                while !self.replicas[i].acks.is_empty() && self.replicas[i].running {
                    self.step(Step::WriteAck(i));
                }
            }
        }
    }

    /// Whether the records are exactly the layout, each slice on its shard with no drain.
    fn holds(&self, layout: usize) -> bool {
        let want = &layouts()[layout];
        self.server.len() == want.len()
            && want.iter().all(|&(range, shard)| {
                self.server.get(&range).is_some_and(|(r, _)| {
                    r.owner == Some(shard)
                        && r.holder == self.leases[shard as usize]
                        && r.drain_to.is_none()
                })
            })
    }
}

#[test]
fn every_layout_is_reached_from_every_other() {
    for from in 0..layouts().len() {
        for to in 0..layouts().len() {
            let mut world = World::new();
            world.settle(from, 12);
            assert!(world.holds(from), "layout {from}: {:?}", world.server);
            world.settle(to, 12);
            assert!(world.holds(to), "{from} -> {to}: {:?}", world.server);
        }
    }
}

#[test]
fn a_split_creates_both_halves_on_the_owner_before_the_whole_is_retired() {
    let mut world = World::new();
    world.settle(0, 6);
    let holder = world.leases[0];
    let (l, h) = (range(1, 0), range(1, 1));
    world.step(Step::PlannerSees(0));
    world.step(Step::PlannerSees(1));
    world.step(Step::Retarget(2));
    world.step(Step::Decide);
    let creates: Vec<_> = world.pending.iter().map(|(a, _)| *a).collect();
    assert_eq!(
        creates,
        [
            SliceAction::Create {
                range: l,
                owner: Some((0, holder.unwrap())),
                epoch: 2,
                drain_to: None,
            },
            SliceAction::Create {
                range: h,
                owner: Some((0, holder.unwrap())),
                epoch: 2,
                drain_to: Some(1),
            },
        ]
    );
    while !world.pending.is_empty() {
        world.step(Step::WriteNext);
    }
    // Next pass: the whole is covered, so it is retired; nothing moves yet.
    world.step(Step::Decide);
    let actions: Vec<_> = world.pending.iter().map(|(a, _)| *a).collect();
    assert_eq!(
        actions,
        [SliceAction::Retire {
            range: KeyRange::WHOLE
        }]
    );
}

/// The owner started work on an item under the whole unit; the unit is split and the
/// item's half given to shard 1. Shard 1 may start on the item only once that work has ended.
#[test]
fn work_under_a_slice_that_was_cut_ends_before_its_half_moves() {
    use Step::*;
    let mut world = World::new();
    world.settle(0, 6);
    world.step(Begin(0, 2));
    world.step(Retarget(2));
    for _ in 0..6 {
        world.step(Decide);
        while !world.pending.is_empty() {
            world.step(WriteNext);
        }
        for i in 0..2 {
            while !world.replicas[i].inbox.is_empty() {
                world.step(Deliver(i));
            }
            while !world.replicas[i].acks.is_empty() {
                world.step(WriteAck(i));
            }
        }
        world.step(Begin(1, 2));
        assert!(world.working_on(2) <= 1, "{world:?}");
    }
    assert_eq!(world.replicas[1].in_flight, [], "shard 1 waits");
    world.step(End(0));
    world.settle(2, 6);
    assert!(world.holds(2), "{:?}", world.server);
    world.step(Begin(1, 2));
    assert_eq!(world.working_on(2), 1);
}

#[test]
fn a_slice_of_a_dead_owner_is_cut_unassigned_and_then_placed() {
    let mut world = World::new();
    world.settle(0, 6);
    world.step(Step::Stop(0));
    world.settle(2, 6);
    // Cut without an owner where shard 0 should own it; the half for shard 1 is placed.
    let l = world.server[&range(1, 0)].0;
    assert_eq!((l.owner, l.holder), (None, None));
    assert_eq!(world.server[&range(1, 1)].0.owner, Some(1));
    assert!(!world.server.contains_key(&KeyRange::WHOLE));
    world.step(Step::Restart(0));
    world.settle(2, 6);
    assert!(world.holds(2), "{:?}", world.server);
}

fn step() -> impl Strategy<Value = Step> {
    let who = 0usize..2;
    prop_oneof![
        1 => (0..layouts().len()).prop_map(Step::Retarget),
        1 => Just(Step::Decide),
        3 => Just(Step::Pass),
        2 => Just(Step::WriteNext),
        2 => who.clone().prop_map(Step::PlannerSees),
        2 => who.clone().prop_map(Step::Deliver),
        3 => who.clone().prop_map(Step::DeliverAll),
        3 => (who.clone(), 0..ITEMS.len()).prop_map(|(i, item)| Step::Begin(i, item)),
        1 => who.clone().prop_map(Step::End),
        3 => who.clone().prop_map(Step::WriteAck),
        1 => who.clone().prop_map(Step::Fence),
        1 => who.clone().prop_map(Step::Expire),
        1 => who.clone().prop_map(Step::Stop),
        2 => who.prop_map(Step::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

    #[test]
    fn no_two_replicas_ever_work_on_one_app(
        start in 0..layouts().len(),
        steps in prop::collection::vec(step(), 1..160),
    ) {
        // A settled fleet whose owners are busy on every item they own, so that work started
        // under one cut is still in flight while the next one is made.
        let mut world = World::new();
        world.settle(start, 8);
        for item in 0..ITEMS.len() {
            for i in 0..2 {
                world.step(Step::Begin(i, item));
            }
        }
        for step in steps {
            world.step(step);
            for (item, &key) in ITEMS.iter().enumerate() {
                prop_assert!(world.working_on(item) <= 1, "item {item} after {step:?}: {world:?}");
                // Every item always has a record (a slice that can be given an owner).
                prop_assert!(
                    world.server.keys().any(|r| r.contains(key)),
                    "item {item} has no slice after {step:?}: {world:?}"
                );
            }
        }
        // Whatever happened, a calm period (fenced leases expire, stopped replicas come back)
        // brings every slice to the last layout's owners.
        for i in 0..2 {
            world.step(Step::Expire(i));
            world.step(Step::Restart(i));
        }
        world.settle(7, 16);
        prop_assert!(world.holds(7), "{:?}", world.server);
    }
}
