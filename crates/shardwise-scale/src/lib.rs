//! How many replicas a fleet needs, and when a planner may change the count.
//!
//! Pure logic, no I/O, no clock: the caller passes the time. Two parts:
//!
//! - [`Sizing`]: the replicas a load needs, given a target load per replica and bounds,
//!   with a tolerance so that a load a few percent off the current count's capacity keeps it.
//! - [`Stabilizer`]: the count to set now, from the needs seen over time. A scale-up follows the
//!   need at once (or after `up`, if set); a scale-down waits until the need has stayed lower
//!   for the whole `down` window, and then goes to the highest need seen in it. This is the
//!   HorizontalPodAutoscaler's stabilisation, so the behaviour is the one operators know.
//!
//! ```
//! use std::time::Duration;
//! use shardwise_scale::{Sizing, Stabilizer, Windows};
//!
//! let sizing = Sizing::new(1000.0, 1, 8).unwrap(); // 1,000 apps per replica, 1 to 8 replicas
//! let mut count = Stabilizer::new(Windows::default());
//! let now = Duration::ZERO;
//! assert_eq!(sizing.needed(3500.0, 1), 4);
//! assert_eq!(count.recommend(now, sizing.needed(3500.0, 1), 1), 4);
//! // The load falls: the count stays until the need has been lower for the whole window.
//! let later = now + Duration::from_secs(60);
//! assert_eq!(count.recommend(later, sizing.needed(500.0, 4), 4), 4);
//! let after_window = later + Windows::default().down;
//! assert_eq!(count.recommend(after_window, sizing.needed(500.0, 4), 4), 1);
//! ```

#![deny(missing_docs)]

use std::collections::VecDeque;
use std::time::Duration;

use thiserror::Error;

/// Sizing that cannot work.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SizingError {
    /// The target load per replica is not a positive number.
    #[error("the target load per replica must be a positive number, got {0}")]
    Target(f64),
    /// The replica bounds are not `1 <= min <= max`.
    #[error("the replica bounds must satisfy 1 <= min <= max, got {min}..{max}")]
    Bounds {
        /// The lower bound given.
        min: u32,
        /// The upper bound given.
        max: u32,
    },
    /// The tolerance is outside `0..=0.5`.
    #[error("the tolerance must be from 0 to 0.5, got {0}")]
    Tolerance(f64),
}

/// The replicas a load needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    /// Load one replica should carry (apps, or measured busy seconds per second).
    pub per_replica: f64,
    /// Fewest replicas, whatever the load.
    pub min: u32,
    /// Most replicas, whatever the load.
    pub max: u32,
    /// A load within this share of what the current count carries at the target keeps the
    /// count (the HorizontalPodAutoscaler's default, 10%).
    pub tolerance: f64,
}

impl Sizing {
    const DEFAULT_TOLERANCE: f64 = 0.1;

    /// Sizing for `per_replica` load per replica, from `min` to `max` replicas, with the
    /// default tolerance of 10%.
    pub fn new(per_replica: f64, min: u32, max: u32) -> Result<Self, SizingError> {
        Self {
            per_replica,
            min,
            max,
            tolerance: Self::DEFAULT_TOLERANCE,
        }
        .validated()
    }

    /// The same sizing with another tolerance, a share from 0 to 0.5.
    pub fn with_tolerance(self, tolerance: f64) -> Result<Self, SizingError> {
        Self { tolerance, ..self }.validated()
    }

    fn validated(self) -> Result<Self, SizingError> {
        if !(self.per_replica.is_finite() && self.per_replica > 0.0) {
            return Err(SizingError::Target(self.per_replica));
        }
        if self.min == 0 || self.min > self.max {
            return Err(SizingError::Bounds {
                min: self.min,
                max: self.max,
            });
        }
        if !(0.0..=0.5).contains(&self.tolerance) {
            return Err(SizingError::Tolerance(self.tolerance));
        }
        Ok(self)
    }

    /// The replicas `load` needs while `current` run: `current` when the load is within the
    /// tolerance of what `current` replicas carry at the target, else enough replicas to carry
    /// it at the target; always within `min..=max`. A load that is not a number needs the
    /// current count.
    pub fn needed(&self, load: f64, current: u32) -> u32 {
        let current_in_bounds = current.clamp(self.min, self.max);
        if !load.is_finite() || load < 0.0 {
            return current_in_bounds;
        }
        if current > 0 {
            let usage = load / (f64::from(current) * self.per_replica);
            if (usage - 1.0).abs() <= self.tolerance {
                return current_in_bounds;
            }
        }
        let wanted = (load / self.per_replica).ceil();
        // Beyond u32 is beyond any max.
        let wanted = if wanted >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            wanted as u32
        };
        wanted.clamp(self.min, self.max)
    }
}

/// How long a need must last before the count follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// A higher need is followed once every need of this window was higher (zero: at once).
    pub up: Duration,
    /// A lower need is followed once every need of this window was lower, to the highest of
    /// them.
    pub down: Duration,
}

