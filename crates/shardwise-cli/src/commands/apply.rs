//! `shardwise plan --source argocd --apply`: pins every cluster Argo CD shards where a strategy
//! puts it, by the `shard` key of its cluster Secret, or (`--unpin`) removes those keys. The
//! diff comes first; only `--yes` writes, each Secret on condition of the resourceVersion read.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Result, anyhow, bail};
use shard_assign::{Assignment, ShardId};

use super::plan::{self, Gathered, strategies};
use crate::cli::{Format, PlanArgs, Source};
use crate::limits::Usage;
use shardwise_plan::LiveFleet;
use shardwise_plan::api::write_pins;
use shardwise_plan::argocd::{self, PinTarget};
use shardwise_plan::planning::{self, Current, PlanRequest};
use shardwise_plan::writer::Writer;

/// The options of `--apply`, before anything is read.
fn check(args: &PlanArgs) -> Result<(), Usage> {
    if args.source != Source::Argocd {
        return Err(Usage(
            "--apply writes the shard keys of Argo CD's cluster Secrets: it needs --source argocd (shardwise's controller places clusters itself)".into(),
        ));
    }
    if args.format != Format::Table {
        return Err(Usage(
            "--apply prints its diff as text: --format applies to plans only".into(),
        ));
    }
    if args.replicas.is_some() {
        return Err(Usage(
            "--apply reads Argo CD's replica count from the installation, so that the pins match it: drop --replicas".into(),
        ));
    }
    if args.unpin {
        if !args.strategy.is_empty() || args.to.is_some() {
            return Err(Usage(
                "--unpin hands placement back to Argo CD's own algorithm: it takes no --strategy or --to".into(),
            ));
        }
    } else if strategies(args).len() != 1 || args.strategy.is_empty() {
        return Err(Usage(
            "--apply pins the placement of one strategy: pass exactly one --strategy".into(),
        ));
    }
    Ok(())
}

/// One cluster Secret of the diff.
struct Row {
    target: PinTarget,
    /// The pin after the apply (`None`: no `shard` key).
    pin: Option<ShardId>,
    /// Argo CD's shard for the cluster now and after the apply (`None`: unplaced).
    now: Option<ShardId>,
    after: Option<ShardId>,
}

impl Row {
    /// The `shard` key after the apply.
    fn key(&self) -> Option<String> {
        self.pin.map(|p| p.to_string())
    }

    /// A key that reads the same but is spelled otherwise (`"+1"`) is rewritten as well.
    fn changes(&self) -> bool {
        self.target.key != self.key()
    }
}

/// `shardwise plan --apply`: the options, then the fleet read as `plan` reads it, then the diff
/// (and, with `--yes`, the writes).
pub(crate) fn run(args: &PlanArgs) -> Result<()> {
    check(args)?;
    plan::check(args)?;
    let runtime = plan::runtime()?;
    runtime.block_on(async {
        let gathered = plan::read(args).await?;
        apply(args, gathered).await
    })
}

async fn apply(args: &PlanArgs, gathered: Gathered) -> Result<()> {
    // One writer per installation: the balancer's Lease, taken before anything is shown (a
    // refusal prints nothing else) and held until the writes are done, or refused, naming the
    // holder, while a balancer holds it. The writes go on condition of what was read.
    let writer = if args.yes {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
        let identity = format!("shardwise-plan-apply_{host}_{:016x}", rand::random::<u64>());
        let client = gathered.connection.client().clone();
        Some(Writer::take(client, &gathered.request.namespace, identity).await?)
    } else {
        None
    };
    let result = show_and_write(args, gathered, writer.as_ref()).await;
    if let Some(writer) = writer {
        writer.release().await;
    }
    result
}

