//! Fleet benchmarks: real controller processes on API servers, measured end to end.
//!
//! - `throughput`: apps per second until 2,000 apps are Synced with 1, 2 and 4 replicas, 10 ms of
//!   latency on every destination request, default workers, 10 requests/s per replica to the
//!   control plane; scaling efficiency `throughput(N) / (N × throughput(1))`, target ≥ 0.8 at 4
//!   replicas.
//! - `skewed`: the same on a skewed fleet, 2,000 apps of which 60% target one cluster, 10
//!   requests/s per replica to each destination, with slices off and on, side by side: without
//!   slices the hot cluster's replica caps the fleet; with them, target scaling efficiency ≥ 0.8
//!   at 4 replicas.
//!
//!   Both hold each replica to a client rate limit that four replicas together stay well under
//!   what kube-apiserver can serve on 2 cores (about 70 apps/s), so that what is measured is how
//!   sharding multiplies a replica's limit, not the servers' capacity (docs/benchmarks.md).
//! - `memory`: peak resident memory of one replica of 4 (not the planner) owning a quarter of
//!   20,000 apps of three objects each, against a single replica owning all; target ≤ 0.30×.
//! - `handoff`: with the default lease settings, 4 replicas, 40 clusters, 2,000 apps: time until
//!   every cluster is owned again after a graceful scale-down (target < 5 s), a SIGKILL (target <
//!   lease duration + 5 s) and a partition; apps whose owner changed; reconciles in flight when
//!   the owner stopped; overlapping reconciles in the audit (must be 0).
//!
//! - `measured`: 4 replicas, 40 clusters of 25 apps each, 8 of them (4 on shard 0, 4 on shard 1)
//!   moved to a destination that answers 10x slower (50 ms against 5 ms); the fleet restarted
//!   with `--load-model=apps`, then with `--load-model=measured`, side by side in one run:
//!   measured busy time per shard, max/mean (target with measured ≤ 1.20, and apps worse), the
//!   clusters moved and the time to get there; overlapping reconciles (must be 0).
//!
//! - `cache`: what the caches of the clusters buy. 3 replicas, 40 clusters, 5,000 apps:
//!   destination writes while every app is looked at again every 30 s with nothing changing
//!   (target 0), and the time to repair 60 managed objects edited or deleted by hand at the
//!   default resync (target p99 < 5 s); then a graceful handoff of a cluster of 1,000 and of
//!   5,000 apps: until it is owned again and until the new owner's cache holds its objects
//!   (target < 5 s for 1,000), with the client limits raised as the big-fleet tests raise them.
//!
//! - `moves`: a cluster of 10,000 apps moved by its owner's graceful stop: the controller's
//!   writes to the control plane meanwhile (target at most 10, whatever the app count), the time
//!   until the other replica has reconciled every moved app (target < 10 s), and 20 new apps
//!   created afterwards, each timed to Synced (target < 2 s).
//!
//! - `scale`: Argo CD's largest published test, 50,000 apps on 500 clusters, with 3, 6, 9 and 12
//!   replicas and the throughput section's settings, on kube-apiserver and etcd: time until
//!   every app is Synced (followed by one watch), apps/s, efficiency against 3 replicas (target
//!   ≥ 0.8 at 12), the planner's peak memory and pass time, the cores the controllers kept busy,
//!   and what the control plane spent per app synced: kube-apiserver's and etcd's CPU, etcd's
//!   log bytes, and the requests by verb and resource, the controllers' apart from the bench's
//!   (the audit log). Every run audited. `-- scale --apps=N --replicas=3,6` runs a smaller one.
//!
//! - `chart`: charts/shardwise installed with helm on a node, so that the real StatefulSet
//!   controller runs 3 replicas (1,000 apps, 20 clusters, default leases): from `helm install` to
//!   every app Synced, then a scale-down 3 -> 2 and a rolling update (`helm upgrade` of the pod
//!   template) timed until every cluster is owned again, beside the same fleet with the harness
//!   playing the StatefulSet controller, in one run (target: scale-down < 5 s, and no cluster 5 s
//!   or more without a live owner in the rollout).
//!
//! - `managers`: what a field manager per term cost: 2,000 apps, 2 replicas, five rounds of both
//!   replicas restarted (new terms) and every app changed, with the controller's writes naming
//!   no field manager (the server then names one per term's User-Agent: the
//!   `per-term-field-manager` defect, seeded in the same failpoints build) and naming its own,
//!   side by side: managedFields entries and bytes per app, and the last round's
//!   kube-apiserver and etcd CPU and etcd log bytes per app (target: fewer entries and bytes).
//!
//! - `copies`: what holding one cluster more costs a replica: the resident memory of one
//!   replica with 2,000 realistic apps on 1 and on 40 clusters.
//!
//! Every other section runs on kube-apiserver and etcd, as the suites do.
//!
//! `cargo bench -p shardwise-e2e-suites --bench fleet [-- throughput|skewed|memory|handoff|chart|measured|cache|moves|scale|managers|copies]`
//! (all but `scale` by default). Prints Markdown for docs/benchmarks.md; exits 1 when a target is missed.

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::ListParams;
use shardwise_api::SyncPhase;
use shardwise_e2e::{scrape, wait_for};
use shardwise_handoff::keys::DRAIN_TO_ANNOTATION;
use shardwise_runtime::audit;
use support::{
    DESTINATION_IDENTITY, Fleet, FleetOptions, Runner, STATEFULSET, is_synced, shard_label,
};

const LONG: Duration = Duration::from_secs(1200);

/// [`support::wait_synced`] within [`LONG`].
async fn wait_synced(fleet: &Fleet, total: usize) {
    support::wait_synced(fleet, total, LONG).await;
}

// ---------------------------------------------------------------- throughput

async fn throughput(replicas: u32) -> f64 {
    synced_rate(FleetOptions {
        replicas,
        clusters: 40,
        apps: 2000,
        args: vec!["--kube-qps=10".into(), "--kube-burst=20".into()],
        ..throughput_options()
    })
    .await
}

/// Default workers and limits, 10 ms on every destination request (sections may lower a limit).
fn throughput_options() -> FleetOptions {
    FleetOptions {
        runner: Runner::Played,
        fast: false,
        destination_latency: Some(Duration::from_millis(10)),
        ..FleetOptions::default()
    }
}

/// Apps Synced per second, from the first replica's start until every app is Synced.
async fn synced_rate(options: FleetOptions) -> f64 {
    let (replicas, apps) = (options.replicas, options.apps);
    let args = options.args.join(" ");
    let fleet = Fleet::start(options).await.unwrap();
    wait_synced(&fleet, apps as usize).await;
    let seconds = fleet.started.elapsed().as_secs_f64();
    let rate = f64::from(apps) / seconds;
    eprintln!(
        "throughput: {replicas} replica(s) {args}: {apps} apps Synced in {seconds:.1} s = {rate:.1} apps/s"
    );
    rate
}

/// 2,000 apps, 60% of them on one of 16 clusters, with slices on or off.
async fn skewed(replicas: u32, slicing: &str) -> f64 {
    synced_rate(FleetOptions {
        replicas,
        clusters: 16,
        apps: 2000,
        hot_percent: Some(60),
        args: vec![format!("--slicing={slicing}"), "--cluster-qps=10".into()],
        ..throughput_options()
    })
    .await
}

// ---------------------------------------------------------------- memory

/// Peak resident set (VmHWM) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    shardwise_e2e::procfs::peak_resident_bytes(pid).unwrap()
}

