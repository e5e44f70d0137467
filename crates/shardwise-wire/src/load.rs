//! Measured load as it travels: what each record (a whole unit, or one slice of a cut unit)
//! costs the shard that owns it, published on the shard's Lease, and read back by the planner
//! and by tools outside. Pure code, no I/O: callers pass the time. (The owner's side, the meter
//! that measures it, is shardwise-runtime's `owner::meter`.)
//!
//! - [`LoadReport`] is what an owner publishes in the `shardwise.io/load` annotation of its
//!   shard Lease: the smoothed busy time and the items under management of its measured
//!   records, as compact versioned JSON.
//! - [`MeasuredLoads`] keeps the latest report of every record, across moves.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shard_assign::KeyRange;
use shardwise_handoff::keys::LOAD_ANNOTATION;
use shardwise_handoff::plan::{ObjectKey, RecordKey};

/// The load of one record as reported.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordLoad {
    /// Smoothed busy seconds per second (1.0: one worker busy all the time).
    pub busy: f64,
    /// Items under management: those of the owner's cache that belong to the record.
    pub items: u64,
    /// Bytes the owner keeps for the record beyond its items (the controller's caches of what
    /// the unit manages, shardwise-runtime's `Sharded::cached_bytes`); `None` when the controller does
    /// not say, and in reports of versions before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl RecordLoad {
    /// Busy time and items, with no memory figure.
    pub fn new(busy: f64, items: u64) -> Self {
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
pub const MAX_REPORTED_RECORDS: usize = 256;

/// The version of the report's format.
const REPORT_VERSION: u32 = 1;

/// The measured records of one shard, as its lease carries them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// The load of each record reported.
    pub records: BTreeMap<RecordKey, RecordLoad>,
    /// Measured records left out to keep the report small: each is at most as busy as the
    /// least busy record reported.
    pub omitted: u64,
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
struct ReportJson {
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
    pub fn top(records: impl IntoIterator<Item = (RecordKey, RecordLoad)>, max: usize) -> Self {
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
    pub fn encode(&self) -> String {
        let wire = ReportJson {
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
        let wire: ReportJson = serde_json::from_str(text)?;
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
    pub fn annotations(&self) -> BTreeMap<String, String> {
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
pub fn parse_record(text: &str) -> Option<RecordKey> {
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
    pub shard: u32,
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
    pub const RETAIN: Duration = Duration::from_secs(600);

    /// Takes in the report of `shard`, carried by a lease renewed at `at`, observed at `now`.
    pub fn apply(&mut self, shard: u32, at: jiff::Timestamp, report: &LoadReport, now: Instant) {
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
    pub fn iter(&self) -> impl Iterator<Item = (&RecordKey, &Measured)> {
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
    use std::collections::BTreeSet;

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

    fn load(busy: f64, items: u64) -> RecordLoad {
        RecordLoad::new(busy, items)
    }

    #[test]
    fn record_keys_read_back_exactly_and_nothing_else_reads() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let keys = [
            record("a"),
            slice("a"),
            RecordKey::whole(ObjectKey::new("", "cluster-scoped")),
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
            report.records[&RecordKey::whole(ObjectKey::new("", "a"))],
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
