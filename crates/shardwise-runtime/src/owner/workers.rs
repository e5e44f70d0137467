//! The worker pools: take a key, look the object up, reconcile it through the gate (recorded in
//! the audit, abandoned if the term ends), and schedule what comes next.

use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use shardwise_handoff::keys::{UNIT_LABEL, unit_token};
use shardwise_handoff::plan::{ObjectKey, RecordKey};
use tracing::{debug, warn};

use super::Owner;
use crate::gate::UNIT_KEY;
use crate::objects::{item_key, merge_patch};
use crate::queue::WorkQueue;
use crate::sharded::{Action, Sharded};

/// How a reconcile went, as the metrics count it.
enum Ran<E> {
    /// Not this term's to do (the gate refused it, or the object is gone).
    Skipped,
    /// The term ended while it ran.
    Cancelled,
    Finished(Result<Action, E>),
}

/// Runs one reconcile of work on `at` (an item's key in its unit's key space, or
/// [`UNIT_KEY`] for the unit itself) of `unit`, through the gate, recorded in the audit,
/// abandoned if the term ends. `None` when the gate refused it.
async fn gated<C: Sharded, T>(
    owner: &Arc<Owner<C>>,
    unit: &ObjectKey,
    at: u64,
    kind: &'static str,
    key: &ObjectKey,
    work: impl std::future::Future<Output = T>,
) -> Option<Option<T>> {
    let term = &owner.term;
    if term.cancel.is_cancelled() {
        return None;
    }
    let range = term.gate.begin(unit, at)?;
    let interval = term
        .audit
        .start(&unit.to_string(), range, kind, &key.to_string());
    let record = RecordKey {
        unit: unit.clone(),
        range,
    };
    let running = owner.meter().begin(record, Instant::now());
    let result = tokio::select! {
        r = work => Some(r),
        _ = term.cancel.cancelled() => None,
    };
    // The interval ends when dropped: here, or wherever the reconcile is abandoned (a worker
    // aborted at the end of the term drops it mid-way; the meter goes with the term).
    drop(interval);
    owner.meter().end(running, Instant::now());
    let effect = term.gate.end(unit, range);
    owner.apply_effect(unit, range, effect);
    Some(result)
}

/// Counts the reconcile and schedules the key's next one.
fn settle<C: Sharded, L: Ord + Clone>(
    owner: &Owner<C>,
    queue: &WorkQueue<ObjectKey, L>,
    kind: &'static str,
    key: &ObjectKey,
    ran: Ran<C::Error>,
    started: Instant,
) {
    let metrics = &owner.term.metrics;
    let seconds = started.elapsed().as_secs_f64();
    match ran {
        Ran::Skipped => metrics.reconciled(kind, "skipped", seconds),
        Ran::Cancelled => metrics.reconciled(kind, "cancelled", seconds),
        Ran::Finished(Ok(Action::Done(after))) => {
            metrics.reconciled(kind, "success", seconds);
            queue.succeeded(key);
            if let Some(after) = after {
                queue.add_after(key.clone(), after);
            }
        }
        Ran::Finished(Ok(Action::Invalid(after))) => {
            metrics.reconciled(kind, "error", seconds);
            debug!(kind, %key, "invalid; waiting for a change");
            if let Some(after) = after {
                queue.add_after(key.clone(), after);
            }
        }
        Ran::Finished(Ok(Action::Retry)) => {
            metrics.reconciled(kind, "error", seconds);
            let delay = queue.add_after_failure(key.clone());
            debug!(kind, %key, retry_in = ?delay, "failed; retrying");
        }
        Ran::Finished(Err(e)) => {
            metrics.reconciled(kind, "error", seconds);
            let delay = queue.add_after_failure(key.clone());
            warn!(kind, %key, error = %e, retry_in = ?delay, "reconcile failed");
        }
    }
}

/// A worker of units.
pub(super) async fn units<C: Sharded>(owner: Arc<Owner<C>>) {
    let term = &owner.term;
    let kind = C::NOUNS.unit;
    while let Some(key) = term.unit_queue.next().await {
        let started = Instant::now();
        let ran = match term.missing_units.lookup(&key, |k| term.unit(k)) {
            None => Ran::Skipped,
            Some(unit) => {
                let work = owner.controller.reconcile_unit(term, unit);
                match gated(&owner, &key, UNIT_KEY, kind, &key, work).await {
                    None => Ran::Skipped,
                    Some(None) => Ran::Cancelled,
                    Some(Some(result)) => Ran::Finished(result),
                }
            }
        };
        settle(&owner, &term.unit_queue, kind, &key, ran, started);
        term.unit_queue.done(&key);
    }
}

/// Whether `item` carries the token of another unit than its own: its unit changed, and the
/// planner, which reads only items' metadata, cannot see that.
fn stale_token<C: Sharded>(item: &C::Item) -> bool {
    let unit = C::unit_of(item);
    item.meta()
        .labels
        .as_ref()
        .and_then(|labels| labels.get(UNIT_LABEL))
        .is_some_and(|token| *token != unit_token(&unit.namespace, &unit.name))
}

/// Removes the stale token of item `key`: the planner then reads the item in full and writes
/// its unit's token, which its owner watches. Retried with the item's next event if it fails.
async fn clear_token<C: Sharded>(owner: &Owner<C>, key: &ObjectKey) {
    let patch = serde_json::json!({"metadata": {"labels": {UNIT_LABEL: null}}});
    match merge_patch::<C::Item>(&owner.term.client, key, &patch).await {
        Ok(()) => debug!(item = %key, "cleared a stale unit token"),
        Err(e) => warn!(item = %key, error = %e, "cannot clear a stale unit token"),
    }
}

/// A worker of items.
pub(super) async fn items<C: Sharded>(owner: Arc<Owner<C>>) {
    let term = &owner.term;
    let kind = C::NOUNS.item;
    while let Some(key) = term.item_queue.next().await {
        let started = Instant::now();
        let ran = match term.missing_items.lookup(&key, |k| term.item(k)) {
            None => Ran::Skipped,
            Some(item) if stale_token::<C>(&item) => {
                clear_token::<C>(&owner, &key).await;
                Ran::Skipped
            }
            Some(item) => {
                let unit = C::unit_of(&item);
                let at = item_key(item.as_ref());
                let work = owner.controller.reconcile_item(term, item.clone());
                match gated(&owner, &unit, at, kind, &key, work).await {
                    Some(None) => Ran::Cancelled,
                    Some(Some(result)) => Ran::Finished(result),
                    None if term.knows(&unit) || term.cancel.is_cancelled() => Ran::Skipped,
                    // Not a unit of this term at all: the item's unit may not exist.
                    None => match owner.controller.reconcile_orphan(term, item).await {
                        Ok(None) => Ran::Skipped,
                        Ok(Some(action)) => Ran::Finished(Ok(action)),
                        Err(e) => Ran::Finished(Err(e)),
                    },
                }
            }
        };
        settle(&owner, &term.item_queue, kind, &key, ran, started);
        term.item_queue.done(&key);
    }
}
