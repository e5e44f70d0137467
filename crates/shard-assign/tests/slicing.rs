//! Invariants of slicing, checked on random skewed fleets: every app in exactly one slice, the
//! slices of a cluster tiling its keys, no cut that nothing needs, no move when re-planning an
//! assignment's own output, and no dependence on input order.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use shard_assign::{
    AppKeys, Cluster, ShardSet, SliceConfig, SlicedAssignment, Slicing, StrategyConfig,
    StrategyKind, assign_sliced,
};

/// Clusters (some hot) with random app keys, as random UIDs give.
fn fleet() -> impl Strategy<Value = (Vec<Cluster>, AppKeys)> {
    let cluster = (
        0u64..400,
        prop::bool::weighted(0.15),
        prop::option::weighted(0.1, 0u32..6),
        prop::option::weighted(0.2, 1u32..4),
        any::<u64>(),
    );
    prop::collection::vec(cluster, 1..30).prop_map(|raw| {
        let mut keys = AppKeys::new();
        let mut clusters = Vec::new();
        for (i, (apps, hot, pin, weight, seed)) in raw.into_iter().enumerate() {
            let apps = if hot { apps * 20 } else { apps };
            let id = format!("uid-{i:03}");
            let mut state = seed;
            let mut k: Vec<u64> = (0..apps)
                .map(|_| {
                    // splitmix64: a uniform stream from the seed.
                    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                })
                .collect();
            k.sort_unstable();
            keys.insert(id.clone(), k);
            clusters.push(Cluster {
                name: id.clone(),
                id,
                apps,
                pin,
                weight,
            });
        }
        (clusters, keys)
    })
}

fn strategy() -> impl Strategy<Value = StrategyConfig> {
    prop::sample::select(StrategyKind::every().collect::<Vec<_>>()).prop_map(StrategyConfig::new)
}

fn run(
    config: &StrategyConfig,
    clusters: &[Cluster],
    keys: &AppKeys,
    shards: &ShardSet,
    previous: Option<&SlicedAssignment>,
) -> SlicedAssignment {
    let recorded = previous.map(|p| p.assignment.to_previous());
    let slicing = previous.map_or_else(Slicing::default, |p| p.slicing.clone());
    assign_sliced(
        config,
        &SliceConfig::enabled(),
        clusters,
        keys,
        shards,
        recorded.as_ref(),
        &slicing,
    )
    .expect("valid input")
}

fn shards_by_unit(a: &SlicedAssignment) -> BTreeMap<String, u32> {
    a.assignment
        .placements()
        .iter()
        .map(|(id, p)| (id.clone(), p.shard))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_app_is_in_exactly_one_slice((clusters, keys) in fleet(), config in strategy(), shards in 1u32..10) {
        let result = run(&config, &clusters, &keys, &ShardSet::contiguous(shards), None);
        let placed: u64 = result.assignment.placements().values().map(|p| p.apps).sum();
        let total: u64 = clusters.iter().map(|c| c.apps).sum();
        prop_assert_eq!(placed, total);
        for (cluster, slices) in result.slicing.cut() {
            // The cut tiles the key space: accepted as a slicing of its own.
            prop_assert!(Slicing::default().with(cluster, slices.to_vec()).is_some(), "{cluster}: {slices:?}");
            prop_assert!(clusters.iter().any(|c| c.id == cluster && c.pin.is_none()));
        }
    }

    #[test]
    fn nothing_is_cut_that_fits_a_shard((clusters, keys) in fleet(), config in strategy(), shards in 1u32..10) {
        let total: u64 = clusters.iter().map(Cluster::load).sum();
        let target = total.div_ceil(u64::from(shards)).max(1);
        let result = run(&config, &clusters, &keys, &ShardSet::contiguous(shards), None);
        for (cluster, _) in result.slicing.cut() {
            let load = clusters.iter().find(|c| c.id == cluster).map_or(0, Cluster::load);
            prop_assert!(load > target, "{cluster} ({load}) was cut with a target of {target}");
        }
        if clusters.iter().all(|c| c.load() <= target) {
            prop_assert_eq!(result.slicing, Slicing::default());
        }
    }

    #[test]
    fn replanning_its_own_output_moves_nothing((clusters, keys) in fleet(), shards in 1u32..10) {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let shards = ShardSet::contiguous(shards);
        let first = run(&config, &clusters, &keys, &shards, None);
        let again = run(&config, &clusters, &keys, &shards, Some(&first));
        prop_assert_eq!(&again.slicing, &first.slicing);
        prop_assert_eq!(shards_by_unit(&again), shards_by_unit(&first));
    }

    #[test]
    fn a_cut_keeps_the_lower_half_of_every_slice_in_place((clusters, keys) in fleet(), from in 1u32..10, to in 1u32..10) {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let first = run(&config, &clusters, &keys, &ShardSet::contiguous(from), None);
        let second = run(&config, &clusters, &keys, &ShardSet::contiguous(to), Some(&first));
        for (cluster, before) in &first.units {
            for (range, unit) in before {
                let Some(shard) = first.assignment.shard_of(unit).filter(|&s| s < to) else {
                    continue;
                };
                let (low, _) = range.halves().expect("slices are shallow");
                for (later, later_unit) in second.units.get(cluster).into_iter().flatten() {
                    if later.within(low) && later != range {
                        prop_assert_eq!(second.assignment.shard_of(later_unit), Some(shard), "{} of {}", later, range);
                    }
                }
            }
        }
    }

    #[test]
    fn a_cluster_that_shrinks_folds_up_only_below_the_hysteresis((clusters, keys) in fleet(), shards in 2u32..10) {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let shards = ShardSet::contiguous(shards);
        let first = run(&config, &clusters, &keys, &shards, None);
        // Every cut cluster keeps a quarter of its apps (the lowest keys).
        let mut shrunk_keys = keys.clone();
        let shrunk: Vec<Cluster> = clusters.iter().map(|c| {
            let mut c = c.clone();
            if first.slicing.slices_of(&c.id).len() > 1 {
                let k = shrunk_keys.get_mut(&c.id).expect("keys of every cluster");
                k.truncate(k.len() / 4);
                c.apps = k.len() as u64;
            }
            c
        }).collect();
        let second = run(&config, &shrunk, &shrunk_keys, &shards, Some(&first));
        let total: u64 = shrunk.iter().map(Cluster::load).sum();
        let target = total.div_ceil(shards.len() as u64).max(1);
        for cluster in &shrunk {
            let cut = second.slicing.slices_of(&cluster.id).len() > 1;
            // Folded up at or below 3/4 of the target; cut again only above the target.
            if cluster.load() * 4 <= target * 3 {
                prop_assert!(!cut, "{} ({}) still cut, target {}", cluster.id, cluster.load(), target);
            }
            if first.slicing.slices_of(&cluster.id).len() == 1 && cut {
                prop_assert!(cluster.load() > target);
            }
        }
    }

    #[test]
    fn input_order_does_not_matter((clusters, keys) in fleet(), config in strategy(), shards in 1u32..10) {
        let shards = ShardSet::contiguous(shards);
        let forward = run(&config, &clusters, &keys, &shards, None);
        let mut reversed = clusters.clone();
        reversed.reverse();
        let backward = run(&config, &reversed, &keys, &shards, None);
        prop_assert_eq!(&forward.slicing, &backward.slicing);
        prop_assert_eq!(shards_by_unit(&forward), shards_by_unit(&backward));
    }
}

