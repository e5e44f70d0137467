//! Which shards are alive, as judged from their leases. Every replica watches the shard leases
//! from the start, not only the planner: a replica that becomes planner then already knows how
//! long each lease has gone unrenewed, and a dead shard's clusters move one lease duration after
//! its last renewal rather than one duration after the new planner started watching.
//!
//! The shard leases also carry each shard's measured load ([`crate::load`]); [`LeaseLoads`]
//! reads it from them, for the planner.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::core::{Expression, Selector};
use kube::{Api, Client, ResourceExt};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_handoff::keys::{
    LEASE_KIND_LABEL, LOAD_ANNOTATION, SHARD_LABEL, STATEFULSET_LABEL, parse_shard,
};
use shardwise_handoff::lease::LeaseObserver;
use shardwise_handoff::plan::Membership;
use tokio::sync::Notify;
use tracing::warn;

use crate::lease::{LeaseKind, lease_record};
use crate::load::{LoadReport, MeasuredLoads, ReportError};

/// The shards a StatefulSet asks for: `spec.replicas`, or 1 when unset (the API's default).
pub(crate) fn expected_shards(statefulset: &StatefulSet) -> u32 {
    statefulset
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(1)
}

/// The measured load the shard leases carry, read from each version of each lease once.
#[derive(Clone, Debug, Default)]
pub struct LeaseLoads {
    measured: MeasuredLoads,
    /// The version of each lease last read: a relist or a confirming read brings the same
    /// version again, and a report is applied (or a bad one reported) once.
    versions: BTreeMap<String, String>,
}

impl LeaseLoads {
    /// Reads the report of a shard lease of shard `shard`, observed at `now`. Without a
    /// renewal time (released) the lease carries no current report. An annotation that is
    /// not a report is ignored, and said once per version of the lease: the error comes back
    /// the first time only.
    pub fn observe(&mut self, lease: &Lease, shard: u32, now: Instant) -> Result<(), ReportError> {
        let name = lease.name_any();
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.versions.get(&name) == Some(&version) {
            return Ok(());
        }
        self.versions.insert(name, version);
        let Some(text) = lease.annotations().get(LOAD_ANNOTATION) else {
            return Ok(());
        };
        let Some(renewed) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) else {
            return Ok(());
        };
        let report = LoadReport::decode(text)?;
        self.measured.apply(shard, renewed.0, &report, now);
        Ok(())
    }

    /// The latest measured load of every record.
    pub fn measured(&self) -> &MeasuredLoads {
        &self.measured
    }
}

/// The shard leases of one StatefulSet, observed continuously.
pub(crate) struct ShardLeases {
    api: Api<Lease>,
    selector: Selector,
    observer: Mutex<LeaseObserver>,
    shards: Mutex<BTreeMap<String, u32>>,
    loads: Mutex<LeaseLoads>,
    synced: AtomicBool,
    /// Notified when the valid leases or their holders change, and once the first list is
    /// complete.
    pub changed: Notify,
}

impl std::fmt::Debug for ShardLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLeases")
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

/// The label selector of the shard Leases of `statefulset`'s replicas.
pub fn shard_lease_selector(statefulset: &str) -> Selector {
    Selector::from_iter([
        Expression::Equal(LEASE_KIND_LABEL.into(), LeaseKind::Shard.label().into()),
        Expression::Equal(STATEFULSET_LABEL.into(), statefulset.into()),
    ])
}

