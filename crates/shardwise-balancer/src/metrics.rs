//! The balancer's own metrics, beside the planner's it shares with shardwise's controller: which
//! Argo CD clusters a live controller reconciles. Set by the balancer holding the Lease, after
//! each pass's read; cleared when it stops leading.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use shardwise_plan::coverage::Coverage;

/// A cluster by Argo CD's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClusterLabels {
    pub(crate) cluster: String,
}

/// No label: one series per balancer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NoLabels {}

#[derive(Clone, Default)]
pub(crate) struct CoverageMetrics {
    reconciled: Family<ClusterLabels, Gauge>,
    unreconciled_apps: Family<NoLabels, Gauge>,
    unreconciled_clusters: Family<NoLabels, Gauge>,
}

impl CoverageMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let r = registry.sub_registry_with_prefix("shardwise");
        r.register(
            "argocd_cluster_reconciled",
            "1 while a Ready Argo CD controller reconciles the cluster, 0 while none does",
            metrics.reconciled.clone(),
        );
        r.register(
            "argocd_unreconciled_apps",
            "Argo CD Applications of clusters no Ready controller reconciles",
            metrics.unreconciled_apps.clone(),
        );
        r.register(
            "argocd_unreconciled_clusters",
            "Argo CD clusters no Ready controller reconciles",
            metrics.unreconciled_clusters.clone(),
        );
        metrics
    }

    /// Shows `coverage`, and only it: clusters gone since the last pass lose their series.
    pub(crate) fn set(&self, coverage: &Coverage) {
        self.reconciled.clear();
        for cluster in &coverage.clusters {
            self.reconciled
                .get_or_create(&ClusterLabels {
                    cluster: cluster.name.clone(),
                })
                .set(i64::from(cluster.why.is_none()));
        }
        let clusters = coverage.unreconciled().count();
        self.unreconciled_apps
            .get_or_create(&NoLabels {})
            .set(i64::try_from(coverage.unreconciled_apps()).unwrap_or(i64::MAX));
        self.unreconciled_clusters
            .get_or_create(&NoLabels {})
            .set(i64::try_from(clusters).unwrap_or(i64::MAX));
    }

    /// No series: a balancer that does not lead says nothing about Argo CD.
    pub(crate) fn clear(&self) {
        self.reconciled.clear();
        self.unreconciled_apps.clear();
        self.unreconciled_clusters.clear();
    }
}

/// With `--load measured`: what the last pass measured.
#[derive(Clone, Default)]
pub(crate) struct MeasuredMetrics {
    weight: Family<ClusterLabels, Gauge>,
    measured_clusters: Family<NoLabels, Gauge>,
    objects: Family<NoLabels, Gauge>,
    unread_controllers: Family<NoLabels, Gauge>,
}

impl MeasuredMetrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let r = registry.sub_registry_with_prefix("shardwise");
        r.register(
            "argocd_cluster_weight",
            "With --load measured: the weight of one of the cluster's apps, 1000 for an app of the fleet's average measured cost",
            metrics.weight.clone(),
        );
        r.register(
            "argocd_measured_clusters",
            "With --load measured: clusters with apps weighed by their measured cost (0: every cluster weighs its apps)",
            metrics.measured_clusters.clone(),
        );
        r.register(
            "argocd_measured_objects",
            "With --load measured: objects the controllers cache for the measured clusters",
            metrics.objects.clone(),
        );
        r.register(
            "argocd_unread_controllers",
            "With --load measured: running controller pods whose /metrics the last pass could not read",
            metrics.unread_controllers.clone(),
        );
        metrics
    }

    /// Shows the weights of `clusters` (name, weight), the clusters measured and their cached
    /// objects, and the controllers not read; only the current clusters keep a series.
    pub(crate) fn set(
        &self,
        clusters: &[(String, Option<u32>)],
        (measured, objects): (usize, f64),
        unread: usize,
    ) {
        self.weight.clear();
        for (cluster, weight) in clusters {
            if let Some(weight) = weight {
                self.weight
                    .get_or_create(&ClusterLabels {
                        cluster: cluster.clone(),
                    })
                    .set(i64::from(*weight));
            }
        }
        self.measured_clusters
            .get_or_create(&NoLabels {})
            .set(i64::try_from(measured).unwrap_or(i64::MAX));
        // Counts of objects: whole numbers, as Argo CD reports them.
        self.objects
            .get_or_create(&NoLabels {})
            .set(objects.round() as i64);
        self.unread_controllers
            .get_or_create(&NoLabels {})
            .set(i64::try_from(unread).unwrap_or(i64::MAX));
    }

    /// No series: a balancer that does not lead, or does not measure, says nothing.
    pub(crate) fn clear(&self) {
        self.weight.clear();
        self.measured_clusters.clear();
        self.objects.clear();
        self.unread_controllers.clear();
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use shardwise_plan::coverage::ClusterCoverage;

    use super::*;

    fn cluster(name: &str, apps: u64, why: Option<&str>) -> ClusterCoverage {
        ClusterCoverage {
            id: format!("uid-{name}"),
            name: name.into(),
            apps,
            reconciled_by: Vec::new(),
            why: why.map(str::to_string),
        }
    }

    fn exposed(registry: &Registry) -> Vec<String> {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn each_cluster_and_the_unreconciled_totals_are_shown_and_only_the_current_ones() {
        let mut registry = Registry::default();
        let metrics = CoverageMetrics::register(&mut registry);
        let mut coverage = Coverage {
            clusters: vec![
                cluster("a", 4, None),
                cluster("b", 3, Some("down")),
                cluster("c", 2, Some("orphaned")),
            ],
            unknown: Vec::new(),
        };
        metrics.set(&coverage);
        let lines = exposed(&registry);
        for line in [
            "shardwise_argocd_cluster_reconciled{cluster=\"a\"} 1",
            "shardwise_argocd_cluster_reconciled{cluster=\"b\"} 0",
            "shardwise_argocd_unreconciled_apps{} 5",
            "shardwise_argocd_unreconciled_clusters{} 2",
        ] {
            assert!(lines.iter().any(|l| l == line), "{line} not in {lines:?}");
        }
        coverage.clusters.remove(1);
        metrics.set(&coverage);
        let lines = exposed(&registry);
        assert!(
            !lines.iter().any(|l| l.contains("cluster=\"b\"")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l == "shardwise_argocd_unreconciled_apps{} 2")
        );
        metrics.clear();
        assert!(exposed(&registry).is_empty());
    }

    #[test]
    fn measured_weights_counts_and_unread_controllers_are_shown_and_cleared() {
        let mut registry = Registry::default();
        let metrics = MeasuredMetrics::register(&mut registry);
        metrics.set(
            &[("a".into(), Some(1500)), ("b".into(), None)],
            (1, 120.0),
            2,
        );
        let lines = exposed(&registry);
        for line in [
            "shardwise_argocd_cluster_weight{cluster=\"a\"} 1500",
            "shardwise_argocd_measured_clusters{} 1",
            "shardwise_argocd_measured_objects{} 120",
            "shardwise_argocd_unread_controllers{} 2",
        ] {
            assert!(lines.iter().any(|l| l == line), "{line} not in {lines:?}");
        }
        assert!(
            !lines.iter().any(|l| l.contains("cluster=\"b\"")),
            "{lines:?}"
        );
        metrics.clear();
        assert!(exposed(&registry).is_empty());
    }
}
