//! Placements pinned across releases. Replicas of different versions run side by side during a
//! rolling upgrade, and a planner of a new version must not reshuffle the fleet: if one of these
//! changes, placement changed for every user.

use shard_assign::{Cluster, ShardSet, StrategyConfig, StrategyKind, assign};

fn fleet() -> Vec<Cluster> {
    (0..40u64)
        .map(|i| Cluster::new(format!("cluster-{i:02}"), (i * 37) % 100 + 1))
        .collect()
}

fn placement(kind: StrategyKind, shards: &ShardSet) -> String {
    let clusters = fleet();
    let a = assign(&StrategyConfig::new(kind), &clusters, shards, None).expect("valid fleet");
    clusters
        .iter()
        .map(|c| a.shard_of(&c.id).expect("placed").to_string())
        .collect::<Vec<_>>()
        .join("")
}

#[test]
fn placements_of_every_strategy_are_pinned() {
    let shards: ShardSet = [0, 1, 2, 4, 5].into_iter().collect();
    let golden = [
        (
            StrategyKind::LegacyModulo,
            "2105421054450150120121541042541250240150",
        ),
        (
            StrategyKind::RoundRobin,
            "0124501245012450124501245012450124501245",
        ),
        (
            StrategyKind::GreedyMinimum,
            "4202050415151215442151515040202044221504",
        ),
        (
            StrategyKind::WeightedRingHash,
            "2541041405112400515141510014021550420242",
        ),
        (
            StrategyKind::BoundedLoad,
            "1455221154551415451500111054404415501004",
        ),
        (
            StrategyKind::StickyBalanced,
            "4202050415151215442151515040202044221504",
        ),
    ];
    for (kind, expected) in golden {
        assert_eq!(placement(kind, &shards), expected, "{kind}");
    }
}

#[test]
fn legacy_modulo_matches_an_independent_fnv_implementation() {
    // The same computation as the golden string, spelled out independently of the library.
    let live = [0u32, 1, 2, 4, 5];
    let expected: String = fleet()
        .iter()
        .map(|c| {
            let hash = c.id.bytes().fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            live[(hash % 5) as usize].to_string()
        })
        .collect();
    assert_eq!(
        placement(StrategyKind::LegacyModulo, &live.into_iter().collect()),
        expected
    );
}

#[test]
fn sticky_balanced_with_a_previous_assignment_is_pinned() {
    let clusters = fleet();
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let before = assign(&config, &clusters, &ShardSet::contiguous(6), None).expect("valid fleet");
    let after_shards: ShardSet = [0, 1, 2, 4, 5].into_iter().collect();
    let after = assign(
        &config,
        &clusters,
        &after_shards,
        Some(&before.to_previous()),
    )
    .expect("valid fleet");
    let placed: String = clusters
        .iter()
        .map(|c| after.shard_of(&c.id).expect("placed").to_string())
        .collect();
    assert_eq!(placed, "1222451414022425501401454120212050425001");
}
