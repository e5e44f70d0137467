//! Measured load: what each record (a whole unit, or one slice of a cut unit) costs the shard
//! that owns it, and how the planner reads it back. Pure code, no I/O: callers pass the time.
//!
//! - The owner's meter adds up the time reconciles of a record's unit and items spend
//!   running, per fixed window, and smooths *busy seconds per second* with an exponentially
//!   weighted moving average across windows.
//! - [`LoadReport`] is what an owner publishes in the `shardwise.io/load` annotation of its
//!   shard Lease: the smoothed busy time and the items under management of its measured
//!   records, as compact versioned JSON.
//! - [`MeasuredLoads`] (planner side) keeps the latest report of every record, across moves.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shard_assign::KeyRange;
use shardwise_handoff::keys::LOAD_ANNOTATION;
use shardwise_handoff::plan::{ObjectKey, RecordKey};

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

#[derive(Clone, Debug)]
struct Tally {
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
    records: BTreeMap<RecordKey, Tally>,
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

    fn tally(&mut self, record: &RecordKey, now: Instant) -> &mut Tally {
        self.records.entry(record.clone()).or_insert_with(|| Tally {
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
            self.tally(record, now);
        }
    }

    /// A reconcile of work under `record` starts.
    pub fn begin(&mut self, record: RecordKey, now: Instant) -> Running {
        self.advance(now);
        self.tally(&record, now);
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

/// The load of one record as reported.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordLoad {
    /// Smoothed busy seconds per second (1.0: one worker busy all the time).
    pub busy: f64,
    /// Items under management: those of the owner's cache that belong to the record.
    pub items: u64,
    /// Bytes the owner keeps for the record beyond its items (the controller's caches of what
    /// the unit manages, [`crate::Sharded::cached_bytes`]); `None` when the controller does
    /// not say, and in reports of versions before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl RecordLoad {
    /// Busy time and items, with no memory figure.
    pub(crate) fn new(busy: f64, items: u64) -> Self {
        Self {
            busy,
            items,
            bytes: None,
        }
    }
}

/// At most this many records in one report, the busiest first. A record takes about 100
/// bytes with names of common length, so a report stays around 25 KB however many records a
/// shard owns (and under 100 KB with the longest names Kubernetes allows, well within its
/// 256 KiB of annotations): it is written with every renewal of the lease and sent to every
/// replica watching it.
pub(crate) const MAX_REPORTED_RECORDS: usize = 256;

/// The version of the report's format.
const REPORT_VERSION: u32 = 1;

/// The measured records of one shard, as its lease carries them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// The load of each record reported.
    pub records: BTreeMap<RecordKey, RecordLoad>,
    /// Measured records left out to keep the report small: each is at most as busy as the
    /// least busy record reported.
    pub(crate) omitted: u64,
}

/// Why an annotation is not a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not JSON of the report's shape.
    #[error("not a load report: {0}")]
    Json(#[from] serde_json::Error),
    /// A format version this replica does not read.
    #[error("load report version {0} is not known here (this replica reads version 1)")]
    Version(u32),
    /// A key that does not name a record.
    #[error("load report names {0:?}, which is not a record (`<namespace>/<name>[#<range>]`)")]
    Key(String),
    /// A busy time that is negative or not a number.
    #[error("load report gives {key:?} a busy time of {busy}, which is not a rate")]
    Busy {
        /// The record, as the report writes it.
        key: String,
        /// The busy time it gives.
        busy: f64,
    },
}

#[derive(Serialize, Deserialize)]
struct Wire {
    v: u32,
    records: BTreeMap<String, RecordLoad>,
    #[serde(default, skip_serializing_if = "is_zero")]
    omitted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `value` to 4 significant digits, as the nearest `f64` (which JSON then writes in full).
fn significant(value: f64) -> f64 {
    format!("{value:.3e}").parse().unwrap_or(value)
}

impl LoadReport {
    /// The busiest `max` of `records`, and how many were left out.
    pub(crate) fn top(
        records: impl IntoIterator<Item = (RecordKey, RecordLoad)>,
        max: usize,
    ) -> Self {
        let mut records: Vec<_> = records.into_iter().collect();
        records.sort_by(|(a_key, a), (b_key, b)| {
            b.busy.total_cmp(&a.busy).then_with(|| a_key.cmp(b_key))
        });
        let omitted = records.len().saturating_sub(max) as u64;
        records.truncate(max);
        Self {
            records: records.into_iter().collect(),
            omitted,
        }
    }

