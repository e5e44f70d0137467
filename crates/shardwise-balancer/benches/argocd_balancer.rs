//! The Argo CD balancer measured: a real `shardwise-balancer` process keeps the `shard` keys of
//! Argo CD's cluster Secrets on kube-apiserver, through six steps of one seeded fleet
//! (100 clusters, 10,000 Applications, Argo CD with 10 replicas and its default `legacy`
//! algorithm, the in-cluster cluster disabled):
//!
//! 0. adopt: the balancer's first passes, from no keys;
//! 1. 10 clusters join, with their apps;
//! 2. 10 clusters leave, with their apps;
//! 3. 500 more apps on each of 3 clusters;
//! 4. Argo CD scaled 10 -> 9 (the StatefulSet's replicas and `ARGOCD_CONTROLLER_REPLICAS`);
//! 5. scaled 9 -> 10.
//!
//! Each change is made while the balancer is stopped (SIGSTOP), so that its passes see the step
//! whole, as the algorithms do. After each step the bench waits until no key has changed for 3
//! passes (`--interval 1`) and records Argo CD's placement by the keys: max/mean apps per shard,
//! the clusters whose Argo CD shard changed and their apps (a key at or above a new replica
//! count sends its cluster to shard 0 at once: a move of its own), the passes that wrote keys and
//! the seconds until the last write. On the same snapshots (cluster ids are the Secrets' UIDs as
//! the API server gave them), Argo CD's three algorithms and an autoscaler-style greedy-minimum
//! from scratch are computed in process, with the moves between consecutive snapshots; step 0
//! counts, for every approach, the moves from Argo CD's placement with no keys.
//!
//! The app counts and the changes are drawn from a seed; the UIDs are the API server's (random,
//! as a real API server's are), and Argo CD's algorithms place by UID, so their figures, and the
//! balancer's starting point, vary from run to run. The measurement checks itself: the moves the
//! balancer logs, plus those the change made, must be the moves the keys show, and its metrics
//! must count every app and report the max/mean the keys give.
//!
//! `cargo bench -p shardwise-balancer --bench argocd_balancer` (`make bench-argocd`). Prints Markdown
//! for docs/benchmarks.md; exits 1 when a target is missed: the balancer's max/mean after each
//! step at most 1.10, and its total moves below the autoscaler-style total.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use shard_assign::{Cluster, ShardId, ShardSet, StrategyConfig, StrategyKind, assign};
use shardwise_e2e::argocd::APPLICATION_CRD;
use shardwise_e2e::{Environment, Poll, Process, ProcessSpec, free_port, scrape, wait_with};
use shardwise_plan::api::application_resource;
use shardwise_sim::{AppDistribution, FleetSpec};
use tokio::task::JoinSet;

const SEED: u64 = 1;
const REPLICAS: u32 = 10;
const JOINING: u32 = 10;
const LEAVING: usize = 10;
const HOT: usize = 3;
const PILE: u64 = 500;
/// The balancer's max/mean target after each step.
const MAX_BALANCE: f64 = 1.10;
/// Passes without a key change after which a step counts as settled.
const QUIET_PASSES: u64 = 3;
const SETTLE: Duration = Duration::from_secs(180);
/// Requests in flight while objects are created or deleted.
const WORKERS: usize = 8;

/// A cluster as Argo CD knows it: its Secret's UID and the apps that target it.
#[derive(Clone, Debug)]
struct Member {
    uid: String,
    apps: u64,
}

/// The fleet after a step, by Secret name (which is also the cluster's name).
#[derive(Clone, Debug)]
struct Snapshot {
    replicas: u32,
    members: BTreeMap<String, Member>,
}

/// Each cluster's shard, by Secret name.
type Placement = BTreeMap<String, ShardId>;
/// Each cluster's `shard` key, by Secret name.
type Keys = BTreeMap<String, Option<ShardId>>;

