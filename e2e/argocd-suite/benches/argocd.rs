//! Argo CD measured on its own controllers (v3.2.11, built by scripts/argocd.sh, run by the
//! harness as in e2e_argocd), on kube-apiserver and etcd.
//!
//! - `algorithms`: one fleet (24 clusters on 2 destination kube-apiservers, 234 Applications of
//!   one ConfigMap each, skewed: the biggest cluster has 40, the smallest 1) on 4 controllers,
//!   under Argo CD's `legacy`, `round-robin` and `consistent-hashing`, then under
//!   `shardwise-balancer` (from `legacy`) weighing apps, then weighing what each cluster costs
//!   its controller (`--load measured`, with its start and stop thresholds and minimum time
//!   between moves), then under the longest-processing-time assignment of the same measured
//!   reconcile time with two-phase hysteresis (argocd-autoscaler's design: a proposal every
//!   30 s, applied once it has been the most frequent of the last 3 for 3 polls in a row),
//!   side by side in one run. Each approach is measured
//!   over the same window (every app resynced twice: `--app-resync 60`, no jitter), per
//!   controller: apps owned (`argocd_app_info`), reconcile time (busy seconds per second, from
//!   `argocd_app_reconcile_sum`), CPU (cores, from `/proc`) and resident memory, and the apps
//!   each approach moved per hour at rest (over the window and the resync before it). Reported: each
//!   figure's max/mean over the controllers, and the balancer's against the best algorithm's.
//!   For every cluster the balancer moved: when its new controller's cache of the cluster was
//!   synced (`argocd_cluster_cache_age_seconds`) and when it first reconciled the cluster's apps
//!   (`argocd_app_reconcile_count`), counted from when the bench saw the cluster change
//!   controller (a key write shows there within a few tenths of a second).
//!
//! - `versus`: shardwise's controller against Argo CD's on the same work: 300 apps of one
//!   ConfigMap each on 6 clusters of 2 destination kube-apiservers, with 1 and then 3 replicas
//!   (shardwise replicas played by the harness; Argo CD controllers as above, with their repo
//!   server and Redis), one after the other in one run: seconds from creating the apps until
//!   every one is Synced, CPU seconds per app (every process of each system, from `/proc`), and
//!   resident memory per replica. Both at their defaults otherwise.
//!
//! `cargo bench -p shardwise-e2e-argocd --bench argocd [-- algorithms|versus]` (both by default;
//! `make bench-argocd`). Prints Markdown for docs/benchmarks.md; exits 1 when a target is
//! missed: the balancer's max/mean of apps per controller at most the best algorithm's, and at
//! most 1.10.

#![allow(clippy::unwrap_used)]

#[path = "../tests/argocd_support/mod.rs"]
mod argocd_support;
#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_support::{ArgoFleet, Auth, ClusterSpec, environment, install, start_balancer};
use shard_assign::{Cluster, ShardSet, StrategyConfig, StrategyKind, assign};
use shardwise_e2e::argocd::{ArgoCd, ArgoCdOptions, owners_of};
use shardwise_e2e::procfs::{cpu_seconds, resident_bytes};
use shardwise_e2e::{Environment, Metrics};

const CONTROLLERS: u32 = 4;
const RESYNC: Duration = Duration::from_secs(60);
/// How long each approach is measured: two resyncs of every app.
const WINDOW: Duration = Duration::from_secs(120);
/// The balancer's target.
const TARGET: f64 = 1.10;
/// With measured load, where moves for balance start (the target is where they stop) and the
/// least time between two moves of one cluster: the balancer's two-phase hysteresis, short
/// enough to act within the bench.
const MEASURED_TRIGGER: &str = "1.25";
const MEASURED_MIN_MOVE: &str = "600";
/// The longest-processing-time assignment's poll and stabilization (polls in a row).
const LPT_POLL: Duration = Duration::from_secs(30);
const LPT_STABILIZATION: usize = 3;
/// Apps of each cluster, biggest first.
const APPS: [u32; 24] = [
    40, 30, 24, 20, 16, 14, 12, 10, 9, 8, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 2, 1, 1,
];

/// One controller over a window.
#[derive(Clone, Copy, Debug, Default)]
struct Controller {
    apps: f64,
    /// Reconcile seconds per second.
    busy: f64,
    /// Cores.
    cpu: f64,
    /// Resident memory at the end, MiB.
    rss: f64,
}

