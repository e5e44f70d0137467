//! `argocd-consistent-hashing` against Argo CD: golden vectors from an independent
//! reimplementation (`golden/argocd_consistent_hashing.py`, see its header for the Argo CD
//! version and files), the assertions of Argo CD's own test of the algorithm, and the behaviour
//! of pins that is particular to Argo CD.

use std::collections::BTreeMap;

use serde::Deserialize;
use shard_assign::{Assignment, Cluster, ShardSet, StrategyKind, Warning, assign};

const KIND: StrategyKind = StrategyKind::ArgoCdConsistentHashing;

#[derive(Debug, Deserialize)]
struct Fixture {
    argo_cd_version: String,
    argo_cd_commit: String,
    vectors: Vec<Vector>,
}

#[derive(Debug, Deserialize)]
struct Vector {
    name: String,
    shards: u32,
    walked_past_first_choice: u32,
    clusters: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    id: String,
    apps: u64,
    pin: Option<u32>,
    expected_shard: u32,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("golden/argocd_consistent_hashing.json"))
        .expect("the fixture is valid JSON of the expected shape")
}

fn run(clusters: &[Cluster], shards: &ShardSet) -> Assignment {
    assign(&KIND.into(), clusters, shards, None).expect("valid fleet")
}

#[test]
fn placements_match_the_independent_reimplementation() {
    let fixture = fixture();
    assert_eq!(fixture.argo_cd_version, "v3.5.1");
    assert_eq!(
        fixture.argo_cd_commit,
        "109ca7ca71139e514114499d294a492e7910a965"
    );
    assert!(fixture.vectors.len() >= 10);
    for vector in &fixture.vectors {
        let clusters: Vec<Cluster> = vector
            .clusters
            .iter()
            .map(|c| Cluster {
                pin: c.pin,
                ..Cluster::new(c.id.clone(), c.apps)
            })
            .collect();
        let a = run(&clusters, &ShardSet::contiguous(vector.shards));
        let wrong: Vec<String> = vector
            .clusters
            .iter()
            .filter(|c| a.shard_of(&c.id) != Some(c.expected_shard))
            .map(|c| {
                format!(
                    "{:?}: {:?}, expected {}",
                    c.id,
                    a.shard_of(&c.id),
                    c.expected_shard
                )
            })
            .collect();
        assert!(wrong.is_empty(), "{}: {wrong:#?}", vector.name);
    }
}

#[test]
fn the_vectors_exercise_the_load_cap_pins_and_colliding_ring_keys() {
    let fixture = fixture();
    let walked: u32 = fixture
        .vectors
        .iter()
        .map(|v| v.walked_past_first_choice)
        .sum();
    assert!(
        walked >= 20,
        "only {walked} clusters walked past their first shard"
    );
    let pins = fixture
        .vectors
        .iter()
        .flat_map(|v| {
            v.clusters
                .iter()
                .filter_map(move |c| Some((c.pin?, v.shards)))
        })
        .collect::<Vec<_>>();
    assert!(pins.iter().any(|&(pin, shards)| pin < shards));
    assert!(pins.iter().any(|&(pin, shards)| pin >= shards));
    assert!(fixture.vectors.iter().any(|v| v.shards >= 12));
    assert!(fixture.vectors.iter().any(|v| v.shards == 1));
}

/// The fleet of Argo CD's `TestConsistentHashingWhenClusterIsAddedAndRemoved`
/// (controller/sharding/sharding_test.go): 133 clusters with ids "%06d" and no apps.
fn upstream_fleet() -> Vec<Cluster> {
    (0..133)
        .map(|i| Cluster::new(format!("{i:06}"), 0))
        .collect()
}

