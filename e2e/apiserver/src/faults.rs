//! Fault injection: latency, error answers, watch closing, partitions and a global pause,
//! each for one identity or for everyone, with counters of what was injected.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::error::ApiError;

/// Who a fault applies to: everyone, or the identity with this name (as in the kubeconfig).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultScope {
    /// Every client, anonymous ones included.
    Global,
    /// Only the identity with this name.
    Identity(String),
}

impl FaultScope {
    /// The scope of the identity named `name`.
    pub fn identity(name: impl Into<String>) -> Self {
        Self::Identity(name.into())
    }

    fn covers(&self, identity: Option<&str>) -> bool {
        match self {
            Self::Global => true,
            Self::Identity(n) => identity == Some(n.as_str()),
        }
    }

    fn label(&self) -> Option<String> {
        match self {
            Self::Global => None,
            Self::Identity(n) => Some(n.clone()),
        }
    }
}

/// Answer a fraction of requests with an error instead of serving them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorFault {
    /// Probability in `[0, 1]` that a request fails.
    pub rate: f64,
    /// Status codes to answer with, chosen at random among them: 429, 500 or 503.
    pub codes: Vec<u16>,
    /// `Retry-After` seconds on 429 and 503 answers.
    #[serde(default = "default_retry_after")]
    pub retry_after_seconds: u64,
    /// Seed of this fault's random sequence; the server's fault seed when absent.
    #[serde(default)]
    pub seed: Option<u64>,
}

fn default_retry_after() -> u64 {
    1
}

impl ErrorFault {
    /// Fails `rate` of the requests with one of `codes`, with `Retry-After: 1` and the server's
    /// fault seed.
    pub fn new(rate: f64, codes: impl Into<Vec<u16>>) -> Self {
        Self {
            rate,
            codes: codes.into(),
            retry_after_seconds: 1,
            seed: None,
        }
    }

    /// Sets the `Retry-After` seconds.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_seconds = seconds;
        self
    }

    pub(crate) fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
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

/// How many faults were injected since start (or the last reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    /// Requests whose connection was dropped by a partition, plus watch streams cut by one.
    pub refused_requests: u64,
    /// Requests that arrived while paused and were held.
    pub paused_requests: u64,
}

#[derive(Default)]
struct Counters {
    delayed: AtomicU64,
    e429: AtomicU64,
    e500: AtomicU64,
    e503: AtomicU64,
    closed: AtomicU64,
    refused: AtomicU64,
    paused: AtomicU64,
}

/// A latency in force, as reported by the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopedLatency {
    /// The identity it applies to; `None` for everyone.
    pub identity: Option<String>,
    /// The delay added to each request, in milliseconds.
    pub ms: u64,
}

/// An error fault in force, as reported by the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopedErrors {
    pub(crate) identity: Option<String>,
    /// The fault as it was set.
    #[serde(flatten)]
    pub fault: ErrorFault,
}

/// A periodic watch close in force, as reported by the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopedPeriod {
    pub(crate) identity: Option<String>,
    /// The period between closes, in milliseconds.
    pub every_ms: u64,
}

/// The faults in force.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveFaults {
    /// Whether the server is paused.
    pub paused: bool,
    /// Added latencies, global first, then by identity.
    pub latency: Vec<ScopedLatency>,
    /// Error faults, global first, then by identity.
    pub errors: Vec<ScopedErrors>,
    /// Partitioned scopes in the order they were set: an identity's name, `None` for everyone.
    pub partitions: Vec<Option<String>>,
    /// Periodic watch closes, global first, then by identity.
    pub close_watches_every: Vec<ScopedPeriod>,
}

/// Active faults and counters, as `GET /_fault` answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FaultStatus {
    pub(crate) active: ActiveFaults,
    pub(crate) counters: FaultCounters,
}

/// A signal to open watch streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchSignal {
    /// End matching streams cleanly, as a server does on timeout.
    Close(FaultScope),
    /// Abort matching streams mid-flight, as a broken connection would.
    Cut(FaultScope),
}

impl WatchSignal {
    pub fn applies_to(&self, identity: Option<&str>) -> bool {
        match self {
            Self::Close(s) | Self::Cut(s) => s.covers(identity),
        }
    }
}

/// What to do with a request after faults are considered.
#[derive(Debug)]
pub enum Verdict {
    Proceed,
    /// Answer with this error.
    Fail(ApiError),
    /// Drop the connection without an answer.
    Refuse,
}

struct ErrorState {
    fault: ErrorFault,
    rng: ChaCha8Rng,
}

#[derive(Default)]
struct State {
    latency: BTreeMap<FaultScope, Duration>,
    errors: BTreeMap<FaultScope, ErrorState>,
    partitions: Vec<FaultScope>,
    periodic: HashMap<FaultScope, (Duration, JoinHandle<()>)>,
}