async fn memory(replicas: u32) -> Memory {
    const APPS: u32 = 20_000;
    let fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas,
        clusters: 40,
        apps: APPS,
        fast: false,
        realistic_apps: true,
        // The same generous limits for both runs, only so that 20,000 apps sync in minutes.
        args: [
            "--kube-qps=1000",
            "--kube-burst=2000",
            "--planner-qps=2000",
            "--planner-burst=4000",
        ]
        .map(String::from)
        .to_vec(),
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, APPS as usize).await;
    let mut chosen = 0;
    for (&ordinal, replica) in &fleet.replicas {
        let m = scrape(&replica.metrics_url).await.unwrap();
        if replicas == 1 || m.sum("shardwise_planner_leader", &[]) == 0.0 {
            chosen = ordinal;
            break;
        }
    }
    let peak = peak_rss(fleet.replicas[&chosen].pid());
    let metrics = scrape(&fleet.replicas[&chosen].metrics_url).await.unwrap();
    let owned = metrics.sum("shardwise_owned_items", &[]);
    let cache = Cached {
        objects: metrics.sum("shardwise_cached_objects", &[]),
        bytes: metrics.sum("shardwise_cached_bytes", &[]),
    };
    eprintln!(
        "memory: replica {chosen} of {replicas} owns {owned} apps, caches {} objects in {:.1} MiB, peak RSS {:.1} MiB",
        cache.objects,
        cache.bytes / 1048576.0,
        peak as f64 / 1048576.0
    );
    Memory {
        chosen,
        peak,
        owned,
        cache,
    }
}

/// What one replica's caches of its clusters held.
struct Cached {
    objects: f64,
    /// Their compact JSON.
    bytes: f64,
}

/// One replica's peak memory and what it owned and cached at the end.
struct Memory {
    chosen: u32,
    peak: u64,
    owned: f64,
    cache: Cached,
}

// ---------------------------------------------------------------- handoff

/// Every cluster on a live shard, not draining, and (for those that moved since `before`)
/// probed by its new owner after `since`.
async fn owned_again(
    clusters: &kube::Api<shardwise_api::FleetCluster>,
    live: &[u32],
    before: &BTreeMap<String, u32>,
    since: jiff::Timestamp,
) -> Result<usize, String> {
    let list = clusters
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut moved = 0;
    for c in &list.items {
        let shard = shard_label(c).ok_or("unlabelled cluster")?;
        if !live.contains(&shard) || c.annotations().contains_key(DRAIN_TO_ANNOTATION) {
            return Err(format!(
                "{} on {shard}, draining {:?}",
                c.name_any(),
                c.annotations().get(DRAIN_TO_ANNOTATION)
            ));
        }
        if before.get(&c.name_any()) != Some(&shard) {
            moved += 1;
            let status = c.status.clone().unwrap_or_default();
            let probed = status.last_probe_time.is_some_and(|t| t.0 >= since);
            if status.shard != Some(shard) || !probed {
                return Err(format!(
                    "{} not yet taken up by shard {shard}",
                    c.name_any()
                ));
            }
        }
    }
    Ok(moved)
}

async fn labels(fleet: &Fleet) -> (BTreeMap<String, u32>, BTreeMap<String, u32>) {
    let clusters = cluster_labels(&fleet.clusters_api()).await;
    let apps = fleet.apps_api().list(&ListParams::default()).await.unwrap();
    // An app's owner is its cluster's (or slice's): apps carry no shard label.
    let placement = fleet.placement().await.unwrap();
    let of = |items: Vec<_>| -> BTreeMap<String, u32> {
        items
            .into_iter()
            .filter_map(|o: shardwise_api::FleetApp| Some((o.name_any(), placement.owner_of(&o)?)))
            .collect()
    };
    (clusters, of(apps.items))
}

struct Handoff {
    what: &'static str,
    seconds: f64,
    clusters_moved: usize,
    apps_moved: usize,
    in_flight: usize,
}

async fn measure(
    fleet: &Fleet,
    what: &'static str,
    live: &[u32],
    before: (BTreeMap<String, u32>, BTreeMap<String, u32>),
    t0: Instant,
    since: jiff::Timestamp,
) -> Handoff {
    let clusters = fleet.clusters_api();
    let clusters_moved = wait_for(&format!("{what}: every cluster owned again"), LONG, || {
        owned_again(&clusters, live, &before.0, since)
    })
    .await
    .unwrap();
    let seconds = t0.elapsed().as_secs_f64();
    fleet.wait_settled(live, LONG).await.unwrap();
    let after = labels(fleet).await;
    let apps_moved = after
        .1
        .iter()
        .filter(|(name, shard)| before.1.get(*name) != Some(*shard))
        .count();
    eprintln!(
        "handoff: {what}: every cluster owned again after {seconds:.2} s ({clusters_moved} clusters, {apps_moved} apps moved)"
    );
    Handoff {
        what,
        seconds,
        clusters_moved,
        apps_moved,
        in_flight: 0,
    }
}

async fn handoff() -> (Vec<Handoff>, usize) {
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 4,
        clusters: 40,
        apps: 2000,
        fast: false,
        audit: true,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();
    let mut deaths = BTreeMap::new();
    let mut rows = Vec::new();

    // Graceful scale-down 4 -> 3.
    let before = labels(&fleet).await;
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    fleet.scale(3).await.unwrap();
    fleet.stop_replica(3).await.unwrap();
    rows.push(
        measure(
            &fleet,
            "graceful scale-down (SIGTERM)",
            &[0, 1, 2],
            before,
            t0,
            since,
        )
        .await,
    );
    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();

    // SIGKILL.
    let before = labels(&fleet).await;
    let pid = fleet.replicas[&1].pid();
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    fleet.kill_replica(1).unwrap();
    deaths.insert(pid, audit::now_nanos());
    let mut row = measure(&fleet, "SIGKILL", &[0, 2, 3], before, t0, since).await;
    row.in_flight = audit::read(&fleet.audit_files(), "cluster")
        .unwrap()
        .iter()
        .filter(|i| i.pid == pid && i.end.is_none())
        .count();
    rows.push(row);
    fleet.spawn_replica(1).await.unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();

    // Partition of replica 2 from the control plane.
    let before = labels(&fleet).await;
    let identity = format!("{STATEFULSET}-2");
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    fleet.env.control_plane().partition(&identity).unwrap();
    let mut row = measure(&fleet, "partition", &[0, 1, 3], before, t0, since).await;
    let replica = scrape(&fleet.replicas[&2].metrics_url).await.unwrap();
    row.in_flight = replica.sum("shardwise_reconciles_total", &[("result", "cancelled")]) as usize;
    rows.push(row);
    fleet.env.control_plane().heal(&identity).unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();

    let overlaps = audit::overlaps(
        &audit::read(&fleet.audit_files(), "cluster").unwrap(),
        &deaths,
    )
    .len();
    (rows, overlaps)
}

// ---------------------------------------------------------------- chart

/// The chart section's fleet, on both sides: clusters on one destination, and apps over them.
const CHART_CLUSTERS: u32 = 20;
const CHART_APPS: u32 = 1000;

/// What the chart section measures on one side.
struct Rollout {
    /// From `helm install` to every app Synced (the real side only).
    install_to_synced: Option<f64>,
    /// Scale-down 3 -> 2: until every cluster is owned again by a live replica.
    scale_down: f64,
    /// A rolling replacement of the 3 replicas, highest first: until the last is Ready and every
    /// cluster owned again.
    rolling: f64,
    /// The longest any cluster went without a live, non-draining owner during the rollout.
    rolling_longest: Duration,
}

/// Each cluster's shard label.
async fn cluster_labels(api: &kube::Api<shardwise_api::FleetCluster>) -> BTreeMap<String, u32> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| Some((c.name_any(), shard_label(&c)?)))
        .collect()
}