#[test]
fn argo_cds_own_test_assertions_hold() {
    let clusters = upstream_fleet();
    let three = run(&clusters, &ShardSet::contiguous(3));
    // Each of the 3 shards holds within 10% of the mean cluster count.
    let mean = clusters.len() as f64 / 3.0;
    for (shard, load) in three.shard_loads() {
        let count = load.clusters as f64;
        assert!(
            (0.9 * mean..=1.1 * mean).contains(&count),
            "shard {shard}: {count} clusters, mean {mean}"
        );
    }
    // Going down to 2 replicas moves only the clusters of the shard that left.
    let two = run(&clusters, &ShardSet::contiguous(2));
    for c in &clusters {
        let before = three.shard_of(&c.id);
        if before != Some(2) {
            assert_eq!(two.shard_of(&c.id), before, "{}", c.id);
        }
    }
}

#[test]
fn a_pinned_cluster_still_loads_the_shard_the_ring_gave_it() {
    let mut clusters: Vec<Cluster> = (0..30)
        .map(|i| Cluster::new(format!("cluster-{i:02}"), 10 + (i * 7) % 40))
        .collect();
    clusters[4].apps = 2_000;
    let shards = ShardSet::contiguous(4);
    let free = run(&clusters, &shards);
    let ring_shard = free.shard_of("cluster-04").expect("placed");
    let pin = (ring_shard + 1) % 4;
    clusters[4].pin = Some(pin);
    let pinned = run(&clusters, &shards);
    assert_eq!(pinned.shard_of("cluster-04"), Some(pin));
    assert!(pinned.placements()["cluster-04"].pinned);
    // Its 2000 apps count where the ring put it, so no other cluster moves.
    for c in clusters.iter().filter(|c| c.id != "cluster-04") {
        assert_eq!(pinned.shard_of(&c.id), free.shard_of(&c.id), "{}", c.id);
    }
}

#[test]
fn a_pin_to_a_missing_shard_goes_to_the_first_live_shard_with_a_warning() {
    let mut clusters: Vec<Cluster> = (0..12).map(|i| Cluster::new(format!("c{i}"), 5)).collect();
    // Pin every cluster beyond the live set: Argo CD sends each to shard 0.
    for c in &mut clusters {
        c.pin = Some(7);
    }
    let live: ShardSet = [2, 3, 5].into_iter().collect();
    let a = run(&clusters, &live);
    for c in &clusters {
        assert_eq!(a.shard_of(&c.id), Some(2));
    }
    assert_eq!(a.warnings().len(), clusters.len());
    assert!(matches!(
        &a.warnings()[0],
        Warning::PinNotLive {
            pin: 7,
            placed_on: 2,
            ..
        }
    ));
}

#[test]
fn a_gap_in_the_live_shards_indexes_the_sorted_live_set() {
    let clusters: Vec<Cluster> = (0..40)
        .map(|i| Cluster::new(format!("c{i}"), (i * 13) % 50))
        .collect();
    let contiguous = run(&clusters, &ShardSet::contiguous(3));
    let live = [0u32, 2, 5];
    let gapped = run(&clusters, &live.into_iter().collect());
    for c in &clusters {
        let position = contiguous.shard_of(&c.id).expect("placed") as usize;
        assert_eq!(gapped.shard_of(&c.id), Some(live[position]), "{}", c.id);
    }
}

#[test]
fn weights_and_ring_parameters_do_not_change_the_placement() {
    let clusters: Vec<Cluster> = (0..50)
        .map(|i| Cluster::new(format!("c{i}"), (i * 31) % 90))
        .collect();
    let shards = ShardSet::contiguous(5);
    let plain = run(&clusters, &shards);
    let weighted: Vec<Cluster> = clusters
        .iter()
        .enumerate()
        .map(|(i, c)| Cluster {
            weight: Some(1 + (i as u32 % 4)),
            ..c.clone()
        })
        .collect();
    let mut config = shard_assign::StrategyConfig::new(KIND);
    config.virtual_nodes = 7;
    config.load_factor = "1.9".parse().expect("a valid ratio");
    let other = assign(&config, &weighted, &shards, None).expect("valid fleet");
    let shards_of = |a: &Assignment| -> BTreeMap<String, u32> {
        a.placements()
            .iter()
            .map(|(id, p)| (id.clone(), p.shard))
            .collect()
    };
    assert_eq!(shards_of(&plain), shards_of(&other));
}
