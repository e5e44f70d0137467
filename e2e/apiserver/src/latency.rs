//! Latency added to requests, for one identity or for every client: what the fleet benchmark's
//! `scale` section needs of this server (10 ms on every destination request). The other faults
//! the suites inject (error answers, closed watches, partitions, a pause) are the harness's
//! proxy's, in front of kube-apiserver.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use shardwise_e2e_testkit::FaultScope;

/// The delays of one server; cheap to call from any thread.
#[derive(Debug, Default)]
pub struct Latency {
    delays: Mutex<BTreeMap<FaultScope, Duration>>,
    delayed: AtomicU64,
}

impl Latency {
    /// Adds `delay` to every request in scope (a global delay and an identity's add up); zero
    /// removes it.
    pub fn set(&self, scope: FaultScope, delay: Duration) {
        let mut delays = self.delays.lock();
        if delay.is_zero() {
            delays.remove(&scope);
        } else {
            delays.insert(scope, delay);
        }
    }

    /// Removes every delay.
    pub fn clear(&self) {
        self.delays.lock().clear();
    }

    /// How many requests were delayed so far.
    pub fn delayed_requests(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }

    /// What a request from `identity` waits (`None`: anonymous, which only a global delay
    /// reaches).
    fn delay_for(&self, identity: Option<&str>) -> Duration {
        self.delays
            .lock()
            .iter()
            .filter(|(scope, _)| match identity {
                Some(name) => scope.covers(name),
                None => **scope == FaultScope::Global,
            })
            .map(|(_, delay)| *delay)
            .sum()
    }

    /// Waits as long as the delays in force for `identity` say.
    pub(crate) async fn wait(&self, identity: Option<&str>) {
        let delay = self.delay_for(identity);
        if !delay.is_zero() {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_add_up_by_scope_and_zero_removes() {
        let latency = Latency::default();
        latency.set(FaultScope::Global, Duration::from_millis(10));
        latency.set(FaultScope::identity("a"), Duration::from_millis(5));
        assert_eq!(latency.delay_for(Some("a")), Duration::from_millis(15));
        assert_eq!(latency.delay_for(Some("b")), Duration::from_millis(10));
        assert_eq!(latency.delay_for(None), Duration::from_millis(10));
        latency.set(FaultScope::Global, Duration::ZERO);
        assert_eq!(latency.delay_for(Some("a")), Duration::from_millis(5));
        assert_eq!(latency.delay_for(None), Duration::ZERO);
        latency.clear();
        assert_eq!(latency.delay_for(Some("a")), Duration::ZERO);
    }
}
