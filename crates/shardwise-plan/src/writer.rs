//! One writer of an Argo CD installation's `shard` keys: the Lease [`WRITER_LEASE`] in Argo
//! CD's namespace, whatever installs the writer. The balancer holds it while it runs; `plan
//! --apply` takes it for its writes, or refuses while another holds it, naming the holder.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use shardwise_handoff::lease::LeaseTiming;
use shardwise_runtime::lease::{self, Fence, Holding, LeaseSpecification};
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The Lease of the writer of an Argo CD installation's `shard` keys, in Argo CD's namespace.
pub const WRITER_LEASE: &str = "shardwise-argocd-balancer";

/// Its timing, shardwise's replicas': a successor takes over within 15 s.
pub const WRITER_TIMING: LeaseTiming = LeaseTiming {
    duration: Duration::from_secs(15),
    renew_deadline: Duration::from_secs(10),
    retry_period: Duration::from_secs(2),
};

/// The Lease's specification for a writer named `identity`.
pub fn writer_lease(identity: String) -> LeaseSpecification {
    LeaseSpecification {
        name: WRITER_LEASE.to_string(),
        labels: BTreeMap::from([(
            "app.kubernetes.io/component".to_string(),
            "argocd-balancer".to_string(),
        )]),
        identity,
        timing: WRITER_TIMING,
        // Argo CD's namespace holds no workload of shardwise's to own it.
        statefulset: None,
    }
}

/// Why the keys may not be written now.
#[derive(Debug, Error)]
pub enum WriterError {
    /// Another writer holds the Lease.
    #[error(
        "{holder} holds Lease {namespace}/{WRITER_LEASE}: the Argo CD balancer writes the keys while it runs; stop it (scale its Deployment to 0) and try again, or leave the keys to it"
    )]
    Held {
        /// Argo CD's namespace.
        namespace: String,
        /// Who holds it.
        holder: String,
    },
    /// The Lease could not be read or taken.
    #[error("cannot take Lease {namespace}/{WRITER_LEASE}: {reason}")]
    NotTaken {
        /// Argo CD's namespace.
        namespace: String,
        /// What went wrong.
        reason: String,
    },
}

/// The Lease, taken for one run of writes; [`Writer::release`] gives it back.
pub struct Writer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    fence: Fence,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// Takes the Lease in `namespace` as `identity`, unless another holds it and it has not
    /// expired: then refuses, naming the holder. A Lease left by a writer that is gone is
    /// taken once it has expired.
    pub async fn take(
        client: Client,
        namespace: &str,
        identity: String,
    ) -> Result<Self, WriterError> {
        let not_taken = |reason: String| WriterError::NotTaken {
            namespace: namespace.to_string(),
            reason,
        };
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let current = leases
            .get_opt(WRITER_LEASE)
            .await
            .map_err(|e| not_taken(e.to_string()))?;
        if let Some(holder) = current.as_ref().and_then(live_holder) {
            return Err(WriterError::Held {
                namespace: namespace.to_string(),
                holder,
            });
        }
        let (holding_tx, holding) = watch::channel(Holding::NotHeld);
        let stop = CancellationToken::new();
        let task = tokio::spawn(lease::hold(
            client,
            namespace.to_string(),
            writer_lease(identity),
            holding_tx,
            stop.clone(),
        ));
        // Long enough for a Lease its writer left to expire, and be seen to.
        let wait = 3 * WRITER_TIMING.duration;
        let held = tokio::time::timeout(wait, lease::until_held(holding.clone())).await;
        match held {
            Ok(Ok(incarnation)) => Ok(Self {
                stop,
                task,
                fence: Fence::new(holding, incarnation),
            }),
            _ => {
                stop.cancel();
                let _ = task.await;
                Err(not_taken(format!("not held within {wait:?}")))
            }
        }
    }

    /// Whether a write may go now: the Lease is still held, its fence ahead.
    pub fn may_write(&self) -> Result<(), String> {
        self.fence
            .check()
            .map_err(|_| format!("Lease {WRITER_LEASE} is lost"))
    }

    /// Gives the Lease back, so that a balancer takes it at once.
    pub async fn release(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The holder of `lease`, if it has one whose term has not expired by this machine's clock.
fn live_holder(lease: &Lease) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?;
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let expires = renewed.0.as_second() + duration;
    (expires > jiff::Timestamp::now().as_second()).then_some(holder)
}
