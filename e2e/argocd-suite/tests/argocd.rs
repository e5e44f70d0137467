//! Real Argo CD as the ground truth of shardwise's reading of it: Argo CD's application
//! controllers, built from its Go module (scripts/argocd.sh), run a fleet of cluster Secrets and
//! Applications on the real control plane, and each reports the apps it owns in
//! `argocd_app_info`. What `shardwise plan --source argocd` says, what `--apply` pins and what
//! the balancer steers must be what those controllers do.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod argocd_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use argocd_support::{
    ArgoFleet, Auth, BALANCER, BALANCER_LEASE, ClusterSpec, OWNERS_SETTLE, Observer,
    apps_per_controller, balancer_user, current_shards, environment, install, max_over_mean, plan,
    planned_owners, shardwise_cli, start_balancer_as,
};
use shardwise_e2e::argocd::{ArgoCd, ArgoCdOptions, NAMESPACE, Owners, documented_role};
use shardwise_e2e::{Environment, Process, wait_for};

/// The tests that time what Argo CD does take turns: on two cores, four Argo CDs at once made a
/// controller take over 5 s to see a key. The resync test, idle most of its time and timed
/// loosely, runs beside them.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
/// The first 8 apps whose owners as Argo CD reports them differ from `expected`, each with
/// both, for messages.
fn owner_differences(owners: &Owners, expected: &Owners) -> Vec<String> {
    expected
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
        .collect()
}

