//! Prometheus metrics, labelled by shard so that dashboards can show per-shard load. Names are
//! the same for every controller on the runtime, so that one dashboard and one set of alerts
//! serve them all: series that count units or items say which in a `kind` label, with the
//! controller's nouns ([`Nouns`]): `shardwise_owned_units{kind="cluster"}` and
//! `shardwise_owned_items{kind="app"}` for shardwise's own controller.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::nouns::Nouns;

#[cfg(feature = "server")]
mod process;
pub use crate::planner::figures::ShardFigures;

/// No labels: a family of one series that can be removed (planner-only metrics must vanish
/// from replicas that are not the planner).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NoLabels {}

/// The labels of a per-shard series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    /// The shard's number, or what stands in for it in a process that owns no shard.
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub kind: &'static str,
    pub shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReconcileLabels {
    pub kind: &'static str,
    pub shard: String,
    pub result: &'static str,
}

/// The labels of a count of planning passes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabels {
    /// The placement strategy that planned.
    pub strategy: String,
    /// How the pass ended: `success`, `error` or `no-live-shards`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MoveLabels {
    pub strategy: String,
    pub kind: &'static str,
}

/// The labels of the shard counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// `expected` (the StatefulSet's replicas) or `live` (shards with a valid lease).
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DirectionLabels {
    /// `up` or `down`.
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HandoffLabels {
    pub shard: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub target: &'static str,
    pub verb: &'static str,
    pub code: String,
}

/// The gauges of the latest plan.
#[derive(Clone, Copy, Debug)]
pub struct PlanGauges<'a> {
    /// Max over mean items per live shard.
    pub balance: f64,
    /// What the plan gives each shard.
    pub shards: &'a BTreeMap<u32, ShardFigures>,
    /// Caches of units beyond one per unit, over the fleet.
    pub cache_copies: u64,
    /// Units cut into slices.
    pub cut_units: u64,
}

/// A reconcile counted in `shardwise_active_workers` while it lives.
pub(crate) struct Running(Gauge);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric of a replica. Cheap to clone (shared handles).
#[derive(Clone, Debug)]
pub struct Metrics {
    shard: String,
    nouns: Nouns,
    pub(crate) owned_units: Family<ShardLabels, Gauge>,
    pub(crate) owned_items: Family<ShardLabels, Gauge>,
    pub(crate) owned_slices: Family<ShardLabels, Gauge>,
    pub(crate) server_shard_selection: Family<ShardLabels, Gauge>,
    pub(crate) measured_busy: Family<ShardLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) measured_records: Family<ShardLabels, Gauge>,
    pub(crate) reconciles: Family<ReconcileLabels, Counter>,
    pub(crate) reconcile_duration: Family<KindLabels, Histogram>,
    pub(crate) queue_depth: Family<KindLabels, Gauge>,
    pub(crate) active_workers: Family<KindLabels, Gauge>,
    pub(crate) lease_held: Family<ShardLabels, Gauge>,
    pub(crate) fenced: Family<ShardLabels, Counter>,
    pub(crate) handoffs: Family<HandoffLabels, Counter>,
    /// `shardwise_planner_leader`: 1 while this process is the planner.
    pub planner_leader: Family<ShardLabels, Gauge>,
    /// `shardwise_planner_runs`: planning passes by strategy and result.
    pub planner_runs: Family<StrategyLabels, Counter>,
    pub(crate) planner_moves: Family<MoveLabels, Counter>,
    pub(crate) planner_rebalances: Family<NoLabels, Counter>,
    pub(crate) balance: Family<NoLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `shardwise_members`: shards expected and live, as the planner last saw them.
    pub members: Family<MemberLabels, Gauge>,
    pub(crate) desired_replicas: Family<NoLabels, Gauge>,
    pub(crate) replica_changes: Family<DirectionLabels, Counter>,
    pub(crate) load_balance: Family<NoLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) planner_pass: Family<NoLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) assigned_load: Family<ShardLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(crate) assigned_items: Family<ShardLabels, Gauge>,
    pub(crate) assigned_units: Family<ShardLabels, Gauge>,
    pub(crate) assigned_slices: Family<ShardLabels, Gauge>,
    pub(crate) shared_units: Family<ShardLabels, Gauge>,
    pub(crate) cache_copies: Family<NoLabels, Gauge>,
    pub(crate) cut_units: Family<NoLabels, Gauge>,
    pub(crate) api_requests: Family<RequestLabels, Counter>,
}

