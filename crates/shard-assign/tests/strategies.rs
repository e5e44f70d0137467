//! Worked examples of each strategy, with expected placements derived by hand.

use shard_assign::{
    AssignmentDiff, Cluster, Ratio, ShardSet, StrategyConfig, StrategyKind, Warning, assign,
};

fn run(kind: StrategyKind, clusters: &[Cluster], shards: &ShardSet) -> shard_assign::Assignment {
    assign(&kind.into(), clusters, shards, None).expect("the example is valid input")
}

#[test]
fn legacy_modulo_uses_fnv1a_of_the_id_modulo_the_shard_count() {
    // FNV-1a 32 of "a" is 0xe40c292c = 3826002220 and of "foobar" 0xbf9cf968 = 3214735720
    // (specification test vectors). 3826002220 % 7 = 5, 3214735720 % 7 = 0,
    // 3826002220 % 3 = 1, 3214735720 % 3 = 1.
    let clusters = [
        Cluster::new("a", 1),
        Cluster::new("foobar", 1),
        Cluster::new("", 1),
    ];
    let seven = run(
        StrategyKind::LegacyModulo,
        &clusters,
        &ShardSet::contiguous(7),
    );
    assert_eq!(seven.shard_of("a"), Some(5));
    assert_eq!(seven.shard_of("foobar"), Some(0));
    // Argo CD puts a cluster without id on the first shard.
    assert_eq!(seven.shard_of(""), Some(0));

    // With a gap in the live set the modulo indexes the sorted live shards: {0, 2, 5}[1] = 2.
    let gap: ShardSet = [5, 0, 2].into_iter().collect();
    let gapped = run(StrategyKind::LegacyModulo, &clusters, &gap);
    assert_eq!(gapped.shard_of("a"), Some(2));
    assert_eq!(gapped.shard_of("foobar"), Some(2));
    assert_eq!(gapped.shard_of(""), Some(0));
}

#[test]
fn legacy_modulo_honours_live_pins_like_argo_cd() {
    let mut pinned = Cluster::new("a", 1);
    pinned.pin = Some(2);
    let a = run(
        StrategyKind::LegacyModulo,
        &[pinned.clone()],
        &ShardSet::contiguous(7),
    );
    assert_eq!(a.shard_of("a"), Some(2));
    // A pin past the live shards falls back to the hash, with a warning.
    pinned.pin = Some(9);
    let a = run(
        StrategyKind::LegacyModulo,
        &[pinned],
        &ShardSet::contiguous(7),
    );
    assert_eq!(a.shard_of("a"), Some(5));
    assert_eq!(
        a.warnings(),
        &[Warning::PinNotLive {
            cluster: "a".into(),
            pin: 9,
            placed_on: 5
        }]
    );
    assert!(a.warnings()[0].to_string().contains("not live"));
}

#[test]
fn round_robin_deals_in_byte_order_of_ids() {
    // Byte order puts "B" (0x42) before "a" (0x61).
    let clusters = ["c", "a", "B", "d"].map(|id| Cluster::new(id, 1));
    let a = run(
        StrategyKind::RoundRobin,
        &clusters,
        &ShardSet::contiguous(3),
    );
    assert_eq!(a.shard_of("B"), Some(0));
    assert_eq!(a.shard_of("a"), Some(1));
    assert_eq!(a.shard_of("c"), Some(2));
    assert_eq!(a.shard_of("d"), Some(0));
}

#[test]
fn greedy_minimum_places_largest_first_on_the_lightest_shard() {
    // LPT on {7, 6, 5, 4, 3} over 2 shards: 7->0, 6->1, 5->1 (6<7), 4->0 (7<11), 3->0 (11=11,
    // tie to shard 0): loads 14 and 11.
    let clusters =
        [("e", 7), ("d", 6), ("c", 5), ("b", 4), ("a", 3)].map(|(id, apps)| Cluster::new(id, apps));
    let a = run(
        StrategyKind::GreedyMinimum,
        &clusters,
        &ShardSet::contiguous(2),
    );
    let loads: Vec<u64> = a.shard_loads().values().map(|l| l.apps).collect();
    assert_eq!(loads, vec![14, 11]);
    assert_eq!(a.shard_of("e"), Some(0));
    assert_eq!(a.shard_of("c"), Some(1));
    assert_eq!(a.shard_of("a"), Some(0));
}

