//! Holding a `coordination.k8s.io/v1` Lease: acquire, renew, release, and tell the rest of the
//! process until when it may work (its fence).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use shardwise_handoff::drain::Incarnation;
use shardwise_handoff::lease::{
    LeaseAction, LeaseObserver, LeaseRecord, LeaseTiming, lease_action,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Whether this process holds the lease, and until when it may act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holding {
    /// Not held: not yet acquired, lost or released.
    NotHeld,
    /// Held; all work must have stopped by `fence_at` unless a renewal moves it.
    Held {
        /// When the hold ends without another renewal, on the monotonic clock (counted from
        /// the start of the last successful renewal).
        fence_at: Instant,
        /// The token of the identity it is held under. Each time the lease is lost, the
        /// process takes it again under a new identity: work assigned to the lost term is not
        /// the new term's.
        incarnation: Incarnation,
    },
}

impl Holding {
    /// Held, and the fence not passed.
    pub fn is_held(&self) -> bool {
        matches!(self, Holding::Held { fence_at, .. } if Instant::now() < *fence_at)
    }

    /// The incarnation it is held under, if held.
    pub fn incarnation(&self) -> Option<Incarnation> {
        match self {
            Holding::Held { incarnation, .. } if self.is_held() => Some(*incarnation),
            _ => None,
        }
    }
}

/// The gate in front of every request a term sends to a destination: open while the lease is
/// held under the term's incarnation and its fence, on the monotonic clock, is ahead. A
/// process frozen (SIGSTOP, a GC or VM pause) with requests in flight finds it shut when it
/// resumes past its fence, before the lease task has even run again.
#[derive(Clone, Debug)]
pub struct Fence {
    holding: watch::Receiver<Holding>,
    incarnation: Incarnation,
}

/// A request stopped at the [`Fence`].
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
#[error("fenced: the shard lease is no longer held by this term, so nothing more is sent")]
pub struct Fenced;

impl Fence {
    /// The fence of the term held under `incarnation`, following the lease task's `holding`.
    pub fn new(holding: watch::Receiver<Holding>, incarnation: Incarnation) -> Self {
        Self {
            holding,
            incarnation,
        }
    }

    /// `Ok` while a request may still be sent.
    pub fn check(&self) -> Result<(), Fenced> {
        self.check_at(Instant::now())
    }

    /// [`check`](Self::check) at `now` on the monotonic clock. Once it fails, it fails for
    /// good: the lease task never renews a term whose fence has passed.
    pub fn check_at(&self, now: Instant) -> Result<(), Fenced> {
        match *self.holding.borrow() {
            Holding::Held {
                fence_at,
                incarnation,
            } if incarnation == self.incarnation && now < fence_at => Ok(()),
            _ => Err(Fenced),
        }
    }
}

/// The leases of the protocol, by the value of their `shardwise.io/lease` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// One per shard, held by the replica of that ordinal.
    Shard,
    /// One per StatefulSet, held by the elected planner.
    Planner,
}

impl LeaseKind {
    pub fn label(self) -> &'static str {
        match self {
            LeaseKind::Shard => "shard",
            LeaseKind::Planner => "planner",
        }
    }
}

/// A lease to hold.
#[derive(Clone, Debug)]
pub struct LeaseSpecification {
    /// The Lease object's name.
    pub name: String,
    /// Labels the Lease is created with.
    pub labels: BTreeMap<String, String>,
    /// Unique per process: a restarted pod waits for its previous incarnation's lease to expire.
    /// The lease is held under this identity, then under `<identity>-<n>` after its n-th loss.
    pub identity: String,
    /// How long the lease lasts, and when it is renewed and given up.
    pub timing: LeaseTiming,
    /// The StatefulSet, in the Lease's namespace, the Lease belongs to. The Lease then carries
    /// an owner reference to it, so that the garbage collector deletes it with the
    /// StatefulSet (`helm uninstall` leaves no Lease behind), and it is created only while the
    /// StatefulSet exists: a replica still stopping after its StatefulSet was deleted must not
    /// create the Lease again, outside any owner. A Lease found without the reference (made
    /// by an older version, or orphaned by `kubectl delete --cascade=orphan`) gets it at its
    /// next renewal.
    pub statefulset: Option<String>,
}

