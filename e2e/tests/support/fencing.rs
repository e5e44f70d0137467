//! The fencing check, from the servers' side: every write a destination or the control plane
//! received from a term names that term and its lease (in its User-Agent), and no term may
//! write after its lease (a shard's, or the planner's) could have expired for everyone else.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_e2e::WriteRecord;
use shardwise_handoff::drain::Incarnation;
use shardwise_runtime::audit::Interval;

/// One state of a shard lease, as a watch saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The Lease's name.
    pub lease: String,
    pub holder: String,
    pub renewed: SystemTime,
    pub duration: Duration,
}

/// Every state of the shard and planner leases of a namespace, recorded by a watch while it
/// runs.
pub struct LeaseHistory {
    renewals: std::sync::Arc<std::sync::Mutex<Vec<Renewal>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseHistory {
    pub fn record(client: Client, namespace: &str) -> Self {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let renewals = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = renewals.clone();
        let task = tokio::spawn(async move {
            // With a backoff: while the control plane is down (restarted by a scenario, or
            // stopped before this task is aborted) a watcher without one retries at once,
            // without ever yielding, and holds a worker thread.
            let events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let Ok(lease) = event else { continue };
                let name = lease.metadata.name.unwrap_or_default();
                let spec = lease.spec.unwrap_or_default();
                if let (true, Some(holder), Some(renewed), Some(seconds)) = (
                    name.contains("-shard-") || name.ends_with("-planner"),
                    spec.holder_identity,
                    spec.renew_time,
                    spec.lease_duration_seconds,
                ) {
                    let renewed = SystemTime::from(renewed.0);
                    sink.lock().unwrap().push(Renewal {
                        lease: name,
                        holder,
                        renewed,
                        duration: Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
                    });
                }
            }
        });
        Self { renewals, task }
    }

    pub fn renewals(&self) -> Vec<Renewal> {
        self.renewals.lock().unwrap().clone()
    }
}

impl Drop for LeaseHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A write that arrived after its term's lease could have expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateWrite {
    pub write: WriteRecord,
    pub holder: String,
    /// How long after the expiry it arrived.
    pub late_by: Duration,
}

/// What [`late_writes`] found.
#[derive(Debug, Default)]
pub struct FenceReport {
    /// Writes matched to a term.
    pub checked: usize,
    pub late: Vec<LateWrite>,
    /// Writes with no term, or a term of no lease seen: they cannot be checked.
    pub unattributed: Vec<WriteRecord>,
}

/// The lease and term a shardwise User-Agent names: `... (shard N; term <16 hex digits>)` is
/// a term of `<statefulset>-shard-N`, `... (planner; term <hex>)` one of
/// `<statefulset>-planner`.
fn term_of(user_agent: &str, statefulset: &str) -> Option<(String, u64)> {
    let (_, tail) = user_agent.rsplit_once(" (")?;
    let (role, term) = tail.trim_end_matches(')').split_once("; term ")?;
    let lease = match role.strip_prefix("shard ") {
        Some(shard) => format!("{statefulset}-shard-{}", shard.parse::<u32>().ok()?),
        None if role == "planner" => format!("{statefulset}-planner"),
        None => return None,
    };
    Some((lease, u64::from_str_radix(term, 16).ok()?))
}

/// Each write is matched to its lease and term (the holder identity whose hash the term is);
/// it is late if it arrived after the term's last renewal plus the lease duration: the
/// earliest instant at which another replica could have been given the term's work. Writes
/// that name no term, or a term no renewal was seen of, are unattributed.
pub fn late_writes(writes: &[WriteRecord], renewals: &[Renewal], statefulset: &str) -> FenceReport {
    let mut expiry: BTreeMap<(String, u64), (String, SystemTime)> = BTreeMap::new();
    for r in renewals {
        let token = Incarnation::of_identity(&r.holder).0;
        let ends = r.renewed + r.duration;
        let entry = expiry
            .entry((r.lease.clone(), token))
            .or_insert_with(|| (r.holder.clone(), ends));
        entry.1 = entry.1.max(ends);
    }
    let mut report = FenceReport::default();
    for write in writes {
        let Some((holder, ends)) = write
            .user_agent
            .as_deref()
            .and_then(|agent| term_of(agent, statefulset))
            .and_then(|term| expiry.get(&term))
        else {
            report.unattributed.push(write.clone());
            continue;
        };
        report.checked += 1;
        if let Ok(late_by) = write.at.duration_since(*ends)
            && late_by > Duration::ZERO
        {
            report.late.push(LateWrite {
                write: write.clone(),
                holder: holder.clone(),
                late_by,
            });
        }
    }
    report
}