/// Found by `replanning_its_own_output_moves_nothing` in CI: 7 shards and one hot cluster (1,000
/// apps, the target being 939) whose cut did not pay from scratch, so the first placement left
/// it whole; re-planning from that placement, with the lower half of a cut held home, found a
/// cut that paid and moved two slices. A first placement is now judged as the pass after it
/// would judge it. The hot cluster's keys are spread as they were: so many in each 32nd of the
/// key space.
#[test]
fn a_first_placement_judges_its_cuts_as_the_next_pass_would() {
    // (apps, pin, weight) of uid-000, uid-001, ...
    let rows: [(u64, Option<u32>, Option<u32>); 21] = [
        (1000, None, None),
        (5, Some(0), None),
        (103, None, None),
        (87, None, None),
        (306, None, None),
        (373, None, None),
        (373, None, None),
        (143, None, None),
        (101, Some(1), None),
        (270, None, Some(3)),
        (123, None, None),
        (255, None, None),
        (379, None, Some(2)),
        (133, None, None),
        (248, None, None),
        (377, None, Some(1)),
        (199, None, None),
        (344, None, Some(1)),
        (305, None, None),
        (213, None, None),
        (316, None, None),
    ];
    let per_32nd: [u64; 32] = [
        30, 35, 37, 34, 32, 30, 34, 35, 28, 35, 34, 35, 24, 30, 29, 33, 30, 34, 24, 28, 31, 38, 29,
        32, 35, 38, 26, 26, 30, 22, 26, 36,
    ];
    let width = u64::MAX / 32;
    let hot: Vec<u64> = per_32nd
        .iter()
        .zip(0u64..)
        .flat_map(|(&n, bucket)| (1..=n).map(move |i| width * bucket + width / (n + 1) * i))
        .collect();
    let mut keys = AppKeys::new();
    let clusters: Vec<Cluster> = rows
        .iter()
        .enumerate()
        .map(|(i, &(apps, pin, weight))| {
            let id = format!("uid-{i:03}");
            let spread = u64::MAX / apps.max(1);
            let own = if i == 0 {
                hot.clone()
            } else {
                (0..apps).map(|k| k * spread).collect()
            };
            keys.insert(id.clone(), own);
            Cluster {
                name: id.clone(),
                id,
                apps,
                pin,
                weight,
            }
        })
        .collect();
    assert_eq!(keys["uid-000"].len(), 1000);
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let shards = ShardSet::contiguous(7);
    let first = run(&config, &clusters, &keys, &shards, None);
    let again = run(&config, &clusters, &keys, &shards, Some(&first));
    assert_eq!(again.slicing, first.slicing);
    assert_eq!(shards_by_unit(&again), shards_by_unit(&first));
    let third = run(&config, &clusters, &keys, &shards, Some(&again));
    assert_eq!(shards_by_unit(&third), shards_by_unit(&again));
}