/// Shows the diff and, with `writer` (`--yes`), writes it under the Lease.
async fn show_and_write(
    args: &PlanArgs,
    gathered: Gathered,
    writer: Option<&Writer>,
) -> Result<()> {
    let Gathered {
        fleet,
        request,
        secrets,
        workload,
        connection,
    } = gathered;
    let Current::Computed(algorithm) = request.current else {
        bail!("--apply needs Argo CD's current algorithm");
    };
    let (targets, left_out) = argocd::pin_targets(&secrets, &fleet);
    let mut out = std::io::stdout().lock();
    let (rows, header, note, now, after) = if args.unpin {
        let pins: BTreeMap<String, Option<ShardId>> =
            targets.iter().map(|t| (t.id.clone(), None)).collect();
        let now = planning::argocd_placement_with(
            &fleet,
            &algorithm,
            request.replicas,
            &BTreeMap::new(),
        )?;
        let after = planning::argocd_placement_with(&fleet, &algorithm, request.replicas, &pins)?;
        let rows = rows(targets, &now, &after, |_| None);
        let header = format!(
            "Remove the shard key of Argo CD's cluster Secrets in {} at {}: Argo CD's {} algorithm then places every cluster over {} replicas",
            request.namespace,
            request.server,
            algorithm_name(&request),
            request.replicas
        );
        (rows, header, None, now, after)
    } else {
        refuse_other_replicas(&request, args.to.is_some(), workload.as_deref())?;
        let config = strategies(args)
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("--apply needs one --strategy"))?;
        let placement = planning::apply_placement(&fleet, &request, &config)?;
        let mut pins = BTreeMap::new();
        for target in &targets {
            let shard = placement.planned.shard_of(&target.id).ok_or_else(|| {
                anyhow!(
                    "{} leaves cluster {:?} unplaced",
                    config.kind,
                    target.cluster
                )
            })?;
            pins.insert(target.id.clone(), Some(shard));
        }
        let after = planning::argocd_placement_with(&fleet, &algorithm, request.to, &pins)?;
        let rows = rows(targets, &placement.now, &after, |id| {
            pins.get(id).copied().flatten()
        });
        let header = format!(
            "Pin Argo CD's clusters in {} at {} where {} puts them at {} replicas (whole clusters: Argo CD cannot cut one)",
            request.namespace, request.server, config.kind, request.to
        );
        let note = in_cluster_note(&fleet, &after, &request);
        (rows, header, note, placement.now, after)
    };
    writeln!(out, "{header}")?;
    write_table(&mut out, &rows)?;
    let changed: Vec<&Row> = rows.iter().filter(|r| r.changes()).collect();
    // Every cluster Argo CD places, the in-cluster one without a Secret too.
    let moving = fleet
        .clusters
        .iter()
        .filter(|c| now.shard_of(&c.id) != after.shard_of(&c.id))
        .count();
    writeln!(
        out,
        "{} Secret(s) to change, {} unchanged; {} cluster(s) move",
        changed.len(),
        rows.len() - changed.len(),
        moving
    )?;
    // What the plan would say about the fleet read: it explains the Secrets left out.
    for line in &fleet.notes {
        writeln!(out, "note: {line}")?;
    }
    for line in fleet.warnings.iter().chain(&left_out) {
        writeln!(out, "warning: {line}")?;
    }
    if let Some(note) = note {
        writeln!(out, "note: {note}")?;
    }
    if changed.is_empty() {
        writeln!(out, "nothing to write")?;
        return Ok(());
    }
    if !args.yes {
        writeln!(
            out,
            "dry run: nothing written; pass --yes to write these {} Secret(s)",
            changed.len()
        )?;
        return Ok(());
    }
    out.flush()?;
    let writes: Vec<(PinTarget, Option<ShardId>)> =
        changed.iter().map(|r| (r.target.clone(), r.pin)).collect();
    let writer = writer.ok_or_else(|| anyhow!("--yes writes under the Lease"))?;
    let written = write_pins(&connection, &request.namespace, &writes, || {
        writer.may_write()
    })
    .await?;
    writeln!(out, "wrote {written} Secret(s)")?;
    Ok(())
}

fn rows(
    targets: Vec<PinTarget>,
    now: &Assignment,
    after: &Assignment,
    pin: impl Fn(&str) -> Option<ShardId>,
) -> Vec<Row> {
    targets
        .into_iter()
        .map(|target| Row {
            pin: pin(&target.id),
            now: now.shard_of(&target.id),
            after: after.shard_of(&target.id),
            target,
        })
        .collect()
}

fn algorithm_name(request: &PlanRequest) -> &'static str {
    request.argocd.as_ref().map_or("", |a| a.algorithm)
}

