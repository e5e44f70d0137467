//! Apps on the owner side: apply their manifests to the destination, prune, report status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use shardwise_api::lenient::Lenient;
use shardwise_api::{FleetApp, FleetAppStatus, FleetCluster, FleetPolicy, SyncPhase};
use shardwise_handoff::plan::ObjectKey;
use tracing::{debug, warn};

use super::clusters::{condition, destination_for};
use super::{Owner, for_each_event, gated, key_of, status_patch};
use crate::destination::{ApplyError, parse_manifests, stale};
use crate::tenancy::Admission;

const APP_STATUS_FIELDS: &[&str] = &[
    "syncPhase",
    "message",
    "appliedResources",
    "shard",
    "lastSyncTime",
    "observedGeneration",
    "conditions",
];

/// Queues apps that are new to this shard or whose spec changed (not our own status writes).
pub(super) async fn watch_events(
    owner: Arc<Owner>,
    events: impl futures::Stream<Item = Result<watcher::Event<FleetApp>, watcher::Error>>,
) {
    let mut generations: BTreeMap<ObjectKey, Option<i64>> = BTreeMap::new();
    let mut listed: BTreeSet<ObjectKey> = BTreeSet::new();
    for_each_event(events, "apps", |event| match event {
        watcher::Event::Apply(app) => queue_if_changed(&owner, &mut generations, &app),
        watcher::Event::InitApply(app) => {
            listed.insert(key_of(&app));
            queue_if_changed(&owner, &mut generations, &app);
        }
        watcher::Event::Delete(app) => {
            let key = key_of(&app);
            generations.remove(&key);
            owner.app_queue.forget(&key);
            owner.recount(cluster_of(&app));
        }
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitDone => {
            // Apps that left while the watch was down are not in the new list: forget them, so
            // that they count as new if they come back.
            generations.retain(|key, _| {
                let kept = listed.contains(key);
                if !kept {
                    owner.app_queue.forget(key);
                }
                kept
            });
            // The cache has caught up with the list: apps a worker missed go round again.
            owner
                .missing_apps
                .requeue_found(|k| owner.app(k).is_some(), &owner.app_queue);
        }
    })
    .await;
}

/// Follows the FleetPolicies: when one appears, changes or goes, the apps of this shard that
/// name it are synced again under the new rules.
pub(super) async fn watch_policies(
    owner: Arc<Owner>,
    events: impl futures::Stream<Item = Result<watcher::Event<FleetPolicy>, watcher::Error>>,
) {
    let mut generations: BTreeMap<ObjectKey, Option<i64>> = BTreeMap::new();
    let mut listed: BTreeSet<ObjectKey> = BTreeSet::new();
    for_each_event(events, "policies", |event| match event {
        watcher::Event::Apply(policy) | watcher::Event::InitApply(policy) => {
            let key = key_of(&policy);
            listed.insert(key.clone());
            let generation = policy.metadata.generation;
            if generations.insert(key.clone(), generation) != Some(generation) {
                owner.queue_users_of(&key);
            }
        }
        watcher::Event::Delete(policy) => {
            let key = key_of(&policy);
            generations.remove(&key);
            owner.queue_users_of(&key);
        }
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitDone => {
            // Policies deleted while the watch was down are not in the new list.
            generations.retain(|key, _| {
                let kept = listed.contains(key);
                if !kept {
                    owner.queue_users_of(key);
                }
                kept
            });
        }
    })
    .await;
}

/// Queues the app unless only its status changed since the last event.
fn queue_if_changed(
    owner: &Owner,
    generations: &mut BTreeMap<ObjectKey, Option<i64>>,
    app: &FleetApp,
) {
    let key = key_of(app);
    let generation = app.metadata.generation;
    match generations.insert(key.clone(), generation) {
        Some(seen) if seen == generation => {}
        seen => {
            if seen.is_none() {
                owner.recount(cluster_of(app));
            }
            owner.app_queue.add(key);
        }
    }
}

fn cluster_of(app: &FleetApp) -> ObjectKey {
    ObjectKey::new(
        app.namespace().unwrap_or_default(),
        app.spec.destination.cluster.clone(),
    )
}

