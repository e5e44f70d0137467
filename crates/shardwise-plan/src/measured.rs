//! Measured load for `plan --source shardwise --load measured`: the load reports shardwise's
//! replicas publish on their shard Leases, read as the elected planner reads them, and the
//! weight the planner would place each FleetCluster with. The weighting is the planner's own
//! (`shardwise_runtime::estimate`); this module gives it what the planner's index would hold,
//! without I/O (`api` lists the Leases).

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use serde::Serialize;
use shard_assign::ShardSet;
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_handoff::keys::{LOAD_ANNOTATION, SHARD_LABEL, SLICES_LABEL, parse_shard};
use shardwise_handoff::plan::{ObjectKey, RecordKey, UnitView};
use shardwise_runtime::estimate::{LeaseLoads, first_pass, slice_records};
use shardwise_runtime::objects::{key_of, record_of};
use shardwise_wire::load::MeasuredLoads;
use shardwise_wire::slice::UnitSlice;

use super::LiveFleet;

/// The load reports of the shard Leases, merged as the planner merges them.
#[derive(Debug, Default)]
pub struct Reports {
    /// The merged loads.
    pub loads: MeasuredLoads,
    /// Shard Leases read (those with a valid shard label; the planner ignores the others).
    pub leases: usize,
    /// Reports taken in.
    pub reports: usize,
    /// What the reader should know about them.
    pub notes: Vec<String>,
    /// Reports that could not be read, each naming its Lease.
    pub warnings: Vec<String>,
}

/// Reads the report of every shard Lease. A Lease without a renewal time (released) carries no
/// current report and one that is not a report is left out, as the planner leaves them out;
/// `plan` says so.
pub fn reports(leases: &[Lease]) -> Reports {
    let now = Instant::now();
    let mut read = LeaseLoads::default();
    let mut reports = Reports::default();
    let mut sorted: Vec<&Lease> = leases.iter().collect();
    sorted.sort_by_key(|l| l.name_any());
    for lease in sorted {
        let name = lease.name_any();
        let Some(shard) = lease.labels().get(SHARD_LABEL).and_then(|v| parse_shard(v)) else {
            continue;
        };
        reports.leases += 1;
        if !lease.annotations().contains_key(LOAD_ANNOTATION) {
            continue;
        }
        if lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .is_none()
        {
            reports.notes.push(format!(
                "shard Lease {name:?} is released (no renewTime): its load report is not current and is left out"
            ));
            continue;
        }
        match read.observe(lease, shard, now) {
            Ok(()) => reports.reports += 1,
            Err(e) => reports.warnings.push(format!(
                "shard Lease {name:?} has a {LOAD_ANNOTATION} annotation that cannot be read ({e}); its report is left out"
            )),
        }
    }
    reports.loads = read.measured().clone();
    reports
}

/// Where the measured weights came from; its JSON form is documented in docs/plan.md.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeasuredSummary {
    /// What one unit of `load` is under this model.
    pub unit: &'static str,
    /// Shard Leases read.
    pub leases: usize,
    /// The load reports taken from them.
    pub reports: usize,
    /// Clusters of the fleet.
    pub clusters: usize,
    /// Clusters weighed by their measured cost per app.
    pub measured: usize,
    /// Clusters measured whose `spec.weight` overrides the measurement.
    pub overridden: usize,
    /// Busy seconds per second the reports give the fleet's clusters, in total.
    pub busy: f64,
    /// Busy seconds per second of an app of the fleet's average cost (load 1000); `None` while
    /// nothing is measured, or everything measured is idle: every cluster then weighs
    /// 1000 × its `spec.weight` (or 1).
    pub busy_per_app: Option<f64>,
}

/// What `load` counts under the measured model.
const UNIT: &str =
    "apps x weight, where weight 1000 is an app of the fleet's average measured cost";

/// Each cluster's measured weight by id, and where they came from.
#[derive(Debug)]
pub struct Weighed {
    /// Each measured cluster's weight, by id.
    pub weights: BTreeMap<String, u32>,
    /// Where they came from.
    pub summary: MeasuredSummary,
}

impl Weighed {
    /// Gives each cluster of `fleet` its measured weight, and the fleet the summary.
    pub fn apply(self, fleet: &mut LiveFleet) {
        for cluster in &mut fleet.clusters {
            if let Some(&weight) = self.weights.get(&cluster.id) {
                cluster.weight = Some(weight);
            }
        }
        fleet.measured = Some(self.summary);
    }
}