/// The chart installed with helm on a node: the real StatefulSet controller runs the replicas.
async fn chart_real() -> Rollout {
    use support::chart::{
        NAMESPACE, RELEASE, Sampler, VALUES, add_fleet, environment, helm, install, kubectl,
    };
    let env = environment();
    let cp = env.control_plane();
    let admin = cp.client("admin").await.unwrap();
    // The CRDs and the fleet first, so that the clock starts at `helm install` (which leaves
    // CRDs that exist alone).
    for crd in std::fs::read_dir(support::repo_file("charts/shardwise/crds")).unwrap() {
        cp.apply_file("admin", &crd.unwrap().path()).await.unwrap();
    }
    cp.apply_yaml(
        "admin",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n"),
    )
    .await
    .unwrap();
    add_fleet(&env, CHART_CLUSTERS, 0..CHART_APPS).await;
    let apps: kube::Api<shardwise_api::FleetApp> = kube::Api::namespaced(admin.clone(), NAMESPACE);
    let t0 = Instant::now();
    install(&env, &[]).await;
    wait_for("every app Synced", LONG, || async {
        let list = apps
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let synced = list.items.iter().filter(|a| is_synced(a)).count();
        if synced == CHART_APPS as usize {
            Ok(())
        } else {
            Err(format!("{synced} Synced"))
        }
    })
    .await
    .unwrap();
    let install_to_synced = t0.elapsed().as_secs_f64();
    eprintln!("chart: helm install to {CHART_APPS} apps Synced in {install_to_synced:.1} s");

    let clusters: kube::Api<shardwise_api::FleetCluster> =
        kube::Api::namespaced(admin.clone(), NAMESPACE);
    let before = cluster_labels(&clusters).await;
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    kubectl(&env, &["scale", "statefulset", RELEASE, "--replicas=2"]);
    wait_for("scale-down: every cluster owned again", LONG, || {
        owned_again(&clusters, &[0, 1], &before, since)
    })
    .await
    .unwrap();
    let scale_down = t0.elapsed().as_secs_f64();
    kubectl(&env, &["scale", "statefulset", RELEASE, "--replicas=3"]);
    let sets: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
        kube::Api::namespaced(admin.clone(), NAMESPACE);
    let rolled_out = |revision_changed: bool| {
        let sets = sets.clone();
        async move {
            let status = sets
                .get(RELEASE)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let done = status.ready_replicas == Some(3)
                && status.updated_replicas == Some(3)
                && (!revision_changed || status.current_revision == status.update_revision);
            if done {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        }
    };
    wait_for("3 replicas Ready", LONG, || rolled_out(false))
        .await
        .unwrap();
    let before = cluster_labels(&clusters).await;
    wait_for("every cluster owned on 3", LONG, || {
        owned_again(&clusters, &[0, 1, 2], &before, since)
    })
    .await
    .unwrap();

    let sampler = Sampler::start(admin.clone(), NAMESPACE, RELEASE);
    let before = cluster_labels(&clusters).await;
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    let chart = support::repo_file("charts/shardwise");
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--reuse-values",
        "--set-string",
        "podAnnotations.example\\.com/rollout=2",
    ];
    upgrade.extend(VALUES);
    helm(&env, &upgrade);
    wait_for("the rolling update", LONG, || rolled_out(true))
        .await
        .unwrap();
    wait_for("rolling update: every cluster owned again", LONG, || {
        owned_again(&clusters, &[0, 1, 2], &before, since)
    })
    .await
    .unwrap();
    let rolling = t0.elapsed().as_secs_f64();
    let rolling_longest = support::chart::longest_handoff(&sampler.stop().await.clusters);
    Rollout {
        install_to_synced: Some(install_to_synced),
        scale_down,
        rolling,
        rolling_longest,
    }
}

/// Whether the replica at `ready_url` (`http://host:port/readyz`) answers ready.
async fn answers_ready(ready_url: &str) -> Result<(), String> {
    let base = ready_url.trim_end_matches("/readyz");
    match support::get(base, None, None, "/readyz").await {
        (200, _) => Ok(()),
        (code, body) => Err(format!("{code}: {body}")),
    }
}

/// The same fleet with the harness playing the StatefulSet controller, as the other sections
/// run: processes started and stopped by the bench.
async fn chart_played() -> Rollout {
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 3,
        clusters: CHART_CLUSTERS,
        apps: CHART_APPS,
        fast: false,
        audit: true,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2], LONG).await.unwrap();
    let clusters = fleet.clusters_api();
    let before = cluster_labels(&clusters).await;
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    fleet.scale(2).await.unwrap();
    fleet.stop_replica(2).await.unwrap();
    wait_for("scale-down: every cluster owned again", LONG, || {
        owned_again(&clusters, &[0, 1], &before, since)
    })
    .await
    .unwrap();
    let scale_down = t0.elapsed().as_secs_f64();
    fleet.scale(3).await.unwrap();
    fleet.spawn_replica(2).await.unwrap();
    fleet.wait_settled(&[0, 1, 2], LONG).await.unwrap();

    let sampler =
        support::chart::Sampler::start(fleet.admin.clone(), support::NAMESPACE, STATEFULSET);
    let before = cluster_labels(&clusters).await;
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    // As the StatefulSet controller rolls: highest ordinal first, the next once it is Ready.
    for ordinal in [2, 1, 0] {
        fleet.stop_replica(ordinal).await.unwrap();
        fleet.spawn_replica(ordinal).await.unwrap();
        let ready = fleet.replicas[&ordinal].ready_url.clone();
        wait_for(&format!("replica {ordinal} Ready"), LONG, || {
            answers_ready(&ready)
        })
        .await
        .unwrap();
    }
    wait_for("rollout: every cluster owned again", LONG, || {
        owned_again(&clusters, &[0, 1, 2], &before, since)
    })
    .await
    .unwrap();
    let rolling = t0.elapsed().as_secs_f64();
    let rolling_longest = support::chart::longest_handoff(&sampler.stop().await.clusters);
    Rollout {
        install_to_synced: None,
        scale_down,
        rolling,
        rolling_longest,
    }
}

// ---------------------------------------------------------------- measured load

const FAST_LATENCY: Duration = Duration::from_millis(5);
const SLOW_LATENCY: Duration = Duration::from_millis(50);
/// The destination the slow clusters are moved to.
const SLOW: usize = 2;

/// Each live replica's measured busy seconds per second, by shard.
async fn busy_per_shard(fleet: &Fleet) -> BTreeMap<u32, f64> {
    let mut busy = BTreeMap::new();
    for &ordinal in fleet.replicas.keys() {
        if let Ok(m) = fleet.scrape(ordinal).await {
            busy.insert(
                ordinal,
                m.sum(
                    "shardwise_measured_busy_seconds_per_second",
                    &[("shard", &ordinal.to_string())],
                ),
            );
        }
    }
    busy
}

fn max_over_mean(values: &BTreeMap<u32, f64>) -> f64 {
    let mean = values.values().sum::<f64>() / values.len().max(1) as f64;
    let max = values.values().copied().fold(0.0, f64::max);
    if mean > 0.0 { max / mean } else { 1.0 }
}

/// The fleet's busy time per shard averaged over `samples` reads 10 s apart.
async fn sampled_busy(fleet: &Fleet, samples: u32) -> BTreeMap<u32, f64> {
    let mut sum: BTreeMap<u32, f64> = BTreeMap::new();
    for i in 0..samples {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        for (shard, busy) in busy_per_shard(fleet).await {
            *sum.entry(shard).or_default() += busy / f64::from(samples);
        }
    }
    sum
}

/// Clusters whose shard differs between two placements.
fn clusters_moved(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) -> usize {
    after
        .iter()
        .filter(|(name, shard)| before.get(*name) != Some(*shard))
        .count()
}

/// Stops every replica and starts them again with `args` (new flags, all at once): each
/// starts with nothing measured, and the new planner takes the placement over as it stands.
async fn restart_with(fleet: &mut Fleet, args: &[&str]) {
    // All at once: replicas stopped one by one would hand their clusters to the others first.
    let mut stopping: Vec<_> = std::mem::take(&mut fleet.replicas).into_values().collect();
    for replica in &mut stopping {
        replica.process_mut().unwrap().terminate().unwrap();
    }
    for replica in &mut stopping {
        replica
            .process_mut()
            .unwrap()
            .wait(Duration::from_secs(60))
            .await
            .unwrap();
    }
    fleet.options.args = args.iter().map(|a| a.to_string()).collect();
    let live: Vec<u32> = (0..u32::try_from(stopping.len()).unwrap()).collect();
    for &ordinal in &live {
        fleet.spawn_replica(ordinal).await.unwrap();
    }
    fleet.wait_settled(&live, LONG).await.unwrap();
}

struct MeasuredRow {
    model: &'static str,
    busy: BTreeMap<u32, f64>,
    apps: BTreeMap<u32, f64>,
    moves: usize,
    seconds: f64,
}

async fn owned_apps(fleet: &Fleet) -> BTreeMap<u32, f64> {
    let (_, apps) = labels(fleet).await;
    let mut per_shard = BTreeMap::new();
    for shard in apps.values() {
        *per_shard.entry(*shard).or_default() += 1.0;
    }
    per_shard
}