impl ShardLeases {
    pub fn new(client: Client, namespace: &str, statefulset: &str) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            selector: shard_lease_selector(statefulset),
            observer: Mutex::new(LeaseObserver::new()),
            shards: Mutex::new(BTreeMap::new()),
            loads: Mutex::new(LeaseLoads::default()),
            synced: AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    fn observer(&self) -> MutexGuard<'_, LeaseObserver> {
        self.observer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, lease: &Lease, now: Instant) {
        let name = lease.name_any();
        if let Some(shard) = lease.labels().get(SHARD_LABEL).and_then(|v| parse_shard(v)) {
            self.shards
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.clone(), shard);
            let read = self
                .loads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .observe(lease, shard, now);
            if let Err(e) = read {
                let version = lease.resource_version().unwrap_or_default();
                warn!(lease = %name, %version, error = %e, "ignoring the load report of a shard lease");
            }
        }
        self.observer().observe(&name, lease_record(lease), now);
    }

    /// Valid leases with their holders.
    fn valid(&self, now: Instant) -> BTreeMap<String, String> {
        let observer = self.observer();
        observer
            .valid_leases(now)
            .map(|name| {
                let holder = observer.holder(name).unwrap_or_default().to_string();
                (name.to_string(), holder)
            })
            .collect()
    }

    /// Watches the leases until the task is dropped.
    pub async fn watch(self: Arc<Self>) {
        let config = watcher::Config::default().labels_from(&self.selector);
        let mut stream = std::pin::pin!(watcher(self.api.clone(), config).default_backoff());
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            let before = self.valid(now);
            match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                    self.record(&lease, now);
                }
                Ok(watcher::Event::InitDone) => {
                    self.synced.store(true, Ordering::SeqCst);
                    self.changed.notify_one();
                }
                // A deleted lease is not a released one: its holder may still be working and
                // about to recreate it. The last observation simply expires unless a new
                // version appears.
                Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {}
                Err(e) => {
                    warn!(error = %e, "lease watch failed; retrying");
                    continue;
                }
            }
            if before != self.valid(now) {
                self.changed.notify_one();
            }
        }
    }

    /// Whether the first list of leases has been seen.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// Waits for the first list.
    pub async fn wait_synced(&self) {
        while !self.is_synced() {
            let notified = self.changed.notified();
            if self.is_synced() {
                break;
            }
            notified.await;
        }
        // Keep the notification for whoever plans next.
        self.changed.notify_one();
    }

    /// Shards whose lease is valid at `now`, with the identity holding it.
    pub fn alive(&self, now: Instant) -> BTreeMap<u32, String> {
        let valid = self.valid(now);
        let shards = self.shards.lock().unwrap_or_else(PoisonError::into_inner);
        valid
            .into_iter()
            .filter_map(|(name, holder)| shards.get(&name).map(|&shard| (shard, holder)))
            .collect()
    }

    /// The membership at `now` of a StatefulSet that asks for `expected` shards.
    pub fn membership(&self, expected: u32, now: Instant) -> Membership {
        Membership {
            expected,
            alive: self.alive(now),
        }
    }

    /// The latest measured load of every record, as the shard leases reported it.
    pub fn measured_loads(&self) -> MeasuredLoads {
        self.loads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .measured()
            .clone()
    }

    /// When the next valid lease would expire without a renewal.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.observer().next_expiry(now)
    }

    /// Reads the leases again when one looks expired at `at`: only a lease unchanged in a fresh
    /// read is really expired (the watch may just be late). The membership must then be taken
    /// at the same `at`: at a later instant a lease may look expired that no read confirmed.
    pub async fn confirm_expiries(&self, at: Instant) -> Result<(), kube::Error> {
        if self.observer().expired_holders(at).is_empty() {
            return Ok(());
        }
        let leases = self
            .api
            .list(&ListParams::default().labels_from(&self.selector))
            .await?;
        let now = Instant::now();
        for lease in &leases.items {
            self.record(lease, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use shardwise_handoff::plan::{ObjectKey, RecordKey};

    use super::*;

    fn record(name: &str) -> RecordKey {
        RecordKey::whole(ObjectKey::new("fleet", name))
    }

    /// Version `version` of shard `shard`'s lease, renewed `renewed` seconds in, carrying
    /// `load` (if any).
    fn lease(shard: u32, version: u64, renewed: Option<i64>, load: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(format!("shardwise-shard-{shard}")),
                resource_version: Some(version.to_string()),
                labels: Some(BTreeMap::from([(
                    SHARD_LABEL.to_string(),
                    shard.to_string(),
                )])),
                annotations: load
                    .map(|l| BTreeMap::from([(LOAD_ANNOTATION.to_string(), l.to_string())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(format!("shardwise-{shard}_1")),
                renew_time: renewed
                    .map(|s| MicroTime(jiff::Timestamp::from_second(1_700_000_000 + s).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    fn busy(loads: &LeaseLoads, name: &str) -> Option<(f64, u64, u32)> {
        loads
            .measured()
            .get(&record(name))
            .map(|m| (m.load.busy, m.load.items, m.shard))
    }

    #[test]
    fn every_shard_lease_report_is_read_and_kept_per_record() {
        let now = Instant::now();
        let mut loads = LeaseLoads::default();
        let zero = r#"{"v":1,"records":{"fleet/a":{"busy":0.5,"items":10},"fleet/b":{"busy":0.25,"items":3}}}"#;
        let one = r#"{"v":1,"records":{"fleet/c":{"busy":1.5,"items":30}}}"#;
        loads
            .observe(&lease(0, 1, Some(0), Some(zero)), 0, now)
            .unwrap();
        loads
            .observe(&lease(1, 2, Some(0), Some(one)), 1, now)
            .unwrap();
        // A lease without a report (an older replica) adds nothing and is no error.
        loads.observe(&lease(2, 3, Some(0), None), 2, now).unwrap();
        assert_eq!(busy(&loads, "a"), Some((0.5, 10, 0)));
        assert_eq!(busy(&loads, "c"), Some((1.5, 30, 1)));
        assert_eq!(loads.measured().len(), 3);
        // b moved to shard 1; shard 0's next renewal no longer has it, and shard 1 has not
        // measured it yet: the last value stays.
        let zero = r#"{"v":1,"records":{"fleet/a":{"busy":0.5,"items":10}}}"#;
        loads
            .observe(&lease(0, 4, Some(2), Some(zero)), 0, now)
            .unwrap();
        assert_eq!(busy(&loads, "b"), Some((0.25, 3, 0)));
        let one = r#"{"v":1,"records":{"fleet/b":{"busy":0.375,"items":3},"fleet/c":{"busy":1.5,"items":30}}}"#;
        loads
            .observe(&lease(1, 5, Some(20), Some(one)), 1, now)
            .unwrap();
        assert_eq!(busy(&loads, "b"), Some((0.375, 3, 1)));
        // A released lease carries no current report.
        let stale = r#"{"v":1,"records":{"fleet/b":{"busy":9,"items":3}}}"#;
        loads
            .observe(&lease(0, 6, None, Some(stale)), 0, now)
            .unwrap();
        assert_eq!(busy(&loads, "b"), Some((0.375, 3, 1)));
    }

    #[test]
    fn a_malformed_report_is_ignored_and_said_once_per_version() {
        let now = Instant::now();
        let mut loads = LeaseLoads::default();
        let good = r#"{"v":1,"records":{"fleet/a":{"busy":0.5,"items":10}}}"#;
        loads
            .observe(&lease(0, 1, Some(0), Some(good)), 0, now)
            .unwrap();
        for bad in [
            "not json",
            r#"{"v":7,"records":{}}"#,
            r#"{"v":1,"records":{"/x":{"busy":1,"items":1}}}"#,
        ] {
            let version = lease(0, 2, Some(2), Some(bad));
            assert!(loads.observe(&version, 0, now).is_err(), "{bad}");
            // The same version again (a relist, a confirming read): nothing more to say.
            assert!(loads.observe(&version, 0, now).is_ok(), "{bad}");
            assert_eq!(busy(&loads, "a"), Some((0.5, 10, 0)));
            loads
                .observe(&lease(0, 1, Some(0), Some(good)), 0, now)
                .unwrap();
        }
    }

    #[tokio::test]
    async fn the_shard_leases_feed_the_loads_by_their_shard_label() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let leases = ShardLeases::new(
            kube::Client::try_from(config).unwrap(),
            "fleet",
            "shardwise",
        );
        let report = r#"{"v":1,"records":{"fleet/a":{"busy":0.5,"items":10}}}"#;
        let mut unlabelled = lease(3, 1, Some(0), Some(report));
        unlabelled.metadata.labels = None;
        leases.record(&unlabelled, Instant::now());
        assert!(leases.measured_loads().is_empty());
        leases.record(&lease(3, 2, Some(0), Some(report)), Instant::now());
        let measured = leases.measured_loads();
        assert_eq!(measured.get(&record("a")).map(|m| m.shard), Some(3));
    }
}
