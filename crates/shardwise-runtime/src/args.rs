//! The flags every sharded controller shares, for clap: flatten [`ReplicaArgs`] into the
//! binary's own arguments and turn them into [`Settings`] at the binary's edge.
//!
//! ```
//! use clap::Parser;
//! use shardwise_runtime::args::ReplicaArgs;
//! use shardwise_runtime::settings::WatchScope;
//!
//! #[derive(Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     replica: ReplicaArgs,
//! }
//!
//! let args = Args::parse_from(["labeller", "--namespace=ops", "--pod-name=labeller-2"]);
//! let settings = args.replica.settings("labeller", WatchScope::Cluster)?;
//! let http = args.replica.http_settings()?;
//! assert_eq!(settings.replica.shard, 2);
//! assert_eq!(settings.replica.statefulset, "labeller");
//! assert!(http.metrics_secure);
//! # Ok::<(), shardwise_runtime::args::ArgsError>(())
//! ```

#[cfg(feature = "server")]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use shard_assign::{Ratio, SliceSwitch, StrategyFlags, StrategyKind};
use shardwise_handoff::lease::LeaseTiming;

#[cfg(feature = "server")]
use crate::http::HttpSettings;
#[cfg(feature = "logging")]
pub use crate::logging::LogFormat;
use crate::settings::{
    LoadModel, LoadSettings, RequestLimit, ScaleSettings, Settings, SettingsError, WatchScope,
};

/// Parses a duration such as `500ms`, `10s` or `5m`.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (expected e.g. 500ms, 10s, 5m)"))
}

/// Parses a whole number of at least 1.
pub fn positive_u32(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if n >= 1 && n <= i64::from(u32::MAX) => Ok(n as u32),
        _ => Err(format!(
            "must be a whole number of at least 1, got {text:?}"
        )),
    }
}

/// Parses a number of bytes as Kubernetes writes memory: `536870912`, `512Mi`, `2Gi`, `500M`.
pub(crate) fn bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let scale: u64 = match suffix {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown unit {suffix:?} in {text:?} (expected e.g. 512Mi, 2Gi)"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("must be a positive number of bytes such as 512Mi, got {text:?}"))
}

/// Flags that make a replica's settings unusable.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The settings the flags give cannot work together (or the pod name gives no shard).
    #[error(transparent)]
    Settings(#[from] SettingsError),
}

/// The flags of a replica of a sharded controller, each with an environment variable: a
/// program's whole command line (`ReplicaArgs::parse()`), or flattened into its own.
#[derive(Clone, Debug, Parser)]
pub struct ReplicaArgs {
    /// Namespace of the leases and the StatefulSet (and of the watched objects, for a
    /// controller that watches one namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// This pod's name, `<statefulset>-<ordinal>`; the ordinal is the shard.
    #[arg(long, env = "POD_NAME")]
    pub(crate) pod_name: String,
    /// Name of the StatefulSet (default: the pod name without its ordinal).
    #[arg(long, env = "SHARDWISE_STATEFULSET")]
    pub(crate) statefulset: Option<String>,

    /// Placement strategy.
    #[arg(long, env = "SHARDWISE_STRATEGY", default_value = "sticky-balanced")]
    pub(crate) strategy: StrategyKind,
    #[command(flatten)]
    pub(crate) tuning: StrategyFlags,
    /// Cut units too big for one shard into slices of their items: `auto` with sticky-balanced
    /// only, `on` with every strategy that may cut (not legacy-modulo or round-robin), `off`.
    #[arg(long, env = "SHARDWISE_SLICING", default_value_t = SliceSwitch::Auto)]
    pub(crate) slicing: SliceSwitch,
    /// Re-plan at least this often (load-aware strategies), besides every change.
    #[arg(long, env = "SHARDWISE_PLAN_INTERVAL", default_value = "30s", value_parser = duration)]
    pub(crate) plan_interval: Duration,
    /// Re-plan this often instead while the fleet is above the target balance (sticky-balanced
    /// converging after a scale-up, a few moves per pass).
    #[arg(long, env = "SHARDWISE_CONVERGE_INTERVAL", default_value = "5s", value_parser = duration)]
    pub(crate) converge_interval: Duration,
    /// What the planner balances: `measured` busy time (units not measured yet count as an
    /// average item times their weight), or `apps`, items times weight.
    #[arg(long, env = "SHARDWISE_LOAD_MODEL", value_enum, default_value_t = LoadModel::Measured)]
    pub(crate) load_model: LoadModel,
    /// With measured load, units move for balance only once the busiest live shard is above
    /// this times the mean (at least --target-balance), and until it is back at the target.
    #[arg(long, env = "SHARDWISE_LOAD_TRIGGER", default_value_t = LoadSettings::DEFAULT.trigger)]
    pub(crate) load_trigger: Ratio,
    /// Half-life of the planner's smoothing of each unit's measured cost per item, up to 24h
    /// (0s: the latest measurement alone).
    #[arg(long, env = "SHARDWISE_LOAD_SMOOTHING", default_value = "15m", value_parser = duration)]
    pub(crate) load_smoothing: Duration,
    /// The share of memory in a measured unit's weight (0 to 1), busy time having the rest:
    /// each is the unit's cost per item over the fleet's average, and memory is what owners
    /// keep for the unit beyond its items (shardwise's controller: its cache of the cluster).
    /// Under either model, a slice's cache copy costs this share of the items its bytes are
    /// worth.
    #[arg(long, env = "SHARDWISE_LOAD_MEMORY_WEIGHT", default_value_t = LoadSettings::DEFAULT.memory_weight)]
    pub(crate) load_memory_weight: f64,