/// Pins are ordinals of the shards Argo CD runs: written for N shards while it runs M, a pin at
/// or above M sends its cluster to shard 0, and the plan's balance is lost. So the two must
/// agree before anything is written.
fn refuse_other_replicas(
    request: &PlanRequest,
    to_given: bool,
    workload: Option<&str>,
) -> Result<(), Usage> {
    if request.replicas == request.to {
        return Ok(());
    }
    let (m, n) = (request.replicas, request.to);
    let asked = if to_given {
        format!("--to is {n}")
    } else {
        format!("the plan is for its {n} pods")
    };
    // Under dynamic cluster distribution the Deployment's replicas are the shard count.
    let scale = match workload {
        Some(w) if w.starts_with("Deployment ") => format!("set the replicas of {w} to {n}"),
        Some(w) => format!("set ARGOCD_CONTROLLER_REPLICAS and the replicas of {w} to {n}"),
        None => format!("set ARGOCD_CONTROLLER_REPLICAS and the controller's replicas to {n}"),
    };
    Err(Usage(format!(
        "Argo CD runs {m} shard(s) ({}) and {asked}: scale the application controller first ({scale}), then apply; or plan --to {m}",
        request.replicas_origin
    )))
}

/// The in-cluster cluster without a Secret cannot be pinned: the plan keeps it where Argo CD
/// puts it, and says so.
fn in_cluster_note(fleet: &LiveFleet, after: &Assignment, request: &PlanRequest) -> Option<String> {
    let cluster = argocd::implicit_in_cluster(fleet)?;
    let shard = after
        .shard_of(&cluster.id)
        .map_or("none".to_string(), |s| s.to_string());
    Some(format!(
        "cluster {:?} has no Secret, so it cannot be pinned (shardwise creates no Secret): it stays on shard {shard}, where Argo CD's {} algorithm puts it, and the plan balances the other clusters around it",
        cluster.name,
        algorithm_name(request),
    ))
}

fn write_table(out: &mut impl Write, rows: &[Row]) -> Result<()> {
    let shard = |s: Option<ShardId>| s.map_or("none".to_string(), |s| s.to_string());
    let key = |k: &Option<String>| k.as_ref().map_or("none".to_string(), |k| format!("{k:?}"));
    let table: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.target.secret.clone(),
                r.target.cluster.clone(),
                key(&r.target.key),
                key(&r.key()),
                format!("{} -> {}", shard(r.now), shard(r.after)),
                if r.changes() {
                    String::new()
                } else {
                    "unchanged".into()
                },
            ]
        })
        .collect();
    let head = [
        "SECRET",
        "CLUSTER",
        "SHARD KEY",
        "-> KEY",
        "ARGO CD SHARD",
        "",
    ];
    let mut widths = head.map(str::len);
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: [&str; 6]| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    writeln!(out, "{}", line(head))?;
    for row in &table {
        writeln!(out, "{}", line(row.each_ref().map(String::as_str)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use shard_assign::{StrategyConfig, StrategyKind};
    use shardwise_plan::FleetSource;

    use super::*;

    fn request(replicas: u32, origin: &str, to: u32) -> PlanRequest {
        PlanRequest {
            source: FleetSource::Argocd,
            server: "https://api".into(),
            namespace: "argocd".into(),
            replicas,
            replicas_origin: origin.into(),
            to,
            current: Current::Computed(StrategyConfig::new(StrategyKind::LegacyModulo)),
            strategies: Vec::new(),
            slicing: shard_assign::SliceSwitch::Off,
            argocd: None,
        }
    }

    #[test]
    fn pins_for_another_replica_count_are_refused_with_what_to_scale() {
        assert!(refuse_other_replicas(&request(3, "env", 3), true, None).is_ok());
        let refused = |request: &PlanRequest, to_given: bool, workload: &str| {
            refuse_other_replicas(request, to_given, Some(workload))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(
                &request(4, "Deployment argocd/c spec.replicas", 2),
                true,
                "Deployment argocd/c"
            ),
            "Argo CD runs 4 shard(s) (Deployment argocd/c spec.replicas) and --to is 2: scale the application controller first (set the replicas of Deployment argocd/c to 2), then apply; or plan --to 4"
        );
        // Argo CD that does not shard: the plan defaults to its pods.
        assert_eq!(
            refused(&request(1, "unset", 3), false, "StatefulSet argocd/c"),
            "Argo CD runs 1 shard(s) (unset) and the plan is for its 3 pods: scale the application controller first (set ARGOCD_CONTROLLER_REPLICAS and the replicas of StatefulSet argocd/c to 3), then apply; or plan --to 1"
        );
    }
}
