//! The fencing check, from the destinations' side: every write a destination received names
//! the term that sent it (in its User-Agent), and no term may write after its shard lease
//! could have expired for everyone else.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_e2e::WriteRecord;
use shardwise_handoff::drain::Incarnation;

/// One state of a shard lease, as a watch saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Renewal {
    pub holder: String,
    pub renewed: SystemTime,
    pub duration: Duration,
}

/// Every state of the shard leases of a namespace, recorded by a watch while it runs.
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
            let events = watcher(api, watcher::Config::default()).applied_objects();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let Ok(lease) = event else { continue };
                let is_shard = lease
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.contains("-shard-"));
                let spec = lease.spec.unwrap_or_default();
                if let (true, Some(holder), Some(renewed), Some(seconds)) = (
                    is_shard,
                    spec.holder_identity,
                    spec.renew_time,
                    spec.lease_duration_seconds,
                ) {
                    let renewed = SystemTime::from(renewed.0);
                    sink.lock().unwrap().push(Renewal {
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

/// The term a shardwise User-Agent names: `... (shard N; term <16 hex digits>)`.
fn term_of(user_agent: &str) -> Option<u64> {
    let hex = user_agent.split("term ").nth(1)?.trim_end_matches(')');
    u64::from_str_radix(hex, 16).ok()
}

/// Each write is matched to its term's holder identity; it is late if it arrived after the
/// term's last renewal plus the lease duration: the earliest instant at which another replica
/// could have been given the term's work.
pub fn late_writes(writes: &[WriteRecord], renewals: &[Renewal]) -> FenceReport {
    let mut expiry: BTreeMap<u64, (String, SystemTime)> = BTreeMap::new();
    for r in renewals {
        let token = Incarnation::of_identity(&r.holder).0;
        let ends = r.renewed + r.duration;
        let entry = expiry
            .entry(token)
            .or_insert_with(|| (r.holder.clone(), ends));
        entry.1 = entry.1.max(ends);
    }
    let mut report = FenceReport::default();
    for write in writes {
        let Some((holder, ends)) = write
            .user_agent
            .as_deref()
            .and_then(term_of)
            .and_then(|t| expiry.get(&t))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn write(seconds: u64, holder: &str) -> WriteRecord {
        WriteRecord {
            at: at(seconds),
            identity: "shardwise-destination".into(),
            user_agent: Some(format!(
                "shardwise-controller/0.1.0 (shard 1; term {:016x})",
                Incarnation::of_identity(holder).0
            )),
            method: "PATCH".into(),
            path: "/api/v1/namespaces/team-0/configmaps/app-1".into(),
            query: String::new(),
            code: 200,
        }
    }

    #[test]
    fn a_write_after_the_last_renewal_plus_the_duration_is_late_and_only_that() {
        let renewals = [
            Renewal {
                holder: "a".into(),
                renewed: at(100),
                duration: Duration::from_secs(6),
            },
            Renewal {
                holder: "a".into(),
                renewed: at(102),
                duration: Duration::from_secs(6),
            },
            Renewal {
                holder: "b".into(),
                renewed: at(120),
                duration: Duration::from_secs(6),
            },
        ];
        let mut unknown = write(101, "a");
        unknown.user_agent = Some("kubectl/v1.33".into());
        let writes = [
            write(107, "a"),
            write(109, "a"),
            write(125, "b"),
            write(130, "c"),
            unknown,
        ];
        let report = late_writes(&writes, &renewals);
        assert_eq!(report.checked, 3);
        assert_eq!(report.late.len(), 1);
        assert_eq!(report.late[0].holder, "a");
        assert_eq!(report.late[0].late_by, Duration::from_secs(1));
        assert_eq!(report.unattributed.len(), 2);
    }
}
