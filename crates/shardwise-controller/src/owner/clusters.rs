//! Clusters on the owner side: follow their records (the handoff), probe them, report status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use shardwise_api::{ClusterPhase, FleetCluster, FleetClusterStatus};
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::plan::ObjectKey;
use tracing::{debug, warn};

use super::{Owner, for_each_event, gated, key_of, record_of};
use crate::clients::{RateLimitLayer, build_fenced_client, destination_config};
use crate::destination::{Destination, rejected, rejection};

/// Applies cluster watch events to the owner machines.
pub(super) async fn watch_events(
    owner: Arc<Owner>,
    events: impl futures::Stream<Item = Result<watcher::Event<FleetCluster>, watcher::Error>>,
) {
    let mut generations: BTreeMap<ObjectKey, Option<i64>> = BTreeMap::new();
    let mut listed: Vec<ObjectKey> = Vec::new();
    for_each_event(events, "clusters", |event| match event {
        watcher::Event::Apply(cluster) | watcher::Event::InitApply(cluster) => {
            let key = key_of(&cluster);
            let generation = cluster.metadata.generation;
            let changed = generations.insert(key.clone(), generation) != Some(generation);
            listed.push(key.clone());
            owner.observe(&key, Some(&cluster), changed);
        }
        watcher::Event::Delete(cluster) => {
            let key = key_of(&cluster);
            generations.remove(&key);
            owner.observe(&key, None, false);
            // Still labelled with this shard: deleted, not moved away. Its apps report it now,
            // not at their next resync.
            if record_of(&cluster).owner == Some(owner.me.shard) {
                for app in owner.apps_of(&key) {
                    owner.app_queue.add(key_of(app.as_ref()));
                }
            }
        }
        watcher::Event::Init => listed.clear(),
        watcher::Event::InitDone => {
            // Clusters that left while the watch was down are not in the new list.
            let gone: Vec<ObjectKey> = owner
                .slots()
                .keys()
                .filter(|k| !listed.contains(k))
                .cloned()
                .collect();
            for key in gone {
                generations.remove(&key);
                owner.observe(&key, None, false);
            }
            // The cache has caught up with the list: clusters a worker missed go round again.
            owner
                .missing_clusters
                .requeue_found(|k| owner.cluster(k).is_some(), &owner.cluster_queue);
        }
    })
    .await;
}

pub(super) async fn worker(owner: Arc<Owner>) {
    while let Some(key) = owner.cluster_queue.next().await {
        let started = Instant::now();
        let outcome = gated(&owner, &key, "cluster", &key, reconcile(&owner, &key)).await;
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            None => owner.metrics.reconciled("cluster", "skipped", seconds),
            Some(Err(_)) => owner.metrics.reconciled("cluster", "cancelled", seconds),
            Some(Ok(Ok(()))) => {
                owner.metrics.reconciled("cluster", "success", seconds);
                owner.cluster_queue.succeeded(&key);
                owner
                    .cluster_queue
                    .add_after(key.clone(), owner.config.probe_interval);
            }
            Some(Ok(Err(e))) => {
                owner.metrics.reconciled("cluster", "error", seconds);
                let delay = owner.cluster_queue.add_after_failure(key.clone());
                warn!(cluster = %key, error = %e, retry_in = ?delay, "cluster reconcile failed");
            }
        }
        owner.cluster_queue.done(&key);
    }
}

pub(crate) fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
    generation: Option<i64>,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time only moves when the status does.
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(jiff::Timestamp::now()));
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Every field of the status: a merge patch must clear those that are now empty.
const CLUSTER_STATUS_FIELDS: &[&str] = &[
    "phase",
    "serverVersion",
    "message",
    "shard",
    "appCount",
    "lastProbeTime",
    "observedGeneration",
    "conditions",
];

/// What the owner learned about the cluster.
struct Probe {
    phase: ClusterPhase,
    version: Option<String>,
    message: Option<String>,
}

/// The destination client of a cluster: reused while its spec and Secret are unchanged, built
/// anew otherwise. `Err` carries a message for an Invalid status.
pub(super) async fn destination_for(
    owner: &Arc<Owner>,
    key: &ObjectKey,
    cluster: &FleetCluster,
) -> Result<Result<Arc<Destination>, String>, kube::Error> {
    let secret = match &cluster.spec.credentials.secret_ref {
        Some(reference) => {
            let secrets: Api<Secret> = Api::namespaced(owner.client.clone(), &key.namespace);
            secrets.get_opt(&reference.name).await?
        }
        None => None,
    };
    let fingerprint = format!(
        "{}|{}|{}",
        cluster.spec.server,
        serde_json::to_string(&cluster.spec.credentials).unwrap_or_default(),
        secret
            .as_ref()
            .and_then(|s| s.metadata.resource_version.clone())
            .unwrap_or_default()
    );
    if let Some(d) = owner.destination(key)
        && d.fingerprint == fingerprint
    {
        return Ok(Ok(d));
    }
    let built = destination_config(&cluster.spec, secret.as_ref(), owner.config.cluster_timeout)
        .map_err(|e| e.to_string())
        .and_then(|mut config| {
            // The term in every request's User-Agent: a destination's audit log shows which
            // owner wrote what.
            config
                .headers
                .push((http::header::USER_AGENT, user_agent(&owner.me)));
            build_fenced_client(
                config,
                owner.fence.clone(),
                "destination",
                &RateLimitLayer::new(owner.config.cluster_qps, owner.config.cluster_burst),
                &owner.metrics,
            )
            .map_err(|e| format!("cannot build a client: {e}"))
        });
    match built {
        Ok(client) => {
            let d = Arc::new(Destination::new(client, fingerprint));
            owner.set_destination(key, Some(d.clone()));
            Ok(Ok(d))
        }
        Err(message) => {
            owner.set_destination(key, None);
            Ok(Err(message))
        }
    }
}

