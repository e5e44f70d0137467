//! A FleetApp's reconcile: apply its manifests to its destination cluster, prune what it no
//! longer declares, report status; and what changes in FleetPolicies means for apps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use kube_runtime::watcher;
use shardwise_api::{AppHealth, FleetApp, FleetAppStatus, FleetCluster, FleetPolicy, SyncPhase};
use shardwise_runtime::decode::for_each_event;
use shardwise_runtime::lenient::Lenient;
use shardwise_runtime::{Action, ContextOf, ObjectKey, TermOf, key_of};
use thiserror::Error;

use super::clusters::{ClientError, destination_for};
use super::status::{condition, status_patch};
use super::{FleetController, cluster_of};
use crate::destination::{ApplyError, Destination};
use crate::manifest::{Manifest, Mark, cluster_label, parse_manifests, stale};
use crate::tenancy::Admission;

const APP_STATUS_FIELDS: &[&str] = &[
    "syncPhase",
    "message",
    "appliedResources",
    "lastSyncTime",
    "observedGeneration",
    "conditions",
    "health",
    // A Healthy app has no health message: the Progressing one before must go.
    "health.message",
];

/// Follows the FleetPolicies: when one appears, changes or goes, the apps of this shard that
/// name it are synced again under the new rules.
pub(super) async fn follow_policies(
    term: Arc<ContextOf<FleetController>>,
    events: impl futures::Stream<Item = Result<watcher::Event<FleetPolicy>, watcher::Error>>,
) {
    let mut generations: BTreeMap<ObjectKey, Option<i64>> = BTreeMap::new();
    let mut listed: BTreeSet<ObjectKey> = BTreeSet::new();
    let queue_users_of = |policy: &ObjectKey| {
        term.queue_items_where(|app| {
            app.namespace().as_deref() == Some(policy.namespace.as_str())
                && app.spec.policy.as_deref() == Some(policy.name.as_str())
        });
    };
    for_each_event(events, "policies", |event| match event {
        watcher::Event::Apply(policy) | watcher::Event::InitApply(policy) => {
            let key = key_of(&policy);
            listed.insert(key.clone());
            let generation = policy.metadata.generation;
            if generations.insert(key.clone(), generation) != Some(generation) {
                queue_users_of(&key);
            }
        }
        watcher::Event::Delete(policy) => {
            let key = key_of(&policy);
            generations.remove(&key);
            queue_users_of(&key);
        }
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitDone => {
            // Policies deleted while the watch was down are not in the new list.
            generations.retain(|key, _| {
                let kept = listed.contains(key);
                if !kept {
                    queue_users_of(key);
                }
                kept
            });
        }
    })
    .await;
}

/// The app's cluster is not this shard's: report it if it does not exist at all (nobody else
/// would), otherwise leave the app to the cluster's owner.
pub(super) async fn report_missing_cluster(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    app: &FleetApp,
) -> Result<Option<Action>, kube::Error> {
    let cluster_key = &cluster_of(app);
    let clusters: Api<Lenient<FleetCluster>> =
        Api::namespaced_with(term.client().clone(), &cluster_key.namespace, &());
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
    write_status(
        term,
        app,
        Outcome::new(SyncPhase::Failed, Some(message.clone())),
    )
    .await?;
    Ok(Some(controller.invalid()))
}