impl Metrics {
    pub(crate) fn new(shard: u32, nouns: Nouns, registry: &mut Registry) -> Self {
        let metrics = Self::unregistered(shard.to_string(), nouns);
        let r = registry.sub_registry_with_prefix("shardwise");
        metrics.register_replica(r);
        metrics.register_planner(r);
        #[cfg(feature = "server")]
        registry.register_collector(Box::new(process::ProcessCollector));
        metrics.start_at_zero();
        metrics
    }

    /// The planner's metrics alone, for a process that plans but owns no shard (the Argo CD
    /// balancer): the same names and labels as a replica's planner, so that the same dashboard
    /// rows show it. `label` is what its `shard` label says.
    pub fn planner_only(label: &str, nouns: Nouns, registry: &mut Registry) -> Self {
        let metrics = Self::unregistered(label.to_string(), nouns);
        metrics.register_planner(registry.sub_registry_with_prefix("shardwise"));
        #[cfg(feature = "server")]
        registry.register_collector(Box::new(process::ProcessCollector));
        metrics
    }

    fn unregistered(shard: String, nouns: Nouns) -> Self {
        let duration_buckets = || Histogram::new(exponential_buckets(0.005, 2.0, 14));
        Self {
            shard,
            nouns,
            owned_units: Family::default(),
            owned_items: Family::default(),
            owned_slices: Family::default(),
            server_shard_selection: Family::default(),
            measured_busy: Family::default(),
            measured_records: Family::default(),
            reconciles: Family::default(),
            reconcile_duration: Family::new_with_constructor(duration_buckets),
            queue_depth: Family::default(),
            active_workers: Family::default(),
            lease_held: Family::default(),
            fenced: Family::default(),
            handoffs: Family::default(),
            planner_leader: Family::default(),
            planner_runs: Family::default(),
            planner_moves: Family::default(),
            planner_rebalances: Family::default(),
            balance: Family::default(),
            load_balance: Family::default(),
            planner_pass: Family::default(),
            assigned_load: Family::default(),
            members: Family::default(),
            desired_replicas: Family::default(),
            replica_changes: Family::default(),
            assigned_items: Family::default(),
            assigned_units: Family::default(),
            assigned_slices: Family::default(),
            shared_units: Family::default(),
            cache_copies: Family::default(),
            cut_units: Family::default(),
            api_requests: Family::default(),
        }
    }

    /// Registers what every replica reports under its name (`shardwise_` and the controller's
    /// nouns).
    fn register_replica(&self, r: &mut Registry) {
        let Nouns { units, items, .. } = self.nouns;
        self.unit_kind(r).register(
            "owned_units",
            format!("{} this shard owns", capitalized(units)),
            self.owned_units.clone(),
        );
        self.item_kind(r).register(
            "owned_items",
            format!("{} this shard owns", capitalized(items)),
            self.owned_items.clone(),
        );
        r.register(
            "owned_slices",
            format!("Slices of cut {units} this shard owns"),
            self.owned_slices.clone(),
        );
        r.register(
            "server_shard_selection",
            format!(
                "1 if the API server selects the {items} of slices by key range (KEP-5866), 0 if the replica alone does"
            ),
            self.server_shard_selection.clone(),
        );
        r.register(
            "measured_busy_seconds_per_second",
            format!(
                "Reconcile time per second of the {units} (and slices) this shard owns and of their {items}, smoothed, summed over its measured records"
            ),
            self.measured_busy.clone(),
        );
        r.register(
            "measured_records",
            format!(
                "{} and slices of this shard whose load is measured",
                capitalized(units)
            ),
            self.measured_records.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles by kind, shard and result",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Duration of reconciles",
            self.reconcile_duration.clone(),
        );
        r.register(
            "queue_depth",
            "Keys waiting for a worker",
            self.queue_depth.clone(),
        );
        r.register(
            "active_workers",
            "Reconciles running now, by kind: workers busy (all of them and a queue waiting means saturated)",
            self.active_workers.clone(),
        );
        r.register(
            "lease_held",
            "1 while this replica holds its shard lease",
            self.lease_held.clone(),
        );
        r.register(
            "fenced",
            "Times this replica stopped all work because it could not renew its lease",
            self.fenced.clone(),
        );
        r.register(
            "handoffs",
            format!(
                "{} released by this shard (reason: drained, shutdown)",
                capitalized(units)
            ),
            self.handoffs.clone(),
        );
        r.register(
            "api_requests",
            "Requests to Kubernetes API servers by target, verb and status code",
            self.api_requests.clone(),
        );
    }