    /// The items one replica should carry: the planner's count of replicas needed
    /// (`shardwise_desired_replicas`) is the items over this, within the bounds.
    #[arg(long, env = "SHARDWISE_ITEMS_PER_REPLICA", default_value_t = ScaleSettings::DEFAULT.items_per_replica, value_parser = positive_u32)]
    pub(crate) items_per_replica: u32,
    /// The measured busy seconds per second one replica should carry; when set, the count
    /// needed is the larger of what the items and the measured busy time need.
    #[arg(long, env = "SHARDWISE_BUSY_PER_REPLICA")]
    pub(crate) busy_per_replica: Option<f64>,
    /// The cache one replica should carry (bytes as owners report them: `512Mi`, `2Gi`); when
    /// set, the count needed is also at least the fleet's reported cache over this.
    #[arg(long, env = "SHARDWISE_CACHE_PER_REPLICA", value_parser = bytes)]
    pub(crate) cache_per_replica: Option<u64>,
    /// The fewest replicas to ask for.
    #[arg(long, env = "SHARDWISE_MIN_REPLICAS", default_value_t = ScaleSettings::DEFAULT.min, value_parser = positive_u32)]
    pub(crate) min_replicas: u32,
    /// The most replicas to ask for.
    #[arg(long, env = "SHARDWISE_MAX_REPLICAS", default_value_t = ScaleSettings::DEFAULT.max, value_parser = positive_u32)]
    pub(crate) max_replicas: u32,
    /// The planner sets the StatefulSet's replicas to the count needed, through its scale
    /// subresource (it needs `get` and `update` on `statefulsets/scale`), never while a
    /// handoff is in progress.
    #[arg(long, env = "SHARDWISE_AUTOSCALE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) autoscale: bool,
    /// Scale up once the count needed has been higher for this long (0s: at once).
    #[arg(long, env = "SHARDWISE_SCALE_UP_WINDOW", default_value = "0s", value_parser = duration)]
    pub(crate) scale_up_window: Duration,
    /// Scale down once the count needed has been lower for this long, to the highest count
    /// needed over it.
    #[arg(long, env = "SHARDWISE_SCALE_DOWN_WINDOW", default_value = "5m", value_parser = duration)]
    pub(crate) scale_down_window: Duration,

    /// Requests per second to the control plane (the cluster the controller runs in).
    #[arg(long, env = "SHARDWISE_KUBE_QPS", default_value_t = 50, value_parser = positive_u32)]
    pub(crate) kube_qps: u32,
    /// Burst of requests to the control plane.
    #[arg(long, env = "SHARDWISE_KUBE_BURST", default_value_t = 100, value_parser = positive_u32)]
    pub(crate) kube_burst: u32,
    /// Requests per second of the planner's writes (labels of units and items).
    #[arg(long, env = "SHARDWISE_PLANNER_QPS", default_value_t = 200, value_parser = positive_u32)]
    pub(crate) planner_qps: u32,
    /// Burst of the planner's writes.
    #[arg(long, env = "SHARDWISE_PLANNER_BURST", default_value_t = 400, value_parser = positive_u32)]
    pub(crate) planner_burst: u32,

