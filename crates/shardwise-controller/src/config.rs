//! Configuration: flags, each with an environment variable fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use shard_assign::{Ratio, StrategyConfig, StrategyKind};
use shardwise_handoff::lease::LeaseTiming;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (expected e.g. 500ms, 10s, 5m)"))
}

fn positive_u32(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if n >= 1 && n <= i64::from(u32::MAX) => Ok(n as u32),
        _ => Err(format!(
            "must be a whole number of at least 1, got {text:?}"
        )),
    }
}

/// The sharded shardwise controller. Run one replica per pod of a StatefulSet; each reconciles
/// the clusters (and their apps) of its shard, and one of them, elected, plans the shards.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "shardwise-controller",
    version,
    allow_negative_numbers = true,
    args_override_self = true
)]
pub struct Config {
    /// Namespace of the FleetClusters, FleetApps, leases and the StatefulSet.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// This pod's name, `<statefulset>-<ordinal>`; the ordinal is the shard.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: String,
    /// Name of the StatefulSet (default: the pod name without its ordinal).
    #[arg(long, env = "SHARDWISE_STATEFULSET")]
    pub statefulset: Option<String>,

    /// Placement strategy.
    #[arg(long, env = "SHARDWISE_STRATEGY", default_value = "sticky-balanced")]
    pub strategy: StrategyKind,
    /// Ring points per shard (weighted-ring-hash, bounded-load).
    #[arg(long, env = "SHARDWISE_VIRTUAL_NODES", default_value_t = StrategyConfig::DEFAULT_VIRTUAL_NODES, value_parser = positive_u32)]
    pub virtual_nodes: u32,
    /// Bounded-load factor c.
    #[arg(long, env = "SHARDWISE_LOAD_FACTOR", default_value_t = StrategyConfig::DEFAULT_LOAD_FACTOR)]
    pub load_factor: Ratio,
    /// Extra moves per planning pass (sticky-balanced).
    #[arg(long, env = "SHARDWISE_MAX_EXTRA_MOVES", default_value_t = StrategyConfig::DEFAULT_MAX_EXTRA_MOVES)]
    pub max_extra_moves: u32,
    /// Max/mean load at which sticky-balanced stops moving clusters.
    #[arg(long, env = "SHARDWISE_TARGET_BALANCE", default_value_t = StrategyConfig::DEFAULT_TARGET_BALANCE)]
    pub target_balance: Ratio,
    /// Re-plan at least this often (load-aware strategies), besides every change.
    #[arg(long, env = "SHARDWISE_PLAN_INTERVAL", default_value = "30s", value_parser = duration)]
    pub plan_interval: Duration,
    /// Re-plan this often instead while the fleet is above the target balance (sticky-balanced
    /// converging after a scale-up, a few moves per pass).
    #[arg(long, env = "SHARDWISE_CONVERGE_INTERVAL", default_value = "5s", value_parser = duration)]
    pub converge_interval: Duration,

    /// Concurrent cluster reconciles.
    #[arg(long, env = "SHARDWISE_CLUSTER_WORKERS", default_value_t = 4, value_parser = positive_u32)]
    pub cluster_workers: u32,
    /// Concurrent app reconciles.
    #[arg(long, env = "SHARDWISE_APP_WORKERS", default_value_t = 8, value_parser = positive_u32)]
    pub app_workers: u32,
    /// Requests per second to the control plane (the cluster shardwise runs in).
    #[arg(long, env = "SHARDWISE_KUBE_QPS", default_value_t = 50, value_parser = positive_u32)]
    pub kube_qps: u32,
    /// Burst of requests to the control plane.
    #[arg(long, env = "SHARDWISE_KUBE_BURST", default_value_t = 100, value_parser = positive_u32)]
    pub kube_burst: u32,
    /// Requests per second of the planner's writes (labels of clusters and apps).
    #[arg(long, env = "SHARDWISE_PLANNER_QPS", default_value_t = 200, value_parser = positive_u32)]
    pub planner_qps: u32,
    /// Burst of the planner's writes.
    #[arg(long, env = "SHARDWISE_PLANNER_BURST", default_value_t = 400, value_parser = positive_u32)]
    pub planner_burst: u32,
    /// Requests per second to each destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_QPS", default_value_t = 20, value_parser = positive_u32)]
    pub cluster_qps: u32,
    /// Burst of requests to each destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_BURST", default_value_t = 40, value_parser = positive_u32)]
    pub cluster_burst: u32,
    /// Timeout of one request to a destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub cluster_timeout: Duration,

    /// Re-apply every app this often, correcting drift.
    #[arg(long, env = "SHARDWISE_RESYNC_INTERVAL", default_value = "3m", value_parser = duration)]
    pub resync_interval: Duration,
    /// Probe every destination cluster this often.
    #[arg(long, env = "SHARDWISE_PROBE_INTERVAL", default_value = "1m", value_parser = duration)]
    pub probe_interval: Duration,

