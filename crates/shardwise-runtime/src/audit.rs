//! The reconcile audit: every reconcile's start and end, per unit, as JSON lines, so that the
//! files of all replicas can be merged and checked for overlaps.
//!
//! [`read`] and [`overlaps`] check the merged files: the end-to-end tests of shardwise's own
//! controller and of the example controller prove with them that no two processes ever worked
//! on one unit at once.
//!
//! Work on a unit cut into slices is recorded with the slice it was admitted under (`range`), so
//! that the check is at item granularity there: two processes on disjoint slices of one unit
//! do not overlap; on nested ones (or on a unit that is not cut) they do.
//!
//! A start line is written (and flushed) before the reconcile touches anything and an end line
//! when its open interval is dropped: after the reconcile finished, or when it was abandoned
//! (its task aborted at fencing or shutdown), which is when its work stopped. A killed process
//! leaves an open interval that a checker must treat as lasting until the process died.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use shard_assign::KeyRange;

/// One line: `event` (start or end), `id` (unique per reconcile within a process, to pair
/// start and end), `t` (wall-clock nanoseconds since the Unix epoch), `shard`, `pid`, the unit
/// the work belongs to under the unit's noun (`cluster` for shardwise's controller), `kind`
/// (the noun of what was reconciled), `key` (`namespace/name` of it) and `range` (the slice of the
/// unit the work was admitted under, `first-last` in hexadecimal).
fn line(fields: [(&str, Value); 9]) -> Map<String, Value> {
    fields
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

#[derive(Debug, Default)]
struct Inner {
    file: Option<File>,
    next_id: u64,
}

/// Appends audit lines to a file; a no-op when no file was configured.
#[derive(Clone, Debug)]
pub(crate) struct Audit {
    shard: u32,
    /// The field that names the unit: the unit's noun.
    unit_field: &'static str,
    inner: Arc<Mutex<Inner>>,
}

/// The interval of a reconcile in progress; dropping it ends it.
#[derive(Debug)]
pub(crate) struct OpenInterval {
    audit: Audit,
    id: u64,
    unit: String,
    range: KeyRange,
    kind: &'static str,
    key: String,
}

/// Wall-clock nanoseconds since the Unix epoch, as the audit records time (a u64 lasts until
/// the year 2554): for a checker that notes when it killed a process.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Audit {
    /// Appends to `path` (none: audits nothing); `unit_field` names the unit in each line.
    pub fn open(
        shard: u32,
        unit_field: &'static str,
        path: Option<&Path>,
    ) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(OpenOptions::new().create(true).append(true).open(path)?),
            None => None,
        };
        Ok(Self {
            shard,
            unit_field,
            inner: Arc::new(Mutex::new(Inner { file, next_id: 0 })),
        })
    }

    fn write(&self, event: &str, id: u64, unit: &str, range: KeyRange, kind: &str, key: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(file) = inner.file.as_mut() else {
            return;
        };
        let line = line([
            ("event", event.into()),
            ("id", id.into()),
            ("t", now_nanos().into()),
            ("shard", self.shard.into()),
            ("pid", std::process::id().into()),
            (self.unit_field, unit.into()),
            ("kind", kind.into()),
            ("key", key.into()),
            ("range", range.to_string().into()),
        ]);
        if let Ok(mut text) = serde_json::to_string(&line) {
            text.push('\n');
            // One write per line on an append-mode file: lines never interleave.
            if let Err(e) = file.write_all(text.as_bytes()) {
                tracing::warn!(error = %e, "could not write the audit file");
            }
        }
    }

    /// Opens the interval of one reconcile of `kind` `key`, work of `range` of `unit`.
    pub fn start(
        &self,
        unit: &str,
        range: KeyRange,
        kind: &'static str,
        key: &str,
    ) -> OpenInterval {
        let id = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner.next_id += 1;
            inner.next_id
        };
        self.write("start", id, unit, range, kind, key);
        OpenInterval {
            audit: self.clone(),
            id,
            unit: unit.to_string(),
            range,
            kind,
            key: key.to_string(),
        }
    }
}

impl Drop for OpenInterval {
    fn drop(&mut self) {
        self.audit
            .write("end", self.id, &self.unit, self.range, self.kind, &self.key);
    }
}

/// One reconcile of one process, as read back from audit files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    /// The process that did the work.
    pub pid: u32,
    /// The shard that process held.
    pub shard: u32,
    /// The unit the work belonged to.
    pub unit: String,
    /// The slice of the unit it was admitted under (the whole unit in lines written before
    /// slices existed).
    pub range: KeyRange,
    /// What was reconciled.
    pub key: String,
    /// When the work started, in wall-clock nanoseconds since the Unix epoch.
    pub start: u64,
    /// When it ended, as `start`; `None` when the process never wrote the end (killed, or
    /// still running).
    pub end: Option<u64>,
}