/// The fault controller of one server; cheap to call from any thread.
pub struct Faults {
    state: Mutex<State>,
    counters: Counters,
    pause: watch::Sender<bool>,
    signals: broadcast::Sender<WatchSignal>,
    runtime: tokio::runtime::Handle,
    seed: u64,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("status", &self.status())
            .finish()
    }
}

impl Faults {
    pub(crate) fn new(runtime: tokio::runtime::Handle, seed: u64) -> Self {
        let (pause, _) = watch::channel(false);
        let (signals, _) = broadcast::channel(64);
        Self {
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            pause,
            signals,
            runtime,
            seed,
        }
    }

    /// Adds `delay` to every request in scope (global and per-identity delays add up).
    pub fn set_latency(&self, scope: FaultScope, delay: Duration) {
        self.state.lock().latency.insert(scope, delay);
    }

    /// Removes the latency set for exactly this scope.
    pub fn clear_latency(&self, scope: &FaultScope) {
        self.state.lock().latency.remove(scope);
    }

    /// Fails a fraction of requests in scope; an identity's own fault wins over the global one.
    pub fn set_errors(&self, scope: FaultScope, fault: ErrorFault) -> Result<(), FaultError> {
        if !(0.0..=1.0).contains(&fault.rate) || fault.rate.is_nan() {
            return Err(FaultError::Rate(fault.rate));
        }
        if fault.codes.is_empty() || fault.codes.iter().any(|c| ![429, 500, 503].contains(c)) {
            return Err(FaultError::Codes(fault.codes));
        }
        let rng = ChaCha8Rng::seed_from_u64(fault.seed.unwrap_or(self.seed));
        self.state
            .lock()
            .errors
            .insert(scope, ErrorState { fault, rng });
        Ok(())
    }

    /// Removes the error fault set for exactly this scope.
    pub fn clear_errors(&self, scope: &FaultScope) {
        self.state.lock().errors.remove(scope);
    }