/// What a reconcile of an app ended with.
enum Outcome {
    /// Applied; look again after the resync interval.
    Synced,
    /// Failed in a way that may pass by itself (unreachable cluster): retry with backoff.
    Retry(String),
    /// Failed until the spec (or what it references) changes: look again after the resync
    /// interval.
    Invalid(String),
}

pub(super) async fn worker(owner: Arc<Owner>) {
    while let Some(key) = owner.app_queue.next().await {
        let started = Instant::now();
        let result = run_one(&owner, &key).await;
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(None) => owner.metrics.reconciled("app", "skipped", seconds),
            Ok(Some(Outcome::Synced)) => {
                owner.metrics.reconciled("app", "success", seconds);
                owner.app_queue.succeeded(&key);
                owner
                    .app_queue
                    .add_after(key.clone(), owner.config.resync_interval);
            }
            Ok(Some(Outcome::Invalid(message))) => {
                owner.metrics.reconciled("app", "error", seconds);
                debug!(app = %key, %message, "app is invalid");
                owner
                    .app_queue
                    .add_after(key.clone(), owner.config.resync_interval);
            }
            Ok(Some(Outcome::Retry(message))) => {
                owner.metrics.reconciled("app", "error", seconds);
                let delay = owner.app_queue.add_after_failure(key.clone());
                debug!(app = %key, %message, retry_in = ?delay, "app sync failed");
            }
            Err(e) => {
                owner.metrics.reconciled("app", "error", seconds);
                let delay = owner.app_queue.add_after_failure(key.clone());
                warn!(app = %key, error = %e, retry_in = ?delay, "app reconcile failed");
            }
        }
        owner.app_queue.done(&key);
    }
}

/// One reconcile: `Ok(None)` when it was not this shard's to do.
async fn run_one(owner: &Arc<Owner>, key: &ObjectKey) -> Result<Option<Outcome>, kube::Error> {
    let Some(app) = owner.missing_apps.lookup(key, |k| owner.app(k)) else {
        return Ok(None);
    };
    let cluster_key = cluster_of(&app);
    let outcome = gated(
        owner,
        &cluster_key,
        "app",
        key,
        sync(owner, &app, &cluster_key),
    )
    .await;
    match outcome {
        Some(Ok(result)) => result.map(Some),
        Some(Err(_)) => Ok(None),
        None if owner.is_known(&cluster_key) => Ok(None),
        None => missing_cluster(owner, &app, &cluster_key).await,
    }
}

/// The app's cluster is not this shard's: report it if it does not exist at all (nobody else
/// would), otherwise leave the app to the cluster's owner.
async fn missing_cluster(
    owner: &Arc<Owner>,
    app: &FleetApp,
    cluster_key: &ObjectKey,
) -> Result<Option<Outcome>, kube::Error> {
    let clusters: Api<Lenient<FleetCluster>> =
        Api::namespaced(owner.client.clone(), &cluster_key.namespace);
    let message = match clusters
        .get_opt(&cluster_key.name)
        .await?
        .map(Lenient::decoded)
    {
        Some(Ok(_)) => return Ok(None),
        Some(Err(bad)) => format!(
            "FleetCluster {:?} is invalid: it cannot be read: {}",
            cluster_key.name, bad.reason
        ),
        None => format!(
            "FleetCluster {:?} does not exist in namespace {:?}",
            cluster_key.name, cluster_key.namespace
        ),
    };
    write_status(owner, app, SyncPhase::Failed, Some(message.clone()), None).await?;
    Ok(Some(Outcome::Invalid(message)))
}

async fn manifests_text(
    owner: &Arc<Owner>,
    app: &FleetApp,
) -> Result<Result<String, String>, kube::Error> {
    let source = &app.spec.source;
    Ok(match (&source.manifests, &source.config_map_ref) {
        (Some(text), None) => Ok(text.clone()),
        (None, Some(reference)) => {
            let namespace = app.namespace().unwrap_or_default();
            let api: Api<ConfigMap> = Api::namespaced(owner.client.clone(), &namespace);
            match api.get_opt(&reference.name).await? {
                None => Err(format!("ConfigMap {:?} not found", reference.name)),
                Some(cm) => cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(reference.key()))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "ConfigMap {:?} has no key {:?}",
                            reference.name,
                            reference.key()
                        )
                    }),
            }
        }
        _ => Err("spec.source must set exactly one of manifests and configMapRef".to_string()),
    })
}

