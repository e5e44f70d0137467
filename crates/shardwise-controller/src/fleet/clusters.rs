//! A FleetCluster's reconcile: probe its API server through its destination client, and
//! report what was found in its status.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use shardwise_api::{ClusterPhase, FleetCluster, FleetClusterStatus};
use shardwise_handoff::drain::OwnerId;
use shardwise_handoff::keys::SLICES_LABEL;
use shardwise_runtime::clients::{RateLimitLayer, TermRole, build_fenced_client, term_user_agent};
use shardwise_runtime::{ObjectKey, TermOf, key_of};
use thiserror::Error;
use tracing::debug;

use super::FleetController;
use super::status::{condition, status_patch};
use crate::credentials::{ClusterConfigError, destination_config};
use crate::destination::{Destination, rejected, rejection};
use crate::live::LiveObjects;
use crate::manifest::cluster_label;

/// Why a cluster has no destination client.
#[derive(Debug, Error)]
pub enum ClientError {
    #[error(transparent)]
    Config(#[from] ClusterConfigError),
    #[error("cannot build a client: {0}")]
    Build(#[source] kube::Error),
    /// The control plane failed (reading the Secret): not the cluster's fault.
    #[error(transparent)]
    ControlPlane(kube::Error),
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
/// anew otherwise.
pub(super) async fn destination_for(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    key: &ObjectKey,
    cluster: &FleetCluster,
) -> Result<Arc<Destination>, ClientError> {
    let secret = match &cluster.spec.credentials.secret_ref {
        Some(reference) => {
            let secrets: Api<Secret> = Api::namespaced(term.client().clone(), &key.namespace);
            secrets
                .get_opt(&reference.name)
                .await
                .map_err(ClientError::ControlPlane)?
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
    let state = term.state();
    if let Some(d) = state.destination(key)
        && d.fingerprint == fingerprint
    {
        return Ok(d);
    }
    let settings = &controller.settings;
    let built = destination_config(&cluster.spec, secret.as_ref(), settings.cluster_timeout)
        .map_err(ClientError::from)
        .and_then(|mut config| {
            // The term in every request's User-Agent: a destination's audit log shows which
            // owner wrote what.
            config
                .headers
                .push((http::header::USER_AGENT, user_agent(&term.owner())));
            let limit = settings.cluster_limit;
            build_fenced_client(
                config,
                term.fence().clone(),
                "destination",
                &RateLimitLayer::new(limit.qps, limit.burst),
                term.metrics(),
            )
            .map_err(ClientError::Build)
        });
    match built {
        Ok(client) => {
            let live = LiveObjects::new(
                client.clone(),
                &cluster_label(&key.namespace, &key.name),
                state.drift_sink(key),
                state.holding(key),
                controller.metrics.cache_gauges(),
            );
            let d = Arc::new(Destination::new(
                client,
                fingerprint,
                live,
                settings.cluster_timeout,
            ));
            state.set_destination(key, Some(d.clone()));
            Ok(d)
        }
        Err(e) => {
            state.set_destination(key, None);
            Err(e)
        }
    }
}

/// `shardwise-controller/<version> (shard <n>; term <incarnation>)`.
pub fn user_agent(me: &OwnerId) -> http::HeaderValue {
    term_user_agent(
        concat!("shardwise-controller/", env!("CARGO_PKG_VERSION")),
        TermRole::Owner(me.shard),
        me.incarnation,
    )
}

/// Probes the cluster's `/version` through its destination client.
async fn probe(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    key: &ObjectKey,
    cluster: &FleetCluster,
) -> Result<Probe, kube::Error> {
    let destination = match destination_for(controller, term, key, cluster).await {
        Ok(d) => d,
        Err(ClientError::ControlPlane(e)) => return Err(e),
        Err(e) => {
            return Ok(Probe {
                phase: ClusterPhase::Invalid,
                version: None,
                message: Some(e.to_string()),
            });
        }
    };
    // `/version` answers anyone; `/api` needs the credentials to be accepted.
    let client = &destination.client;
    let version = tokio::time::timeout(controller.settings.cluster_timeout, async {
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
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Probes the cluster and writes its status.
pub(super) async fn reconcile(
    controller: &FleetController,
    term: &TermOf<FleetController>,
    cluster: &FleetCluster,
) -> Result<(), kube::Error> {
    let key = &key_of(cluster);
    let probe = probe(controller, term, key, cluster).await?;
    // Deleted apps leave the health count here, at the cluster's probe.
    let state = term.state();
    state.health.forget(key, |app| term.item(app).is_some());
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
        let honoured = pin == term.shard();
        let message = if honoured {
            format!("pinned to shard {pin}")
        } else {
            format!(
                "pinned to shard {pin}, which is not live; shard {} owns it until shard {pin} returns",
                term.shard()
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
    // Of a cut cluster this shard holds some slices only, and sees only their apps.
    let cut = cluster.labels().contains_key(SLICES_LABEL);
    let status = FleetClusterStatus {
        phase: Some(probe.phase),
        server_version: probe.version,
        message: probe.message,
        shard: Some(term.shard()),
        app_count: (!cut).then(|| term.items_of(key).len() as u64),
        last_probe_time: Some(Time(jiff::Timestamp::now())),
        observed_generation: generation,
        conditions,
    };
    let api: Api<FleetCluster> = Api::namespaced(term.client().clone(), &key.namespace);
    let patch = serde_json::json!({ "status": status_patch(&status, CLUSTER_STATUS_FIELDS) });
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    debug!(cluster = %key, phase = ?status.phase, "probed");
    Ok(())
}
