//! Which of Argo CD's clusters a live controller reconciles, from the fleet and the controller
//! pods as read. No I/O.
//!
//! Argo CD never says that a cluster has no controller: its Applications keep the last status
//! they were given (Synced, Healthy) while nothing reconciles them. A cluster goes unreconciled
//! when its Secret's key is negative (the user's choice, or shardwise-balancer's for the moment
//! of a handover) or the Secret says `skip-reconcile`, when the shard its key
//! (or Argo CD's algorithm) names has no pod, or when that shard's pod is not Ready; and it may
//! go unreconciled when two Secrets with its server have different keys. Each pod
//! reads keys with its own replica count, so a cluster is judged pod by pod: reconciled when a
//! Ready pod takes it as its own.

use std::collections::BTreeMap;

use shard_assign::{AssignError, ShardId, StrategyConfig};

use crate::LiveFleet;
use crate::installation::ControllerPod;
use crate::planning;

/// One cluster, as the controllers running now treat it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterCoverage {
    /// The cluster's id (its Secret's UID).
    pub id: String,
    /// Argo CD's name of the cluster.
    pub name: String,
    /// Its Applications.
    pub apps: u64,
    /// The Ready pods that reconcile it, by name.
    pub reconciled_by: Vec<String>,
    /// Why no Ready pod reconciles it, when none does.
    pub why: Option<String>,
}

/// Every cluster of an Argo CD fleet and who reconciles it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// In the fleet's order (cluster name).
    pub clusters: Vec<ClusterCoverage>,
    /// Pods whose replica count cannot be told: what they reconcile is not known, and no
    /// cluster is said to be unreconciled while one runs.
    pub unknown: Vec<String>,
}

impl Coverage {
    /// The clusters no Ready pod reconciles.
    pub fn unreconciled(&self) -> impl Iterator<Item = &ClusterCoverage> {
        self.clusters.iter().filter(|c| c.why.is_some())
    }

    /// The Applications of the clusters no Ready pod reconciles.
    pub fn unreconciled_apps(&self) -> u64 {
        self.unreconciled().map(|c| c.apps).sum()
    }
}

/// Who reconciles each cluster of `fleet`, placed by Argo CD's `algorithm` with each running
/// pod's own replica count, given the `pods` of the application controller.
pub fn coverage(
    fleet: &LiveFleet,
    algorithm: &StrategyConfig,
    pods: &[ControllerPod],
) -> Result<Coverage, AssignError> {
    let unknown: Vec<String> = pods
        .iter()
        .filter(|p| p.replicas.is_none())
        .map(|p| p.name.clone())
        .collect();
    // Argo CD's placement as each replica count in use reads the keys.
    let mut placements = BTreeMap::new();
    for count in pods.iter().filter_map(|p| p.replicas) {
        if let std::collections::btree_map::Entry::Vacant(e) = placements.entry(count) {
            e.insert(planning::argocd_placement_with(
                fleet,
                algorithm,
                count.max(1),
                &BTreeMap::new(),
            )?);
        }
    }
    // A pod without sharding (a count of 1 or less) reconciles every cluster it knows of.
    let takes = |pod: &ControllerPod, id: &str| -> bool {
        match pod.replicas {
            Some(count) if count <= 1 => true,
            Some(count) => {
                let placed = placements.get(&count).and_then(|p| p.shard_of(id));
                placed.is_some() && placed == pod.shard
            }
            None => false,
        }
    };
    let clusters = fleet
        .clusters
        .iter()
        .map(|c| {
            let orphaned = fleet.orphaned.contains(&c.id);
            let reconciled_by: Vec<String> = pods
                .iter()
                .filter(|p| p.ready && !orphaned && takes(p, &c.id))
                .map(|p| p.name.clone())
                .collect();
            let why = match fleet.shadowed.get(&c.id) {
                // Whichever Secret Argo CD kept decides: not knowing it is no better than none.
                Some(others) => Some(format!(
                    "Secret(s) {} have its server with another shard key: Argo CD keeps one Secret per server, which one is not defined",
                    others.join(", ")
                )),
                None => (reconciled_by.is_empty() && unknown.is_empty())
                    .then(|| why_unreconciled(
                        c.id.as_str(),
                        orphaned,
                        fleet.parked.get(&c.id).copied(),
                        pods,
                        &takes,
                    )),
            };
            ClusterCoverage {
                id: c.id.clone(),
                name: c.name.clone(),
                apps: c.apps,
                reconciled_by,
                why,
            }
        })
        .collect();
    Ok(Coverage { clusters, unknown })
}

