//! The owner's meter: it adds up the time reconciles of each record's unit and items spend
//! running, per fixed window, and smooths *busy seconds per second* with an exponentially
//! weighted moving average across windows. The owner publishes what it measures as a
//! [`LoadReport`](crate::load::LoadReport). Pure code, no I/O: callers pass the time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shardwise_handoff::plan::RecordKey;

/// How busy time is turned into a smoothed rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MeterSettings {
    /// Busy time is summed over windows of this length; each full window gives one sample.
    pub window: Duration,
    /// A sample's weight in the average halves after this long.
    pub half_life: Duration,
}

impl MeterSettings {
    /// 10 s windows: long enough to hold many reconciles of a busy record, and as long as the
    /// default report interval, so that each report carries a new sample. A 2 min half-life:
    /// noise of single windows averages out over about a dozen of them, while a lasting change
    /// (a destination that became 10x slower) shows at half its size within 2 minutes and at
    /// 90 % within 7, quicker than any rebalancing should react to it.
    pub const DEFAULT: MeterSettings = MeterSettings {
        window: Duration::from_secs(10),
        half_life: Duration::from_secs(120),
    };

    /// The weight the average keeps at each new window.
    fn decay(self) -> f64 {
        0.5f64.powf(self.window.as_secs_f64() / self.half_life.as_secs_f64())
    }
}

impl Default for MeterSettings {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A reconcile under way, as [`Meter::begin`] counted it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reconcile that is begun must be ended"]
pub(crate) struct Running(u64);

/// One record's measurement in progress.
#[derive(Clone, Debug)]
struct RecordMeter {
    /// Since when the record is measured: only windows that start at or after it are samples.
    since: Instant,
    /// Busy time in the current window.
    busy: Duration,
    /// `None` until the first full window.
    smoothed: Option<f64>,
}

/// The busy time of the records a shard owns, in busy seconds per second, smoothed.
///
/// Windows are fixed, from the meter's creation. A reconcile that spans a window boundary
/// counts in each window for the time it ran there. A record counts from the moment the meter
/// first hears of it ([`own`](Self::own) or [`begin`](Self::begin)), and stays unmeasured
/// until a whole window has passed since: a record just taken over is not reported as idle.
#[derive(Clone, Debug)]
pub(crate) struct Meter {
    settings: MeterSettings,
    decay: f64,
    window_start: Instant,
    records: BTreeMap<RecordKey, RecordMeter>,
    running: BTreeMap<u64, (RecordKey, Instant)>,
    next_running: u64,
}

impl Meter {
    /// A meter whose first window starts `now`. Windows are at least a millisecond long.
    pub fn new(mut settings: MeterSettings, now: Instant) -> Self {
        settings.window = settings.window.max(Duration::from_millis(1));
        Self {
            settings,
            decay: settings.decay(),
            window_start: now,
            records: BTreeMap::new(),
            running: BTreeMap::new(),
            next_running: 0,
        }
    }

    fn record_meter(&mut self, record: &RecordKey, now: Instant) -> &mut RecordMeter {
        self.records
            .entry(record.clone())
            .or_insert_with(|| RecordMeter {
                since: now,
                busy: Duration::ZERO,
                smoothed: None,
            })
    }

    /// The records the shard owns now: others are forgotten (with their reconciles still
    /// running), new ones start unmeasured.
    pub fn own(&mut self, records: &BTreeSet<RecordKey>, now: Instant) {
        self.advance(now);
        self.records.retain(|key, _| records.contains(key));
        self.running.retain(|_, (key, _)| records.contains(key));
        for record in records {
            self.record_meter(record, now);
        }
    }

    /// A reconcile of work under `record` starts.
    pub fn begin(&mut self, record: RecordKey, now: Instant) -> Running {
        self.advance(now);
        self.record_meter(&record, now);
        let id = self.next_running;
        self.next_running += 1;
        // Callers read the clock before they take the meter: another may have closed a window
        // in between.
        self.running
            .insert(id, (record, now.max(self.window_start)));
        Running(id)
    }