    /// Ends the open watch streams in scope now; clients see a clean end of stream.
    pub fn close_watches(&self, scope: FaultScope) {
        // No receivers just means there are no open watches.
        let _ = self.signals.send(WatchSignal::Close(scope));
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
        let s = scope.clone();
        let task = self.runtime.spawn(async move {
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                ticker.tick().await;
                let _ = signals.send(WatchSignal::Close(s.clone()));
            }
        });
        if let Some((_, old)) = self.state.lock().periodic.insert(scope, (period, task)) {
            old.abort();
        }
        Ok(())
    }

    /// Stops the periodic watch close set for exactly this scope.
    pub fn clear_close_watches(&self, scope: &FaultScope) {
        if let Some((_, task)) = self.state.lock().periodic.remove(scope) {
            task.abort();
        }
    }

    /// Refuses the clients in scope entirely: their connections are dropped without an answer
    /// and their open watches are cut, so they see the server as unreachable.
    pub fn partition(&self, scope: FaultScope) {
        {
            let mut st = self.state.lock();
            if !st.partitions.contains(&scope) {
                st.partitions.push(scope.clone());
            }
        }
        let _ = self.signals.send(WatchSignal::Cut(scope));
    }

    /// Ends the partition of exactly this scope.
    pub fn heal(&self, scope: &FaultScope) {
        self.state.lock().partitions.retain(|s| s != scope);
    }

    /// Holds every request (and every watch event) until [`Faults::resume`].
    pub fn pause(&self) {
        self.pause.send_replace(true);
    }

    /// Ends the pause: held requests and watch events go on.
    pub fn resume(&self) {
        self.pause.send_replace(false);
    }

    /// Clears every fault of one scope (the pause is global and is left alone).
    pub fn clear(&self, scope: &FaultScope) {
        self.clear_latency(scope);
        self.clear_errors(scope);
        self.clear_close_watches(scope);
        self.heal(scope);
    }

    /// Clears every fault and resumes.
    pub fn clear_all(&self) {
        let mut st = self.state.lock();
        for (_, (_, task)) in st.periodic.drain() {
            task.abort();
        }
        *st = State::default();
        drop(st);
        self.resume();
    }

    /// What was injected so far.
    pub fn counters(&self) -> FaultCounters {
        let c = &self.counters;
        FaultCounters {
            delayed_requests: c.delayed.load(Ordering::Relaxed),
            injected_429: c.e429.load(Ordering::Relaxed),
            injected_500: c.e500.load(Ordering::Relaxed),
            injected_503: c.e503.load(Ordering::Relaxed),
            watches_closed: c.closed.load(Ordering::Relaxed),
            refused_requests: c.refused.load(Ordering::Relaxed),
            paused_requests: c.paused.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn reset_counters(&self) {
        let c = &self.counters;
        for a in [
            &c.delayed, &c.e429, &c.e500, &c.e503, &c.closed, &c.refused, &c.paused,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// The faults in force.
    pub fn active(&self) -> ActiveFaults {
        let st = self.state.lock();
        let mut periodic: Vec<ScopedPeriod> = st
            .periodic
            .iter()
            .map(|(s, (p, _))| ScopedPeriod {
                identity: s.label(),
                every_ms: u64::try_from(p.as_millis()).unwrap_or(u64::MAX),
            })
            .collect();
        periodic.sort_by(|a, b| a.identity.cmp(&b.identity));
        ActiveFaults {
            paused: *self.pause.borrow(),
            latency: st
                .latency
                .iter()
                .map(|(s, d)| ScopedLatency {
                    identity: s.label(),
                    ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
                })
                .collect(),
            errors: st
                .errors
                .iter()
                .map(|(s, e)| ScopedErrors {
                    identity: s.label(),
                    fault: e.fault.clone(),
                })
                .collect(),
            partitions: st.partitions.iter().map(FaultScope::label).collect(),
            close_watches_every: periodic,
        }
    }

    pub(crate) fn status(&self) -> FaultStatus {
        FaultStatus {
            active: self.active(),
            counters: self.counters(),
        }
    }

    fn partitioned(&self, identity: Option<&str>) -> bool {
        self.state
            .lock()
            .partitions
            .iter()
            .any(|s| s.covers(identity))
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.pause.borrow()
    }

    /// Waits while the server is paused.
    pub(crate) async fn wait_unpaused(&self) {
        let mut rx = self.pause.subscribe();
        // The sender lives as long as `self`, so this only ends when resumed.
        let _ = rx.wait_for(|paused| !*paused).await;
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<WatchSignal> {
        self.signals.subscribe()
    }

    pub(crate) fn count_watch_closed(&self) {
        self.counters.closed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_refused(&self) {
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Applies the faults in force to one request from `identity` (None: anonymous).
    pub(crate) async fn admit(&self, identity: Option<&str>) -> Verdict {
        if self.partitioned(identity) {
            self.count_refused();
            return Verdict::Refuse;
        }
        if self.is_paused() {
            self.counters.paused.fetch_add(1, Ordering::Relaxed);
            self.wait_unpaused().await;
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
        match self.roll_error(identity) {
            Some(e) => Verdict::Fail(e),
            None => Verdict::Proceed,
        }
    }

    fn roll_error(&self, identity: Option<&str>) -> Option<ApiError> {
        let mut st = self.state.lock();
        let own = identity.map(|n| FaultScope::Identity(n.to_string()));
        let scope = match own {
            Some(s) if st.errors.contains_key(&s) => s,
            _ => FaultScope::Global,
        };
        let entry = st.errors.get_mut(&scope)?;
        if entry.rng.random::<f64>() >= entry.fault.rate {
            return None;
        }
        let code = entry.fault.codes[entry.rng.random_range(0..entry.fault.codes.len())];
        let retry = entry.fault.retry_after_seconds;
        drop(st);
        let (counter, err) = match code {
            429 => (&self.counters.e429, ApiError::too_many_requests(retry)),
            500 => (&self.counters.e500, ApiError::internal("injected fault")),
            _ => (
                &self.counters.e503,
                ApiError::unavailable(
                    "injected fault: the server is currently unable to handle the request",
                    Some(retry),
                ),
            ),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Some(err)
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        for (_, (_, task)) in self.state.get_mut().periodic.drain() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults() -> Faults {
        Faults::new(tokio::runtime::Handle::current(), 7)
    }

    #[tokio::test]
    async fn error_rates_are_reproducible() {
        let run = || async {
            let f = faults();
            f.set_errors(FaultScope::Global, ErrorFault::new(0.5, [429, 503]))
                .unwrap();
            let mut out = Vec::new();
            for _ in 0..20 {
                out.push(match f.admit(Some("x")).await {
                    Verdict::Fail(e) => e.code,
                    _ => 200,
                });
            }
            out
        };
        let a = run().await;
        assert_eq!(a, run().await);
        assert!(
            a.contains(&200) && a.contains(&429) && a.contains(&503),
            "{a:?}"
        );
    }

    #[tokio::test]
    async fn identity_scopes() {
        let f = faults();
        f.partition(FaultScope::identity("r1"));
        assert!(matches!(f.admit(Some("r1")).await, Verdict::Refuse));
        assert!(matches!(f.admit(Some("r2")).await, Verdict::Proceed));
        assert!(matches!(f.admit(None).await, Verdict::Proceed));
        f.clear(&FaultScope::identity("r1"));
        assert!(matches!(f.admit(Some("r1")).await, Verdict::Proceed));
        assert_eq!(f.counters().refused_requests, 1);
    }

    #[test]
    fn validation() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let f = Faults::new(rt.handle().clone(), 1);
        assert_eq!(
            f.set_errors(FaultScope::Global, ErrorFault::new(1.5, [503])),
            Err(FaultError::Rate(1.5))
        );
        assert!(
            f.set_errors(FaultScope::Global, ErrorFault::new(0.5, [404]))
                .is_err()
        );
        assert!(
            f.set_errors(FaultScope::Global, ErrorFault::new(0.5, Vec::new()))
                .is_err()
        );
    }
}