/// Every controller's figures over one window.
struct Window {
    controllers: BTreeMap<u32, Controller>,
}

impl Window {
    fn max_over_mean(&self, figure: impl Fn(&Controller) -> f64) -> f64 {
        let values: Vec<f64> = self.controllers.values().map(&figure).collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let max = values.iter().copied().fold(0.0, f64::max);
        if mean > 0.0 { max / mean } else { 1.0 }
    }

    fn total(&self, figure: impl Fn(&Controller) -> f64) -> f64 {
        self.controllers.values().map(figure).sum()
    }
}

fn reconcile_seconds(m: &Metrics) -> f64 {
    m.sum("argocd_app_reconcile_sum", &[])
}

/// Apps the balancer serving metrics on `port` has moved so far.
async fn moved_apps(port: u16) -> f64 {
    shardwise_e2e::scrape(&format!("http://127.0.0.1:{port}/metrics"))
        .await
        .map(|m| m.sum("shardwise_planner_moves_total", &[("kind", "app")]))
        .unwrap_or(0.0)
}

/// Each cluster's reconcile time (seconds, summed over the controllers: a cluster that moved
/// counts on both), by cluster name, as every controller's `argocd_app_reconcile_sum` says.
async fn reconcile_by_cluster(
    argocd: &ArgoCd,
    servers: &BTreeMap<String, String>,
) -> BTreeMap<String, f64> {
    let scraped = argocd.scrape().await.unwrap();
    servers
        .iter()
        .map(|(cluster, server)| {
            let busy = scraped
                .values()
                .map(|m| m.sum("argocd_app_reconcile_sum", &[("dest_server", server)]))
                .sum();
            (cluster.clone(), busy)
        })
        .collect()
}

/// The longest-processing-time assignment of `busy` (each cluster's reconcile time over the
/// same period) on the controllers: heaviest first, each onto the least loaded shard so far
/// (shard-assign's `greedy-minimum`).
fn lpt(busy: &BTreeMap<String, f64>) -> BTreeMap<String, u32> {
    let clusters: Vec<Cluster> = busy
        .iter()
        // Microseconds, at least 1: a cluster with apps is never free.
        .map(|(name, seconds)| Cluster::new(name.clone(), ((seconds * 1e6) as u64).max(1)))
        .collect();
    let placed = assign(
        &StrategyConfig::new(StrategyKind::GreedyMinimum),
        &clusters,
        &ShardSet::contiguous(CONTROLLERS),
        None,
    )
    .unwrap();
    clusters
        .iter()
        .map(|c| (c.id.clone(), placed.shard_of(&c.id).unwrap()))
        .collect()
}

/// Argo CD's placement steered by a longest-processing-time assignment of the measured
/// reconcile time under two-phase hysteresis, as plumber-cd/argocd-autoscaler designs it: every
/// [`LPT_POLL`] a proposal from the time each cluster took since the poll before; a proposal is
/// applied (the keys that differ written, their apps refreshed) once it has been the most
/// frequent of the last [`LPT_STABILIZATION`] proposals for that many polls in a row. Runs for
/// `period`; returns the apps it moved.
async fn lpt_with_hysteresis(
    env: &Environment,
    argocd: &ArgoCd,
    fleet: &ArgoFleet,
    current: &mut BTreeMap<String, u32>,
    period: Duration,
) -> u64 {
    let servers = fleet.servers(env);
    let apps_of = |cluster: &str| {
        fleet
            .app_cluster
            .values()
            .filter(|c| c.as_str() == cluster)
            .count()
    };
    let mut proposals: std::collections::VecDeque<BTreeMap<String, u32>> = Default::default();
    let mut wanted: Option<(BTreeMap<String, u32>, usize)> = None;
    let mut moved = 0;
    let started = Instant::now();
    let mut last = reconcile_by_cluster(argocd, &servers).await;
    while started.elapsed() + LPT_POLL <= period {
        tokio::time::sleep(LPT_POLL).await;
        let now = reconcile_by_cluster(argocd, &servers).await;
        let busy: BTreeMap<String, f64> = now
            .iter()
            .filter(|(c, _)| apps_of(c) > 0)
            .map(|(c, t)| {
                (
                    c.clone(),
                    (t - last.get(c).copied().unwrap_or(0.0)).max(0.0),
                )
            })
            .collect();
        last = now;
        proposals.push_back(lpt(&busy));
        if proposals.len() > LPT_STABILIZATION {
            proposals.pop_front();
        }
        let count = |p: &BTreeMap<String, u32>| proposals.iter().filter(|q| *q == p).count();
        let top = proposals.iter().map(count).max().unwrap_or(0);
        let mode = proposals
            .iter()
            .rev()
            .find(|p| count(p) == top)
            .unwrap()
            .clone();
        let polls = match wanted.take() {
            Some((w, polls)) if w == mode => polls + 1,
            _ => 1,
        };
        wanted = Some((mode.clone(), polls));
        if polls < LPT_STABILIZATION || mode == *current {
            continue;
        }
        moved += apply_keys(env, fleet, current, &mode).await;
    }
    moved
}