/// Resolves once `holding` is no longer held under `incarnation`: released, lost, its fence
/// reached, or (if the loss went unseen) held again under another incarnation.
pub async fn until_lost(mut holding: watch::Receiver<Holding>, incarnation: Incarnation) {
    loop {
        let current = *holding.borrow_and_update();
        match current {
            Holding::Held {
                fence_at,
                incarnation: held_as,
            } if held_as == incarnation => {
                tokio::select! {
                    _ = tokio::time::sleep_until(fence_at.into()) => {
                        // The fence may have moved while we slept.
                        if matches!(*holding.borrow(), Holding::Held { fence_at: f, incarnation: i }
                            if f > Instant::now() && i == incarnation)
                        {
                            continue;
                        }
                        return;
                    }
                    changed = holding.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
            _ => return,
        }
    }
}

/// Resolves once `holding` is held (with its fence ahead), with the incarnation it is held as.
pub async fn until_held(
    mut holding: watch::Receiver<Holding>,
) -> Result<Incarnation, watch::error::RecvError> {
    loop {
        if let Some(incarnation) = holding.borrow_and_update().incarnation() {
            return Ok(incarnation);
        }
        holding.changed().await?;
    }
}

/// What the protocol needs of a Lease object.
pub(crate) fn lease_record(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.as_ref();
    LeaseRecord {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
        duration: Duration::from_secs(
            spec.and_then(|s| s.lease_duration_seconds)
                .and_then(|d| u64::try_from(d).ok())
                .unwrap_or(15),
        ),
    }
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

const FENCE_PASSED: &str = "could not renew the lease before the renew deadline";

/// Acquires and renews the lease until `stop` is cancelled, then releases it if held.
pub async fn hold(
    client: Client,
    namespace: String,
    spec: LeaseSpecification,
    holding: watch::Sender<Holding>,
    stop: CancellationToken,
) {
    let (_, none) = watch::channel(Annotations::new());
    hold_annotated(client, namespace, spec, none, holding, stop).await;
}

/// Annotations of a Lease, by key.
pub(crate) type Annotations = BTreeMap<String, String>;

/// [`hold`], and every write that creates or renews the lease also sets the annotations
/// `annotations` holds at that moment: what the holder publishes rides on the renewals it
/// makes anyway, costs no request of its own, and only the holder can write it. Annotations
/// it does not hold are left as they are.
pub async fn hold_annotated(
    client: Client,
    namespace: String,
    mut spec: LeaseSpecification,
    annotations: watch::Receiver<Annotations>,
    holding: watch::Sender<Holding>,
    stop: CancellationToken,
) {
    let api = LeaseApis {
        leases: Api::namespaced(client.clone(), &namespace),
        statefulsets: Api::namespaced(client, &namespace),
        missing_reported: std::sync::atomic::AtomicBool::new(false),
    };
    let mut observer = LeaseObserver::new();
    let attempt_timeout = spec.timing.renew_deadline / 2;
    let base_identity = spec.identity.clone();
    let mut losses = 0u64;
    let mut lost = |spec: &mut LeaseSpecification, why: &str| {
        warn!(lease = %spec.name, "{why}");
        // A new term: the lease is taken again only once the lost term's has expired.
        losses += 1;
        spec.identity = format!("{base_identity}-{losses}");
        holding.send_replace(Holding::NotHeld);
    };
    // Past the fence without a renewal, the term is over for every purpose, even if a renewal
    // lands later: the work of this term has stopped and the lease may look expired to others.
    let past_fence = |h: Holding| {
        matches!(h, Holding::Held { fence_at, .. } if Instant::now() >= fence_at)
            && !crate::failpoints::seeded(crate::failpoints::RENEW_AFTER_EXPIRY)
    };
    loop {
        // (Copy the state out first: a borrow held across `send_replace` would deadlock the
        // channel.)
        let before = *holding.borrow();
        if past_fence(before) {
            lost(&mut spec, FENCE_PASSED);
        }
        let started = Instant::now();
        let carried = annotations.borrow().clone();
        let attempt = tokio::time::timeout(
            attempt_timeout,
            try_hold(&api, &spec, &carried, &mut observer, started),
        );
        let result = attempt.await;
        let current = *holding.borrow();
        if past_fence(current) {
            lost(&mut spec, FENCE_PASSED);
        } else {
            match result {
                Ok(Ok(true)) => {
                    let fence_at = spec.timing.fence_at(started);
                    holding.send_replace(Holding::Held {
                        fence_at,
                        incarnation: Incarnation::of_identity(&spec.identity),
                    });
                    if !current.is_held() {
                        info!(lease = %spec.name, identity = %spec.identity, "lease acquired");
                    }
                }
                Ok(Ok(false)) => {
                    if current.is_held() {
                        lost(&mut spec, "lease taken by another holder");
                    }
                }
                // A refusal will not pass by itself (RBAC, a bad token): it must be seen.
                Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => {
                    warn!(lease = %spec.name, error = %status.message, "lease renewal refused")
                }
                Ok(Err(e)) => debug!(lease = %spec.name, error = %e, "lease renewal failed"),
                Err(_) => debug!(lease = %spec.name, "lease renewal timed out"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(spec.timing.retry_period) => {}
        }
    }
    let held = holding.borrow().is_held();
    if held {
        match tokio::time::timeout(attempt_timeout, release(&api.leases, &spec)).await {
            Ok(Ok(())) => info!(lease = %spec.name, "lease released"),
            Ok(Err(e)) => warn!(lease = %spec.name, error = %e, "could not release the lease"),
            Err(_) => warn!(lease = %spec.name, "releasing the lease timed out"),
        }
    }
    holding.send_replace(Holding::NotHeld);
}

/// The Lease and the StatefulSet it may belong to.
struct LeaseApis {
    leases: Api<Lease>,
    statefulsets: Api<StatefulSet>,
    /// The StatefulSet was found missing and that was said: once, until it is found again.
    missing_reported: std::sync::atomic::AtomicBool,
}

/// The owner reference to StatefulSet `name`; `None` when it does not exist.
async fn statefulset_owner(
    api: &Api<StatefulSet>,
    name: &str,
) -> Result<Option<OwnerReference>, kube::Error> {
    let Some(statefulset) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let Some(uid) = statefulset.metadata.uid else {
        return Ok(None);
    };
    Ok(Some(OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: name.to_string(),
        uid,
        // Not its controller: no controller manages Leases, and none must adopt them.
        controller: None,
        block_owner_deletion: None,
    }))
}

/// Whether `lease` already names StatefulSet `name` among its owners.
fn owned_by(lease: &Lease, name: &str) -> bool {
    lease
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "StatefulSet" && o.name == name)
}

/// One acquisition or renewal. `Ok(true)` when we hold the lease after it.
async fn try_hold(
    apis: &LeaseApis,
    spec: &LeaseSpecification,
    annotations: &Annotations,
    observer: &mut LeaseObserver,
    now: Instant,
) -> Result<bool, kube::Error> {
    let api = &apis.leases;
    let current = api.get_opt(&spec.name).await?;
    let record = current.as_ref().map(lease_record);
    if let Some(record) = &record {
        observer.observe(&spec.name, record.clone(), now);
    }
    let duration_secs = i32::try_from(spec.timing.duration.as_secs()).unwrap_or(i32::MAX);
    match lease_action(&spec.name, record.as_ref(), &spec.identity, observer, now) {
        LeaseAction::Wait => Ok(false),
        LeaseAction::Create => {
            let owner = match &spec.statefulset {
                Some(name) => match statefulset_owner(&apis.statefulsets, name).await? {
                    Some(owner) => {
                        apis.missing_reported.store(false, Ordering::Relaxed);
                        Some(vec![owner])
                    }
                    None => {
                        // A replica outside its StatefulSet (a wrong --statefulset, or one
                        // deleted): it waits, and says why once.
                        if !apis.missing_reported.swap(true, Ordering::Relaxed) {
                            warn!(lease = %spec.name, statefulset = %name, "StatefulSet not found in the lease's namespace: the lease is created once it exists");
                        }
                        return Ok(false);
                    }
                },
                None => None,
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(spec.name.clone()),
                    labels: Some(spec.labels.clone()),
                    annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                    owner_references: owner,
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(spec.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now_micro()),
                    renew_time: Some(now_micro()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                // Someone created it first: look again next round.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        LeaseAction::Take => {
            let Some(mut lease) = current else {
                return Ok(false);
            };
            let mut lease_spec = lease.spec.take().unwrap_or_default();
            let ours = lease_spec.holder_identity.as_deref() == Some(spec.identity.as_str());
            if !ours {
                lease_spec.acquire_time = Some(now_micro());
                lease_spec.lease_transitions = Some(lease_spec.lease_transitions.unwrap_or(0) + 1);
            }
            lease_spec.holder_identity = Some(spec.identity.clone());
            lease_spec.lease_duration_seconds = Some(duration_secs);
            lease_spec.renew_time = Some(now_micro());
            lease.spec = Some(lease_spec);
            let labels = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(spec.labels.clone());
            if !annotations.is_empty() {
                let carried = lease.metadata.annotations.get_or_insert_with(BTreeMap::new);
                carried.extend(annotations.clone());
            }
            if let Some(name) = &spec.statefulset
                && !owned_by(&lease, name)
                && let Some(owner) = statefulset_owner(&apis.statefulsets, name).await?
            {
                let owners = lease.metadata.owner_references.get_or_insert_with(Vec::new);
                owners.push(owner);
            }
            // The resourceVersion we read makes this conditional: a concurrent writer wins.
            match api
                .replace(&spec.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Gives the lease up so that others need not wait for it to expire.
async fn release(api: &Api<Lease>, spec: &LeaseSpecification) -> Result<(), kube::Error> {
    let Some(lease) = api.get_opt(&spec.name).await? else {
        return Ok(());
    };
    if lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        != Some(spec.identity.as_str())
    {
        return Ok(());
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": lease.metadata.resource_version},
        "spec": {"holderIdentity": null, "renewTime": null},
    });
    api.patch(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}
