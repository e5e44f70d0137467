//! Reading a live fleet and its placement settings through a [`Connection`]: a shardwise
//! fleet (FleetClusters, FleetApps, UnitSlices, and with measured load the shard Leases), or
//! an Argo CD installation (cluster Secrets, Applications, and the sharding settings of its
//! application controller). What a caller gives wins over what the installation says.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use shard_assign::{ShardSet, StrategyConfig, StrategyKind};
use thiserror::Error;

use crate::api::{Connection, FetchError};
use crate::argocd::ArgoCdLoad;
use crate::installation::{self, ControllerPod, Message, Workload};
use crate::planning::{ArgoCdSettings, Current};
use crate::{FleetError, LiveFleet, measured, shardwise, statefulset_replicas};

/// Why a fleet could not be read.
#[derive(Debug, Error)]
pub enum ReadError {
    /// A request to the API server failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// An object could not be turned into a cluster.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// What was read cannot be planned, and the message says what to pass instead.
    #[error("{0}")]
    Unplannable(String),
}

/// What reading a fleet gives besides the caller's own settings.
#[derive(Debug)]
pub struct Read {
    /// The fleet's clusters and where they are now.
    pub fleet: LiveFleet,
    /// Replicas now.
    pub replicas: u32,
    /// Where `replicas` was read (a flag, a StatefulSet's `spec.replicas`, a setting).
    pub replicas_origin: String,
    /// Replicas to plan for, when not `replicas` (Argo CD that does not shard: its pods).
    pub to: Option<u32>,
    /// How the current placement is known.
    pub current: Current,
    /// Argo CD's sharding settings as read (none for shardwise).
    pub argocd: Option<ArgoCdSettings>,
    /// Argo CD's cluster Secrets as read (none for shardwise).
    pub secrets: Vec<Secret>,
    /// The controller's workload as messages name it (`StatefulSet ns/name`), when read.
    pub workload: Option<String>,
    /// Argo CD's controller pods as they shard, when asked and its workload was read; why
    /// they could not be listed, if so.
    pub controller_pods: Option<Result<Vec<ControllerPod>, String>>,
    /// The label selector [`Read::controller_pods`] were listed with: what lists them again.
    pub controller_selector: Option<String>,
}

/// What reading a shardwise fleet takes from its caller.
#[derive(Debug)]
pub struct ShardwiseQuery<'a> {
    /// The fleet's namespace.
    pub namespace: &'a str,
    /// The controller's StatefulSet, whose replicas are the current count.
    pub statefulset: &'a str,
    /// The current replica count, when given: the StatefulSet is then not read.
    pub replicas: Option<u32>,
    /// Weigh each cluster by what its owners measured (the shard Leases' load reports).
    pub measured: bool,
}

/// Reads a shardwise fleet: its clusters, apps and slices, the replica count (given, the
/// StatefulSet's, or the highest shard label + 1), and with `measured` the load its replicas
/// reported.
pub async fn read_shardwise(
    query: &ShardwiseQuery<'_>,
    connection: &Connection,
) -> Result<Read, ReadError> {
    let ShardwiseQuery {
        namespace,
        statefulset,
        ..
    } = *query;
    let clusters = connection.fleet_clusters(namespace).await?;
    let apps = connection.fleet_apps(namespace).await?;
    let slices = connection.unit_slices(namespace).await?;
    let mut fleet = shardwise::fleet(&clusters, &apps, &slices)?;
    if fleet.clusters.is_empty() {
        return Err(ReadError::Unplannable(format!(
            "no clusters in namespace {namespace}: nothing to plan (is --namespace right?)"
        )));
    }
    let (replicas, replicas_origin) = match query.replicas {
        Some(n) => (n, "--replicas".to_string()),
        None => match connection.statefulset(namespace, statefulset).await? {
            Some(sts) => (
                statefulset_replicas(&sts),
                format!("StatefulSet {namespace}/{statefulset} spec.replicas"),
            ),
            None => match fleet.shards_in_use() {
                Some(n) => (
                    n,
                    format!(
                        "the highest shard label + 1 (no StatefulSet {namespace}/{statefulset})"
                    ),
                ),
                None => {
                    return Err(ReadError::Unplannable(format!(
                        "cannot tell the current replica count: there is no StatefulSet {namespace}/{statefulset} (--statefulset) and no cluster has a shard label; pass --replicas N"
                    )));
                }
            },
        },
    };
    if query.measured {
        let leases = connection.shard_leases(namespace, statefulset).await?;
        let mut reports = measured::reports(&leases);
        let live = ShardSet::contiguous(replicas);
        let weighed = measured::weigh(&clusters, &apps, &slices, &reports, &live);
        fleet.notes.append(&mut reports.notes);
        fleet.warnings.append(&mut reports.warnings);
        weighed.apply(&mut fleet);
    }
    Ok(Read {
        fleet,
        replicas,
        replicas_origin,
        to: None,
        current: Current::Recorded,
        argocd: None,
        secrets: Vec::new(),
        workload: None,
        controller_pods: None,
        controller_selector: None,
    })
}