    /// How long a lease stays valid after its last renewal.
    #[arg(long, env = "SHARDWISE_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub(crate) lease_duration: Duration,
    /// A replica that could not renew its lease for this long stops all work.
    #[arg(long, env = "SHARDWISE_RENEW_DEADLINE", default_value = "10s", value_parser = duration)]
    pub(crate) renew_deadline: Duration,
    /// Interval between lease renewals.
    #[arg(long, env = "SHARDWISE_RETRY_PERIOD", default_value = "2s", value_parser = duration)]
    pub(crate) retry_period: Duration,
    /// Refresh the measured load this replica publishes on its shard lease this often, 1s to
    /// 5m (the lease renewals carry it: no request of its own).
    #[arg(long, env = "SHARDWISE_LOAD_REPORT_INTERVAL", default_value = "10s", value_parser = duration)]
    pub(crate) load_report_interval: Duration,
    /// On SIGTERM, wait at most this long for in-flight reconciles before releasing everything.
    #[arg(long, env = "SHARDWISE_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = duration)]
    pub(crate) shutdown_timeout: Duration,

    #[cfg(feature = "server")]
    /// Address of `/metrics`.
    #[arg(long, env = "SHARDWISE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub(crate) metrics_addr: SocketAddr,
    #[cfg(feature = "server")]
    /// Address of `/healthz` and `/readyz` (plain HTTP, for the kubelet).
    #[arg(long, env = "SHARDWISE_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub(crate) health_addr: SocketAddr,
    #[cfg(feature = "server")]
    /// Serve `/metrics` over HTTPS, and only to requests whose bearer token the API server
    /// accepts (TokenReview) for a user allowed to `get` the path `/metrics`
    /// (SubjectAccessReview). `false`: plain HTTP, open to anyone who reaches the port.
    #[arg(long, env = "SHARDWISE_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) metrics_secure: bool,
    #[cfg(feature = "server")]
    /// Directory with `tls.crt` and `tls.key` for secure metrics (a mounted kubernetes.io/tls
    /// Secret), re-read when they change. Unset: a self-signed certificate made at startup.
    #[arg(long, env = "SHARDWISE_METRICS_CERT_DIR")]
    pub(crate) metrics_cert_dir: Option<PathBuf>,
    #[cfg(feature = "server")]
    /// Reviews per second the metrics endpoint may ask of the API server, on a client of its
    /// own: scrapes with made-up tokens cannot slow down lease renewals.
    #[arg(long, env = "SHARDWISE_METRICS_REVIEW_QPS", default_value_t = 5, value_parser = positive_u32)]
    pub(crate) metrics_review_qps: u32,
    #[cfg(feature = "logging")]
    #[arg(long, env = "SHARDWISE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax).
    #[cfg(feature = "logging")]
    #[arg(long, env = "SHARDWISE_LOG", default_value = "info")]
    pub(crate) log: String,
    /// Append every reconcile interval (start, end, unit, shard) to this file, as JSON lines.
    #[arg(long, env = "SHARDWISE_AUDIT_FILE")]
    pub(crate) audit_file: Option<PathBuf>,
}

impl ReplicaArgs {
    /// The settings these flags give a controller named `controller_name` that watches
    /// `scope`, with 4 unit and 8 item workers; checked.
    pub fn settings(
        &self,
        controller_name: &str,
        scope: WatchScope,
    ) -> Result<Settings, ArgsError> {
        let mut builder = Settings::builder(&self.namespace, &self.pod_name)
            .controller_name(controller_name)
            .scope(scope)
            .leases(LeaseTiming {
                duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            })
            .strategy(self.tuning.config(self.strategy))
            .slicing(self.slicing)
            .plan_intervals(self.plan_interval, self.converge_interval)
            .planner_limit(RequestLimit {
                qps: self.planner_qps,
                burst: self.planner_burst,
            })
            .load_model(self.load_model)
            .measured_load(
                self.load_trigger,
                self.load_smoothing,
                self.load_memory_weight,
            )
            .items_per_replica(self.items_per_replica)
            .busy_per_replica(self.busy_per_replica)
            .cache_per_replica(self.cache_per_replica)
            .replicas(self.min_replicas, self.max_replicas)
            .autoscale(
                self.autoscale,
                shardwise_scale::Windows {
                    up: self.scale_up_window,
                    down: self.scale_down_window,
                },
            )
            .control_plane_limit(RequestLimit {
                qps: self.kube_qps,
                burst: self.kube_burst,
            })
            .shutdown_timeout(self.shutdown_timeout)
            .load_report_interval(self.load_report_interval)
            .audit_file(self.audit_file.clone());
        if let Some(statefulset) = &self.statefulset {
            builder = builder.statefulset(statefulset);
        }
        Ok(builder.build()?)
    }

