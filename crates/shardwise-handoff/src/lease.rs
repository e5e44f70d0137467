//! Lease timing: when a holder must stop (fencing), when an observer may consider a lease
//! expired, and what a replica should do with its lease.
//!
//! Every duration is measured on the local monotonic clock of the process that measures it, never
//! by comparing one machine's timestamps with another's, so clock offsets between machines do not
//! matter; only clock *rates* do (see `docs/guarantees.md`).
//!
//! The safety margin: a holder stops all work `renew_deadline` after it *started* its last
//! successful renewal, while an observer considers the lease expired `duration` after it *saw*
//! that renewal, which is later. As `renew_deadline < duration`, the holder has stopped at least
//! `duration - renew_deadline` before anyone takes its work.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use thiserror::Error;

/// How leases are held and judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a lease stays valid after its holder's last renewal, as seen by others.
    pub duration: Duration,
    /// How long a holder keeps working without a successful renewal. Shorter than `duration`.
    pub renew_deadline: Duration,
    /// Interval between renewals (and between attempts while failing).
    pub retry_period: Duration,
}

/// Why a [`LeaseTiming`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimingError {
    /// The lease duration is shorter than 1 s.
    #[error("lease duration must be at least 1 s (got {0:?})")]
    TooShort(Duration),
    /// The renew deadline is not at least 1 s shorter than the lease duration.
    #[error(
        "renew deadline {deadline:?} must be shorter than the lease duration {duration:?}, with at least 1 s to spare"
    )]
    DeadlineTooLong {
        /// The renew deadline.
        deadline: Duration,
        /// The lease duration.
        duration: Duration,
    },
    /// The retry period is not shorter than the renew deadline.
    #[error("retry period {retry:?} must be shorter than the renew deadline {deadline:?}")]
    RetryTooLong {
        /// The retry period.
        retry: Duration,
        /// The renew deadline.
        deadline: Duration,
    },
}

impl LeaseTiming {
    /// 15 s / 10 s / 2 s, Kubernetes' usual leader-election settings.
    pub const DEFAULT: LeaseTiming = LeaseTiming {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// Checks that the durations fit together: a lease duration of at least 1 s, a renew
    /// deadline at least 1 s shorter, and a retry period shorter than the renew deadline.
    pub fn validate(&self) -> Result<(), TimingError> {
        if self.duration < Duration::from_secs(1) {
            return Err(TimingError::TooShort(self.duration));
        }
        if self.renew_deadline + Duration::from_secs(1) > self.duration {
            return Err(TimingError::DeadlineTooLong {
                deadline: self.renew_deadline,
                duration: self.duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(TimingError::RetryTooLong {
                retry: self.retry_period,
                deadline: self.renew_deadline,
            });
        }
        Ok(())
    }

    /// The instant a holder must have stopped all work, given when it started its last
    /// successful renewal.
    pub fn fence_at(&self, last_renewal_started: Instant) -> Instant {
        last_renewal_started + self.renew_deadline
    }
}

/// A lease as read from the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Current holder; `None` or empty when released.
    pub holder: Option<String>,
    /// Changes at every write of the lease (its resourceVersion): a renewal is a change.
    pub version: String,
    /// `spec.leaseDurationSeconds`, as the holder declared it.
    pub duration: Duration,
}

impl LeaseRecord {
    fn held(&self) -> bool {
        self.holder.as_deref().is_some_and(|h| !h.is_empty())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Observation {
    record: LeaseRecord,
    /// When this observer first saw `record` (by its own clock).
    since: Instant,
}

/// Judges leases by watching them change. A lease is valid while it has a holder and has changed
/// within its duration, as seen by this observer. What was first seen at `start` counts as seen
/// at `start`: an observer that just started waits a full duration before it calls a lease dead.
#[derive(Clone, Debug, Default)]
pub struct LeaseObserver {
    leases: BTreeMap<String, Observation>,
}

impl LeaseObserver {
    /// An observer that has seen no lease yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what a lease looks like now.
    pub fn observe(&mut self, name: &str, record: LeaseRecord, now: Instant) {
        match self.leases.get_mut(name) {
            Some(seen) if seen.record == record => {}
            Some(seen) => {
                seen.record = record;
                seen.since = now;
            }
            None => {
                self.leases
                    .insert(name.to_string(), Observation { record, since: now });
            }
        }
    }

    /// The lease was deleted.
    pub fn forget(&mut self, name: &str) {
        self.leases.remove(name);
    }

    /// The holder of the lease as last seen, whether or not the lease is still valid; `None`
    /// when it is released or was never seen.
    pub fn holder(&self, name: &str) -> Option<&str> {
        self.leases
            .get(name)
            .and_then(|o| o.record.holder.as_deref())
            .filter(|h| !h.is_empty())
    }

    /// Whether the lease is held and was renewed within its duration.
    pub fn is_valid(&self, name: &str, now: Instant) -> bool {
        self.leases
            .get(name)
            .is_some_and(|o| o.record.held() && now < o.since + o.record.duration)
    }

    /// The earliest instant after `now` at which a currently valid lease expires, if none is
    /// renewed before; the moment the observer should look again.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.leases
            .values()
            .filter(|o| o.record.held())
            .map(|o| o.since + o.record.duration)
            .filter(|&at| at > now)
            .min()
    }

    /// Leases with a holder that look expired at `now`. An observer fed by a watch must confirm
    /// these with a fresh read before acting: a stalled watch would make live leases look dead.
    pub fn expired_holders(&self, now: Instant) -> Vec<String> {
        self.leases
            .iter()
            .filter(|(_, o)| o.record.held() && now >= o.since + o.record.duration)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Names of the leases valid at `now`.
    pub fn valid_leases(&self, now: Instant) -> impl Iterator<Item = &str> {
        self.leases
            .iter()
            .filter(move |(_, o)| o.record.held() && now < o.since + o.record.duration)
            .map(|(name, _)| name.as_str())
    }
}

/// What a would-be holder should do with a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// No lease object exists: create it with us as holder.
    Create,
    /// Write us as holder (the lease is ours, released, or expired).
    Take,
    /// Someone else holds a valid lease; look again later.
    Wait,
}

/// Decides for `me`, given the lease (if it exists) and the observer that has been watching it.
pub fn lease_action(
    name: &str,
    record: Option<&LeaseRecord>,
    me: &str,
    observer: &LeaseObserver,
    now: Instant,
) -> LeaseAction {
    let Some(record) = record else {
        return LeaseAction::Create;
    };
    if !record.held() || record.holder.as_deref() == Some(me) || !observer.is_valid(name, now) {
        LeaseAction::Take
    } else {
        LeaseAction::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, version: &str) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_string),
            version: version.to_string(),
            duration: Duration::from_secs(15),
        }
    }

