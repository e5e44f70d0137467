//! The faults a test injects between a cluster's clients and its kube-apiserver: latency,
//! error answers, watches closed, partitions and a pause, each for one identity or for every
//! identity, with counters of what was injected. This is the decision side, kept apart from the
//! proxy that acts on it ([`crate::real`]'s links) so that it can be tested by feeding it
//! requests.
//!
//! The harness's own `admin` reaches each server directly and is never faulted: a test's checks
//! must see the cluster as it is.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardwise_e2e_testkit::FaultScope;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

/// Answer a fraction of requests with an error instead of forwarding them.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorFault {
    /// Probability in `[0, 1]` that a request fails.
    pub rate: f64,
    /// Status codes to answer with, chosen at random among them: 429, 500 or 503.
    pub codes: Vec<u16>,
    /// `Retry-After` seconds on 429 and 503 answers.
    pub retry_after_seconds: u64,
    /// Seed of this fault's random sequence, so a run can be repeated.
    pub seed: u64,
}

impl ErrorFault {
    /// Fails `rate` of the requests with one of `codes`, with `Retry-After: 1`.
    pub fn new(rate: f64, codes: impl Into<Vec<u16>>) -> Self {
        Self {
            rate,
            codes: codes.into(),
            retry_after_seconds: 1,
            seed: 0x5eed,
        }
    }

    /// Sets the `Retry-After` seconds.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_seconds = seconds;
        self
    }

    /// Sets the seed of the random sequence.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// Why a fault was not set.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultError {
    /// The error rate is not a probability.
    #[error("rate must be between 0 and 1, got {0}")]
    Rate(f64),
    /// No status codes, or one the error fault cannot answer with.
    #[error("codes must be a non-empty subset of 429, 500 and 503, got {0:?}")]
    Codes(Vec<u16>),
    /// A periodic watch close with a zero period.
    #[error("the period must be positive")]
    Period,
}

/// How many faults were injected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Requests that were delayed.
    pub delayed_requests: u64,
    /// Requests answered 429 by the error fault.
    pub injected_429: u64,
    /// Requests answered 500 by the error fault.
    pub injected_500: u64,
    /// Requests answered 503 by the error fault.
    pub injected_503: u64,
    /// Watch streams ended by a close-watches fault.
    pub watches_closed: u64,
    /// Connections dropped by a partition, open or new.
    pub refused_connections: u64,
    /// Requests that arrived while paused and were held.
    pub paused_requests: u64,
}

#[derive(Debug, Default)]
struct Counters {
    delayed: AtomicU64,
    e429: AtomicU64,
    e500: AtomicU64,
    e503: AtomicU64,
    closed: AtomicU64,
    refused: AtomicU64,
    paused: AtomicU64,
}

/// What a link must do to open streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// End matching watch streams cleanly, as a server does at a watch's timeout.
    Close(FaultScope),
    /// Drop matching connections, as a broken network would.
    Cut(FaultScope),
}

impl Signal {
    pub(crate) fn applies_to(&self, identity: &str) -> bool {
        match self {
            Self::Close(s) | Self::Cut(s) => s.covers(identity),
        }
    }
}

/// What to do with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Forward it.
    Forward,
    /// Answer with this status code (and `Retry-After` seconds for 429 and 503) instead.
    Fail { code: u16, retry_after: u64 },
    /// Drop the connection without an answer.
    Refuse,
}

#[derive(Debug)]
struct ErrorState {
    fault: ErrorFault,
    rng: ChaCha8Rng,
}

#[derive(Debug, Default)]
struct State {
    latency: BTreeMap<FaultScope, Duration>,
    errors: BTreeMap<FaultScope, ErrorState>,
    partitions: Vec<FaultScope>,
    periodic: BTreeMap<FaultScope, JoinHandle<()>>,
}

/// The faults of one cluster; cheap to call from any thread. Its periodic closes run on the
/// runtime it was given.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    counters: Counters,
    pause: watch::Sender<bool>,
    signals: broadcast::Sender<Signal>,
    runtime: tokio::runtime::Handle,
}

impl Faults {
    pub(crate) fn new(runtime: tokio::runtime::Handle) -> Self {
        Self {
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            pause: watch::channel(false).0,
            signals: broadcast::channel(64).0,
            runtime,
        }
    }

    /// Adds `delay` to every request in scope (global and per-identity delays add up); zero
    /// removes it.
    pub fn set_latency(&self, scope: FaultScope, delay: Duration) {
        let mut state = self.state.lock();
        if delay.is_zero() {
            state.latency.remove(&scope);
        } else {
            state.latency.insert(scope, delay);
        }
    }

    /// Fails a fraction of requests in scope; an identity's own fault wins over the global one.
    pub fn set_errors(&self, scope: FaultScope, fault: ErrorFault) -> Result<(), FaultError> {
        if !(0.0..=1.0).contains(&fault.rate) {
            return Err(FaultError::Rate(fault.rate));
        }
        if fault.codes.is_empty() || fault.codes.iter().any(|c| ![429, 500, 503].contains(c)) {
            return Err(FaultError::Codes(fault.codes));
        }
        let rng = ChaCha8Rng::seed_from_u64(fault.seed);
        self.state
            .lock()
            .errors
            .insert(scope, ErrorState { fault, rng });
        Ok(())
    }

