//! A work queue in the manner of client-go's: each key is queued at most once, never processed
//! by two workers at once (a key added while it is processed is processed again after), can be
//! scheduled for later, and backs off after failures. Its length is the queue-depth metric.
//!
//! Keys may be queued in *lanes* (an item's lane is its unit): workers take one key from each
//! lane with keys ready in turn, first in first out within a lane. Without lanes, a unit that
//! became active a moment before another queued all its items ahead of the other's, and every
//! worker then waited on that one unit's destination (its request limit, its latency) while the
//! other's items waited behind them.
//!
//! Why not kube-runtime's `Controller` (its `scheduler` and `runner`)? They give deduplication,
//! delays and a bounded worker pool, and this queue gives the same; what the owner needs beyond
//! them is:
//!
//! - **A gate owned by another object.** An item may run only while its *unit*'s handoff state
//!   admits work; `Controller` decides per object, from that object's own events. Here every
//!   reconcile passes `Gate::begin` (the `gate` module) for its unit just before it starts.
//! - **Knowing when a unit's last reconcile ended.** A drain is acknowledged only once no
//!   reconcile of the unit *or any of its items* is in flight (`Gate::end` returns the
//!   acknowledgement to write). `Controller` does not expose in-flight work.
//! - **Abandoning everything at once.** When a lease is lost, every in-flight reconcile of the
//!   term is dropped immediately (its audit interval ends there) and the queue closes;
//!   `Controller` shuts down by draining its stream.
//! - **Fairness between units** (the lanes above): `Controller` runs its ready keys in order.
//!
//! The queue itself stays free of these concerns; the owner's workers combine it with the
//! gate.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;

#[derive(Debug)]
struct State<K, L> {
    /// Keys ready, by lane (`None`: keys queued without one); a key forgotten while queued
    /// stays here and is skipped.
    ready: BTreeMap<Option<L>, VecDeque<K>>,
    /// The lanes in `ready`, in the order of their turns.
    turns: VecDeque<Option<L>>,
    /// The lane of each key queued, processed or scheduled.
    lanes: BTreeMap<K, L>,
    queued: BTreeSet<K>,
    processing: BTreeSet<K>,
    dirty: BTreeSet<K>,
    delayed: BTreeMap<(Instant, u64), K>,
    delayed_at: BTreeMap<K, (Instant, u64)>,
    failures: BTreeMap<K, u32>,
    sequence: u64,
    closed: bool,
}

impl<K: Ord + Clone, L: Ord + Clone> State<K, L> {
    fn push(&mut self, key: K) {
        if let Some(at) = self.delayed_at.remove(&key) {
            self.delayed.remove(&at);
        }
        if self.processing.contains(&key) {
            self.dirty.insert(key);
        } else if self.queued.insert(key.clone()) {
            let lane = self.lanes.get(&key).cloned();
            let keys = self.ready.entry(lane.clone()).or_default();
            if keys.is_empty() {
                self.turns.push_back(lane);
            }
            keys.push_back(key);
        }
    }

    /// `key`, taken but not processed, first in its lane again.
    fn put_back(&mut self, key: K) {
        self.processing.remove(&key);
        self.dirty.remove(&key);
        if let Some(at) = self.delayed_at.remove(&key) {
            self.delayed.remove(&at);
        }
        if self.queued.insert(key.clone()) {
            let lane = self.lanes.get(&key).cloned();
            let keys = self.ready.entry(lane.clone()).or_default();
            if keys.is_empty() {
                // A lane with keys ready has a turn, and only one.
                self.turns.push_front(lane);
            }
            keys.push_front(key);
        }
    }

    /// The next key to process: the first of the lane whose turn it is.
    fn pop(&mut self) -> Option<K> {
        while let Some(lane) = self.turns.pop_front() {
            let Some(keys) = self.ready.get_mut(&lane) else {
                continue;
            };
            let mut next = None;
            while let Some(key) = keys.pop_front() {
                // Keys forgotten while queued are skipped.
                if self.queued.remove(&key) {
                    next = Some(key);
                    break;
                }
            }
            if keys.is_empty() {
                self.ready.remove(&lane);
            } else {
                self.turns.push_back(lane);
            }
            if let Some(key) = next {
                self.processing.insert(key.clone());
                return Some(key);
            }
        }
        None
    }

    fn promote_due(&mut self, now: Instant) {
        while let Some((&(at, seq), _)) = self.delayed.first_key_value() {
            if at > now {
                break;
            }
            if let Some(key) = self.delayed.remove(&(at, seq)) {
                self.delayed_at.remove(&key);
                self.push(key);
            }
        }
    }

    /// Drops the lane of `key` once nothing of the queue refers to it.
    fn release(&mut self, key: &K) {
        if !self.queued.contains(key)
            && !self.processing.contains(key)
            && !self.delayed_at.contains_key(key)
        {
            self.lanes.remove(key);
        }
    }
}