    /// The reconcile ended (whatever its result: an error costs time too).
    pub fn end(&mut self, running: Running, now: Instant) {
        self.advance(now);
        if let Some((record, from)) = self.running.remove(&running.0)
            && let Some(tally) = self.records.get_mut(&record)
        {
            tally.busy += now.saturating_duration_since(from);
        }
    }

    /// Closes every window that ended by `now`.
    pub fn advance(&mut self, now: Instant) {
        let window = self.settings.window;
        let seconds = window.as_secs_f64();
        loop {
            let end = self.window_start + window;
            if now < end {
                return;
            }
            for (record, from) in self.running.values_mut() {
                if let Some(tally) = self.records.get_mut(record) {
                    tally.busy += end.saturating_duration_since(*from);
                }
                *from = end;
            }
            for tally in self.records.values_mut() {
                if tally.since <= self.window_start {
                    let sample = tally.busy.as_secs_f64() / seconds;
                    tally.smoothed = Some(match tally.smoothed {
                        // The first sample stands alone: starting from 0 would report a busy
                        // record as nearly idle for minutes.
                        None => sample,
                        Some(smoothed) => smoothed * self.decay + sample * (1.0 - self.decay),
                    });
                }
                tally.busy = Duration::ZERO;
            }
            self.window_start = end;
        }
    }

    /// Every measured record with its smoothed busy seconds per second, in key order.
    pub fn measured(&self) -> impl Iterator<Item = (&RecordKey, f64)> {
        self.records
            .iter()
            .filter_map(|(key, tally)| Some((key, tally.smoothed?)))
    }
}

#[cfg(test)]
mod tests {
    use shard_assign::KeyRange;
    use shardwise_handoff::plan::ObjectKey;

    use super::*;

    /// The whole unit `fleet/<name>`.
    fn record(name: &str) -> RecordKey {
        RecordKey::whole(ObjectKey::new("fleet", name))
    }

    /// The upper half of the unit `fleet/<name>`.
    fn slice(name: &str) -> RecordKey {
        RecordKey {
            unit: ObjectKey::new("fleet", name),
            range: KeyRange::WHOLE.halves().unwrap().1,
        }
    }

    impl Meter {
        /// The smoothed busy seconds per second of `record`; `None` while it is not measured
        /// yet.
        fn busy(&self, record: &RecordKey) -> Option<f64> {
            self.records.get(record)?.smoothed
        }
    }

    const SETTINGS: MeterSettings = MeterSettings::DEFAULT;
    const WINDOW: Duration = MeterSettings::DEFAULT.window;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Runs one reconcile of `record` from `at` for `busy`.
    fn reconcile(meter: &mut Meter, record: &RecordKey, at: Instant, busy: Duration) {
        let running = meter.begin(record.clone(), at);
        meter.end(running, at + busy);
    }

    #[test]
    fn a_record_is_unmeasured_until_its_first_full_window() {
        let t0 = Instant::now();
        let mut meter = Meter::new(SETTINGS, t0);
        let a = record("a");
        // Taken over mid-window: that window is partial and says nothing.
        meter.own(&BTreeSet::from([a.clone()]), t0 + WINDOW / 2);
        reconcile(&mut meter, &a, t0 + WINDOW / 2, Duration::from_secs(1));
        meter.advance(t0 + WINDOW);
        assert_eq!(meter.busy(&a), None);
        assert_eq!(meter.measured().count(), 0);
        // A whole window, idle: measured, and idle is 0, not "unknown".
        meter.advance(t0 + 2 * WINDOW);
        assert_eq!(meter.busy(&a), Some(0.0));
        // Its first sample stands alone: 2 s busy in 10 s.
        let b = record("b");
        meter.own(&BTreeSet::from([a.clone(), b.clone()]), t0 + 2 * WINDOW);
        reconcile(&mut meter, &b, t0 + 2 * WINDOW, Duration::from_secs(2));
        meter.advance(t0 + 3 * WINDOW);
        assert_eq!(meter.busy(&b), Some(0.2));
    }