async fn measured() -> (Vec<MeasuredRow>, usize) {
    let flags = |model: &'static str| {
        vec![
            "--resync-interval=10s",
            "--probe-interval=5s",
            "--plan-interval=5s",
            "--converge-interval=5s",
            "--load-smoothing=30s",
            "--log=info,kube=warn",
            model,
        ]
    };
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 4,
        clusters: 40,
        apps: 1000,
        destinations: 3,
        fast: false,
        audit: true,
        destination_latency: Some(FAST_LATENCY),
        args: flags("--load-model=apps")
            .iter()
            .map(|a| a.to_string())
            .collect(),
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();

    // Four clusters of shard 0 and four of shard 1 move to the slow destination; every other
    // cluster to one of the fast ones.
    let (clusters, _) = labels(&fleet).await;
    let mut slow = Vec::new();
    for shard in [0, 1] {
        let mut on_shard: Vec<&String> = clusters
            .iter()
            .filter(|&(_, s)| *s == shard)
            .map(|(name, _)| name)
            .collect();
        on_shard.sort_by_key(|name| name[8..].parse::<u32>().unwrap());
        slow.extend(on_shard.into_iter().take(4).cloned());
    }
    assert_eq!(slow.len(), 8, "shards 0 and 1 own at least 4 clusters each");
    for (i, name) in clusters.keys().enumerate() {
        let destination = if slow.contains(name) { SLOW } else { i % 2 };
        let patch = serde_json::json!({"spec": {
            "server": fleet.destination_url(destination),
            "credentials": {"secretRef": {"name": format!("dest-{destination}-credentials")}},
        }});
        fleet
            .clusters_api()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    fleet.env.destinations()[SLOW]
        .set_latency(support::DESTINATION_IDENTITY, SLOW_LATENCY)
        .unwrap();
    eprintln!("measured: slow clusters {slow:?}");

    let mut rows = Vec::new();
    let placed = labels(&fleet).await.0;
    restart_with(&mut fleet, &flags("--load-model=apps")).await;
    // Two windows of measurement, then a minute of samples.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let busy = sampled_busy(&fleet, 7).await;
    eprintln!("measured: apps model: busy per shard {busy:?}");
    rows.push(MeasuredRow {
        model: "apps",
        busy,
        apps: owned_apps(&fleet).await,
        moves: clusters_moved(&placed, &labels(&fleet).await.0),
        seconds: 0.0,
    });

    let placed = labels(&fleet).await.0;
    restart_with(&mut fleet, &flags("--load-model=measured")).await;
    let started = Instant::now();
    // Converged: three reads in a row, 10 s apart, within 1.20.
    let mut within = 0;
    while within < 3 {
        assert!(started.elapsed() < LONG, "measured load did not converge");
        tokio::time::sleep(Duration::from_secs(10)).await;
        let busy = busy_per_shard(&fleet).await;
        let balance = max_over_mean(&busy);
        eprintln!(
            "measured: {:.0} s: busy max/mean {balance:.3} {busy:?}",
            started.elapsed().as_secs_f64()
        );
        // Every shard measured: a replica that just started reports nothing yet.
        let measured = busy.len() == 4 && busy.values().all(|&b| b > 0.0);
        within = if balance <= 1.20 && measured {
            within + 1
        } else {
            0
        };
    }
    let seconds = started.elapsed().as_secs_f64();
    fleet.wait_settled(&[0, 1, 2, 3], LONG).await.unwrap();
    let busy = sampled_busy(&fleet, 7).await;
    rows.push(MeasuredRow {
        model: "measured",
        busy,
        apps: owned_apps(&fleet).await,
        moves: clusters_moved(&placed, &labels(&fleet).await.0),
        seconds,
    });
    let overlaps = audit::overlaps(
        &audit::read(&fleet.audit_files(), "cluster").unwrap(),
        &BTreeMap::new(),
    )
    .len();
    (rows, overlaps)
}

// ---------------------------------------------------------------- main

// ---------------------------------------------------------------- cache

/// Writes of the controller's identity to every destination since `since`.
fn controller_writes_since(fleet: &Fleet, since: std::time::SystemTime) -> usize {
    fleet
        .env
        .destinations()
        .iter()
        .flat_map(|d| d.writes())
        .filter(|w| w.identity == DESTINATION_IDENTITY && w.at >= since)
        .count()
}

/// App reconciles so far, over every replica.
async fn app_reconciles(fleet: &Fleet) -> f64 {
    let mut total = 0.0;
    for replica in fleet.replicas.values() {
        let m = scrape(&replica.metrics_url).await.unwrap();
        total += m.sum("shardwise_reconciles_total", &[("kind", "app")]);
    }
    total
}

/// What the caches of the clusters buy at rest and against drift.
struct AtRest {
    apps: u32,
    window: Duration,
    looks: f64,
    writes: usize,
    /// Seconds from each hand edit or deletion until the object was as declared again.
    repairs: Vec<f64>,
}

/// 3 replicas, 40 clusters, 5,000 apps: destination writes while every app is looked at again
/// every 30 s with nothing changing; then, at the default resync (an hour), 60 managed objects
/// edited (30) or deleted (30) by hand on their clusters, one after the other, each timed until
/// repaired.
async fn at_rest() -> AtRest {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use kube::api::{DeleteParams, Patch, PatchParams};

    const APPS: u32 = 5000;
    const WINDOW: Duration = Duration::from_secs(120);
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 3,
        clusters: 40,
        apps: APPS,
        fast: false,
        args: ["--resync-interval=30s"].map(String::from).to_vec(),
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, APPS as usize).await;
    fleet.wait_settled(&[0, 1, 2], LONG).await.unwrap();
    let looked_before = app_reconciles(&fleet).await;
    let since = std::time::SystemTime::now();
    tokio::time::sleep(WINDOW).await;
    let writes = controller_writes_since(&fleet, since);
    let looks = app_reconciles(&fleet).await - looked_before;
    eprintln!(
        "cache: {writes} destination writes in {} s while {looks} app reconciles ran",
        WINDOW.as_secs()
    );

    restart_with(&mut fleet, &[]).await;
    let mut repairs = Vec::new();
    for n in 0..60u32 {
        let i = (n * 83) % APPS;
        let destination = fleet.cluster_of_app(i) as usize % fleet.env.destinations().len();
        let client = fleet.env.destinations()[destination]
            .client("admin")
            .await
            .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client, &format!("team-{}", i % 5));
        let name = format!("app-{i}");
        let t0 = Instant::now();
        if n % 2 == 0 {
            let edit = serde_json::json!({"data": {"generation": "edited by hand"}});
            cms.patch(&name, &PatchParams::default(), &Patch::Merge(&edit))
                .await
                .unwrap();
        } else {
            cms.delete(&name, &DeleteParams::default()).await.unwrap();
        }
        let poll = shardwise_e2e::Poll {
            interval: Duration::from_millis(20),
            ..shardwise_e2e::Poll::timeout(Duration::from_secs(60))
        };
        shardwise_e2e::wait_with(&format!("{name} repaired"), poll, || async {
            match cms.get_opt(&name).await.map_err(|e| e.to_string())? {
                Some(cm) if cm.data.as_ref().is_some_and(|d| d["generation"] == "1") => Ok(()),
                other => Err(format!("{:?}", other.map(|c| c.data))),
            }
        })
        .await
        .unwrap();
        repairs.push(t0.elapsed().as_secs_f64());
    }
    AtRest {
        apps: APPS,
        window: WINDOW,
        looks,
        writes,
        repairs,
    }
}