    /// Registers what the planner reports.
    fn register_planner(&self, r: &mut Registry) {
        let Nouns {
            unit,
            units,
            item,
            items,
        } = self.nouns;
        r.register(
            "planner_leader",
            "1 while this replica is the planner",
            self.planner_leader.clone(),
        );
        r.register(
            "planner_runs",
            "Planning passes by strategy and result",
            self.planner_runs.clone(),
        );
        r.register(
            "planner_moves",
            format!("Owner changes written by the planner (kind: {unit}, {item}); a first placement is none"),
            self.planner_moves.clone(),
        );
        r.register(
            "planner_rebalances",
            format!(
                "Planning passes allowed to move {units} for balance under measured load (the busiest shard crossed the trigger, or the live shards changed, and the target is not reached yet)"
            ),
            self.planner_rebalances.clone(),
        );
        r.register(
            "planner_pass_seconds",
            "Seconds the latest planning pass took to decide: the index's views and the plan, its writes apart",
            self.planner_pass.clone(),
        );
        r.register(
            "load_balance",
            "Max over mean load per live shard in the latest plan, under the load model and its current loads: what the measured model's trigger is judged on",
            self.load_balance.clone(),
        );
        r.register(
            "assigned_load",
            format!(
                "Load per shard in the latest plan, under the load model: busy seconds per second when measured ({items} times weight with --load-model=apps)"
            ),
            self.assigned_load.clone(),
        );
        r.register(
            "assignment_balance",
            format!("Max over mean {items} per live shard in the latest plan"),
            self.balance.clone(),
        );
        r.register(
            "members",
            "Shards expected (StatefulSet replicas) and live",
            self.members.clone(),
        );
        r.register(
            "desired_replicas",
            format!(
                "Replicas the fleet needs now: its {items} over --items-per-replica (and its measured busy time over --busy-per-replica, when set), within --min-replicas and --max-replicas"
            ),
            self.desired_replicas.clone(),
        );
        r.register(
            "replica_changes",
            "Changes of the StatefulSet's replicas made by the planner (--autoscale), by direction",
            self.replica_changes.clone(),
        );
        self.item_kind(r).register(
            "assigned_items",
            format!("{} per shard in the latest plan", capitalized(items)),
            self.assigned_items.clone(),
        );
        self.unit_kind(r).register(
            "assigned_units",
            format!("{} per shard in the latest plan", capitalized(units)),
            self.assigned_units.clone(),
        );
        r.register(
            "assigned_slices",
            format!("Slices per shard in the latest plan (a {unit} that is not cut is one slice)"),
            self.assigned_slices.clone(),
        );
        self.unit_kind(r).register(
            "shared_units",
            format!(
                "Cut {units} with a slice on this shard and on another in the latest plan: each costs this shard a cache that another shard has too"
            ),
            self.shared_units.clone(),
        );
        r.register(
            "cache_copies",
            format!(
                "Caches of {units} beyond one per {unit} in the latest plan: (unit, shard) pairs of cut {units} beyond the first"
            ),
            self.cache_copies.clone(),
        );
        self.unit_kind(r).register(
            "cut_units",
            format!("{} cut into slices in the latest plan", capitalized(units)),
            self.cut_units.clone(),
        );
    }

