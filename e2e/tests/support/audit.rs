//! The safety check: merge the reconcile audit files of every replica process and fail on any
//! instant at which two processes worked on the same cluster (or its apps).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Line {
    event: String,
    id: u64,
    t: u128,
    shard: u32,
    pid: u32,
    cluster: String,
    key: String,
}

/// One reconcile of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub pid: u32,
    pub shard: u32,
    pub cluster: String,
    pub key: String,
    pub start: u128,
    /// `None` when the process never wrote the end (killed, or still running).
    pub end: Option<u128>,
}

/// Two processes working on one cluster at the same time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub cluster: String,
    pub first: Interval,
    pub second: Interval,
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cluster {}: shard {} (pid {}) {} [{}..{:?}] overlaps shard {} (pid {}) {} [{}..{:?}]",
            self.cluster,
            self.first.shard,
            self.first.pid,
            self.first.key,
            self.first.start,
            self.first.end,
            self.second.shard,
            self.second.pid,
            self.second.key,
            self.second.start,
            self.second.end
        )
    }
}

/// Reads every interval of the given audit files.
pub fn read(files: &[impl AsRef<Path>]) -> Result<Vec<Interval>, String> {
    let mut open: BTreeMap<(u32, u64), Interval> = BTreeMap::new();
    let mut done = Vec::new();
    for file in files {
        let path = file.as_ref();
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        for (n, raw) in text.lines().enumerate() {
            // A process killed mid-write leaves a torn last line; it carries no complete event.
            let Ok(line) = serde_json::from_str::<Line>(raw) else {
                if n + 1 == text.lines().count() {
                    continue;
                }
                return Err(format!(
                    "{}:{}: not an audit line: {raw}",
                    path.display(),
                    n + 1
                ));
            };
            match line.event.as_str() {
                "start" => {
                    open.insert(
                        (line.pid, line.id),
                        Interval {
                            pid: line.pid,
                            shard: line.shard,
                            cluster: line.cluster,
                            key: line.key,
                            start: line.t,
                            end: None,
                        },
                    );
                }
                "end" => {
                    if let Some(mut interval) = open.remove(&(line.pid, line.id)) {
                        interval.end = Some(line.t);
                        done.push(interval);
                    }
                }
                other => return Err(format!("{}: unknown event {other:?}", path.display())),
            }
        }
    }
    done.extend(open.into_values());
    Ok(done)
}

/// Overlaps between different processes on the same cluster. An interval without an end lasts
/// until `deaths[pid]` (when the test killed that process) or, for a live process, forever.
pub fn overlaps(intervals: &[Interval], deaths: &BTreeMap<u32, u128>) -> Vec<Overlap> {
    let end_of = |i: &Interval| {
        i.end
            .or_else(|| deaths.get(&i.pid).copied())
            .unwrap_or(u128::MAX)
    };
    let mut by_cluster: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for i in intervals {
        by_cluster.entry(&i.cluster).or_default().push(i);
    }
    let mut found = Vec::new();
    for (cluster, mut list) in by_cluster {
        list.sort_by_key(|i| i.start);
        // Sweep in start order, remembering the interval of another process that reaches
        // furthest; any start before that end is an overlap.
        let mut reach: BTreeMap<u32, &Interval> = BTreeMap::new();
        for interval in list {
            for (&pid, other) in &reach {
                if pid != interval.pid && end_of(other) > interval.start {
                    found.push(Overlap {
                        cluster: cluster.to_string(),
                        first: (*other).clone(),
                        second: interval.clone(),
                    });
                }
            }
            let furthest = reach
                .get(&interval.pid)
                .is_none_or(|r| end_of(r) < end_of(interval));
            if furthest {
                reach.insert(interval.pid, interval);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(pid: u32, cluster: &str, start: u128, end: Option<u128>) -> Interval {
        Interval {
            pid,
            shard: pid,
            cluster: cluster.into(),
            key: cluster.into(),
            start,
            end,
        }
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
}
