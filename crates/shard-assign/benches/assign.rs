//! Assignment speed: every strategy on the reference fleet (100 clusters, 10 shards), and on
//! 1,000 and 10,000 clusters carrying 1,000,000 apps over 100 shards. `sticky-balanced` is also
//! timed with a previous assignment (the planner's normal case): 101 shards scaled to 100.
//!
//! Run with `make bench`; `scripts/bench_report.py` turns the estimates into the table of
//! `docs/benchmarks.md`, with the 10x growth ratios and the targets.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use shard_assign::{Cluster, ShardSet, StrategyConfig, StrategyKind, assign};

/// A fleet of `clusters` clusters sharing `apps` apps with a deterministic spread of 1x..3x
/// (a cheap LCG keeps this file free of a random-number dependency).
fn fleet(clusters: u64, apps: u64) -> Vec<Cluster> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let weights: Vec<u64> = (0..clusters)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            100 + (state >> 33) % 200
        })
        .collect();
    let total: u64 = weights.iter().sum();
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let uid = format!("{:08x}-0000-4000-8000-{:012x}", i, (state >> 16) ^ i as u64);
            Cluster::new(uid, apps * w / total)
        })
        .collect()
}

fn strategies(c: &mut Criterion) {
    let cases = [
        ("reference", 100u64, 10_000u64, 10u32),
        ("1k-clusters", 1_000, 1_000_000, 100),
        ("10k-clusters", 10_000, 1_000_000, 100),
    ];
    for (name, clusters, apps, shards) in cases {
        let fleet = fleet(clusters, apps);
        let live = ShardSet::contiguous(shards);
        let mut group = c.benchmark_group(name);
        group
            .sample_size(20)
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(500));
        for kind in StrategyKind::ALL {
            let config = StrategyConfig::new(kind);
            group.bench_with_input(
                BenchmarkId::from_parameter(kind.name()),
                &fleet,
                |b, fleet| b.iter(|| assign(black_box(&config), black_box(fleet), &live, None)),
            );
        }
        // The planner's case: a previous assignment on one more shard, that shard gone.
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let before = ShardSet::contiguous(shards + 1);
        let previous = assign(&config, &fleet, &before, None)
            .expect("the benchmark fleet is valid")
            .to_previous();
        group.bench_with_input(
            BenchmarkId::from_parameter("sticky-balanced-with-previous"),
            &fleet,
            |b, fleet| {
                b.iter(|| assign(black_box(&config), black_box(fleet), &live, Some(&previous)))
            },
        );
        group.finish();
    }
}

criterion_group!(benches, strategies);
criterion_main!(benches);
