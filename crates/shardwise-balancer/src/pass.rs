//! One pass of the Argo CD balancer, decided from objects already read: which `shard` keys
//! to write, and the figures of the resulting placement.
//!
//! Argo CD places a cluster on the shard its Secret's `shard` key names. The balancer owns those
//! keys: on each pass it reads the installation as `shardwise plan --source argocd` does, takes
//! where Argo CD runs each cluster now as the previous placement, lets `sticky-balanced` keep
//! clusters home and spend its move budget only while the busiest shard is above the target,
//! and writes the keys that differ. [`decide`] is that pass without I/O, tested by feeding it
//! objects; `balancer` runs it under a Lease.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use shard_assign::{
    AssignError, Assignment, Cluster, PreviousPlacement, ShardId, StrategyConfig, assign,
};
use shardwise_runtime::metrics::ShardFigures;

use shardwise_plan::LiveFleet;
use shardwise_plan::argocd::{self, PinTarget};
use shardwise_plan::planning;

use crate::controllers::Shards;

/// A cluster Secret annotated with this (`"true"`) keeps its `shard` key: the balancer counts
/// the cluster where Argo CD runs it and never writes the key. The balancer only reads it.
pub const KEEP_SHARD_ANNOTATION: &str = "shardwise.io/keep-shard";

/// The shard a cluster was rescued from when its controller stayed down past the grace period,
/// written with the key that moved it away: the cluster goes back there once a Ready pod serves
/// it again, and the annotation is removed with the key that moves it back.
pub const RESCUED_FROM_ANNOTATION: &str = "shardwise.io/rescued-from";

/// A move whose Applications are yet to be refreshed, written with the key that made it (the
/// shard moved to): removed once every Application of the cluster has been asked to refresh.
/// A balancer stopped or deposed between the two leaves it for the next pass, its own or its
/// successor's.
pub const REFRESH_PENDING_ANNOTATION: &str = "shardwise.io/refresh-pending";

/// A cluster Secret that says a refresh is pending ([`REFRESH_PENDING_ANNOTATION`]), as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The Secret's name.
    pub secret: String,
    /// The cluster's id (the Secret's UID).
    pub id: String,
    /// As read: the precondition of the write that records the refresh done.
    pub resource_version: String,
}

/// What one pass reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// Argo CD's fleet as read.
    pub fleet: &'a LiveFleet,
    /// Argo CD's cluster Secrets, as read (their resourceVersions are the writes' preconditions).
    pub secrets: &'a [Secret],
    /// Argo CD's own algorithm, which places every cluster without a pin it honours.
    pub algorithm: &'a StrategyConfig,
    /// The shards as the running controller pods allow them.
    pub shards: &'a Shards,
    /// How the balancer places: `sticky-balanced` and its move budget.
    pub strategy: &'a StrategyConfig,
}

/// One Secret a pass rewrites.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyWrite {
    /// The Secret, as read.
    pub target: PinTarget,
    /// The `shard` key to write.
    pub shard: ShardId,
    /// [`RESCUED_FROM_ANNOTATION`]: set to a shard (`Some(Some(_))`), removed (`Some(None)`)
    /// or left as it is (`None`).
    pub rescued_from: Option<Option<ShardId>>,
    /// The write hands the cluster to another controller (or gives it one at last).
    pub moves: bool,
}

/// What one pass decides.
#[derive(Debug)]
pub struct Pass {
    /// The Secrets to rewrite, in Secret name order.
    pub writes: Vec<KeyWrite>,
    /// Clusters whose Argo CD controller changes once the writes land (the writes that
    /// [`KeyWrite::moves`]).
    pub moved_clusters: u64,
    /// Their apps.
    pub moved_apps: u64,
    /// Busiest shard over the mean after the pass, over the shards clusters may move onto.
    pub balance: f64,
    /// Every shard of Argo CD after the pass: its clusters and apps.
    pub shards: BTreeMap<ShardId, ShardFigures>,
    /// Secrets the balancer leaves as they are, and why.
    pub left_out: Vec<String>,
    /// Why the pass writes nothing at all, if so.
    pub held: Option<String>,
    /// Secrets read with a refresh pending, in name order.
    pub pending: Vec<Pending>,
}

/// What `placement` gives each shard.
fn figures_of(placement: &Assignment) -> BTreeMap<ShardId, ShardFigures> {
    placement
        .shard_loads()
        .iter()
        .map(|(&shard, load)| {
            let figures = ShardFigures {
                units: load.clusters,
                slices: load.clusters,
                items: load.apps,
                shared: 0,
            };
            (shard, figures)
        })
        .collect()
}

