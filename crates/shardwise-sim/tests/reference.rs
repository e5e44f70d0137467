//! The simulator on the reference experiment and the churn scenario: the trade-offs between
//! balance and moves that docs/simulator.md reports, and the targets of `sticky-balanced`,
//! checked over 100 seeds.

use shard_assign::StrategyKind;
use shardwise_sim::{Report, Scenario, Simulation, StrategyReport};

fn run(scenario: Scenario, kinds: &[StrategyKind]) -> Report {
    let simulation = Simulation {
        scenario,
        strategies: kinds.iter().map(|&k| k.into()).collect(),
        ..Simulation::reference()
    };
    simulation
        .run(|| {})
        .expect("the reference simulation is valid")
}

fn strategy(report: &Report, kind: StrategyKind) -> &StrategyReport {
    report
        .strategies
        .iter()
        .find(|s| s.strategy == kind)
        .expect("every strategy is simulated")
}

const CHURN: Scenario = Scenario::Churn {
    shards: 10,
    steps: 50,
    arrivals: 5,
    max_lifetime: 10,
};

#[test]
fn the_classic_strategies_trade_balance_for_churn() {
    let report = run(Scenario::REFERENCE, &StrategyKind::ALL);
    assert_eq!(report.strategies.len(), 6);
    assert_eq!((report.fleet.clusters, report.fleet.apps), (100, 10_000));
    let balance = |k| strategy(&report, k).balance.max_over_mean.median;
    let moves = |k| strategy(&report, k).moves.clusters_excluding_removed.median;
    let classic = [
        StrategyKind::LegacyModulo,
        StrategyKind::RoundRobin,
        StrategyKind::GreedyMinimum,
        StrategyKind::WeightedRingHash,
        StrategyKind::BoundedLoad,
    ];
    // Greedy balances best of the five, and moves most of the consistent-hash ones.
    for k in classic {
        assert!(balance(StrategyKind::GreedyMinimum) <= balance(k), "{k}");
    }
    assert!(moves(StrategyKind::GreedyMinimum) > 5.0 * moves(StrategyKind::BoundedLoad));
    assert!(moves(StrategyKind::GreedyMinimum) > moves(StrategyKind::WeightedRingHash));
    // Bounded-load keeps every shard within its cap of 1.25 x mean here (small clusters).
    assert!(
        strategy(&report, StrategyKind::BoundedLoad)
            .balance
            .max_over_mean
            .p95
            <= 1.25
    );
    // The weighted ring moves fewer clusters than greedy but balances worse.
    assert!(balance(StrategyKind::WeightedRingHash) > balance(StrategyKind::GreedyMinimum));
    // Removing one shard of ten forces about a tenth of the clusters to move under every
    // strategy: the difference between "all" and "excluding removed" moves.
    for s in &report.strategies {
        let forced = s.moves.clusters.median - s.moves.clusters_excluding_removed.median;
        assert!((4.0..=20.0).contains(&forced), "{}: {forced}", s.strategy);
    }
}

#[test]
fn sticky_balanced_meets_its_targets_on_the_reference_experiment() {
    let report = run(
        Scenario::REFERENCE,
        &[
            StrategyKind::GreedyMinimum,
            StrategyKind::BoundedLoad,
            StrategyKind::StickyBalanced,
        ],
    );
    let sticky = strategy(&report, StrategyKind::StickyBalanced);
    assert!(sticky.moves.clusters_excluding_removed.median <= 3.0);
    assert!(
        sticky.balance.max_over_mean.median <= 1.03,
        "{:?}",
        sticky.balance
    );
    assert!(
        sticky.balance.max_over_mean.p95 <= 1.04,
        "{:?}",
        sticky.balance
    );
    // Better than bounded-load on balance, and than greedy-minimum on churn, at once.
    let bounded = strategy(&report, StrategyKind::BoundedLoad);
    let greedy = strategy(&report, StrategyKind::GreedyMinimum);
    assert!(sticky.balance.max_over_mean.median < bounded.balance.max_over_mean.median);
    assert!(sticky.balance.max_over_mean.p95 < bounded.balance.max_over_mean.p95);
    assert!(
        sticky.moves.clusters_excluding_removed.median
            < greedy.moves.clusters_excluding_removed.median
    );
    assert!(sticky.moves.apps.median < greedy.moves.apps.median);
}

#[test]
fn sticky_balanced_halves_bounded_loads_churn_at_better_balance_every_step() {
    let report = run(
        CHURN,
        &[StrategyKind::BoundedLoad, StrategyKind::StickyBalanced],
    );
    let sticky = strategy(&report, StrategyKind::StickyBalanced);
    let bounded = strategy(&report, StrategyKind::BoundedLoad);
    assert_eq!(sticky.per_step.len(), 50);
    assert!(
        sticky.moves.apps.median <= 0.5 * bounded.moves.apps.median,
        "sticky {} vs bounded-load {}",
        sticky.moves.apps.median,
        bounded.moves.apps.median
    );
    for (s, b) in sticky.per_step.iter().zip(&bounded.per_step) {
        assert!(
            s.max_over_mean.median <= b.max_over_mean.median,
            "step {}: sticky {} > bounded-load {}",
            s.step,
            s.max_over_mean.median,
            b.max_over_mean.median
        );
        assert!(
            s.max_over_mean.p95 <= b.max_over_mean.p95,
            "step {}",
            s.step
        );
    }
}

#[test]
fn a_seed_gives_the_same_report_every_time() {
    let simulation = Simulation {
        seeds: 5,
        ..Simulation::reference()
    };
    // Untimed, as by default, a report depends on its inputs only.
    let a = simulation.run(|| {}).unwrap();
    let b = simulation.run(|| {}).unwrap();
    assert_eq!(a, b);
    assert!(a.strategies.iter().all(|s| s.assign_ms.is_none()));

    let timed = Simulation {
        timings: true,
        ..simulation
    }
    .run(|| {})
    .unwrap();
    for s in &timed.strategies {
        assert!(
            s.assign_ms.is_some_and(|ms| ms.median > 0.0),
            "{}",
            s.strategy
        );
        assert!(s.runs.iter().all(|r| r.assign_ms.len() == 2));
    }
}
