//! Exhaustive tests of both machines, and a randomized model of planner, owners, watch delays
//! and fencing that checks the safety property itself.

use super::*;

const SHARDS: [ShardId; 3] = [0, 1, 2];

fn records() -> Vec<ClusterRecord> {
    let mut all = Vec::new();
    for owner in [None, Some(0), Some(1), Some(2)] {
        for epoch in [0u64, 3] {
            for drain_to in [None, Some(0), Some(1), Some(2)] {
                let mut drained = vec![None, Some(epoch)];
                if epoch > 0 {
                    drained.push(Some(epoch - 1));
                }
                for drained_epoch in drained {
                    all.push(ClusterRecord {
                        owner,
                        epoch,
                        drain_to,
                        drained_epoch,
                    });
                }
            }
        }
    }
    all
}

fn alive_sets() -> Vec<Vec<ShardId>> {
    (0u8..8)
        .map(|mask| {
            SHARDS
                .iter()
                .copied()
                .filter(|s| mask & (1 << s) != 0)
                .collect()
        })
        .collect()
}

#[test]
fn planner_never_takes_a_cluster_from_a_live_owner_that_has_not_released_it() {
    for record in records() {
        for desired in SHARDS {
            for alive in alive_sets() {
                let action = planner_action(&record, desired, |s| alive.contains(&s));
                let live_holder = record
                    .owner
                    .is_some_and(|o| alive.contains(&o) && !record.released());
                if let PlannerAction::Assign { shard, epoch } = action {
                    assert!(
                        !live_holder,
                        "{record:?} desired {desired} alive {alive:?}: {action:?}"
                    );
                    assert_eq!(shard, desired);
                    assert_eq!(epoch, record.epoch + 1, "every relabel bumps the epoch");
                }
            }
        }
    }
}

#[test]
fn planner_decisions_table() {
    let all = |_| true;
    let rec = |owner, drain_to, drained_epoch| ClusterRecord {
        owner,
        epoch: 4,
        drain_to,
        drained_epoch,
    };
    use PlannerAction::*;
    let cases = [
        (rec(None, None, None), 1, Assign { shard: 1, epoch: 5 }),
        (rec(Some(0), None, None), 0, Keep),
        (rec(Some(0), None, None), 1, RequestDrain { to: 1 }),
        (rec(Some(0), Some(1), None), 1, Keep),
        (rec(Some(0), Some(2), None), 1, RequestDrain { to: 1 }),
        (rec(Some(0), Some(1), None), 0, CancelDrain),
        (
            rec(Some(0), Some(1), Some(4)),
            1,
            Assign { shard: 1, epoch: 5 },
        ),
        // Released, and the planner changed its mind back: the owner gets it back, new epoch.
        (
            rec(Some(0), Some(1), Some(4)),
            0,
            Assign { shard: 0, epoch: 5 },
        ),
        // An old acknowledgement does not count.
        (rec(Some(0), Some(1), Some(3)), 1, Keep),
    ];
    for (record, desired, expected) in cases {
        assert_eq!(
            planner_action(&record, desired, all),
            expected,
            "{record:?} -> {desired}"
        );
    }
    // A dead owner's cluster moves at once.
    assert_eq!(
        planner_action(&rec(Some(0), Some(1), None), 1, |s| s != 0),
        Assign { shard: 1, epoch: 5 }
    );
}

/// Applies a planner action to the record, as the API server would.
fn apply(record: &mut ClusterRecord, action: PlannerAction) {
    match action {
        PlannerAction::Keep => {}
        PlannerAction::Assign { shard, epoch } => {
            *record = ClusterRecord {
                owner: Some(shard),
                epoch,
                drain_to: None,
                drained_epoch: None,
            };
        }
        PlannerAction::RequestDrain { to } => record.drain_to = Some(to),
        PlannerAction::CancelDrain => record.drain_to = None,
    }
}

