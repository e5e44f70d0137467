//! `shardwise plan`: reads a live fleet, plans it with each strategy, prints the plan.

use std::io::Write;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Secret;
use shard_assign::{StrategyConfig, StrategyKind};
use shardwise_plan::LiveFleet;
use shardwise_plan::api::Connection;
use shardwise_plan::argocd::ArgoCdLoad;
use shardwise_plan::coverage;
use shardwise_plan::planning::{self, Current, PlanRequest};
use shardwise_plan::read::{ArgoCdQuery, Read, ShardwiseQuery, read_argocd, read_shardwise};

use crate::cli::{Format, PlanArgs, PlanLoad, Source};
use crate::limits::{self, Usage};
use crate::output;

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
        controller_pods,
        ..
    } = match args.source {
        Source::Shardwise => {
            let query = ShardwiseQuery {
                namespace,
                statefulset: workload_name,
                replicas: args.replicas,
                measured: args.load == PlanLoad::Measured,
            };
            let mut read = read_shardwise(&query, &connection).await?;
            read.to = args.to;
            read
        }
        Source::Argocd => {
            let query = ArgoCdQuery {
                namespace,
                workload: workload_name,
                replicas: args.replicas,
                current_strategy: args.current_strategy,
                app_namespaces: &args.app_namespaces,
                load: argocd_load(args.load)?,
                tuning: args.strategy_args.config(StrategyKind::StickyBalanced),
                controller_pods: true,
            };
            let mut read = read_argocd(&query, &connection).await?;
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
    let mut fleet = fleet;
    match (&current, controller_pods) {
        (Current::Computed(algorithm), Some(Ok(pods))) => {
            let coverage = coverage::coverage(&fleet, algorithm, &pods)?;
            let warnings = unreconciled_warnings(&coverage, &fleet.orphaned);
            fleet.warnings.extend(warnings);
            if !coverage.unknown.is_empty() {
                fleet.notes.push(format!(
                    "the replica count of controller pod(s) {} cannot be told: which clusters no controller reconciles is not shown",
                    coverage.unknown.join(", ")
                ));
            }
        }
        (_, Some(Err(e))) => fleet.notes.push(format!(
            "the controller's pods could not be listed ({e}): which clusters no controller reconciles is not shown"
        )),
        _ => {}
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

/// Clusters named per cause in a warning about clusters no controller reconciles.
const NAMED_PER_CAUSE: usize = 5;

/// One warning per cause of clusters no Ready controller reconciles: their Applications, and
/// the first few clusters by name. The `orphaned` ones (by id) have a warning of their own.
fn unreconciled_warnings(
    coverage: &coverage::Coverage,
    orphaned: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut causes: std::collections::BTreeMap<&str, (u64, Vec<&str>)> = Default::default();
    for c in coverage
        .unreconciled()
        .filter(|c| !orphaned.contains(&c.id))
    {
        let entry = causes
            .entry(c.why.as_deref().unwrap_or_default())
            .or_default();
        entry.0 += c.apps;
        entry.1.push(&c.name);
    }
    causes
        .into_iter()
        .map(|(why, (apps, clusters))| {
            let mut named: Vec<String> = clusters
                .iter()
                .take(NAMED_PER_CAUSE)
                .map(|n| format!("{n:?}"))
                .collect();
            if clusters.len() > NAMED_PER_CAUSE {
                named.push(format!("{} more", clusters.len() - NAMED_PER_CAUSE));
            }
            format!(
                "{apps} Application(s) on {} cluster(s) have no live controller now, whatever their status says ({}): {why}",
                clusters.len(),
                named.join(", ")
            )
        })
        .collect()
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