    #[test]
    fn default_timing_is_valid_and_inconsistent_timing_is_not() {
        assert!(LeaseTiming::DEFAULT.validate().is_ok());
        let mut t = LeaseTiming::DEFAULT;
        t.renew_deadline = Duration::from_secs(15);
        assert!(matches!(
            t.validate(),
            Err(TimingError::DeadlineTooLong { .. })
        ));
        t = LeaseTiming::DEFAULT;
        t.retry_period = Duration::from_secs(10);
        assert!(matches!(
            t.validate(),
            Err(TimingError::RetryTooLong { .. })
        ));
        t.duration = Duration::from_millis(500);
        assert!(matches!(t.validate(), Err(TimingError::TooShort(_))));
    }

    #[test]
    fn a_lease_is_valid_up_to_its_expiry_exclusive_and_only_while_held() {
        let start = Instant::now();
        let mut observer = LeaseObserver::new();
        observer.observe("held", record(Some("a"), "1"), start);
        observer.observe("released", record(None, "1"), start);
        let expiry = start + Duration::from_secs(15);
        let just_before = expiry - Duration::from_millis(1);
        // A released lease is never valid, even within its duration.
        assert_eq!(
            observer.valid_leases(just_before).collect::<Vec<_>>(),
            vec!["held"]
        );
        assert!(!observer.is_valid("released", just_before));
        // At its expiry a lease is expired, not valid: the instant it ends belongs to the
        // next holder, and no planner may wait for it again.
        assert_eq!(observer.valid_leases(expiry).count(), 0);
        assert!(!observer.is_valid("held", expiry));
        assert_eq!(observer.expired_holders(expiry), vec!["held".to_string()]);
        assert_eq!(observer.next_expiry(just_before), Some(expiry));
        assert_eq!(observer.next_expiry(expiry), None);
    }

