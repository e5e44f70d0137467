//! `shardwise plan`: reads a live fleet, plans it with each strategy, prints the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Secret;
use shard_assign::{ShardSet, StrategyConfig, StrategyKind};

use crate::cli::{Format, PlanArgs, PlanLoad, Source, StrategyArgs};
use crate::fleet::api::Connection;
use crate::fleet::argocd::ArgoCdLoad;
use crate::fleet::installation::{self, Message, Workload};
use crate::fleet::{self, LiveFleet};
use crate::limits::{self, Usage};
use crate::output;
use crate::planning::{self, ArgoCdSettings, Current, PlanRequest};

pub(crate) fn run(args: &PlanArgs) -> Result<()> {
    check(args)?;
    let runtime = runtime()?;
    let Gathered { fleet, request, .. } = runtime.block_on(read(args))?;
    let report = planning::build(&fleet, request)?;
    let mut stdout = std::io::stdout().lock();
    output::write_plan(&mut stdout, &report, args.format, args.limit)?;
    stdout.flush()?;
    if args.format == Format::Csv {
        for line in output::plan_messages(&report) {
            eprintln!("{line}");
        }
    }
    Ok(())
}

/// The runtime `plan` and `plan --apply` read the fleet on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The options alone, before anything is read.
pub(crate) fn check(args: &PlanArgs) -> Result<(), Usage> {
    if args.source == Source::Shardwise {
        if args.current_strategy.is_some() {
            return Err(Usage(
                "--current-strategy applies to --source argocd only: shardwise records the current placement in shard labels (of FleetClusters and UnitSlices)".into(),
            ));
        }
        if args.load == PlanLoad::Resources {
            return Err(Usage(
                "--load resources applies to --source argocd only: a FleetCluster's load is its FleetApps times its weight (--load apps) or the reconcile time its replicas measured (--load measured)".into(),
            ));
        }
        if !args.app_namespaces.is_empty() {
            return Err(Usage(
                "--app-namespaces applies to --source argocd only: FleetApps are read from --namespace".into(),
            ));
        }
    }
    if args.source == Source::Argocd {
        argocd_load(args.load)?;
    }
    if let Some(replicas) = args.replicas {
        limits::at_most("--replicas", replicas, limits::MAX_SHARDS)?;
    }
    if let Some(to) = args.to {
        limits::at_most("--to", to, limits::MAX_SHARDS)?;
    }
    for config in strategies(args) {
        config.validate().map_err(Usage::of)?;
    }
    Ok(())
}

/// What counts as load in an Argo CD fleet.
fn argocd_load(load: PlanLoad) -> Result<ArgoCdLoad, Usage> {
    load.argocd().ok_or_else(|| {
        Usage(
            "--load measured applies to --source shardwise only: Argo CD's controller publishes no measured load; use --load apps or --load resources".into(),
        )
    })
}

/// What `read` returns: the fleet, the request to plan it, and for `--apply` the cluster
/// Secrets as read, the controller's workload and the connection to write with.
pub(crate) struct Gathered {
    pub fleet: LiveFleet,
    pub request: PlanRequest,
    /// Argo CD's cluster Secrets (none for shardwise).
    pub secrets: Vec<Secret>,
    /// The controller's workload as messages name it (`StatefulSet ns/name`), when read.
    pub workload: Option<String>,
    pub connection: Connection,
}

