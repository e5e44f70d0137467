//! What a replica is configured with, as plain values: a program builds them with
//! [`Settings::builder`] (or from flags, with the `clap` feature's `args` module), and each part
//! of the runtime receives only its own.
//!
//! ```
//! use std::time::Duration;
//!
//! use shardwise_runtime::settings::{Settings, WatchScope};
//!
//! let settings = Settings::builder("ops", "labeller-2")
//!     .scope(WatchScope::Namespace("ops".into()))
//!     .workers(2, 8)
//!     .shutdown_timeout(Duration::from_secs(30))
//!     .build()?;
//! assert_eq!((settings.replica.statefulset.as_str(), settings.replica.shard), ("labeller", 2));
//! # Ok::<(), shardwise_runtime::settings::SettingsError>(())
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use shardwise_handoff::identity::shard_from_pod_name;

/// What the builder's setters take and its errors carry, from the placement, protocol and sizing
/// crates: re-exported on purpose, so that a program names them through the runtime.
pub use shard_assign::{AssignError, Ratio, SliceSwitch, StrategyConfig, StrategyKind};
pub use shardwise_handoff::identity::IdentityError;
pub use shardwise_handoff::lease::{LeaseTiming, TimingError};
pub use shardwise_scale::Windows;

/// Where units and items are watched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchScope {
    /// In one namespace (both kinds must be namespaced).
    Namespace(String),
    /// Across the cluster (required when either kind is cluster-scoped).
    Cluster,
}

/// Who this replica is: its pod, its StatefulSet and its shard, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    /// Namespace of the StatefulSet and of the protocol's leases.
    pub(crate) namespace: String,
    pub(crate) pod_name: String,
    /// Name of the StatefulSet the pod belongs to.
    pub statefulset: String,
    /// The pod's ordinal.
    pub shard: u32,
}

impl Replica {
    /// From the pod name `<statefulset>-<ordinal>`; `statefulset` names the StatefulSet when
    /// the pod name alone cannot (the ordinal is checked against it).
    pub(crate) fn new(
        namespace: impl Into<String>,
        pod_name: impl Into<String>,
        statefulset: Option<&str>,
    ) -> Result<Self, IdentityError> {
        let pod_name = pod_name.into();
        let shard = shard_from_pod_name(&pod_name, statefulset)?;
        let statefulset = match statefulset {
            Some(name) => name.to_string(),
            None => pod_name
                .rsplit_once('-')
                .map_or_else(|| pod_name.clone(), |(prefix, _)| prefix.to_string()),
        };
        Ok(Self {
            namespace: namespace.into(),
            pod_name,
            statefulset,
            shard,
        })
    }

    /// The namespace of the StatefulSet and of the protocol's leases.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pod's name.
    pub fn pod_name(&self) -> &str {
        &self.pod_name
    }

    /// The Lease of this replica's shard.
    pub(crate) fn shard_lease(&self) -> String {
        format!("{}-shard-{}", self.statefulset, self.shard)
    }

    /// The Lease of the planner.
    pub(crate) fn planner_lease(&self) -> String {
        format!("{}-planner", self.statefulset)
    }
}

/// A request budget: `qps` per second on average, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimit {
    /// Requests per second, on average.
    pub qps: u32,
    /// Requests that may go at once after a quiet spell.
    pub burst: u32,
}

/// What the planner balances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LoadModel {
    /// Items times the unit's weight.
    Apps,
    /// The busy time owners measure, smoothed; units not measured yet count as an average
    /// item times their weight.
    Measured,
}

/// How the planner counts load, and when measured load may move units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LoadSettings {
    pub model: LoadModel,
    /// Voluntary moves start once the busiest live shard is above this times the mean.
    pub trigger: Ratio,
    /// Half-life of the planner's smoothing of each unit's measured cost per item.
    pub smoothing: Duration,
    /// The share of memory (the bytes owners keep for a unit) in a measured unit's weight,
    /// `0..=1`; busy time has the rest.
    pub memory_weight: f64,
}