    #[test]
    fn timing_at_each_limit_is_valid_and_one_millisecond_past_it_is_not() {
        // At every limit: a lease of 1 s, a renew deadline exactly 1 s shorter than the lease
        // (the fence's margin before the lease can expire elsewhere), a retry period just
        // under the deadline.
        let edge = LeaseTiming {
            duration: Duration::from_millis(1_000),
            renew_deadline: Duration::ZERO,
            retry_period: Duration::ZERO,
        };
        // Only the retry period (0, not under a deadline of 0) fails a lease of exactly 1 s.
        assert!(matches!(
            edge.validate(),
            Err(TimingError::RetryTooLong { .. })
        ));
        let edge = LeaseTiming {
            duration: Duration::from_millis(1_002),
            renew_deadline: Duration::from_millis(2),
            retry_period: Duration::from_millis(1),
        };
        assert_eq!(edge.validate(), Ok(()));
        let past = [
            LeaseTiming {
                duration: Duration::from_millis(999),
                renew_deadline: Duration::ZERO,
                ..edge
            },
            LeaseTiming {
                renew_deadline: Duration::from_millis(3),
                ..edge
            },
            LeaseTiming {
                retry_period: Duration::from_millis(2),
                ..edge
            },
        ];
        assert!(matches!(past[0].validate(), Err(TimingError::TooShort(_))));
        assert!(matches!(
            past[1].validate(),
            Err(TimingError::DeadlineTooLong { .. })
        ));
        assert!(matches!(
            past[2].validate(),
            Err(TimingError::RetryTooLong { .. })
        ));
    }

    #[test]
    fn a_lease_is_valid_for_its_duration_after_it_was_last_seen_to_change() {
        let t0 = Instant::now();
        let mut o = LeaseObserver::new();
        o.observe("shard-1", record(Some("a"), "1"), t0);
        assert!(o.is_valid("shard-1", t0 + Duration::from_secs(14)));
        // Seeing the same version again is not a renewal.
        o.observe(
            "shard-1",
            record(Some("a"), "1"),
            t0 + Duration::from_secs(10),
        );
        assert!(!o.is_valid("shard-1", t0 + Duration::from_secs(15)));
        assert_eq!(o.next_expiry(t0), Some(t0 + Duration::from_secs(15)));
        // A renewal (new version) restarts the clock.
        o.observe(
            "shard-1",
            record(Some("a"), "2"),
            t0 + Duration::from_secs(12),
        );
        assert!(o.is_valid("shard-1", t0 + Duration::from_secs(26)));
        assert!(!o.is_valid("shard-1", t0 + Duration::from_secs(27)));
        assert_eq!(
            o.valid_leases(t0 + Duration::from_secs(20))
                .collect::<Vec<_>>(),
            ["shard-1"]
        );
        assert!(o.expired_holders(t0 + Duration::from_secs(20)).is_empty());
        assert_eq!(o.expired_holders(t0 + Duration::from_secs(27)), ["shard-1"]);
    }

    #[test]
    fn released_and_unknown_leases_are_not_valid() {
        let t0 = Instant::now();
        let mut o = LeaseObserver::new();
        o.observe("shard-2", record(None, "5"), t0);
        assert!(!o.is_valid("shard-2", t0));
        o.observe("shard-3", record(Some(""), "1"), t0);
        assert!(!o.is_valid("shard-3", t0));
        assert!(!o.is_valid("shard-9", t0));
        assert_eq!(o.next_expiry(t0), None);
        o.observe("shard-4", record(Some("x"), "1"), t0);
        o.forget("shard-4");
        assert!(!o.is_valid("shard-4", t0));
    }

    #[test]
    fn holders_fence_before_observers_expire() {
        let timing = LeaseTiming::DEFAULT;
        let renewal_started = Instant::now();
        // The observer cannot see the renewal before it was sent.
        let seen = renewal_started + Duration::from_millis(1);
        let mut o = LeaseObserver::new();
        o.observe("l", record(Some("me"), "9"), seen);
        let fence = timing.fence_at(renewal_started);
        assert!(
            o.is_valid("l", fence),
            "the observer must still see the lease valid at the fence"
        );
        assert!(fence + (timing.duration - timing.renew_deadline) <= seen + timing.duration);
    }

    #[test]
    fn lease_actions() {
        let t0 = Instant::now();
        let mut o = LeaseObserver::new();
        assert_eq!(lease_action("l", None, "me", &o, t0), LeaseAction::Create);
        let mine = record(Some("me"), "1");
        o.observe("l", mine.clone(), t0);
        assert_eq!(
            lease_action("l", Some(&mine), "me", &o, t0),
            LeaseAction::Take
        );
        let theirs = record(Some("other"), "2");
        o.observe("l", theirs.clone(), t0);
        assert_eq!(
            lease_action("l", Some(&theirs), "me", &o, t0),
            LeaseAction::Wait
        );
        let later = t0 + Duration::from_secs(15);
        assert_eq!(
            lease_action("l", Some(&theirs), "me", &o, later),
            LeaseAction::Take
        );
        let released = record(None, "3");
        o.observe("l", released.clone(), t0);
        assert_eq!(
            lease_action("l", Some(&released), "me", &o, t0),
            LeaseAction::Take
        );
    }
}
