//! When a parked cluster has been let go. No I/O.
//!
//! Argo CD's controllers each read the `shard` keys through informers of their own, so a key
//! rewritten from one shard to another is seen by the two controllers at different moments: for
//! that moment both reconcile the cluster (auto-sync and hooks run twice), or, the other way
//! round, neither does. The balancer therefore hands a cluster over in two writes: first a key
//! no controller takes ([`shardwise_plan::argocd::PARKED_KEY`]), then, once no controller lists
//! any of the cluster's Applications in its `argocd_app_info` any more, the key of its new
//! shard. The cluster is then unowned for a moment, never owned twice.

use std::collections::{BTreeMap, BTreeSet};

use shardwise_plan::LiveFleet;
use shardwise_plan::installation::ControllerPod;

use crate::scrape::Scraped;

/// Of the `parked` clusters (by id), those a controller may still reconcile, each with why:
/// a pod that lists one of its Applications, or a Ready pod, not being deleted, whose metrics
/// did not answer (it may). A pod that did not answer and is not Ready, or is being deleted,
/// is taken to have let go: its process is starting, stopping or gone, and waiting for it
/// would leave the cluster unowned for as long as it stays so.
pub fn holders(
    parked: &BTreeSet<String>,
    fleet: &LiveFleet,
    pods: &[ControllerPod],
    scraped: &Scraped,
) -> BTreeMap<String, Vec<String>> {
    let mut holding: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let silent: Vec<&ControllerPod> = pods
        .iter()
        .filter(|p| p.ip.is_some() && !scraped.scrapes.contains_key(&p.uid))
        .filter(|p| p.ready && !p.terminating)
        .collect();
    for id in parked {
        let apps: BTreeSet<String> = fleet
            .cluster_apps
            .get(id)
            .into_iter()
            .flatten()
            .map(|(namespace, name)| format!("{namespace}/{name}"))
            .collect();
        if apps.is_empty() {
            // No Application: nothing can be reconciled twice.
            continue;
        }
        let mut why = Vec::new();
        for pod in pods {
            let Some(scrape) = scraped.scrapes.get(&pod.uid) else {
                continue;
            };
            let listed = scrape.apps.intersection(&apps).count();
            if listed > 0 {
                why.push(format!(
                    "{} lists {listed} of its {} Application(s)",
                    pod.name,
                    apps.len()
                ));
            }
        }
        why.extend(
            silent
                .iter()
                .map(|p| format!("{} is Ready but its metrics did not answer", p.name)),
        );
        if !why.is_empty() {
            holding.insert(id.clone(), why);
        }
    }
    holding
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measured::Scrape;

    fn pod(name: &str, ready: bool, terminating: bool) -> ControllerPod {
        ControllerPod {
            name: name.to_string(),
            uid: format!("uid-{name}"),
            ip: Some(format!("10.0.0.{}", name.len())),
            ready,
            terminating,
            ..ControllerPod::default()
        }
    }

    fn listing(apps: &[&str]) -> Scrape {
        Scrape {
            apps: apps.iter().map(|a| a.to_string()).collect(),
            ..Scrape::default()
        }
    }

    /// Clusters `a` (apps argocd/a1, argocd/a2), `b` (argocd/b1) and `e` (none).
    fn fleet() -> LiveFleet {
        let mut fleet = LiveFleet::default();
        let apps = |names: &[&str]| -> Vec<(String, String)> {
            names
                .iter()
                .map(|n| ("argocd".to_string(), n.to_string()))
                .collect()
        };
        fleet.cluster_apps.insert("a".into(), apps(&["a1", "a2"]));
        fleet.cluster_apps.insert("b".into(), apps(&["b1"]));
        fleet.cluster_apps.insert("e".into(), Vec::new());
        fleet
    }

    fn parked(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|i| i.to_string()).collect()
    }

    #[test]
    fn a_cluster_is_held_while_any_controller_lists_one_of_its_apps() {
        let pods = [pod("c0", true, false), pod("c1", true, false)];
        let mut scraped = Scraped::default();
        scraped
            .scrapes
            .insert("uid-c0".into(), listing(&["argocd/a2", "argocd/x"]));
        scraped.scrapes.insert("uid-c1".into(), listing(&[]));
        let holding = holders(&parked(&["a", "b", "e"]), &fleet(), &pods, &scraped);
        assert_eq!(
            holding,
            BTreeMap::from([(
                "a".to_string(),
                vec!["c0 lists 1 of its 2 Application(s)".to_string()]
            )])
        );
        // Let go everywhere: released.
        scraped
            .scrapes
            .insert("uid-c0".into(), listing(&["argocd/x"]));
        assert!(holders(&parked(&["a", "b"]), &fleet(), &pods, &scraped).is_empty());
    }

    #[test]
    fn a_ready_controller_that_does_not_answer_may_hold_every_cluster_with_apps() {
        let pods = [
            pod("c0", true, false),
            pod("c1", false, false),
            pod("c2", true, true),
        ];
        let mut scraped = Scraped::default();
        scraped
            .scrapes
            .insert("uid-c1".into(), listing(&["argocd/b1"]));
        let holding = holders(&parked(&["a", "b", "e"]), &fleet(), &pods, &scraped);
        let silent = "c0 is Ready but its metrics did not answer".to_string();
        assert_eq!(
            holding,
            BTreeMap::from([
                ("a".to_string(), vec![silent.clone()]),
                (
                    "b".to_string(),
                    vec!["c1 lists 1 of its 1 Application(s)".to_string(), silent]
                ),
            ])
        );
        // A pod that is not Ready, or is being deleted, and does not answer holds nothing;
        // one without an address has no process to ask.
        let pods = [
            pod("c1", false, false),
            pod("c2", true, true),
            ControllerPod {
                ip: None,
                ..pod("c3", true, false)
            },
        ];
        assert!(holders(&parked(&["a"]), &fleet(), &pods, &Scraped::default()).is_empty());
    }
}