impl LoadSettings {
    /// Measured, 10% above the mean, and a 15 min half-life: what the simulator's drift
    /// experiment keeps within 1.10 of the true balance while moving about 1% of items per
    /// hour. Memory a fifth of the weight, as object counts weigh in argocd-autoscaler's
    /// default load index: busy time still leads, and a unit of large objects weighs more.
    pub const DEFAULT: LoadSettings = LoadSettings {
        model: LoadModel::Measured,
        trigger: shard_assign::Hysteresis::DEFAULT_TRIGGER,
        smoothing: Duration::from_secs(15 * 60),
        memory_weight: 0.2,
    };

    /// The longest `--load-smoothing` accepted: beyond a day, placement would follow
    /// yesterday's load.
    pub const MAX_SMOOTHING: Duration = Duration::from_secs(24 * 3600);
}

/// How many replicas the planner asks for, and whether it sets the count itself.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ScaleSettings {
    /// Items one replica should carry.
    pub items_per_replica: u32,
    /// Measured busy seconds per second one replica should carry; `None`: items alone.
    pub busy_per_replica: Option<f64>,
    /// Bytes of cache (what owners report for their units) one replica should carry; `None`:
    /// not a reason to add replicas.
    pub cache_per_replica: Option<u64>,
    pub min: u32,
    pub max: u32,
    /// Set the StatefulSet's replicas through its scale subresource; off, only the metric.
    pub autoscale: bool,
    pub windows: Windows,
}

impl ScaleSettings {
    /// 5,000 items per replica (a full re-sync of one replica in about two minutes at the
    /// default request rate: docs/operations.md), 1 to 10 replicas, the metric only, and the
    /// HorizontalPodAutoscaler's windows: up at once, down after 5 minutes.
    pub const DEFAULT: ScaleSettings = ScaleSettings {
        items_per_replica: 5000,
        busy_per_replica: None,
        cache_per_replica: None,
        min: 1,
        max: 10,
        autoscale: false,
        windows: Windows {
            up: Duration::ZERO,
            down: Duration::from_secs(300),
        },
    };

    /// The longest stabilisation window accepted.
    pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

    fn validate(&self) -> Result<(), SettingsError> {
        if self.min == 0 || self.min > self.max {
            return Err(SettingsError::ReplicaBounds {
                min: self.min,
                max: self.max,
            });
        }
        if let Some(busy) = self.busy_per_replica
            && !(busy.is_finite() && busy > 0.0)
        {
            return Err(SettingsError::BusyPerReplica(busy.to_string()));
        }
        for (flag, window) in [
            ("--scale-up-window", self.windows.up),
            ("--scale-down-window", self.windows.down),
        ] {
            if window > Self::MAX_WINDOW {
                return Err(SettingsError::ScaleWindow { flag, window });
            }
        }
        Ok(())
    }
}

/// The planner's settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlannerSettings {
    pub strategy: StrategyConfig,
    /// Whether units too big for one shard are cut into slices of their items.
    pub slicing: SliceSwitch,
    /// Re-plan at least this often (load-aware strategies), besides every change.
    pub plan_interval: Duration,
    /// Re-plan this often instead while the fleet is above the target balance.
    pub converge_interval: Duration,
    /// The planner's writes.
    pub limit: RequestLimit,
    pub load: LoadSettings,
    pub scale: ScaleSettings,
}

impl PlannerSettings {
    /// Sticky-balanced with its defaults, cutting where it pays (`auto`), a pass every 30 s (5 s
    /// while above the target balance), 200 writes a second (400 at once), measured load and
    /// the metric of the replicas it needs.
    const DEFAULT: PlannerSettings = PlannerSettings {
        strategy: StrategyConfig {
            kind: shard_assign::StrategyKind::StickyBalanced,
            virtual_nodes: StrategyConfig::DEFAULT_VIRTUAL_NODES,
            load_factor: StrategyConfig::DEFAULT_LOAD_FACTOR,
            max_extra_moves: StrategyConfig::DEFAULT_MAX_EXTRA_MOVES,
            target_balance: StrategyConfig::DEFAULT_TARGET_BALANCE,
        },
        slicing: SliceSwitch::Auto,
        plan_interval: Duration::from_secs(30),
        converge_interval: Duration::from_secs(5),
        limit: RequestLimit {
            qps: 200,
            burst: 400,
        },
        load: LoadSettings::DEFAULT,
        scale: ScaleSettings::DEFAULT,
    };

