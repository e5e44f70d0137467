//! The controller's flags, each with an environment variable: those of every sharded replica
//! ([`ReplicaArgs`]) and the Fleet controller's own.

use std::time::Duration;

use clap::Parser;
use shardwise_runtime::args::{ArgsError, ReplicaArgs, duration, positive_u32};
use shardwise_runtime::settings::{RequestLimit, Settings, WatchScope};

use crate::fleet::FleetSettings;

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
    /// The flags every sharded replica takes: its pod and namespace, placement, load and
    /// autoscaling, limits and logging.
    #[command(flatten)]
    pub replica: ReplicaArgs,

    /// Concurrent cluster reconciles.
    #[arg(long, env = "SHARDWISE_CLUSTER_WORKERS", default_value_t = 4, value_parser = positive_u32)]
    pub(crate) cluster_workers: u32,
    /// Concurrent app reconciles.
    #[arg(long, env = "SHARDWISE_APP_WORKERS", default_value_t = 8, value_parser = positive_u32)]
    pub(crate) app_workers: u32,
    /// Requests per second to each destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_QPS", default_value_t = 20, value_parser = positive_u32)]
    pub(crate) cluster_qps: u32,
    /// Burst of requests to each destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_BURST", default_value_t = 40, value_parser = positive_u32)]
    pub(crate) cluster_burst: u32,
    /// Timeout of one request to a destination cluster.
    #[arg(long, env = "SHARDWISE_CLUSTER_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub(crate) cluster_timeout: Duration,
    /// Look at every app again this often, as a safety net: a change of an app's objects on its
    /// cluster is seen at once through the cluster's watches, and only what differs is written.
    #[arg(long, env = "SHARDWISE_RESYNC_INTERVAL", default_value = "1h", value_parser = duration)]
    pub(crate) resync_interval: Duration,
    /// Probe every destination cluster this often.
    #[arg(long, env = "SHARDWISE_PROBE_INTERVAL", default_value = "1m", value_parser = duration)]
    pub(crate) probe_interval: Duration,
}

impl Config {
    /// The runtime's settings: FleetClusters, FleetApps, leases and the StatefulSet all live in
    /// `--namespace`.
    pub(crate) fn settings(&self) -> Result<Settings, ArgsError> {
        let scope = WatchScope::Namespace(self.replica.namespace.clone());
        let mut settings = self.replica.settings("shardwise-controller", scope)?;
        settings.owner.unit_workers = self.cluster_workers;
        settings.owner.item_workers = self.app_workers;
        Ok(settings)
    }

    /// The Fleet controller's own settings.
    pub(crate) fn fleet(&self) -> FleetSettings {
        FleetSettings {
            resync_interval: self.resync_interval,
            probe_interval: self.probe_interval,
            cluster_limit: RequestLimit {
                qps: self.cluster_qps,
                burst: self.cluster_burst,
            },
            cluster_timeout: self.cluster_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardwise_runtime::settings::SettingsError;

    fn parse(extra: &[&str]) -> Config {
        let base = [
            "shardwise-controller",
            "--namespace=fleet",
            "--pod-name=shardwise-2",
        ];
        Config::try_parse_from(base.iter().chain(extra)).unwrap()
    }

    #[test]
    fn fleet_flags_reach_the_runtime_and_the_reconcilers() {
        let config = parse(&["--cluster-workers=2", "--app-workers=3", "--cluster-qps=9"]);
        let settings = config.settings().unwrap();
        assert_eq!(settings.replica.shard, 2);
        assert_eq!(settings.scope, WatchScope::Namespace("fleet".into()));
        assert_eq!(
            (settings.owner.unit_workers, settings.owner.item_workers),
            (2, 3)
        );
        assert_eq!(config.fleet().cluster_limit.qps, 9);
        assert_eq!(config.fleet().resync_interval, Duration::from_secs(3600));
    }

    #[test]
    fn bad_values_are_refused_with_the_flag_named() {
        let e = Config::try_parse_from([
            "shardwise-controller",
            "--namespace=fleet",
            "--pod-name=shardwise-0",
            "--app-workers=0",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--app-workers") && e.contains("at least 1"),
            "{e}"
        );
        let bad_pod = parse(&["--pod-name=shardwise"]).settings().unwrap_err();
        assert!(
            matches!(bad_pod, ArgsError::Settings(SettingsError::Identity(_))),
            "{bad_pod}"
        );
    }
}