/// Where a cluster runs now, as far as every running controller pod agrees.
fn home(cluster: &Cluster, now: Option<ShardId>, shards: &Shards) -> Option<ShardId> {
    match cluster.pin {
        Some(key) => (key < shards.agreed).then_some(key),
        // Argo CD's algorithm places it alike on every pod only if they all read with one count.
        None => now.filter(|_| shards.uniform),
    }
}

/// Decides one pass. Every cluster Argo CD shards gets a key (so that Argo CD's algorithm no
/// longer decides), except those annotated with [`KEEP_SHARD_ANNOTATION`]; a key that already
/// names the planned shard (spelled as Argo CD reads it) is not rewritten. Keys name only
/// shards every running pod reads alike and a Ready pod serves ([`Shards`]): a cluster on a
/// shard at or above the agreed count, or on a shard down past the grace period, moves at once
/// whatever the budget; one on a shard down for less waits where it is. A pass fed the Secrets
/// its own writes produced writes nothing, unless the busiest shard is above the target and a
/// move can lower it.
pub fn decide(inputs: &Inputs<'_>) -> Result<Pass, AssignError> {
    let Inputs {
        fleet,
        secrets,
        algorithm,
        shards,
        strategy,
    } = *inputs;
    let (targets, mut left_out) = argocd::pin_targets(secrets, fleet);
    let mut pending: Vec<Pending> = secrets
        .iter()
        .filter(|s| s.annotations().contains_key(REFRESH_PENDING_ANNOTATION))
        .filter_map(|s| {
            Some(Pending {
                secret: s.metadata.name.clone()?,
                id: s.uid()?,
                resource_version: s.resource_version()?,
            })
        })
        .collect();
    pending.sort_by(|a, b| a.secret.cmp(&b.secret));
    let annotated = |key: &str| -> BTreeMap<String, String> {
        secrets
            .iter()
            .filter_map(|s| Some((s.uid()?, s.annotations().get(key)?.clone())))
            .collect()
    };
    let kept: BTreeSet<String> = annotated(KEEP_SHARD_ANNOTATION)
        .into_iter()
        .filter(|(_, v)| argocd::parse_go_bool(v) == Some(true))
        .map(|(id, _)| id)
        .collect();
    let rescued: BTreeMap<String, ShardId> = annotated(RESCUED_FROM_ANNOTATION)
        .into_iter()
        .filter_map(|(id, v)| Some((id, v.trim().parse().ok()?)))
        .collect();
    let balanced: BTreeSet<String> = targets
        .iter()
        .map(|t| t.id.clone())
        .filter(|id| !kept.contains(id))
        .collect();
    for target in targets.iter().filter(|t| kept.contains(&t.id)) {
        left_out.push(format!(
            "Secret {:?} left as it is: annotated {KEEP_SHARD_ANNOTATION}",
            target.secret
        ));
    }

    // Where Argo CD runs each cluster now: the previous placement. Its pins are the balancer's
    // own state, not constraints, except where the balancer may not write.
    let now =
        planning::argocd_placement_with(fleet, algorithm, shards.agreed.max(1), &BTreeMap::new())?;
    if let Some(why) = &shards.hold {
        // Nothing is placed: the figures are Argo CD's placement as it stands.
        return Ok(Pass {
            writes: Vec::new(),
            moved_clusters: 0,
            moved_apps: 0,
            balance: now.balance().max_over_mean,
            shards: figures_of(&now),
            left_out,
            held: Some(why.clone()),
            pending,
        });
    }
    let mut waiting: BTreeMap<ShardId, (u64, u64)> = BTreeMap::new();
    let mut clusters = Vec::new();
    let mut homes: BTreeMap<String, ShardId> = BTreeMap::new();
    for c in &fleet.clusters {
        let Some(placed) = now.shard_of(&c.id) else {
            continue;
        };
        let home = home(c, Some(placed), shards);
        if !balanced.contains(&c.id) {
            // Never written: it counts where it runs, if clusters may move there.
            if let Some(home) = home.filter(|h| shards.ready.contains(*h)) {
                clusters.push(Cluster {
                    pin: Some(home),
                    weight: None,
                    ..c.clone()
                });
            }
            continue;
        }
        if let Some(home) = home.filter(|h| shards.down.contains(h)) {
            // Its controller may be back within the grace period: it stays, and nothing moves.
            let w = waiting.entry(home).or_default();
            *w = (w.0 + 1, w.1 + c.apps);
            continue;
        }
        let back = rescued
            .get(&c.id)
            .copied()
            .filter(|h| shards.ready.contains(*h));
        clusters.push(Cluster {
            pin: back,
            weight: None,
            ..c.clone()
        });
        if let Some(home) = home {
            homes.insert(c.id.clone(), home);
        }
    }
    let previous: PreviousPlacement = homes.iter().map(|(id, &s)| (id.clone(), s)).collect();
    let planned = assign(strategy, &clusters, &shards.ready, Some(&previous))?;

    let mut writes = Vec::new();
    for t in targets.into_iter().filter(|t| balanced.contains(&t.id)) {
        let Some(shard) = planned.shard_of(&t.id) else {
            continue;
        };
        let home = homes.get(&t.id).copied();
        let rescued_from = match (rescued.get(&t.id), home) {
            // Leaving a dead shard: remember it (the first one, if rescued twice).
            (None, Some(home)) if shards.dead.contains(&home) => Some(Some(home)),
            // Back home, or home is gone for good.
            (Some(&from), _) if from == shard || from >= shards.agreed => Some(None),
            _ => None,
        };
        let key_differs = t.key.as_deref() != Some(shard.to_string().as_str());
        if key_differs || rescued_from.is_some() {
            writes.push(KeyWrite {
                target: t,
                shard,
                rescued_from,
                moves: home != Some(shard),
            });
        }
    }
    let apps: BTreeMap<&str, u64> = fleet
        .clusters
        .iter()
        .map(|c| (c.id.as_str(), c.apps))
        .collect();
    let moved: Vec<&str> = writes
        .iter()
        .filter(|w| w.moves)
        .map(|w| w.target.id.as_str())
        .collect();
    let moved_apps = moved
        .iter()
        .map(|id| apps.get(id).copied().unwrap_or(0))
        .sum();
    let mut figures = figures_of(&planned);
    for (shard, (count, apps)) in waiting {
        let f = figures.entry(shard).or_default();
        f.units += count;
        f.slices += count;
        f.items += apps;
    }
    Ok(Pass {
        moved_clusters: moved.len() as u64,
        moved_apps,
        balance: planned.balance().max_over_mean,
        shards: figures,
        left_out,
        held: None,
        pending,
        writes,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use kube::api::DynamicObject;
    use serde_json::json;
    use shard_assign::StrategyKind;

    use shardwise_plan::argocd::ArgoCdLoad;
    use shardwise_plan::shardwise::fixtures::argocd_application;

    use super::*;
    use crate::controllers::{ControllerPod, Health, ready_pod as controller};
    use std::time::{Duration, Instant};

    /// A fleet on Argo CD: cluster Secrets and Applications, changed between passes as Argo CD
    /// and the API server would (a write bumps the resourceVersion).
    struct ArgoCd {
        secrets: Vec<Secret>,
        apps: Vec<DynamicObject>,
        algorithm: StrategyConfig,
        replicas: u32,
        /// The controller pods as the balancer sees them; `None`: `replicas` Ready pods.
        shards: Option<Shards>,
    }

    /// `replicas` Ready pods reading keys with `replicas`.
    fn all_ready(replicas: u32) -> Shards {
        let pods: Vec<ControllerPod> = (0..replicas).map(|i| controller(i, replicas)).collect();
        Health::default().observe(replicas, &pods, Instant::now(), Duration::from_secs(60))
    }

    fn secret(name: &str, shard: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("argocd".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.resource_version = Some("1".into());
        let mut data = BTreeMap::from([
            ("name".to_string(), ByteString(name.as_bytes().to_vec())),
            (
                "server".to_string(),
                ByteString(format!("https://{name}.example").into_bytes()),
            ),
        ]);
        if let Some(shard) = shard {
            data.insert("shard".into(), ByteString(shard.as_bytes().to_vec()));
        }
        s.data = Some(data);
        s
    }

    fn app(name: &str, cluster: &str) -> DynamicObject {
        argocd_application(name, json!({"name": cluster}))
    }

    impl ArgoCd {
        /// `apps[i]` apps on cluster `c{i}`, no keys, Argo CD's legacy algorithm.
        fn new(apps: &[u64], replicas: u32) -> Self {
            let mut fleet = Self {
                secrets: Vec::new(),
                apps: Vec::new(),
                algorithm: StrategyConfig::new(StrategyKind::LegacyModulo),
                replicas,
                shards: None,
            };
            for (i, &n) in apps.iter().enumerate() {
                fleet.add_cluster(&format!("c{i:02}"), n);
            }
            fleet
        }

        fn add_cluster(&mut self, name: &str, apps: u64) {
            self.secrets.push(secret(name, None));
            self.add_apps(name, apps);
        }

        fn add_apps(&mut self, cluster: &str, apps: u64) {
            let first = self.apps.len();
            for i in first..first + apps as usize {
                self.apps.push(app(&format!("a{i}"), cluster));
            }
        }

        fn fleet(&self) -> LiveFleet {
            argocd::fleet(&self.secrets, &self.apps, false, ArgoCdLoad::Apps).unwrap()
        }

        fn pass(&self) -> Pass {
            let fleet = self.fleet();
            let strategy = StrategyConfig::new(StrategyKind::StickyBalanced);
            let shards = self
                .shards
                .clone()
                .unwrap_or_else(|| all_ready(self.replicas));
            decide(&Inputs {
                fleet: &fleet,
                secrets: &self.secrets,
                algorithm: &self.algorithm,
                shards: &shards,
                strategy: &strategy,
            })
            .unwrap()
        }

        /// What the API server does with the writes: the key set, the version bumped.
        fn write(&mut self, pass: &Pass) {
            for w in &pass.writes {
                let s = self
                    .secrets
                    .iter_mut()
                    .find(|s| s.name_any() == w.target.secret)
                    .unwrap();
                assert_eq!(
                    s.metadata.resource_version.as_ref(),
                    Some(&w.target.resource_version)
                );
                let data = s.data.get_or_insert_default();
                data.insert("shard".into(), ByteString(w.shard.to_string().into_bytes()));
                let annotations = s.metadata.annotations.get_or_insert_default();
                match w.rescued_from {
                    Some(Some(from)) => {
                        annotations.insert(RESCUED_FROM_ANNOTATION.into(), from.to_string());
                    }
                    Some(None) => {
                        annotations.remove(RESCUED_FROM_ANNOTATION);
                    }
                    None => {}
                }
                let version: u64 = s
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap()
                    .parse()
                    .unwrap();
                s.metadata.resource_version = Some((version + 1).to_string());
            }
        }

        /// Passes (each written) until one writes nothing: the passes that wrote, the moves.
        fn settle(&mut self) -> (u32, u64) {
            let (mut passes, mut moves) = (0, 0);
            loop {
                let pass = self.pass();
                if pass.writes.is_empty() {
                    return (passes, moves);
                }
                assert!(passes < 50, "no fixpoint after 50 passes");
                passes += 1;
                moves += pass.moved_clusters;
                self.write(&pass);
            }
        }

        fn key(&self, name: &str) -> Option<String> {
            let s = self.secrets.iter().find(|s| s.name_any() == name)?;
            let bytes = s.data.as_ref()?.get("shard")?;
            Some(String::from_utf8(bytes.0.clone()).unwrap())
        }

        fn balance(&self) -> f64 {
            self.pass().balance
        }
    }

    /// Argo CD's placement of `fleet` as it stands: apps per shard.
    fn argocd_loads(argocd: &ArgoCd) -> Vec<u64> {
        let fleet = argocd.fleet();
        let placed = planning::argocd_placement_with(
            &fleet,
            &argocd.algorithm,
            argocd.replicas,
            &BTreeMap::new(),
        )
        .unwrap();
        (0..argocd.replicas)
            .map(|s| placed.shard_loads().get(&s).map_or(0, |l| l.apps))
            .collect()
    }

    fn max_over_mean(loads: &[u64]) -> f64 {
        let total: u64 = loads.iter().sum();
        *loads.iter().max().unwrap() as f64 * loads.len() as f64 / total as f64
    }

    #[test]
    fn the_first_pass_pins_every_cluster_and_moves_within_the_budget() {
        let sizes = [40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5];
        let mut argocd = ArgoCd::new(&sizes, 3);
        let before = argocd_loads(&argocd);
        let pass = argocd.pass();
        // Every cluster gets a key, even those that stay where Argo CD runs them.
        assert_eq!(pass.writes.len(), sizes.len());
        let budget = u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES);
        assert!(pass.moved_clusters <= budget, "{pass:?}");
        argocd.write(&pass);
        for i in 0..sizes.len() {
            assert!(argocd.key(&format!("c{i:02}")).is_some());
        }
        // Argo CD, honouring the keys, now runs what the pass planned.
        let after = argocd_loads(&argocd);
        let planned: Vec<u64> = (0..3).map(|s| pass.shards[&s].items).collect();
        assert_eq!(after, planned);
        assert!(max_over_mean(&after) < max_over_mean(&before));
        assert!((max_over_mean(&after) - pass.balance).abs() < 1e-9);
    }

    #[test]
    fn a_pass_names_the_clusters_it_moves_and_the_fleet_their_applications() {
        let mut argocd = ArgoCd::new(&[40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5], 3);
        let fleet = argocd.fleet();
        let shard_now = |argocd: &ArgoCd, id: &str| {
            planning::argocd_placement_with(
                &argocd.fleet(),
                &argocd.algorithm,
                argocd.replicas,
                &BTreeMap::new(),
            )
            .unwrap()
            .shard_of(id)
        };
        let before: BTreeMap<String, Option<ShardId>> = fleet
            .clusters
            .iter()
            .map(|c| (c.id.clone(), shard_now(&argocd, &c.id)))
            .collect();
        let pass = argocd.pass();
        argocd.write(&pass);
        let changed: Vec<String> = before
            .iter()
            .filter(|(id, shard)| shard_now(&argocd, id) != **shard)
            .map(|(id, _)| id.clone())
            .collect();
        assert!(!changed.is_empty(), "the unbalanced fleet moves: {pass:?}");
        let mut moved: Vec<String> = pass
            .writes
            .iter()
            .filter(|w| w.moves)
            .map(|w| w.target.id.clone())
            .collect();
        moved.sort();
        assert_eq!(moved, changed);
        assert_eq!(pass.moved_clusters, changed.len() as u64);
        // What the balancer refreshes for each: exactly the Applications of that cluster.
        for id in &moved {
            let cluster = fleet.clusters.iter().find(|c| &c.id == id).unwrap();
            let apps = &fleet.cluster_apps[id];
            assert_eq!(apps.len() as u64, cluster.apps);
            for (namespace, name) in apps {
                let app = argocd
                    .apps
                    .iter()
                    .find(|a| a.metadata.name.as_deref() == Some(name.as_str()))
                    .unwrap();
                assert_eq!(app.metadata.namespace.as_deref(), Some(namespace.as_str()));
                assert_eq!(app.data["spec"]["destination"]["name"], cluster.name);
            }
        }
    }

    #[test]
    fn a_settled_fleet_writes_nothing_and_keys_spelled_otherwise_are_rewritten() {
        let mut argocd = ArgoCd::new(&[30, 20, 20, 10, 10, 10], 3);
        let (passes, _) = argocd.settle();
        assert!(passes >= 1);
        let settled = argocd.pass();
        assert!(settled.writes.is_empty());
        assert_eq!(settled.moved_clusters, 0);
        // "+1" reads as 1 in Argo CD; the balancer writes the plain spelling, moving nothing.
        let key = argocd.key("c01").unwrap();
        let s = argocd
            .secrets
            .iter_mut()
            .find(|s| s.name_any() == "c01")
            .unwrap();
        s.data
            .as_mut()
            .unwrap()
            .insert("shard".into(), ByteString(format!("+{key}").into_bytes()));
        let pass = argocd.pass();
        assert_eq!(pass.writes.len(), 1);
        assert_eq!(pass.writes[0].target.secret, "c01");
        assert_eq!(pass.writes[0].shard.to_string(), key);
        assert!(!pass.writes[0].moves);
        assert_eq!(pass.moved_clusters, 0);
    }

    #[test]
    fn clusters_added_and_removed_are_balanced_within_the_budget_per_pass() {
        let mut argocd = ArgoCd::new(&[20; 9], 3);
        argocd.settle();
        // Three clusters arrive; Argo CD's algorithm runs them somewhere until pinned.
        for name in ["n0", "n1", "n2"] {
            argocd.add_cluster(name, 20);
        }
        let pass = argocd.pass();
        let written: BTreeSet<&str> = pass
            .writes
            .iter()
            .map(|w| w.target.secret.as_str())
            .collect();
        assert!(written.is_superset(&BTreeSet::from(["n0", "n1", "n2"])));
        assert!(pass.moved_clusters <= u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES));
        argocd.settle();
        assert!(
            argocd.balance() <= 1.0 + 1e-9,
            "12 equal clusters over 3 shards"
        );
        // Three clusters of shard 0 leave.
        let gone: Vec<String> = argocd
            .secrets
            .iter()
            .map(|s| s.name_any())
            .filter(|n| argocd.key(n).as_deref() == Some("0"))
            .take(3)
            .collect();
        argocd.secrets.retain(|s| !gone.contains(&s.name_any()));
        let keys = |argocd: &ArgoCd| -> BTreeMap<String, Option<String>> {
            argocd
                .secrets
                .iter()
                .map(|s| (s.name_any(), argocd.key(&s.name_any())))
                .collect()
        };
        let before = keys(&argocd);
        let (_, moves) = argocd.settle();
        // 9 equal clusters over 3 shards, one holding 1: 2 moves at best, and only those.
        assert_eq!(moves, 2);
        assert!(argocd.balance() <= 1.0 + 1e-9);
        let after = keys(&argocd);
        let changed = before.iter().filter(|(n, k)| after[*n] != **k).count();
        assert_eq!(changed, 2);
    }

    #[test]
    fn apps_piling_on_one_cluster_move_the_others_off_its_shard() {
        let mut argocd = ArgoCd::new(&[10; 12], 4);
        argocd.settle();
        assert!(argocd.balance() <= 1.0 + 1e-9);
        let hot_shard = argocd.key("c05").unwrap();
        argocd.add_apps("c05", 60);
        // 90 apps on the hot cluster's shard, 30 on each other: twice the mean.
        assert_eq!(max_over_mean(&argocd_loads(&argocd)), 2.0);
        let (passes, moves) = argocd.settle();
        // The hot cluster (70 apps) stays; its shard's other two clusters leave.
        assert_eq!(argocd.key("c05").unwrap(), hot_shard);
        assert_eq!(moves, 2, "after {passes} passes");
        let fleet = argocd.fleet();
        let on_hot = fleet
            .clusters
            .iter()
            .filter(|c| argocd.key(&c.name).as_deref() == Some(hot_shard.as_str()))
            .count();
        assert_eq!(on_hot, 1);
    }

    #[test]
    fn keys_at_or_above_the_count_move_at_once_whatever_the_budget() {
        let mut argocd = ArgoCd::new(&[10; 12], 4);
        argocd.settle();
        // Argo CD scaled to 2: the keys 2 and 3 now mean shard 0.
        argocd.replicas = 2;
        assert_eq!(argocd_loads(&argocd), vec![90, 30]);
        let first = argocd.pass();
        argocd.write(&first);
        // Every rewrite off a shard that left hands its cluster over: each is a move.
        assert_eq!(first.moved_clusters, 6);
        assert!(first.moved_clusters > u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES));
        assert!(first.writes.iter().all(|w| w.moves));
        assert_eq!(argocd_loads(&argocd), vec![60, 60]);
        for i in 0..12 {
            let key: u32 = argocd.key(&format!("c{i:02}")).unwrap().parse().unwrap();
            assert!(key < 2);
        }
        assert!(argocd.pass().writes.is_empty());
    }

    /// Argo CD's controllers during a rollout: each pod reads keys with the count it started
    /// with (`ARGOCD_CONTROLLER_REPLICAS` of its own spec).
    struct Pods(Vec<ControllerPod>);

    impl Pods {
        fn new(replicas: u32) -> Self {
            Self((0..replicas).map(|i| controller(i, replicas)).collect())
        }

        fn get(&mut self, shard: u32) -> &mut ControllerPod {
            self.0.iter_mut().find(|p| p.shard == Some(shard)).unwrap()
        }

        /// The StatefulSet controller's steps to `replicas` pods reading with `replicas`:
        /// pods above the count deleted from the top, new ones created and made Ready, then
        /// every other pod replaced from the highest ordinal, the next only once the one
        /// above is Ready. `step` runs after each change.
        fn roll(&mut self, from: u32, replicas: u32, step: &mut impl FnMut(&[ControllerPod])) {
            for shard in (replicas..from).rev() {
                self.get(shard).terminating = true;
                step(&self.0);
                self.0.retain(|p| p.shard != Some(shard));
                step(&self.0);
            }
            for shard in from..replicas {
                let mut new = controller(shard, replicas);
                new.ready = false;
                self.0.push(new);
                step(&self.0);
                self.get(shard).ready = true;
                step(&self.0);
            }
            for shard in (0..from.min(replicas)).rev() {
                self.get(shard).terminating = true;
                self.get(shard).ready = false;
                step(&self.0);
                self.0.retain(|p| p.shard != Some(shard));
                step(&self.0);
                let mut new = controller(shard, replicas);
                new.ready = false;
                self.0.push(new);
                step(&self.0);
                self.get(shard).ready = true;
                step(&self.0);
            }
        }
    }

    /// The running pods (terminating ones too: their processes still reconcile) that own a
    /// cluster keyed `key`, as Argo CD decides: a key at or above a pod's count is shard 0.
    fn owners(key: u32, pods: &[ControllerPod]) -> Vec<String> {
        pods.iter()
            .filter(|p| {
                let count = p.replicas.unwrap();
                let read = if key < count { key } else { 0 };
                p.shard == Some(read)
            })
            .map(|p| p.name.clone())
            .collect()
    }

    #[test]
    fn no_cluster_has_two_owners_at_any_step_of_a_rollout_up_and_down() {
        let sizes = [40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5, 30, 20, 10, 5];
        let mut argocd = ArgoCd::new(&sizes, 3);
        argocd.settle();
        let names: Vec<String> = argocd.secrets.iter().map(|s| s.name_any()).collect();
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        // Per step: whether every pod read with 4, and how many clusters were on shard 3.
        let seen: std::cell::RefCell<Vec<(bool, usize)>> = Default::default();
        let mut step = |argocd: &mut ArgoCd, target: u32, pods: &[ControllerPod]| {
            let mut seen = seen.borrow_mut();
            argocd.shards = Some(health.observe(target, pods, now, grace));
            let pass = argocd.pass();
            argocd.write(&pass);
            let mut on_new = 0;
            for name in &names {
                let key: u32 = argocd.key(name).unwrap().parse().unwrap();
                let owners = owners(key, pods);
                assert!(
                    owners.len() <= 1,
                    "step {}: {name} (key {key}) is owned by two controllers, {owners:?}: {pods:?}",
                    seen.len()
                );
                on_new += usize::from(key == 3);
            }
            seen.push((pods.iter().all(|p| p.replicas == Some(4)), on_new));
        };
        // 3 -> 4 and back, the balancer passing after every step of each rollout.
        let mut pods = Pods::new(3);
        pods.roll(3, 4, &mut |p| step(&mut argocd, 4, p));
        let up = seen.borrow().len();
        pods.roll(4, 3, &mut |p| step(&mut argocd, 3, p));
        let seen = seen.into_inner();
        assert!(up >= 10 && seen.len() >= 2 * up - 2, "{seen:?}");
        // Shard 3 got clusters only once every pod read with 4, and did get some then.
        assert!(
            seen[..up].iter().all(|&(all_new, on)| all_new || on == 0),
            "{seen:?}"
        );
        assert!(seen[up - 1].1 > 0, "{seen:?}");
        // From the first step down (the count asked is 3), no key names shard 3.
        assert!(seen[up..].iter().all(|&(_, on)| on == 0), "{seen:?}");
    }

    #[test]
    fn the_new_shard_gets_clusters_only_once_every_pod_reads_the_new_count() {
        let mut argocd = ArgoCd::new(&[10; 12], 3);
        argocd.settle();
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        let mut pods = Pods::new(3);
        pods.0.push(controller(3, 4));
        argocd.shards = Some(health.observe(4, &pods.0, now, grace));
        argocd.settle();
        let keys = |argocd: &ArgoCd| -> Vec<String> {
            argocd
                .secrets
                .iter()
                .map(|s| argocd.key(&s.name_any()).unwrap())
                .collect()
        };
        assert!(
            !keys(&argocd).contains(&"3".to_string()),
            "pods 0 to 2 read key 3 as 0"
        );
        pods = Pods::new(4);
        argocd.shards = Some(health.observe(4, &pods.0, now, grace));
        argocd.settle();
        assert_eq!(keys(&argocd).iter().filter(|k| *k == "3").count(), 3);
    }

    #[test]
    fn a_dead_shards_clusters_wait_the_grace_then_are_rescued_and_go_back_when_it_recovers() {
        let mut argocd = ArgoCd::new(&[10; 9], 3);
        argocd.settle();
        let on = |argocd: &ArgoCd, shard: &str| -> BTreeSet<String> {
            argocd
                .secrets
                .iter()
                .map(|s| s.name_any())
                .filter(|n| argocd.key(n).as_deref() == Some(shard))
                .collect()
        };
        let home = on(&argocd, "1");
        assert_eq!(home.len(), 3);
        let start = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        let mut pods = Pods::new(3);
        pods.get(1).ready = false;
        // Down within the grace: its clusters stay, and no cluster moves anywhere.
        argocd.shards = Some(health.observe(3, &pods.0, start, grace));
        let waiting = argocd.pass();
        assert!(waiting.writes.is_empty(), "{waiting:?}");
        assert_eq!(waiting.shards[&1].units, 3);
        // Past the grace: all three leave at once, each recording where it came from.
        argocd.shards = Some(health.observe(3, &pods.0, start + grace, grace));
        let rescue = argocd.pass();
        assert_eq!(rescue.moved_clusters, 3);
        assert!(
            rescue
                .writes
                .iter()
                .all(|w| w.rescued_from == Some(Some(1)) && w.moves)
        );
        argocd.write(&rescue);
        assert!(on(&argocd, "1").is_empty());
        assert_eq!(argocd_loads(&argocd)[1], 0);
        // Rescued and still dead: nothing more to write.
        assert!(argocd.pass().writes.is_empty());
        // Back: the same three return, and their annotations go.
        pods.get(1).ready = true;
        argocd.shards = Some(health.observe(3, &pods.0, start + 2 * grace, grace));
        let back = argocd.pass();
        assert_eq!(back.moved_clusters, 3);
        assert!(
            back.writes
                .iter()
                .all(|w| w.rescued_from == Some(None) && w.shard == 1)
        );
        argocd.write(&back);
        assert_eq!(on(&argocd, "1"), home);
        assert!(
            argocd
                .secrets
                .iter()
                .all(|s| !s.annotations().contains_key(RESCUED_FROM_ANNOTATION))
        );
        assert!(argocd.pass().writes.is_empty());
    }

    #[test]
    fn nothing_moves_onto_a_shard_that_is_down() {
        let mut argocd = ArgoCd::new(&[10; 6], 3);
        argocd.settle();
        // Shard 0 is down, and a big cluster arrives: it may go to 1 or 2 only.
        argocd.add_cluster("big", 50);
        let mut pods = Pods::new(3);
        pods.get(0).ready = false;
        argocd.shards =
            Some(Health::default().observe(3, &pods.0, Instant::now(), Duration::from_secs(60)));
        let pass = argocd.pass();
        assert!(!pass.writes.is_empty());
        assert!(pass.writes.iter().all(|w| w.shard != 0), "{pass:?}");
    }

    #[test]
    fn secrets_with_a_refresh_pending_are_listed_as_read() {
        let mut argocd = ArgoCd::new(&[10; 4], 2);
        argocd.settle();
        assert!(argocd.pass().pending.is_empty());
        let s = argocd
            .secrets
            .iter_mut()
            .find(|s| s.name_any() == "c02")
            .unwrap();
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(REFRESH_PENDING_ANNOTATION.into(), "1".into());
        s.metadata.resource_version = Some("7".into());
        let pass = argocd.pass();
        assert!(
            pass.writes.is_empty(),
            "a pending refresh is no reason to write a key"
        );
        assert_eq!(
            pass.pending,
            [Pending {
                secret: "c02".into(),
                id: "uid-c02".into(),
                resource_version: "7".into(),
            }]
        );
    }

    #[test]
    fn a_held_pass_writes_nothing_and_says_why() {
        let mut argocd = ArgoCd::new(&[10; 6], 3);
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut unknown = Pods::new(3);
        unknown.get(2).replicas = None;
        argocd.shards = Some(Health::default().observe(3, &unknown.0, now, grace));
        let pass = argocd.pass();
        assert!(pass.writes.is_empty());
        assert!(pass.held.unwrap().contains("controller-2"));
        // No pod Ready at all: nothing to place on, and no error either.
        let mut none = Pods::new(3);
        none.0.iter_mut().for_each(|p| p.ready = false);
        argocd.shards = Some(Health::default().observe(3, &none.0, now, grace));
        let pass = argocd.pass();
        assert!(pass.writes.is_empty());
        assert!(pass.held.unwrap().contains("no controller pod is Ready"));
        assert_eq!(pass.shards.values().map(|f| f.items).sum::<u64>(), 60);
    }

    #[test]
    fn kept_orphaned_and_skipped_clusters_are_never_written_but_kept_ones_count() {
        let mut argocd = ArgoCd::new(&[], 2);
        argocd.secrets.push(secret("kept", Some("1")));
        argocd.add_apps("kept", 50);
        argocd.secrets[0]
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(KEEP_SHARD_ANNOTATION.into(), "true".into());
        argocd.secrets.push(secret("orphan", Some("-1")));
        argocd.add_apps("orphan", 50);
        let mut skipped = secret("skipped", None);
        skipped
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("argocd.argoproj.io/skip-reconcile".into(), "true".into());
        argocd.secrets.push(skipped);
        for name in ["x", "y", "z"] {
            argocd.add_cluster(name, 20);
        }
        let pass = argocd.pass();
        let written: Vec<&str> = pass
            .writes
            .iter()
            .map(|w| w.target.secret.as_str())
            .collect();
        assert_eq!(written, ["x", "y", "z"]);
        // The kept cluster's 50 apps weigh on shard 1: the three others (60) are best on 0.
        let to_zero = pass.writes.iter().filter(|w| w.shard == 0).count();
        assert_eq!(to_zero, 3);
        assert_eq!(pass.left_out.len(), 3, "{:?}", pass.left_out);
        assert!(
            pass.left_out
                .iter()
                .any(|l| l.contains(KEEP_SHARD_ANNOTATION))
        );
    }
}