/// The weight the planner's measured model gives each FleetCluster (by UID) on its first pass
/// with `reports`: the latest reports alone, no smoothing. Clusters being deleted are left out,
/// as the planner leaves them out; a cut cluster's slices (its UnitSlices with a range) add up
/// into its cost.
pub fn weigh(
    clusters: &[FleetCluster],
    apps: &[FleetApp],
    slices: &[UnitSlice],
    reports: &Reports,
    live: &ShardSet,
) -> Weighed {
    let views = views(clusters, slices);
    let mut items: BTreeMap<ObjectKey, u64> = BTreeMap::new();
    for app in apps {
        let cluster = ObjectKey::new(
            app.namespace().unwrap_or_default(),
            &app.spec.destination.cluster,
        );
        *items.entry(cluster).or_default() += 1;
    }
    let pass = first_pass(&views, &items, &reports.loads, live);

    let (mut measured, mut overridden, mut busy) = (0, 0, 0.0);
    for view in &views {
        let (mut unit_busy, mut unit_items) = (0.0, 0u64);
        for record in view.records() {
            let key = RecordKey {
                unit: view.key.clone(),
                range: record.range,
            };
            if let Some(m) = reports.loads.get(&key) {
                unit_busy += m.load.busy;
                unit_items += m.load.items;
            }
        }
        busy += unit_busy;
        // As the model: a cluster is measured once its records hold an item.
        if unit_items > 0 {
            if view.weight.is_some() {
                overridden += 1;
            } else {
                measured += 1;
            }
        }
    }
    Weighed {
        weights: pass.weights,
        summary: MeasuredSummary {
            unit: UNIT,
            leases: reports.leases,
            reports: reports.reports,
            clusters: views.len(),
            measured,
            overridden,
            busy,
            busy_per_app: pass.busy_per_item,
        },
    }
}