/// The p-th percentile (0-100) of `values`, nearest rank.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// 2 replicas, 2 clusters of `per_cluster` apps each, one per replica; replica 1 stopped
/// gracefully (a scale-down): seconds until its cluster is owned again by replica 0, and until
/// replica 0's cache holds every object of both clusters (the warm-up of the moved cluster's).
async fn cached_handoff(per_cluster: u32) -> (f64, f64) {
    let mut args = support::raised_client_limits();
    args.push("--slicing=off".into());
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 2,
        clusters: 2,
        apps: 2 * per_cluster,
        fast: false,
        args,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, 2 * per_cluster as usize).await;
    fleet.wait_settled(&[0, 1], LONG).await.unwrap();
    let before = labels(&fleet).await;
    if before
        .0
        .values()
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        != 2
    {
        panic!("the two clusters are not on two shards: {:?}", before.0);
    }
    let (t0, since) = (Instant::now(), jiff::Timestamp::now());
    fleet.scale(1).await.unwrap();
    fleet.stop_replica(1).await.unwrap();
    let clusters = fleet.clusters_api();
    wait_for("the cluster of replica 1 owned again", LONG, || {
        owned_again(&clusters, &[0], &before.0, since)
    })
    .await
    .unwrap();
    let owned = t0.elapsed().as_secs_f64();
    let url = fleet.replicas[&0].metrics_url.clone();
    wait_for("replica 0's cache warm", LONG, || async {
        let m = scrape(&url).await.map_err(|e| e.to_string())?;
        let cached = m.sum("shardwise_cached_objects", &[]);
        if cached >= f64::from(2 * per_cluster) {
            Ok(())
        } else {
            Err(format!("{cached} objects cached"))
        }
    })
    .await
    .unwrap();
    let warm = t0.elapsed().as_secs_f64();
    eprintln!(
        "cache: a cluster of {per_cluster} apps owned again after {owned:.2} s, its cache warm after {warm:.2} s"
    );
    (owned, warm)
}

// ---------------------------------------------------------------- moves

/// The apps of the cluster the `moves` section moves.
const MOVED_APPS: u32 = 10_000;

/// What one move of a big cluster cost, and how soon new apps were reconciled after it.
struct Move {
    /// Seconds from the owner's SIGTERM until the cluster's record names the other replica.
    owned_again: f64,
    /// Seconds from the SIGTERM until the other replica has reconciled every app of the
    /// cluster again, its queue empty.
    reconciled: f64,
    /// The controller's writes to the control plane during the move, by method and resource
    /// (its Lease renewals apart).
    control_plane: BTreeMap<String, usize>,
    lease_renewals: usize,
    /// The controller's writes to the destinations during the move.
    destination: usize,
    /// Seconds from the creation of each new app until it was Synced.
    new_apps: Vec<f64>,
}

/// `METHOD resource[/subresource]` of a request path, for a breakdown of writes.
fn write_kind(method: &str, path: &str) -> String {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    // .../namespaces/<ns>/<resource>/<name>[/<subresource>]
    let resource = parts
        .iter()
        .position(|p| *p == "namespaces")
        .and_then(|i| parts.get(i + 2..))
        .map_or_else(
            || parts.last().copied().unwrap_or_default().to_string(),
            |rest| match rest {
                [resource, _, sub, ..] => format!("{resource}/{sub}"),
                [resource, ..] => (*resource).to_string(),
                [] => String::new(),
            },
        );
    format!("{method} {resource}")
}

/// 2 replicas; a cluster of 10,000 apps and one of 2,500, one on each (slicing off, client
/// limits raised); the big cluster's owner stopped gracefully. Counts the controller's writes
/// until the other replica has reconciled every moved app again, then times 20 new apps from
/// creation to Synced.
async fn cluster_move() -> Move {
    let apps = MOVED_APPS * 5 / 4;
    let mut args = support::raised_client_limits();
    args.push("--slicing=off".into());
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 2,
        clusters: 2,
        apps,
        hot_percent: Some(80),
        fast: false,
        args,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, apps as usize).await;
    fleet.wait_settled(&[0, 1], LONG).await.unwrap();
    let placement = fleet.placement().await.unwrap();
    let owner = placement.clusters["cluster-0"][0].1;
    let other = 1 - owner;
    assert_ne!(
        placement.clusters["cluster-1"][0].1, owner,
        "each replica holds one cluster: {placement:?}"
    );
    let metrics = fleet.replicas[&other].metrics_url.clone();
    let reconciles =
        |m: &shardwise_e2e::Metrics| m.sum("shardwise_reconciles_total", &[("kind", "app")]);
    let before = reconciles(&scrape(&metrics).await.unwrap());

    let (t0, since) = (Instant::now(), std::time::SystemTime::now());
    fleet.stop_replica(owner).await.unwrap();
    wait_for("the big cluster owned again", LONG, || async {
        let placement = fleet.placement().await.map_err(|e| e.to_string())?;
        match placement.clusters.get("cluster-0").map(|s| s[0]) {
            Some((_, shard, false)) if shard == other => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await
    .unwrap();
    let owned_again = t0.elapsed().as_secs_f64();
    wait_for("every moved app reconciled again", LONG, || async {
        let m = scrape(&metrics).await.map_err(|e| e.to_string())?;
        let done = reconciles(&m) - before;
        let queued = m.sum("shardwise_queue_depth", &[("kind", "app")]);
        if done >= f64::from(MOVED_APPS) && queued == 0.0 {
            Ok(())
        } else {
            Err(format!("{done} reconciled since the stop, {queued} queued"))
        }
    })
    .await
    .unwrap();
    let reconciled = t0.elapsed().as_secs_f64();

    let mut control_plane = BTreeMap::new();
    let mut lease_renewals = 0;
    for w in fleet.env.control_plane().writes() {
        if w.at < since || !w.identity.starts_with(STATEFULSET) {
            continue;
        }
        if w.path.contains("/leases/") {
            lease_renewals += 1;
        } else {
            *control_plane
                .entry(write_kind(&w.method, &w.path))
                .or_insert(0) += 1;
        }
    }
    let destination = controller_writes_since(&fleet, since);
    eprintln!(
        "moves: cluster-0 ({MOVED_APPS} apps) owned again after {owned_again:.2} s, reconciled after {reconciled:.2} s; writes {control_plane:?}, {lease_renewals} lease renewals, {destination} to destinations"
    );

    let api = fleet.apps_api();
    let mut new_apps = Vec::new();
    for i in apps..apps + 20 {
        let created = Instant::now();
        fleet.create_apps(i..i + 1).await.unwrap();
        let name = format!("app-{i}");
        wait_for(&format!("{name} Synced"), LONG, || async {
            let app = api.get(&name).await.map_err(|e| e.to_string())?;
            match app.status.and_then(|s| s.sync_phase) {
                Some(SyncPhase::Synced) => Ok(()),
                phase => Err(format!("{phase:?}")),
            }
        })
        .await
        .unwrap();
        new_apps.push(created.elapsed().as_secs_f64());
    }
    Move {
        owned_again,
        reconciled,
        control_plane,
        lease_renewals,
        destination,
        new_apps,
    }
}

// ---------------------------------------------------------------- scale

/// The `scale` section's fleet: Argo CD's largest published test by default, 50,000 apps on
/// 500 clusters at 3, 6, 9 and 12 replicas; `--apps=N` (a cluster per 100 apps) and
/// `--replicas=3,6` make a smaller one.
struct ScaleSize {
    apps: u32,
    clusters: u32,
    replicas: Vec<u32>,
}

impl ScaleSize {
    fn from_args(args: &[String]) -> Result<Self, String> {
        let value = |flag: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("{flag}=")).map(str::to_string))
        };
        let apps = match value("--apps") {
            Some(n) => n
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 100)
                .ok_or_else(|| format!("--apps={n}: a whole number of at least 100"))?,
            None => 50_000,
        };
        let replicas = match value("--replicas") {
            Some(list) => list
                .split(',')
                .map(|n| n.trim().parse::<u32>().ok().filter(|n| *n >= 1))
                .collect::<Option<Vec<u32>>>()
                .filter(|r| !r.is_empty())
                .ok_or_else(|| {
                    format!("--replicas={list}: replica counts of at least 1, comma-separated")
                })?,
            None => vec![3, 6, 9, 12],
        };
        Ok(Self {
            apps,
            clusters: apps / 100,
            replicas,
        })
    }
}

/// The user the controllers' replicas send their requests as.
const CONTROLLER_USER: &str = "system:serviceaccount:shardwise:shardwise";
/// The user the bench's own requests (its watch of the apps, its reads) are sent as.
const BENCH_USER: &str = "admin";

/// One run of the `scale` section.
struct ScaleRun {
    replicas: u32,
    /// Seconds from the first replica's start until every app is Synced.
    seconds: f64,
    /// The planner's peak resident size, and its latest pass's decision time.
    planner_rss: u64,
    planner_pass: f64,
    /// CPU seconds the controller processes used, over the run's wall time: the cores they kept
    /// busy (2 on this machine at most, the API servers' share apart).
    controller_cores: f64,
    /// What the control plane served from the replicas' start until every app was Synced.
    cost: shardwise_e2e::ControlPlaneCost,
}

