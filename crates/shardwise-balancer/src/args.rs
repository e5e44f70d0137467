//! The balancer's flags: Argo CD's installation is read as `shardwise plan --source argocd`
//! reads it; the balancer's own settings follow.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use shard_assign::{Hysteresis, Ratio, StrategyConfig, StrategyFlags, StrategyKind};
use shardwise_plan::argocd::ArgoCdLoad;
use shardwise_plan::installation::argocd_algorithm_named;
use shardwise_runtime::logging::LogFormat;
use shardwise_scale::Sizing;

use crate::pass::Damping;

/// Seconds between two passes: an hour at most, so that a typo cannot stop the balancer.
pub const MAX_INTERVAL_SECONDS: u32 = 3_600;

/// Keep the shard keys of a live Argo CD's cluster Secrets balanced with sticky-balanced as
/// clusters and apps come and go. Runs until stopped; one balancer at a time holds a Lease.
#[derive(Debug, Parser)]
#[command(name = "shardwise-balancer", version)]
pub struct BalanceArgs {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the pod's service account)
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Argo CD's namespace: its cluster Secrets, application controller and settings
    #[arg(long, short = 'n', value_name = "NS", default_value = "argocd")]
    pub namespace: String,
    /// Argo CD's application controller (a StatefulSet, or a Deployment under dynamic cluster
    /// distribution)
    #[arg(
        long,
        value_name = "NAME",
        default_value = "argocd-application-controller"
    )]
    pub statefulset: String,
    /// Namespaces of Applications besides Argo CD's (default: application.namespaces of
    /// argocd-cmd-params-cm, as the controller reads it)
    #[arg(long, value_delimiter = ',', value_name = "NS")]
    pub app_namespaces: Vec<String>,
    /// Argo CD's sharding algorithm (default: read from the installation): legacy, round-robin
    /// or consistent-hashing
    #[arg(long, value_name = "NAME", value_parser = argocd_algorithm_named)]
    pub current_strategy: Option<(StrategyKind, &'static str)>,
    /// What a cluster weighs: its Applications (apps), the resources they manage (resources),
    /// or what its controller measures it costs (measured: reconcile and resource-event time
    /// and cached objects, from each controller's /metrics; apps until a rate is measured)
    #[arg(long, value_enum, default_value_t = Load::Apps)]
    pub load: Load,
    /// With --load measured: the time constant, in seconds, of the moving average that
    /// smooths each cluster's measured time, so that one sync's burst moves nothing
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub load_window: u32,
    /// With --load measured: the share of a cluster's weight that comes from the objects its
    /// controller caches (memory) rather than from the time it spends (CPU), 0 to 1
    #[arg(long, value_name = "SHARE", default_value_t = 0.5, value_parser = share)]
    pub load_memory_weight: f64,
    /// The port of the application controllers' /metrics (Argo CD's --metrics-port): what
    /// each handover asks whether a controller has let a cluster go, and --load measured and
    /// --manage-replicas read
    #[arg(long, value_name = "PORT", default_value_t = 8082)]
    pub controller_metrics_port: u16,
    #[command(flatten)]
    pub strategy: StrategyFlags,
    /// Seconds between passes; each pass may spend the move budget (--max-extra-moves) once
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = seconds)]
    pub interval: u32,
    /// Busiest shard over the mean above which moves for balance start; once started, they go
    /// on (--max-extra-moves a pass) until it is at or under --target-balance
    #[arg(long, value_name = "RATIO", default_value_t = Hysteresis::DEFAULT_TRIGGER)]
    pub load_trigger: Ratio,
    /// Seconds after a move of a cluster before it may move again for balance (a move off a
    /// shard no pod serves is never held back)
    #[arg(long, value_name = "SECONDS", default_value_t = 1_800,
          value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub min_move_interval: u32,
    /// Percent of the fleet's load (apps, or resources) that moves may carry within any hour
    /// (above 100: more than the whole fleet's, for fleets that may move that often)
    #[arg(long, value_name = "PERCENT", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub hourly_move_budget: u32,
    /// Seconds a cluster stays where it is while a sync operation runs on one of its
    /// Applications, from the operation's start (a move off a shard no pod serves does not wait)
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub sync_wait: u32,
    /// Seconds a shard may go without a Ready controller pod before its clusters are moved to
    /// Ready shards (they come back when it recovers). Longer than a pod's replacement in a
    /// rollout, so that a rollout rescues nothing
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = seconds)]
    pub down_grace: u32,
    /// Change the controller's replica count (its StatefulSet's replicas and
    /// ARGOCD_CONTROLLER_REPLICAS together) to what the load needs, one pod at a time, each
    /// pod's clusters moved to the others before it restarts: no app with two owners or none.
    /// Needs `patch` on the StatefulSet; not with dynamic cluster distribution
    #[arg(long)]
    pub manage_replicas: bool,
    /// With --manage-replicas: the load one controller should carry, in the unit of --load
    /// (apps; resources; measured: apps weighed by what they cost against the average)
    #[arg(long, value_name = "LOAD", default_value_t = 2_000.0)]
    pub load_per_replica: f64,
    /// With --manage-replicas: the fewest controllers (2 or more: one does not shard)
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub min_replicas: u32,
    /// With --manage-replicas: the most controllers
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub max_replicas: u32,
    /// With --manage-replicas: seconds the load must have needed fewer controllers before
    /// the count goes down (to the most needed over that time); up goes at once
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = seconds)]
    pub scale_down_window: u32,
    /// This process's name in the Lease (default: $POD_NAME, else the host name), to which a
    /// random suffix is added
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub identity: Option<String>,
    /// Address of /metrics (plain HTTP)
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: std::net::SocketAddr,
    /// Address of /healthz and /readyz
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: std::net::SocketAddr,
    /// Decide and log each pass's writes, but write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// After moving a cluster, ask Argo CD to refresh its Applications (the
    /// argocd.argoproj.io/refresh annotation), so that the new controller reconciles them at
    /// once rather than at its next resync (up to twice --app-resync, minutes by default)
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub refresh_moved_apps: bool,
    /// Log filter (tracing-subscriber syntax)
    #[arg(long, env = "SHARDWISE_LOG", default_value = "info")]
    pub log: String,
    /// Log format
    #[arg(long, env = "SHARDWISE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl BalanceArgs {
    /// The strategy these flags give `kind`.
    pub fn config(&self, kind: StrategyKind) -> StrategyConfig {
        self.strategy.config(kind)
    }

    /// The start and stop thresholds of moves for balance, or why they cannot work together.
    pub fn band(&self) -> Result<Hysteresis, String> {
        let target = self.strategy.target_balance;
        if self.load_trigger < target {
            return Err(format!(
                "--load-trigger ({}) is below --target-balance ({target}): moves would start where they must stop",
                self.load_trigger
            ));
        }
        Ok(Hysteresis::new(self.load_trigger, target))
    }

    /// The replica count's sizing under `--manage-replicas`, or why these flags cannot work.
    pub fn sizing(&self) -> Result<Sizing, String> {
        Sizing::new(self.load_per_replica, self.min_replicas, self.max_replicas).map_err(|e| {
            format!(
                "--load-per-replica {}, --min-replicas {}, --max-replicas {}: {e}",
                self.load_per_replica, self.min_replicas, self.max_replicas
            )
        })
    }

    /// The minimum time between moves of a cluster and the hourly budget.
    pub fn damping(&self) -> Damping {
        Damping {
            min_move_interval: self.min_move_interval,
            hourly_budget_percent: self.hourly_move_budget,
            sync_wait: self.sync_wait,
        }
    }
}