async fn sync(
    owner: &Arc<Owner>,
    app: &Arc<FleetApp>,
    cluster_key: &ObjectKey,
) -> Result<Outcome, kube::Error> {
    let Some(cluster) = owner.cluster(cluster_key) else {
        return Ok(Outcome::Retry("cluster not in cache yet".into()));
    };
    let status = app.status.clone().unwrap_or_default();
    let generation = app.metadata.generation;
    if status.sync_phase == Some(SyncPhase::Synced) && status.observed_generation != generation {
        write_status(
            owner,
            app,
            SyncPhase::OutOfSync,
            Some("the manifests changed; applying".into()),
            None,
        )
        .await?;
    }
    let text = match manifests_text(owner, app).await? {
        Ok(text) => text,
        Err(message) => return fail(owner, app, message, false).await,
    };
    let manifests = match parse_manifests(&text) {
        Ok(m) => m,
        Err(e) => return fail(owner, app, e.to_string(), false).await,
    };
    // The cluster's probe keeps its client current; apps only build one if there is none yet.
    let destination = match owner.destination(cluster_key) {
        Some(d) => d,
        None => match destination_for(owner, cluster_key, &cluster).await? {
            Ok(d) => d,
            Err(message) => {
                let message = format!("FleetCluster {:?} is invalid: {message}", cluster_key.name);
                return fail(owner, app, message, false).await;
            }
        },
    };
    let policy = match &app.spec.policy {
        None => None,
        Some(name) => match owner.policy(&cluster_key.namespace, name).await {
            Some(policy) => Some((name.as_str(), policy)),
            None => {
                // Synced again when the policy appears (see `watch_policies`).
                let message = format!("FleetPolicy {name:?} does not exist");
                return fail(owner, app, message, false).await;
            }
        },
    };
    let namespace = &app.spec.destination.namespace;
    let admission = match Admission::new(
        &app.name_any(),
        &cluster_key.name,
        namespace,
        policy.as_ref().map(|(name, p)| (*name, &p.spec)),
    ) {
        Ok(admission) => admission,
        Err(refusal) => return fail(owner, app, refusal.to_string(), false).await,
    };
    let uid = app.uid().unwrap_or_default();
    let app_name = format!("{}/{}", cluster_key.namespace, app.name_any());
    let apply = |adopt_from: Option<String>| {
        let destination = destination.clone();
        let (manifests, admission) = (&manifests, &admission);
        let (uid, app_name, previous) = (&uid, &app_name, &status.applied_resources);
        async move {
            destination
                .apply_all(
                    manifests,
                    namespace,
                    admission,
                    (uid, app_name),
                    previous,
                    adopt_from.as_deref(),
                )
                .await
        }
    };
    let mut result = apply(None).await;
    // The object carries the mark of another app: take it over only if that app is gone.
    if let Err(ApplyError::Conflict {
        other, other_uid, ..
    }) = &result
        && !app_exists(owner, other, other_uid).await?
    {
        result = apply(Some(other_uid.clone())).await;
    }
    let applied = match result {
        Ok(inventory) => inventory,
        Err(e) => return fail(owner, app, e.to_string(), e.is_transient()).await,
    };
    let leftovers = stale(&status.applied_resources, &applied);
    if let Err(e) = destination.prune(&leftovers, &uid).await {
        let message = format!("pruning failed: {e}");
        return fail(owner, app, message, e.is_transient()).await;
    }
    write_status(owner, app, SyncPhase::Synced, None, Some(applied)).await?;
    Ok(Outcome::Synced)
}

/// Whether the FleetApp `namespace/name` with this UID still exists (a deleted app leaves its
/// mark on objects it applied in a cluster it could no longer reach).
async fn app_exists(owner: &Arc<Owner>, app: &str, uid: &str) -> Result<bool, kube::Error> {
    let Some((namespace, name)) = app.split_once('/') else {
        return Ok(false);
    };
    let apps: Api<Lenient<FleetApp>> = Api::namespaced(owner.client.clone(), namespace);
    Ok(apps
        .get_opt(name)
        .await?
        .is_some_and(|a| a.meta().uid.as_deref() == Some(uid)))
}