/// `apps` apps on `clusters` clusters, `replicas` replicas, on kube-apiserver and etcd, the
/// throughput section's settings (10 ms on every destination request, default workers and
/// limits), audited; the bench follows the apps with one watch.
async fn scale(replicas: u32, size: &ScaleSize) -> ScaleRun {
    let fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas,
        clusters: size.clusters,
        apps: size.apps,
        audit: true,
        // Measured: a fleet whose apps have their tokens, as after the planner's first pass
        // over them. Without, the planner's 50,000 first writes at --planner-qps (200/s) bound
        // the run from 6 replicas on (docs/benchmarks.md).
        tokened_apps: true,
        ..throughput_options()
    })
    .await
    .unwrap();
    let before = fleet.env.control_plane_reading().await.unwrap();
    wait_synced(&fleet, size.apps as usize).await;
    let seconds = fleet.started.elapsed().as_secs_f64();
    let after = fleet.env.control_plane_reading().await.unwrap();
    let cost = after.cost_since(&before, &fleet.env);
    let planner = fleet.planner(LONG).await.unwrap();
    let metrics = scrape(&fleet.replicas[&planner].metrics_url).await.unwrap();
    let planner_pass = metrics.sum("shardwise_planner_pass_seconds", &[]);
    let planner_rss = peak_rss(fleet.replicas[&planner].pid());
    let cpu: f64 = fleet
        .replicas
        .values()
        .map(|r| shardwise_e2e::procfs::cpu_seconds(r.pid()))
        .sum();
    fleet.audited_without_overlap();
    eprintln!(
        "scale: {replicas} replicas, {} apps Synced in {seconds:.1} s; kube-apiserver {:.1} CPU s, etcd {:.1} CPU s, {:.0} requests",
        size.apps,
        cost.apiserver_cpu,
        cost.etcd_cpu,
        cost.total_requests()
    );
    ScaleRun {
        replicas,
        seconds,
        planner_rss,
        planner_pass,
        controller_cores: cpu / seconds,
        cost,
    }
}

