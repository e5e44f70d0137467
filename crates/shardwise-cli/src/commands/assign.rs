//! `shardwise assign`.

use std::io::Write;

use anyhow::Result;
use shard_assign::{AppKeys, Cluster, ShardSet, Slicing, StrategyKind, Warning, assign_sliced};
use shardwise_sim::app_keys;

use crate::cli::AssignArgs;
use crate::limits::{self, Usage};
use crate::{inventory, output};

pub(crate) fn run(args: &AssignArgs) -> Result<()> {
    // Options first, then the inventory: every refusal comes before any work.
    if let Some(count) = args.shards {
        limits::at_most("--shards", count, limits::MAX_SHARDS)?;
    }
    for &id in &args.live_shards {
        limits::at_most("--live-shards", id, limits::MAX_SHARDS - 1)?;
    }
    let config = args.strategy_args.config(args.strategy);
    config.validate().map_err(Usage::of)?;
    let clusters = inventory::read(&args.inventory)?;
    let shards: ShardSet = match args.shards {
        Some(count) => ShardSet::contiguous(count),
        None => args.live_shards.iter().copied().collect(),
    };
    let switch = shard_assign::SliceSwitch::from(args.slicing);
    let keys = if switch.slices(args.strategy) {
        app_keys(&clusters)
    } else {
        AppKeys::new()
    };
    let (placed, redirected) = argocd_pin_rule(args.strategy, &clusters, &shards);
    let sliced = assign_sliced(
        &config,
        &switch
            .config_for(args.strategy)
            .with_copy_cost(shardwise_sim::COPY_COST_APPS),
        &placed,
        &keys,
        &shards,
        None,
        &Slicing::default(),
    )?;
    let mut stdout = std::io::stdout().lock();
    output::write_assignment(&mut stdout, &sliced, &clusters, &redirected, args.format)?;
    stdout.flush()?;
    for warning in sliced.assignment.warnings().iter().chain(&redirected) {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// Argo CD's rule for a pin its replicas do not have, kept by the strategies that reproduce its
/// algorithms: Argo CD puts a cluster pinned at or above its replica count on shard 0, so
/// `legacy-modulo` and `round-robin` here put a cluster pinned to a shard that is not live on
/// the lowest live shard (`argocd-consistent-hashing` does so itself). shardwise's own
/// strategies keep shard-assign's rule: the strategy places the cluster until the shard is
/// live. Returns the clusters to place and a warning for each one redirected.
fn argocd_pin_rule(
    kind: StrategyKind,
    clusters: &[Cluster],
    shards: &ShardSet,
) -> (Vec<Cluster>, Vec<Warning>) {
    let lowest = shards.as_slice().first().copied();
    let mut redirected = Vec::new();
    let placed = clusters
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if matches!(kind, StrategyKind::LegacyModulo | StrategyKind::RoundRobin)
                && let (Some(pin), Some(lowest)) = (c.pin, lowest)
                && !shards.contains(pin)
            {
                redirected.push(Warning::PinNotLive {
                    cluster: c.id.clone(),
                    pin,
                    placed_on: lowest,
                });
                c.pin = Some(lowest);
            }
            c
        })
        .collect();
    (placed, redirected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned(id: &str, pin: Option<u32>) -> Cluster {
        Cluster {
            pin,
            ..Cluster::new(id, 1)
        }
    }

    #[test]
    fn argo_cd_strategies_send_pins_that_are_not_live_to_the_lowest_live_shard() {
        let clusters = [
            pinned("a", Some(7)),
            pinned("b", Some(1)),
            pinned("c", None),
        ];
        let shards: ShardSet = [1, 2].into_iter().collect();
        for kind in [StrategyKind::LegacyModulo, StrategyKind::RoundRobin] {
            let (placed, redirected) = argocd_pin_rule(kind, &clusters, &shards);
            let pins: Vec<Option<u32>> = placed.iter().map(|c| c.pin).collect();
            assert_eq!(pins, [Some(1), Some(1), None], "{kind}");
            assert_eq!(
                redirected,
                [Warning::PinNotLive {
                    cluster: "a".into(),
                    pin: 7,
                    placed_on: 1
                }]
            );
        }
        // shardwise's own strategies, and the one that applies the rule itself, are left alone.
        for kind in [
            StrategyKind::GreedyMinimum,
            StrategyKind::StickyBalanced,
            StrategyKind::ArgoCdConsistentHashing,
        ] {
            let (placed, redirected) = argocd_pin_rule(kind, &clusters, &shards);
            assert_eq!(placed, clusters, "{kind}");
            assert!(redirected.is_empty());
        }
    }
}