/// `shardwise-controller/<version> (shard <n>; term <incarnation>)`.
pub fn user_agent(me: &OwnerId) -> http::HeaderValue {
    let text = format!(
        "shardwise-controller/{} (shard {}; term {:016x})",
        env!("CARGO_PKG_VERSION"),
        me.shard,
        me.incarnation.0
    );
    // Only ASCII digits, letters and punctuation: always a valid header value.
    http::HeaderValue::from_str(&text)
        .unwrap_or(http::HeaderValue::from_static("shardwise-controller"))
}

/// Probes the cluster's `/version` through its destination client.
async fn probe(
    owner: &Arc<Owner>,
    key: &ObjectKey,
    cluster: &FleetCluster,
) -> Result<Probe, kube::Error> {
    let destination = match destination_for(owner, key, cluster).await? {
        Ok(d) => d,
        Err(message) => {
            return Ok(Probe {
                phase: ClusterPhase::Invalid,
                version: None,
                message: Some(message),
            });
        }
    };
    // `/version` answers anyone; `/api` needs the credentials to be accepted.
    let client = &destination.client;
    let version = tokio::time::timeout(owner.config.cluster_timeout, async {
        let info = client.apiserver_version().await?;
        client.list_core_api_versions().await?;
        Ok::<_, kube::Error>(info)
    })
    .await;
    Ok(match version {
        Ok(Ok(info)) => Probe {
            phase: ClusterPhase::Connected,
            version: Some(info.git_version),
            message: None,
        },
        Ok(Err(e)) if rejected(&e).is_some() => Probe {
            phase: ClusterPhase::Unauthorized,
            version: None,
            message: Some(format!(
                "probe of {}: {}",
                cluster.spec.server,
                rejection(rejected(&e).unwrap_or(401))
            )),
        },
        Ok(Err(e)) => Probe {
            phase: ClusterPhase::Unreachable,
            version: None,
            message: Some(format!(
                "probe of {} failed: {}",
                cluster.spec.server,
                describe(&e)
            )),
        },
        Err(_) => Probe {
            phase: ClusterPhase::Unreachable,
            version: None,
            message: Some(format!("probe of {} timed out", cluster.spec.server)),
        },
    })
}

/// An error in words, without anything that could carry credentials.
pub(super) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

async fn reconcile(owner: &Arc<Owner>, key: &ObjectKey) -> Result<(), kube::Error> {
    let Some(cluster) = owner.missing_clusters.lookup(key, |k| owner.cluster(k)) else {
        return Ok(());
    };
    let probe = probe(owner, key, &cluster).await?;
    let previous = cluster.status.clone().unwrap_or_default();
    let generation = cluster.metadata.generation;
    let mut conditions = vec![condition(
        "Ready",
        probe.phase == ClusterPhase::Connected,
        match probe.phase {
            ClusterPhase::Connected => "Connected",
            ClusterPhase::Unreachable => "Unreachable",
            ClusterPhase::Unauthorized => "CredentialsRejected",
            ClusterPhase::Invalid => "InvalidSpec",
        },
        probe
            .message
            .clone()
            .unwrap_or_else(|| "the API server answered".into()),
        &previous.conditions,
        generation,
    )];
    if let Some(pin) = cluster.spec.shard {
        let honoured = pin == owner.me.shard;
        let message = if honoured {
            format!("pinned to shard {pin}")
        } else {
            format!(
                "pinned to shard {pin}, which is not live; shard {} owns it until shard {pin} returns",
                owner.me.shard
            )
        };
        let reason = if honoured {
            "Pinned"
        } else {
            "PinnedShardNotLive"
        };
        conditions.push(condition(
            "PinHonoured",
            honoured,
            reason,
            message,
            &previous.conditions,
            generation,
        ));
    }
    let status = FleetClusterStatus {
        phase: Some(probe.phase),
        server_version: probe.version,
        message: probe.message,
        shard: Some(owner.me.shard),
        app_count: Some(owner.apps_of(key).len() as u64),
        last_probe_time: Some(Time(jiff::Timestamp::now())),
        observed_generation: generation,
        conditions,
    };
    let api: Api<FleetCluster> = Api::namespaced(owner.client.clone(), &key.namespace);
    let patch =
        serde_json::json!({ "status": super::status_patch(&status, CLUSTER_STATUS_FIELDS) });
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    debug!(cluster = %key, phase = ?status.phase, "probed");
    Ok(())
}
