//! Invariants every strategy must keep, checked on random fleets.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use shard_assign::{
    Assignment, AssignmentDiff, Cluster, Ratio, ShardSet, StrategyConfig, StrategyKind, assign,
};

const MAX_SHARD: u32 = 12;

fn clusters() -> impl Strategy<Value = Vec<Cluster>> {
    let cluster = (
        "[a-f0-9-]{0,6}",
        0u64..500,
        prop::option::weighted(0.15, 0..MAX_SHARD + 2),
        prop::option::weighted(0.2, 1u32..4),
    );
    prop::collection::vec(cluster, 0..60).prop_map(|raw| {
        // Unique ids, as cluster UIDs are.
        let unique: BTreeMap<String, Cluster> = raw
            .into_iter()
            .map(|(id, apps, pin, weight)| {
                let cluster = Cluster {
                    name: format!("name-{id}"),
                    id: id.clone(),
                    apps,
                    pin,
                    weight,
                };
                (id, cluster)
            })
            .collect();
        unique.into_values().collect()
    })
}

fn live_shards() -> impl Strategy<Value = ShardSet> {
    prop::collection::btree_set(0..MAX_SHARD, 1..8).prop_map(|s| s.into_iter().collect())
}

fn ratio(low_thousandths: u64, high_thousandths: u64) -> impl Strategy<Value = Ratio> {
    (low_thousandths..=high_thousandths).prop_map(Ratio::from_thousandths)
}

fn config() -> impl Strategy<Value = StrategyConfig> {
    (
        prop::sample::select(StrategyKind::every().collect::<Vec<_>>()),
        1u32..64,
        ratio(1000, 2000),
        0u32..6,
        ratio(1000, 1200),
    )
        .prop_map(
            |(kind, virtual_nodes, load_factor, max_extra_moves, target_balance)| StrategyConfig {
                kind,
                virtual_nodes,
                load_factor,
                max_extra_moves,
                target_balance,
            },
        )
}