/// Writes the keys of `wanted` that differ from `current` and refreshes the moved clusters'
/// apps; returns the apps moved.
async fn apply_keys(
    env: &Environment,
    fleet: &ArgoFleet,
    current: &mut BTreeMap<String, u32>,
    wanted: &BTreeMap<String, u32>,
) -> u64 {
    let mut moved = Vec::new();
    for (cluster, &shard) in wanted {
        if current.get(cluster) != Some(&shard) {
            argocd_support::write_key(env, cluster, shard).await;
            current.insert(cluster.clone(), shard);
            moved.push(cluster.clone());
        }
    }
    // As the balancer does: every controller sees the key before the refresh.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for cluster in &moved {
        argocd_support::refresh_apps(env, &fleet.clusters[cluster]).await;
    }
    moved
        .iter()
        .map(|c| fleet.app_cluster.values().filter(|a| *a == c).count() as u64)
        .sum()
}

/// Measures every controller over [`WINDOW`], after one resync period at rest: a controller just
/// started (every approach begins with a rollout) reconciles all its apps at once and syncs its
/// cluster caches, which is not the steady state being compared (one run counted 130% busy
/// right after a restart, 1% a minute later).
async fn window(argocd: &ArgoCd) -> Window {
    tokio::time::sleep(RESYNC).await;
    let pids: BTreeMap<u32, u32> = argocd.controller_pids().await.unwrap();
    let before = argocd.scrape().await.unwrap();
    let cpu_before: BTreeMap<u32, f64> = pids.iter().map(|(o, p)| (*o, cpu_seconds(*p))).collect();
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let after = argocd.scrape().await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let controllers = pids
        .iter()
        .map(|(o, pid)| {
            let figures = Controller {
                apps: after[o].matching("argocd_app_info", &[]).count() as f64,
                busy: (reconcile_seconds(&after[o]) - reconcile_seconds(&before[o])) / seconds,
                cpu: (cpu_seconds(*pid) - cpu_before[o]) / seconds,
                rss: resident_bytes(*pid).unwrap_or(0) as f64 / 1_048_576.0,
            };
            (*o, figures)
        })
        .collect();
    Window { controllers }
}