#[test]
fn weights_multiply_apps_into_load() {
    let mut heavy = Cluster::new("heavy", 10);
    heavy.weight = Some(3);
    let clusters = [heavy, Cluster::new("x", 20), Cluster::new("y", 15)];
    let a = run(
        StrategyKind::GreedyMinimum,
        &clusters,
        &ShardSet::contiguous(2),
    );
    // Loads 30, 20, 15: heavy alone on shard 0, the other two together on shard 1.
    assert_eq!(a.shard_of("heavy"), Some(0));
    assert_eq!(a.shard_loads()[&1].load, 35);
    assert_eq!(a.shard_loads()[&0].apps, 10);
    assert_eq!(a.shard_loads()[&0].load, 30);
}

#[test]
fn bounded_load_spreads_what_the_cap_refuses() {
    // 40 equal clusters on 4 shards with c = 1: cap is exactly the mean, so the result is
    // perfectly even whatever the ring says.
    let clusters: Vec<Cluster> = (0..40).map(|i| Cluster::new(format!("c{i}"), 5)).collect();
    let config = StrategyConfig {
        load_factor: Ratio::ONE,
        ..StrategyConfig::new(StrategyKind::BoundedLoad)
    };
    let a = assign(&config, &clusters, &ShardSet::contiguous(4), None).unwrap();
    assert!(a.shard_loads().values().all(|l| l.apps == 50));
}

#[test]
fn bounded_load_moves_only_the_departed_shards_clusters_when_there_is_room() {
    // A generous factor leaves every shard room, so clusters only move when their shard goes.
    let clusters: Vec<Cluster> = (0..200)
        .map(|i| Cluster::new(format!("uid-{i}"), 3))
        .collect();
    let config = StrategyConfig {
        load_factor: Ratio::from_thousandths(3000),
        ..StrategyConfig::new(StrategyKind::BoundedLoad)
    };
    let before = assign(&config, &clusters, &ShardSet::contiguous(10), None).unwrap();
    let after = assign(&config, &clusters, &ShardSet::contiguous(9), None).unwrap();
    let diff = AssignmentDiff::between(&before, &after);
    assert_eq!(diff.voluntary_clusters, 0);
    assert_eq!(
        diff.forced_clusters as u64,
        before.shard_loads()[&9].clusters
    );
}

#[test]
fn sticky_balanced_fills_the_gap_and_spends_its_budget() {
    // Three shards of 100; shard 2 leaves with clusters of 60 and 40. Placed largest first onto
    // the lightest: 60 -> shard 0 (tie, lowest id), 40 -> shard 1: loads 160 and 140, max/mean
    // 1.067 > 1.03. One extra move of a 10 from shard 0 to shard 1 gives 150 / 150.
    let mut clusters = vec![
        Cluster::new("a", 90),
        Cluster::new("b", 10),
        Cluster::new("c", 100),
        Cluster::new("d", 60),
        Cluster::new("e", 40),
    ];
    let before_shards = ShardSet::contiguous(3);
    let mut previous = shard_assign::PreviousPlacement::new().with_live_shards(before_shards);
    for (id, shard) in [("a", 0), ("b", 0), ("c", 1), ("d", 2), ("e", 2)] {
        let load = clusters.iter().find(|c| c.id == id).unwrap().apps;
        previous.insert(id, shard, Some(load));
    }
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let balanced = assign(
        &config,
        &clusters,
        &ShardSet::contiguous(2),
        Some(&previous),
    )
    .unwrap();
    assert_eq!(balanced.shard_loads()[&0].apps, 150);
    assert_eq!(balanced.shard_loads()[&1].apps, 150);
    assert_eq!(balanced.shard_of("b"), Some(1));
    assert_eq!(balanced.shard_of("a"), Some(0));

    // With no budget the gap is filled but nothing else moves.
    let frozen = StrategyConfig {
        max_extra_moves: 0,
        ..config
    };
    let a = assign(
        &frozen,
        &clusters,
        &ShardSet::contiguous(2),
        Some(&previous),
    )
    .unwrap();
    assert_eq!(a.shard_of("b"), Some(0));
    assert_eq!(a.shard_loads()[&0].apps, 160);

    // A new cluster lands on the lightest shard (a tie: the lowest id) and nothing else moves
    // while the result is within the target.
    clusters.push(Cluster::new("f", 1));
    let grown = balanced.to_previous();
    let b = assign(&config, &clusters, &ShardSet::contiguous(2), Some(&grown)).unwrap();
    let diff = AssignmentDiff::between(&balanced, &b);
    assert_eq!(diff.clusters_moved(), 0);
    assert_eq!(diff.added_clusters, 1);
    assert_eq!(b.shard_of("f"), Some(0));
}

