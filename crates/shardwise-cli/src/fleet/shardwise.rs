//! shardwise's own resources as a fleet: FleetClusters, FleetApps, and shard labels as the
//! current placement — the same view the planner has.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use shard_assign::Cluster;
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_handoff::keys::{SHARD_LABEL, parse_shard};

use super::{FleetError, LiveFleet, some_names};

/// Builds the fleet of one namespace. Clusters being deleted are left out, as the planner leaves
/// them out; each app counts toward the cluster its `spec.destination.cluster` names.
pub(crate) fn fleet(clusters: &[FleetCluster], apps: &[FleetApp]) -> Result<LiveFleet, FleetError> {
    let mut app_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for app in apps {
        *app_counts
            .entry(app.spec.destination.cluster.as_str())
            .or_default() += 1;
    }
    let mut ordered: Vec<&FleetCluster> = clusters.iter().collect();
    ordered.sort_by_key(|c| c.name_any());

    let mut fleet = LiveFleet::default();
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut deleting = Vec::new();
    for c in ordered {
        let name = c.name_any();
        if c.metadata.deletion_timestamp.is_some() {
            deleting.push(name);
            continue;
        }
        let id = c.uid().ok_or_else(|| FleetError::MissingUid {
            kind: "FleetCluster",
            name: name.clone(),
        })?;
        if c.spec.weight == Some(0) {
            return Err(FleetError::ZeroWeight(name));
        }
        if let Some(value) = c.labels().get(SHARD_LABEL) {
            match parse_shard(value) {
                Some(shard) => {
                    fleet.recorded.insert(id.clone(), shard);
                }
                None => fleet.notes.push(format!(
                    "FleetCluster {name:?} has shard label {value:?}, which is not a shard ordinal; counted as unplaced"
                )),
            }
        }
        fleet.clusters.push(Cluster {
            id,
            apps: app_counts.get(name.as_str()).copied().unwrap_or(0),
            pin: c.spec.shard,
            weight: c.spec.weight,
            name: name.clone(),
        });
        known.insert(name);
    }
    if !deleting.is_empty() {
        fleet.notes.push(format!(
            "{} FleetCluster(s) being deleted are left out: {}",
            deleting.len(),
            some_names(&deleting)
        ));
    }
    let ids: BTreeMap<String, String> = fleet
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.id.clone()))
        .collect();
    for app in apps {
        if let Some(id) = ids.get(&app.spec.destination.cluster) {
            fleet.add_app_key(id, app.metadata.uid.as_deref());
        }
    }
    fleet.finish_keys();
    let mut unmatched: Vec<String> = apps
        .iter()
        .filter(|a| !known.contains(&a.spec.destination.cluster))
        .map(|a| a.name_any())
        .collect();
    unmatched.sort();
    if !unmatched.is_empty() {
        fleet.unmatched_apps = unmatched.len() as u64;
        fleet.notes.push(format!(
            "{} FleetApp(s) target no FleetCluster of the namespace and are not counted: {}",
            unmatched.len(),
            some_names(&unmatched)
        ));
    }
    Ok(fleet)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use shardwise_api::{AppSource, Destination, FleetAppSpec, FleetClusterSpec};

    use super::*;

    fn cluster(name: &str, label: Option<&str>) -> FleetCluster {
        let mut c = FleetCluster::new(
            name,
            FleetClusterSpec {
                server: format!("https://{name}.example:6443"),
                credentials: Default::default(),
                shard: None,
                weight: None,
            },
        );
        c.metadata.uid = Some(format!("uid-{name}"));
        if let Some(value) = label {
            c.labels_mut().insert(SHARD_LABEL.into(), value.into());
        }
        c
    }

    fn app(name: &str, cluster: &str) -> FleetApp {
        FleetApp::new(
            name,
            FleetAppSpec {
                destination: Destination {
                    cluster: cluster.into(),
                    namespace: "default".into(),
                },
                source: AppSource::default(),
                policy: None,
            },
        )
    }

    #[test]
    fn clusters_carry_uid_apps_pin_weight_and_their_label() {
        let mut pinned = cluster("b", Some("2"));
        pinned.spec.shard = Some(1);
        pinned.spec.weight = Some(3);
        let clusters = [pinned, cluster("a", Some("0")), cluster("c", None)];
        let apps = [app("x", "a"), app("y", "b"), app("z", "b")];
        let fleet = fleet(&clusters, &apps).unwrap();
        let summary: Vec<_> = fleet
            .clusters
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.apps, c.pin, c.weight))
            .collect();
        assert_eq!(
            summary,
            [
                ("uid-a", "a", 1, None, None),
                ("uid-b", "b", 2, Some(1), Some(3)),
                ("uid-c", "c", 0, None, None),
            ]
        );
        let recorded: Vec<_> = fleet
            .recorded
            .iter()
            .map(|(id, &s)| (id.as_str(), s))
            .collect();
        assert_eq!(recorded, [("uid-a", 0), ("uid-b", 2)]);
        assert_eq!(fleet.unmatched_apps, 0);
        assert!(fleet.notes.is_empty(), "{:?}", fleet.notes);
    }

    #[test]
    fn app_uids_become_sorted_slice_keys_unless_one_is_missing() {
        let with_uid = |name: &str, cluster: &str| {
            let mut a = app(name, cluster);
            a.metadata.uid = Some(format!("uid-{name}"));
            a
        };
        let apps = [
            with_uid("x", "a"),
            with_uid("y", "a"),
            with_uid("z", "b"),
            app("anonymous", "b"),
        ];
        let fleet = fleet(&[cluster("a", None), cluster("b", None)], &apps).unwrap();
        let mut expected = vec![
            shard_assign::app_key("uid-x"),
            shard_assign::app_key("uid-y"),
        ];
        expected.sort_unstable();
        assert_eq!(fleet.keys.get("uid-a"), Some(&expected));
        // An app without a UID cannot be told to a slice: its cluster is never cut.
        assert_eq!(fleet.keys.get("uid-b"), None);
        assert_eq!(fleet.clusters[1].apps, 2);
    }

    #[test]
    fn invalid_labels_leave_a_cluster_unplaced_with_a_note() {
        let fleet = fleet(&[cluster("a", Some("01")), cluster("b", Some("x"))], &[]).unwrap();
        assert!(fleet.recorded.is_empty());
        assert_eq!(fleet.notes.len(), 2);
        assert!(fleet.notes[0].contains(r#"FleetCluster "a" has shard label "01""#));
    }

    #[test]
    fn apps_of_unknown_or_deleted_clusters_are_not_counted() {
        let mut leaving = cluster("gone", Some("1"));
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        let apps = [app("p", "a"), app("q", "gone"), app("r", "missing")];
        let fleet = fleet(&[cluster("a", Some("0")), leaving], &apps).unwrap();
        assert_eq!(fleet.clusters.len(), 1);
        assert_eq!(fleet.clusters[0].apps, 1);
        assert_eq!(fleet.unmatched_apps, 2);
        assert!(fleet.notes[0].contains(r#"being deleted are left out: "gone""#));
        assert!(fleet.notes[1].contains(r#"not counted: "q", "r""#));
    }

    #[test]
    fn missing_uids_and_zero_weights_are_refused() {
        let mut anonymous = cluster("a", None);
        anonymous.metadata.uid = None;
        assert_eq!(
            fleet(&[anonymous], &[]).unwrap_err(),
            FleetError::MissingUid {
                kind: "FleetCluster",
                name: "a".into()
            }
        );
        let mut weightless = cluster("w", None);
        weightless.spec.weight = Some(0);
        assert_eq!(
            fleet(&[weightless], &[]).unwrap_err(),
            FleetError::ZeroWeight("w".into())
        );
    }
}