/// What reading Argo CD takes from its caller (`plan`'s flags or the balancer's): each setting
/// given here wins over the installation's.
#[derive(Debug)]
pub struct ArgoCdQuery<'a> {
    /// Argo CD's namespace: its cluster Secrets, application controller and settings.
    pub namespace: &'a str,
    /// The application controller's StatefulSet (or Deployment).
    pub workload: &'a str,
    /// The current replica count, when given.
    pub replicas: Option<u32>,
    /// Argo CD's sharding algorithm (the strategy that reproduces it, and Argo CD's name),
    /// when given.
    pub current_strategy: Option<(StrategyKind, &'static str)>,
    /// Namespaces of Applications besides Argo CD's, when given.
    pub app_namespaces: &'a [String],
    /// What an Application weighs.
    pub load: ArgoCdLoad,
    /// The parameters of the current strategy; its kind is Argo CD's algorithm.
    pub tuning: StrategyConfig,
    /// Read the controller's pods too ([`Read::controller_pods`]; needs `list` on pods).
    pub controller_pods: bool,
}

/// Argo CD's fleet and sharding settings: the query's settings win; what they leave is read
/// from the installation (the controller's StatefulSet, or Deployment, and the ConfigMaps its
/// environment refers to).
pub async fn read_argocd(
    query: &ArgoCdQuery<'_>,
    connection: &Connection,
) -> Result<Read, ReadError> {
    let ArgoCdQuery {
        namespace,
        workload: workload_name,
        ..
    } = *query;
    let all_given = query.replicas.is_some()
        && query.current_strategy.is_some()
        && !query.app_namespaces.is_empty();
    let (statefulset, deployment) = if all_given {
        (None, None)
    } else {
        match connection.statefulset(namespace, workload_name).await? {
            Some(sts) => (Some(sts), None),
            None => (None, connection.deployment(namespace, workload_name).await?),
        }
    };
    let workload = match (&statefulset, &deployment) {
        (Some(sts), _) => sts.spec.as_ref().map(|spec| Workload {
            what: format!("StatefulSet {namespace}/{workload_name}"),
            replicas: Some(spec.replicas.unwrap_or(1)),
            template: &spec.template,
        }),
        (None, Some(deploy)) => deploy.spec.as_ref().map(|spec| Workload {
            what: format!("Deployment {namespace}/{workload_name}"),
            replicas: spec.replicas,
            template: &spec.template,
        }),
        (None, None) => None,
    };
    let mut config_maps = BTreeMap::new();
    if !all_given {
        for name in installation::referenced_config_maps(workload.as_ref()) {
            if let Some(cm) = connection.config_map(namespace, &name).await? {
                config_maps.insert(name, cm);
            }
        }
    }
    let selector = statefulset
        .as_ref()
        .and_then(|s| s.spec.as_ref().map(|s| s.selector.clone()))
        .or_else(|| {
            deployment
                .as_ref()
                .and_then(|d| d.spec.as_ref().map(|s| s.selector.clone()))
        })
        .map(|selector| {
            kube::core::Selector::try_from(selector)
                .map(|s| s.to_string())
                .map_err(|e| {
                    ReadError::Unplannable(format!(
                        "the selector of {workload_name} cannot be read: {e}"
                    ))
                })
        })
        .transpose()?;
    let selector = selector.filter(|_| query.controller_pods);
    // Pods that cannot be read (no `list` on pods) leave the rest of the read as it is.
    let (pods, pods_error) = match &selector {
        Some(selector) => match connection.pods(namespace, selector).await {
            Ok(pods) => (pods, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        },
        None => (Vec::new(), None),
    };
    for name in pods.iter().flat_map(installation::pod_config_maps) {
        if !config_maps.contains_key(&name)
            && let Some(cm) = connection.config_map(namespace, &name).await?
        {
            config_maps.insert(name, cm);
        }
    }
    let sharding =
        installation::sharding(workload.as_ref(), &config_maps).map_err(ReadError::Unplannable)?;
    let controller_pods = match (&selector, &deployment) {
        (None, _) => None,
        (Some(_), _) if pods_error.is_some() => pods_error.map(Err),
        (Some(_), Some(deployment)) if sharding.dynamic => {
            let mapping = connection
                .config_map(namespace, installation::SHARD_CM)
                .await?
                .map(|cm| installation::shard_mapping(&cm))
                .unwrap_or_default();
            let written = installation::replicas_written(&deployment.metadata);
            Some(Ok(pods
                .iter()
                .map(|p| installation::dynamic_pod(p, &mapping, sharding.replicas.value, &written))
                .collect()))
        }
        (Some(_), _) => Some(Ok(pods
            .iter()
            .map(|p| installation::statefulset_pod(p, &config_maps))
            .collect())),
    };

    let (replicas, replicas_origin, unsharded_pods) = match (query.replicas, &workload) {
        (Some(n), _) => (n, "--replicas".to_string(), None),
        (None, Some(_)) => (
            sharding.replicas.value,
            sharding.replicas.origin.clone(),
            sharding.unsharded_pods,
        ),
        (None, None) => {
            return Err(ReadError::Unplannable(format!(
                "cannot tell Argo CD's replica count: there is no StatefulSet or Deployment {namespace}/{workload_name} (--statefulset); pass --replicas N"
            )));
        }
    };
    let (kind, algorithm, algorithm_origin) = match query.current_strategy {
        Some((kind, name)) => (kind, name, "--current-strategy".to_string()),
        None => (
            sharding.algorithm.value.0,
            sharding.algorithm.value.1,
            sharding.algorithm.origin.clone(),
        ),
    };
    let (patterns, namespaces_origin) = if query.app_namespaces.is_empty() {
        (
            sharding.app_namespaces.value.clone(),
            sharding.app_namespaces.origin.clone(),
        )
    } else {
        (
            query.app_namespaces.to_vec(),
            "--app-namespaces".to_string(),
        )
    };
    if let Some(p) = patterns
        .iter()
        .find(|p| installation::unsupported_pattern(p))
    {
        return Err(ReadError::Unplannable(format!(
            "application namespace pattern {p:?} ({namespaces_origin}) uses a regular expression or glob class shardwise does not evaluate; pass --app-namespaces with the namespaces or * patterns"
        )));
    }

    let secrets = connection.cluster_secrets(namespace).await?;
    let apps = applications(connection, namespace, &patterns).await?;
    let (in_cluster_enabled, note) = connection.in_cluster_enabled(namespace).await;
    let mut fleet = crate::argocd::fleet(&secrets, &apps, in_cluster_enabled, query.load)?;
    let replica_notes = if query.replicas.is_some() {
        Vec::new()
    } else {
        sharding.replica_notes
    };
    let mut messages: Vec<Message> = replica_notes.into_iter().chain(sharding.notes).collect();
    messages.extend(note.map(Message::Note));
    put_first(&mut fleet, messages);
    if fleet.clusters.is_empty() {
        return Err(ReadError::Unplannable(format!(
            "no clusters in namespace {namespace}: nothing to plan (is --namespace right?)"
        )));
    }
    let workload = workload.map(|w| w.what);
    let mut shown = vec![namespace.to_string()];
    shown.extend(patterns);
    let settings = ArgoCdSettings {
        algorithm,
        algorithm_origin,
        app_namespaces: shown,
        app_namespaces_origin: format!("{namespace} (the control plane's) and {namespaces_origin}"),
        load: query.load,
    };
    Ok(Read {
        fleet,
        replicas,
        replicas_origin,
        to: unsharded_pods,
        current: Current::Computed(StrategyConfig {
            kind,
            ..query.tuning
        }),
        argocd: Some(settings),
        secrets,
        workload,
        controller_pods,
        controller_selector: selector,
    })
}

/// The Applications Argo CD reconciles: those of its own namespace and of the namespaces
/// `patterns` allow. Literal names are listed one namespace at a time (a Role in each is
/// enough); a `*` pattern needs a list across namespaces, filtered here.
async fn applications(
    connection: &Connection,
    namespace: &str,
    patterns: &[String],
) -> Result<Vec<DynamicObject>, ReadError> {
    if patterns.iter().all(|p| installation::is_literal(p)) {
        let mut listed: BTreeSet<&str> = BTreeSet::from([namespace]);
        listed.extend(patterns.iter().map(String::as_str));
        let mut apps = Vec::new();
        for ns in listed {
            apps.extend(connection.applications(Some(ns)).await?);
        }
        return Ok(apps);
    }
    let mut apps = connection.applications(None).await?;
    apps.retain(|app| {
        installation::namespace_allowed(
            patterns,
            namespace,
            app.metadata.namespace.as_deref().unwrap_or_default(),
        )
    });
    Ok(apps)
}

/// Puts the installation's `messages` before the fleet's own notes and warnings.
fn put_first(fleet: &mut LiveFleet, messages: Vec<Message>) {
    let (mut notes, mut warnings) = (Vec::new(), Vec::new());
    for message in messages {
        match message {
            Message::Note(text) => notes.push(text),
            Message::Warning(text) => warnings.push(text),
        }
    }
    notes.append(&mut fleet.notes);
    warnings.append(&mut fleet.warnings);
    (fleet.notes, fleet.warnings) = (notes, warnings);
}