/// Reads the fleet and everything the plan needs from the API server.
pub(crate) async fn read(args: &PlanArgs) -> Result<Gathered> {
    let (default_namespace, default_statefulset) = match args.source {
        Source::Shardwise => ("shardwise", "shardwise"),
        Source::Argocd => ("argocd", "argocd-application-controller"),
    };
    let namespace = args.namespace.as_deref().unwrap_or(default_namespace);
    let workload_name = args.statefulset.as_deref().unwrap_or(default_statefulset);
    let connection = Connection::new(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let Read {
        fleet,
        replicas,
        replicas_origin,
        to,
        current,
        argocd,
        secrets,
        workload,
    } = match args.source {
        Source::Shardwise => {
            let clusters = connection.fleet_clusters(namespace).await?;
            let apps = connection.fleet_apps(namespace).await?;
            let slices = connection.unit_slices(namespace).await?;
            let mut fleet = fleet::shardwise::fleet(&clusters, &apps, &slices)?;
            if fleet.clusters.is_empty() {
                bail!(
                    "no clusters in namespace {namespace}: nothing to plan (is --namespace right?)"
                );
            }
            let (replicas, origin) = match args.replicas {
                Some(n) => (n, "--replicas".to_string()),
                None => match connection.statefulset(namespace, workload_name).await? {
                    Some(sts) => (
                        fleet::statefulset_replicas(&sts),
                        format!("StatefulSet {namespace}/{workload_name} spec.replicas"),
                    ),
                    None => match fleet.shards_in_use() {
                        Some(n) => (
                            n,
                            format!(
                                "the highest shard label + 1 (no StatefulSet {namespace}/{workload_name})"
                            ),
                        ),
                        None => bail!(
                            "cannot tell the current replica count: there is no StatefulSet {namespace}/{workload_name} (--statefulset) and no cluster has a shard label; pass --replicas N"
                        ),
                    },
                },
            };
            if args.load == PlanLoad::Measured {
                let leases = connection.shard_leases(namespace, workload_name).await?;
                let mut reports = fleet::measured::reports(&leases);
                let live = ShardSet::contiguous(replicas);
                let weighed = fleet::measured::weigh(&clusters, &apps, &slices, &reports, &live);
                fleet.notes.append(&mut reports.notes);
                fleet.warnings.append(&mut reports.warnings);
                weighed.apply(&mut fleet);
            }
            Read {
                fleet,
                replicas,
                replicas_origin: origin,
                to: args.to,
                current: Current::Recorded,
                argocd: None,
                secrets: Vec::new(),
                workload: None,
            }
        }
        Source::Argocd => {
            let query = ArgoCdQuery {
                replicas: args.replicas,
                current_strategy: args.current_strategy,
                app_namespaces: &args.app_namespaces,
                load: argocd_load(args.load)?,
                strategy_args: &args.strategy_args,
            };
            let mut read = read_argocd(&query, &connection, namespace, workload_name).await?;
            read.to = args.to.or(read.to);
            read
        }
    };
    if replicas == 0 {
        bail!(
            "zero replicas: {replicas_origin} is 0, so nothing reconciles the fleet now; pass --replicas N to plan from N replicas"
        );
    }
    if u64::from(replicas) > limits::MAX_SHARDS {
        bail!(
            "{replicas} replicas ({replicas_origin}) is over the limit of {}; pass --replicas N",
            limits::MAX_SHARDS
        );
    }
    let request = PlanRequest {
        source: args.source.into(),
        server: connection.server().to_string(),
        namespace: namespace.to_string(),
        replicas,
        replicas_origin,
        to: to.unwrap_or(replicas),
        current,
        strategies: strategies(args),
        slicing: args.slicing.into(),
        argocd,
    };
    Ok(Gathered {
        fleet,
        request,
        secrets,
        workload,
        connection,
    })
}

/// What `read` gathers besides the request's fixed parts.
pub(crate) struct Read {
    pub fleet: LiveFleet,
    /// Replicas now, and where that number was read.
    pub replicas: u32,
    pub replicas_origin: String,
    /// Replicas to plan for, when not `replicas` (Argo CD that does not shard: its pods).
    pub to: Option<u32>,
    pub current: Current,
    pub argocd: Option<ArgoCdSettings>,
    pub secrets: Vec<Secret>,
    pub workload: Option<String>,
}

/// What reading Argo CD takes from the command line (`plan`'s flags or `balance`'s): each
/// setting given here wins over the installation's.
pub(crate) struct ArgoCdQuery<'a> {
    pub replicas: Option<u32>,
    pub current_strategy: Option<(StrategyKind, &'static str)>,
    pub app_namespaces: &'a [String],
    pub load: ArgoCdLoad,
    pub strategy_args: &'a StrategyArgs,
}

/// Argo CD's fleet and sharding settings: flags win; what they leave is read from the
/// installation (the controller's StatefulSet, or Deployment, and the ConfigMaps its
/// environment refers to).
pub(crate) async fn read_argocd(
    args: &ArgoCdQuery<'_>,
    connection: &Connection,
    namespace: &str,
    workload_name: &str,
) -> Result<Read> {
    let all_given = args.replicas.is_some()
        && args.current_strategy.is_some()
        && !args.app_namespaces.is_empty();
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
    let sharding =
        installation::sharding(workload.as_ref(), &config_maps).map_err(anyhow::Error::msg)?;

    let (replicas, replicas_origin, unsharded_pods) = match (args.replicas, &workload) {
        (Some(n), _) => (n, "--replicas".to_string(), None),
        (None, Some(_)) => (
            sharding.replicas.value,
            sharding.replicas.origin.clone(),
            sharding.unsharded_pods,
        ),
        (None, None) => bail!(
            "cannot tell Argo CD's replica count: there is no StatefulSet or Deployment {namespace}/{workload_name} (--statefulset); pass --replicas N"
        ),
    };
    let (kind, algorithm, algorithm_origin) = match args.current_strategy {
        Some((kind, name)) => (kind, name, "--current-strategy".to_string()),
        None => (
            sharding.algorithm.value.0,
            sharding.algorithm.value.1,
            sharding.algorithm.origin.clone(),
        ),
    };
    let (patterns, namespaces_origin) = if args.app_namespaces.is_empty() {
        (
            sharding.app_namespaces.value.clone(),
            sharding.app_namespaces.origin.clone(),
        )
    } else {
        (args.app_namespaces.to_vec(), "--app-namespaces".to_string())
    };
    if let Some(p) = patterns
        .iter()
        .find(|p| installation::unsupported_pattern(p))
    {
        bail!(
            "application namespace pattern {p:?} ({namespaces_origin}) uses a regular expression or glob class shardwise does not evaluate; pass --app-namespaces with the namespaces or * patterns"
        );
    }

    let secrets = connection.cluster_secrets(namespace).await?;
    let apps = if patterns.iter().all(|p| installation::is_literal(p)) {
        let mut listed: BTreeSet<&str> = BTreeSet::from([namespace]);
        listed.extend(patterns.iter().map(String::as_str));
        let mut apps = Vec::new();
        for ns in listed {
            apps.extend(connection.applications(Some(ns)).await?);
        }
        apps
    } else {
        let mut apps = connection.applications(None).await?;
        apps.retain(|app| {
            installation::namespace_allowed(
                &patterns,
                namespace,
                app.metadata.namespace.as_deref().unwrap_or_default(),
            )
        });
        apps
    };
    let (in_cluster_enabled, note) = connection.in_cluster_enabled(namespace).await;
    let mut fleet = fleet::argocd::fleet(&secrets, &apps, in_cluster_enabled, args.load)?;
    let replica_notes = if args.replicas.is_some() {
        Vec::new()
    } else {
        sharding.replica_notes
    };
    let (mut notes, mut warnings) = (Vec::new(), Vec::new());
    for message in replica_notes.into_iter().chain(sharding.notes) {
        match message {
            Message::Note(text) => notes.push(text),
            Message::Warning(text) => warnings.push(text),
        }
    }
    notes.extend(note);
    notes.append(&mut fleet.notes);
    warnings.append(&mut fleet.warnings);
    (fleet.notes, fleet.warnings) = (notes, warnings);
    if fleet.clusters.is_empty() {
        bail!("no clusters in namespace {namespace}: nothing to plan (is --namespace right?)");
    }
    let workload = workload.map(|w| w.what);
    let mut shown = vec![namespace.to_string()];
    shown.extend(patterns);
    let settings = ArgoCdSettings {
        algorithm,
        algorithm_origin,
        app_namespaces: shown,
        app_namespaces_origin: format!("{namespace} (the control plane's) and {namespaces_origin}"),
        load: args.load,
    };
    Ok(Read {
        fleet,
        replicas,
        replicas_origin,
        to: unsharded_pods,
        current: Current::Computed(args.strategy_args.config(kind)),
        argocd: Some(settings),
        secrets,
        workload,
    })
}

/// The strategies asked for, once each, in the order given; all of them by default.
pub(crate) fn strategies(args: &PlanArgs) -> Vec<StrategyConfig> {
    let mut kinds: Vec<StrategyKind> = Vec::new();
    let asked = if args.strategy.is_empty() {
        &StrategyKind::ALL[..]
    } else {
        &args.strategy[..]
    };
    for &kind in asked {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
        .into_iter()
        .map(|kind| args.strategy_args.config(kind))
        .collect()
}