    /// How long between periodic passes: shorter while the fleet is above its target balance.
    pub fn periodic_interval(&self, above_target: bool) -> Duration {
        if above_target {
            self.converge_interval.min(self.plan_interval)
        } else {
            self.plan_interval
        }
    }
}

/// The owner's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerSettings {
    /// Concurrent unit reconciles.
    pub unit_workers: u32,
    /// Concurrent item reconciles.
    pub item_workers: u32,
    /// On shutdown, wait at most this long for in-flight reconciles before releasing.
    pub(crate) shutdown_timeout: Duration,
    /// A unit is reconciled again this long after its items arrive or leave (one reconcile
    /// for a burst of them).
    pub(crate) item_change_delay: Duration,
    /// The measured load on the shard lease is refreshed this often (the lease renewals carry
    /// it, so it is written no more often than they are).
    pub(crate) load_report_interval: Duration,
}

impl OwnerSettings {
    /// 4 unit and 8 item workers, 20 s to finish in-flight reconciles on shutdown, a unit
    /// reconciled 2 s after its items change, the load report refreshed every 10 s.
    const DEFAULT: OwnerSettings = OwnerSettings {
        unit_workers: 4,
        item_workers: 8,
        shutdown_timeout: Duration::from_secs(20),
        item_change_delay: Duration::from_secs(2),
        load_report_interval: Duration::from_secs(10),
    };

    /// The range `--load-report-interval` must be in: at least a second (the report counts
    /// every item of the shard), and at most 5 minutes (beyond it the report lags the
    /// measurement by more than the measurement's own smoothing).
    pub(crate) const LOAD_REPORT_INTERVALS: std::ops::RangeInclusive<Duration> =
        Duration::from_secs(1)..=Duration::from_secs(300);
}

/// Everything a replica runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Who this replica is.
    pub replica: Replica,
    /// The controller's name, in Events and logs.
    pub(crate) controller_name: String,
    /// Where units and items are watched.
    pub scope: WatchScope,
    pub(crate) leases: LeaseTiming,
    pub(crate) planner: PlannerSettings,
    /// How the owner reconciles: workers, shutdown and load reports.
    pub owner: OwnerSettings,
    /// Requests of leases and owners to the control plane.
    pub(crate) control_plane: RequestLimit,
    /// Where the reconcile audit goes; none when unset.
    pub(crate) audit_file: Option<PathBuf>,
}