/// The `scale` section's tables: time, rate, efficiency and what the control plane spent per
/// app synced, then the requests per app by kind and sender.
fn print_scale(size: &ScaleSize, runs: &[ScaleRun], failures: &mut Vec<String>) {
    let apps = f64::from(size.apps);
    let base = runs
        .iter()
        .find(|r| r.replicas == 3)
        .map(|r| apps / r.seconds / 3.0);
    println!(
        "\n### Argo CD's largest published test: {} apps on {} clusters (10 ms per destination request, default workers and limits; on kube-apiserver and etcd)\n",
        size.apps, size.clusters
    );
    println!(
        "| replicas | all Synced after | apps/s | efficiency against 3 | kube-apiserver CPU per app | etcd CPU per app | requests per app (controllers) | etcd log bytes per app | controller CPU (cores) | kube-apiserver CPU (cores) | planner peak RSS | planner pass |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        let rate = apps / r.seconds;
        let efficiency = base.map(|b| rate / f64::from(r.replicas) / b);
        let controllers: u64 = r.cost.requests_of(|u| u == CONTROLLER_USER).values().sum();
        println!(
            "| {} | {:.1} s | {rate:.0} | {} | {:.2} ms | {:.2} ms | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} MiB | {:.3} s |",
            r.replicas,
            r.seconds,
            efficiency.map_or("-".to_string(), |e| format!("**{e:.2}**")),
            r.cost.apiserver_cpu / apps * 1000.0,
            r.cost.etcd_cpu / apps * 1000.0,
            controllers as f64 / apps,
            r.cost.etcd_wal_bytes / apps,
            r.controller_cores,
            r.cost.apiserver_cpu / r.seconds,
            r.planner_rss as f64 / 1_048_576.0,
            r.planner_pass,
        );
        if r.replicas == 12
            && let Some(e) = efficiency
            && e < 0.8
        {
            failures.push(format!("scale: efficiency at 12 replicas {e:.2} < 0.8"));
        }
    }
    println!("\nEvery run audited: no two replicas reconciled one cluster at once.");

    // Requests per app synced, by kind: the controllers' at each replica count, then the
    // bench's and the server's own (its identity leases) at the first.
    let senders: Vec<(String, BTreeMap<shardwise_e2e::RequestKind, u64>)> = runs
        .iter()
        .map(|r| {
            (
                format!("controllers, {} replicas", r.replicas),
                r.cost.requests_of(|u| u == CONTROLLER_USER),
            )
        })
        .chain(runs.first().map(|r| {
            (
                format!("the bench, {} replicas", r.replicas),
                r.cost.requests_of(|u| u == BENCH_USER),
            )
        }))
        .chain(runs.first().map(|r| {
            (
                format!("others, {} replicas", r.replicas),
                r.cost
                    .requests_of(|u| u != BENCH_USER && u != CONTROLLER_USER),
            )
        }))
        .collect();
    let kinds: std::collections::BTreeSet<&shardwise_e2e::RequestKind> =
        senders.iter().flat_map(|(_, k)| k.keys()).collect();
    println!(
        "\nRequests per app synced, by verb and resource (the control plane's audit log, every request received from the replicas' start until every app was Synced):\n"
    );
    println!(
        "| verb | resource | {} |",
        senders
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|{}", "---:|".repeat(senders.len()));
    for kind in kinds {
        let cells: Vec<String> = senders
            .iter()
            .map(|(_, k)| {
                format!(
                    "{:.4}",
                    k.get(kind).copied().unwrap_or_default() as f64 / apps
                )
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            kind.verb,
            kind.resource,
            cells.join(" | ")
        );
    }
}

// ---------------------------------------------------------------- managers

const MANAGER_APPS: u32 = 2000;
/// Rounds of new terms: each restarts both replicas, changes every app and waits until every
/// one is Synced again.
const MANAGER_ROUNDS: u32 = 5;

/// One run of the `managers` section: the last round's cost and what the apps look like then.
struct ManagersRun {
    /// The last round: from the apps' change until every one is Synced.
    seconds: f64,
    cost: shardwise_e2e::ControlPlaneCost,
    /// Per app at the end: its JSON as the server serves it, and its `managedFields` entries.
    bytes: f64,
    entries: f64,
}

/// 2,000 apps on 20 clusters, 2 replicas, through [`MANAGER_ROUNDS`] rounds of new terms, with
/// the controller naming its field manager or (`per_term`, the defect seeded in the same
/// binary) leaving it to the server, which names it after each term's User-Agent.
async fn managers(controller: &std::path::Path, per_term: bool) -> ManagersRun {
    let mut fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 2,
        clusters: 20,
        apps: MANAGER_APPS,
        controller: Some(controller.to_path_buf()),
        replica_env: if per_term {
            vec![(
                "FAILPOINTS".to_string(),
                format!(
                    "{}=return",
                    shardwise_runtime::failpoints::PER_TERM_FIELD_MANAGER
                ),
            )]
        } else {
            Vec::new()
        },
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, MANAGER_APPS as usize).await;
    let mut last = None;
    for round in 0..MANAGER_ROUNDS {
        for ordinal in [0, 1] {
            fleet.stop_replica(ordinal).await.unwrap();
            fleet.spawn_replica(ordinal).await.unwrap();
        }
        fleet.wait_settled(&[0, 1], LONG).await.unwrap();
        let before = fleet.env.control_plane_reading().await.unwrap();
        let started = Instant::now();
        fleet.update_apps(0..MANAGER_APPS, round + 2).await.unwrap();
        wait_synced(&fleet, MANAGER_APPS as usize).await;
        let seconds = started.elapsed().as_secs_f64();
        let after = fleet.env.control_plane_reading().await.unwrap();
        last = Some((seconds, after.cost_since(&before, &fleet.env)));
    }
    let (seconds, cost) = last.expect("at least one round");
    let apps = fleet.apps_api().list(&ListParams::default()).await.unwrap();
    let bytes: usize = apps
        .items
        .iter()
        .map(|app| serde_json::to_vec(app).map_or(0, |json| json.len()))
        .sum();
    let entries: usize = apps
        .items
        .iter()
        .map(|app| app.metadata.managed_fields.as_ref().map_or(0, Vec::len))
        .sum();
    fleet.audited_without_overlap();
    let n = apps.items.len().max(1) as f64;
    eprintln!(
        "managers: per term {per_term}: last round {seconds:.1} s, kube-apiserver {:.1} CPU s; {:.0} bytes and {:.1} managedFields entries per app",
        cost.apiserver_cpu,
        bytes as f64 / n,
        entries as f64 / n
    );
    ManagersRun {
        seconds,
        cost,
        bytes: bytes as f64 / n,
        entries: entries as f64 / n,
    }
}

// ---------------------------------------------------------------- copies

/// Resident memory (VmRSS) of a process now, in bytes.
fn rss(pid: u32) -> u64 {
    shardwise_e2e::procfs::resident_bytes(pid).unwrap()
}

/// One replica holding 2,000 realistic apps (3 kinds) on `clusters` clusters: its resident
/// memory once every app is Synced and the fleet has been at rest for 30 s.
async fn resident_with(clusters: u32) -> u64 {
    const APPS: u32 = 2000;
    let mut args = support::raised_client_limits();
    args.push("--slicing=off".into());
    let fleet = Fleet::start(FleetOptions {
        runner: Runner::Played,
        replicas: 1,
        clusters,
        apps: APPS,
        fast: false,
        realistic_apps: true,
        args,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    wait_synced(&fleet, APPS as usize).await;
    fleet.wait_settled(&[0], LONG).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let bytes = rss(fleet.replicas[&0].pid());
    eprintln!(
        "copies: 1 replica, {APPS} apps on {clusters} clusters: {:.1} MiB resident",
        bytes as f64 / 1048576.0
    );
    bytes
}

/// What a replica pays for holding one cluster more with the same objects (a cache copy: a
/// slice of a cluster on one shard more): the same 2,000 apps on 4 clusters and then on 84,
/// the difference in resident memory over the 80 clusters added.
async fn copy_cost() -> (u64, u64, f64) {
    let few = resident_with(4).await;
    let many = resident_with(84).await;
    let per_cluster = (many as f64 - few as f64) / 80.0;
    (few, many, per_cluster)
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let named = |name: &str| wanted.iter().any(|w| w == name);
    // `scale` takes longer than the rest together: only when named (`make bench-scale`).
    let run = |name: &str| named(name) || (wanted.is_empty() && name != "scale");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scale_size = match ScaleSize::from_args(&args) {
        Ok(size) => size,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut failures = Vec::new();
    runtime.block_on(async {
        if run("throughput") {
            let one = throughput(1).await;
            let two = throughput(2).await;
            let four = throughput(4).await;
            let efficiency = |n: f64, rate: f64| rate / (n * one);
            println!("\n### Reconcile throughput (2,000 apps, 10 ms destination latency, 10 requests/s per replica to the control plane)\n");
            println!("| replicas | apps/s | scaling efficiency |");
            println!("|---:|---:|---:|");
            println!("| 1 | {one:.1} | 1.00 |");
            println!("| 2 | {two:.1} | {:.2} |", efficiency(2.0, two));
            println!("| 4 | {four:.1} | {:.2} |", efficiency(4.0, four));
            if efficiency(4.0, four) < 0.8 {
                failures.push(format!("scaling efficiency at 4 replicas {:.2} < 0.8", efficiency(4.0, four)));
            }
        }
        if run("skewed") {
            let mut rates = BTreeMap::new();
            for replicas in [1u32, 2, 4] {
                for slicing in ["off", "on"] {
                    rates.insert((replicas, slicing), skewed(replicas, slicing).await);
                }
            }
            let efficiency = |n: u32, slicing: &str| {
                rates[&(n, slicing)] / (f64::from(n) * rates[&(1, slicing)])
            };
            println!("\n### Reconcile throughput, skewed fleet (2,000 apps, 60% on one of 16 clusters, 10 ms destination latency, 10 requests/s per replica to each destination)\n");
            println!("| replicas | slices off: apps/s | efficiency | slices on: apps/s | efficiency | on / off |");
            println!("|---:|---:|---:|---:|---:|---:|");
            for n in [1u32, 2, 4] {
                let (off, on) = (rates[&(n, "off")], rates[&(n, "on")]);
                println!(
                    "| {n} | {off:.1} | {:.2} | {on:.1} | {:.2} | {:.2}x |",
                    efficiency(n, "off"),
                    efficiency(n, "on"),
                    on / off
                );
            }
            if efficiency(4, "on") < 0.8 {
                failures.push(format!("skewed fleet: scaling efficiency with slices at 4 replicas {:.2} < 0.8", efficiency(4, "on")));
            }
        }
        if run("memory") {
            let single = memory(1).await;
            let quarter = memory(4).await;
            let ratio = quarter.peak as f64 / single.peak as f64;
            let mib = |b: f64| b / 1048576.0;
            println!("\n### Peak resident memory (20,000 apps of ~2.5 KB manifests, 3 objects each, cached)\n");
            println!("| replica | owns | objects cached | their JSON | bytes per cached object | peak RSS |");
            println!("|---|---:|---:|---:|---:|---:|");
            for (m, what) in [(&single, "the only replica of 1 (also planner)".to_string()), (&quarter, format!("replica {} of 4 (not planner)", quarter.chosen))] {
                println!(
                    "| {what} | {:.0} apps | {:.0} | {:.1} MiB | {:.0} | {:.1} MiB |",
                    m.owned,
                    m.cache.objects,
                    mib(m.cache.bytes),
                    m.cache.bytes / m.cache.objects.max(1.0),
                    mib(m.peak as f64)
                );
            }
            println!("\nratio: **{ratio:.2}x** (target at most 0.30x)");
            if ratio > 0.30 {
                failures.push(format!("memory ratio {ratio:.2} > 0.30"));
            }
            if single.cache.objects < 3.0 * 20_000.0 {
                failures.push(format!("the only replica cached {} objects, not every app's 3", single.cache.objects));
            }
        }
        if run("handoff") {
            let (rows, overlaps) = handoff().await;
            println!("\n### Handoff (4 replicas, 40 clusters, 2,000 apps, default leases: 15 s / 10 s / 2 s)\n");
            println!("| disruption | every cluster owned again after | clusters moved | apps moved | reconciles in flight at the stop |");
            println!("|---|---:|---:|---:|---:|");
            for r in &rows {
                println!("| {} | {:.2} s | {} | {} | {} |", r.what, r.seconds, r.clusters_moved, r.apps_moved, r.in_flight);
            }
            println!("\nduplicated reconciles (overlapping intervals in the merged audit): **{overlaps}**");
            if overlaps > 0 {
                failures.push(format!("{overlaps} overlapping reconciles"));
            }
            if let Some(r) = rows.iter().find(|r| r.what.starts_with("graceful")) && r.seconds >= 5.0 {
                failures.push(format!("graceful handoff took {:.1} s >= 5 s", r.seconds));
            }
            if let Some(r) = rows.iter().find(|r| r.what == "SIGKILL") && r.seconds >= 20.0 {
                failures.push(format!("SIGKILL recovery took {:.1} s >= 20 s", r.seconds));
            }
        }
        if run("chart") {
            let real = chart_real().await;
            let played = chart_played().await;
            println!("\n### The chart on a real StatefulSet controller, beside the harness playing it ({CHART_APPS} apps, {CHART_CLUSTERS} clusters, 3 replicas, default leases)\n");
            println!("| measure | real StatefulSet controller (helm install) | harness-played | real / played |");
            println!("|---|---:|---:|---:|");
            println!("| `helm install` to every app Synced | {:.1} s | | |", real.install_to_synced.unwrap_or_default());
            println!("| scale-down 3 -> 2: every cluster owned again | {:.2} s | {:.2} s | {:.2}x |", real.scale_down, played.scale_down, real.scale_down / played.scale_down);
            println!("| rolling replacement of 3, highest first: done, every cluster owned | {:.1} s | {:.1} s | {:.2}x |", real.rolling, played.rolling, real.rolling / played.rolling);
            println!("| longest a cluster went without a live owner in it | {:.2} s | {:.2} s | |", real.rolling_longest.as_secs_f64(), played.rolling_longest.as_secs_f64());
            if real.scale_down >= 5.0 {
                failures.push(format!("chart: scale-down handoff took {:.1} s >= 5 s", real.scale_down));
            }
            if real.rolling_longest >= Duration::from_secs(5) {
                failures.push(format!("chart: a cluster went {:?} without an owner in the rollout", real.rolling_longest));
            }
        }
        if run("cache") {
            let rest = at_rest().await;
            let per_hour = rest.writes as f64 * 3600.0 / rest.window.as_secs_f64();
            println!("\n### Caches of the clusters: at rest, drift, handoff (3 replicas, 40 clusters, {} apps)\n", rest.apps);
            println!("| measure | figure | target |");
            println!("|---|---:|---:|");
            println!("| app reconciles in {} s at rest (resync 30 s) | {:.0} | |", rest.window.as_secs(), rest.looks);
            println!("| destination writes in those {} s | {} | |", rest.window.as_secs(), rest.writes);
            println!("| destination writes per hour at rest | {per_hour:.0} | 0 |");
            let p = |q: f64| percentile(&rest.repairs, q);
            println!("| drift repaired ({} edits and deletions), p50 / p99 / max | {:.2} s / {:.2} s / {:.2} s | p99 < 5 s |", rest.repairs.len(), p(50.0), p(99.0), p(100.0));
            if rest.writes > 0 {
                failures.push(format!("{} destination writes at rest", rest.writes));
            }
            if p(99.0) >= 5.0 {
                failures.push(format!("drift repair p99 {:.2} s >= 5 s", p(99.0)));
            }
            for per_cluster in [1000u32, 5000] {
                let (owned, warm) = cached_handoff(per_cluster).await;
                println!("| graceful handoff of a {per_cluster}-app cluster: owned again / cache warm | {owned:.2} s / {warm:.2} s | < 5 s (1,000 apps) |");
                if per_cluster == 1000 && warm >= 5.0 {
                    failures.push(format!("handoff of a 1,000-app cluster with its cache took {warm:.2} s >= 5 s"));
                }
            }
        }
        if run("moves") {
            let m = cluster_move().await;
            let writes: usize = m.control_plane.values().sum();
            println!("\n### Moving a cluster of {MOVED_APPS} apps (2 replicas, its owner stopped gracefully, slicing off, client limits raised)\n");
            println!("| measure | figure | target |");
            println!("|---|---:|---:|");
            println!("| owned again by the other replica after | {:.2} s | |", m.owned_again);
            println!("| every app of it reconciled again after | **{:.2} s** | < 10 s |", m.reconciled);
            println!("| the controller's writes to the control plane meanwhile | **{writes}** | at most 10 |");
            for (kind, n) in &m.control_plane {
                println!("| &nbsp;&nbsp;{kind} | {n} | |");
            }
            println!("| its Lease renewals meanwhile (not counted above) | {} | |", m.lease_renewals);
            println!("| its writes to the destinations meanwhile | {} | |", m.destination);
            let p = |q: f64| percentile(&m.new_apps, q);
            println!("| new apps after the move ({}), created to Synced: p50 / p99 / max | {:.2} s / {:.2} s / {:.2} s | under 2 s |", m.new_apps.len(), p(50.0), p(99.0), p(100.0));
            if writes > 10 {
                failures.push(format!("moving a {MOVED_APPS}-app cluster wrote {writes} objects of the control plane > 10"));
            }
            if m.reconciled >= 10.0 {
                failures.push(format!("moving a {MOVED_APPS}-app cluster took {:.1} s >= 10 s to reconcile", m.reconciled));
            }
            if p(100.0) >= 2.0 {
                failures.push(format!("a new app took {:.2} s >= 2 s to be Synced", p(100.0)));
            }
        }
        if run("scale") {
            let mut runs = Vec::new();
            for &replicas in &scale_size.replicas {
                runs.push(scale(replicas, &scale_size).await);
            }
            print_scale(&scale_size, &runs, &mut failures);
        }
        if run("managers") {
            let controller = shardwise_e2e::workspace_binary_with_features(
                "shardwise-controller",
                "shardwise-controller",
                "shardwise-runtime/failpoints",
            )
            .unwrap();
            let per_term = managers(&controller, true).await;
            let named = managers(&controller, false).await;
            let apps = f64::from(MANAGER_APPS);
            println!("\n### One field manager, not one per term ({MANAGER_APPS} apps, 2 replicas, {MANAGER_ROUNDS} rounds of both replicas restarted and every app changed; the last round measured)\n");
            println!("| the controller's writes name | managedFields entries per app | bytes per app | last round: all Synced after | kube-apiserver CPU per app | etcd CPU per app | etcd log bytes per app |");
            println!("|---|---:|---:|---:|---:|---:|---:|");
            for (what, r) in [("no manager (the server names one per term's User-Agent)", &per_term), ("the controller (`fieldManager=shardwise-controller`)", &named)] {
                println!(
                    "| {what} | {:.1} | {:.0} | {:.1} s | {:.2} ms | {:.2} ms | {:.0} |",
                    r.entries,
                    r.bytes,
                    r.seconds,
                    r.cost.apiserver_cpu / apps * 1000.0,
                    r.cost.etcd_cpu / apps * 1000.0,
                    r.cost.etcd_wal_bytes / apps,
                );
            }
            let ratio = |f: fn(&ManagersRun) -> f64| f(&named) / f(&per_term);
            println!(
                "\none manager against one per term: bytes per app **{:.2}x**, kube-apiserver CPU per app **{:.2}x**, etcd log bytes per app **{:.2}x**",
                ratio(|r| r.bytes),
                ratio(|r| r.cost.apiserver_cpu),
                ratio(|r| r.cost.etcd_wal_bytes),
            );
            if named.entries > per_term.entries || named.bytes >= per_term.bytes {
                failures.push(format!(
                    "one field manager: {:.1} entries and {:.0} bytes per app, against {:.1} and {:.0} with one per term",
                    named.entries, named.bytes, per_term.entries, per_term.bytes
                ));
            }
        }
        if run("copies") {
            let (few, many, per_cluster) = copy_cost().await;
            let mib = |b: u64| b as f64 / 1048576.0;
            println!("\n### What a cache copy costs (1 replica, 2,000 realistic apps, 3 kinds)\n");
            println!("| clusters | resident memory at rest |");
            println!("|---:|---:|");
            println!("| 4 | {:.1} MiB |", mib(few));
            println!("| 84 | {:.1} MiB |", mib(many));
            println!("\nper cluster held (a cache copy): **{:.0} KiB**", per_cluster / 1024.0);
        }
        if run("measured") {
            let (rows, overlaps) = measured().await;
            println!("\n### Measured load (4 replicas, 40 clusters of 25 apps, 8 of them 10x slower: 50 ms against 5 ms)\n");
            println!("| load model | busy s/s per shard | busy max/mean | apps per shard | apps max/mean | clusters moved | converged after |");
            println!("|---|---|---:|---|---:|---:|---:|");
            let show = |m: &BTreeMap<u32, f64>, digits: usize| {
                m.values().map(|v| format!("{v:.digits$}")).collect::<Vec<_>>().join(" / ")
            };
            for r in &rows {
                println!(
                    "| {} | {} | {:.2} | {} | {:.2} | {} | {} |",
                    r.model,
                    show(&r.busy, 2),
                    max_over_mean(&r.busy),
                    show(&r.apps, 0),
                    max_over_mean(&r.apps),
                    r.moves,
                    if r.model == "apps" { "-".to_string() } else { format!("{:.0} s", r.seconds) },
                );
            }
            println!("\nduplicated reconciles (overlapping intervals in the merged audit): **{overlaps}**");
            let (apps, measured) = (max_over_mean(&rows[0].busy), max_over_mean(&rows[1].busy));
            println!("\nbusy max/mean, measured over apps: **{:.2}x**", measured / apps);
            if measured > 1.20 {
                failures.push(format!("measured load: busy max/mean {measured:.2} > 1.20"));
            }
            if apps <= measured {
                failures.push(format!("measured load: the apps model ({apps:.2}) is not worse than measured ({measured:.2})"));
            }
            if overlaps > 0 {
                failures.push(format!("measured load: {overlaps} overlapping reconciles"));
            }
        }
    });
    for f in &failures {
        eprintln!("TARGET MISSED: {f}");
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