#[test]
fn sticky_balanced_swaps_when_a_move_would_overshoot() {
    // Shard 0 carries 100 + 40 = 140, shard 1 carries 90 + 30 = 120 (mean 130, max/mean 1.077).
    // Moving the 40 gives 100/160 and moving the 100 is worse: no move lowers the maximum. Two
    // swaps give 130/130: "x"(40) for "y"(30) and "big0"(100) for "big1"(90); the one moving
    // fewer apps wins.
    let clusters = [
        Cluster::new("big0", 100),
        Cluster::new("x", 40),
        Cluster::new("big1", 90),
        Cluster::new("y", 30),
    ];
    let mut previous =
        shard_assign::PreviousPlacement::new().with_live_shards(ShardSet::contiguous(2));
    previous.insert("big0", 0, Some(100));
    previous.insert("x", 0, Some(39)); // its load changed: a reason to re-plan
    previous.insert("big1", 1, Some(90));
    previous.insert("y", 1, Some(30));
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let a = assign(
        &config,
        &clusters,
        &ShardSet::contiguous(2),
        Some(&previous),
    )
    .unwrap();
    assert_eq!(a.shard_of("x"), Some(1));
    assert_eq!(a.shard_of("y"), Some(0));
    assert_eq!(a.shard_of("big0"), Some(0));
    assert_eq!(a.shard_loads()[&0].apps, 130);

    // With a budget of one no step is affordable that lowers the maximum: nothing moves.
    let one = StrategyConfig {
        max_extra_moves: 1,
        ..config
    };
    let a = assign(&one, &clusters, &ShardSet::contiguous(2), Some(&previous)).unwrap();
    assert_eq!(a.shard_of("x"), Some(0));
    assert_eq!(a.shard_loads()[&0].apps, 140);

    // Unchanged inputs: the recorded state is kept as it is, however unbalanced.
    previous.insert("x", 0, Some(40));
    let a = assign(
        &config,
        &clusters,
        &ShardSet::contiguous(2),
        Some(&previous),
    )
    .unwrap();
    assert_eq!(a.shard_of("x"), Some(0));
}

#[test]
fn one_outsized_cluster_never_freezes_the_balance_of_the_others() {
    // "huge" (20 apps of weight 1000) alone on shard 0 outweighs the rest of the fleet a hundred
    // times: no move can lower shard 0, so the target (1.03 x mean) is out of reach. Shard 3 is
    // new. Shard 0 is set aside and the others are balanced against their own mean (180 / 3):
    // 100 / 80 / 0 becomes 60 / 60 / 60 in three moves, the whole budget.
    let mut huge = Cluster::new("huge", 20);
    huge.weight = Some(1000);
    let mut clusters = vec![huge];
    let mut previous =
        shard_assign::PreviousPlacement::new().with_live_shards(ShardSet::contiguous(3));
    previous.insert("huge", 0, Some(20_000));
    for i in 0..9 {
        let id = format!("small-{i}");
        previous.insert(id.as_str(), if i < 5 { 1 } else { 2 }, Some(20));
        clusters.push(Cluster::new(id, 20));
    }
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let a = assign(
        &config,
        &clusters,
        &ShardSet::contiguous(4),
        Some(&previous),
    )
    .unwrap();
    let loads: Vec<u64> = a.shard_loads().values().map(|l| l.load).collect();
    assert_eq!(loads, vec![20_000, 60, 60, 60]);
    assert_eq!(a.shard_of("huge"), Some(0));

    // Fed its own output with unchanged inputs, nothing moves.
    let again = assign(
        &config,
        &clusters,
        &ShardSet::contiguous(4),
        Some(&a.to_previous()),
    )
    .unwrap();
    assert_eq!(AssignmentDiff::between(&a, &again).clusters_moved(), 0);
}