/// Panics if a write of `writes` (to `server`) names no term of a lease seen, or arrived after
/// its term's lease could have expired; returns how many were checked.
pub fn assert_no_late_writes(
    writes: &[WriteRecord],
    renewals: &[Renewal],
    statefulset: &str,
    server: &str,
) -> usize {
    let report = late_writes(writes, renewals, statefulset);
    assert!(
        report.unattributed.is_empty(),
        "{} {server} writes name no term of a lease seen, e.g. {:?}",
        report.unattributed.len(),
        &report.unattributed[..report.unattributed.len().min(3)]
    );
    assert!(
        report.late.is_empty(),
        "{} {server} writes arrived after their term's lease expired (a write after the fence), e.g. {:?}",
        report.late.len(),
        &report.late[..report.late.len().min(3)]
    );
    report.checked
}

/// What a process frozen while it held a shard lease started once that lease had expired, as
/// its own audit tells.
#[derive(Debug)]
pub struct ExpiredStarts {
    /// The identity the lease was held under at the freeze: the frozen term.
    pub holder: String,
    /// When the frozen term's lease expired: its last renewal plus the lease duration.
    pub expiry: SystemTime,
    /// When the lease was next taken (by the resumed process's next term, whose reconciles are
    /// its own), if it was.
    pub next_term: Option<SystemTime>,
    /// The reconciles the process started after the expiry and before its next term.
    pub starts: Vec<Interval>,
}

/// `t` on the audit's clock: nanoseconds since the epoch.
pub fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The term that held `lease` at `at` (the holder of its latest renewal seen by then), with
/// every renewal of that term seen, before `at` or after; `None` if none was seen by `at`.
pub fn term_at<'a>(
    renewals: &'a [Renewal],
    lease: &str,
    at: SystemTime,
) -> Option<(String, Vec<&'a Renewal>)> {
    let holder = renewals
        .iter()
        .filter(|r| r.lease == lease && r.renewed <= at)
        .max_by_key(|r| r.renewed)?
        .holder
        .clone();
    let term = renewals
        .iter()
        .filter(|r| r.lease == lease && r.holder == holder)
        .collect();
    Some((holder, term))
}

