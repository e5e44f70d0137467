//! `shardwise plan`: reads a live fleet, plans it with each strategy, prints the plan.

use std::io::Write;

use anyhow::{Context, Result, bail};
use shard_assign::{StrategyConfig, StrategyKind};

use crate::cli::{Format, PlanArgs, Source};
use crate::fleet::api::Connection;
use crate::fleet::{self, LiveFleet};
use crate::limits::{self, Usage};
use crate::output;
use crate::planning::{self, Current, PlanRequest};

pub(crate) fn run(args: &PlanArgs) -> Result<()> {
    check(args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (fleet, request) = runtime.block_on(read(args))?;
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

/// The options alone, before anything is read.
fn check(args: &PlanArgs) -> Result<(), Usage> {
    if args.source == Source::Shardwise {
        if args.current_strategy.is_some() {
            return Err(Usage(
                "--current-strategy applies to --source argocd only: shardwise records the current placement in shard labels (of FleetClusters and UnitSlices)".into(),
            ));
        }
        if !args.app_namespaces.is_empty() {
            return Err(Usage(
                "--app-namespaces applies to --source argocd only: FleetApps are read from --namespace".into(),
            ));
        }
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

/// Reads the fleet and everything the plan needs from the API server.
async fn read(args: &PlanArgs) -> Result<(LiveFleet, PlanRequest)> {
    let (default_namespace, default_statefulset) = match args.source {
        Source::Shardwise => ("shardwise", "shardwise"),
        Source::Argocd => ("argocd", "argocd-application-controller"),
    };
    let namespace = args.namespace.as_deref().unwrap_or(default_namespace);
    let connection = Connection::new(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let fleet = match args.source {
        Source::Shardwise => {
            let clusters = connection.fleet_clusters(namespace).await?;
            let apps = connection.fleet_apps(namespace).await?;
            let slices = connection.unit_slices(namespace).await?;
            fleet::shardwise::fleet(&clusters, &apps, &slices)?
        }
        Source::Argocd => {
            let secrets = connection.cluster_secrets(namespace).await?;
            let mut apps = Vec::new();
            if args.app_namespaces.iter().any(|ns| ns == "*") {
                apps = connection.applications(None).await?;
            } else if args.app_namespaces.is_empty() {
                apps = connection.applications(Some(namespace)).await?;
            } else {
                for ns in &args.app_namespaces {
                    apps.extend(connection.applications(Some(ns)).await?);
                }
            }
            let (in_cluster_enabled, note) = connection.in_cluster_enabled(namespace).await;
            let mut fleet = fleet::argocd::fleet(&secrets, &apps, in_cluster_enabled)?;
            fleet.notes.extend(note);
            fleet
        }
    };
    if fleet.clusters.is_empty() {
        bail!("no clusters in namespace {namespace}: nothing to plan (is --namespace right?)");
    }

    let (replicas, replicas_origin) = match args.replicas {
        Some(n) => (n, "--replicas".to_string()),
        None => {
            let name = args.statefulset.as_deref().unwrap_or(default_statefulset);
            match connection.statefulset(namespace, name).await? {
                Some(sts) => {
                    let (n, field) = fleet::statefulset_replicas(&sts, args.source);
                    (n, format!("StatefulSet {namespace}/{name} {field}"))
                }
                None => match fleet.shards_in_use() {
                    Some(n) => (
                        n,
                        format!("the highest shard label + 1 (no StatefulSet {namespace}/{name})"),
                    ),
                    None => bail!(
                        "cannot tell the current replica count: there is no StatefulSet {namespace}/{name} (--statefulset) and no cluster has a shard label; pass --replicas N"
                    ),
                },
            }
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
    let current = match args.source {
        Source::Shardwise => Current::Recorded,
        Source::Argocd => Current::Computed(
            args.strategy_args
                .config(args.current_strategy.unwrap_or(StrategyKind::LegacyModulo)),
        ),
    };
    let request = PlanRequest {
        source: args.source,
        server: connection.server().to_string(),
        namespace: namespace.to_string(),
        replicas,
        replicas_origin,
        to: args.to.unwrap_or(replicas),
        current,
        strategies: strategies(args),
        slicing: args.slicing.into(),
    };
    Ok((fleet, request))
}

/// The strategies asked for, once each, in the order given; all of them by default.
fn strategies(args: &PlanArgs) -> Vec<StrategyConfig> {
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