    /// Where series that count units are registered: the same name for every controller, the
    /// controller's unit in a `kind` label.
    fn unit_kind<'r>(&self, r: &'r mut Registry) -> &'r mut Registry {
        r.sub_registry_with_label(("kind".into(), self.nouns.unit.into()))
    }

    /// Where series that count items are registered, the item in a `kind` label.
    fn item_kind<'r>(&self, r: &'r mut Registry) -> &'r mut Registry {
        r.sub_registry_with_label(("kind".into(), self.nouns.item.into()))
    }

    /// Counters appear at zero from the start: `rate()` and `increase()` cannot see a series
    /// whose first sample is already 1.
    fn start_at_zero(&self) {
        let shard = self.shard.clone();
        for kind in [self.nouns.unit, self.nouns.item] {
            for result in ["success", "error", "skipped", "cancelled"] {
                self.reconciles
                    .get_or_create(&ReconcileLabels {
                        kind,
                        shard: shard.clone(),
                        result,
                    })
                    .inc_by(0);
            }
        }
        for reason in ["drained", "shutdown"] {
            self.handoffs
                .get_or_create(&HandoffLabels {
                    shard: shard.clone(),
                    reason,
                })
                .inc_by(0);
        }
        self.fenced.get_or_create(&self.shard_labels()).inc_by(0);
        self.planner_rebalances
            .get_or_create(&NoLabels {})
            .inc_by(0);
        for direction in ["up", "down"] {
            self.replica_changes
                .get_or_create(&DirectionLabels { direction })
                .inc_by(0);
        }
    }

    /// Counts a successful planning pass and the owner changes it wrote.
    pub fn count_pass(&self, strategy: &str, unit_moves: u64, item_moves: u64) {
        self.planner_runs
            .get_or_create(&StrategyLabels {
                strategy: strategy.to_string(),
                result: "success",
            })
            .inc();
        for (kind, moves) in [(self.nouns.unit, unit_moves), (self.nouns.item, item_moves)] {
            self.planner_moves
                .get_or_create(&MoveLabels {
                    strategy: strategy.to_string(),
                    kind,
                })
                .inc_by(moves);
        }
    }

    /// Sets the gauges of the latest plan.
    pub fn set_plan(&self, plan: &PlanGauges<'_>) {
        self.balance.get_or_create(&NoLabels {}).set(plan.balance);
        self.cache_copies
            .get_or_create(&NoLabels {})
            .set(plan.cache_copies as i64);
        self.cut_units
            .get_or_create(&NoLabels {})
            .set(plan.cut_units as i64);
        // Shards that left the plan must not keep their last values.
        let per_shard = [
            &self.assigned_items,
            &self.assigned_units,
            &self.assigned_slices,
            &self.shared_units,
        ];
        for family in per_shard {
            family.clear();
        }
        for (shard, f) in plan.shards {
            let labels = ShardLabels {
                shard: shard.to_string(),
            };
            let values = [f.items, f.units, f.slices, f.shared];
            for (family, value) in per_shard.iter().zip(values) {
                family.get_or_create(&labels).set(value as i64);
            }
        }
    }

    /// Sets the latest plan's load under the load model: each live shard's, and the busiest
    /// over the mean.
    pub(crate) fn set_load(&self, loads: &BTreeMap<u32, f64>, balance: f64) {
        self.load_balance.get_or_create(&NoLabels {}).set(balance);
        // Shards that left the plan must not keep their last values.
        self.assigned_load.clear();
        for (shard, &load) in loads {
            let labels = ShardLabels {
                shard: shard.to_string(),
            };
            self.assigned_load.get_or_create(&labels).set(load);
        }
    }

    /// Sets how long the latest planning pass took to decide.
    pub(crate) fn set_pass_time(&self, seconds: f64) {
        self.planner_pass.get_or_create(&NoLabels {}).set(seconds);
    }

    /// Sets `shardwise_desired_replicas`, for a planner that sizes a workload of its own
    /// (Argo CD's balancer under `--manage-replicas`).
    pub fn set_desired_replicas(&self, replicas: u32) {
        self.desired_replicas
            .get_or_create(&NoLabels {})
            .set(i64::from(replicas));
    }

    /// Removes the metrics only the planner exports, when this replica stops being it.
    pub fn clear_planner(&self) {
        self.balance.clear();
        self.load_balance.clear();
        self.planner_pass.clear();
        self.assigned_load.clear();
        self.members.clear();
        self.desired_replicas.clear();
        self.assigned_items.clear();
        self.assigned_units.clear();
        self.assigned_slices.clear();
        self.shared_units.clear();
        self.cache_copies.clear();
        self.cut_units.clear();
    }

    pub(crate) fn shard_labels(&self) -> ShardLabels {
        ShardLabels {
            shard: self.shard.clone(),
        }
    }

    pub(crate) fn kind_labels(&self, kind: &'static str) -> KindLabels {
        KindLabels {
            kind,
            shard: self.shard.clone(),
        }
    }

    /// Counts a reconcile of `kind` as running until the guard is dropped: when it ends, or
    /// wherever it is abandoned.
    pub(crate) fn running(&self, kind: &'static str) -> Running {
        let gauge = self
            .active_workers
            .get_or_create(&self.kind_labels(kind))
            .clone();
        gauge.inc();
        Running(gauge)
    }

    /// Counts a reconcile; its duration is recorded only if it ran (a reconcile the gate
    /// refused, or that a lost lease cancelled, says nothing about reconcile latency).
    pub(crate) fn reconciled(&self, kind: &'static str, result: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                kind,
                shard: self.shard.clone(),
                result,
            })
            .inc();
        if matches!(result, "success" | "error") {
            self.reconcile_duration
                .get_or_create(&self.kind_labels(kind))
                .observe(seconds);
        }
    }

    /// Sets the gauges of the shard's measured load: the busy seconds per second summed over
    /// its measured records, and how many there are.
    pub(crate) fn set_measured(&self, busy: f64, records: usize) {
        let labels = self.shard_labels();
        self.measured_busy.get_or_create(&labels).set(busy);
        self.measured_records
            .get_or_create(&labels)
            .set(records as i64);
    }

    pub(crate) fn handoff(&self, reason: &'static str) {
        self.handoffs
            .get_or_create(&HandoffLabels {
                shard: self.shard.clone(),
                reason,
            })
            .inc();
    }
}

