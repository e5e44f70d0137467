//! shardwise's own resources as a fleet: FleetClusters, FleetApps, and the shard labels of
//! FleetClusters and of the UnitSlices of cut ones as the current placement — the same view the
//! planner has.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use shard_assign::{Cluster, KeyRange, ShardId, Slicing, count_in, recorded_cut};
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_handoff::keys::{SHARD_LABEL, SLICES_LABEL, parse_shard};
use shardwise_wire::slice::UnitSlice;

use super::{FleetError, LiveFleet, some_names};

/// Builds the fleet of one namespace. Clusters being deleted are left out, as the planner leaves
/// them out; each app counts toward the cluster its `spec.destination.cluster` names. A cluster
/// labelled as cut is placed by the UnitSlices made for it (same name and UID).
pub fn fleet(
    clusters: &[FleetCluster],
    apps: &[FleetApp],
    slices: &[UnitSlice],
) -> Result<LiveFleet, FleetError> {
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
    // Clusters labelled as cut, as (name, id): placed once their apps' keys are known.
    let mut cut = Vec::new();
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
        // A cut cluster's own record is gone: the planner ignores a shard label left on it.
        if c.labels().contains_key(SLICES_LABEL) {
            cut.push((name.clone(), id.clone()));
        } else if let Some(value) = c.labels().get(SHARD_LABEL) {
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
    record_cuts(&mut fleet, clusters, &cut, slices);
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

/// Places each cut cluster (`cut`: name and id) by its UnitSlices, when they tile the key
/// space; otherwise it stays unplaced, with a note. UnitSlices of no listed FleetCluster (it was
/// deleted, or made again under another UID) are named in a note and ignored.
fn record_cuts(
    fleet: &mut LiveFleet,
    clusters: &[FleetCluster],
    cut: &[(String, String)],
    slices: &[UnitSlice],
) {
    let mut by_unit: BTreeMap<(&str, &str), Vec<&UnitSlice>> = BTreeMap::new();
    for slice in slices {
        let unit = &slice.spec.unit;
        by_unit
            .entry((unit.name.as_str(), unit.uid.as_str()))
            .or_default()
            .push(slice);
    }
    for (name, id) in cut {
        let mine = by_unit
            .remove(&(name.as_str(), id.as_str()))
            .unwrap_or_default();
        // The records the controller can read: a slice's range, and its shard label.
        let mut records: Vec<(KeyRange, ShardId)> = mine
            .iter()
            .filter_map(|s| {
                let shard = s.labels().get(SHARD_LABEL).and_then(|v| parse_shard(v))?;
                Some((s.spec.key_range()?, shard))
            })
            .collect();
        // Read as the planner reads them: a recut under way counts as made if its records
        // tile the key space, as not begun otherwise.
        let ranges: Vec<KeyRange> = records.iter().map(|&(range, _)| range).collect();
        let cut = recorded_cut(&ranges);
        records.retain(|(range, _)| cut.contains(range));
        records.sort();
        records.dedup_by_key(|(range, _)| *range);
        if Slicing::default().with(id.as_str(), cut).is_none() {
            fleet.notes.push(format!(
                "FleetCluster {name:?} is cut ({SLICES_LABEL}) but its UnitSlices do not cover the key space (UnitSlices missing; {} kept with a valid range and shard label, {} without); counted as unplaced",
                records.len(),
                mine.len() - records.len()
            ));
            continue;
        }
        // Strategies that place whole clusters see it where most of its apps are.
        let keys = fleet.keys.get(id).map_or(&[][..], Vec::as_slice);
        let mut apps_on: BTreeMap<ShardId, u64> = BTreeMap::new();
        for &(range, shard) in &records {
            *apps_on.entry(shard).or_default() += count_in(keys, range);
        }
        if let Some((&home, _)) = apps_on
            .iter()
            .max_by_key(|&(&shard, &apps)| (apps, Reverse(shard)))
        {
            fleet.recorded.insert(id.clone(), home);
        }
        fleet.recorded_cuts.insert(id.clone(), records);
    }
    // Slices of a listed cluster that is not cut, or being deleted, are the controller's to
    // clean up and place nothing.
    let listed: BTreeSet<(String, String)> = clusters
        .iter()
        .filter_map(|c| Some((c.name_any(), c.uid()?)))
        .collect();
    let mut strays: Vec<String> = by_unit
        .iter()
        .filter(|((name, uid), _)| !listed.contains(&(name.to_string(), uid.to_string())))
        .flat_map(|(_, slices)| slices.iter().map(|s| s.name_any()))
        .collect();
    strays.sort();
    if !strays.is_empty() {
        fleet.notes.push(format!(
            "{} UnitSlice(s) belong to no FleetCluster of the namespace (deleted, or made again with another UID) and are ignored: {}",
            strays.len(),
            some_names(&strays)
        ));
    }
}

/// Objects as the API server gives them, for tests (this crate's, and with the `fixtures`
/// feature other crates').
#[cfg(any(test, feature = "fixtures"))]
// Fixtures: one that cannot be built is a broken test.
#[allow(clippy::unwrap_used)]
pub mod fixtures {
    use kube::api::DynamicObject;
    use serde_json::{Value, json};
    use shardwise_api::{AppSource, Destination, FleetAppSpec, FleetClusterSpec};
    use shardwise_handoff::plan::ObjectKey;
    use shardwise_wire::slice::UnitSliceSpec;

    use super::*;

    /// An Argo CD Application of Argo CD's namespace with `destination`, UID `uid-app-<name>`.
    pub fn argocd_application(name: &str, destination: Value) -> DynamicObject {
        let mut app = DynamicObject::new(name, &crate::api::application_resource())
            .within("argocd")
            .data(json!({"spec": {"destination": destination}}));
        app.metadata.uid = Some(format!("uid-app-{name}"));
        app
    }

    /// A FleetCluster with UID `uid-<name>` and, if given, a shard label.
    pub fn cluster(name: &str, label: Option<&str>) -> FleetCluster {
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

    /// A FleetCluster cut into `slices` slices: labelled so, with no shard label.
    pub fn cut_cluster(name: &str, slices: usize) -> FleetCluster {
        let mut c = cluster(name, None);
        c.labels_mut()
            .insert(SLICES_LABEL.into(), slices.to_string());
        c
    }

    /// A FleetApp without a UID.
    pub fn app(name: &str, cluster: &str) -> FleetApp {
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

    /// `count` FleetApps of `cluster` with random UIDs, as the API server makes them (so that
    /// their keys spread over the key space).
    pub fn keyed_apps(cluster: &str, count: u64) -> Vec<FleetApp> {
        (0..count)
            .map(|n| {
                let mut a = app(&format!("{cluster}-{n}"), cluster);
                a.metadata.uid = Some(shardwise_sim::app_uid(cluster, n));
                a
            })
            .collect()
    }

    /// The UnitSlice of `range` of the FleetCluster `cluster` whose UID is `uid`, with a shard
    /// label if given.
    pub fn unit_slice(cluster: &str, uid: &str, range: KeyRange, shard: Option<&str>) -> UnitSlice {
        let unit = ObjectKey::new("shardwise", cluster);
        let name = format!("{cluster}-{}-{:x}", range.depth(), range.index());
        let mut slice = UnitSlice::new(&name, UnitSliceSpec::new(&unit, uid, range));
        if let Some(value) = shard {
            slice.labels_mut().insert(SHARD_LABEL.into(), value.into());
        }
        slice
    }

    /// FleetCluster "hot" (360 apps) cut into three UnitSlices on shards 0, 1 and 2, three
    /// whole clusters "a", "b" and "c" that bring every shard to exactly 200 apps, and a
    /// UnitSlice left by an earlier "hot"; with the cut and the apps of each slice. Hot is
    /// heavier than a shard's share at 2 replicas too, so that it stays cut then.
    pub fn cut_fleet() -> (LiveFleet, [KeyRange; 3], [u64; 3]) {
        let range = |depth, index| KeyRange::new(depth, index).unwrap();
        let cut = [range(2, 0), range(2, 1), range(1, 1)];
        let mut apps = keyed_apps("hot", 360);
        let mut keys: Vec<u64> = apps
            .iter()
            .filter_map(|a| a.metadata.uid.as_deref())
            .map(shard_assign::app_key)
            .collect();
        keys.sort_unstable();
        let in_slice = cut.map(|r| count_in(&keys, r));
        assert!(in_slice.iter().all(|&n| n <= 200), "{in_slice:?}");
        let mut clusters = vec![cut_cluster("hot", 3)];
        let mut slices = vec![unit_slice("hot", "uid-hot-before", range(1, 0), Some("1"))];
        for (shard, name) in ["a", "b", "c"].into_iter().enumerate() {
            let label = shard.to_string();
            clusters.push(cluster(name, Some(&label)));
            apps.extend(keyed_apps(name, 200 - in_slice[shard]));
            slices.push(unit_slice("hot", "uid-hot", cut[shard], Some(&label)));
        }
        let fleet = fleet(&clusters, &apps, &slices).unwrap();
        (fleet, cut, in_slice)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::fixtures::*;
    use super::*;

    #[test]
    fn clusters_carry_uid_apps_pin_weight_and_their_label() {
        let mut pinned = cluster("b", Some("2"));
        pinned.spec.shard = Some(1);
        pinned.spec.weight = Some(3);
        let clusters = [pinned, cluster("a", Some("0")), cluster("c", None)];
        let apps = [app("x", "a"), app("y", "b"), app("z", "b")];
        let fleet = fleet(&clusters, &apps, &[]).unwrap();
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
        let fleet = fleet(&[cluster("a", None), cluster("b", None)], &apps, &[]).unwrap();
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
        let fleet = fleet(
            &[cluster("a", Some("01")), cluster("b", Some("x"))],
            &[],
            &[],
        )
        .unwrap();
        assert!(fleet.recorded.is_empty());
        assert_eq!(fleet.notes.len(), 2);
        assert!(fleet.notes[0].contains(r#"FleetCluster "a" has shard label "01""#));
    }

    #[test]
    fn apps_of_unknown_or_deleted_clusters_are_not_counted() {
        let mut leaving = cluster("gone", Some("1"));
        leaving.metadata.deletion_timestamp = Some(Time(Default::default()));
        let apps = [app("p", "a"), app("q", "gone"), app("r", "missing")];
        let fleet = fleet(&[cluster("a", Some("0")), leaving], &apps, &[]).unwrap();
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
            fleet(&[anonymous], &[], &[]).unwrap_err(),
            FleetError::MissingUid {
                kind: "FleetCluster",
                name: "a".into()
            }
        );
        let mut weightless = cluster("w", None);
        weightless.spec.weight = Some(0);
        assert_eq!(
            fleet(&[weightless], &[], &[]).unwrap_err(),
            FleetError::ZeroWeight("w".into())
        );
    }

    #[test]
    fn a_cut_cluster_is_placed_by_its_unit_slices() {
        let range = |depth, index| KeyRange::new(depth, index).unwrap();
        let (low, high) = (range(1, 0), range(1, 1));
        let mut hot = cut_cluster("hot", 3);
        // A shard label left on a cut cluster is no record of it.
        hot.labels_mut().insert(SHARD_LABEL.into(), "7".into());
        let mut gone = cut_cluster("gone", 2);
        gone.metadata.deletion_timestamp = Some(Time(Default::default()));
        let clusters = [
            hot,
            cut_cluster("torn", 2),
            cluster("whole", Some("1")),
            gone,
        ];
        let mut apps = keyed_apps("hot", 200);
        apps.extend(keyed_apps("torn", 10));
        let slices = [
            unit_slice("hot", "uid-hot", high, Some("1")),
            unit_slice("hot", "uid-hot", range(2, 0), Some("2")),
            unit_slice("hot", "uid-hot", range(2, 1), Some("0")),
            // Two halves, one without a shard: they do not cover every key.
            unit_slice("torn", "uid-torn", low, Some("1")),
            unit_slice("torn", "uid-torn", high, Some("one")),
            // Left by an earlier FleetCluster "hot", deleted and made again.
            unit_slice("hot", "uid-hot-before", low, Some("0")),
            // Of a cluster being deleted, or one that is whole again: no record, no note.
            unit_slice("gone", "uid-gone", low, Some("0")),
            unit_slice("whole", "uid-whole", low, Some("0")),
        ];
        let fleet = fleet(&clusters, &apps, &slices).unwrap();

        let cuts: Vec<_> = fleet.recorded_cuts.iter().collect();
        assert_eq!(
            cuts,
            [(
                &"uid-hot".to_string(),
                &vec![(range(2, 0), 2), (range(2, 1), 0), (high, 1)]
            )]
        );
        // Placed, for whole-cluster strategies, on the shard of its biggest slice.
        let keys = &fleet.keys["uid-hot"];
        let apps_in = |r| count_in(keys, r);
        assert!(apps_in(high) > apps_in(range(2, 0)).max(apps_in(range(2, 1))));
        let recorded: Vec<_> = fleet
            .recorded
            .iter()
            .map(|(id, &s)| (id.as_str(), s))
            .collect();
        assert_eq!(recorded, [("uid-hot", 1), ("uid-whole", 1)]);
        assert_eq!(fleet.shards_in_use(), Some(3));

        assert_eq!(fleet.notes.len(), 3, "{:?}", fleet.notes);
        assert!(fleet.notes[0].contains(r#"being deleted are left out: "gone""#));
        assert_eq!(
            fleet.notes[1],
            r#"FleetCluster "torn" is cut (shardwise.io/slices) but its UnitSlices do not cover the key space (UnitSlices missing; 1 kept with a valid range and shard label, 1 without); counted as unplaced"#
        );
        assert_eq!(
            fleet.notes[2],
            r#"1 UnitSlice(s) belong to no FleetCluster of the namespace (deleted, or made again with another UID) and are ignored: "hot-1-0""#
        );
    }

    #[test]
    fn a_cut_cluster_without_unit_slices_is_unplaced() {
        let fleet = fleet(&[cut_cluster("hot", 2)], &keyed_apps("hot", 4), &[]).unwrap();
        assert!(fleet.recorded.is_empty());
        assert!(fleet.recorded_cuts.is_empty());
        assert!(fleet.notes[0].contains("0 kept with a valid range and shard label, 0 without"));
        assert_eq!(fleet.shards_in_use(), None);
    }
}