    /// Ends the open watch streams in scope now; clients see a clean end of stream.
    pub fn close_watches(&self, scope: FaultScope) {
        // No receivers just means no link is open.
        let _ = self.signals.send(Signal::Close(scope));
    }

    /// Closes the watches in scope every `period` until cleared.
    pub fn close_watches_every(
        &self,
        scope: FaultScope,
        period: Duration,
    ) -> Result<(), FaultError> {
        if period.is_zero() {
            return Err(FaultError::Period);
        }
        let signals = self.signals.clone();
        let closing = scope.clone();
        let task = self.runtime.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                ticks.tick().await;
                let _ = signals.send(Signal::Close(closing.clone()));
            }
        });
        if let Some(old) = self.state.lock().periodic.insert(scope, task) {
            old.abort();
        }
        Ok(())
    }

    /// Cuts the identities in scope off: their open connections (watches included) drop and
    /// new ones are dropped without an answer, so they see the server as unreachable.
    pub fn partition(&self, scope: FaultScope) {
        {
            let mut state = self.state.lock();
            if !state.partitions.contains(&scope) {
                state.partitions.push(scope.clone());
            }
        }
        let _ = self.signals.send(Signal::Cut(scope));
    }

    /// Ends the partition of exactly this scope.
    pub fn heal(&self, scope: &FaultScope) {
        self.state.lock().partitions.retain(|s| s != scope);
    }

    /// Holds every request and every watch event of every identity until [`Faults::resume`].
    pub fn pause(&self) {
        self.pause.send_replace(true);
    }

    /// Ends the pause: held requests and watch events go on.
    pub fn resume(&self) {
        self.pause.send_replace(false);
    }

    /// Clears every fault of exactly this scope (the pause, which has none, is left alone).
    pub fn clear(&self, scope: &FaultScope) {
        let mut state = self.state.lock();
        state.latency.remove(scope);
        state.errors.remove(scope);
        state.partitions.retain(|s| s != scope);
        if let Some(task) = state.periodic.remove(scope) {
            task.abort();
        }
    }

    /// Clears every fault and resumes.
    pub fn clear_all(&self) {
        let mut state = self.state.lock();
        for (_, task) in std::mem::take(&mut state.periodic) {
            task.abort();
        }
        *state = State::default();
        drop(state);
        self.resume();
    }

    /// What was injected so far.
    pub fn counters(&self) -> FaultCounters {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultCounters {
            delayed_requests: load(&c.delayed),
            injected_429: load(&c.e429),
            injected_500: load(&c.e500),
            injected_503: load(&c.e503),
            watches_closed: load(&c.closed),
            refused_connections: load(&c.refused),
            paused_requests: load(&c.paused),
        }
    }

    pub(crate) fn partitioned(&self, identity: &str) -> bool {
        self.state
            .lock()
            .partitions
            .iter()
            .any(|s| s.covers(identity))
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }

    pub(crate) fn paused(&self) -> watch::Receiver<bool> {
        self.pause.subscribe()
    }

    pub(crate) fn count_refused(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_watch_closed(&self) {
        self.counters.closed.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies the faults in force to one request of `identity`: waits out a pause and the
    /// latency, then decides.
    pub(crate) async fn admit(&self, identity: &str) -> Verdict {
        let mut paused = self.paused();
        if *paused.borrow_and_update() {
            self.counters.paused.fetch_add(1, Ordering::Relaxed);
            // The sender lives as long as `self`: this ends only when resumed.
            let _ = paused.wait_for(|paused| !*paused).await;
        }
        let delay: Duration = self
            .state
            .lock()
            .latency
            .iter()
            .filter(|(s, _)| s.covers(identity))
            .map(|(_, d)| *d)
            .sum();
        if !delay.is_zero() {
            self.counters.delayed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
        }
        if self.partitioned(identity) {
            self.count_refused();
            return Verdict::Refuse;
        }
        self.roll_error(identity)
    }

    fn roll_error(&self, identity: &str) -> Verdict {
        let mut state = self.state.lock();
        let own = FaultScope::identity(identity);
        let scope = if state.errors.contains_key(&own) {
            own
        } else {
            FaultScope::Global
        };
        let Some(entry) = state.errors.get_mut(&scope) else {
            return Verdict::Forward;
        };
        if entry.rng.random::<f64>() >= entry.fault.rate {
            return Verdict::Forward;
        }
        let code = entry.fault.codes[entry.rng.random_range(0..entry.fault.codes.len())];
        let retry_after = entry.fault.retry_after_seconds;
        drop(state);
        let counter = match code {
            429 => &self.counters.e429,
            500 => &self.counters.e500,
            _ => &self.counters.e503,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Verdict::Fail { code, retry_after }
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        for (_, task) in std::mem::take(&mut self.state.get_mut().periodic) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults() -> Faults {
        Faults::new(tokio::runtime::Handle::current())
    }

    #[tokio::test]
    async fn a_request_with_no_fault_in_force_is_forwarded() {
        let f = faults();
        assert_eq!(f.admit("a").await, Verdict::Forward);
        assert_eq!(f.counters(), FaultCounters::default());
    }

    #[tokio::test]
    async fn errors_hit_their_scope_at_their_rate_and_an_identitys_own_fault_wins() {
        let f = faults();
        f.set_errors(FaultScope::Global, ErrorFault::new(1.0, [500]))
            .unwrap();
        f.set_errors(
            FaultScope::identity("b"),
            ErrorFault::new(1.0, [429]).retry_after(3),
        )
        .unwrap();
        assert_eq!(
            f.admit("a").await,
            Verdict::Fail {
                code: 500,
                retry_after: 1
            }
        );
        assert_eq!(
            f.admit("b").await,
            Verdict::Fail {
                code: 429,
                retry_after: 3
            }
        );
        f.set_errors(FaultScope::identity("b"), ErrorFault::new(0.0, [429]))
            .unwrap();
        assert_eq!(f.admit("b").await, Verdict::Forward);

        // A rate between: about that share of requests fails, the same share every run.
        f.clear(&FaultScope::Global);
        f.set_errors(FaultScope::identity("c"), ErrorFault::new(0.25, [500, 429]))
            .unwrap();
        let mut failed = 0;
        for _ in 0..2_000 {
            if f.admit("c").await != Verdict::Forward {
                failed += 1;
            }
        }
        assert!((400..600).contains(&failed), "{failed} of 2000 failed");
        let counters = f.counters();
        assert_eq!(counters.injected_500 + counters.injected_429, failed + 2);
        assert!(counters.injected_429 > 1 && counters.injected_500 > 1);
    }

    #[test]
    fn bad_faults_are_refused() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let f = Faults::new(runtime.handle().clone());
        let scope = FaultScope::Global;
        assert_eq!(
            f.set_errors(scope.clone(), ErrorFault::new(1.5, [500])),
            Err(FaultError::Rate(1.5))
        );
        assert_eq!(
            f.set_errors(scope.clone(), ErrorFault::new(f64::NAN, [500]))
                .map_err(|e| matches!(e, FaultError::Rate(_))),
            Err(true)
        );
        assert_eq!(
            f.set_errors(scope.clone(), ErrorFault::new(0.5, [404])),
            Err(FaultError::Codes(vec![404]))
        );
        assert_eq!(
            f.close_watches_every(scope, Duration::ZERO),
            Err(FaultError::Period)
        );
    }

    #[tokio::test]
    async fn a_partition_refuses_its_scope_until_healed() {
        let f = faults();
        let mut signals = f.subscribe();
        f.partition(FaultScope::identity("a"));
        assert_eq!(f.admit("a").await, Verdict::Refuse);
        assert_eq!(f.admit("b").await, Verdict::Forward);
        let signal = signals.recv().await.unwrap();
        assert!(signal.applies_to("a") && !signal.applies_to("b"));
        f.heal(&FaultScope::identity("a"));
        assert_eq!(f.admit("a").await, Verdict::Forward);
        assert_eq!(f.counters().refused_connections, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn latencies_in_scope_add_up_and_a_pause_holds_until_resumed() {
        let f = std::sync::Arc::new(faults());
        f.set_latency(FaultScope::Global, Duration::from_millis(100));
        f.set_latency(FaultScope::identity("a"), Duration::from_millis(50));
        let start = tokio::time::Instant::now();
        assert_eq!(f.admit("a").await, Verdict::Forward);
        assert_eq!(start.elapsed(), Duration::from_millis(150));
        f.set_latency(FaultScope::Global, Duration::ZERO);
        let start = tokio::time::Instant::now();
        f.admit("b").await;
        assert_eq!(start.elapsed(), Duration::ZERO);

        f.pause();
        let held = tokio::spawn({
            let f = f.clone();
            async move { f.admit("b").await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!held.is_finished(), "a request went through a pause");
        f.resume();
        assert_eq!(held.await.unwrap(), Verdict::Forward);
        let counters = f.counters();
        assert_eq!(
            (counters.delayed_requests, counters.paused_requests),
            (1, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn periodic_closes_signal_their_scope_until_cleared() {
        let f = faults();
        let mut signals = f.subscribe();
        let scope = FaultScope::identity("a");
        f.close_watches_every(scope.clone(), Duration::from_secs(10))
            .unwrap();
        let start = tokio::time::Instant::now();
        assert_eq!(signals.recv().await.unwrap(), Signal::Close(scope.clone()));
        assert_eq!(signals.recv().await.unwrap(), Signal::Close(scope.clone()));
        assert_eq!(start.elapsed(), Duration::from_secs(20));
        f.clear(&scope);
        let quiet = tokio::time::timeout(Duration::from_secs(60), signals.recv()).await;
        assert!(quiet.is_err(), "closed again after clear: {quiet:?}");
    }
}