    /// How the metrics and probes are served.
    #[cfg(feature = "server")]
    pub fn http_settings(&self) -> Result<HttpSettings, ArgsError> {
        let http = HttpSettings {
            metrics_addr: self.metrics_addr,
            health_addr: self.health_addr,
            metrics_secure: self.metrics_secure,
            metrics_cert_dir: self.metrics_cert_dir.clone(),
            metrics_review_qps: self.metrics_review_qps,
        };
        http.validate()?;
        Ok(http)
    }

    /// Logs as `--log` and `--log-format` say ([`crate::logging::init`]).
    #[cfg(feature = "logging")]
    pub fn init_logging(&self) {
        crate::logging::init(&self.log, self.log_format);
    }

    /// A program's whole `main` for `controller`, named `controller_name` and watching
    /// `scope`: logs as these flags say, then [`crate::run`] with the settings and HTTP
    /// settings they give, until SIGTERM.
    #[cfg(all(feature = "server", feature = "logging"))]
    pub async fn run<C: crate::Sharded>(
        &self,
        controller: C,
        controller_name: &str,
        scope: WatchScope,
    ) -> Result<(), crate::RunError> {
        self.init_logging();
        let settings = self.settings(controller_name, scope)?;
        let http = self.http_settings()?;
        crate::run(controller, settings, http).await
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Binary {
        #[command(flatten)]
        replica: ReplicaArgs,
    }

    fn parse(extra: &[&str]) -> ReplicaArgs {
        let base = ["binary", "--namespace=fleet", "--pod-name=shardwise-0"];
        Binary::try_parse_from(base.iter().chain(extra))
            .unwrap()
            .replica
    }

    #[test]
    fn bytes_read_as_kubernetes_writes_memory() {
        assert_eq!(bytes("536870912"), Ok(512 << 20));
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("2Gi"), Ok(2 << 30));
        assert_eq!(bytes("500M"), Ok(500_000_000));
        assert_eq!(bytes("4k"), Ok(4000));
        for bad in ["", "Mi", "0", "-1Gi", "1.5Gi", "2GB", "99999999999Ti"] {
            assert!(bytes(bad).is_err(), "{bad:?}");
        }
        assert!(bytes("2GB").unwrap_err().contains("unknown unit \"GB\""));
    }

    fn settings(extra: &[&str]) -> Result<Settings, ArgsError> {
        parse(extra).settings("test", WatchScope::Namespace("fleet".into()))
    }

    #[cfg(feature = "server")]
    fn http(extra: &[&str]) -> Result<HttpSettings, ArgsError> {
        parse(extra).http_settings()
    }

    #[cfg(feature = "server")]
    #[test]
    fn metrics_are_secure_unless_turned_off() {
        assert!(parse(&[]).metrics_secure);
        assert!(parse(&["--metrics-secure"]).metrics_secure);
        assert!(!parse(&["--metrics-secure=false"]).metrics_secure);
        assert!(http(&[]).is_ok_and(|h| h == HttpSettings::default()));
    }