async fn wait_for_owners(argocd: &ArgoCd, expected: &Owners, what: &str) {
    let seen = wait_for(what, OWNERS_SETTLE, || async {
        let owners = argocd.owners().await.map_err(|e| e.to_string())?;
        if &owners == expected {
            Ok(owners)
        } else {
            let differ = owner_differences(&owners, expected);
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
    let _serial = SERIAL.lock().await;
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
            argocd.wait_rolled().await.unwrap();
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
    let _serial = SERIAL.lock().await;
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
    let apply = [
        "plan",
        "--source",
        "argocd",
        "--apply",
        "--strategy",
        "sticky-balanced",
    ];
    // Argo CD places unpinned clusters by their Secrets' UIDs, which the server draws: a draw
    // may leave nothing the strategy can improve. Then the Secrets are made again, new UIDs.
    let mut draws = 1;
    let (before_plan, before, dry) = loop {
        let before_plan = plan(&env, &[]);
        let before = planned_owners(&before_plan, &fleet, 3);
        wait_for_owners(&argocd, &before, "Argo CD's owners before --apply").await;
        let dry = shardwise_cli(&env, &apply);
        if !dry.contains("; 0 cluster(s) move") {
            break (before_plan, before, dry);
        }
        assert!(
            draws < 5,
            "5 draws of UIDs, none that the strategy moves:\n{dry}"
        );
        draws += 1;
        fleet.recreate_secrets(&env).await;
    };
    // Where the apply's plan puts each cluster (its table: SECRET CLUSTER KEY -> KEY, then
    // Argo CD's shard now -> after); the in-cluster cluster has no Secret and stays.
    let current = current_shards(&before_plan);
    let mut target = BTreeMap::from([("in-cluster".to_string(), current["in-cluster"])]);
    for line in dry.lines().filter(|l| l.starts_with("cluster-")) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let after: Option<u64> = cells.last().and_then(|s| s.parse().ok());
        target.insert(cells[1].to_string(), after);
    }
    target.insert("c09".into(), None);
    assert_eq!(
        target.len(),
        current.len(),
        "every cluster in the apply's table:\n{dry}"
    );
    assert!(
        target != current,
        "the fleet is unbalanced enough for the strategy to move clusters:\n{dry}"
    );
    let mut yes = apply.to_vec();
    yes.push("--yes");
    let wrote = shardwise_cli(&env, &yes);
    let after_plan = plan(&env, &[]);
    let after = planned_owners(&after_plan, &fleet, 3);
    assert_eq!(
        current_shards(&after_plan),
        target,
        "after --apply, plan reads each cluster where the apply put it:\n{wrote}"
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

/// The balancer's target in the suite: apps per controller's max over mean.
const TARGET: f64 = 1.10;

/// One step of the balancer's run, as measured.
struct Step {
    name: &'static str,
    settled_in: Duration,
    key_writes: u64,
    moved: usize,
    balance: f64,
}

/// The controller that owns each cluster's apps (clusters with apps owned by exactly one).
fn cluster_owners(owners: &Owners, fleet: &ArgoFleet) -> BTreeMap<String, u32> {
    fleet
        .app_cluster
        .iter()
        .filter_map(|(app, cluster)| match owners.get(app).map(Vec::as_slice) {
            Some([one]) => Some((cluster.clone(), *one)),
            _ => None,
        })
        .collect()
}

/// Each controller's reconciles of each destination server (`argocd_app_reconcile_count`).
async fn reconciles(argocd: &ArgoCd) -> BTreeMap<(u32, String), f64> {
    let mut counts = BTreeMap::new();
    for (ordinal, m) in argocd.scrape().await.unwrap() {
        for sample in m.matching("argocd_app_reconcile_count", &[]) {
            if let Some(server) = sample.labels.get("dest_server") {
                *counts.entry((ordinal, server.clone())).or_default() += sample.value;
            }
        }
    }
    counts
}

/// Balancing passes the balancers have completed (only the Lease's holder makes them).
async fn balancer_passes(metrics_ports: &[u16]) -> f64 {
    let mut passes = 0.0;
    for port in metrics_ports {
        let m = shardwise_e2e::scrape(&format!("http://127.0.0.1:{port}/metrics"))
            .await
            .unwrap_or_else(|e| panic!("the balancer on :{port} answers: {e}"));
        passes += m.sum("shardwise_planner_runs_total", &[("result", "success")]);
    }
    passes
}

/// Samples until the balancer is at rest and Argo CD has followed it: a balancing pass that
/// began after the keys took their current values completed and left them so, Argo CD's owners
/// are what `plan` reads from the keys, and every cluster that changed controller has been
/// reconciled by its new one since. The step's balance is that of the sample that showed all
/// of this, whatever it is: a balancer that stops short of the target settles too, and the test
/// sees its balance.
async fn settle(
    observer: &mut Observer,
    env: &Environment,
    argocd: &ArgoCd,
    fleet: &ArgoFleet,
    balancers: &[u16],
    name: &'static str,
) -> Step {
    let started = Instant::now();
    let replicas = argocd.options().replicas;
    let servers = fleet.servers(env);
    let owners_before = cluster_owners(&observer.sample(env, argocd, fleet).await, fleet);
    let reconciles_before = reconciles(argocd).await;
    // The passes completed when first counted after the keys were seen as they are, and when
    // they were first seen so.
    let mut mark: Option<(Instant, f64)> = None;
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(180) {
        // Counted before the sample: a pass counted here ended before its keys were read.
        let (passes, counted) = (balancer_passes(balancers).await, Instant::now());
        let owners = observer.sample(env, argocd, fleet).await;
        let keys_since = observer.keys_since().unwrap_or(counted);
        if mark.is_none_or(|(since, _)| since != keys_since) {
            mark = (counted > keys_since).then_some((keys_since, passes));
        }
        // Passes are sequential: once two more have completed, the second began after the
        // mark, with these keys in place, and changed none of them. Clusters moved off a
        // replaced or draining pod are still to come back.
        let away = argocd_support::away(env).await;
        let at_rest = mark.is_some_and(|(_, marked)| passes >= marked + 2.0) && away.is_empty();
        let apps = apps_per_controller(&owners, replicas);
        let balance = max_over_mean(&apps);
        if at_rest {
            let expected = planned_owners(&plan(env, &[]), fleet, replicas);
            let moved: Vec<(String, u32)> = cluster_owners(&owners, fleet)
                .into_iter()
                .filter(|(c, to)| owners_before.get(c).is_some_and(|from| from != to))
                .collect();
            let counts = reconciles(argocd).await;
            let unreconciled: Vec<&(String, u32)> = moved
                .iter()
                .filter(|(c, to)| {
                    let key = (*to, servers[c].clone());
                    counts.get(&key).copied().unwrap_or(0.0)
                        <= reconciles_before.get(&key).copied().unwrap_or(0.0)
                })
                .collect();
            if owners == expected && unreconciled.is_empty() {
                let step = Step {
                    name,
                    settled_in: started.elapsed(),
                    key_writes: observer.key_writes,
                    moved: moved.len(),
                    balance,
                };
                eprintln!(
                    "{name}: settled in {:.1} s, {} keys written, {} clusters changed controller (each reconciled there since), apps per controller {apps:?} (max/mean {balance:.3})",
                    step.settled_in.as_secs_f64(),
                    step.key_writes,
                    step.moved
                );
                observer.step();
                return step;
            }
            let differ = owner_differences(&owners, &expected);
            last = format!(
                "the balancer at rest; apps per controller {apps:?} (max/mean {balance:.3}); owners as plan reads the keys: {} {differ:?}; moved clusters not yet reconciled by their new controller: {unreconciled:?}",
                owners == expected
            );
        } else {
            last = format!(
                "keys changed {:?} ago, {passes} balancing passes, {mark:?} when first counted since; clusters away from their shard {away:?}; apps per controller {apps:?}",
                observer.keys_stable_for()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{name}: not settled in 180 s: {last}\n{}", argocd.report());
}

/// What the server's audit log shows of the balancers' writes of Argo CD's objects (keys,
/// refreshes): those each user sent while it held the Lease, and the others, described.
#[derive(Default)]
struct BalancerWrites {
    by_holder: BTreeMap<String, usize>,
    stray: Vec<String>,
}

/// The balancers' writes, from the server's audit log, against the Lease's history there: its
/// holder at any moment is the sender of its last accepted write before (a create, a take or a
/// renewal; a release, a PATCH, leaves none), whose hold lasts the Lease's duration after it.
/// A create names the collection, not the Lease: the balancers have no other Lease there.
fn balancer_writes(
    env: &Environment,
    users: &[String],
    lease_duration: Duration,
) -> BalancerWrites {
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
    let lease = format!("{leases}/{BALANCER_LEASE}");
    let mut writes: Vec<_> = env
        .control_plane()
        .writes()
        .into_iter()
        .filter(|w| users.contains(&w.user))
        .collect();
    // As the server received them: who held the Lease when each write arrived.
    writes.sort_by_key(|w| w.at);
    let mut holder: Option<(String, SystemTime)> = None;
    let mut found = BalancerWrites::default();
    for w in writes {
        if w.path == lease || w.path == leases {
            if w.code < 300 {
                holder = (w.method != "PATCH").then(|| (w.user.clone(), w.at));
            }
            continue;
        }
        let held = holder.as_ref().is_some_and(|(user, renewed)| {
            *user == w.user
                && !matches!(w.at.duration_since(*renewed), Ok(d) if d >= lease_duration)
        });
        if held {
            *found.by_holder.entry(w.user).or_default() += 1;
        } else {
            found.stray.push(format!(
                "{} {} {} ({}) at {}, the Lease's holder {:?}",
                w.user,
                w.method,
                w.path,
                w.code,
                jiff::Timestamp::try_from(w.at).map_or_else(|e| e.to_string(), |t| t.to_string()),
                holder
                    .as_ref()
                    .map(|(user, renewed)| (user, jiff::Timestamp::try_from(*renewed).ok()))
            ));
        }
    }
    found
}

/// Ordinary clusters for the balancer: uneven, so that Argo CD's algorithm alone is off target.
fn balancer_clusters() -> Vec<ClusterSpec> {
    let apps = [9, 1, 7, 2, 6, 3, 8, 2, 5, 4, 1, 6, 3, 2, 4];
    let mut clusters = vec![ClusterSpec::new("in-cluster", 0, Auth::Token, 2)];
    clusters.extend(apps.into_iter().enumerate().map(|(i, apps)| {
        let auth = if i % 2 == 0 {
            Auth::Token
        } else {
            Auth::Certificate
        };
        ClusterSpec::new(&format!("b{:02}", i + 1), i % 2, auth, apps)
    }));
    clusters
}

#[tokio::test(flavor = "multi_thread")]
async fn the_balancer_steers_real_argocd_through_joins_leaves_a_hot_spot_and_a_scale_change() {
    let _serial = SERIAL.lock().await;
    let mut clusters = balancer_clusters();
    let joining: Vec<ClusterSpec> = (0..3)
        .map(|i| ClusterSpec::new(&format!("j{i}"), i % 2, Auth::Token, [7, 3, 5][i]))
        .collect();
    // The environment knows every identity from the start: joining clusters' too.
    clusters.extend(joining.iter().cloned());
    let env = environment(2, &clusters);
    clusters.truncate(clusters.len() - joining.len());
    // A move's refresh can be lost (seen right after rollouts, likely taken by a controller
    // still starting); the move is then reconciled at the next resync. A 30 s resync keeps that
    // well within a step's 180 s (Argo CD's default, 120 s plus up to 60 s, took 155 s once).
    let options = ArgoCdOptions {
        app_resync: Duration::from_secs(30),
        app_resync_jitter: Duration::ZERO,
        ..ArgoCdOptions::default()
    };
    let mut argocd = install(&env, options).await;
    let mut fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    // Argo CD alone, starting: its apps have no owner until its controllers have synced,
    // which is none of the balancer's doing, so it has an observer of its own.
    let before = settle_owners(&mut Observer::default(), &env, &argocd, &fleet).await;
    eprintln!(
        "Argo CD's legacy algorithm alone: apps per controller {before:?} (max/mean {:.3})",
        max_over_mean(&before)
    );
    let mut observer = Observer::default();
    observer.sample(&env, &argocd, &fleet).await;

    // Two balancers, as two replicas of its Deployment, each its own ServiceAccount: the
    // server's audit log tells which one sent a write.
    let accounts = [BALANCER.to_string(), format!("{BALANCER}-2")];
    let mut balancers = Vec::new();
    let mut ports = Vec::new();
    for account in &accounts {
        let (process, port) =
            start_balancer_as(&env, account, &["--target-balance", &TARGET.to_string()]).await;
        balancers.push(process);
        ports.push(port);
    }
    let mut steps = vec![settle(&mut observer, &env, &argocd, &fleet, &ports, "adoption").await];

    for c in &joining {
        observer.changed(&c.name);
    }
    fleet
        .add(&env, &argocd, joining, Vec::new(), Vec::new())
        .await;
    steps.push(
        settle(
            &mut observer,
            &env,
            &argocd,
            &fleet,
            &ports,
            "3 clusters join",
        )
        .await,
    );

    for name in ["b01", "b07"] {
        observer.changed(name);
        fleet.remove(&env, name).await;
    }
    steps.push(
        settle(
            &mut observer,
            &env,
            &argocd,
            &fleet,
            &ports,
            "2 clusters leave",
        )
        .await,
    );

    observer.changed("b09");
    fleet.grow(&env, &argocd, "b09", 12).await;
    steps.push(
        settle(
            &mut observer,
            &env,
            &argocd,
            &fleet,
            &ports,
            "12 apps onto b09",
        )
        .await,
    );

    // The user changes the StatefulSet's replicas and ARGOCD_CONTROLLER_REPLICAS together, and
    // the StatefulSet controller rolls the pods while the balancer runs: sampled all along, no
    // app may have two owners (but within the grace after a key write), nor none while the
    // controller its key names is Ready.
    let mut with_balancer = Vec::new();
    for (replicas, name) in REPLICA_CHANGES {
        let (unowned, two) = (observer.unowned_app_seconds(), observer.two_owner_samples());
        roll(&mut observer, &env, &mut argocd, &fleet, replicas, name).await;
        steps.push(settle(&mut observer, &env, &argocd, &fleet, &ports, name).await);
        with_balancer.push((
            observer.unowned_app_seconds() - unowned,
            observer.two_owner_samples() - two,
        ));
    }

    let violations = observer.violations();
    assert!(
        violations.is_empty(),
        "{} samples of apps owned by two controllers, or by none while their controller was Ready, outside the grace after a change of their cluster (of {} samples), e.g. {:?}\n{}",
        violations.len(),
        observer.samples,
        &violations[..violations.len().min(8)],
        argocd.sharding_log()
    );
    // Moves are handovers (a parked key, then the new one once no controller lists the
    // cluster's apps): no grace for two owners.
    let two = observer.two_owners();
    assert!(
        two.is_empty(),
        "{} samples of apps owned by two controllers, e.g. {:?}\n{}",
        two.len(),
        &two[..two.len().min(8)],
        argocd.sharding_log()
    );
    // Each step's balance, as Argo CD's controllers reported it when the step settled.
    for step in &steps {
        assert!(
            step.balance <= TARGET,
            "{}: settled at max/mean {:.3}, over the target {TARGET}\n{}",
            step.name,
            step.balance,
            balancers
                .iter()
                .map(Process::report)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    eprintln!(
        "{} samples; {} app samples owned by no controller or two: {} by two; {} unowned while their controller had no Ready pod; {:.1} app-seconds unowned in all",
        observer.samples,
        observer.odd_samples(),
        observer.two_owner_samples(),
        observer.unowned_while_down(),
        observer.unowned_app_seconds()
    );

    // One balancer at a time: every write of either to Argo CD's objects came from the Lease's
    // holder, within its lease; the other, running all along, wrote nothing.
    for (account, process) in accounts.iter().zip(&mut balancers) {
        assert!(process.is_running(), "balancer {account} ran throughout");
    }
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
    );
    let lease_duration = leases
        .get(BALANCER_LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
        .expect("the balancer's Lease has a duration");
    let users: Vec<String> = accounts.iter().map(|a| balancer_user(a)).collect();
    let writes = balancer_writes(&env, &users, lease_duration);
    eprintln!(
        "writes of Argo CD's objects by the balancers, by user, all while it held the Lease: {:?}",
        writes.by_holder
    );
    assert!(
        writes.stray.is_empty(),
        "{} writes by a balancer that did not hold the Lease, e.g. {:?}",
        writes.stray.len(),
        &writes.stray[..writes.stray.len().min(8)]
    );
    assert!(
        steps.iter().map(|s| s.key_writes).sum::<u64>() > 0
            && writes.by_holder.values().sum::<usize>() > 0,
        "the balancers wrote keys"
    );
    // Argo CD alone doing the same changes, in the same run: the balancers stopped (each
    // releases the Lease), every key removed, Argo CD's legacy algorithm placing the clusters.
    for process in &mut balancers {
        let status = process.stop(Duration::from_secs(30)).await.unwrap();
        assert!(status.success(), "a balancer stops cleanly: {status}");
    }
    shardwise_cli(
        &env,
        &["plan", "--source", "argocd", "--apply", "--unpin", "--yes"],
    );
    let mut alone = Observer::default();
    settle_owners(&mut alone, &env, &argocd, &fleet).await;
    let mut without = Vec::new();
    for (replicas, name) in REPLICA_CHANGES {
        let (unowned, two) = (alone.unowned_app_seconds(), alone.two_owner_samples());
        roll(&mut alone, &env, &mut argocd, &fleet, replicas, name).await;
        settle_owners(&mut alone, &env, &argocd, &fleet).await;
        without.push((
            alone.unowned_app_seconds() - unowned,
            alone.two_owner_samples() - two,
        ));
    }
    eprintln!(
        "longest a shard went without a Ready controller pod: {:.1} s with the balancer, {:.1} s alone (what --down-grace must exceed)",
        observer.longest_unserved().as_secs_f64(),
        alone.longest_unserved().as_secs_f64()
    );
    for (((_, name), (unowned, two)), (alone_unowned, alone_two)) in
        REPLICA_CHANGES.iter().zip(&with_balancer).zip(&without)
    {
        eprintln!(
            "{name}, rolled and settled: with the balancer {unowned:.1} app-seconds unowned and {two} app samples with two owners; Argo CD alone {alone_unowned:.1} and {alone_two}"
        );
    }
}

/// The Role docs/argocd.md gives the balancer for `--manage-replicas`.
const REPLICAS_ROLE: &str = "shardwise-argocd-balancer-replicas";

/// The annotation the balancer keeps on the StatefulSet while it changes the replica count.
const REPLICA_CHANGE_ANNOTATION: &str = "shardwise.io/replica-change";

/// Whether the controller's StatefulSet is at rest at `replicas`: no change of the balancer's
/// under way, no partition left; what it is at, if not.
async fn replicas_at_rest(env: &Environment, replicas: u32) -> Result<(), String> {
    let sets: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> = kube::Api::namespaced(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
    );
    let set = sets
        .get(shardwise_e2e::argocd::CONTROLLER)
        .await
        .map_err(|e| e.to_string())?;
    let spec = set.spec.clone().unwrap_or_default();
    let partition = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let changing = set
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLICA_CHANGE_ANNOTATION).cloned());
    if spec.replicas == Some(i32::try_from(replicas).unwrap())
        && partition == 0
        && changing.is_none()
    {
        Ok(())
    } else {
        Err(format!(
            "replicas {:?}, partition {partition}, change annotation {changing:?}",
            spec.replicas
        ))
    }
}

/// `--manage-replicas`: the balancer itself takes Argo CD from 3 controllers to 4 and back,
/// one pod at a time, each pod's clusters moved to the others and dropped before the
/// StatefulSet controller replaces it. Sampled all along: no app with two owners outside the
/// grace of a key write, and no app unowned.
#[tokio::test(flavor = "multi_thread")]
async fn with_manage_replicas_the_balancer_changes_the_count_pod_by_pod_and_no_app_goes_unowned() {
    let _serial = SERIAL.lock().await;
    let clusters = balancer_clusters();
    let env = environment(2, &clusters);
    let options = ArgoCdOptions {
        app_resync: Duration::from_secs(30),
        app_resync_jitter: Duration::ZERO,
        ..ArgoCdOptions::default()
    };
    let mut argocd = install(&env, options).await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    settle_owners(&mut Observer::default(), &env, &argocd, &fleet).await;
    let binding = format!(
        "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {REPLICAS_ROLE}, namespace: {NAMESPACE}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {REPLICAS_ROLE}}}\nsubjects: [{{kind: ServiceAccount, name: {BALANCER}, namespace: {NAMESPACE}}}]\n"
    );
    env.control_plane()
        .apply_yaml(
            "admin",
            &format!("{}{binding}", documented_role(REPLICAS_ROLE)),
        )
        .await
        .unwrap();

    let mut observer = Observer::default();
    observer.sample(&env, &argocd, &fleet).await;
    let mut balancer: Option<Process> = None;
    let mut figures = Vec::new();
    for (replicas, name) in [
        (3, "adoption at 3 controllers"),
        (4, "3 -> 4 by the balancer"),
        (3, "4 -> 3 by the balancer"),
    ] {
        // A balancer sized to `replicas` (a load it reads the same, bounds that force the count).
        if let Some(mut old) = balancer.take() {
            let status = old.stop(Duration::from_secs(30)).await.unwrap();
            assert!(status.success(), "a balancer stops cleanly: {status}");
        }
        let count = replicas.to_string();
        let (process, port) = start_balancer_as(
            &env,
            BALANCER,
            &[
                "--manage-replicas",
                "--min-replicas",
                &count,
                "--max-replicas",
                &count,
                "--scale-down-window",
                "1",
                "--target-balance",
                &TARGET.to_string(),
            ],
        )
        .await;
        balancer = Some(process);
        argocd.follow_replicas(replicas);
        let (unowned, beyond, two, samples) = (
            observer.unowned_by_cluster().clone(),
            observer.unowned_beyond_grace().clone(),
            observer.two_owner_samples(),
            observer.samples,
        );
        let started = Instant::now();
        loop {
            observer.sample(&env, &argocd, &fleet).await;
            let rest = replicas_at_rest(&env, replicas).await;
            let rolled = argocd.rolled().await;
            if rest.is_ok() && rolled.is_ok() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "{name}: not done in 600 s: {rest:?}, {rolled:?}\n{}\n{}",
                balancer.as_ref().map(Process::report).unwrap_or_default(),
                argocd.report()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let changed_in = started.elapsed();
        // A change restarts every pod, each after 20 s of settling: dozens of samples, so
        // that no restart falls between two of them.
        assert!(
            (replicas == 3 && figures.is_empty()) || observer.samples - samples >= 40,
            "{name}: {} samples in {changed_in:?}",
            observer.samples - samples
        );
        let step = settle(&mut observer, &env, &argocd, &fleet, &[port], name).await;
        assert!(
            step.balance <= TARGET,
            "{name}: settled at max/mean {:.3}",
            step.balance
        );
        // App-seconds unowned in this step, by cluster: all, and beyond the grace of a key write.
        let since = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(c, s)| (c.clone(), s - then.get(c).copied().unwrap_or(0.0)))
                .filter(|(_, s)| *s > 0.0)
                .collect::<BTreeMap<String, f64>>()
        };
        figures.push((
            name,
            changed_in,
            observer.samples - samples,
            observer.two_owner_samples() - two,
            since(observer.unowned_by_cluster(), &unowned),
            since(observer.unowned_beyond_grace(), &beyond),
        ));
    }
    for (name, changed_in, samples, two, unowned, beyond) in &figures {
        eprintln!(
            "{name}: changed and rolled in {:.1} s, {samples} samples: {two} app samples with two owners; app-seconds unowned by cluster {unowned:?}, of which beyond {:?} after a key write {beyond:?}",
            changed_in.as_secs_f64(),
            argocd_support::CHANGE_GRACE
        );
    }
    let violations = observer.violations();
    assert!(
        violations.is_empty(),
        "{} samples of apps owned by two controllers, or by none while their controller was Ready, outside the grace after a change of their cluster, e.g. {:?}\n{}",
        violations.len(),
        &violations[..violations.len().min(8)],
        argocd.sharding_log()
    );
    // Moves are handovers (a parked key, then the new one once no controller lists the
    // cluster's apps): no grace for two owners.
    let two = observer.two_owners();
    assert!(
        two.is_empty(),
        "{} samples of apps owned by two controllers, e.g. {:?}\n{}",
        two.len(),
        &two[..two.len().min(8)],
        argocd.sharding_log()
    );
    // No pod is replaced while it holds a movable cluster: an app of one goes unowned only in
    // the moment each controller takes to see a key write. Argo CD's own cluster has no
    // Secret, so no key: its apps stay with pod 0 and wait for its restart.
    for (name, _, _, _, _, beyond) in &figures {
        let movable: Vec<(&String, &f64)> =
            beyond.iter().filter(|(c, _)| *c != "in-cluster").collect();
        assert!(
            movable.is_empty(),
            "{name}: app-seconds without an owner beyond {:?} after a key write, by cluster: {movable:?}",
            argocd_support::CHANGE_GRACE
        );
    }
}

/// The replica changes the user makes in the balancer test, StatefulSet and
/// `ARGOCD_CONTROLLER_REPLICAS` together.
const REPLICA_CHANGES: [(u32, &str); 2] = [(4, "3 -> 4 replicas"), (3, "4 -> 3 replicas")];

/// Changes the StatefulSet's replicas (and `ARGOCD_CONTROLLER_REPLICAS`) to `replicas` and
/// samples while the StatefulSet controller rolls the pods, until they are rolled.
async fn roll(
    observer: &mut Observer,
    env: &Environment,
    argocd: &mut ArgoCd,
    fleet: &ArgoFleet,
    replicas: u32,
    name: &str,
) {
    argocd.reconfigure(env, replicas, "legacy").await.unwrap();
    let samples = observer.samples;
    let rolled = Instant::now();
    loop {
        observer.sample(env, argocd, fleet).await;
        if argocd.rolled().await.is_ok() {
            break;
        }
        assert!(
            rolled.elapsed() < Duration::from_secs(300),
            "{name}: not rolled in 300 s: {:?}\n{}",
            argocd.rolled().await,
            argocd.report()
        );
        // No pause between samples: a sample (the keys, the pods twice and every controller's
        // metrics) takes long enough on a loaded machine that a rollout of a few seconds
        // would otherwise get too few of them.
    }
    eprintln!(
        "{name}: rolled in {:.1} s, {} samples during the rollout",
        rolled.elapsed().as_secs_f64(),
        observer.samples - samples
    );
    assert!(
        observer.samples - samples >= 5,
        "{name}: the rollout was sampled too rarely"
    );
}

/// How long after Argo CD moved a shard between its own pods (the shard ConfigMap changed) a
/// second owner may remain: the previous pod drops the shard at its next readiness probe (every
/// 2 s here), after the probe's own read of the Deployment and the ConfigMap.
const RESHUFFLE_GRACE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread")]
async fn under_dynamic_distribution_a_scale_without_restarts_gives_no_app_two_owners() {
    let _serial = SERIAL.lock().await;
    let clusters = balancer_clusters();
    let env = environment(2, &clusters);
    let options = ArgoCdOptions {
        dynamic: true,
        app_resync: Duration::from_secs(30),
        app_resync_jitter: Duration::ZERO,
        ..ArgoCdOptions::default()
    };
    let mut argocd = install(&env, options).await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    settle_owners(&mut Observer::default(), &env, &argocd, &fleet).await;
    let mut observer = Observer::default();
    observer.sample(&env, &argocd, &fleet).await;
    let (_balancer, port) =
        argocd_support::start_balancer(&env, &["--target-balance", &TARGET.to_string()]).await;
    settle(&mut observer, &env, &argocd, &fleet, &[port], "adoption").await;
    let keys_before = argocd_support::keys(&env).await;
    let uids = |pods: &BTreeMap<u32, k8s_openapi::api::core::v1::Pod>| -> Vec<String> {
        pods.values()
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    };
    let old = uids(&argocd.pods().await.unwrap());

    // The user scales the Deployment 3 -> 4: no pod restarts, and each old pod goes on reading
    // keys with 3, the new one with 4. Sampled until the new pod is Ready and the balancer has
    // made 10 passes since.
    argocd.scale(4).await.unwrap();
    let scaled = Instant::now();
    let mut passes_at_ready = None;
    loop {
        observer.sample(&env, &argocd, &fleet).await;
        if passes_at_ready.is_none() && argocd.rolled().await.is_ok() {
            passes_at_ready = Some(balancer_passes(&[port]).await);
        }
        if let Some(at) = passes_at_ready
            && balancer_passes(&[port]).await >= at + 10.0
        {
            break;
        }
        assert!(
            scaled.elapsed() < Duration::from_secs(180),
            "3 -> 4: not scaled in 180 s: {:?}
{}",
            argocd.rolled().await,
            argocd.report()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let now = uids(&argocd.pods().await.unwrap());
    assert!(
        old.iter().all(|u| now.contains(u)) && now.len() == 4,
        "the old pods run on: {old:?} then {now:?}"
    );
    // The old pods' count cannot be told from the Deployment: the balancer writes nothing.
    let keys_after = argocd_support::keys(&env).await;
    assert_eq!(
        keys_after, keys_before,
        "the balancer wrote keys while pods that read them with the old count ran"
    );
    // Argo CD's own part: on a scale, the pods claim shards in the shard ConfigMap anew (one
    // whose view of the Deployment still says 3 resets a mapping of 4), and a shard's previous
    // pod drops it only at its next readiness probe. Two owners then, with no key written,
    // are Argo CD's; any other two-owner sample is a key read two ways.
    let reshuffle = RESHUFFLE_GRACE;
    let two = observer.two_owner_samples();
    let argos = observer.two_owner_samples_in_reshuffles(reshuffle);
    let violations = observer.violations_beyond(reshuffle);
    assert!(
        violations.is_empty(),
        "{} samples with two owners, {} of them outside Argo CD's own shard reshuffles ({reshuffle:?} after the shard ConfigMap changed); {} violations outside them (of {} samples), e.g. {:?}\n{}",
        two,
        two - argos,
        violations.len(),
        observer.samples,
        &violations[..violations.len().min(8)],
        argocd.sharding_log()
    );
    eprintln!(
        "dynamic distribution 3 -> 4 by a scale: {} samples over {:.1} s; keys unchanged; {two} app samples with two owners, all within {reshuffle:?} of Argo CD moving a shard between pods",
        observer.samples,
        scaled.elapsed().as_secs_f64()
    );
}

/// Samples until Argo CD's owners are what `plan` computes; the apps per controller.
async fn settle_owners(
    observer: &mut Observer,
    env: &Environment,
    argocd: &ArgoCd,
    fleet: &ArgoFleet,
) -> Vec<u64> {
    let replicas = argocd.options().replicas;
    let expected = planned_owners(&plan(env, &[]), fleet, replicas);
    for _ in 0..400 {
        let owners = observer.sample(env, argocd, fleet).await;
        if owners == expected {
            return apps_per_controller(&owners, replicas);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("Argo CD's owners never matched plan's\n{}", argocd.report());
}

/// How a move reached its new owner: when it exported the cluster's apps, and when it first
/// reconciled them (its `argocd_app_reconcile` count for the cluster's server went up).
struct MoveSeen {
    owned_after: Duration,
    reconciled_after: Duration,
}

/// Writes `shard` as `cluster`'s key (and with `refresh`, then asks Argo CD to refresh its apps,
/// as the balancer does); measures how the move reaches controller `shard`.
async fn move_and_watch(
    env: &Environment,
    argocd: &ArgoCd,
    fleet: &ArgoFleet,
    cluster: &str,
    shard: u32,
    refresh: bool,
) -> MoveSeen {
    let spec = &fleet.clusters[cluster];
    let server = argocd_support::server_of(env, spec);
    let url = argocd.metrics_url(shard).await.unwrap().unwrap();
    let reconciles = |m: &shardwise_e2e::Metrics| {
        m.sum(
            "argocd_app_reconcile_count",
            &[("dest_server", server.as_str())],
        )
    };
    let before = reconciles(&shardwise_e2e::scrape(&url).await.unwrap());
    let apps: Vec<String> = spec.app_names().map(|a| format!("argocd/{a}")).collect();
    let started = Instant::now();
    argocd_support::write_key(env, cluster, shard).await;
    if refresh {
        // As the balancer does: a second for every controller to see the key first, or the
        // old owner takes the refresh.
        tokio::time::sleep(Duration::from_secs(1)).await;
        argocd_support::refresh_apps(env, spec).await;
    }
    let (mut owned_after, mut reconciled_after) = (None, None);
    while started.elapsed() < Duration::from_secs(120) {
        let m = shardwise_e2e::scrape(&url).await.unwrap();
        let owned = apps.iter().all(|app| {
            let (_, name) = app.split_once('/').unwrap();
            m.get("argocd_app_info", &[("name", name)]).is_some()
        });
        if owned && owned_after.is_none() {
            owned_after = Some(started.elapsed());
        }
        if reconciles(&m) > before && reconciled_after.is_none() {
            reconciled_after = Some(started.elapsed());
        }
        if let (Some(owned_after), Some(reconciled_after)) = (owned_after, reconciled_after) {
            return MoveSeen {
                owned_after,
                reconciled_after,
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{cluster} moved to controller {shard}: owned after {owned_after:?}, reconciled after {reconciled_after:?} (within 120 s)\n{}",
        argocd.report()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_moved_cluster_is_reconciled_by_its_new_owner_at_its_resync_or_at_once_when_refreshed() {
    // Timings of Argo CD itself: measured alone, not beside another suite's controllers.
    let _serial = SERIAL.lock().await;
    const RESYNC: Duration = Duration::from_secs(15);
    let clusters: Vec<ClusterSpec> = (0..4)
        .map(|i| ClusterSpec::new(&format!("m{i}"), i % 2, Auth::Token, 3))
        .collect();
    let env = environment(2, &clusters);
    let argocd = install(
        &env,
        ArgoCdOptions {
            replicas: 2,
            app_resync: RESYNC,
            app_resync_jitter: Duration::ZERO,
            ..ArgoCdOptions::default()
        },
    )
    .await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    let mut observer = Observer::default();
    settle_owners(&mut observer, &env, &argocd, &fleet).await;
    let shards = current_shards(&plan(&env, &[]));
    let mut seen = Vec::new();
    for (cluster, refresh) in [("m0", false), ("m1", true), ("m2", false), ("m3", true)] {
        let to = 1 - u32::try_from(shards[cluster].unwrap()).unwrap();
        let m = move_and_watch(&env, &argocd, &fleet, cluster, to, refresh).await;
        eprintln!(
            "{cluster} -> controller {to} ({}): owned after {:.2} s, first reconciled after {:.2} s",
            if refresh {
                "apps refreshed"
            } else {
                "no refresh"
            },
            m.owned_after.as_secs_f64(),
            m.reconciled_after.as_secs_f64()
        );
        seen.push((refresh, m));
    }
    for (refresh, m) in &seen {
        assert!(
            m.owned_after < Duration::from_secs(5),
            "the new owner takes the apps at once"
        );
        // Unrefreshed, the new owner reconciles at a resync that finds the app's last
        // reconcile (by the old owner) older than the resync period: within two periods.
        let bound = if *refresh {
            Duration::from_secs(10)
        } else {
            2 * RESYNC + Duration::from_secs(15)
        };
        assert!(
            m.reconciled_after < bound,
            "first reconcile after {:?}",
            m.reconciled_after
        );
    }
}

/// Cordons (`true`) or uncordons node-0: a pod deleted while it is cordoned has a successor
/// that stays Pending, so its controller stays down.
async fn cordon(env: &Environment, unschedulable: bool) {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    let nodes: kube::Api<Node> = kube::Api::all(env.control_plane().client("admin").await.unwrap());
    let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
    nodes
        .patch("node-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_controllers_clusters_are_rescued_after_the_grace_and_go_back_when_it_recovers() {
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::api::DeleteParams;
    const GRACE: Duration = Duration::from_secs(10);
    const RESCUE_BOUND: Duration = Duration::from_secs(40);
    let _serial = SERIAL.lock().await;
    let clusters: Vec<ClusterSpec> = (0..6)
        .map(|i| ClusterSpec::new(&format!("d{i}"), i % 2, Auth::Token, 2))
        .collect();
    let env = environment(2, &clusters);
    let argocd = install(&env, ArgoCdOptions::default()).await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    settle_owners(&mut Observer::default(), &env, &argocd, &fleet).await;
    let (_balancer, port) = argocd_support::start_balancer(
        &env,
        &[
            "--down-grace",
            &GRACE.as_secs().to_string(),
            "--target-balance",
            "1.10",
        ],
    )
    .await;
    let mut observer = Observer::default();
    observer.sample(&env, &argocd, &fleet).await;
    settle(&mut observer, &env, &argocd, &fleet, &[port], "adoption").await;
    let on_one: Vec<String> = argocd_support::keys(&env)
        .await
        .into_iter()
        .filter(|(_, k)| k.as_deref() == Some("1"))
        .map(|(c, _)| c)
        .collect();
    assert!(!on_one.is_empty(), "controller 1 has clusters to lose");
    let apps: Vec<String> = fleet
        .app_cluster
        .iter()
        .filter(|(_, c)| on_one.contains(c))
        .map(|(a, _)| a.clone())
        .collect();

    // Controller 1 dies and stays down: the node is cordoned and its pod force-deleted, so its
    // successor stays Pending.
    let admin = env.control_plane().client("admin").await.unwrap();
    cordon(&env, true).await;
    let pods: kube::Api<Pod> = kube::Api::namespaced(admin.clone(), NAMESPACE);
    let killed = Instant::now();
    pods.delete(
        "argocd-application-controller-1",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    // Its clusters keep their key for the grace, then move, each Secret naming where it came
    // from; their apps are then reconciled by the controllers that took them.
    let secrets: kube::Api<Secret> = kube::Api::namespaced(admin, NAMESPACE);
    let rescued = |key: &str| {
        let on_one = on_one.clone();
        let secrets = secrets.clone();
        let key = key.to_string();
        async move {
            for cluster in &on_one {
                let s = secrets
                    .get(&format!("cluster-{cluster}"))
                    .await
                    .map_err(|e| e.to_string())?;
                let shard = shardwise_e2e::argocd::shard_key(&s);
                let from = s
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("shardwise.io/rescued-from").cloned());
                let moved = shard.as_deref() != Some("1");
                match key.as_str() {
                    "away" if moved && from.as_deref() == Some("1") => {}
                    "home" if !moved && from.is_none() => {}
                    _ => return Err(format!("{cluster}: key {shard:?}, rescued-from {from:?}")),
                }
            }
            Ok(())
        }
    };
    let unreconciled = || async move {
        shardwise_e2e::scrape(&format!("http://127.0.0.1:{port}/metrics"))
            .await
            .ok()
            .and_then(|m| m.get("shardwise_argocd_unreconciled_apps", &[]))
    };
    let (mut first_moved, mut first_flagged) = (None, None);
    while killed.elapsed() < RESCUE_BOUND {
        // The balancer says controller 1's apps have no live controller, until they move.
        if first_flagged.is_none() && unreconciled().await == Some(apps.len() as f64) {
            first_flagged = Some(killed.elapsed());
        }
        let keys = argocd_support::keys(&env).await;
        if on_one.iter().any(|c| keys[c].as_deref() != Some("1")) {
            first_moved.get_or_insert(killed.elapsed());
        }
        let owners = argocd.owners().await.unwrap();
        let taken = apps
            .iter()
            .all(|a| owners.get(a).is_some_and(|o| o.len() == 1 && o[0] != 1));
        if taken && rescued("away").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rescued_after = killed.elapsed();
    let first_moved = first_moved.unwrap_or_else(|| {
        panic!(
            "no cluster of controller 1 moved in {RESCUE_BOUND:?}\n{}",
            argocd.report()
        )
    });
    assert!(
        rescued_after < RESCUE_BOUND,
        "controller 1's apps not owned by another controller within {RESCUE_BOUND:?}: {:?}\n{}",
        rescued("away").await,
        argocd.report()
    );
    assert!(
        first_moved >= GRACE,
        "a cluster of controller 1 moved {first_moved:?} after the kill, within the grace of {GRACE:?}"
    );
    let flagged = first_flagged.unwrap_or_else(|| {
        panic!(
            "the balancer never counted controller 1's {} apps unreconciled",
            apps.len()
        )
    });
    assert!(
        flagged <= Duration::from_secs(30),
        "controller 1's apps counted unreconciled {flagged:?} after the kill"
    );
    wait_for(
        "no app counted unreconciled once the clusters moved",
        Duration::from_secs(30),
        || async {
            match unreconciled().await {
                Some(0.0) => Ok(()),
                seen => Err(format!("{seen:?}")),
            }
        },
    )
    .await
    .unwrap();
    eprintln!(
        "controller 1 killed and kept down: its {} clusters ({} apps) counted unreconciled {:.1} s after, moved {:.1} s after, owned elsewhere {:.1} s after (grace {GRACE:?})",
        on_one.len(),
        apps.len(),
        flagged.as_secs_f64(),
        first_moved.as_secs_f64(),
        rescued_after.as_secs_f64()
    );

    // Back: its clusters return, their annotations go, and controller 1 owns their apps again.
    cordon(&env, false).await;
    let back = Instant::now();
    wait_for(
        "controller 1's clusters back home and owned there",
        Duration::from_secs(120),
        || async {
            rescued("home").await?;
            let owners = argocd.owners().await.map_err(|e| e.to_string())?;
            match apps.iter().find(|a| owners.get(*a) != Some(&vec![1])) {
                Some(a) => Err(format!("{a} owned by {:?}", owners.get(a))),
                None => Ok(()),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", argocd.report()));
    eprintln!(
        "controller 1 back: its clusters home and owned there {:.1} s after the uncordon",
        back.elapsed().as_secs_f64()
    );
}

/// `--load measured` on real controllers: the balancer reads every controller's own
/// `/metrics`, finds each cluster there by its Secret's server, and weighs every cluster with
/// apps by what its controller reports; then it balances that load, and Argo CD follows.
#[tokio::test(flavor = "multi_thread")]
async fn with_measured_load_the_balancer_weighs_every_cluster_by_what_its_controller_reports() {
    let _serial = SERIAL.lock().await;
    // Apps per cluster from 1 to 6, so that a weight per app from the measured time differs
    // from the count alone.
    let clusters: Vec<ClusterSpec> = (0..6)
        .map(|i| ClusterSpec::new(&format!("w{i}"), i % 2, Auth::Token, i as u32 + 1))
        .collect();
    let with_apps = clusters.iter().filter(|c| c.apps > 0).count() as f64;
    let env = environment(2, &clusters);
    let argocd = install(&env, ArgoCdOptions::default()).await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    settle_owners(&mut Observer::default(), &env, &argocd, &fleet).await;
    let (balancer, port) = argocd_support::start_balancer(
        &env,
        &[
            "--load",
            "measured",
            "--load-window",
            "0",
            "--target-balance",
            "1.10",
        ],
    )
    .await;
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let weights = wait_for(
        "every cluster with apps weighed by its measured time and objects, every controller read",
        Duration::from_secs(120),
        || async {
            let m = shardwise_e2e::scrape(&metrics)
                .await
                .map_err(|e| e.to_string())?;
            let measured = m.sum("shardwise_argocd_measured_clusters", &[]);
            let unread = m.sum("shardwise_argocd_unread_controllers", &[]);
            // Argo CD lists a controller's cluster caches in its metrics every 30 s.
            let objects = m.sum("shardwise_argocd_measured_objects", &[]);
            let weights: BTreeMap<String, f64> = m
                .matching("shardwise_argocd_cluster_weight", &[])
                .filter_map(|s| Some((s.labels.get("cluster")?.clone(), s.value)))
                .collect();
            if measured == with_apps && unread == 0.0 && objects > 0.0 {
                Ok(weights)
            } else {
                Err(format!(
                    "{measured} of {with_apps} clusters measured, {unread} controllers unread, {objects} cached objects, weights {weights:?}"
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", balancer.report()));
    eprintln!("measured weights per app (1000: the fleet's average app): {weights:?}");
    // Apps-weighted, the weights average to an average app: the time is the controllers'.
    let apps: BTreeMap<String, f64> =
        fleet
            .app_cluster
            .values()
            .fold(BTreeMap::new(), |mut n, c| {
                *n.entry(c.clone()).or_default() += 1.0;
                n
            });
    let (load, count) = apps.iter().fold((0.0, 0.0), |(l, n), (c, a)| {
        (l + a * weights.get(c).copied().unwrap_or(0.0), n + a)
    });
    assert!(
        ((load / count) - 1000.0).abs() < 5.0,
        "apps-weighted mean weight {:.1}, weights {weights:?}, apps {apps:?}",
        load / count
    );
    assert!(
        weights.values().any(|w| (*w - 1000.0).abs() >= 1.0),
        "every cluster weighs an average app: nothing measured tells them apart ({weights:?})"
    );
    let mut observer = Observer::default();
    observer.sample(&env, &argocd, &fleet).await;
    settle(&mut observer, &env, &argocd, &fleet, &[port], "measured").await;
}

/// `--sync-wait` on real Argo CD: a cluster whose Applications have a sync operation running
/// (a PreSync hook Job that never completes: the destinations run no Job controller) stays on
/// its shard for the wait from the operation's start, though the balancer wants it moved, and
/// moves once the wait is over.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_with_a_sync_running_moves_only_after_the_sync_wait() {
    const SYNC_WAIT: u64 = 20;
    let _serial = SERIAL.lock().await;
    // Shard 0 carries 8 of the 10 apps: the balancer wants syncing and syncing-too moved.
    let syncing = ["syncing", "syncing-too"];
    let clusters = vec![
        ClusterSpec::new(syncing[0], 0, Auth::Token, 4).pinned("0"),
        ClusterSpec::new(syncing[1], 1, Auth::Token, 4).pinned("0"),
        ClusterSpec::new("quiet-1", 0, Auth::Token, 1).pinned("1"),
        ClusterSpec::new("quiet-2", 1, Auth::Token, 1).pinned("2"),
    ];
    let hooks: Vec<(String, String)> = clusters
        .iter()
        .filter(|c| syncing.contains(&c.name.as_str()))
        .flat_map(|c| c.app_names().collect::<Vec<_>>())
        .map(|app| {
            (
                format!("apps/{app}/presync.yaml"),
                format!(
                    "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {app}-presync\n  annotations: {{argocd.argoproj.io/hook: PreSync}}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: wait, image: registry.example.com/wait:1}}]\n"
                ),
            )
        })
        .collect();
    let env = environment(2, &clusters);
    let argocd = install(&env, ArgoCdOptions::default()).await;
    let mut fleet = ArgoFleet {
        clusters: BTreeMap::new(),
        app_cluster: BTreeMap::new(),
        unresolved: Vec::new(),
    };
    fleet.add(&env, &argocd, clusters, hooks, Vec::new()).await;
    let hooked: Vec<String> = fleet
        .app_cluster
        .iter()
        .filter(|(_, c)| syncing.contains(&c.as_str()))
        .map(|(app, _)| app.clone())
        .collect();
    // Every hooked app's sync is running, held by its hook.
    let started = wait_for(
        "a sync running on every app of the syncing clusters",
        Duration::from_secs(120),
        || async {
            let operations = argocd_support::operations(&env).await;
            let running: Vec<jiff::Timestamp> = hooked
                .iter()
                .filter_map(|app| operations.get(app))
                .filter(|(phase, _)| phase == "Running")
                .map(|(_, started)| *started)
                .collect();
            if running.len() == hooked.len() {
                Ok(running.into_iter().min().unwrap())
            } else {
                Err(format!(
                    "{} of {} running: {operations:?}",
                    running.len(),
                    hooked.len()
                ))
            }
        },
    )
    .await
    .unwrap();
    let released = started + jiff::SignedDuration::from_secs(SYNC_WAIT as i64);
    let (balancer, port) = argocd_support::start_balancer(
        &env,
        &[
            "--sync-wait",
            &SYNC_WAIT.to_string(),
            "--target-balance",
            "1.10",
        ],
    )
    .await;
    let keys_of_syncing = || async {
        let keys = argocd_support::keys(&env).await;
        syncing
            .iter()
            .map(|c| keys.get(*c).cloned().flatten())
            .collect::<Vec<_>>()
    };
    let pinned = vec![Some("0".to_string()); syncing.len()];
    // Until the wait is over (a second's margin for the samples), neither moves, pass after pass.
    let mut passes = 0.0;
    while jiff::Timestamp::now() < released - jiff::SignedDuration::from_secs(1) {
        assert_eq!(
            keys_of_syncing().await,
            pinned,
            "a syncing cluster moved {:.1} s before its sync wait was over\n{}",
            released
                .duration_since(jiff::Timestamp::now())
                .as_secs_f64(),
            balancer.report()
        );
        passes = balancer_passes(&[port]).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        passes >= 5.0,
        "the balancer made {passes} passes while the syncs held their clusters"
    );
    // Then one of them moves off shard 0.
    let moved_after = wait_for(
        "a syncing cluster moved once its wait was over",
        Duration::from_secs(60),
        || async {
            let keys = keys_of_syncing().await;
            if keys != pinned {
                Ok(jiff::Timestamp::now().duration_since(released))
            } else {
                Err(format!("keys {keys:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", balancer.report()));
    eprintln!(
        "sync wait {SYNC_WAIT} s: the syncing clusters stayed through {passes} passes and one moved {:.1} s after the wait was over",
        moved_after.as_secs_f64()
    );
}