/// Two processes working on one unit at the same time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub(crate) unit: String,
    /// The interval that started first.
    pub first: Interval,
    /// The interval of another process that started before `first` ended.
    pub second: Interval,
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |i: &Interval| {
            format!(
                "shard {} (pid {}) {} [{}..{:?}]",
                i.shard, i.pid, i.key, i.start, i.end
            )
        };
        write!(
            f,
            "{}: {} overlaps {}",
            self.unit,
            side(&self.first),
            side(&self.second)
        )
    }
}

/// An audit file that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file exists but cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// A line that is not the last one (which may be torn) is not an audit line.
    #[error("{path}:{line}: not an audit line: {reason}")]
    Line {
        /// The file.
        path: std::path::PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// What a line must hold; the unit is under the field its writer named.
fn parse_line(raw: &str, unit_field: &str) -> Result<(String, u64, Interval), String> {
    let value: Value = serde_json::from_str(raw).map_err(|e| e.to_string())?;
    let text = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("no text field {name:?}"))
    };
    let number = |name: &str| {
        value
            .get(name)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("no number field {name:?}"))
    };
    let small = |name: &str| number(name).and_then(|n| u32::try_from(n).map_err(|e| e.to_string()));
    Ok((
        text("event")?,
        number("id")?,
        Interval {
            pid: small("pid")?,
            shard: small("shard")?,
            unit: text(unit_field)?,
            range: match value.get("range") {
                None => KeyRange::WHOLE,
                Some(range) => range
                    .as_str()
                    .ok_or("field \"range\" is not text")?
                    .parse()
                    .map_err(|e: shard_assign::ParseError| e.to_string())?,
            },
            key: text("key")?,
            start: number("t")?,
            end: None,
        },
    ))
}