    /// The compact JSON of the annotation: `{"v":1,"records":{"<ns>/<name>":{"busy":0.0123,
    /// "items":42,"bytes":81920},"<ns>/<name>#<range>":{…}},"omitted":3}` (`bytes` only when
    /// known, `omitted` only when not 0), busy times to 4 significant digits.
    pub(crate) fn encode(&self) -> String {
        let wire = Wire {
            v: REPORT_VERSION,
            records: self
                .records
                .iter()
                .map(|(key, load)| {
                    let load = RecordLoad {
                        busy: significant(load.busy),
                        ..*load
                    };
                    (record_text(key), load)
                })
                .collect(),
            omitted: self.omitted,
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Reads a report from the text of its annotation, as an owner writes it.
    pub fn decode(text: &str) -> Result<Self, ReportError> {
        let wire: Wire = serde_json::from_str(text)?;
        if wire.v != REPORT_VERSION {
            return Err(ReportError::Version(wire.v));
        }
        let mut records = BTreeMap::new();
        for (text, load) in wire.records {
            if !(load.busy.is_finite() && load.busy >= 0.0) {
                return Err(ReportError::Busy {
                    key: text,
                    busy: load.busy,
                });
            }
            let key = parse_record(&text).ok_or(ReportError::Key(text))?;
            records.insert(key, load);
        }
        Ok(Self {
            records,
            omitted: wire.omitted,
        })
    }

    /// The annotations a shard lease carries for this report.
    pub(crate) fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(LOAD_ANNOTATION.to_string(), self.encode())])
    }

    /// The smallest busy time reported, when some records were left out (they are no busier).
    fn floor(&self) -> Option<f64> {
        (self.omitted > 0).then(|| {
            self.records
                .values()
                .map(|l| l.busy)
                .min_by(f64::total_cmp)
                .unwrap_or(0.0)
        })
    }
}

/// A record as text: the unit's key (`<namespace>/<name>`, or `<name>` when cluster-scoped),
/// then `#<first>-<last>` (hexadecimal) for a slice. Names hold neither `/` nor `#`, so it
/// reads back exactly.
pub fn record_text(key: &RecordKey) -> String {
    if key.range == KeyRange::WHOLE {
        key.unit.to_string()
    } else {
        format!("{}#{}", key.unit, key.range)
    }
}

/// Reads back [`record_text`]; `None` for anything it does not write.
pub(crate) fn parse_record(text: &str) -> Option<RecordKey> {
    let (text, range) = match text.split_once('#') {
        Some((text, range)) => {
            let range: KeyRange = range.parse().ok()?;
            // One spelling per record: the whole unit has no suffix.
            (range != KeyRange::WHOLE).then_some((text, range))?
        }
        None => (text, KeyRange::WHOLE),
    };
    let valid = |part: &str| !part.is_empty() && !part.contains(['/', '#']);
    let unit = match text.split_once('/') {
        Some((namespace, name)) if valid(namespace) && valid(name) => {
            ObjectKey::new(namespace, name)
        }
        None if valid(text) => ObjectKey::new("", text),
        _ => return None,
    };
    Some(RecordKey { unit, range })
}

/// A record's latest measurement, as the planner keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The load the report gave.
    pub load: RecordLoad,
    /// The shard whose report it came from (the record may have moved since).
    pub(crate) shard: u32,
    /// The renewal time of the lease that carried the report.
    at: jiff::Timestamp,
    /// When a report last carried the record.
    seen: Instant,
}