    /// How long a lease stays valid after its last renewal.
    #[arg(long, env = "SHARDWISE_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// A replica that could not renew its lease for this long stops all work.
    #[arg(long, env = "SHARDWISE_RENEW_DEADLINE", default_value = "10s", value_parser = duration)]
    pub renew_deadline: Duration,
    /// Interval between lease renewals.
    #[arg(long, env = "SHARDWISE_RETRY_PERIOD", default_value = "2s", value_parser = duration)]
    pub retry_period: Duration,
    /// On SIGTERM, wait at most this long for in-flight reconciles before releasing everything.
    #[arg(long, env = "SHARDWISE_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = duration)]
    pub shutdown_timeout: Duration,

    /// Address of `/metrics`.
    #[arg(long, env = "SHARDWISE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Address of `/healthz` and `/readyz` (plain HTTP, for the kubelet).
    #[arg(long, env = "SHARDWISE_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,
    /// Serve `/metrics` over HTTPS, and only to requests whose bearer token the API server
    /// accepts (TokenReview) for a user allowed to `get` the path `/metrics`
    /// (SubjectAccessReview). `false`: plain HTTP, open to anyone who reaches the port.
    #[arg(long, env = "SHARDWISE_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub metrics_secure: bool,
    /// Directory with `tls.crt` and `tls.key` for secure metrics (a mounted kubernetes.io/tls
    /// Secret), re-read when they change. Unset: a self-signed certificate made at startup.
    #[arg(long, env = "SHARDWISE_METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Reviews per second the metrics endpoint may ask of the API server, on a client of its
    /// own: scrapes with made-up tokens cannot slow down lease renewals.
    #[arg(long, env = "SHARDWISE_METRICS_REVIEW_QPS", default_value_t = 5, value_parser = positive_u32)]
    pub metrics_review_qps: u32,
    #[arg(long, env = "SHARDWISE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax).
    #[arg(long, env = "SHARDWISE_LOG", default_value = "info")]
    pub log: String,
    /// Append every reconcile interval (start, end, cluster, shard) to this file, as JSON lines.
    #[arg(long, env = "SHARDWISE_AUDIT_FILE")]
    pub audit_file: Option<PathBuf>,
}

impl Config {
    pub fn strategy_config(&self) -> StrategyConfig {
        StrategyConfig {
            kind: self.strategy,
            virtual_nodes: self.virtual_nodes,
            load_factor: self.load_factor,
            max_extra_moves: self.max_extra_moves,
            target_balance: self.target_balance,
        }
    }

    pub fn lease_timing(&self) -> LeaseTiming {
        LeaseTiming {
            duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    /// Settings that only make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.metrics_secure && self.metrics_addr == self.health_addr {
            return Err(format!(
                "--metrics-addr and --health-addr are both {}: secure metrics need a port of their own, since the kubelet probes over plain HTTP",
                self.metrics_addr
            ));
        }
        if !self.metrics_secure && self.metrics_cert_dir.is_some() {
            return Err("--metrics-cert-dir is set but --metrics-secure is false: the certificate would not be used".to_string());
        }
        Ok(())
    }

    /// The StatefulSet's name: the flag, or the pod name without `-<ordinal>`.
    pub fn statefulset_name(&self) -> String {
        self.statefulset.clone().unwrap_or_else(|| {
            self.pod_name
                .rsplit_once('-')
                .map_or_else(|| self.pod_name.clone(), |(prefix, _)| prefix.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Config {
        let base = [
            "shardwise-controller",
            "--namespace=fleet",
            "--pod-name=shardwise-0",
        ];
        Config::try_parse_from(base.iter().chain(extra)).unwrap()
    }

    #[test]
    fn metrics_are_secure_unless_turned_off() {
        assert!(parse(&[]).metrics_secure);
        assert!(parse(&["--metrics-secure"]).metrics_secure);
        assert!(!parse(&["--metrics-secure=false"]).metrics_secure);
        assert!(parse(&[]).validate().is_ok());
    }

    #[test]
    fn settings_that_cannot_work_together_are_refused() {
        let shared = parse(&["--metrics-addr=0.0.0.0:9000", "--health-addr=0.0.0.0:9000"]);
        let e = shared.validate().unwrap_err();
        assert!(
            e.contains("0.0.0.0:9000") && e.contains("plain HTTP"),
            "{e}"
        );
        let open = parse(&[
            "--metrics-secure=false",
            "--metrics-addr=0.0.0.0:9000",
            "--health-addr=0.0.0.0:9000",
        ]);
        assert!(open.validate().is_ok());
        let unused = parse(&["--metrics-secure=false", "--metrics-cert-dir=/certs"]);
        assert!(
            unused
                .validate()
                .unwrap_err()
                .contains("--metrics-cert-dir")
        );
    }
}
