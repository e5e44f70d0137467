//! The reconcile audit: every reconcile's start and end, per cluster, as JSON lines, so that the
//! files of all replicas can be merged and checked for overlaps.
//!
//! A start line is written (and flushed) before the reconcile touches anything and an end line
//! when its [`Interval`] is dropped: after the reconcile finished, or when it was abandoned
//! (its task aborted at fencing or shutdown), which is when its work stopped. A killed process
//! leaves an open interval that a checker must treat as lasting until the process died.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Serialize)]
struct Line<'a> {
    event: &'a str,
    /// Unique per reconcile within a process, to pair start and end.
    id: u64,
    /// Wall-clock time, nanoseconds since the Unix epoch.
    t: u128,
    shard: u32,
    pid: u32,
    /// `namespace/name` of the FleetCluster the work belongs to.
    cluster: &'a str,
    kind: &'a str,
    key: &'a str,
}

#[derive(Debug, Default)]
struct Inner {
    file: Option<File>,
    next_id: u64,
}

/// Appends audit lines to a file; a no-op when no file was configured.
#[derive(Clone, Debug)]
pub struct Audit {
    shard: u32,
    inner: Arc<Mutex<Inner>>,
}

/// An open interval; dropping it closes it.
#[derive(Debug)]
pub struct Interval {
    audit: Audit,
    id: u64,
    cluster: String,
    kind: &'static str,
    key: String,
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl Audit {
    pub fn open(shard: u32, path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(OpenOptions::new().create(true).append(true).open(path)?),
            None => None,
        };
        Ok(Self {
            shard,
            inner: Arc::new(Mutex::new(Inner { file, next_id: 0 })),
        })
    }

    fn write(&self, event: &str, id: u64, cluster: &str, kind: &str, key: &str) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let Some(file) = inner.file.as_mut() else {
            return;
        };
        let line = Line {
            event,
            id,
            t: now_nanos(),
            shard: self.shard,
            pid: std::process::id(),
            cluster,
            kind,
            key,
        };
        if let Ok(mut text) = serde_json::to_string(&line) {
            text.push('\n');
            // One write per line on an append-mode file: lines never interleave.
            if let Err(e) = file.write_all(text.as_bytes()) {
                tracing::warn!(error = %e, "could not write the audit file");
            }
        }
    }

    pub fn start(&self, cluster: &str, kind: &'static str, key: &str) -> Interval {
        let id = match self.inner.lock() {
            Ok(mut inner) => {
                inner.next_id += 1;
                inner.next_id
            }
            Err(_) => 0,
        };
        self.write("start", id, cluster, kind, key);
        Interval {
            audit: self.clone(),
            id,
            cluster: cluster.to_string(),
            kind,
            key: key.to_string(),
        }
    }
}

impl Drop for Interval {
    fn drop(&mut self) {
        self.audit
            .write("end", self.id, &self.cluster, self.kind, &self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_and_end_lines_pair_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::open(3, Some(&path)).unwrap();
        let a = audit.start("fleet/c1", "app", "fleet/x");
        let b = audit.start("fleet/c2", "cluster", "fleet/c2");
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
        let silent = Audit::open(0, None).unwrap();
        drop(silent.start("a/b", "app", "a/c"));
    }

    /// A reconcile abandoned mid-way (its task aborted, as at fencing) still ends its interval,
    /// at the moment it was abandoned.
    #[tokio::test]
    async fn an_abandoned_reconcile_ends_its_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = Audit::open(1, Some(&path)).unwrap();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn({
            let audit = audit.clone();
            async move {
                let _interval = audit.start("fleet/c1", "app", "fleet/x");
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