/// Reads every interval of the audit files of any number of processes (files that do not
/// exist are skipped: a replica that never started wrote none). `unit_field` is the unit's
/// noun, as the writer named it.
pub fn read(files: &[impl AsRef<Path>], unit_field: &str) -> Result<Vec<Interval>, AuditError> {
    let mut open: BTreeMap<(u32, u64), Interval> = BTreeMap::new();
    let mut done = Vec::new();
    for file in files {
        let path = file.as_ref();
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(AuditError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let count = text.lines().count();
        for (n, raw) in text.lines().enumerate() {
            let (event, id, interval) = match parse_line(raw, unit_field) {
                Ok(parsed) => parsed,
                // A process killed mid-write leaves a torn last line: no complete event.
                Err(_) if n + 1 == count => continue,
                Err(reason) => {
                    return Err(AuditError::Line {
                        path: path.to_path_buf(),
                        line: n + 1,
                        reason,
                    });
                }
            };
            match event.as_str() {
                "start" => {
                    open.insert((interval.pid, id), interval);
                }
                "end" => {
                    if let Some(mut started) = open.remove(&(interval.pid, id)) {
                        started.end = Some(interval.start);
                        done.push(started);
                    }
                }
                other => {
                    return Err(AuditError::Line {
                        path: path.to_path_buf(),
                        line: n + 1,
                        reason: format!("unknown event {other:?}"),
                    });
                }
            }
        }
    }
    done.extend(open.into_values());
    Ok(done)
}

/// Overlaps between different processes on the same unit, under slices that nest (the same,
/// or one within the other). An interval without an end lasts until `deaths[pid]` (when that
/// process was killed) or, for a live process, forever.
pub fn overlaps(intervals: &[Interval], deaths: &BTreeMap<u32, u64>) -> Vec<Overlap> {
    let end_of = |i: &Interval| {
        i.end
            .or_else(|| deaths.get(&i.pid).copied())
            .unwrap_or(u64::MAX)
    };
    let nest = |a: KeyRange, b: KeyRange| a.within(b) || b.within(a);
    let mut by_unit: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for i in intervals {
        by_unit.entry(&i.unit).or_default().push(i);
    }
    let mut found = Vec::new();
    for (unit, mut list) in by_unit {
        list.sort_by_key(|i| i.start);
        // Sweep in start order, keeping the intervals that have not ended yet: per process and
        // slice, the one that reaches furthest. Any start before the end of one of another
        // process, under a slice that nests with its own, is an overlap.
        let mut reach: BTreeMap<(u32, KeyRange), &Interval> = BTreeMap::new();
        for interval in list {
            reach.retain(|_, other| end_of(other) > interval.start);
            for (&(pid, range), other) in &reach {
                if pid != interval.pid && nest(range, interval.range) {
                    found.push(Overlap {
                        unit: unit.to_string(),
                        first: (*other).clone(),
                        second: interval.clone(),
                    });
                }
            }
            let slot = (interval.pid, interval.range);
            if reach
                .get(&slot)
                .is_none_or(|r| end_of(r) < end_of(interval))
            {
                reach.insert(slot, interval);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(pid: u32, unit: &str, start: u64, end: Option<u64>) -> Interval {
        Interval {
            pid,
            shard: pid,
            unit: unit.into(),
            range: KeyRange::WHOLE,
            key: unit.into(),
            start,
            end,
        }
    }

    #[test]
    fn on_a_cut_unit_only_nested_slices_overlap() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let under = |pid, range, start, end| Interval {
            range,
            ..interval(pid, "fleet/hot", start, Some(end))
        };
        let disjoint = [under(1, low, 0, 10), under(2, high, 5, 15)];
        assert!(overlaps(&disjoint, &BTreeMap::new()).is_empty());
        // A split under way on one process and the half on another: they nest.
        let nested = [under(1, KeyRange::WHOLE, 0, 10), under(2, high, 5, 15)];
        assert_eq!(overlaps(&nested, &BTreeMap::new()).len(), 1);
        // A long interval under one half is still seen after a short one under the other.
        let long = [
            under(1, high, 0, 100),
            under(1, low, 1, 2),
            under(2, high, 50, 60),
        ];
        assert_eq!(overlaps(&long, &BTreeMap::new()).len(), 1);
    }

    #[test]
    fn the_checker_finds_overlaps_and_only_overlaps() {
        let deaths = BTreeMap::from([(3, 50)]);
        let ok = [
            interval(1, "a", 0, Some(10)),
            interval(2, "a", 10, Some(20)),
            interval(1, "b", 0, Some(100)),
            interval(1, "b", 5, Some(6)),
            interval(3, "c", 0, None),
            interval(4, "c", 50, Some(60)),
        ];
        assert!(overlaps(&ok, &deaths).is_empty());
        let bad = [interval(1, "a", 0, Some(10)), interval(2, "a", 9, Some(20))];
        assert_eq!(overlaps(&bad, &deaths).len(), 1);
        let unterminated = [
            interval(5, "d", 0, None),
            interval(6, "d", 1000, Some(1001)),
        ];
        assert_eq!(overlaps(&unterminated, &deaths).len(), 1);
        let killed_late = [interval(3, "e", 0, None), interval(4, "e", 49, Some(60))];
        assert_eq!(overlaps(&killed_late, &deaths).len(), 1);
    }

    #[test]
    fn what_is_written_reads_back_as_intervals_named_by_the_units_noun() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::open(2, "namespace", Some(&path)).unwrap();
        drop(audit.start("team-a", KeyRange::WHOLE, "configmap", "team-a/settings"));
        let (_, high) = KeyRange::WHOLE.halves().unwrap();
        let _open = audit.start("team-b", high, "namespace", "team-b");
        let mut torn = std::fs::read_to_string(&path).unwrap();
        torn.push_str("{\"event\": \"sta");
        std::fs::write(&path, torn).unwrap();
        let mut intervals = read(&[&path, &dir.path().join("missing.jsonl")], "namespace").unwrap();
        intervals.sort_by_key(|i| i.start);
        assert_eq!(intervals.len(), 2);
        assert_eq!(
            (intervals[0].unit.as_str(), intervals[0].shard),
            ("team-a", 2)
        );
        assert!(
            intervals[0]
                .end
                .is_some_and(|end| end >= intervals[0].start)
        );
        assert_eq!(intervals[1].end, None, "still open");
        assert_eq!(
            (intervals[0].range, intervals[1].range),
            (KeyRange::WHOLE, high)
        );
        let wrong_noun = read(&[&path], "cluster").unwrap_err();
        assert!(
            wrong_noun.to_string().contains("no text field \"cluster\""),
            "{wrong_noun}"
        );
    }

    #[test]
    fn start_and_end_lines_pair_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::open(3, "cluster", Some(&path)).unwrap();
        let a = audit.start("fleet/c1", KeyRange::WHOLE, "app", "fleet/x");
        let b = audit.start("fleet/c2", KeyRange::WHOLE, "cluster", "fleet/c2");
        drop(a);
        drop(b);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["event"], "start");
        assert_eq!(lines[2]["event"], "end");
        assert_eq!(lines[0]["id"], lines[2]["id"]);
        assert_eq!(lines[1]["cluster"], "fleet/c2");
        assert_eq!(lines[3]["shard"], 3);
        assert!(lines[2]["t"].as_u64().unwrap() >= lines[0]["t"].as_u64().unwrap());
        // Without a file nothing is written and nothing fails.
        let silent = Audit::open(0, "cluster", None).unwrap();
        drop(silent.start("a/b", KeyRange::WHOLE, "app", "a/c"));
    }

    /// A reconcile abandoned mid-way (its task aborted, as at fencing) still ends its interval,
    /// at the moment it was abandoned.
    #[tokio::test]
    async fn an_abandoned_reconcile_ends_its_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::open(1, "cluster", Some(&path)).unwrap();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let audit = audit.clone();
            async move {
                let _interval = audit.start("fleet/c1", KeyRange::WHOLE, "app", "fleet/x");
                let _ = started_tx.send(());
                std::future::pending::<()>().await;
            }
        });
        started_rx.await.unwrap();
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"].to_string())
            .collect();
        assert_eq!(events, [r#""start""#, r#""end""#]);
    }
}