fn max_load(a: &Assignment) -> u64 {
    a.shard_loads().values().map(|l| l.load).max().unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(300)
    })]

    #[test]
    fn every_cluster_gets_exactly_one_live_shard(
        config in config(), clusters in clusters(), shards in live_shards()
    ) {
        let a = assign(&config, &clusters, &shards, None).unwrap();
        prop_assert_eq!(a.placements().len(), clusters.len());
        for c in &clusters {
            let shard = a.shard_of(&c.id).unwrap();
            prop_assert!(shards.contains(shard), "{} placed on {} not in {}", c.id, shard, shards);
        }
        // Per-shard loads add up to the placements, and every live shard is reported.
        prop_assert_eq!(a.live_shards(), shards.clone());
        let clusters_total: u64 = a.shard_loads().values().map(|l| l.clusters).sum();
        let apps_total: u64 = a.shard_loads().values().map(|l| l.apps).sum();
        prop_assert_eq!(clusters_total, clusters.len() as u64);
        prop_assert_eq!(apps_total, clusters.iter().map(|c| c.apps).sum::<u64>());
    }

    #[test]
    fn live_pins_are_honoured_and_dead_pins_warned(
        config in config(), clusters in clusters(), shards in live_shards()
    ) {
        let a = assign(&config, &clusters, &shards, None).unwrap();
        for c in &clusters {
            let placed = a.placements()[&c.id];
            match c.pin {
                Some(pin) if shards.contains(pin) => {
                    prop_assert_eq!(placed.shard, pin);
                    prop_assert!(placed.pinned);
                }
                Some(pin) => {
                    prop_assert!(!placed.pinned);
                    let warned = a.warnings().iter().any(|w| matches!(w,
                        shard_assign::Warning::PinNotLive { cluster, pin: p, placed_on }
                            if cluster == &c.id && *p == pin && *placed_on == placed.shard));
                    prop_assert!(warned, "no warning for {} pinned to {}", c.id, pin);
                }
                None => prop_assert!(!placed.pinned),
            }
        }
    }

    #[test]
    fn input_order_does_not_matter(
        config in config(), clusters in clusters(), shards in live_shards(), seed in any::<u64>()
    ) {
        let a = assign(&config, &clusters, &shards, None).unwrap();
        let mut shuffled = clusters.clone();
        // A deterministic shuffle driven by the seed.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let b = assign(&config, &shuffled, &shards, None).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn bounded_load_respects_its_stated_bound(
        clusters in clusters(), shards in live_shards(), factor in ratio(1000, 2000), vnodes in 1u32..64
    ) {
        let config = StrategyConfig {
            load_factor: factor,
            virtual_nodes: vnodes,
            ..StrategyConfig::new(StrategyKind::BoundedLoad)
        };
        let a = assign(&config, &clusters, &shards, None).unwrap();
        let n = shards.len() as u64;
        let total: u64 = clusters.iter().map(Cluster::load).sum();
        let cap = factor.mul_div_ceil(total, n);
        let largest_unpinned = clusters
            .iter()
            .filter(|c| !a.placements()[&c.id].pinned)
            .map(Cluster::load)
            .max()
            .unwrap_or(0);
        let mut pinned_load: BTreeMap<u32, u64> = BTreeMap::new();
        for c in &clusters {
            let p = a.placements()[&c.id];
            if p.pinned {
                *pinned_load.entry(p.shard).or_default() += c.load();
            }
        }
        for (shard, load) in a.shard_loads() {
            let bound = cap
                .max(total / n + largest_unpinned)
                .max(pinned_load.get(shard).copied().unwrap_or(0));
            prop_assert!(load.load <= bound, "shard {} carries {} > bound {}", shard, load.load, bound);
        }
    }

    #[test]
    fn bounded_load_stays_under_the_cap_when_clusters_are_small(
        shards in live_shards(), counts in prop::collection::vec(1u64..10, 50..200)
    ) {
        // With every cluster far below the slack (c - 1) * mean, no fallback can happen, and the
        // cap itself is the bound.
        let clusters: Vec<Cluster> = counts
            .iter()
            .enumerate()
            .map(|(i, &apps)| Cluster::new(format!("c{i}"), apps))
            .collect();
        let config = StrategyConfig::new(StrategyKind::BoundedLoad);
        let total: u64 = counts.iter().sum();
        let n = shards.len() as u64;
        let cap = config.load_factor.mul_div_ceil(total, n);
        prop_assume!(cap - total / n >= 10);
        let a = assign(&config, &clusters, &shards, None).unwrap();
        prop_assert!(max_load(&a) <= cap, "max {} > cap {}", max_load(&a), cap);
    }

    #[test]
    fn greedy_minimum_is_within_the_list_scheduling_bound(
        clusters in clusters(), shards in live_shards()
    ) {
        let clusters: Vec<Cluster> = clusters.into_iter().map(|c| Cluster { pin: None, ..c }).collect();
        let a = assign(&StrategyKind::GreedyMinimum.into(), &clusters, &shards, None).unwrap();
        let n = shards.len() as u64;
        let total: u64 = clusters.iter().map(Cluster::load).sum();
        let largest = clusters.iter().map(Cluster::load).max().unwrap_or(0);
        prop_assert!(max_load(&a) <= total / n + largest);
        // No shard ends empty while another carries two or more clusters with load.
        let loaded: Vec<_> = a.shard_loads().values().collect();
        if clusters.iter().filter(|c| c.load() > 0).count() >= shards.len() {
            prop_assert!(loaded.iter().all(|l| l.load > 0));
        }
    }

    #[test]
    fn round_robin_deals_clusters_in_id_order(
        clusters in clusters(), shards in live_shards()
    ) {
        let clusters: Vec<Cluster> = clusters.into_iter().map(|c| Cluster { pin: None, ..c }).collect();
        let a = assign(&StrategyKind::RoundRobin.into(), &clusters, &shards, None).unwrap();
        let mut ids: Vec<&str> = clusters.iter().map(|c| c.id.as_str()).collect();
        ids.sort_unstable();
        for (k, id) in ids.iter().enumerate() {
            prop_assert_eq!(a.shard_of(id), Some(shards.as_slice()[k % shards.len()]));
        }
    }

    #[test]
    fn sticky_without_previous_is_greedy(
        config in config(), clusters in clusters(), shards in live_shards()
    ) {
        let sticky = StrategyConfig { kind: StrategyKind::StickyBalanced, ..config };
        let a = assign(&sticky, &clusters, &shards, None).unwrap();
        let g = assign(&StrategyKind::GreedyMinimum.into(), &clusters, &shards, None).unwrap();
        prop_assert_eq!(a.placements(), g.placements());
    }

    #[test]
    fn sticky_is_stable_on_its_own_output(
        config in config(), before in clusters(), after in clusters(),
        from in live_shards(), to in live_shards()
    ) {
        let sticky = StrategyConfig { kind: StrategyKind::StickyBalanced, ..config };
        let first = assign(&sticky, &before, &from, None).unwrap();
        let second = assign(&sticky, &after, &to, Some(&first.to_previous())).unwrap();
        let third = assign(&sticky, &after, &to, Some(&second.to_previous())).unwrap();
        prop_assert_eq!(second.placements(), third.placements());
    }

    #[test]
    fn sticky_keeps_clusters_home_but_for_its_budget(
        config in config(), before in clusters(), after in clusters(),
        from in live_shards(), to in live_shards()
    ) {
        let sticky = StrategyConfig { kind: StrategyKind::StickyBalanced, ..config };
        let first = assign(&sticky, &before, &from, None).unwrap();
        let second = assign(&sticky, &after, &to, Some(&first.to_previous())).unwrap();
        let diff = AssignmentDiff::between(&first, &second);
        // Voluntary moves are the budget's, or clusters whose pin became live elsewhere.
        let pin_moves = diff
            .moves
            .iter()
            .filter(|m| !m.forced && second.placements()[&m.cluster].pinned)
            .count();
        prop_assert!(diff.voluntary_clusters <= config.max_extra_moves as usize + pin_moves);
    }

    #[test]
    fn sticky_extra_moves_never_raise_the_heaviest_shard(
        config in config(), before in clusters(), after in clusters(),
        from in live_shards(), to in live_shards()
    ) {
        let previous = assign(&StrategyKind::GreedyMinimum.into(), &before, &from, None).unwrap().to_previous();
        let sticky = StrategyConfig { kind: StrategyKind::StickyBalanced, ..config };
        // A target no fleet can miss stops the improvement steps before the first one.
        let no_steps = StrategyConfig { target_balance: Ratio::from_thousandths(1_000_000), ..sticky };
        let with = assign(&sticky, &after, &to, Some(&previous)).unwrap();
        let without = assign(&no_steps, &after, &to, Some(&previous)).unwrap();
        prop_assert!(max_load(&with) <= max_load(&without));
    }
}

#[test]
fn zero_live_shards_is_an_error_for_every_strategy() {
    let clusters = vec![Cluster::new("a", 1)];
    for kind in StrategyKind::every() {
        let err = assign(&kind.into(), &clusters, &ShardSet::default(), None).unwrap_err();
        assert_eq!(err, shard_assign::AssignError::NoLiveShards);
    }
}

#[test]
fn duplicate_ids_and_zero_weights_are_refused() {
    let dup = vec![Cluster::new("a", 1), Cluster::new("a", 2)];
    let err = assign(
        &StrategyKind::RoundRobin.into(),
        &dup,
        &ShardSet::contiguous(2),
        None,
    );
    assert_eq!(
        err,
        Err(shard_assign::AssignError::DuplicateClusterId("a".into()))
    );
    let zero = vec![Cluster {
        weight: Some(0),
        ..Cluster::new("b", 1)
    }];
    let err = assign(
        &StrategyKind::RoundRobin.into(),
        &zero,
        &ShardSet::contiguous(2),
        None,
    );
    assert_eq!(err, Err(shard_assign::AssignError::ZeroWeight("b".into())));
}
