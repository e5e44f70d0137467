//! Which shards are alive, as judged from their leases. Every replica watches the shard leases
//! from the start, not only the planner: a replica that becomes planner then already knows how
//! long each lease has gone unrenewed, and a dead shard's clusters move one lease duration after
//! its last renewal rather than one duration after the new planner started watching.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use kube_runtime::{WatchStreamExt, watcher};
use shardwise_handoff::keys::{LEASE_KIND_LABEL, SHARD_LABEL, STATEFULSET_LABEL, parse_shard};
use shardwise_handoff::lease::LeaseObserver;
use shardwise_handoff::plan::Membership;
use tokio::sync::Notify;
use tracing::warn;

use crate::lease::{LeaseKind, lease_record};

/// The shards a StatefulSet asks for: `spec.replicas`, or 1 when unset (the API's default).
pub fn expected_shards(statefulset: &StatefulSet) -> u32 {
    statefulset
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(1)
}

/// The shard leases of one StatefulSet, observed continuously.
pub struct ShardLeases {
    api: Api<Lease>,
    selector: String,
    observer: Mutex<LeaseObserver>,
    shards: Mutex<BTreeMap<String, u32>>,
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

impl ShardLeases {
    pub fn new(client: Client, namespace: &str, statefulset: &str) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced(client, namespace),
            selector: format!(
                "{LEASE_KIND_LABEL}={},{STATEFULSET_LABEL}={statefulset}",
                LeaseKind::Shard.label()
            ),
            observer: Mutex::new(LeaseObserver::new()),
            shards: Mutex::new(BTreeMap::new()),
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
        let config = watcher::Config::default().labels(&self.selector);
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

    /// When the next valid lease would expire without a renewal.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.observer().next_expiry(now)
    }

    /// Reads the leases again when one looks expired: only a lease unchanged in a fresh read is
    /// really expired (the watch may just be late).
    pub async fn confirm_expiries(&self) -> Result<(), kube::Error> {
        if self.observer().expired_holders(Instant::now()).is_empty() {
            return Ok(());
        }
        let leases = self
            .api
            .list(&ListParams::default().labels(&self.selector))
            .await?;
        let now = Instant::now();
        for lease in &leases.items {
            self.record(lease, now);
        }
        Ok(())
    }
}
