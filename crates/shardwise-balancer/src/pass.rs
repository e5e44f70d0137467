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
    AssignError, Cluster, PreviousPlacement, ShardId, ShardSet, StrategyConfig, assign,
};
use shardwise_runtime::metrics::ShardFigures;

use shardwise_plan::LiveFleet;
use shardwise_plan::argocd::{self, PinTarget};
use shardwise_plan::planning;

/// A cluster Secret annotated with this (`"true"`) keeps its `shard` key: the balancer counts
/// the cluster where Argo CD runs it and never writes the key. The balancer only reads it.
pub const KEEP_SHARD_ANNOTATION: &str = "shardwise.io/keep-shard";

/// What one pass reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// Argo CD's fleet as read.
    pub fleet: &'a LiveFleet,
    /// Argo CD's cluster Secrets, as read (their resourceVersions are the writes' preconditions).
    pub secrets: &'a [Secret],
    /// Argo CD's own algorithm, which places every cluster without a pin it honours.
    pub algorithm: &'a StrategyConfig,
    /// Argo CD's shard count.
    pub replicas: u32,
    /// How the balancer places: `sticky-balanced` and its move budget.
    pub strategy: &'a StrategyConfig,
}

/// What one pass decides.
#[derive(Debug)]
pub struct Pass {
    /// The Secrets whose `shard` key changes, with the key to write, in Secret name order.
    pub writes: Vec<(PinTarget, Option<ShardId>)>,
    /// Clusters whose Argo CD shard changes once the writes land.
    pub moved_clusters: u64,
    /// Their ids, in id order.
    pub moved: Vec<String>,
    /// Their apps.
    pub moved_apps: u64,
    /// Busiest shard over the mean after the pass.
    pub balance: f64,
    /// Every shard of Argo CD after the pass: its clusters and apps.
    pub shards: BTreeMap<ShardId, ShardFigures>,
    /// Secrets the balancer leaves as they are, and why.
    pub left_out: Vec<String>,
}

/// Decides one pass. Every cluster Argo CD shards gets a key (so that Argo CD's algorithm no
/// longer decides), except those annotated with [`KEEP_SHARD_ANNOTATION`]; a key that already
/// names the planned shard (spelled as Argo CD reads it) is not rewritten. A pass fed the
/// Secrets its own writes produced writes nothing, unless the busiest shard is above the target
/// and a move can lower it.
pub fn decide(inputs: &Inputs<'_>) -> Result<Pass, AssignError> {
    let Inputs {
        fleet,
        secrets,
        algorithm,
        replicas,
        strategy,
    } = *inputs;
    let (targets, mut left_out) = argocd::pin_targets(secrets, fleet);
    let kept: BTreeSet<String> = secrets
        .iter()
        .filter(|s| {
            s.annotations()
                .get(KEEP_SHARD_ANNOTATION)
                .and_then(|v| argocd::parse_go_bool(v))
                == Some(true)
        })
        .filter_map(|s| s.uid())
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
    let now = planning::argocd_placement_with(fleet, algorithm, replicas, &BTreeMap::new())?;
    let clusters: Vec<Cluster> = fleet
        .clusters
        .iter()
        .filter_map(|c| {
            let shard = now.shard_of(&c.id)?;
            Some(Cluster {
                pin: (!balanced.contains(&c.id)).then_some(shard),
                weight: None,
                ..c.clone()
            })
        })
        .collect();
    let previous: PreviousPlacement = clusters
        .iter()
        .filter_map(|c| Some((c.id.clone(), now.shard_of(&c.id)?)))
        .collect();
    let planned = assign(
        strategy,
        &clusters,
        &ShardSet::contiguous(replicas),
        Some(&previous),
    )?;

    let writes: Vec<(PinTarget, Option<ShardId>)> = targets
        .into_iter()
        .filter(|t| balanced.contains(&t.id))
        .filter_map(|t| {
            let shard = planned.shard_of(&t.id)?;
            (t.key.as_deref() != Some(shard.to_string().as_str())).then_some((t, Some(shard)))
        })
        .collect();
    let (mut moved, mut moved_apps) = (Vec::new(), 0);
    for c in &clusters {
        if planned.shard_of(&c.id) != now.shard_of(&c.id) {
            moved.push(c.id.clone());
            moved_apps += c.apps;
        }
    }
    moved.sort();
    let shards = planned
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
        .collect();
    Ok(Pass {
        writes,
        moved_clusters: moved.len() as u64,
        moved,
        moved_apps,
        balance: planned.balance().max_over_mean,
        shards,
        left_out,
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

    /// A fleet on Argo CD: cluster Secrets and Applications, changed between passes as Argo CD
    /// and the API server would (a write bumps the resourceVersion).
    struct ArgoCd {
        secrets: Vec<Secret>,
        apps: Vec<DynamicObject>,
        algorithm: StrategyConfig,
        replicas: u32,
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
            decide(&Inputs {
                fleet: &fleet,
                secrets: &self.secrets,
                algorithm: &self.algorithm,
                replicas: self.replicas,
                strategy: &strategy,
            })
            .unwrap()
        }

        /// What the API server does with the writes: the key set, the version bumped.
        fn write(&mut self, pass: &Pass) {
            for (target, shard) in &pass.writes {
                let s = self
                    .secrets
                    .iter_mut()
                    .find(|s| s.name_any() == target.secret)
                    .unwrap();
                let data = s.data.get_or_insert_default();
                match shard {
                    Some(shard) => {
                        data.insert("shard".into(), ByteString(shard.to_string().into_bytes()));
                    }
                    None => {
                        data.remove("shard");
                    }
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
        assert_eq!(pass.moved, changed);
        assert_eq!(pass.moved_clusters, changed.len() as u64);
        // What the balancer refreshes for each: exactly the Applications of that cluster.
        for id in &pass.moved {
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
        assert_eq!(pass.writes[0].0.secret, "c01");
        assert_eq!(pass.writes[0].1.map(|s| s.to_string()), Some(key));
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
        let written: BTreeSet<&str> = pass.writes.iter().map(|(t, _)| t.secret.as_str()).collect();
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
    fn pins_out_of_range_after_a_scale_down_are_spread_over_passes() {
        let mut argocd = ArgoCd::new(&[10; 12], 4);
        argocd.settle();
        // Argo CD scaled to 2: the keys 2 and 3 now mean shard 0.
        argocd.replicas = 2;
        assert_eq!(argocd_loads(&argocd), vec![90, 30]);
        let first = argocd.pass();
        assert!(first.moved_clusters <= u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES));
        argocd.write(&first);
        let (_, moves) = argocd.settle();
        assert_eq!(
            first.moved_clusters + moves,
            3,
            "the minimum: 3 clusters to shard 1"
        );
        assert_eq!(argocd_loads(&argocd), vec![60, 60]);
        for i in 0..12 {
            let key: u32 = argocd.key(&format!("c{i:02}")).unwrap().parse().unwrap();
            assert!(key < 2);
        }
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
        let written: Vec<&str> = pass.writes.iter().map(|(t, _)| t.secret.as_str()).collect();
        assert_eq!(written, ["x", "y", "z"]);
        // The kept cluster's 50 apps weigh on shard 1: the three others (60) are best on 0.
        let to_zero = pass.writes.iter().filter(|(_, s)| *s == Some(0)).count();
        assert_eq!(to_zero, 3);
        assert_eq!(pass.left_out.len(), 3, "{:?}", pass.left_out);
        assert!(
            pass.left_out
                .iter()
                .any(|l| l.contains(KEEP_SHARD_ANNOTATION))
        );
    }
}