fn capitalized(noun: &str) -> String {
    let mut chars = noun.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// The registry and the metrics, shared by the HTTP server and the workers.
#[derive(Clone, Debug)]
pub struct Telemetry {
    /// What `/metrics` encodes: the runtime's metrics and any the controller registered.
    pub registry: Arc<Registry>,
    /// Handles to the runtime's metrics in `registry`.
    pub metrics: Metrics,
}

impl Telemetry {
    /// The runtime's metrics, and whatever `controller` registers beside them.
    pub(crate) fn new(shard: u32, nouns: Nouns, controller: impl FnOnce(&mut Registry)) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::new(shard, nouns, &mut registry);
        controller(&mut registry);
        Self {
            registry: Arc::new(registry),
            metrics,
        }
    }

    /// The registry in the OpenMetrics text format, as `/metrics` serves it (for a program
    /// that serves its own).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOUNS: Nouns = Nouns {
        unit: "cluster",
        units: "clusters",
        item: "app",
        items: "apps",
    };

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn a_reconcile_counts_as_running_until_its_guard_is_dropped() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(1, NOUNS, &mut registry);
        let first = metrics.running("app");
        let second = metrics.running("app");
        let unit = metrics.running("cluster");
        let text = encoded(&registry);
        assert!(
            text.contains("shardwise_active_workers{kind=\"app\",shard=\"1\"} 2"),
            "{text}"
        );
        drop((first, unit));
        let text = encoded(&registry);
        assert!(
            text.contains("shardwise_active_workers{kind=\"app\",shard=\"1\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("shardwise_active_workers{kind=\"cluster\",shard=\"1\"} 0"),
            "{text}"
        );
        drop(second);
    }

    #[test]
    fn a_replica_exports_its_measured_load_and_a_planner_alone_does_not() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(2, NOUNS, &mut registry);
        metrics.set_measured(0.75, 3);
        let text = encoded(&registry);
        assert!(
            text.contains("shardwise_measured_busy_seconds_per_second{shard=\"2\"} 0.75"),
            "{text}"
        );
        assert!(
            text.contains("shardwise_measured_records{shard=\"2\"} 3"),
            "{text}"
        );
        let mut registry = Registry::default();
        let planner = Metrics::planner_only("balancer", NOUNS, &mut registry);
        planner.set_measured(0.75, 3);
        assert!(!encoded(&registry).contains("measured"));
    }
}