/// Waits until every app of the fleet is owned by one controller and reported Synced by it.
async fn all_synced(argocd: &ArgoCd, fleet: &ArgoFleet) {
    let total = fleet.app_cluster.len();
    let started = Instant::now();
    loop {
        let metrics = argocd.scrape().await.unwrap();
        let synced = metrics
            .values()
            .flat_map(|m| m.matching("argocd_app_info", &[("sync_status", "Synced")]))
            .count();
        if synced == total {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{synced} of {total} apps Synced after 600 s\n{}",
            argocd.report()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What one move cost its new controller, from when the bench saw the cluster change
/// controller: until its cache of the cluster was synced, and until it first reconciled one of
/// the cluster's apps.
struct MoveCost {
    cluster: String,
    cache_synced: f64,
    first_reconcile: f64,
    /// Time since the previous sample: the reconcile came at most this much earlier.
    resolution: f64,
}

/// A move under way: each figure is taken as soon as it shows, since they show on different
/// clocks (the reconcile count at once, the cluster cache metrics only at the controller's
/// 30-second collection).
struct Move {
    seen: Instant,
    to: u32,
    /// The new controller's reconciles of the cluster's apps when the move was seen.
    reconciles: f64,
    cache_synced: Option<f64>,
    first_reconcile: Option<(f64, f64)>,
}

/// Follows the moves the balancer makes until its keys stay put for 10 s.
async fn follow_moves(env: &Environment, argocd: &ArgoCd, fleet: &ArgoFleet) -> Vec<MoveCost> {
    let servers = fleet.servers(env);
    let owner_of = |owners: &shardwise_e2e::argocd::Owners, cluster: &str| {
        fleet
            .app_cluster
            .iter()
            .find(|(_, c)| c.as_str() == cluster)
            .and_then(|(app, _)| match owners.get(app).map(Vec::as_slice) {
                Some([one]) => Some(*one),
                _ => None,
            })
    };
    let mut keys = argocd_support::keys(env).await;
    let mut owners = argocd.owners().await.unwrap();
    let mut pending: BTreeMap<String, Move> = BTreeMap::new();
    let mut costs = Vec::new();
    let mut quiet_since = Instant::now();
    let mut last_seen = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(10) || !pending.is_empty() {
        let now_keys = argocd_support::keys(env).await;
        // One scrape for both: owners and reconcile counts of the same moment.
        let metrics = argocd.scrape().await.unwrap();
        let now_owners = owners_of(&metrics);
        let seen = Instant::now();
        if now_keys != keys {
            quiet_since = seen;
        }
        for cluster in servers.keys() {
            let (Some(from), Some(to)) =
                (owner_of(&owners, cluster), owner_of(&now_owners, cluster))
            else {
                continue;
            };
            if from != to {
                let reconciles = metrics[&to].sum(
                    "argocd_app_reconcile_count",
                    &[("dest_server", &servers[cluster])],
                );
                let move_ = Move {
                    seen,
                    to,
                    reconciles,
                    cache_synced: None,
                    first_reconcile: None,
                };
                pending.insert(cluster.clone(), move_);
            }
        }
        let mut done = Vec::new();
        for (cluster, move_) in &mut pending {
            let m = &metrics[&move_.to];
            let server = servers[cluster].as_str();
            let since_move = seen.duration_since(move_.seen).as_secs_f64();
            if let Some(age) = m.get("argocd_cluster_cache_age_seconds", &[("server", server)]) {
                move_
                    .cache_synced
                    .get_or_insert((since_move - age).max(0.0));
            }
            if m.sum("argocd_app_reconcile_count", &[("dest_server", server)]) > move_.reconciles {
                let resolution = seen.duration_since(last_seen).as_secs_f64();
                move_
                    .first_reconcile
                    .get_or_insert((since_move, resolution));
            }
            if let (Some(cache_synced), Some((first_reconcile, resolution))) =
                (move_.cache_synced, move_.first_reconcile)
            {
                costs.push(MoveCost {
                    cluster: cluster.clone(),
                    cache_synced,
                    first_reconcile,
                    resolution,
                });
                done.push(cluster.clone());
            }
            assert!(
                move_.seen.elapsed() < Duration::from_secs(300),
                "{cluster}: its new controller {} neither synced its cache nor reconciled its apps in 300 s",
                move_.to
            );
        }
        for cluster in done {
            pending.remove(&cluster);
        }
        keys = now_keys;
        owners = now_owners;
        last_seen = seen;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    costs
}

fn clusters() -> Vec<ClusterSpec> {
    let mut clusters = vec![ClusterSpec::new("in-cluster", 0, Auth::Token, 0)];
    clusters.extend(APPS.iter().enumerate().map(|(i, &apps)| {
        let auth = if i % 2 == 0 {
            Auth::Token
        } else {
            Auth::Certificate
        };
        ClusterSpec::new(&format!("c{i:02}"), i % 2, auth, apps)
    }));
    clusters
}

/// One placement's row; `moved`: the apps it moved per hour at rest, `None` for a static one.
fn row(name: &str, w: &Window, moved: Option<f64>) -> String {
    let cell = |figure: &dyn Fn(&Controller) -> f64, total: f64, unit: &str| {
        let per: Vec<String> = w
            .controllers
            .values()
            .map(|c| match unit {
                "%" => format!("{:.1}", figure(c) * 100.0),
                _ => format!("{:.0}", figure(c)),
            })
            .collect();
        format!(
            "{} ({:.2})",
            per.join(" / "),
            if total > 0.0 {
                w.max_over_mean(figure)
            } else {
                1.0
            }
        )
    };
    let moved = moved.map_or_else(|| "0 (static)".to_string(), |m| format!("{m:.0}"));
    format!(
        "| {name} | {} | {} | {} | {} | {moved} |",
        cell(&|c| c.apps, w.total(|c| c.apps), ""),
        cell(&|c| c.busy, w.total(|c| c.busy), "%"),
        cell(&|c| c.cpu, w.total(|c| c.cpu), "%"),
        cell(&|c| c.rss, w.total(|c| c.rss), ""),
    )
}

async fn algorithms(failures: &mut Vec<String>) {
    let clusters = clusters();
    let env = environment(2, &clusters);
    let mut argocd = install(
        &env,
        ArgoCdOptions {
            replicas: CONTROLLERS,
            algorithm: "legacy".into(),
            app_resync: RESYNC,
            app_resync_jitter: Duration::ZERO,
            ..ArgoCdOptions::default()
        },
    )
    .await;
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    let mut windows = Vec::new();
    for algorithm in ["legacy", "round-robin", "consistent-hashing"] {
        argocd
            .reconfigure(&env, CONTROLLERS, algorithm)
            .await
            .unwrap();
        argocd.wait_rolled().await.unwrap();
        all_synced(&argocd, &fleet).await;
        let w = window(&argocd).await;
        eprintln!("{}", row(algorithm, &w, None));
        windows.push((algorithm.to_string(), w));
    }
    argocd
        .reconfigure(&env, CONTROLLERS, "legacy")
        .await
        .unwrap();
    argocd.wait_rolled().await.unwrap();
    all_synced(&argocd, &fleet).await;
    // Moves are timed on controllers at rest: right after the rollout each one still works
    // through the reconcile of every app it owns, and a refreshed app would wait behind them.
    tokio::time::sleep(RESYNC).await;
    // Moves at rest are counted over what `window` takes: a resync period, then the window.
    let per_hour = |apps: f64| apps * 3600.0 / (RESYNC + WINDOW).as_secs_f64();
    let target = TARGET.to_string();
    let (mut balancer, port) = start_balancer(&env, &["--target-balance", &target]).await;
    let moves = follow_moves(&env, &argocd, &fleet).await;
    all_synced(&argocd, &fleet).await;
    let before = moved_apps(port).await;
    let w = window(&argocd).await;
    let balancer_moves = per_hour(moved_apps(port).await - before);
    eprintln!("{}", row("shardwise-balancer", &w, Some(balancer_moves)));
    balancer.kill().unwrap();

    // The balancer weighing each cluster by what its controller measures (reconcile time and
    // cached objects), with its two-phase hysteresis, from where the apps placed the clusters.
    let (mut balancer, port) = start_balancer(
        &env,
        &[
            "--load",
            "measured",
            "--target-balance",
            &target,
            "--load-trigger",
            MEASURED_TRIGGER,
            "--min-move-interval",
            MEASURED_MIN_MOVE,
        ],
    )
    .await;
    let measured_moves = follow_moves(&env, &argocd, &fleet).await;
    all_synced(&argocd, &fleet).await;
    let measured_to_get_there = moved_apps(port).await;
    let wm = window(&argocd).await;
    let measured_per_hour = per_hour(moved_apps(port).await - measured_to_get_there);
    eprintln!(
        "{}",
        row("shardwise-balancer, measured", &wm, Some(measured_per_hour))
    );
    balancer.kill().unwrap();

    // The longest-processing-time assignment of the same measured time, under two-phase
    // hysteresis: first from a resync period's reconcile time, then polled through the window.
    let servers = fleet.servers(&env);
    let mut current: BTreeMap<String, u32> = argocd_support::keys(&env)
        .await
        .into_iter()
        .filter_map(|(c, k)| Some((c, k?.parse().ok()?)))
        .collect();
    let first = reconcile_by_cluster(&argocd, &servers).await;
    tokio::time::sleep(RESYNC).await;
    let busy: BTreeMap<String, f64> = reconcile_by_cluster(&argocd, &servers)
        .await
        .into_iter()
        .filter(|(c, _)| fleet.app_cluster.values().any(|a| a == c))
        .map(|(c, t)| {
            let was = first.get(&c).copied().unwrap_or(0.0);
            (c, (t - was).max(0.0))
        })
        .collect();
    let lpt_to_get_there = apply_keys(&env, &fleet, &mut current, &lpt(&busy)).await;
    all_synced(&argocd, &fleet).await;
    let (wl, lpt_moved) = tokio::join!(
        window(&argocd),
        lpt_with_hysteresis(&env, &argocd, &fleet, &mut current, RESYNC + WINDOW)
    );
    let lpt_per_hour = per_hour(lpt_moved as f64);
    eprintln!("{}", row("LPT, measured", &wl, Some(lpt_per_hour)));

    println!(
        "\n### Argo CD's controllers under its algorithms and under the balancer ({CONTROLLERS} controllers, 24 clusters, {} apps, `--app-resync 60`, {} s windows)\n",
        fleet.app_cluster.len(),
        WINDOW.as_secs()
    );
    println!("Per controller, and (max/mean):\n");
    println!(
        "| placement | apps owned | reconcile busy, % of a second | CPU, % of a core | resident MiB | apps moved per hour at rest |"
    );
    println!("|---|---|---|---|---|---:|");
    for (name, w) in &windows {
        println!("{}", row(name, w, None));
    }
    println!(
        "{}",
        row("shardwise-balancer (from legacy)", &w, Some(balancer_moves))
    );
    println!(
        "{}",
        row(
            &format!(
                "shardwise-balancer, `--load measured` (moved {measured_to_get_there:.0} apps to get there)"
            ),
            &wm,
            Some(measured_per_hour)
        )
    );
    println!(
        "{}",
        row(
            &format!(
                "longest processing time of the measured time, two-phase hysteresis (moved {lpt_to_get_there} apps to get there)"
            ),
            &wl,
            Some(lpt_per_hour)
        )
    );
    let best = windows
        .iter()
        .map(|(name, w)| (name.clone(), w.max_over_mean(|c| c.apps)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let balancer_apps = w.max_over_mean(|c| c.apps);
    let best_busy = windows
        .iter()
        .map(|(_, w)| w.max_over_mean(|c| c.busy))
        .fold(f64::INFINITY, f64::min);
    let best_cpu = windows
        .iter()
        .map(|(_, w)| w.max_over_mean(|c| c.cpu))
        .fold(f64::INFINITY, f64::min);
    println!(
        "\nBalancer against the best algorithm ({}): apps max/mean {balancer_apps:.2} against {:.2} (**{:.2}x**); reconcile busy max/mean {:.2} against the best {best_busy:.2}; CPU max/mean {:.2} against the best {best_cpu:.2}.",
        best.0,
        best.1,
        balancer_apps / best.1,
        w.max_over_mean(|c| c.busy),
        w.max_over_mean(|c| c.cpu),
    );
    println!(
        "\nWith measured load, the balancer against the longest-processing-time assignment of the same measured time: reconcile busy max/mean {:.2} against {:.2} (**{:.2}x**), resident memory max/mean {:.2} against {:.2}, apps moved per hour at rest {measured_per_hour:.0} against {lpt_per_hour:.0}; {} clusters moved to get there against {lpt_to_get_there} apps.",
        wm.max_over_mean(|c| c.busy),
        wl.max_over_mean(|c| c.busy),
        wm.max_over_mean(|c| c.busy) / wl.max_over_mean(|c| c.busy),
        wm.max_over_mean(|c| c.rss),
        wl.max_over_mean(|c| c.rss),
        measured_moves.len(),
    );
    println!(
        "\nMoves the balancer made, each timed from when the suite saw the cluster change controller:\n"
    );
    println!(
        "| cluster | new controller's cache synced | its first reconcile of the apps (sampled every) |"
    );
    println!("|---|---:|---:|");
    for m in &moves {
        println!(
            "| {} | {:.2} s | {:.2} s ({:.2} s) |",
            m.cluster, m.cache_synced, m.first_reconcile, m.resolution
        );
    }
    if balancer_apps > best.1 + 1e-9 {
        failures.push(format!(
            "the balancer's apps max/mean {balancer_apps:.3} is above {}'s {:.3}",
            best.0, best.1
        ));
    }
    if balancer_apps > TARGET {
        failures.push(format!(
            "the balancer's apps max/mean {balancer_apps:.3} > {TARGET}"
        ));
    }
}

/// One system's run of the `versus` work.
struct Versus {
    system: &'static str,
    replicas: u32,
    seconds: f64,
    cpu_per_app: f64,
    rss_mib: Vec<f64>,
}

const VERSUS_APPS: u32 = 300;
const VERSUS_CLUSTERS: u32 = 6;

/// shardwise: the fleet's replicas played by the harness, from the fleet's creation until every
/// app is Synced.
async fn shardwise_run(replicas: u32) -> Versus {
    let fleet = support::Fleet::start(support::FleetOptions {
        runner: support::Runner::Played,
        fast: false,
        replicas,
        clusters: VERSUS_CLUSTERS,
        apps: VERSUS_APPS,
        ..support::FleetOptions::default()
    })
    .await
    .unwrap();
    support::wait_synced(&fleet, VERSUS_APPS as usize, Duration::from_secs(600)).await;
    let seconds = fleet.started.elapsed().as_secs_f64();
    let pids: Vec<u32> = fleet.replicas.values().map(|r| r.pid()).collect();
    Versus {
        system: "shardwise",
        replicas,
        seconds,
        cpu_per_app: pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() / f64::from(VERSUS_APPS),
        rss_mib: pids
            .iter()
            .map(|p| resident_bytes(*p).unwrap_or(0) as f64 / 1_048_576.0)
            .collect(),
    }
}

/// Argo CD: its controllers, repo server and Redis started first; from the Applications'
/// creation until every one is Synced, their CPU since.
async fn argocd_run(replicas: u32) -> Versus {
    let clusters: Vec<ClusterSpec> = (0..VERSUS_CLUSTERS)
        .map(|i| {
            ClusterSpec::new(
                &format!("v{i}"),
                (i % 2) as usize,
                Auth::Token,
                VERSUS_APPS / VERSUS_CLUSTERS,
            )
        })
        .collect();
    let env = environment(2, &clusters);
    let argocd = install(
        &env,
        ArgoCdOptions {
            replicas,
            ..ArgoCdOptions::default()
        },
    )
    .await;
    let mut pids: Vec<u32> = argocd
        .controller_pids()
        .await
        .unwrap()
        .into_values()
        .collect();
    let controllers = pids.clone();
    pids.extend(argocd.shared_processes().iter().map(|p| p.pid()));
    let cpu_before: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    let started = Instant::now();
    let fleet = ArgoFleet::create(&env, &argocd, clusters, 0).await;
    all_synced(&argocd, &fleet).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>() - cpu_before;
    Versus {
        system: "Argo CD",
        replicas,
        seconds,
        cpu_per_app: cpu / f64::from(VERSUS_APPS),
        rss_mib: controllers
            .iter()
            .map(|p| resident_bytes(*p).unwrap_or(0) as f64 / 1_048_576.0)
            .collect(),
    }
}

async fn versus() {
    let mut runs = Vec::new();
    for replicas in [1, 3] {
        for run in [shardwise_run(replicas).await, argocd_run(replicas).await] {
            eprintln!(
                "{} x {}: {:.1} s, {:.3} CPU s per app",
                run.system, run.replicas, run.seconds, run.cpu_per_app
            );
            runs.push(run);
        }
    }
    println!(
        "\n### shardwise's controller against Argo CD's ({VERSUS_APPS} apps of one ConfigMap, {VERSUS_CLUSTERS} clusters)\n"
    );
    println!(
        "| system | replicas | until all Synced | apps/s | CPU per app | resident memory per replica |"
    );
    println!("|---|---:|---:|---:|---:|---|");
    for r in &runs {
        let rss: Vec<String> = r.rss_mib.iter().map(|m| format!("{m:.0} MiB")).collect();
        println!(
            "| {} | {} | {:.1} s | {:.1} | {:.1} ms | {} |",
            r.system,
            r.replicas,
            r.seconds,
            f64::from(VERSUS_APPS) / r.seconds,
            r.cpu_per_app * 1000.0,
            rss.join(", ")
        );
    }
    for replicas in [1, 3] {
        let of = |system: &str| {
            runs.iter()
                .find(|r| r.system == system && r.replicas == replicas)
                .unwrap()
        };
        let (s, a) = (of("shardwise"), of("Argo CD"));
        println!(
            "\nAt {replicas} replica(s): Argo CD takes {:.2}x shardwise's time and {:.2}x its CPU per app.",
            a.seconds / s.seconds,
            a.cpu_per_app / s.cpu_per_app
        );
    }
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut failures = Vec::new();
    runtime.block_on(async {
        if run("algorithms") {
            algorithms(&mut failures).await;
        }
        if run("versus") {
            versus().await;
        }
    });
    if !failures.is_empty() {
        eprintln!("targets missed: {failures:?}");
        std::process::exit(1);
    }
}