/// A deduplicating, delaying work queue shared by a pool of workers, fair between lanes `L`.
#[derive(Debug)]
pub struct WorkQueue<K, L = ()> {
    state: Arc<Mutex<State<K, L>>>,
    notify: Arc<Notify>,
}

impl<K, L> Clone for WorkQueue<K, L> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<K: Ord + Clone, L: Ord + Clone> Default for WorkQueue<K, L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Clone, L: Ord + Clone> WorkQueue<K, L> {
    pub const BACKOFF_BASE: Duration = Duration::from_millis(500);
    pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                ready: BTreeMap::new(),
                turns: VecDeque::new(),
                lanes: BTreeMap::new(),
                queued: BTreeSet::new(),
                processing: BTreeSet::new(),
                dirty: BTreeSet::new(),
                delayed: BTreeMap::new(),
                delayed_at: BTreeMap::new(),
                failures: BTreeMap::new(),
                sequence: 0,
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K, L>> {
        // A worker that panicked while holding the lock left consistent data behind: every
        // mutation above completes before the guard drops.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key` now, in the lane it has (if none, in the lane of keys without one).
    pub fn add(&self, key: K) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.push(key);
        drop(state);
        self.notify.notify_one();
    }

    /// Queues `key` now in `lane`, its lane from now on (a key already waiting keeps its place
    /// in the lane it waits in).
    pub fn add_in(&self, key: K, lane: L) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        state.lanes.insert(key.clone(), lane);
        state.push(key);
        drop(state);
        self.notify.notify_one();
    }

    /// Queues `key` after `delay`, unless it is queued earlier.
    pub fn add_after(&self, key: K, delay: Duration) {
        let at = Instant::now() + delay;
        let mut state = self.lock();
        if state.closed || state.queued.contains(&key) {
            return;
        }
        if let Some(&existing) = state.delayed_at.get(&key) {
            if existing.0 <= at {
                return;
            }
            state.delayed.remove(&existing);
        }
        state.sequence += 1;
        let slot = (at, state.sequence);
        state.delayed.insert(slot, key.clone());
        state.delayed_at.insert(key, slot);
        drop(state);
        // A waiting worker may need to wake earlier than it planned.
        self.notify.notify_waiters();
    }

    /// Queues `key` after a delay that doubles with each consecutive failure.
    pub fn add_after_failure(&self, key: K) -> Duration {
        let failures = {
            let mut state = self.lock();
            let n = state.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        let delay = (Self::BACKOFF_BASE * factor).min(Self::BACKOFF_MAX);
        self.add_after(key, delay);
        delay
    }

    /// Clears the failure count of `key` (it succeeded).
    pub fn succeeded(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Drops every trace of `key` except a reconcile in progress.
    pub fn forget(&self, key: &K) {
        let mut state = self.lock();
        state.queued.remove(key);
        state.dirty.remove(key);
        state.failures.remove(key);
        if let Some(at) = state.delayed_at.remove(key) {
            state.delayed.remove(&at);
        }
        state.release(key);
    }

    /// Waits for a key to process; `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.lock();
                if state.closed {
                    return None;
                }
                state.promote_due(Instant::now());
                if let Some(key) = state.pop() {
                    return Some(key);
                }
                state.delayed.first_key_value().map(|(&(at, _), _)| at)
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// A worker finished `key`; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.processing.remove(key);
        if state.dirty.remove(key) && !state.closed {
            state.push(key.clone());
            drop(state);
            self.notify.notify_one();
        } else {
            state.release(key);
        }
    }

    /// Returns `key`, taken by [`next`](Self::next) but not started, to the front of its lane,
    /// as if it had never been taken (an add meanwhile, or a schedule, is absorbed: it is
    /// queued now). Also on a closed queue: the key is put back, not added.
    pub fn put_back(&self, key: K) {
        self.lock().put_back(key);
        self.notify.notify_one();
    }

    /// Keys ready for a worker (not counting scheduled ones).
    pub fn depth(&self) -> usize {
        let mut state = self.lock();
        state.promote_due(Instant::now());
        state.queued.len()
    }

    /// Stops handing out keys; waiting workers get `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Whether [`close`](Self::close) was called: the term is ending.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keys_are_deduplicated_and_fifo() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.depth(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test]
    async fn a_key_added_while_processed_runs_again_after_not_concurrently() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        q.add("a");
        // Not handed to a second worker while the first holds it.
        assert_eq!(q.depth(), 0);
        let second = tokio::time::timeout(Duration::from_millis(50), q.next()).await;
        assert!(second.is_err(), "handed out twice");
        q.done(&"a");
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_due_in_time_order() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add_after("late", Duration::from_secs(10));
        q.add_after("soon", Duration::from_secs(1));
        assert_eq!(q.depth(), 0);
        let start = tokio::time::Instant::now();
        assert_eq!(q.next().await, Some("soon"));
        assert!(start.elapsed() >= Duration::from_secs(1));
        assert_eq!(q.next().await, Some("late"));
        assert!(start.elapsed() >= Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_add_supersedes_a_scheduled_one() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add_after("a", Duration::from_secs(60));
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        // The schedule was consumed by the immediate add.
        let again = tokio::time::timeout(Duration::from_secs(120), q.next()).await;
        assert!(again.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_and_reset_on_success() {
        let q: WorkQueue<&str> = WorkQueue::new();
        assert_eq!(q.add_after_failure("a"), Duration::from_millis(500));
        assert_eq!(q.add_after_failure("a"), Duration::from_secs(1));
        assert_eq!(q.add_after_failure("a"), Duration::from_secs(2));
        for _ in 0..20 {
            q.add_after_failure("a");
        }
        assert_eq!(q.add_after_failure("a"), WorkQueue::<&str>::BACKOFF_MAX);
        q.succeeded(&"a");
        assert_eq!(q.add_after_failure("a"), Duration::from_millis(500));
    }

    #[tokio::test]
    async fn lanes_take_turns_and_keep_their_order_within() {
        let q: WorkQueue<&str, &str> = WorkQueue::new();
        for key in ["a1", "a2", "a3"] {
            q.add_in(key, "a");
        }
        q.add_in("b1", "b");
        q.add_in("b2", "b");
        q.add_in("c1", "c");
        let mut order = Vec::new();
        while q.depth() > 0 {
            order.push(q.next().await.unwrap());
        }
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "a3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_keeps_its_lane_when_it_comes_round_again() {
        let q: WorkQueue<&str, &str> = WorkQueue::new();
        q.add_in("a1", "a");
        assert_eq!(q.next().await, Some("a1"));
        // Added again while processed, and scheduled after a failure: both in lane a.
        q.add("a1");
        q.done(&"a1");
        assert_eq!(q.next().await, Some("a1"));
        q.add_after_failure("a1");
        q.done(&"a1");
        for key in ["a2", "a3"] {
            q.add_in(key, "a");
        }
        q.add_in("b1", "b");
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut order = Vec::new();
        while q.depth() > 0 {
            order.push(q.next().await.unwrap());
        }
        // a1 rejoined lane a behind a2 and a3: b1 had the turn after a2.
        assert_eq!(order, ["a2", "b1", "a3", "a1"]);
    }

    #[tokio::test]
    async fn a_released_key_forgets_its_lane_and_a_forgotten_one_leaves_no_turn() {
        let q: WorkQueue<&str, &str> = WorkQueue::new();
        q.add_in("x", "a");
        assert_eq!(q.next().await, Some("x"));
        q.done(&"x");
        assert!(q.lock().lanes.is_empty(), "nothing refers to x any more");
        // Queued plainly afterwards: the lane of keys without one.
        q.add("x");
        q.add_in("y", "a");
        q.add_in("z", "a");
        assert_eq!(q.next().await, Some("x"));
        q.forget(&"y");
        assert_eq!(q.next().await, Some("z"));
        let state = q.lock();
        assert!(state.turns.is_empty() && state.ready.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_put_back_is_next_in_its_lane_and_counted_once() {
        let q: WorkQueue<&str, &str> = WorkQueue::new();
        for key in ["a1", "a2"] {
            q.add_in(key, "a");
        }
        q.add_in("b1", "b");
        assert_eq!(q.depth(), 3);
        assert_eq!(q.next().await, Some("a1"));
        // Added again and scheduled while out: still one key, queued now.
        q.add("a1");
        q.add_after("a1", Duration::from_secs(5));
        q.put_back("a1");
        assert_eq!(q.depth(), 3, "the depth is as before the take");
        // b1 has the turn a1's lane gave up; a1 is then first of its lane again.
        let mut order = Vec::new();
        while q.depth() > 0 {
            let key = q.next().await.unwrap();
            q.done(&key);
            order.push(key);
        }
        assert_eq!(order, ["b1", "a1", "a2"]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.depth(), 0, "the schedule went with the put back");
        // The last key of its lane comes back as the lane's only key, with a turn.
        q.add_in("c1", "c");
        assert_eq!(q.next().await, Some("c1"));
        q.put_back("c1");
        q.close();
        assert_eq!(q.depth(), 1);
        let state = q.lock();
        assert_eq!(state.turns, [Some("c")]);
        assert!(state.processing.is_empty() && state.dirty.is_empty());
    }

    #[tokio::test]
    async fn forgotten_keys_are_skipped_and_close_releases_workers() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.forget(&"a");
        assert_eq!(q.next().await, Some("b"));
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
        q.add("c");
        assert_eq!(q.next().await, None);
    }
}