    #[cfg(feature = "server")]
    #[test]
    fn http_settings_that_cannot_work_together_are_refused() {
        let e = http(&["--metrics-addr=0.0.0.0:9000", "--health-addr=0.0.0.0:9000"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("0.0.0.0:9000") && e.contains("plain HTTP"),
            "{e}"
        );
        assert!(
            http(&[
                "--metrics-secure=false",
                "--metrics-addr=0.0.0.0:9000",
                "--health-addr=0.0.0.0:9000",
            ])
            .is_ok()
        );
        let unused = http(&["--metrics-secure=false", "--metrics-cert-dir=/certs"]);
        assert!(
            unused
                .unwrap_err()
                .to_string()
                .contains("--metrics-cert-dir")
        );
    }

    #[test]
    fn the_flags_defaults_are_the_builders() {
        assert_eq!(
            settings(&[]).unwrap(),
            Settings::builder("fleet", "shardwise-0")
                .controller_name("test")
                .scope(WatchScope::Namespace("fleet".into()))
                .build()
                .unwrap()
        );
    }

    #[test]
    fn settings_that_cannot_work_together_are_refused() {
        for bad in ["0s", "500ms", "6m"] {
            let e = settings(&[&format!("--load-report-interval={bad}")])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--load-report-interval") && e.contains(bad),
                "{e}"
            );
        }
        let e = settings(&["--load-trigger=1.02"]).unwrap_err().to_string();
        assert!(
            e.contains("--load-trigger (1.02)") && e.contains("1.03"),
            "{e}"
        );
        assert!(settings(&["--load-trigger=1.02", "--target-balance=1.01"]).is_ok());
        let e = settings(&["--load-smoothing=48h"]).unwrap_err().to_string();
        assert!(e.contains("--load-smoothing") && e.contains("2days"), "{e}");
        let e = settings(&["--min-replicas=4", "--max-replicas=3"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--min-replicas (4)") && e.contains("--max-replicas (3)"),
            "{e}"
        );
        for bad in ["0", "-1", "NaN", "inf"] {
            let e = settings(&[&format!("--busy-per-replica={bad}")])
                .unwrap_err()
                .to_string();
            assert!(e.contains("--busy-per-replica"), "{e}");
        }
        let e = settings(&["--scale-down-window=2h"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--scale-down-window") && e.contains("2h"), "{e}");
        assert!(
            Binary::try_parse_from(["b", "--namespace=f", "--pod-name=s-0", "--min-replicas=0"])
                .is_err()
        );
        let leases = settings(&["--lease-duration=10s", "--renew-deadline=12s"]);
        assert!(matches!(
            leases,
            Err(ArgsError::Settings(SettingsError::Leases(_)))
        ));
    }

    #[test]
    fn the_flags_become_the_settings_of_each_part() {
        let s = settings(&[
            "--strategy=bounded-load",
            "--kube-qps=7",
            "--plan-interval=1m",
            "--load-report-interval=30s",
        ])
        .unwrap();
        assert_eq!(s.owner.load_report_interval, Duration::from_secs(30));
        assert_eq!(
            settings(&[]).unwrap().owner.load_report_interval,
            Duration::from_secs(10)
        );
        assert_eq!(settings(&[]).unwrap().planner.load, LoadSettings::DEFAULT);
        assert_eq!(settings(&[]).unwrap().planner.scale, ScaleSettings::DEFAULT);
        let scaled = settings(&[
            "--autoscale",
            "--items-per-replica=1000",
            "--busy-per-replica=2.5",
            "--cache-per-replica=512Mi",
            "--min-replicas=2",
            "--max-replicas=6",
            "--scale-up-window=30s",
            "--scale-down-window=1m",
        ])
        .unwrap()
        .planner
        .scale;
        assert_eq!(
            scaled,
            ScaleSettings {
                items_per_replica: 1000,
                busy_per_replica: Some(2.5),
                cache_per_replica: Some(512 << 20),
                min: 2,
                max: 6,
                autoscale: true,
                windows: shardwise_scale::Windows {
                    up: Duration::from_secs(30),
                    down: Duration::from_secs(60),
                },
            }
        );
        let memory = settings(&["--load-memory-weight=0.5"])
            .unwrap()
            .planner
            .load;
        assert_eq!(memory.memory_weight, 0.5);
        let e = settings(&["--load-memory-weight=1.5"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--load-memory-weight must be between 0 and 1"),
            "{e}"
        );
        let apps = settings(&["--load-model=apps", "--load-smoothing=0s"]).unwrap();
        assert_eq!(apps.planner.load.model, LoadModel::Apps);
        assert_eq!(apps.planner.load.smoothing, Duration::ZERO);
        assert_eq!(s.replica.shard, 0);
        assert_eq!(s.planner.strategy.kind, StrategyKind::BoundedLoad);
        assert_eq!(s.planner.plan_interval, Duration::from_secs(60));
        assert_eq!(s.control_plane.qps, 7);
        assert_eq!(s.leases.duration, Duration::from_secs(15));
        assert!(matches!(
            parse(&[]).settings("x", WatchScope::Cluster),
            Ok(Settings {
                scope: WatchScope::Cluster,
                ..
            })
        ));
    }
}
