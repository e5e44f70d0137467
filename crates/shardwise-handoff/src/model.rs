//! What the randomized models of [`crate::drain`] and [`crate::slices`] share: real time, the
//! monotonic clock of each process, the shard leases on the API server, each replica's lease
//! task and the planner's view of the leases, all on the rules of [`crate::lease`], and the
//! audit that checks the safety property.
//!
//! Time. Real time advances only by [`Life::Tick`]. Each process (two replicas, one planner)
//! has its own monotonic clock, which runs at its own rate, in thousandths of real time, within
//! [`Settings::rates`]; each starts at its own origin, so that comparing two processes' instants
//! would be meaningless (the rules never do). A paused process (SIGSTOP, a stop-the-world pause)
//! takes no step, and its clock runs on, as `CLOCK_MONOTONIC` does.
//!
//! Leases. A replica renews in three steps: it sends ([`Life::Renew`]: past its fence, it first
//! gives the term up and takes a new identity), the API server reads and writes the lease
//! ([`Life::Lands`]: the holder's decision, [`lease_action`] on its own [`LeaseObserver`], as of
//! when it sent), and the answer comes back ([`Life::Answer`]: a success moves the fence to
//! [`LeaseTiming::fence_at`] of the send time; past the attempt's timeout it counts as a
//! failure). The planner sees lease versions through a watch that may lag or stall
//! ([`Life::Watch`]), each recorded in its [`LeaseObserver`] when it arrives. A planning pass
//! first checks for leases that look expired ([`Life::Confirm`]) and, if there are any, reads them
//! again ([`Life::Serve`] on the server, [`Life::ReadBack`] in the planner); it then decides on
//! the leases valid at the instant of that check. Nothing expires by itself: the planner calls a
//! lease expired from its own observations and clock, whatever its holder is doing.
//!
//! The fence as implemented. A term's gate is open while its lease is held under the term's
//! incarnation and the fence is ahead on the replica's clock. A reconcile starts only through
//! an open gate (the worker's check), every request passes it when sent, and a term ends (its
//! work dropped, its state forgotten) only at a step of its own process after the gate shut.
//!
//! Safety, as checked: a reconcile *acts* when it starts and when it sends a request, and it is
//! *live* from its start until it ends, its term ends, or its gate shuts: until it can send
//! nothing more. No reconcile acts while a reconcile of the same item by another term is live.
//! (Code that runs on past the fence without sending anything is not an act:
//! `docs/guarantees.md`, "Work that is not a request".)

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use shard_assign::ShardId;

use crate::drain::{Incarnation, OwnerId};
use crate::lease::{LeaseAction, LeaseObserver, LeaseRecord, LeaseTiming, lease_action};

/// The replicas, serving shards 0 and 1.
pub(crate) const REPLICAS: usize = 2;
/// The index of the planner among processes (replicas come first).
pub(crate) const PLANNER: usize = REPLICAS;

/// A fault seeded into the model, to show that the check finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Defect {
    /// A worker starts a reconcile without checking the term's fence first.
    NoFenceCheck,
    /// Requests are sent without passing the gate.
    NoRequestGate,
    /// A holder counts its fence from when a renewal's answer came back, not from when it sent
    /// the renewal.
    FenceFromAnswer,
    /// The planner counts a lease version read again as seen when it sent the read, not when
    /// the answer came back.
    SeenAtReadSent,
    /// The planner decides on the leases valid when it decides, not at the instant it checked
    /// for expiries and read them again: a lease that expires in between counts as expired
    /// without a fresh read.
    DecidesAfterConfirming,
    /// A paused process's clock stops too (a virtual machine paused by its hypervisor).
    ClockStopsWhenPaused,
}

/// The lease settings, the clock rates and the defects of one model.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// The lease settings of every replica.
    pub(crate) timing: LeaseTiming,
    /// The slowest and fastest clock rate, in thousandths of real time.
    pub(crate) rates: (u64, u64),
    /// Seeded defects.
    pub(crate) defects: Vec<Defect>,
}

impl Settings {
    /// The default lease settings, and clocks whose rates differ by a factor up to
    /// 1220/820 ≈ 1.488, just below `lease_duration / renew_deadline` = 1.5.
    pub(crate) fn correct() -> Self {
        Self {
            timing: LeaseTiming::DEFAULT,
            rates: (820, 1220),
            defects: Vec::new(),
        }
    }

