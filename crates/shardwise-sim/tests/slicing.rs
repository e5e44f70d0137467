//! Slicing on skewed fleets, 10 -> 9 shards over 100 seeds, slicing off and on side by side:
//! the targets docs/algorithms.md reports for `sticky-balanced` with slices.

use shard_assign::StrategyKind;
use shardwise_sim::{
    AppDistribution, FleetSource, FleetSpec, Report, Simulation, SliceMode, StrategyReport,
};

fn run(clusters: u32, apps: u64, exponent: f64) -> Report {
    let simulation = Simulation {
        fleet: FleetSource::Synthetic(FleetSpec {
            clusters,
            apps,
            distribution: AppDistribution::Zipf { exponent },
        }),
        strategies: vec![
            StrategyKind::BoundedLoad.into(),
            StrategyKind::StickyBalanced.into(),
        ],
        slicing: SliceMode::Both,
        ..Simulation::reference()
    };
    simulation.run(|| {}).expect("the simulation is valid")
}

fn variant(report: &Report, kind: StrategyKind, sliced: bool) -> &StrategyReport {
    report
        .strategies
        .iter()
        .find(|s| s.strategy == kind && s.sliced == sliced)
        .expect("both variants are simulated")
}

/// Sticky-balanced with slices against the same strategy without, and against bounded-load
/// with slices (its moves) in the same run.
fn check(report: &Report, balance: f64, copies: f64) {
    let sticky = variant(report, StrategyKind::StickyBalanced, true);
    let whole = variant(report, StrategyKind::StickyBalanced, false);
    let bounded = variant(report, StrategyKind::BoundedLoad, true);
    let max_over_mean = sticky.balance.max_over_mean.median;
    assert!(max_over_mean <= balance, "{:?}", sticky.balance);
    assert!(
        whole.balance.max_over_mean.median > 1.3,
        "{:?}",
        whole.balance
    );
    assert!(
        sticky.cache_copies.median <= copies,
        "{:?}",
        sticky.cache_copies
    );
    assert_eq!(whole.cache_copies.median, 0.0);
    assert!(
        sticky.moves.apps_excluding_removed.median <= bounded.moves.apps_excluding_removed.median,
        "sticky {:?} vs bounded-load {:?}",
        sticky.moves.apps_excluding_removed,
        bounded.moves.apps_excluding_removed
    );
}

#[test]
fn slices_balance_a_zipf_fleet_of_500_clusters() {
    check(&run(500, 50_000, 1.0), 1.03, 2.0);
}

#[test]
fn slices_balance_a_fleet_where_one_cluster_holds_four_tenths() {
    check(&run(100, 10_000, 1.5), 1.05, 8.0);
}
