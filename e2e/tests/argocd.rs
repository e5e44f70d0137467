//! Real Argo CD as the ground truth of shardwise's reading of it: Argo CD's application
//! controllers, built from its Go module (scripts/argocd.sh), run a fleet of cluster Secrets and
//! Applications on the real control plane, and each reports the apps it owns in
//! `argocd_app_info`. What `shardwise plan --source argocd` says, what `--apply` pins and what
//! the balancer steers must be what those controllers do.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod argocd_support;

use argocd_support::{
    ArgoFleet, Auth, ClusterSpec, OWNERS_SETTLE, current_shards, environment, install, plan,
    planned_owners, shardwise_cli,
};
use shardwise_e2e::argocd::{ArgoCd, ArgoCdOptions, Owners};
use shardwise_e2e::wait_for;

/// Twelve clusters: Argo CD's own (`in-cluster`, no Secret), one without apps, pins in range
/// (1, 2), out of range (7) and negative (-1), credentials by token and by client certificate,
/// on two destination servers.
fn ground_truth_clusters() -> Vec<ClusterSpec> {
    let apps = [3, 5, 2, 4, 0, 6, 1, 3, 2, 4, 5];
    let mut clusters = vec![ClusterSpec::new("in-cluster", 0, Auth::Token, 3)];
    for (i, apps) in apps.into_iter().enumerate() {
        let auth = if i % 2 == 0 {
            Auth::Token
        } else {
            Auth::Certificate
        };
        let c = ClusterSpec::new(&format!("c{:02}", i + 1), i % 2, auth, apps);
        clusters.push(match i + 1 {
            3 => c.pinned("1"),
            6 => c.pinned("7"),
            9 => c.pinned("-1"),
            10 => c.pinned("2"),
            _ => c,
        });
    }
    clusters
}

/// Waits until the controllers report exactly `expected` as the owners of the fleet's apps.
async fn wait_for_owners(argocd: &ArgoCd, expected: &Owners, what: &str) {
    let seen = wait_for(what, OWNERS_SETTLE, || async {
        let owners = argocd.owners().await.map_err(|e| e.to_string())?;
        if &owners == expected {
            Ok(owners)
        } else {
            let differ: Vec<String> = expected
                .keys()
                .chain(owners.keys())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter(|app| owners.get(*app) != expected.get(*app))
                .take(8)
                .map(|app| {
                    format!(
                        "{app}: Argo CD {:?}, plan {:?}",
                        owners.get(app),
                        expected.get(app)
                    )
                })
                .collect();
            Err(format!("{} apps differ, e.g. {differ:?}", differ.len()))
        }
    })
    .await;
    if let Err(e) = seen {
        panic!("{what}: {e}\n{}", argocd.report());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_says_which_controller_owns_every_app_for_each_algorithm_and_replica_count() {
    let clusters = ground_truth_clusters();
    let env = environment(2, &clusters);
    let mut argocd = install(
        &env,
        ArgoCdOptions {
            replicas: 1,
            algorithm: "legacy".into(),
            ..ArgoCdOptions::default()
        },
    )
    .await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 1).await;
    for algorithm in ["legacy", "round-robin", "consistent-hashing"] {
        for replicas in [1, 3, 4] {
            argocd.reconfigure(&env, replicas, algorithm).await.unwrap();
            let plan = plan(&env, &[]);
            let expected = planned_owners(&plan, &fleet, replicas);
            let started = std::time::Instant::now();
            wait_for_owners(
                &argocd,
                &expected,
                &format!("{algorithm} on {replicas} replicas: Argo CD's owners as planned"),
            )
            .await;
            eprintln!(
                "{algorithm} x {replicas}: {} apps owned as planned after {:.1} s",
                expected.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_moves_the_real_owners_as_planned_and_unpin_moves_them_back() {
    // --unpin hands every cluster back to Argo CD's algorithm: only the negative pin, which
    // --apply leaves alone, stays.
    let clusters: Vec<ClusterSpec> = ground_truth_clusters()
        .into_iter()
        .map(|c| match c.pin.as_deref() {
            Some("-1") => c,
            _ => ClusterSpec { pin: None, ..c },
        })
        .collect();
    let env = environment(2, &clusters);
    let argocd = install(&env, ArgoCdOptions::default()).await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    let before_plan = plan(&env, &["--strategy", "sticky-balanced"]);
    let before = planned_owners(&before_plan, &fleet, 3);
    wait_for_owners(&argocd, &before, "Argo CD's owners before --apply").await;

    // Where the strategy puts each cluster: moved ones to their new shard, others stay.
    let strategy = &before_plan["strategies"][0];
    let mut target = current_shards(&before_plan);
    for moved in strategy["moved"].as_array().unwrap() {
        target.insert(
            moved["cluster"].as_str().unwrap().to_string(),
            moved["to"].as_u64(),
        );
    }
    assert!(
        !strategy["moved"].as_array().unwrap().is_empty(),
        "the fleet is unbalanced enough for the strategy to move clusters: {before_plan}"
    );
    let wrote = shardwise_cli(
        &env,
        &[
            "plan",
            "--source",
            "argocd",
            "--apply",
            "--strategy",
            "sticky-balanced",
            "--yes",
        ],
    );
    let after_plan = plan(&env, &[]);
    let after = planned_owners(&after_plan, &fleet, 3);
    assert_eq!(
        current_shards(&after_plan),
        target,
        "after --apply, plan reads each cluster where the strategy put it:\n{wrote}"
    );
    let started = std::time::Instant::now();
    wait_for_owners(&argocd, &after, "Argo CD's owners after --apply").await;
    eprintln!(
        "--apply: owners moved as planned after {:.2} s",
        started.elapsed().as_secs_f64()
    );

    shardwise_cli(
        &env,
        &["plan", "--source", "argocd", "--apply", "--unpin", "--yes"],
    );
    let started = std::time::Instant::now();
    wait_for_owners(
        &argocd,
        &before,
        "Argo CD's owners after --unpin, as before --apply",
    )
    .await;
    eprintln!(
        "--unpin: owners back after {:.2} s",
        started.elapsed().as_secs_f64()
    );
}