/// The FleetClusters as the planner's index sees them: not being deleted, with the records of
/// the UnitSlices made for them (same name and UID).
fn views(clusters: &[FleetCluster], slices: &[UnitSlice]) -> Vec<UnitView> {
    let mut records = slice_records(slices);
    clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| {
            let key = key_of(c);
            let uid = c.uid().unwrap_or_default();
            UnitView {
                slices: records
                    .remove(&(key.clone(), uid.clone()))
                    .unwrap_or_default(),
                key,
                uid,
                pin: c.spec.shard,
                weight: c.spec.weight,
                record: record_of(c),
                cut: c.labels().contains_key(SLICES_LABEL),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shard_assign::KeyRange;
    use shardwise_handoff::keys::{LEASE_KIND_LABEL, STATEFULSET_LABEL};

    use super::super::shardwise::fixtures::{cluster, cut_cluster, keyed_apps, unit_slice};
    use super::*;

    const NS: &str = "shardwise";

    /// A shard Lease of StatefulSet shardwise for `shard`, renewed unless `released`, carrying
    /// `report` as its load annotation.
    fn lease(shard: u32, report: &str, released: bool) -> Lease {
        let renew = (!released).then_some("2030-01-01T00:00:00.000000Z");
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("shardwise-shard-{shard}"),
                "namespace": NS,
                "resourceVersion": "1",
                "labels": {
                    LEASE_KIND_LABEL: "shard",
                    STATEFULSET_LABEL: "shardwise",
                    SHARD_LABEL: shard.to_string(),
                },
                "annotations": {LOAD_ANNOTATION: report},
            },
            "spec": {"holderIdentity": format!("shardwise-{shard}"), "renewTime": renew},
        }))
        .unwrap()
    }

    fn in_namespace<K: ResourceExt>(mut object: K) -> K {
        object.meta_mut().namespace = Some(NS.into());
        object
    }

    fn whole(name: &str) -> String {
        format!("{NS}/{name}")
    }

    #[test]
    fn weights_are_the_planners_from_the_latest_reports() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let mut pinned = cluster("pinned", Some("1"));
        pinned.spec.weight = Some(3);
        let clusters: Vec<FleetCluster> = [
            cluster("cheap", Some("0")),
            cluster("dear", Some("1")),
            cluster("new", Some("0")),
            pinned,
            cut_cluster("hot", 2),
        ]
        .into_iter()
        .map(in_namespace)
        .collect();
        let apps: Vec<FleetApp> = [
            ("cheap", 10),
            ("dear", 10),
            ("new", 5),
            ("pinned", 5),
            ("hot", 20),
        ]
        .into_iter()
        .flat_map(|(name, n)| keyed_apps(name, n))
        .map(in_namespace)
        .collect();
        let slices: Vec<UnitSlice> = [(low, "0"), (high, "1")]
            .into_iter()
            .map(|(range, shard)| in_namespace(unit_slice("hot", "uid-hot", range, Some(shard))))
            .collect();
        let record =
            |key: String, busy: f64, items: u64| (key, json!({"busy": busy, "items": items}));
        let report = |records: Vec<(String, serde_json::Value)>| {
            let records: serde_json::Map<String, serde_json::Value> = records.into_iter().collect();
            json!({"v": 1, "records": records}).to_string()
        };
        let leases = [
            // cheap costs 0.1 busy s/s per app, dear 0.2; hot's slices 0.05 and 0.15, 0.1 in all.
            lease(
                0,
                &report(vec![
                    record(whole("cheap"), 1.0, 10),
                    record(format!("{}#{low}", whole("hot")), 0.5, 10),
                ]),
                false,
            ),
            lease(
                1,
                &report(vec![
                    record(whole("dear"), 2.0, 10),
                    record(format!("{}#{high}", whole("hot")), 1.5, 10),
                    // Measured, but its spec.weight stands.
                    record(whole("pinned"), 1.0, 5),
                ]),
                false,
            ),
            // Neither counts: were they read, cheap would weigh far more than dear.
            lease(2, "{not a report", false),
            lease(3, &report(vec![record(whole("cheap"), 100.0, 10)]), true),
        ];

        let reports = reports(&leases);
        assert_eq!((reports.leases, reports.reports), (4, 2));
        assert_eq!(reports.warnings.len(), 1, "{:?}", reports.warnings);
        assert!(
            reports.warnings[0].starts_with(
                "shard Lease \"shardwise-shard-2\" has a shardwise.io/load annotation that cannot be read (not a load report: "
            ),
            "{:?}",
            reports.warnings
        );
        assert!(
            reports.notes[0].starts_with("shard Lease \"shardwise-shard-3\" is released"),
            "{:?}",
            reports.notes
        );

        let weighed = weigh(
            &clusters,
            &apps,
            &slices,
            &reports,
            &ShardSet::contiguous(2),
        );
        let weight = |name: &str| weighed.weights[&format!("uid-{name}")];
        // The average app of the measured clusters costs 5 / 40 = 0.125 busy s/s.
        assert_eq!(weight("cheap"), 800);
        assert_eq!(
            weight("dear"),
            2 * weight("cheap"),
            "twice as costly per app"
        );
        assert_eq!(weight("hot"), 800, "its slices' busy time over their apps");
        assert_eq!(weight("new"), 1000, "not measured: an average app");
        assert_eq!(weight("pinned"), 3000, "spec.weight overrides");
        let summary = &weighed.summary;
        assert_eq!(
            (summary.clusters, summary.measured, summary.overridden),
            (5, 3, 1)
        );
        assert!((summary.busy - 6.0).abs() < 1e-9, "{summary:?}");
        assert!((summary.busy_per_app.unwrap() - 0.125).abs() < 1e-9);

        let mut fleet = crate::shardwise::fleet(&clusters, &apps, &slices).unwrap();
        weighed.apply(&mut fleet);
        let dear = fleet.clusters.iter().find(|c| c.name == "dear").unwrap();
        assert_eq!(dear.load(), 10 * 1600);
        assert_eq!(fleet.measured.as_ref().unwrap().measured, 3);
    }

    #[test]
    fn without_reports_every_cluster_weighs_its_spec_weight_in_average_apps() {
        let mut heavy = in_namespace(cluster("heavy", Some("0")));
        heavy.spec.weight = Some(2);
        let clusters = [in_namespace(cluster("plain", Some("0"))), heavy];
        let apps: Vec<FleetApp> = keyed_apps("plain", 3)
            .into_iter()
            .map(in_namespace)
            .collect();
        let weighed = weigh(
            &clusters,
            &apps,
            &[],
            &reports(&[]),
            &ShardSet::contiguous(1),
        );
        assert_eq!(weighed.weights["uid-plain"], 1000);
        assert_eq!(weighed.weights["uid-heavy"], 2000);
        assert_eq!(weighed.summary.busy_per_app, None);
        assert_eq!((weighed.summary.leases, weighed.summary.measured), (0, 0));
    }
}