/// Where Argo CD runs each cluster with `config` and `keys`, as `planning::argocd_assignment_of`
/// computes it: a key below the replica count is the shard, one at or above it means shard 0,
/// and the algorithm places the rest. Every Application names its cluster by server, so the
/// counts consistent-hashing weighs are the apps.
fn place(config: &StrategyConfig, snapshot: &Snapshot, keys: &Keys) -> Placement {
    let clusters: Vec<Cluster> = snapshot
        .members
        .iter()
        .map(|(name, m)| Cluster {
            id: m.uid.clone(),
            name: name.clone(),
            apps: m.apps,
            pin: keys
                .get(name)
                .copied()
                .flatten()
                .map(|k| if k < snapshot.replicas { k } else { 0 }),
            weight: None,
        })
        .collect();
    let assignment = assign(
        config,
        &clusters,
        &ShardSet::contiguous(snapshot.replicas),
        None,
    )
    .expect("the fleet is placed");
    snapshot
        .members
        .iter()
        .map(|(name, m)| {
            let shard = assignment
                .shard_of(&m.uid)
                .expect("every cluster is placed");
            (name.clone(), shard)
        })
        .collect()
}

fn max_over_mean(snapshot: &Snapshot, placement: &Placement) -> f64 {
    let mut loads = vec![0u64; snapshot.replicas as usize];
    for (name, m) in &snapshot.members {
        loads[placement[name] as usize] += m.apps;
    }
    let total: u64 = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or_default();
    max as f64 * f64::from(snapshot.replicas) / total as f64
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Moves {
    clusters: u64,
    apps: u64,
}

impl std::ops::AddAssign for Moves {
    fn add_assign(&mut self, other: Self) {
        self.clusters += other.clusters;
        self.apps += other.apps;
    }
}

/// Clusters of `snapshot` placed in both `from` and `to` on different shards, and their apps.
fn moves(snapshot: &Snapshot, from: &Placement, to: &Placement) -> Moves {
    let mut moved = Moves::default();
    for (name, m) in &snapshot.members {
        if let (Some(a), Some(b)) = (from.get(name), to.get(name))
            && a != b
        {
            moved.clusters += 1;
            moved.apps += m.apps;
        }
    }
    moved
}

/// One approach's figures after one step.
#[derive(Clone, Copy, Debug)]
struct Row {
    balance: f64,
    moved: Moves,
    /// Of the balancer's moves, those the change itself made (keys at or above a new replica
    /// count), its passes that wrote keys, seconds from the change to the last write, and the
    /// worst max/mean on the way.
    measured: Option<Measured>,
}

#[derive(Clone, Copy, Debug)]
struct Measured {
    forced: u64,
    passes: u64,
    seconds: f64,
    /// The worst max/mean of Argo CD's placement from the change until settled.
    peak: f64,
}

/// What the balancer left after a change: Argo CD's placement, the moves seen on the way, the
/// worst max/mean on the way, and when the last key changed.
#[derive(Clone, Debug)]
struct Settled {
    placement: Placement,
    moved: Moves,
    peak: f64,
    last_change: Option<Instant>,
}

/// Runs `work` on each item, `WORKERS` at a time.
async fn in_parallel<T, F, Fut>(items: Vec<T>, work: F)
where
    T: Send + 'static,
    F: Fn(T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let mut chunks: Vec<Vec<T>> = (0..WORKERS).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        chunks[i % WORKERS].push(item);
    }
    let mut set = JoinSet::new();
    for chunk in chunks {
        let work = work.clone();
        set.spawn(async move {
            for item in chunk {
                work(item).await;
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("a worker panicked");
    }
}

/// What a change starts from: the keys, and where the balancer's log stood.
struct Before {
    keys: Keys,
    /// The balancer's passes so far.
    passes: u64,
    log_offset: usize,
}

/// Argo CD on kube-apiserver, the balancer, and what the bench has created.
struct ArgoCd {
    env: Environment,
    secrets: Api<Secret>,
    apps: Api<DynamicObject>,
    balancer: Option<Process>,
    metrics_port: u16,
    snapshot: Snapshot,
}

fn installation(replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: argocd-application-controller, namespace: argocd}}\nspec:\n  replicas: {replicas}\n  serviceName: c\n  selector: {{matchLabels: {{app: c}}}}\n  template:\n    metadata: {{labels: {{app: c}}}}\n    spec: {{containers: [{{name: c, image: x, env: [{{name: ARGOCD_CONTROLLER_REPLICAS, value: \"{replicas}\"}}]}}]}}\n"
    )
}

fn app_name(cluster: &str, index: u64) -> String {
    format!("{cluster}-{index}")
}

impl ArgoCd {
    async fn start() -> Self {
        let env = Environment::builder()
            .start()
            .expect("the control plane starts");
        let cp = env.control_plane();
        let config = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: argocd-cm, namespace: argocd}\ndata: {cluster.inClusterEnabled: \"false\"}\n";
        cp.apply_yaml(
            "admin",
            &format!(
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: argocd}}\n---\n{config}---\n{}---\n{APPLICATION_CRD}",
                installation(REPLICAS)
            ),
        )
        .await
        .expect("Argo CD is installed");
        let client = cp.client("admin").await.expect("a client");
        Self {
            secrets: Api::namespaced(client.clone(), "argocd"),
            apps: Api::namespaced_with(client, "argocd", &application_resource()),
            env,
            balancer: None,
            metrics_port: free_port().expect("a free port"),
            snapshot: Snapshot {
                replicas: REPLICAS,
                members: BTreeMap::new(),
            },
        }
    }

    /// Applications `first..first + count` of `cluster`, each naming it by server.
    async fn add_apps(&self, apps: Vec<(String, u64, u64)>) {
        let objects: Vec<DynamicObject> = apps
            .iter()
            .flat_map(|(cluster, first, count)| {
                (*first..first + count).map(move |i| {
                    serde_json::from_value(json!({
                        "apiVersion": "argoproj.io/v1alpha1",
                        "kind": "Application",
                        "metadata": {"name": app_name(cluster, i), "namespace": "argocd"},
                        "spec": {
                            "project": "default",
                            "destination": {"server": format!("https://{cluster}.example"), "namespace": "x"},
                        },
                    }))
                    .expect("an Application")
                })
            })
            .collect();
        let api = self.apps.clone();
        in_parallel(objects, move |app| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &app)
                    .await
                    .expect("an Application is created");
            }
        })
        .await;
    }

    /// Clusters with their apps: the Applications first, so that each cluster appears whole.
    async fn add_clusters(&mut self, clusters: &[(String, u64)]) {
        self.add_apps(clusters.iter().map(|(n, a)| (n.clone(), 0, *a)).collect())
            .await;
        for (name, apps) in clusters {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "namespace": "argocd",
                    "labels": {"argocd.argoproj.io/secret-type": "cluster"},
                },
                "stringData": {"name": name, "server": format!("https://{name}.example")},
            }))
            .expect("a Secret");
            let created = self
                .secrets
                .create(&PostParams::default(), &secret)
                .await
                .expect("a cluster Secret is created");
            let uid = created.metadata.uid.expect("the API server gives a UID");
            self.snapshot
                .members
                .insert(name.clone(), Member { uid, apps: *apps });
        }
    }

    /// Clusters removed: their Secrets first (Argo CD drops them), then their Applications.
    async fn remove_clusters(&mut self, names: &[String]) {
        let mut apps = Vec::new();
        for name in names {
            self.secrets
                .delete(name, &DeleteParams::default())
                .await
                .expect("a cluster Secret is deleted");
            let member = self.snapshot.members.remove(name).expect("a member");
            apps.extend((0..member.apps).map(|i| app_name(name, i)));
        }
        let api = self.apps.clone();
        in_parallel(apps, move |name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .expect("an Application is deleted");
            }
        })
        .await;
    }

    async fn pile_on(&mut self, names: &[String], more: u64) {
        let apps = names
            .iter()
            .map(|n| (n.clone(), self.snapshot.members[n].apps, more))
            .collect();
        self.add_apps(apps).await;
        for name in names {
            self.snapshot.members.get_mut(name).expect("a member").apps += more;
        }
    }

    async fn scale(&mut self, replicas: u32) {
        self.env
            .control_plane()
            .apply_yaml("admin", &installation(replicas))
            .await
            .expect("the StatefulSet is scaled");
        self.snapshot.replicas = replicas;
    }

    fn start_balancer(&mut self) {
        let kubeconfig = self
            .env
            .control_plane()
            .kubeconfig_path("admin")
            .expect("a kubeconfig");
        let health = free_port().expect("a free port");
        let spec = ProcessSpec::new("balancer", env!("CARGO_BIN_EXE_shardwise-balancer"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--interval", "1"])
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{}", self.metrics_port),
            ])
            .args(["--health-addr", &format!("127.0.0.1:{health}")])
            .env("POD_NAMESPACE", "argocd")
            .env("POD_NAME", "balancer")
            .env("SHARDWISE_LOG", "info")
            .env("SHARDWISE_LOG_FORMAT", "json");
        self.balancer = Some(self.env.spawn(&spec).expect("the balancer starts"));
    }

    async fn keys(&self) -> Keys {
        let secrets = self
            .secrets
            .list(&ListParams::default())
            .await
            .expect("Secrets are listed");
        let mut keys: Keys = self
            .snapshot
            .members
            .keys()
            .map(|n| (n.clone(), None))
            .collect();
        for s in secrets.items {
            let name = s.metadata.name.clone().unwrap_or_default();
            if let Some(key) = keys.get_mut(&name) {
                *key = s.data.as_ref().and_then(|d| d.get("shard")).map(|b| {
                    let text = String::from_utf8_lossy(&b.0);
                    text.parse()
                        .unwrap_or_else(|e| panic!("{name}: shard {text:?}: {e}"))
                });
            }
        }
        keys
    }

    /// The balancer's successful passes so far (0 before it serves metrics).
    async fn passes(&self) -> u64 {
        scrape(&format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .map(|m| m.sum("shardwise_planner_runs_total", &[("result", "success")]) as u64)
            .unwrap_or(0)
    }

    /// The balancer's "shard keys written" log records after `offset`: how many, and the
    /// clusters and apps they say moved.
    fn writes_logged(&self, offset: usize) -> (u64, Moves) {
        let balancer = self.balancer.as_ref().expect("the balancer runs");
        let log = std::fs::read(balancer.stderr_path()).expect("the balancer's log");
        let mut passes = 0;
        let mut moved = Moves::default();
        for line in String::from_utf8_lossy(&log[offset..]).lines() {
            let Ok(record) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if record["message"] == "shard keys written" {
                passes += 1;
                moved += Moves {
                    clusters: record["moved_clusters"].as_u64().expect("moved_clusters"),
                    apps: record["moved_apps"].as_u64().expect("moved_apps"),
                };
            }
        }
        (passes, moved)
    }

    /// Waits until every cluster has a key below the replica count and no key has changed for
    /// [`QUIET_PASSES`] passes, starting from `keys` and `placement` (Argo CD's at the change,
    /// after `passes` passes).
    async fn settle(&self, keys: Keys, placement: Placement, passes: u64) -> Settled {
        struct Seen {
            keys: Keys,
            /// Passes counted from here on found the keys as they are now. A pass that was
            /// writing when the change was seen is counted after its writes, so it is skipped.
            quiet_from: u64,
            settled: Settled,
        }
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let seen = Mutex::new(Seen {
            keys,
            quiet_from: passes + 1,
            settled: Settled {
                peak: max_over_mean(&self.snapshot, &placement),
                placement,
                moved: Moves::default(),
                last_change: None,
            },
        });
        let snapshot = &self.snapshot;
        let poll = Poll::timeout(SETTLE).every(Duration::from_millis(100));
        wait_with("the keys to settle", poll, || {
            let (seen, legacy) = (&seen, &legacy);
            async move {
                let keys = self.keys().await;
                let passes = self.passes().await;
                let mut seen = seen.lock().expect("not poisoned");
                if keys != seen.keys {
                    let placement = place(legacy, snapshot, &keys);
                    let settled = &mut seen.settled;
                    settled.moved += moves(snapshot, &settled.placement, &placement);
                    settled.peak = settled.peak.max(max_over_mean(snapshot, &placement));
                    settled.placement = placement;
                    settled.last_change = Some(Instant::now());
                    seen.keys = keys;
                    seen.quiet_from = passes + 1;
                }
                if let Some((name, key)) = seen
                    .keys
                    .iter()
                    .find(|(_, k)| !k.is_some_and(|k| k < snapshot.replicas))
                {
                    return Err(format!("{name} has key {key:?}"));
                }
                let quiet = passes.saturating_sub(seen.quiet_from);
                if quiet < QUIET_PASSES {
                    return Err(format!("{quiet} passes without a key change"));
                }
                Ok(seen.settled.clone())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Readies a change: the keys and the passes as they are, and the balancer stopped
    /// (SIGSTOP) so that its passes see the change whole.
    async fn begin(&mut self) -> Before {
        let keys = self.keys().await;
        // Read before the stop: a stopped process accepts connections but does not answer.
        let passes = self.passes().await;
        let log_offset = match &mut self.balancer {
            Some(balancer) => {
                balancer.pause().expect("the balancer stops");
                std::fs::read(balancer.stderr_path()).map_or(0, |b| b.len())
            }
            None => 0,
        };
        Before {
            keys,
            passes,
            log_offset,
        }
    }

    /// Lets the balancer go (starts it the first time) after a change and measures its
    /// response from `before`, Argo CD's placement before the change. Consistency failures of
    /// the measurement are added to `failures`.
    async fn measure(
        &mut self,
        change: Before,
        before: &Placement,
        failures: &mut Vec<String>,
    ) -> (Placement, Row) {
        let changed = Instant::now();
        match &mut self.balancer {
            Some(balancer) => balancer.resume().expect("the balancer resumes"),
            None => self.start_balancer(),
        }
        // Argo CD's placement at once: the keys it had, with the new replicas and clusters.
        let keys: Keys = self
            .snapshot
            .members
            .keys()
            .map(|n| (n.clone(), change.keys.get(n).copied().flatten()))
            .collect();
        let at_change = place(
            &StrategyConfig::new(StrategyKind::LegacyModulo),
            &self.snapshot,
            &keys,
        );
        let forced = moves(&self.snapshot, before, &at_change);
        let settled = self.settle(keys, at_change, change.passes).await;
        let (passes_written, logged) = self.writes_logged(change.log_offset);
        self.check(&settled.placement, failures).await;
        let mut moved = forced;
        moved += settled.moved;
        let mut reported = forced;
        reported += logged;
        if reported != moved {
            failures.push(format!(
                "the balancer logged {logged:?} moves and {forced:?} were forced, but the keys show {moved:?}"
            ));
        }
        let seconds = settled
            .last_change
            .map_or(0.0, |t| t.duration_since(changed).as_secs_f64());
        let row = Row {
            balance: max_over_mean(&self.snapshot, &settled.placement),
            moved,
            measured: Some(Measured {
                forced: forced.clusters,
                passes: passes_written,
                seconds,
                peak: settled.peak,
            }),
        };
        (settled.placement, row)
    }

    /// The balancer's own figures of its last pass must match the placement the keys give: all
    /// apps counted (every Application matched to its cluster) and the same max/mean.
    async fn check(&self, placement: &Placement, failures: &mut Vec<String>) {
        let metrics = scrape(&format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .expect("the balancer's metrics");
        let apps = metrics.sum("shardwise_assigned_items", &[]) as u64;
        let total: u64 = self.snapshot.members.values().map(|m| m.apps).sum();
        if apps != total {
            failures.push(format!("the balancer counts {apps} apps of {total}"));
        }
        let theirs = metrics
            .get("shardwise_assignment_balance", &[])
            .unwrap_or(f64::NAN);
        let ours = max_over_mean(&self.snapshot, placement);
        if (theirs - ours).abs() > 1e-9 {
            failures.push(format!(
                "the balancer reports max/mean {theirs}, the keys give {ours}"
            ));
        }
    }
}

/// The approaches in the order of the table: the balancer, then those computed in process.
const APPROACHES: [&str; 5] = [
    "balancer (measured)",
    "legacy",
    "round-robin",
    "consistent-hashing",
    "autoscaler-style (greedy-minimum)",
];

fn algorithms() -> [StrategyConfig; 4] {
    [
        StrategyKind::LegacyModulo,
        StrategyKind::RoundRobin,
        StrategyKind::ArgoCdConsistentHashing,
        StrategyKind::GreedyMinimum,
    ]
    .map(StrategyConfig::new)
}

/// Rows of the algorithms on `snapshot`, each from its placement `previous` (updated).
fn computed(snapshot: &Snapshot, previous: &mut [Placement; 4]) -> Vec<Row> {
    algorithms()
        .iter()
        .zip(previous.iter_mut())
        .map(|(config, previous)| {
            let placement = place(config, snapshot, &Keys::new());
            let row = Row {
                balance: max_over_mean(snapshot, &placement),
                moved: moves(snapshot, previous, &placement),
                measured: None,
            };
            *previous = placement;
            row
        })
        .collect()
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_table(steps: &[(String, Vec<Row>)]) {
    println!(
        "| step | approach | max/mean | clusters moved | apps moved | balancer: passes that wrote / seconds to the last write | balancer: worst max/mean on the way |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (step, rows) in steps {
        for (i, (approach, row)) in APPROACHES.iter().zip(rows).enumerate() {
            // Two cells, empty for the approaches computed in process.
            let settled = row.measured.map_or(" |".to_string(), |m| {
                format!("{} / {:.1} | {:.3}", m.passes, m.seconds, m.peak)
            });
            let forced = match row.measured {
                Some(m) if m.forced > 0 => format!(" ({} by the change itself)", m.forced),
                _ => String::new(),
            };
            println!(
                "| {} | {approach} | {:.3} | {}{forced} | {} | {settled} |",
                if i == 0 { step.as_str() } else { "" },
                row.balance,
                row.moved.clusters,
                thousands(row.moved.apps),
            );
        }
    }
}

/// Total moves of each approach over `steps`.
fn totals(steps: &[(String, Vec<Row>)]) -> Vec<Moves> {
    let mut totals = vec![Moves::default(); APPROACHES.len()];
    for (_, rows) in steps {
        for (total, row) in totals.iter_mut().zip(rows) {
            *total += row.moved;
        }
    }
    totals
}

fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "n/a (no moves)".into()
    } else {
        format!("{:.2}", a as f64 / b as f64)
    }
}

async fn run(failures: &mut Vec<String>) {
    let mut rng = StdRng::seed_from_u64(SEED);
    let generated = FleetSpec::REFERENCE.generate(&mut rng);
    let joining = FleetSpec {
        clusters: JOINING,
        apps: FleetSpec::REFERENCE.apps / u64::from(FleetSpec::REFERENCE.clusters)
            * u64::from(JOINING),
        distribution: AppDistribution::Random,
    }
    .generate(&mut rng);
    let started = Instant::now();
    let mut argocd = ArgoCd::start().await;
    let initial: Vec<(String, u64)> = generated.iter().map(|c| (c.name.clone(), c.apps)).collect();
    argocd.add_clusters(&initial).await;
    eprintln!(
        "fleet: {} clusters, {} apps created in {:.1} s",
        initial.len(),
        initial.iter().map(|(_, a)| a).sum::<u64>(),
        started.elapsed().as_secs_f64()
    );

    let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
    // Argo CD's placement before any key: where every approach starts from.
    let unpinned = place(&legacy, &argocd.snapshot, &Keys::new());
    let mut previous: [Placement; 4] = std::array::from_fn(|_| unpinned.clone());
    let mut steps: Vec<(String, Vec<Row>)> = Vec::new();

    // 1-5: the changes after adoption, drawn from the same seed.
    let joined: Vec<(String, u64)> = joining
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("cluster-{:05}", generated.len() + i), c.apps))
        .collect();
    let mut names: Vec<String> = initial
        .iter()
        .chain(&joined)
        .map(|(n, _)| n.clone())
        .collect();
    names.shuffle(&mut rng);
    let leaving: Vec<String> = names[..LEAVING].to_vec();
    let hot: Vec<String> = names[LEAVING..LEAVING + HOT].to_vec();

    let titles = [
        "0. adopt (no keys)".to_string(),
        format!("1. {JOINING} clusters join"),
        format!("2. {LEAVING} clusters leave"),
        format!("3. +{PILE} apps on {HOT} clusters"),
        format!("4. Argo CD {REPLICAS} -> {} replicas", REPLICAS - 1),
        format!("5. Argo CD {} -> {REPLICAS} replicas", REPLICAS - 1),
    ];
    let mut placement = unpinned;
    for (index, title) in titles.into_iter().enumerate() {
        let before = argocd.begin().await;
        match index {
            // Adoption: the balancer starts on the fleet as it is.
            0 => {}
            1 => argocd.add_clusters(&joined).await,
            2 => argocd.remove_clusters(&leaving).await,
            3 => argocd.pile_on(&hot, PILE).await,
            4 => argocd.scale(REPLICAS - 1).await,
            _ => argocd.scale(REPLICAS).await,
        }
        let (after, row) = argocd.measure(before, &placement, failures).await;
        placement = after;
        let mut rows = vec![row];
        rows.extend(computed(&argocd.snapshot, &mut previous));
        steps.push((title, rows));
        eprintln!(
            "step {index} settled at {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    argocd
        .balancer
        .as_mut()
        .expect("the balancer runs")
        .stop(Duration::from_secs(10))
        .await
        .expect("the balancer stops");

    println!(
        "\n### The Argo CD balancer against Argo CD's algorithms (100 clusters, 10,000 apps, seed {SEED})\n"
    );
    print_table(&steps);
    let all = totals(&steps);
    let after_adoption = totals(&steps[1..]);
    println!(
        "\n| total moves | steps 0-5: clusters | apps | steps 1-5: clusters | apps | balancer / this (clusters, steps 0-5) | (clusters, steps 1-5) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, approach) in APPROACHES.iter().enumerate() {
        println!(
            "| {approach} | {} | {} | {} | {} | {} | {} |",
            all[i].clusters,
            thousands(all[i].apps),
            after_adoption[i].clusters,
            thousands(after_adoption[i].apps),
            ratio(all[0].clusters, all[i].clusters),
            ratio(after_adoption[0].clusters, after_adoption[i].clusters),
        );
    }

    for (step, rows) in &steps {
        if rows[0].balance > MAX_BALANCE {
            failures.push(format!(
                "{step}: the balancer's max/mean {:.3} > {MAX_BALANCE}",
                rows[0].balance
            ));
        }
    }
    let autoscaler = APPROACHES.len() - 1;
    if all[0].clusters >= all[autoscaler].clusters {
        failures.push(format!(
            "the balancer moved {} clusters in all, the autoscaler-style partition {}",
            all[0].clusters, all[autoscaler].clusters
        ));
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut failures = Vec::new();
    runtime.block_on(run(&mut failures));
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("target missed: {f}");
        }
        std::process::exit(1);
    }
}