    /// The same, with `defect` seeded.
    pub(crate) fn with_defect(mut self, defect: Defect) -> Self {
        self.defects.push(defect);
        self
    }

    fn has(&self, defect: Defect) -> bool {
        self.defects.contains(&defect)
    }

    /// The clock rates of the replicas and the planner: often at a bound, where the margin is
    /// thinnest.
    pub(crate) fn clock_rates(&self) -> impl Strategy<Value = [u64; REPLICAS + 1]> + use<> {
        let (slow, fast) = self.rates;
        let rate = prop_oneof![Just(slow), Just(fast), slow..=fast];
        [rate.clone(), rate.clone(), rate]
    }
}

/// A step of time, of a lease or of the planner's view of the leases.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Life {
    /// Real time advances by this many milliseconds, in steps of at most the retry period,
    /// each after what the lease tasks and the planner's watch do by themselves
    /// ([`Fleet::background`]).
    Tick(u64),
    /// Real time advances to the instant the planner's next lease would expire, if none is
    /// renewed before (and a tick of up to 50 ms more): the planner sleeps until then, as the
    /// runtime's does, and [`Life::Confirm`] then comes at the worst moment.
    Sleep(u64),
    /// A replica's renewals no longer get through by themselves (a partition, a slow API
    /// server): only the explicit steps below renew it.
    Cut(usize),
    /// They get through again.
    Heal(usize),
    /// The planner's watch of the leases stalls: only [`Life::Watch`] delivers.
    Stall,
    /// It flows again.
    Flow,
    /// A process (a replica, or [`PLANNER`]) is frozen.
    Pause(usize),
    /// A frozen process runs again.
    Resume(usize),
    /// A replica sends a renewal (or an attempt to take its lease).
    Renew(usize),
    /// The API server handles it.
    Lands(usize),
    /// Its answer (or its timeout) reaches the replica.
    Answer(usize),
    /// The three at once.
    Renewal(usize),
    /// A slow renewal: sent, handled at once, its answer back this many milliseconds later.
    Slow(usize, u64),
    /// A new process for a replica that died.
    Start(usize),
    /// The planner's watch delivers the next version of a shard's lease.
    Watch(usize),
    /// The planner starts a pass: it looks for leases that look expired, and reads them again.
    Confirm,
    /// The API server answers that read.
    Serve,
    /// The answer reaches the planner.
    ReadBack,
}

/// Kinds of step, each with its weight.
pub(crate) type Kinds<T> = Vec<(u32, BoxedStrategy<T>)>;

/// The kinds of [`Life`] step, weighted: those every case has, and those it may leave out.
pub(crate) fn life() -> (Kinds<Life>, Kinds<Life>) {
    let who = || (0..REPLICAS).boxed();
    let process = || (0..=PLANNER).boxed();
    let always = vec![
        (6, (1u64..=500).prop_map(Life::Tick).boxed()),
        (12, (500u64..=4000).prop_map(Life::Tick).boxed()),
    ];
    let optional = vec![
        (4, (0u64..=50).prop_map(Life::Sleep).boxed()),
        (2, who().prop_map(Life::Cut).boxed()),
        (2, who().prop_map(Life::Heal).boxed()),
        (1, Just(Life::Stall).boxed()),
        (1, Just(Life::Flow).boxed()),
        (1, process().prop_map(Life::Pause).boxed()),
        (2, process().prop_map(Life::Resume).boxed()),
        (2, who().prop_map(Life::Renew).boxed()),
        (2, who().prop_map(Life::Lands).boxed()),
        (2, who().prop_map(Life::Answer).boxed()),
        (2, who().prop_map(Life::Renewal).boxed()),
        (
            2,
            (who(), 0u64..=6000)
                .prop_map(|(i, ms)| Life::Slow(i, ms))
                .boxed(),
        ),
        (1, who().prop_map(Life::Start).boxed()),
        (2, who().prop_map(Life::Watch).boxed()),
        (2, Just(Life::Confirm).boxed()),
        (2, Just(Life::Serve).boxed()),
        (2, Just(Life::ReadBack).boxed()),
    ];
    (always, optional)
}