/// The reconciles that process `pid`, frozen at `frozen_at` while it held `lease`, started
/// after that term's lease had expired; `None` if no renewal of `lease` before the freeze was
/// seen. Every renewal of the term counts, one sent just before the freeze too.
pub fn starts_after_expiry(
    intervals: &[Interval],
    pid: u32,
    lease: &str,
    renewals: &[Renewal],
    frozen_at: SystemTime,
) -> Option<ExpiredStarts> {
    let (holder, term) = term_at(renewals, lease, frozen_at)?;
    let expiry = term.iter().map(|r| r.renewed + r.duration).max()?;
    let last_renewal = term.iter().map(|r| r.renewed).max()?;
    let next_term = renewals
        .iter()
        .filter(|r| r.lease == lease && r.holder != holder && r.renewed > last_renewal)
        .map(|r| r.renewed)
        .min();
    let (from, to) = (nanos(expiry), next_term.map_or(u64::MAX, nanos));
    let starts = intervals
        .iter()
        .filter(|i| i.pid == pid && i.start > from && i.start < to)
        .cloned()
        .collect();
    Some(ExpiredStarts {
        holder,
        expiry,
        next_term,
        starts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn write(seconds: u64, role: &str, holder: &str) -> WriteRecord {
        WriteRecord {
            at: at(seconds),
            identity: "shardwise-destination".into(),
            user: "shardwise-destination".into(),
            user_agent: Some(format!(
                "shardwise-controller/0.1.0 ({role}; term {:016x})",
                Incarnation::of_identity(holder).0
            )),
            method: "PATCH".into(),
            path: "/api/v1/namespaces/team-0/configmaps/app-1".into(),
            query: String::new(),
            code: 200,
        }
    }

    fn renewal(lease: &str, holder: &str, seconds: u64) -> Renewal {
        Renewal {
            lease: lease.into(),
            holder: holder.into(),
            renewed: at(seconds),
            duration: Duration::from_secs(6),
        }
    }

    #[test]
    fn a_write_after_its_own_leases_last_renewal_plus_the_duration_is_late_and_only_that() {
        let renewals = [
            renewal("shardwise-shard-1", "a", 100),
            renewal("shardwise-shard-1", "a", 102),
            renewal("shardwise-shard-1", "b", 120),
            // The same identity holds the planner lease, renewed later: it does not extend
            // the shard term's writes, nor the other way round.
            renewal("shardwise-planner", "a", 110),
        ];
        let mut unknown = write(101, "shard 1", "a");
        unknown.user_agent = Some("kubectl/v1.33".into());
        let writes = [
            write(107, "shard 1", "a"),
            write(109, "shard 1", "a"),
            write(125, "shard 1", "b"),
            write(130, "shard 1", "c"),
            // A term of shard 1's holder named as shard 2's: no renewal of that lease.
            write(103, "shard 2", "a"),
            write(115, "planner", "a"),
            write(117, "planner", "a"),
            unknown,
        ];
        let report = late_writes(&writes, &renewals, "shardwise");
        assert_eq!(report.checked, 5);
        let late: Vec<(&str, Duration)> = report
            .late
            .iter()
            .map(|l| (l.holder.as_str(), l.late_by))
            .collect();
        assert_eq!(
            late,
            [("a", Duration::from_secs(1)), ("a", Duration::from_secs(1))]
        );
        assert_eq!(report.unattributed.len(), 3);
    }

    fn started(pid: u32, seconds: u64) -> Interval {
        Interval {
            pid,
            shard: 1,
            unit: "fleet/cluster-1".into(),
            range: shard_assign::KeyRange::WHOLE,
            key: "fleet/app-1".into(),
            start: nanos(at(seconds)),
            end: None,
        }
    }

    #[test]
    fn a_start_between_the_frozen_terms_expiry_and_its_next_term_is_counted_and_only_that() {
        let renewal = |lease: &str, holder: &str, seconds| Renewal {
            lease: lease.into(),
            holder: holder.into(),
            renewed: at(seconds),
            duration: Duration::from_secs(6),
        };
        let renewals = [
            renewal("shardwise-shard-1", "p_1", 100),
            renewal("shardwise-shard-1", "p_1", 101),
            // Sent just before the freeze at 102, seen after it.
            renewal("shardwise-shard-1", "p_1", 102),
            renewal("shardwise-shard-2", "q_1", 140),
            renewal("shardwise-shard-1", "p_1-1", 150),
        ];
        let intervals = [
            started(7, 101),
            started(7, 107),
            started(7, 109),
            started(7, 149),
            started(8, 120),
            // The next term's own.
            started(7, 151),
        ];
        let found = starts_after_expiry(&intervals, 7, "shardwise-shard-1", &renewals, at(102))
            .expect("renewals before the freeze");
        assert_eq!(found.holder, "p_1");
        assert_eq!(found.expiry, at(108));
        assert_eq!(found.next_term, Some(at(150)));
        let starts: Vec<u64> = found.starts.iter().map(|i| i.start).collect();
        assert_eq!(starts, [nanos(at(109)), nanos(at(149))]);
        assert!(
            starts_after_expiry(&intervals, 7, "shardwise-shard-3", &renewals, at(102)).is_none()
        );
    }
}