/// Why an app's manifests cannot be read.
#[derive(Debug, Error)]
enum SourceError {
    #[error("ConfigMap {0:?} not found")]
    ConfigMapMissing(String),
    #[error("ConfigMap {name:?} has no key {key:?}")]
    KeyMissing { name: String, key: String },
    #[error("spec.source must set exactly one of manifests and configMapRef")]
    NotOneSource,
    /// The control plane failed: not the app's fault.
    #[error(transparent)]
    ControlPlane(#[from] kube::Error),
}

/// The app's manifests, inline or from its ConfigMap.
async fn manifests_text(
    term: &TermOf<FleetController>,
    app: &FleetApp,
) -> Result<String, SourceError> {
    let source = &app.spec.source;
    match (&source.manifests, &source.config_map_ref) {
        (Some(text), None) => Ok(text.clone()),
        (None, Some(reference)) => {
            let namespace = app.namespace().unwrap_or_default();
            let api: Api<ConfigMap> = Api::namespaced(term.client().clone(), &namespace);
            let config_map = api
                .get_opt(&reference.name)
                .await?
                .ok_or_else(|| SourceError::ConfigMapMissing(reference.name.clone()))?;
            config_map
                .data
                .as_ref()
                .and_then(|d| d.get(reference.key()))
                .cloned()
                .ok_or_else(|| SourceError::KeyMissing {
                    name: reference.name.clone(),
                    key: reference.key().to_string(),
                })
        }
        _ => Err(SourceError::NotOneSource),
    }
}

/// What an app needs before anything is written to its cluster.
struct Prepared {
    manifests: Vec<Manifest>,
    destination: Arc<Destination>,
    /// The FleetPolicy the app names, if any.
    policy: Option<(String, Arc<FleetPolicy>)>,
}

/// Why an app is not ready to apply.
enum Unprepared {
    /// Its spec, or what it references, is wrong: the message goes to its status.
    Invalid(String),
    /// The control plane failed: not the app's fault.
    ControlPlane(kube::Error),
}

/// Reads the manifests, gets the cluster's client and the app's policy.
async fn prepare(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    app: &FleetApp,
    cluster: &FleetCluster,
) -> Result<Prepared, Unprepared> {
    let cluster_key = &cluster_of(app);
    let text = manifests_text(term, app).await.map_err(|e| match e {
        SourceError::ControlPlane(e) => Unprepared::ControlPlane(e),
        e => Unprepared::Invalid(e.to_string()),
    })?;
    let manifests = parse_manifests(&text).map_err(|e| Unprepared::Invalid(e.to_string()))?;
    // The cluster's probe keeps its client current; apps only build one if there is none yet.
    let destination = match term.state().destination(cluster_key) {
        Some(d) => d,
        None => destination_for(controller, term, cluster_key, cluster)
            .await
            .map_err(|e| match e {
                ClientError::ControlPlane(e) => Unprepared::ControlPlane(e),
                e => Unprepared::Invalid(format!(
                    "FleetCluster {:?} is invalid: {e}",
                    cluster_key.name
                )),
            })?,
    };
    let policy = match &app.spec.policy {
        None => None,
        Some(name) => match term.state().policy(&cluster_key.namespace, name).await {
            Some(policy) => Some((name.clone(), policy)),
            // Synced again when the policy appears (see `follow_policies`).
            None => {
                return Err(Unprepared::Invalid(format!(
                    "FleetPolicy {name:?} does not exist"
                )));
            }
        },
    };
    Ok(Prepared {
        manifests,
        destination,
        policy,
    })
}

/// Applies the app, prunes what it no longer declares, and reports.
pub(super) async fn reconcile(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    app: &FleetApp,
) -> Result<Action, kube::Error> {
    let cluster_key = &cluster_of(app);
    let Some(cluster) = term.unit(cluster_key) else {
        // Not in the cache yet.
        return Ok(Action::Retry);
    };
    let status = app.status.clone().unwrap_or_default();
    if status.sync_phase == Some(SyncPhase::Synced)
        && status.observed_generation != app.metadata.generation
    {
        let message = Some("the manifests changed; applying".into());
        write_status(term, app, Outcome::new(SyncPhase::OutOfSync, message)).await?;
    }
    let failed = |message: String, retry: bool| fail(controller, term, app, message, retry);
    let Prepared {
        manifests,
        destination,
        policy,
    } = match prepare(controller, term, app, &cluster).await {
        Ok(prepared) => prepared,
        Err(Unprepared::ControlPlane(e)) => return Err(e),
        Err(Unprepared::Invalid(message)) => return failed(message, false).await,
    };
    let namespace = &app.spec.destination.namespace;
    let policy = policy.as_ref().map(|(name, p)| (name.as_str(), &p.spec));
    let admission = match Admission::new(&app.name_any(), &cluster_key.name, namespace, policy) {
        Ok(admission) => admission,
        Err(refusal) => return failed(refusal.to_string(), false).await,
    };
    let uid = app.uid().unwrap_or_default();
    let app_name = format!("{}/{}", cluster_key.namespace, app.name_any());
    let cluster = cluster_label(&cluster_key.namespace, &cluster_key.name);
    let mark = Mark {
        app_uid: &uid,
        app: &app_name,
        cluster: &cluster,
    };
    let plan = |adopt_from: Option<String>| {
        let destination = destination.clone();
        let (manifests, admission) = (&manifests, &admission);
        let previous = &status.applied_resources;
        async move {
            destination
                .plan(
                    manifests,
                    namespace,
                    admission,
                    mark,
                    previous,
                    adopt_from.as_deref(),
                )
                .await
        }
    };
    let mut planned = plan(None).await;
    // The object carries the mark of another app: take it over only if that app is gone.
    if let Err(ApplyError::Conflict {
        other, other_uid, ..
    }) = &planned
        && !app_exists(term, other, other_uid).await?
    {
        planned = plan(Some(other_uid.clone())).await;
    }
    let plan = match planned {
        Ok(plan) => plan,
        Err(e) => return failed(e.to_string(), e.is_transient()).await,
    };
    let applied = plan.inventory().to_vec();
    // Synced at this generation, and yet something differs: drift, said before it is repaired.
    let drifted = status.sync_phase == Some(SyncPhase::Synced)
        && status.observed_generation == app.metadata.generation
        && plan.finds_drift();
    if drifted {
        let changes = plan.changes();
        let message = format!("drifted, repairing: {}", summary(&changes));
        write_status(term, app, Outcome::new(SyncPhase::OutOfSync, Some(message))).await?;
    }
    let written = match destination.write(plan).await {
        Ok(written) => written,
        Err(e) => return failed(e.to_string(), e.is_transient()).await,
    };
    let leftovers = stale(&status.applied_resources, &applied);
    if let Err(e) = destination.prune(&leftovers, &uid).await {
        let message = format!("pruning failed: {e}");
        return failed(message, e.is_transient()).await;
    }
    let health = destination.health(&applied, &written, &uid).await;
    let state = term.state();
    state
        .health
        .set(key_of(app), cluster_key.clone(), health.status);
    let synced = Outcome {
        applied: Some(applied),
        health: Some(health),
        ..Outcome::new(SyncPhase::Synced, None)
    };
    write_status(term, app, synced).await?;
    Ok(Action::Done(Some(controller.settings.resync_interval)))
}

/// The first changes, and how many more.
fn summary(changes: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = changes[..changes.len().min(SHOWN)].join("; ");
    if changes.len() > SHOWN {
        text.push_str(&format!(" (and {} more)", changes.len() - SHOWN));
    }
    text
}

/// Whether the FleetApp `namespace/name` with this UID still exists (a deleted app leaves its
/// mark on objects it applied in a cluster it could no longer reach).
async fn app_exists(
    term: &TermOf<FleetController>,
    app: &str,
    uid: &str,
) -> Result<bool, kube::Error> {
    let Some((namespace, name)) = app.split_once('/') else {
        return Ok(false);
    };
    let apps: Api<Lenient<FleetApp>> = Api::namespaced_with(term.client().clone(), namespace, &());
    Ok(apps
        .get_opt(name)
        .await?
        .is_some_and(|a| a.meta().uid.as_deref() == Some(uid)))
}

/// Reports the failure; `retry` when it may pass by itself (an unreachable cluster), so that
/// it is retried with backoff rather than at the next resync.
async fn fail(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    app: &FleetApp,
    message: String,
    retry: bool,
) -> Result<Action, kube::Error> {
    write_status(term, app, Outcome::new(SyncPhase::Failed, Some(message))).await?;
    Ok(if retry {
        Action::Retry
    } else {
        controller.invalid()
    })
}

/// What a reconcile concluded, for the app's status.
struct Outcome {
    phase: SyncPhase,
    message: Option<String>,
    /// The new inventory, after a successful sync only: a failure keeps the previous one,
    /// which later pruning needs.
    applied: Option<Vec<shardwise_api::ResourceRef>>,
    /// The new health, if judged; `None` keeps the previous one.
    health: Option<AppHealth>,
}

impl Outcome {
    /// `phase` with `message`, inventory and health unchanged.
    fn new(phase: SyncPhase, message: Option<String>) -> Self {
        Self {
            phase,
            message,
            applied: None,
            health: None,
        }
    }
}

/// Writes the app's status as `outcome` says, when it differs from what is there.
async fn write_status(
    term: &TermOf<FleetController>,
    app: &FleetApp,
    outcome: Outcome,
) -> Result<(), kube::Error> {
    let Outcome {
        phase,
        message,
        applied,
        health,
    } = outcome;
    let previous = app.status.clone().unwrap_or_default();
    let synced = phase == SyncPhase::Synced;
    let status = FleetAppStatus {
        sync_phase: Some(phase),
        message: message.clone(),
        applied_resources: applied.unwrap_or(previous.applied_resources.clone()),
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
        health: health.or(previous.health.clone()),
    };
    // A resync that changed nothing writes nothing: the control plane's write budget goes to
    // apps that need it. (lastSyncTime is thus the last sync that changed the outcome.)
    if same_outcome(&status, &previous) {
        return Ok(());
    }
    let api: Api<FleetApp> =
        Api::namespaced(term.client().clone(), &app.namespace().unwrap_or_default());
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
        a.observed_generation,
        &a.health,
    ) == (
        b.sync_phase,
        &b.message,
        &b.applied_resources,
        b.observed_generation,
        &b.health,
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
        // Nothing says which shard wrote it: a move alone writes no status.
        let mut generation = status(SyncPhase::Synced, 1);
        generation.observed_generation = Some(2);
        assert!(!same_outcome(&generation, &status(SyncPhase::Synced, 1)));
    }

    #[test]
    fn every_status_field_is_cleared_by_the_patch() {
        let status = FleetAppStatus::default();
        let patch = status_patch(&status, APP_STATUS_FIELDS);
        let object = patch.as_object().unwrap();
        for field in APP_STATUS_FIELDS.iter().filter(|f| !f.contains('.')) {
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
            last_sync_time: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
            observed_generation: Some(1),
            conditions: vec![],
            health: Some(AppHealth {
                status: shardwise_api::Health::Healthy,
                message: None,
            }),
        };
        let value = serde_json::to_value(&full).unwrap();
        for key in value.as_object().unwrap().keys() {
            assert!(
                APP_STATUS_FIELDS.contains(&key.as_str()),
                "{key} missing from APP_STATUS_FIELDS"
            );
        }
        // Healthy after Progressing: the patch clears the message the status no longer has.
        let patch = status_patch(&full, APP_STATUS_FIELDS);
        assert_eq!(
            patch["health"],
            serde_json::json!({"status": "Healthy", "message": null})
        );
    }
}