#[test]
fn planner_and_a_cooperative_owner_converge_on_every_desired_shard() {
    for start in records() {
        for desired in SHARDS {
            let mut record = start;
            let mut owners: Vec<OwnerMachine> =
                SHARDS.iter().map(|_| OwnerMachine::new()).collect();
            for _ in 0..10 {
                let action = planner_action(&record, desired, |_| true);
                apply(&mut record, action);
                for shard in SHARDS {
                    let machine = &mut owners[shard as usize];
                    if let Some(OwnerEffect::WriteAck { epoch }) =
                        machine.observe(shard, Some(&record))
                        && record.owner == Some(shard)
                        && record.epoch == epoch
                    {
                        record.drained_epoch = Some(epoch);
                        machine.ack_written(epoch);
                    }
                }
            }
            assert_eq!(record.owner, Some(desired), "from {start:?}");
            assert_eq!(record.drain_to, None, "from {start:?}");
            assert!(
                owners[desired as usize].may_start(),
                "from {start:?}: {:?}",
                owners[desired as usize]
            );
            for other in SHARDS.iter().filter(|&&s| s != desired) {
                assert!(!owners[*other as usize].may_start());
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Observe(Option<ClusterRecord>),
    Begin,
    End,
    AckWritten(u64),
    AckFailed,
}

/// Every sequence of up to four events over a representative alphabet.
#[test]
fn owner_machine_invariants_hold_for_every_event_sequence() {
    let me = 1;
    let mut alphabet: Vec<Event> = records()
        .into_iter()
        .filter(|r| r.epoch == 3 && matches!(r.owner, Some(1) | Some(2)))
        .map(|r| Event::Observe(Some(r)))
        .collect();
    alphabet.push(Event::Observe(Some(ClusterRecord {
        owner: Some(1),
        epoch: 5,
        ..Default::default()
    })));
    alphabet.extend([
        Event::Observe(None),
        Event::Begin,
        Event::End,
        Event::AckWritten(3),
        Event::AckFailed,
    ]);
    let mut sequences: Vec<Vec<Event>> = vec![Vec::new()];
    for _ in 0..4 {
        let mut next = Vec::new();
        for s in &sequences {
            for e in &alphabet {
                let mut longer = s.clone();
                longer.push(*e);
                next.push(longer);
            }
        }
        sequences = next;
    }
    for sequence in sequences {
        let mut m = OwnerMachine::new();
        let mut last: Option<ClusterRecord> = None;
        let mut acked: Option<u64> = None;
        for event in &sequence {
            let effect = match *event {
                Event::Observe(record) => {
                    // The machine ignores views older than one it has seen; so does the check.
                    let stale = matches!((record, last), (Some(r), Some(l))
                        if r.owner == Some(me) && l.owner == Some(me) && r.epoch < l.epoch);
                    if !stale {
                        last = record;
                    }
                    m.observe(me, record.as_ref())
                }
                Event::Begin => {
                    let admitted = m.begin();
                    if admitted {
                        let r = last.expect("work only starts on an observed cluster");
                        assert_eq!(r.owner, Some(me), "{sequence:?}");
                        assert!(r.drain_to.is_none() && !r.released(), "{sequence:?}");
                        assert!(
                            acked.is_none_or(|a| r.epoch > a),
                            "work after ack: {sequence:?}"
                        );
                    }
                    None
                }
                Event::End => {
                    if m.in_flight() == 0 {
                        continue;
                    }
                    m.end()
                }
                Event::AckWritten(epoch) => {
                    m.ack_written(epoch);
                    None
                }
                Event::AckFailed => {
                    m.ack_failed();
                    None
                }
            };
            match effect {
                Some(OwnerEffect::WriteAck { epoch }) => {
                    assert_eq!(m.in_flight(), 0, "ack with work in flight: {sequence:?}");
                    assert!(!m.may_start(), "ack while open: {sequence:?}");
                    acked = Some(epoch);
                }
                Some(OwnerEffect::Forget) => {
                    assert_eq!(m.state(), None);
                    acked = None;
                }
                None => {}
            }
            if m.may_start() {
                assert!(matches!(m.state(), Some(OwnerState::Active { .. })));
            }
        }
    }
}

mod model {
    //! Planner, two owners with delayed watches, reconciles, acknowledgements and fencing, in
    //! random interleavings. Checked: never do both owners have work in flight at once.

    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    struct Owner {
        machine: OwnerMachine,
        /// Versions of the record not yet delivered by the watch, in order.
        inbox: Vec<ClusterRecord>,
        /// Lease state as the owner itself knows it: fenced owners do nothing.
        fenced: bool,
        /// As the planner sees it: expires only after the owner has fenced.
        alive_for_planner: bool,
        pending_ack: Option<u64>,
    }

    #[derive(Clone, Copy, Debug)]
    enum Step {
        Plan(ShardId),
        Deliver(usize),
        Begin(usize),
        End(usize),
        WriteAck(usize),
        Fence(usize),
        Expire(usize),
        Recover(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        let who = 0usize..2;
        prop_oneof![
            (0u32..2).prop_map(Step::Plan),
            who.clone().prop_map(Step::Deliver),
            who.clone().prop_map(Step::Begin),
            who.clone().prop_map(Step::End),
            who.clone().prop_map(Step::WriteAck),
            who.clone().prop_map(Step::Fence),
            who.clone().prop_map(Step::Expire),
            who.prop_map(Step::Recover),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn no_two_owners_ever_work_at_once(steps in prop::collection::vec(step(), 1..80)) {
            let mut record = ClusterRecord::default();
            let mut owners: Vec<Owner> = (0..2)
                .map(|_| Owner {
                    machine: OwnerMachine::new(),
                    inbox: Vec::new(),
                    fenced: false,
                    alive_for_planner: true,
                    pending_ack: None,
                })
                .collect();
            let publish = |record: ClusterRecord, owners: &mut Vec<Owner>| {
                for o in owners.iter_mut() {
                    o.inbox.push(record);
                }
            };
            for step in steps {
                match step {
                    Step::Plan(desired) => {
                        let alive = |s: ShardId| owners[s as usize].alive_for_planner;
                        let action = planner_action(&record, desired, alive);
                        if action != PlannerAction::Keep {
                            apply(&mut record, action);
                            publish(record, &mut owners);
                        }
                    }
                    Step::Deliver(i) => {
                        let o = &mut owners[i];
                        if !o.inbox.is_empty() && !o.fenced {
                            let seen = o.inbox.remove(0);
                            if let Some(OwnerEffect::WriteAck { epoch }) = o.machine.observe(i as u32, Some(&seen)) {
                                o.pending_ack = Some(epoch);
                            }
                        }
                    }
                    Step::Begin(i) => {
                        if !owners[i].fenced {
                            owners[i].machine.begin();
                        }
                    }
                    Step::End(i) => {
                        let o = &mut owners[i];
                        if o.machine.in_flight() > 0
                            && let Some(OwnerEffect::WriteAck { epoch }) = o.machine.end()
                        {
                            o.pending_ack = Some(epoch);
                        }
                    }
                    Step::WriteAck(i) => {
                        if let Some(epoch) = owners[i].pending_ack.take() {
                            // The patch carries the observed resourceVersion: it only lands on
                            // the assignment it acknowledges.
                            if record.owner == Some(i as u32) && record.epoch == epoch {
                                record.drained_epoch = Some(epoch);
                                owners[i].machine.ack_written(epoch);
                                publish(record, &mut owners);
                            } else {
                                owners[i].machine.ack_failed();
                            }
                        }
                    }
                    Step::Fence(i) => {
                        // Renew deadline passed: all work is cancelled and state dropped.
                        let o = &mut owners[i];
                        o.fenced = true;
                        o.machine = OwnerMachine::new();
                        o.pending_ack = None;
                    }
                    Step::Expire(i) => {
                        // The planner may only see the lease expire after the owner fenced.
                        if owners[i].fenced {
                            owners[i].alive_for_planner = false;
                        }
                    }
                    Step::Recover(i) => {
                        // The owner holds its lease again and restarts from a fresh list.
                        let o = &mut owners[i];
                        if o.fenced {
                            o.fenced = false;
                            o.alive_for_planner = true;
                            o.inbox = vec![record];
                        }
                    }
                }
                let working = owners.iter().filter(|o| o.machine.in_flight() > 0).count();
                prop_assert!(working <= 1, "two owners working: {owners:?} record {record:?}");
            }
        }
    }
}