/// The latest measured load of every record, from the reports of every shard.
///
/// A record that leaves a shard's report (it moved, or its owner lost its lease) keeps its
/// last value until another report carries it: its new owner's, once measured. A value no
/// report has carried for 10 minutes is dropped (a record deleted, say).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeasuredLoads {
    records: BTreeMap<RecordKey, Measured>,
}

impl MeasuredLoads {
    /// How long a record's value outlives the last report that carried it.
    pub(crate) const RETAIN: Duration = Duration::from_secs(600);

    /// Takes in the report of `shard`, carried by a lease renewed at `at`, observed at `now`.
    pub(crate) fn apply(
        &mut self,
        shard: u32,
        at: jiff::Timestamp,
        report: &LoadReport,
        now: Instant,
    ) {
        self.records
            .retain(|_, m| now.saturating_duration_since(m.seen) < Self::RETAIN);
        // A record of this shard's that the report leaves out either moved (its value stays
        // the best there is) or was left out for size: then it is no busier than the floor.
        if let Some(floor) = report.floor() {
            for (key, measured) in &mut self.records {
                if measured.shard == shard && !report.records.contains_key(key) {
                    measured.load.busy = measured.load.busy.min(floor);
                }
            }
        }
        for (key, load) in &report.records {
            // Two shards can report a record for a moment around its move: the later renewal
            // wins.
            let older = self
                .records
                .get(key)
                .is_some_and(|m| m.shard != shard && m.at > at);
            if !older {
                self.records.insert(
                    key.clone(),
                    Measured {
                        load: *load,
                        shard,
                        at,
                        seen: now,
                    },
                );
            }
        }
    }

    /// The latest measurement of `record`; `None` while no report has carried it.
    pub fn get(&self, record: &RecordKey) -> Option<&Measured> {
        self.records.get(record)
    }