/// Why no Ready pod takes cluster `id`.
fn why_unreconciled(
    id: &str,
    orphaned: bool,
    parked: Option<ShardId>,
    pods: &[ControllerPod],
    takes: &impl Fn(&ControllerPod, &str) -> bool,
) -> String {
    if let Some(to) = parked {
        return format!(
            "shardwise-balancer parked it while it hands it over to shard {to}: no controller takes it until then"
        );
    }
    if orphaned {
        return "its Secret has a negative shard key or skip-reconcile: no controller takes it"
            .to_string();
    }
    let waiting: Vec<&str> = pods
        .iter()
        .filter(|p| takes(p, id))
        .map(|p| p.name.as_str())
        .collect();
    if pods.is_empty() {
        "no controller pod runs".to_string()
    } else if waiting.is_empty() {
        "the shard its key names has no controller pod".to_string()
    } else {
        format!("its controller {} is not Ready", waiting.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::DynamicObject;
    use serde_json::json;
    use shard_assign::StrategyKind;

    use super::*;
    use crate::argocd::{self, ArgoCdLoad};
    use crate::shardwise::fixtures::argocd_application;

    fn secret(name: &str, shard: Option<&str>, skip: bool) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.uid = Some(format!("uid-{name}"));
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
        if skip {
            s.metadata.annotations = Some(BTreeMap::from([(
                "argocd.argoproj.io/skip-reconcile".to_string(),
                "true".to_string(),
            )]));
        }
        s
    }

    fn pod(shard: shard_assign::ShardId, replicas: u32, ready: bool) -> ControllerPod {
        ControllerPod {
            name: format!("controller-{shard}"),
            shard: Some(shard),
            replicas: Some(replicas),
            ready,
            terminating: false,
            ..ControllerPod::default()
        }
    }

    /// Clusters `a` to `f`, two apps each, keyed as given.
    fn fleet(keys: &[(&str, Option<&str>, bool)]) -> LiveFleet {
        let secrets: Vec<Secret> = keys
            .iter()
            .map(|(n, k, skip)| secret(n, *k, *skip))
            .collect();
        let apps: Vec<DynamicObject> = keys
            .iter()
            .flat_map(|(n, _, _)| {
                (0..2).map(move |i| argocd_application(&format!("{n}{i}"), json!({"name": n})))
            })
            .collect();
        argocd::fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap()
    }

    fn why<'a>(coverage: &'a Coverage, name: &str) -> Option<&'a str> {
        coverage
            .clusters
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .why
            .as_deref()
    }

    #[test]
    fn each_cause_of_an_unreconciled_cluster_is_found_and_named() {
        let fleet = fleet(&[
            ("a", Some("0"), false),
            ("b", Some("1"), false),
            ("c", Some("2"), false),
            ("d", Some("-1"), false),
            ("e", Some("0"), true),
            ("f", Some("3"), false),
        ]);
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        // Four replicas asked for, pod 3 missing and pod 1 not Ready.
        let pods = [pod(0, 4, true), pod(1, 4, false), pod(2, 4, true)];
        let coverage = coverage(&fleet, &legacy, &pods).unwrap();
        assert_eq!(why(&coverage, "a"), None);
        assert_eq!(why(&coverage, "c"), None);
        assert_eq!(
            why(&coverage, "b"),
            Some("its controller controller-1 is not Ready")
        );
        assert!(why(&coverage, "d").unwrap().contains("negative shard key"));
        assert!(why(&coverage, "e").unwrap().contains("skip-reconcile"));
        assert_eq!(
            why(&coverage, "f"),
            Some("the shard its key names has no controller pod")
        );
        let names: Vec<&str> = coverage.unreconciled().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["b", "d", "e", "f"]);
        assert_eq!(coverage.unreconciled_apps(), 8);
    }

    #[test]
    fn a_cluster_parked_for_a_handover_is_unreconciled_and_says_where_it_goes() {
        let mut fleet = fleet(&[("a", Some("0"), false), ("d", Some("-1"), false)]);
        let d = fleet
            .clusters
            .iter()
            .find(|c| c.name == "d")
            .unwrap()
            .id
            .clone();
        fleet.parked.insert(d, 1);
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let coverage = coverage(&fleet, &legacy, &[pod(0, 2, true), pod(1, 2, true)]).unwrap();
        assert_eq!(why(&coverage, "a"), None);
        assert_eq!(
            why(&coverage, "d"),
            Some(
                "shardwise-balancer parked it while it hands it over to shard 1: no controller takes it until then"
            )
        );
        assert_eq!(coverage.unreconciled_apps(), 2);
    }

    #[test]
    fn two_secrets_of_one_server_with_different_keys_are_not_counted_as_reconciled() {
        let mut same = secret("same", Some("1"), false);
        let mut other = secret("other", Some("2"), false);
        for s in [&mut same, &mut other] {
            s.data
                .as_mut()
                .unwrap()
                .insert("server".into(), ByteString(b"https://a.example".to_vec()));
        }
        let secrets = [secret("a", Some("1"), false), same, other];
        let fleet = argocd::fleet(&secrets, &[], false, ArgoCdLoad::Apps).unwrap();
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let pods = [pod(0, 3, true), pod(1, 3, true), pod(2, 3, true)];
        let coverage = coverage(&fleet, &legacy, &pods).unwrap();
        let a = why(&coverage, "a").unwrap();
        assert!(a.starts_with("Secret(s) other have its server"), "{a}");
    }

    #[test]
    fn pods_of_two_counts_each_read_the_keys_with_their_own() {
        let fleet = fleet(&[("a", Some("3"), false), ("b", None, false)]);
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        // 3 -> 4 under way: pod 3 runs with 4, pods 0 to 2 still with 3.
        let pods = [
            pod(0, 3, true),
            pod(1, 3, true),
            pod(2, 3, true),
            pod(3, 4, true),
        ];
        let coverage = coverage(&fleet, &legacy, &pods).unwrap();
        let a = &coverage.clusters[0];
        // Key 3 is shard 0 to a pod counting 3, shard 3 to one counting 4: two owners.
        assert_eq!(a.reconciled_by, ["controller-0", "controller-3"]);
        // A pod whose count cannot be told: nothing is said to be unreconciled.
        let mut blind = pods.to_vec();
        blind[3].replicas = None;
        blind[0].ready = false;
        let coverage = super::coverage(&fleet, &legacy, &blind).unwrap();
        assert_eq!(coverage.unknown, ["controller-3"]);
        assert_eq!(coverage.unreconciled_apps(), 0);
        // A pod that does not shard takes every cluster.
        let single = [pod(0, 1, true)];
        let coverage = super::coverage(&fleet, &legacy, &single).unwrap();
        assert!(
            coverage
                .clusters
                .iter()
                .all(|c| c.reconciled_by == ["controller-0"])
        );
    }
}