async fn fail(
    owner: &Arc<Owner>,
    app: &FleetApp,
    message: String,
    retry: bool,
) -> Result<Outcome, kube::Error> {
    write_status(owner, app, SyncPhase::Failed, Some(message.clone()), None).await?;
    Ok(if retry {
        Outcome::Retry(message)
    } else {
        Outcome::Invalid(message)
    })
}

/// Writes the app's status. The inventory is replaced only after a successful sync: a failure
/// keeps the previous one, which later pruning needs.
async fn write_status(
    owner: &Arc<Owner>,
    app: &FleetApp,
    phase: SyncPhase,
    message: Option<String>,
    applied: Option<Vec<shardwise_api::ResourceRef>>,
) -> Result<(), kube::Error> {
    let previous = app.status.clone().unwrap_or_default();
    let synced = phase == SyncPhase::Synced;
    let status = FleetAppStatus {
        sync_phase: Some(phase),
        message: message.clone(),
        applied_resources: applied.unwrap_or(previous.applied_resources.clone()),
        shard: Some(owner.me.shard),
        last_sync_time: if synced {
            Some(Time(jiff::Timestamp::now()))
        } else {
            previous.last_sync_time.clone()
        },
        observed_generation: app.metadata.generation,
        conditions: vec![condition(
            "Synced",
            synced,
            match phase {
                SyncPhase::Synced => "Synced",
                SyncPhase::OutOfSync => "OutOfSync",
                SyncPhase::Failed => "SyncFailed",
            },
            message.unwrap_or_else(|| "every manifest is applied".into()),
            &previous.conditions,
            app.metadata.generation,
        )],
    };
    // A resync that changed nothing writes nothing: the control plane's write budget goes to
    // apps that need it. (lastSyncTime is thus the last sync that changed the outcome.)
    if same_outcome(&status, &previous) {
        return Ok(());
    }
    let api: Api<FleetApp> =
        Api::namespaced(owner.client.clone(), &app.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "status": status_patch(&status, APP_STATUS_FIELDS) });
    api.patch_status(
        &app.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Equal but for timestamps.
fn same_outcome(a: &FleetAppStatus, b: &FleetAppStatus) -> bool {
    let conditions = |s: &FleetAppStatus| -> Vec<(String, String, String, String)> {
        s.conditions
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                )
            })
            .collect()
    };
    (
        a.sync_phase,
        &a.message,
        &a.applied_resources,
        a.shard,
        a.observed_generation,
    ) == (
        b.sync_phase,
        &b.message,
        &b.applied_resources,
        b.shard,
        b.observed_generation,
    ) && conditions(a) == conditions(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_alone_are_not_a_change() {
        let status = |phase, time: i64| FleetAppStatus {
            sync_phase: Some(phase),
            last_sync_time: Some(Time(jiff::Timestamp::from_second(time).unwrap())),
            shard: Some(1),
            ..Default::default()
        };
        assert!(same_outcome(
            &status(SyncPhase::Synced, 1),
            &status(SyncPhase::Synced, 2)
        ));
        assert!(!same_outcome(
            &status(SyncPhase::Synced, 1),
            &status(SyncPhase::Failed, 1)
        ));
        let mut moved = status(SyncPhase::Synced, 1);
        moved.shard = Some(2);
        assert!(!same_outcome(&moved, &status(SyncPhase::Synced, 1)));
    }

    #[test]
    fn every_status_field_is_cleared_by_the_patch() {
        let status = FleetAppStatus::default();
        let patch = status_patch(&status, APP_STATUS_FIELDS);
        let object = patch.as_object().unwrap();
        for field in APP_STATUS_FIELDS {
            assert!(object.contains_key(*field), "{field}");
        }
        // And the list matches the type: no field of the status is forgotten.
        let full = FleetAppStatus {
            sync_phase: Some(SyncPhase::Synced),
            message: Some("m".into()),
            applied_resources: vec![shardwise_api::ResourceRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: None,
                name: "a".into(),
            }],
            shard: Some(1),
            last_sync_time: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
            observed_generation: Some(1),
            conditions: vec![],
        };
        let value = serde_json::to_value(&full).unwrap();
        for key in value.as_object().unwrap().keys() {
            assert!(
                APP_STATUS_FIELDS.contains(&key.as_str()),
                "{key} missing from APP_STATUS_FIELDS"
            );
        }
    }
}