impl Default for Windows {
    /// Up at once; down after 5 minutes, the HorizontalPodAutoscaler's defaults. A replica
    /// added in vain costs a few handoffs; one removed too early costs them twice.
    fn default() -> Self {
        Self {
            up: Duration::ZERO,
            down: Duration::from_secs(300),
        }
    }
}

/// The needs seen over the longer window, and the count to set from them.
#[derive(Debug, Clone)]
pub struct Stabilizer {
    windows: Windows,
    /// (time, need), oldest first; times never go back.
    seen: VecDeque<(Duration, u32)>,
    /// When the first need was seen: no scale-down before a whole window from it.
    since: Option<Duration>,
}

impl Stabilizer {
    /// A stabilizer that has seen no need yet.
    pub fn new(windows: Windows) -> Self {
        Self {
            windows,
            seen: VecDeque::new(),
            since: None,
        }
    }

    /// Records the need at `now` (time since any fixed origin) and returns the count to set
    /// while `current` run: above `current` only if every need of the up window is, and then
    /// the lowest of them; below it only if the down window is full of lower needs, and then
    /// the highest of them; else `current`. A stabilizer that has not yet seen a whole down
    /// window (a planner that just took over) never scales down.
    pub fn recommend(&mut self, now: Duration, needed: u32, current: u32) -> u32 {
        let now = self.seen.back().map_or(now, |&(last, _)| now.max(last));
        self.seen.push_back((now, needed));
        let since = *self.since.get_or_insert(now);
        let keep = self.windows.up.max(self.windows.down);
        while let Some(&(at, _)) = self.seen.front() {
            // Keep the newest need older than the window: it says what held at its start.
            if now.saturating_sub(at) > keep
                && self
                    .seen
                    .get(1)
                    .is_some_and(|&(next, _)| now.saturating_sub(next) >= keep)
            {
                self.seen.pop_front();
            } else {
                break;
            }
        }
        let within = |window: Duration| {
            let start = now.saturating_sub(window);
            // The needs of the window, and the one in force when it began.
            let first = self
                .seen
                .iter()
                .rposition(|&(at, _)| at <= start)
                .unwrap_or(0);
            let covered = now.saturating_sub(since) >= window;
            (self.seen.iter().skip(first).map(|&(_, n)| n), covered)
        };
        let (up_needs, _) = within(self.windows.up);
        let lowest = up_needs.min().unwrap_or(needed);
        if lowest > current {
            return lowest;
        }
        let (down_needs, covered) = within(self.windows.down);
        let highest = down_needs.max().unwrap_or(needed);
        if highest < current && covered {
            return highest;
        }
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn minutes(m: u64) -> Duration {
        Duration::from_secs(60 * m)
    }

    /// A stabilizer with windows of `up` and `down` minutes.
    fn stabilizer(up: u64, down: u64) -> Stabilizer {
        Stabilizer::new(Windows {
            up: minutes(up),
            down: minutes(down),
        })
    }

    #[test]
    fn one_count_is_a_valid_range() {
        let fixed = Sizing::new(1000.0, 3, 3).unwrap();
        assert_eq!(fixed.needed(9000.0, 1), 3);
        assert!(Sizing::new(1000.0, 4, 3).is_err());
    }

    #[test]
    fn the_need_in_force_when_the_down_window_began_still_counts() {
        let mut s = stabilizer(5, 10);
        // 7 needed, and set, at 0; nothing new until 3 is needed at 11 min: 7 was in force
        // when the down window (1 to 11 min) began, so the count stays 7.
        assert_eq!(s.recommend(minutes(0), 7, 7), 7);
        assert_eq!(s.recommend(minutes(11), 3, 7), 7);
        // A whole window of 3 since: down to 3.
        assert_eq!(s.recommend(minutes(21), 3, 7), 3);
    }

    #[test]
    fn the_needs_kept_are_those_of_the_longer_window() {
        let mut s = stabilizer(5, 10);
        for tick in 0..720u64 {
            s.recommend(Duration::from_secs(10 * tick), 2 + (tick % 3) as u32, 3);
        }
        // Ten minutes of needs 10 s apart, and the one in force when they began.
        assert!(s.seen.len() <= 62, "{} needs kept", s.seen.len());
    }

    #[test]
    fn the_need_is_the_load_over_the_target_within_bounds_and_tolerance() {
        let sizing = Sizing::new(1000.0, 1, 4).unwrap();
        assert_eq!(sizing.needed(500.0, 1), 1);
        assert_eq!(sizing.needed(4000.0, 1), 4);
        assert_eq!(sizing.needed(9000.0, 1), 4, "never above max");
        assert_eq!(sizing.needed(0.0, 3), 1, "never below min");
        // 2,150 apps on 2 replicas is 7.5% over their target: within the tolerance.
        assert_eq!(sizing.needed(2150.0, 2), 2);
        assert_eq!(sizing.needed(2250.0, 2), 3);
        assert_eq!(sizing.needed(f64::NAN, 3), 3);
        assert_eq!(sizing.needed(f64::INFINITY, 9), 4);
    }

    #[test]
    fn bad_sizing_is_refused() {
        assert_eq!(
            Sizing::new(0.0, 1, 2).unwrap_err().to_string(),
            "the target load per replica must be a positive number, got 0"
        );
        assert!(Sizing::new(1.0, 0, 2).is_err());
        assert!(Sizing::new(1.0, 3, 2).is_err());
        assert!(Sizing::new(1.0, 1, 2).unwrap().with_tolerance(0.6).is_err());
    }

    #[test]
    fn up_at_once_down_only_after_the_window_to_its_highest_need() {
        let mut count = Stabilizer::new(Windows::default());
        assert_eq!(count.recommend(minutes(0), 4, 1), 4);
        // The need drops to 2 then 1: nothing for 5 minutes.
        assert_eq!(count.recommend(minutes(1), 2, 4), 4);
        assert_eq!(count.recommend(minutes(3), 1, 4), 4);
        assert_eq!(count.recommend(minutes(5), 1, 4), 4);
        // At 6 min the window (1..6) holds needs 2, 1, 1, 1: down to 2.
        assert_eq!(count.recommend(minutes(6), 1, 4), 2);
        // At 9 min the window (4..9) holds 1s only (the need at 3 min was in force at 4).
        assert_eq!(count.recommend(minutes(9), 1, 2), 1);
    }

    #[test]
    fn a_planner_that_just_took_over_does_not_scale_down_before_a_whole_window() {
        let mut count = Stabilizer::new(Windows::default());
        assert_eq!(count.recommend(minutes(100), 1, 4), 4);
        assert_eq!(count.recommend(minutes(104), 1, 4), 4);
        assert_eq!(count.recommend(minutes(105), 1, 4), 1);
    }

    #[test]
    fn an_up_window_waits_for_a_lasting_need() {
        let mut count = stabilizer(2, 5);
        assert_eq!(count.recommend(minutes(0), 1, 1), 1);
        assert_eq!(count.recommend(minutes(1), 3, 1), 1);
        assert_eq!(count.recommend(minutes(2), 3, 1), 1, "the need at 0 was 1");
        assert_eq!(count.recommend(minutes(3), 4, 1), 3, "the lowest of 1..3");
    }

    proptest! {
        /// A load that hovers across the boundary between 2 and 3 replicas changes the count
        /// once at most: up when it first needs 3, never back down while it keeps coming back.
        #[test]
        fn a_load_hovering_at_a_boundary_does_not_flap(
            loads in proptest::collection::vec(1900.0f64..2400.0, 10..200),
        ) {
            let sizing = Sizing::new(1000.0, 1, 8).unwrap();
            let mut count = Stabilizer::new(Windows::default());
            let mut current = 2;
            let mut changes: Vec<Duration> = Vec::new();
            for (i, load) in loads.iter().enumerate() {
                let now = Duration::from_secs(30 * i as u64);
                let next = count.recommend(now, sizing.needed(*load, current), current);
                if next != current {
                    changes.push(now);
                    current = next;
                }
            }
            prop_assert!(changes.len() <= 1, "changes at {changes:?}");
        }

        #[test]
        fn the_count_stays_within_bounds(
            loads in proptest::collection::vec(0.0f64..20_000.0, 1..100),
        ) {
            let sizing = Sizing::new(1000.0, 2, 6).unwrap();
            let mut count = Stabilizer::new(Windows::default());
            let mut current = 3;
            for (i, load) in loads.iter().enumerate() {
                let now = Duration::from_secs(60 * i as u64);
                current = count.recommend(now, sizing.needed(*load, current), current);
                prop_assert!((2..=6).contains(&current));
            }
        }

        /// A scale-down never goes below a need seen within the last down window, and never
        /// happens before a whole window has been seen.
        #[test]
        fn scale_downs_respect_every_need_of_the_window(
            loads in proptest::collection::vec(0.0f64..8000.0, 1..200),
        ) {
            let sizing = Sizing::new(1000.0, 1, 8).unwrap();
            let windows = Windows::default();
            let mut count = Stabilizer::new(windows);
            let mut current = 8;
            let mut needs: Vec<(Duration, u32)> = Vec::new();
            for (i, load) in loads.iter().enumerate() {
                let now = Duration::from_secs(20 * i as u64);
                let need = sizing.needed(*load, current);
                needs.push((now, need));
                let next = count.recommend(now, need, current);
                if next < current {
                    prop_assert!(now >= windows.down);
                    let recent = needs.iter().filter(|(at, _)| now.saturating_sub(*at) < windows.down);
                    for (at, n) in recent {
                        prop_assert!(*n <= next, "need {n} at {at:?}, scaled to {next} at {now:?}");
                    }
                }
                current = next;
            }
        }
    }
}
