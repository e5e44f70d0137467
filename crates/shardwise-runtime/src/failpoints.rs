//! Seeded defects: places where a test build can be told to break a promise on purpose, so
//! that the suites prove they catch it (scripts/defects.sh runs the matrix, docs/testing.md
//! has its table). Built on TiKV's failpoints (the `fail` crate), compiled in only with this
//! crate's `failpoints` feature; without it [`seeded`] is `false` and costs nothing.
//!
//! A process (or a test binary) reads `FAILPOINTS` once, as fail-rs spells it:
//! `FAILPOINTS='skip-fence-check=return'` seeds one defect; `name=off` or no variable, none.

/// A worker starts a reconcile without checking the term's fence first.
pub const SKIP_FENCE_CHECK: &str = "skip-fence-check";
/// The fenced client lets a request (or a connection's write) through after the fence.
pub const WRITE_AFTER_FENCE: &str = "write-after-fence";
/// The controller plans no write of an app's objects (so it sees no drift either) and reports
/// the app Synced.
pub const DROP_DESTINATION_WRITE: &str = "drop-destination-write";
/// The gate admits work on a record its owner has acknowledged handing over.
pub const KEEP_WORKING_AFTER_HANDOVER: &str = "keep-working-after-handover";
/// The lease task renews a lease under the same identity after its term's fence passed.
pub const RENEW_AFTER_EXPIRY: &str = "renew-after-expiry";
/// The Argo CD balancer moves clusters without refreshing their Applications.
pub const SKIP_BALANCER_REFRESH: &str = "skip-balancer-refresh";
/// The Argo CD balancer writes a moved cluster's new key at once, without parking the cluster
/// until the controller that has it lets it go.
pub const SKIP_BALANCER_HANDOVER: &str = "skip-balancer-handover";
/// The Argo CD balancer does not watch the controller's workload: a replica change waits for
/// the next pass.
pub const IGNORE_WORKLOAD_CHANGES: &str = "ignore-workload-changes";
/// The Argo CD balancer places clusters on every shard of the count asked for, ignoring the
/// counts the running controller pods read keys with (a key at or above a pod's count).
pub const BALANCER_KEY_ABOVE_POD_COUNT: &str = "balancer-key-above-pod-count";
/// The Argo CD balancer's `--manage-replicas` neither moves a pod's clusters off before the
/// StatefulSet controller replaces it nor waits for it to drop them.
pub const RESTART_UNDRAINED_CONTROLLER: &str = "restart-undrained-controller";
/// Under Argo CD's dynamic cluster distribution, the reader takes every controller pod to read
/// keys with the Deployment's current count, pods started before it was written too.
pub const TRUST_DYNAMIC_COUNT: &str = "trust-dynamic-count";

/// A term's writes name no field manager: the API server then names it after the term's
/// User-Agent, and an object keeps a `managedFields` entry per term that last set some of its
/// fields.
pub const PER_TERM_FIELD_MANAGER: &str = "per-term-field-manager";

/// Whether the defect `name` is seeded in this process.
#[cfg(feature = "failpoints")]
pub fn seeded(name: &str) -> bool {
    static SETUP: std::sync::Once = std::sync::Once::new();
    SETUP.call_once(|| {
        // What `fail::FailScenario::setup` reads, without its process-wide lock (tests of one
        // binary each ask here, in parallel).
        let Ok(points) = std::env::var("FAILPOINTS") else {
            return;
        };
        for point in points.split(';').filter(|p| !p.trim().is_empty()) {
            match point.split_once('=') {
                Some((point, actions)) => match fail::cfg(point.trim(), actions.trim()) {
                    Ok(()) => tracing::warn!(defect = point.trim(), "a defect is seeded"),
                    Err(e) => tracing::error!(defect = point.trim(), error = %e, "FAILPOINTS"),
                },
                None => tracing::error!(point, "FAILPOINTS: expected name=actions"),
            }
        }
    });
    fail::eval(name, |_| ()).is_some()
}

/// Whether the defect `name` is seeded in this process: never, in this build.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn seeded(_name: &str) -> bool {
    false
}