/// What counts as load in an Argo CD fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Load {
    /// One per Application.
    Apps,
    /// One per resource an Application manages (`status.resources`).
    Resources,
    /// What the controllers measure a cluster costs, per app, against the fleet's average.
    Measured,
}

impl From<Load> for ArgoCdLoad {
    fn from(load: Load) -> Self {
        match load {
            // Measured weights multiply the app counts.
            Load::Apps | Load::Measured => ArgoCdLoad::Apps,
            Load::Resources => ArgoCdLoad::Resources,
        }
    }
}

/// A share from 0 to 1, with a message that says so.
fn share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        Ok(x) => Err(format!("must be from 0 to 1, got {x}")),
        Err(_) => Err(format!("must be a number from 0 to 1, got {text:?}")),
    }
}

/// Seconds (between passes, of grace): 1 to [`MAX_INTERVAL_SECONDS`], with a message that says
/// so.
fn seconds(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=i64::from(MAX_INTERVAL_SECONDS)).contains(&n) => Ok(n as u32),
        Ok(n) if n > 0 => Err(format!("{n} is over the limit of {MAX_INTERVAL_SECONDS}")),
        Ok(n) => Err(format!(
            "must be a whole number from 1 to {MAX_INTERVAL_SECONDS}, got {n}"
        )),
        Err(_) => Err(format!("must be a whole number, got {text:?}")),
    }
}