    /// Every measured record, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&RecordKey, &Measured)> {
        self.records.iter()
    }

    /// How many records are measured.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is measured.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Meter {
        /// The smoothed busy seconds per second of `record`; `None` while it is not measured
        /// yet.
        fn busy(&self, record: &RecordKey) -> Option<f64> {
            self.records.get(record)?.smoothed
        }
    }

    const SETTINGS: MeterSettings = MeterSettings::DEFAULT;
    const WINDOW: Duration = MeterSettings::DEFAULT.window;

    fn record(name: &str) -> RecordKey {
        RecordKey {
            unit: ObjectKey::new("fleet", name),
            range: KeyRange::WHOLE,
        }
    }

    fn slice(name: &str) -> RecordKey {
        RecordKey {
            unit: ObjectKey::new("fleet", name),
            range: KeyRange::WHOLE.halves().unwrap().1,
        }
    }

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

    fn load(busy: f64, items: u64) -> RecordLoad {
        RecordLoad::new(busy, items)
    }

    #[test]
    fn record_keys_read_back_exactly_and_nothing_else_reads() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let keys = [
            record("a"),
            slice("a"),
            RecordKey {
                unit: ObjectKey::new("", "cluster-scoped"),
                range: KeyRange::WHOLE,
            },
            RecordKey {
                unit: ObjectKey::new("", "cluster-scoped"),
                range: low.halves().unwrap().1,
            },
            RecordKey {
                unit: ObjectKey::new("ns", "b"),
                range: low,
            },
        ];
        for key in keys {
            let text = record_text(&key);
            assert_eq!(parse_record(&text), Some(key), "{text}");
        }
        assert_eq!(record_text(&slice("a")), format!("fleet/a#{high}"));
        for bad in [
            "",
            "/a",
            "ns/",
            "a/b/c",
            "a#",
            "a#zz",
            "a#0-ffffffffffffffff",
            "a#1-2",
            "#0-7fffffffffffffff",
            "ns/a#0-7fffffffffffffff#0-3fffffffffffffff",
        ] {
            assert_eq!(parse_record(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_report_reads_back_rounded_to_four_significant_digits() {
        let report = LoadReport {
            records: BTreeMap::from([
                (record("a"), load(0.012_345_678, 42)),
                (slice("a"), load(1.0 / 3.0, 7)),
                (record("idle"), load(0.0, 0)),
                (record("big"), load(12_345.678, 100_000)),
            ]),
            omitted: 0,
        };
        let text = report.encode();
        assert!(text.starts_with(r#"{"v":1,"records":{"#), "{text}");
        assert!(
            text.contains(r#""fleet/a":{"busy":0.01235,"items":42}"#),
            "{text}"
        );
        assert!(
            text.contains(r#"#8000000000000000-ffffffffffffffff":{"busy":0.3333,"#),
            "{text}"
        );
        assert!(!text.contains("omitted"), "{text}");
        let back = LoadReport::decode(&text).unwrap();
        assert_eq!(back.records.len(), 4);
        assert_eq!(back.records[&record("a")], load(0.01235, 42));
        assert_eq!(back.records[&record("big")], load(12_350.0, 100_000));
        assert_eq!(back.records[&record("idle")], load(0.0, 0));
        // What was read encodes to the same text.
        assert_eq!(back.encode(), text);
    }

    #[test]
    fn memory_is_reported_when_known_and_older_reports_read_as_unknown() {
        let cached = RecordLoad {
            bytes: Some(81_920),
            ..load(0.5, 2)
        };
        let report = LoadReport {
            records: BTreeMap::from([(record("a"), cached), (record("b"), load(0.5, 2))]),
            omitted: 0,
        };
        let text = report.encode();
        assert!(
            text.contains(r#""fleet/a":{"busy":0.5,"items":2,"bytes":81920}"#),
            "{text}"
        );
        assert!(
            text.contains(r#""fleet/b":{"busy":0.5,"items":2}"#),
            "{text}"
        );
        assert_eq!(LoadReport::decode(&text).unwrap(), report);
        let negative = r#"{"v":1,"records":{"a":{"busy":1,"items":1,"bytes":-1}}}"#;
        assert!(LoadReport::decode(negative).is_err());
    }

    #[test]
    fn a_report_keeps_the_busiest_records_and_counts_the_rest() {
        let records = (0..10u32).map(|i| (record(&format!("r{i}")), load(f64::from(i), 1)));
        let report = LoadReport::top(records, 3);
        assert_eq!(
            report.records.keys().cloned().collect::<BTreeSet<_>>(),
            BTreeSet::from([record("r7"), record("r8"), record("r9")])
        );
        assert_eq!(report.omitted, 7);
        let back = LoadReport::decode(&report.encode()).unwrap();
        assert_eq!(back, report);
        // The cap keeps the annotation small even for the longest names Kubernetes allows.
        let long = "n".repeat(63);
        let many = (0..1000u32).map(|i| {
            let key = RecordKey {
                unit: ObjectKey::new(&long, format!("{}{i}", "c".repeat(240))),
                range: KeyRange::WHOLE.halves().unwrap().0,
            };
            (key, load(0.123_456 * f64::from(i), 123_456))
        });
        let text = LoadReport::top(many, MAX_REPORTED_RECORDS).encode();
        assert!(text.len() < 256 * 1024, "{} bytes", text.len());
    }

    #[test]
    fn malformed_reports_are_refused_with_a_reason() {
        for (text, reason) in [
            ("", "not a load report"),
            ("{", "not a load report"),
            (r#"{"records":{}}"#, "not a load report"),
            (r#"{"v":2,"records":{}}"#, "version 2"),
            (
                r#"{"v":1,"records":{"a/b/c":{"busy":1,"items":1}}}"#,
                "a/b/c",
            ),
            (
                r#"{"v":1,"records":{"a":{"busy":-1,"items":1}}}"#,
                "not a rate",
            ),
            (
                r#"{"v":1,"records":{"a":{"busy":1,"items":-1}}}"#,
                "not a load report",
            ),
            (
                r#"{"v":1,"records":{"a":{"busy":"x","items":1}}}"#,
                "not a load report",
            ),
        ] {
            let e = LoadReport::decode(text).unwrap_err().to_string();
            assert!(e.contains(reason), "{text:?}: {e}");
        }
        // Fields a later version of the same format may add are ignored.
        let extra = r#"{"v":1,"records":{"a":{"busy":0.5,"items":2,"objects":9}},"window":10}"#;
        let report = LoadReport::decode(extra).unwrap();
        assert_eq!(
            report.records[&RecordKey {
                unit: ObjectKey::new("", "a"),
                range: KeyRange::WHOLE
            }],
            load(0.5, 2)
        );
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn report(records: &[(&RecordKey, f64)], omitted: u64) -> LoadReport {
        LoadReport {
            records: records
                .iter()
                .map(|(k, busy)| ((*k).clone(), load(*busy, 1)))
                .collect(),
            omitted,
        }
    }

    #[test]
    fn the_planner_keeps_a_moved_record_until_its_new_owner_reports_it() {
        let now = Instant::now();
        let (a, b) = (record("a"), record("b"));
        let mut loads = MeasuredLoads::default();
        loads.apply(0, at(0), &report(&[(&a, 0.5), (&b, 0.25)], 0), now);
        assert_eq!(
            loads.get(&a).map(|m| (m.load.busy, m.shard)),
            Some((0.5, 0))
        );
        // a moved to shard 1: shard 0 stops reporting it, shard 1 has not measured it yet.
        loads.apply(0, at(2), &report(&[(&b, 0.25)], 0), now);
        loads.apply(1, at(3), &report(&[], 0), now);
        assert_eq!(
            loads.get(&a).map(|m| (m.load.busy, m.shard)),
            Some((0.5, 0))
        );
        // Shard 1 measured it.
        loads.apply(1, at(20), &report(&[(&a, 0.75)], 0), now);
        assert_eq!(
            loads.get(&a).map(|m| (m.load.busy, m.shard)),
            Some((0.75, 1))
        );
        // A late read of shard 0's older report does not bring the old value back.
        loads.apply(0, at(1), &report(&[(&a, 0.5), (&b, 0.25)], 0), now);
        assert_eq!(loads.get(&a).map(|m| m.shard), Some(1));
        assert_eq!(loads.len(), 2);
    }

    #[test]
    fn a_record_left_out_for_size_is_no_busier_than_the_least_busy_reported() {
        let now = Instant::now();
        let (a, b, c) = (record("a"), record("b"), record("c"));
        let mut loads = MeasuredLoads::default();
        loads.apply(
            0,
            at(0),
            &report(&[(&a, 0.9), (&b, 0.5), (&c, 0.4)], 0),
            now,
        );
        // c's load grew past a's; a was left out.
        loads.apply(0, at(10), &report(&[(&c, 1.2), (&b, 0.6)], 1), now);
        assert_eq!(loads.get(&a).unwrap().load.busy, 0.6);
        // Without a cut, a record left out (moved) keeps its value.
        loads.apply(0, at(20), &report(&[(&c, 1.2)], 0), now);
        assert_eq!(loads.get(&b).unwrap().load.busy, 0.6);
    }

    #[test]
    fn values_no_report_carries_any_more_are_dropped_after_a_while() {
        let now = Instant::now();
        let (a, b) = (record("a"), record("b"));
        let mut loads = MeasuredLoads::default();
        loads.apply(0, at(0), &report(&[(&a, 0.5), (&b, 0.5)], 0), now);
        // a is deleted; b is still reported.
        let later = now + MeasuredLoads::RETAIN - Duration::from_secs(1);
        loads.apply(0, at(599), &report(&[(&b, 0.5)], 0), later);
        assert!(loads.get(&a).is_some());
        loads.apply(
            0,
            at(601),
            &report(&[(&b, 0.5)], 0),
            now + MeasuredLoads::RETAIN,
        );
        assert!(loads.get(&a).is_none());
        assert!(loads.get(&b).is_some());
    }
}