/// Settings that cannot work, each named by its builder method's flag (`--flag-name` sets
/// `flag_name`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The pod name does not give a shard (or does not match the StatefulSet's name).
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// Secure metrics and the probes on one address.
    #[error(
        "--metrics-addr and --health-addr are both {0}: secure metrics need a port of their own, since the kubelet probes over plain HTTP"
    )]
    SharedMetricsPort(SocketAddr),
    /// A certificate directory for metrics served over plain HTTP.
    #[error(
        "--metrics-cert-dir is set but --metrics-secure is false: the certificate would not be used"
    )]
    UnusedCertificate,
    /// A load report interval outside 1s to 5m.
    #[error("--load-report-interval must be between 1s and 5m, got {}", humantime::format_duration(*.0))]
    LoadReportInterval(Duration),
    /// A load trigger below the target balance.
    #[error(
        "--load-trigger ({trigger}) is below --target-balance ({target}): moves would start where they must stop"
    )]
    LoadTrigger {
        /// `--load-trigger`.
        trigger: Ratio,
        /// `--target-balance`.
        target: Ratio,
    },
    /// A smoothing half-life beyond 24h.
    #[error("--load-smoothing must be at most 24h, got {}", humantime::format_duration(*.0))]
    LoadSmoothing(Duration),
    /// A memory weight outside 0 to 1 (as given).
    #[error("--load-memory-weight must be between 0 and 1, got {0}")]
    MemoryWeight(String),
    /// Replica bounds that allow no count.
    #[error("--min-replicas ({min}) and --max-replicas ({max}) must satisfy 1 <= min <= max")]
    ReplicaBounds {
        /// `--min-replicas`.
        min: u32,
        /// `--max-replicas`.
        max: u32,
    },
    /// A busy time per replica that is not a positive number (as given).
    #[error("--busy-per-replica must be a positive number of seconds per second, got {0}")]
    BusyPerReplica(String),
    /// A scaling window beyond an hour.
    #[error("{flag} must be at most 1h, got {}", humantime::format_duration(*.window))]
    ScaleWindow {
        /// The flag that set it.
        flag: &'static str,
        /// The window given.
        window: Duration,
    },
    /// Lease timings that cannot hold a lease safely.
    #[error(transparent)]
    Leases(#[from] TimingError),
    /// A placement strategy configuration that cannot work.
    #[error(transparent)]
    Strategy(#[from] AssignError),
}

impl Settings {
    /// Settings for pod `pod_name` (`<statefulset>-<ordinal>`) in `namespace`, with the
    /// defaults of the flags; [`SettingsBuilder::build`] checks them.
    pub fn builder(namespace: impl Into<String>, pod_name: impl Into<String>) -> SettingsBuilder {
        SettingsBuilder {
            namespace: namespace.into(),
            pod_name: pod_name.into(),
            statefulset: None,
            controller_name: None,
            scope: WatchScope::Cluster,
            leases: LeaseTiming::DEFAULT,
            planner: PlannerSettings::DEFAULT,
            owner: OwnerSettings::DEFAULT,
            control_plane: RequestLimit {
                qps: 50,
                burst: 100,
            },
            audit_file: None,
        }
    }

    /// Refuses settings that only fail later.
    pub(crate) fn validate(&self) -> Result<(), SettingsError> {
        self.leases.validate()?;
        self.planner.strategy.validate()?;
        let interval = self.owner.load_report_interval;
        if !OwnerSettings::LOAD_REPORT_INTERVALS.contains(&interval) {
            return Err(SettingsError::LoadReportInterval(interval));
        }
        let load = self.planner.load;
        let target = self.planner.strategy.target_balance;
        if load.trigger < target {
            return Err(SettingsError::LoadTrigger {
                trigger: load.trigger,
                target,
            });
        }
        if load.smoothing > LoadSettings::MAX_SMOOTHING {
            return Err(SettingsError::LoadSmoothing(load.smoothing));
        }
        if !(0.0..=1.0).contains(&load.memory_weight) {
            return Err(SettingsError::MemoryWeight(load.memory_weight.to_string()));
        }
        self.planner.scale.validate()
    }
}

/// Builds [`Settings`]: every value starts at its flag's default.
#[derive(Clone, Debug)]
#[must_use]
pub struct SettingsBuilder {
    namespace: String,
    pod_name: String,
    statefulset: Option<String>,
    controller_name: Option<String>,
    scope: WatchScope,
    leases: LeaseTiming,
    planner: PlannerSettings,
    owner: OwnerSettings,
    control_plane: RequestLimit,
    audit_file: Option<PathBuf>,
}

impl SettingsBuilder {
    /// The StatefulSet's name, when the pod name alone cannot give it (default: the pod name
    /// without its ordinal).
    pub fn statefulset(mut self, name: impl Into<String>) -> Self {
        self.statefulset = Some(name.into());
        self
    }

    /// The controller's name in Events and User-Agents (default: the StatefulSet's).
    pub fn controller_name(mut self, name: impl Into<String>) -> Self {
        self.controller_name = Some(name.into());
        self
    }

    /// Where units and items are watched (default: across the cluster).
    pub fn scope(mut self, scope: WatchScope) -> Self {
        self.scope = scope;
        self
    }

    /// How shard and planner leases are held (default: 15 s, renewed within 10 s, tried every
    /// 2 s).
    pub fn leases(mut self, timing: LeaseTiming) -> Self {
        self.leases = timing;
        self
    }

    /// The placement strategy and its tuning (default: sticky-balanced).
    pub fn strategy(mut self, strategy: StrategyConfig) -> Self {
        self.planner.strategy = strategy;
        self
    }

    /// Whether units too big for one shard are cut into slices (default: `auto`).
    pub fn slicing(mut self, slicing: SliceSwitch) -> Self {
        self.planner.slicing = slicing;
        self
    }

    /// How often the planner plans at least (`plan`, default 30 s), and while the fleet is
    /// above its target balance (`converge`, default 5 s).
    pub fn plan_intervals(mut self, plan: Duration, converge: Duration) -> Self {
        self.planner.plan_interval = plan;
        self.planner.converge_interval = converge;
        self
    }

    /// The planner's writes (default: 200 a second, 400 at once).
    pub fn planner_limit(mut self, limit: RequestLimit) -> Self {
        self.planner.limit = limit;
        self
    }

    /// What the planner balances (default: measured busy time).
    pub fn load_model(mut self, model: LoadModel) -> Self {
        self.planner.load.model = model;
        self
    }

    /// With measured load, how far above the mean the busiest shard may go before units move
    /// (`load_trigger`, default 1.10), the half-life of the smoothing (`load_smoothing`,
    /// default 15 min), and memory's share of a unit's weight (`load_memory_weight`, default
    /// 0.2).
    pub fn measured_load(
        mut self,
        trigger: Ratio,
        smoothing: Duration,
        memory_weight: f64,
    ) -> Self {
        self.planner.load.trigger = trigger;
        self.planner.load.smoothing = smoothing;
        self.planner.load.memory_weight = memory_weight;
        self
    }

    /// Items one replica should carry, for the replica count the planner asks for (default:
    /// 5,000).
    pub fn items_per_replica(mut self, items: u32) -> Self {
        self.planner.scale.items_per_replica = items;
        self
    }

    /// Measured busy seconds per second one replica should carry (default: none, items alone).
    pub fn busy_per_replica(mut self, busy: Option<f64>) -> Self {
        self.planner.scale.busy_per_replica = busy;
        self
    }

    /// Bytes of cache one replica should carry (default: none).
    pub fn cache_per_replica(mut self, bytes: Option<u64>) -> Self {
        self.planner.scale.cache_per_replica = bytes;
        self
    }

    /// The replica counts the planner may ask for (default: 1 to 10).
    pub fn replicas(mut self, min: u32, max: u32) -> Self {
        self.planner.scale.min = min;
        self.planner.scale.max = max;
        self
    }

    /// Whether the planner sets the StatefulSet's replicas itself (default: no, the metric
    /// only), and its stabilisation windows (default: up at once, down after 5 min).
    pub fn autoscale(mut self, on: bool, windows: Windows) -> Self {
        self.planner.scale.autoscale = on;
        self.planner.scale.windows = windows;
        self
    }

    /// Requests of the leases and owners to the control plane (default: 50 a second, 100 at
    /// once).
    pub fn control_plane_limit(mut self, limit: RequestLimit) -> Self {
        self.control_plane = limit;
        self
    }

    /// Concurrent unit and item reconciles (default: 4 and 8).
    pub fn workers(mut self, units: u32, items: u32) -> Self {
        self.owner.unit_workers = units;
        self.owner.item_workers = items;
        self
    }

    /// How long a stopping replica waits for in-flight reconciles (default: 20 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.owner.shutdown_timeout = timeout;
        self
    }

    /// How often the measured load on the shard lease is refreshed (default: 10 s).
    pub fn load_report_interval(mut self, interval: Duration) -> Self {
        self.owner.load_report_interval = interval;
        self
    }

    /// A file the audit of every reconcile is appended to (default: none).
    pub fn audit_file(mut self, path: Option<PathBuf>) -> Self {
        self.audit_file = path;
        self
    }

    /// The settings, once they are known to work together.
    pub fn build(self) -> Result<Settings, SettingsError> {
        let replica = Replica::new(self.namespace, self.pod_name, self.statefulset.as_deref())?;
        let settings = Settings {
            controller_name: self
                .controller_name
                .unwrap_or_else(|| replica.statefulset.clone()),
            replica,
            scope: self.scope,
            leases: self.leases,
            planner: self.planner,
            owner: self.owner,
            control_plane: self.control_plane,
            audit_file: self.audit_file,
        };
        settings.validate()?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_is_parsed_from_its_pod_name_once() {
        let replica = Replica::new("fleet", "shardwise-3", None).unwrap();
        assert_eq!(replica.shard, 3);
        assert_eq!(replica.statefulset, "shardwise");
        assert_eq!(replica.shard_lease(), "shardwise-shard-3");
        assert_eq!(replica.planner_lease(), "shardwise-planner");
        let named = Replica::new("fleet", "my-sts-12", Some("my-sts")).unwrap();
        assert_eq!((named.shard, named.statefulset.as_str()), (12, "my-sts"));
        assert!(Replica::new("fleet", "shardwise", None).is_err());
        assert!(Replica::new("fleet", "other-1", Some("shardwise")).is_err());
    }
}