/// One planning pass of `sticky-balanced` from `placed` (made for `placed_on`) onto `shards`,
/// with the loads unknown, as a planner's periodic pass runs it.
fn sticky_pass(
    clusters: &[Cluster],
    placed: &shard_assign::Assignment,
    placed_on: &ShardSet,
    shards: &ShardSet,
) -> shard_assign::Assignment {
    let previous =
        shard_assign::previous_for_pass(clusters, |id| placed.shard_of(id), placed_on, true);
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    assign(&config, clusters, shards, Some(&previous)).expect("the pass is valid input")
}

#[test]
fn sticky_balanced_fills_a_new_shard_with_the_old_shards_excess() {
    // Six shards of 100 (a 60 and two 20s each) scale to seven: mean 85.7, so each old shard is
    // 14.3 above it and the new shard 85.7 below. Moving a 60 would lower the sum of squares
    // most but leave its shard at 40, to be refilled later by another old shard; a 20 takes an
    // old shard to 80 and no further. The budget of three moves takes a 20 off each of the
    // three heaviest shards (ties: lowest id) and gives all three to the new shard.
    let clusters: Vec<Cluster> = (0..6)
        .flat_map(|s| {
            [
                Cluster::new(format!("{s}-a"), 60),
                Cluster::new(format!("{s}-b"), 20),
                Cluster::new(format!("{s}-c"), 20),
            ]
        })
        .collect();
    let six = ShardSet::contiguous(6);
    let seven = ShardSet::contiguous(7);
    let placed = run(StrategyKind::GreedyMinimum, &clusters, &six);
    for shard in 0..6 {
        assert_eq!(placed.shard_loads()[&shard].apps, 100);
    }
    let next = sticky_pass(&clusters, &placed, &six, &seven);
    let moved: Vec<(u64, Option<u32>, Option<u32>)> = clusters
        .iter()
        .filter(|c| next.shard_of(&c.id) != placed.shard_of(&c.id))
        .map(|c| (c.apps, placed.shard_of(&c.id), next.shard_of(&c.id)))
        .collect();
    assert_eq!(
        moved,
        [
            (20, Some(0), Some(6)),
            (20, Some(1), Some(6)),
            (20, Some(2), Some(6))
        ]
    );
}

#[test]
fn sticky_balanced_scales_up_within_a_fifth_of_the_least_it_must_move() {
    // Fleets of 100 clusters of 1 to 200 apps scale from 9 to 10 shards. At least the new
    // shard's share at the mean must move; pass after pass, sticky-balanced must reach its
    // target balance moving at most 1.2 times that.
    let config = StrategyConfig::new(StrategyKind::StickyBalanced);
    let nine = ShardSet::contiguous(9);
    let ten = ShardSet::contiguous(10);
    for seed in 1..=20u64 {
        // xorshift64: a fixed fleet per seed, with no dependency on a random-number crate.
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next_apps = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            1 + state % 200
        };
        let clusters: Vec<Cluster> = (0..100)
            .map(|i| Cluster::new(format!("c{i:03}"), next_apps()))
            .collect();
        let total: u64 = clusters.iter().map(|c| c.apps).sum();
        let least = total / 10;

        let mut placed = run(StrategyKind::GreedyMinimum, &clusters, &nine);
        let mut placed_on = &nine;
        let mut moved = 0;
        let mut passes = 0;
        while !config.target_balance.bounds(max_load(&placed) * 10, total) || placed_on != &ten {
            passes += 1;
            assert!(passes <= 10, "seed {seed}: no convergence in 10 passes");
            let next = sticky_pass(&clusters, &placed, placed_on, &ten);
            moved += clusters
                .iter()
                .filter(|c| next.shard_of(&c.id) != placed.shard_of(&c.id))
                .map(|c| c.apps)
                .sum::<u64>();
            placed = next;
            placed_on = &ten;
        }
        assert!(
            moved * 5 <= least * 6,
            "seed {seed}: {moved} apps moved, least {least}, in {passes} passes"
        );
    }
}

fn max_load(a: &shard_assign::Assignment) -> u64 {
    a.shard_loads().values().map(|l| l.apps).max().unwrap_or(0)
}