/// Sequences of fewer than `len` steps, drawn from `always` and from a subset of `optional`
/// that each case draws first (swarm testing): a case without, say, steps that end
/// reconciles or heal partitions keeps such states long enough for rare interleavings.
pub(crate) fn swarm<T: Clone + std::fmt::Debug + 'static>(
    always: Kinds<T>,
    optional: Kinds<T>,
    len: usize,
) -> impl Strategy<Value = Vec<T>> {
    prop::collection::vec(any::<bool>(), optional.len()).prop_flat_map(move |keep| {
        let kinds: Kinds<T> = always
            .iter()
            .cloned()
            .chain(
                optional
                    .iter()
                    .zip(keep)
                    .filter(|(_, keep)| *keep)
                    .map(|(kind, _)| kind.clone()),
            )
            .collect();
        prop::collection::vec(prop::strategy::Union::new_weighted(kinds), 1..len)
    })
}

/// The search of the seeded-defect tests: `cases` cases drawn from a fixed seed, so the same
/// cases in the same order every time, and no file of past failures. A failure is shrunk only
/// if `shrink` (shrinking these cases is slow).
pub(crate) fn search<S: Strategy>(
    strategy: &S,
    cases: u32,
    shrink: bool,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<(), TestError<S::Value>> {
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: if shrink { 1000 } else { 0 },
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
    TestRunner::new_with_rng(config, rng).run(strategy, check)
}

/// A process's monotonic clock.
#[derive(Clone, Debug)]
struct Clock {
    origin: Instant,
    /// Microseconds since `origin`.
    micros: u64,
    /// Thousandths of real time: a millisecond of real time is `rate` microseconds here.
    rate: u64,
}

impl Clock {
    fn now(&self) -> Instant {
        self.origin + Duration::from_micros(self.micros)
    }

    fn advance(&mut self, millis: u64) {
        self.micros += millis * self.rate;
    }
}

/// A renewal sent and not answered yet.
#[derive(Clone, Debug)]
struct Attempt {
    started: Instant,
    /// Sent by the lease task between the model's steps, which also takes its answer.
    background: bool,
    /// What the API server did with it, once it landed: whether we hold the lease after it.
    landed: Option<bool>,
}

/// A replica's process: its clock, its lease task and its current term.
#[derive(Clone, Debug)]
struct Replica {
    shard: ShardId,
    clock: Clock,
    alive: bool,
    paused: bool,
    /// Renewals get through at every tick.
    link: bool,
    /// Processes started for this shard so far.
    generation: u64,
    /// Terms this process lost.
    losses: u64,
    identity: String,
    observer: LeaseObserver,
    /// Held: until when (on this clock), and under which incarnation.
    holding: Option<(Instant, Incarnation)>,
    attempt: Option<Attempt>,
    /// The term the owner side serves, until a step of this process sees its gate shut.
    term: Option<Incarnation>,
}

impl Replica {
    fn base_identity(&self) -> String {
        format!("shard-{}-p{}", self.shard, self.generation)
    }

    fn running(&self) -> bool {
        self.alive && !self.paused
    }

    /// The term's gate: its lease held under its incarnation, the fence ahead.
    fn gate_open(&self) -> bool {
        match (self.term, self.holding) {
            (Some(term), Some((fence, held_as))) => held_as == term && self.clock.now() < fence,
            _ => false,
        }
    }

    /// The term is over for this process: a new identity for the next one.
    fn lose(&mut self) {
        self.losses += 1;
        self.identity = format!("{}-{}", self.base_identity(), self.losses);
        self.holding = None;
    }
}

/// A read of the shard leases, sent by the planner.
#[derive(Clone, Debug)]
struct Read {
    sent: Instant,
    served: Option<Vec<LeaseRecord>>,
}

#[derive(Clone, Debug)]
struct Planner {
    clock: Clock,
    paused: bool,
    /// The watch delivers at every tick.
    flowing: bool,
    observer: LeaseObserver,
    /// Versions of each shard's lease not delivered by the watch yet, in order.
    inbox: Vec<Vec<LeaseRecord>>,
    /// The pass under way: the instant of its expiry check, and its read.
    checked: Option<(Instant, Option<Read>)>,
}

/// A reconcile, as the audit sees it.
#[derive(Clone, Debug)]
struct Reconcile {
    item: usize,
    replica: usize,
    term: Incarnation,
    ended: bool,
}

/// Time, leases and the audit of a model.
#[derive(Clone, Debug)]
pub(crate) struct Fleet {
    settings: Settings,
    /// Milliseconds of real time since the start.
    real: u64,
    /// Each shard lease on the API server: holder and version.
    leases: Vec<(Option<String>, u64)>,
    replicas: Vec<Replica>,
    planner: Planner,
    /// Every reconcile started, by id.
    reconciles: Vec<Reconcile>,
    /// The first reconcile found acting while another term's was live.
    violation: Option<String>,
}

fn lease_name(shard: usize) -> String {
    format!("shard-{shard}")
}

/// The origin of process `n`'s clock: far apart, so that no instant of one means anything to
/// another.
fn origin(base: Instant, n: u64) -> Instant {
    base + Duration::from_secs(100_000 * (n + 1))
}

impl Fleet {
    /// Both replicas holding their leases and serving a term, a planner that has just seen
    /// both leases, at the start of time.
    pub(crate) fn new(settings: Settings, rates: [u64; REPLICAS + 1]) -> Self {
        let base = Instant::now();
        let timing = settings.timing;
        let mut replicas: Vec<Replica> = (0..REPLICAS)
            .map(|i| Replica {
                shard: i as ShardId,
                clock: Clock {
                    origin: origin(base, i as u64),
                    micros: 0,
                    rate: rates[i],
                },
                alive: true,
                paused: false,
                link: true,
                generation: 1,
                losses: 0,
                identity: String::new(),
                observer: LeaseObserver::new(),
                holding: None,
                attempt: None,
                term: None,
            })
            .collect();
        for r in &mut replicas {
            r.identity = r.base_identity();
            let incarnation = Incarnation::of_identity(&r.identity);
            r.holding = Some((timing.fence_at(r.clock.now()), incarnation));
            r.term = Some(incarnation);
        }
        let mut fleet = Self {
            leases: replicas
                .iter()
                .map(|r| (Some(r.identity.clone()), 1))
                .collect(),
            replicas,
            planner: Planner {
                clock: Clock {
                    origin: origin(base, PLANNER as u64),
                    micros: 0,
                    rate: rates[PLANNER],
                },
                paused: false,
                flowing: true,
                observer: LeaseObserver::new(),
                inbox: vec![Vec::new(); REPLICAS],
                checked: None,
            },
            settings,
            real: 0,
            reconciles: Vec::new(),
            violation: None,
        };
        for i in 0..REPLICAS {
            let record = fleet.record(i);
            let now = fleet.replicas[i].clock.now();
            fleet.replicas[i]
                .observer
                .observe(&lease_name(i), record.clone(), now);
            let now = fleet.planner.clock.now();
            fleet.planner.observer.observe(&lease_name(i), record, now);
        }
        fleet
    }

    /// The lease of shard `i` as the API server would return it.
    fn record(&self, i: usize) -> LeaseRecord {
        let (holder, version) = &self.leases[i];
        LeaseRecord {
            holder: holder.clone(),
            version: version.to_string(),
            duration: self.settings.timing.duration,
        }
    }

    /// Writes shard `i`'s lease, which the planner's watch delivers later.
    fn write_lease(&mut self, i: usize, holder: Option<String>) {
        self.leases[i] = (holder, self.leases[i].1 + 1);
        let record = self.record(i);
        self.planner.inbox[i].push(record);
    }

    /// Takes one step.
    pub(crate) fn step(&mut self, step: Life) {
        let timeout = self.settings.timing.renew_deadline / 2;
        match step {
            Life::Tick(millis) => {
                // In steps of at most the retry period, each starting with what the lease
                // tasks and the planner's watch do by themselves.
                let chunk = u64::try_from(self.settings.timing.retry_period.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1);
                let mut left = millis;
                loop {
                    self.background();
                    let slice = left.min(chunk);
                    self.advance(slice);
                    left -= slice;
                    if left == 0 {
                        break;
                    }
                }
            }
            Life::Sleep(after) => {
                let p = &self.planner;
                let now = p.clock.now();
                if let Some(at) = p.observer.next_expiry(now) {
                    let micros = u64::try_from((at - now).as_micros()).unwrap_or(u64::MAX);
                    self.step(Life::Tick(micros.div_ceil(p.clock.rate) + after));
                }
            }
            Life::Cut(i) => self.replicas[i].link = false,
            Life::Heal(i) => self.replicas[i].link = true,
            Life::Stall => self.planner.flowing = false,
            Life::Flow => self.planner.flowing = true,
            Life::Pause(p) | Life::Resume(p) => {
                let paused = matches!(step, Life::Pause(_));
                match self.replicas.get_mut(p) {
                    Some(r) => r.paused = paused,
                    None => self.planner.paused = paused,
                }
            }
            Life::Renew(i) => {
                let r = &mut self.replicas[i];
                if !r.running() || r.attempt.is_some() {
                    return;
                }
                let now = r.clock.now();
                if r.holding.is_some_and(|(fence, _)| now >= fence) {
                    r.lose();
                }
                r.attempt = Some(Attempt {
                    started: now,
                    background: false,
                    landed: None,
                });
            }
            Life::Lands(i) => {
                let record = self.record(i);
                let r = &mut self.replicas[i];
                let now = r.clock.now();
                let running = r.running();
                let Some(attempt) = &mut r.attempt else {
                    return;
                };
                // The holder reads, decides and writes as of when it sent; it sends nothing
                // once its attempt timed out.
                if !running || attempt.landed.is_some() || now >= attempt.started + timeout {
                    return;
                }
                let name = lease_name(i);
                r.observer.observe(&name, record.clone(), attempt.started);
                let action = lease_action(
                    &name,
                    Some(&record),
                    &r.identity,
                    &r.observer,
                    attempt.started,
                );
                let took = action != LeaseAction::Wait;
                attempt.landed = Some(took);
                if took {
                    let identity = r.identity.clone();
                    self.write_lease(i, Some(identity));
                }
            }
            Life::Answer(i) => {
                let timing = self.settings.timing;
                let from_answer = self.settings.has(Defect::FenceFromAnswer);
                let r = &mut self.replicas[i];
                let Some(attempt) = &r.attempt else {
                    return;
                };
                let now = r.clock.now();
                let timed_out = now >= attempt.started + timeout;
                if !r.running() || (attempt.landed.is_none() && !timed_out) {
                    return;
                }
                let result = if timed_out { None } else { attempt.landed };
                let started = if from_answer { now } else { attempt.started };
                r.attempt = None;
                if r.holding.is_some_and(|(fence, _)| now >= fence) {
                    r.lose();
                } else {
                    match result {
                        Some(true) => {
                            r.holding = Some((
                                timing.fence_at(started),
                                Incarnation::of_identity(&r.identity),
                            ));
                        }
                        Some(false) if r.holding.is_some() => r.lose(),
                        _ => {}
                    }
                }
            }
            Life::Renewal(i) => {
                self.step(Life::Renew(i));
                self.step(Life::Lands(i));
                self.step(Life::Answer(i));
            }
            Life::Slow(i, millis) => {
                self.step(Life::Renew(i));
                self.step(Life::Lands(i));
                self.step(Life::Tick(millis));
                self.step(Life::Answer(i));
            }
            Life::Start(i) => {
                let r = &mut self.replicas[i];
                if r.alive {
                    return;
                }
                r.generation += 1;
                r.clock.origin = origin(r.clock.now(), 0);
                r.clock.micros = 0;
                r.alive = true;
                r.paused = false;
                r.losses = 0;
                r.identity = r.base_identity();
                r.observer = LeaseObserver::new();
                r.holding = None;
                r.attempt = None;
                r.term = None;
            }
            Life::Watch(i) => {
                let p = &mut self.planner;
                if p.paused || p.inbox[i].is_empty() {
                    return;
                }
                let record = p.inbox[i].remove(0);
                let now = p.clock.now();
                p.observer.observe(&lease_name(i), record, now);
            }
            Life::Confirm => {
                let p = &mut self.planner;
                // One pass at a time: it ends when it decides.
                if p.paused || p.checked.is_some() {
                    return;
                }
                let now = p.clock.now();
                let expired = !p.observer.expired_holders(now).is_empty();
                let read = expired.then_some(Read {
                    sent: now,
                    served: None,
                });
                p.checked = Some((now, read));
            }
            Life::Serve => {
                let records: Vec<LeaseRecord> = (0..REPLICAS).map(|i| self.record(i)).collect();
                if let Some((_, Some(read))) = &mut self.planner.checked
                    && read.served.is_none()
                {
                    read.served = Some(records);
                }
            }
            Life::ReadBack => {
                let at_sent = self.settings.has(Defect::SeenAtReadSent);
                let p = &mut self.planner;
                if !p.paused
                    && let Some((_, read)) = &mut p.checked
                    && let Some(Read {
                        sent,
                        served: Some(records),
                    }) = read.take_if(|read| read.served.is_some())
                {
                    let now = if at_sent { sent } else { p.clock.now() };
                    for (i, record) in records.into_iter().enumerate() {
                        p.observer.observe(&lease_name(i), record, now);
                    }
                }
            }
        }
    }

    /// What runs between the model's steps: every running replica takes the answer to its
    /// last renewal (or gives it up after its timeout) and, if its renewals get through,
    /// sends the next one, which lands at once; the planner's watch, unless stalled, delivers
    /// what it has.
    fn background(&mut self) {
        let timeout = self.settings.timing.renew_deadline / 2;
        for i in 0..REPLICAS {
            let r = &self.replicas[i];
            if r.attempt.as_ref().is_some_and(|a| {
                (a.background && a.landed.is_some()) || r.clock.now() >= a.started + timeout
            }) {
                self.step(Life::Answer(i));
            }
            if self.replicas[i].link && self.replicas[i].attempt.is_none() {
                self.step(Life::Renew(i));
                if let Some(attempt) = &mut self.replicas[i].attempt {
                    attempt.background = true;
                }
                self.step(Life::Lands(i));
            }
        }
        if self.planner.flowing {
            for i in 0..REPLICAS {
                while !self.planner.paused && !self.planner.inbox[i].is_empty() {
                    self.step(Life::Watch(i));
                }
            }
        }
    }

    /// Real time advances by `millis`, and each clock by its rate.
    fn advance(&mut self, millis: u64) {
        self.real += millis;
        let stops = self.settings.has(Defect::ClockStopsWhenPaused);
        for r in &mut self.replicas {
            if !(stops && r.paused) {
                r.clock.advance(millis);
            }
        }
        if !(stops && self.planner.paused) {
            self.planner.clock.advance(millis);
        }
    }

    /// Whether the planner runs.
    pub(crate) fn planner_running(&self) -> bool {
        !self.planner.paused
    }

    /// The lease holders the planner decides on, when a pass has checked its leases: the holder
    /// of each shard's lease if valid. Ends the pass.
    pub(crate) fn decide(&mut self) -> Option<Vec<Option<Incarnation>>> {
        let p = &mut self.planner;
        if p.paused || p.checked.as_ref().is_none_or(|(_, read)| read.is_some()) {
            return None;
        }
        let (checked, _) = p.checked.take()?;
        let at = if self.settings.has(Defect::DecidesAfterConfirming) {
            p.clock.now()
        } else {
            checked
        };
        Some(
            (0..REPLICAS)
                .map(|i| {
                    let name = lease_name(i);
                    p.observer
                        .is_valid(&name, at)
                        .then(|| p.observer.holder(&name).map(Incarnation::of_identity))
                        .flatten()
                })
                .collect(),
        )
    }

    /// A whole pass: check, read again if needed, decide.
    pub(crate) fn pass(&mut self) -> Option<Vec<Option<Incarnation>>> {
        for step in [Life::Confirm, Life::Serve, Life::ReadBack] {
            self.step(step);
        }
        self.decide()
    }

    /// The incarnation holding shard `i`'s lease on the API server.
    pub(crate) fn lease_holder(&self, i: usize) -> Option<Incarnation> {
        self.leases[i].0.as_deref().map(Incarnation::of_identity)
    }

    /// The term replica `i` serves, if it runs.
    pub(crate) fn term(&self, i: usize) -> Option<OwnerId> {
        let r = &self.replicas[i];
        r.term.filter(|_| r.running()).map(|incarnation| OwnerId {
            shard: r.shard,
            incarnation,
        })
    }

    /// Replica `i` starts a new term, if it holds its lease and serves none: `Some` with the
    /// owner it now is.
    pub(crate) fn term_start(&mut self, i: usize) -> Option<OwnerId> {
        let r = &mut self.replicas[i];
        let (fence, incarnation) = r.holding?;
        if !r.running() || r.term.is_some() || r.clock.now() >= fence {
            return None;
        }
        r.term = Some(incarnation);
        self.term(i)
    }

    /// Replica `i`'s term ends, if its gate has shut: true when it did, and everything the term
    /// held must go.
    pub(crate) fn term_end(&mut self, i: usize) -> bool {
        let r = &mut self.replicas[i];
        if !r.running() || r.term.is_none() || r.gate_open() {
            return false;
        }
        r.term = None;
        true
    }

    /// Whether a worker of replica `i` may start a reconcile now.
    pub(crate) fn may_begin(&self, i: usize) -> bool {
        let r = &self.replicas[i];
        self.term(i).is_some() && (self.settings.has(Defect::NoFenceCheck) || r.gate_open())
    }

    /// Whether replica `i` may send a request now.
    pub(crate) fn may_send(&self, i: usize) -> bool {
        let r = &self.replicas[i];
        self.term(i).is_some() && (self.settings.has(Defect::NoRequestGate) || r.gate_open())
    }

    /// Replica `i`'s process is killed (SIGKILL): it does nothing more, its lease stays until
    /// it expires.
    pub(crate) fn kill(&mut self, i: usize) {
        let r = &mut self.replicas[i];
        r.alive = false;
        r.term = None;
        r.attempt = None;
        r.holding = None;
    }

    /// Replica `i` stops gracefully (SIGTERM), if it runs: its work is over, then it releases
    /// its lease if it still holds it.
    pub(crate) fn stop(&mut self, i: usize) -> bool {
        let r = &self.replicas[i];
        if !r.running() {
            return false;
        }
        let held = r.holding.is_some_and(|(fence, _)| r.clock.now() < fence);
        if held && self.leases[i].0.as_deref() == Some(r.identity.as_str()) {
            self.write_lease(i, None);
        }
        self.kill(i);
        true
    }

    /// A reconcile of `item` by replica `i`'s term starts: its id for [`act`](Self::act)
    /// and [`end`](Self::end). `None` when the replica serves no term.
    pub(crate) fn begin(&mut self, i: usize, item: usize) -> Option<usize> {
        let term = self.term(i)?.incarnation;
        self.reconciles.push(Reconcile {
            item,
            replica: i,
            term,
            ended: false,
        });
        let id = self.reconciles.len() - 1;
        self.act(id);
        Some(id)
    }

    /// Whether reconcile `id` could still send a request: it has not ended, its term has not
    /// ended, and its gate is open (or lets anything through, with [`Defect::NoRequestGate`]).
    fn live(&self, id: usize) -> bool {
        let reconcile = &self.reconciles[id];
        let r = &self.replicas[reconcile.replica];
        !reconcile.ended
            && r.alive
            && r.term == Some(reconcile.term)
            && (self.settings.has(Defect::NoRequestGate) || r.gate_open())
    }

    /// Reconcile `id` acts: it starts, or sends a request. No reconcile of the same item by
    /// another term may be live.
    pub(crate) fn act(&mut self, id: usize) {
        let me = &self.reconciles[id];
        let overlap = (0..self.reconciles.len()).find(|&other| {
            let o = &self.reconciles[other];
            o.item == me.item && o.term != me.term && self.live(other)
        });
        if let Some(other) = overlap
            && self.violation.is_none()
        {
            self.violation = Some(format!(
                "reconcile {id} (item {}, term {:x}) acted while reconcile {other} (term {:x}) was live",
                me.item, me.term.0, self.reconciles[other].term.0
            ));
        }
    }

    /// Reconcile `id` ended: finished, or failed at the gate.
    pub(crate) fn end(&mut self, id: usize) {
        self.reconciles[id].ended = true;
    }

    /// The first reconcile found acting while another term's was live, if any.
    pub(crate) fn violation(&self) -> Option<&str> {
        self.violation.as_deref()
    }

    /// A calm period begins: every process runs, dead replicas start again, renewals get
    /// through and the planner's watch flows.
    pub(crate) fn calm(&mut self) {
        for p in 0..=PLANNER {
            self.step(Life::Resume(p));
        }
        for i in 0..REPLICAS {
            self.step(Life::Start(i));
            self.step(Life::Heal(i));
        }
        self.step(Life::Flow);
    }
}