    #[test]
    fn a_reconcile_counts_in_each_window_for_the_time_it_ran_there() {
        let t0 = Instant::now();
        let mut meter = Meter::new(SETTINGS, t0);
        let a = record("a");
        meter.own(&BTreeSet::from([a.clone()]), t0);
        // 15 s from 5 s in: 5 s in the first window, 10 s in the second.
        let running = meter.begin(a.clone(), t0 + Duration::from_secs(5));
        meter.advance(t0 + WINDOW);
        assert_eq!(meter.busy(&a), Some(0.5));
        meter.end(running, t0 + Duration::from_secs(20));
        meter.advance(t0 + 2 * WINDOW);
        let decay = SETTINGS.decay();
        let expected = 0.5 * decay + 1.0 * (1.0 - decay);
        assert!(
            close(meter.busy(&a).unwrap(), expected),
            "{:?}",
            meter.busy(&a)
        );
    }

    #[test]
    fn the_average_settles_on_a_steady_load_and_halves_in_a_half_life_once_idle() {
        let t0 = Instant::now();
        let mut meter = Meter::new(SETTINGS, t0);
        let a = record("a");
        meter.own(&BTreeSet::from([a.clone()]), t0);
        // Alternating windows of 1 s and 5 s busy, then a steady 3 s per window: the average
        // moves from the first sample towards 0.3.
        for w in 0..6u32 {
            let busy = if w % 2 == 0 { 1 } else { 5 };
            reconcile(&mut meter, &a, t0 + w * WINDOW, Duration::from_secs(busy));
        }
        for w in 6..200u32 {
            reconcile(&mut meter, &a, t0 + w * WINDOW, Duration::from_secs(3));
        }
        meter.advance(t0 + 200 * WINDOW);
        let steady = meter.busy(&a).unwrap();
        assert!((steady - 0.3).abs() < 1e-4, "{steady}");
        // Idle for one half-life (12 windows): half of it is left.
        meter.advance(t0 + 200 * WINDOW + SETTINGS.half_life);
        assert!(close(meter.busy(&a).unwrap(), steady / 2.0));
    }

    #[test]
    fn records_no_longer_owned_are_forgotten_and_start_over_if_they_come_back() {
        let t0 = Instant::now();
        let mut meter = Meter::new(SETTINGS, t0);
        let (a, b) = (record("a"), slice("a"));
        meter.own(&BTreeSet::from([a.clone(), b.clone()]), t0);
        reconcile(&mut meter, &a, t0, Duration::from_secs(4));
        let running = meter.begin(b.clone(), t0 + Duration::from_secs(1));
        meter.advance(t0 + WINDOW);
        assert_eq!(meter.busy(&a), Some(0.4));
        assert_eq!(meter.busy(&b), Some(0.9));
        // b moves away mid-reconcile: its reconcile's end is not counted anywhere.
        meter.own(&BTreeSet::from([a.clone()]), t0 + WINDOW);
        meter.end(running, t0 + WINDOW + Duration::from_secs(2));
        assert_eq!(meter.busy(&b), None);
        assert_eq!(meter.measured().map(|(k, _)| k).collect::<Vec<_>>(), [&a]);
        // And back later: unmeasured again.
        meter.own(
            &BTreeSet::from([a, b.clone()]),
            t0 + WINDOW + Duration::from_secs(3),
        );
        meter.advance(t0 + 2 * WINDOW);
        assert_eq!(meter.busy(&b), None);
    }

    #[test]
    fn a_clock_read_before_a_window_closed_counts_from_the_window() {
        let t0 = Instant::now();
        let mut meter = Meter::new(SETTINGS, t0);
        let a = record("a");
        meter.own(&BTreeSet::from([a.clone()]), t0);
        meter.advance(t0 + WINDOW + Duration::from_secs(1));
        // Read at 9 s, begun after the window closed at 10 s.
        let running = meter.begin(a.clone(), t0 + Duration::from_secs(9));
        meter.end(running, t0 + WINDOW + Duration::from_secs(3));
        meter.advance(t0 + 2 * WINDOW);
        let decay = SETTINGS.decay();
        assert!(close(meter.busy(&a).unwrap(), 0.3 * (1.0 - decay)));
    }
}
