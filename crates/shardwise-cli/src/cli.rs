//! Command-line definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use shard_assign::{Ratio, StrategyFlags, StrategyKind};
use shardwise_sim::AppDistribution;

use crate::limits;
use shardwise_plan::FleetSource;
use shardwise_plan::argocd::ArgoCdLoad;
use shardwise_plan::installation::argocd_algorithm_named;

/// The version and the commit it was built from (build.rs; "unknown" without git).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SHARDWISE_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "shardwise",
    version = VERSION,
    about = "Spread a fleet's clusters over the replicas of a sharded controller",
    long_about = "Spread a fleet's clusters over the replicas of a sharded controller: simulate how \
                  shard-assignment strategies balance a fleet and how much they move when \
                  replicas or clusters change, show where clusters would go, plan a live \
                  shardwise or Argo CD fleet, and print the CRDs."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare strategies on a scenario over many seeds (default: the reference experiment,
    /// 100 clusters / 10,000 apps / 10 shards scaled to 9 / 100 seeds).
    Simulate(SimulateArgs),
    /// Show where each cluster of an inventory would go, and the load of each shard.
    Assign(AssignArgs),
    /// Read a live fleet through the kubeconfig and show, per strategy, the load of each shard
    /// and what would move when the replica count changes from --replicas to --to.
    Plan(PlanArgs),
    /// Print the CustomResourceDefinitions of shardwise (FleetCluster, FleetApp, FleetPolicy
    /// and the runtime's UnitSlice) as YAML.
    Crds,
    /// Print a completion script for a shell (e.g. `shardwise completions bash >
    /// /etc/bash_completion.d/shardwise`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Whether clusters are cut into slices, for `simulate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Slicing {
    /// With sticky-balanced only.
    Auto,
    /// With every strategy that may cut.
    On,
    Off,
    /// Every strategy that may cut both with and without, side by side.
    Both,
}

/// Whether clusters are cut into slices, for `assign` and `plan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SliceSwitch {
    /// With sticky-balanced only.
    Auto,
    /// With every strategy that may cut.
    On,
    Off,
}

impl From<SliceSwitch> for shard_assign::SliceSwitch {
    fn from(switch: SliceSwitch) -> Self {
        match switch {
            SliceSwitch::Auto => shard_assign::SliceSwitch::Auto,
            SliceSwitch::On => shard_assign::SliceSwitch::On,
            SliceSwitch::Off => shard_assign::SliceSwitch::Off,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// Where `plan` reads the fleet from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// FleetClusters and FleetApps; the current placement is their shard label.
    Shardwise,
    /// Argo CD's cluster Secrets and Applications; the current placement is computed.
    Argocd,
}

/// What counts as load in an Argo CD fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Load {
    /// One per Application.
    Apps,
    /// One per resource an Application manages (`status.resources`).
    Resources,
}

impl From<Source> for FleetSource {
    fn from(source: Source) -> Self {
        match source {
            Source::Shardwise => FleetSource::Shardwise,
            Source::Argocd => FleetSource::Argocd,
        }
    }
}

impl From<Load> for ArgoCdLoad {
    fn from(load: Load) -> Self {
        match load {
            Load::Apps => ArgoCdLoad::Apps,
            Load::Resources => ArgoCdLoad::Resources,
        }
    }
}

/// What counts as load in `plan`: Argo CD's two counts, or what shardwise's replicas measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlanLoad {
    /// One per app (FleetApp, or Argo CD Application), times the cluster's weight.
    Apps,
    /// One per resource an Application manages (`status.resources`). --source argocd only.
    Resources,
    /// The reconcile time shardwise's replicas measure and publish on their shard Leases,
    /// weighed as the controller's planner weighs it. --source shardwise only.
    Measured,
}

impl PlanLoad {
    /// The load of an Argo CD fleet; `None` for `measured`, which Argo CD does not publish.
    pub fn argocd(self) -> Option<ArgoCdLoad> {
        match self {
            PlanLoad::Apps => Some(ArgoCdLoad::Apps),
            PlanLoad::Resources => Some(ArgoCdLoad::Resources),
            PlanLoad::Measured => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScenarioKind {
    /// Change the number of shards from --from to --to.
    Scale,
    /// Add --count clusters, on --from shards.
    AddClusters,
    /// Remove --count random clusters, on --from shards.
    RemoveClusters,
    /// Ephemeral clusters come and go for --steps steps, on --from shards.
    Churn,
    /// --from shards changed to --to, then planning passes until the target balance (at most
    /// --passes): passes and apps moved against the least any placement moves.
    Converge,
    /// Each cluster's cost per app drifts for --hours on --from shards, planned every
    /// --plan-every minutes by apps and by measured cost: the true balance and the moves.
    Drift,
}

/// A whole number of at least 1, with a message that says so (clap's own would call "-5" an
/// unexpected argument) and states the real range: up to `MAX`, the limit of `limits.rs`. A
/// value above `MAX` that fits is let through, so that the command refuses it with the limit's
/// own message (`--from 20000 is over the limit of 10000`).
fn at_least_one<const MAX: u64>(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i64>() {
        Ok(n) if (1..=i64::from(u32::MAX)).contains(&n) => Ok(n as u32),
        Ok(n) => Err(format!("must be a whole number from 1 to {MAX}, got {n}")),
        Err(_) => Err(format!("must be a whole number, got {text:?}")),
    }
}

/// A whole number of at least 0.
fn count<T: TryFrom<i128>>(text: &str) -> Result<T, String> {
    match text.trim().parse::<i128>() {
        Ok(n) if n < 0 => Err(format!("must be 0 or more, got {n}")),
        Ok(n) => T::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("must be a whole number, got {text:?}")),
    }
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct SimulateArgs {
    /// Clusters in the synthetic fleet.
    #[arg(long, default_value_t = 100, value_parser = at_least_one::<{ limits::MAX_CLUSTERS }>)]
    pub clusters: u32,
    /// Apps in the synthetic fleet, spread over its clusters.
    #[arg(long, default_value_t = 10_000, value_parser = count::<u64>)]
    pub apps: u64,
    /// How apps are spread: uniform, random (uniform weights), zipf or zipf:EXPONENT.
    #[arg(long, default_value = "random")]
    pub distribution: AppDistribution,
    /// Read the fleet from a YAML or JSON inventory instead of drawing one (`-`: standard
    /// input).
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// What changes after the first assignment.
    #[arg(long, value_enum, default_value_t = ScenarioKind::Scale)]
    pub scenario: ScenarioKind,
    /// Shards at the start.
    #[arg(long, default_value_t = 10, value_parser = at_least_one::<{ limits::MAX_SHARDS }>)]
    pub from: u32,
    /// Shards after a scale change.
    #[arg(long, default_value_t = 9, value_parser = at_least_one::<{ limits::MAX_SHARDS }>)]
    pub to: u32,
    /// Clusters added or removed (add-clusters, remove-clusters).
    #[arg(long, default_value_t = 10, value_parser = count::<u32>)]
    pub count: u32,
    /// Steps of the churn scenario.
    #[arg(long, default_value_t = 50, value_parser = at_least_one::<{ limits::MAX_STEPS }>)]
    pub steps: u32,
    /// Ephemeral clusters arriving at each churn step.
    #[arg(long, default_value_t = 5, value_parser = count::<u32>)]
    pub arrivals: u32,
    /// Longest life of an ephemeral cluster, in steps (each draws 1..=this).
    #[arg(long, default_value_t = 10, value_parser = at_least_one::<{ limits::MAX_STEPS }>)]
    pub max_lifetime: u32,
    /// Planning passes at most after the change (converge).
    #[arg(long, default_value_t = 50, value_parser = at_least_one::<{ limits::MAX_STEPS }>)]
    pub passes: u32,
    /// Simulated hours (drift).
    #[arg(long, default_value_t = 24, value_parser = at_least_one::<{ limits::MAX_HOURS }>)]
    pub hours: u32,
    /// Minutes between planning passes (drift).
    #[arg(long, default_value_t = 5, value_parser = at_least_one::<{ limits::MAX_MINUTES }>)]
    pub plan_every: u32,
    /// Standard deviation of the log of a cluster's cost per app after an hour (drift).
    #[arg(long, default_value_t = 0.1)]
    pub drift: f64,
    /// Standard deviation of the log of an observation's error (drift).
    #[arg(long, default_value_t = 0.1)]
    pub noise: f64,
    /// Half-life in minutes of the planner's smoothing of measured costs (drift).
    #[arg(long, default_value_t = 15, value_parser = at_least_one::<{ limits::MAX_MINUTES }>)]
    pub smoothing: u32,
    /// Busiest shard over the mean above which sticky-balanced starts moving clusters for
    /// measured load (drift); it stops at --target-balance.
    #[arg(long, default_value_t = shard_assign::Hysteresis::DEFAULT_TRIGGER)]
    pub trigger: Ratio,
    /// Strategies to compare, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<StrategyKind>,
    #[command(flatten)]
    pub strategy: StrategyFlags,
    /// Cut clusters too big for one shard into slices of their apps (Argo CD's algorithms,
    /// legacy-modulo, round-robin and argocd-consistent-hashing, never cut).
    #[arg(long, value_enum, default_value_t = Slicing::Auto)]
    pub slicing: Slicing,
    /// Number of seeds (fleets drawn) to summarise over.
    #[arg(long, default_value_t = 100, value_parser = at_least_one::<{ limits::MAX_SEEDS }>)]
    pub seeds: u32,
    /// First seed; seeds are consecutive from here.
    #[arg(long, default_value_t = 0, value_parser = count::<u64>)]
    pub first_seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also draw the results to a PNG or SVG file (by extension).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Also time every assignment (an "assign ms" column). Off, the output depends on the
    /// inputs only, byte for byte.
    #[arg(long)]
    pub timings: bool,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct AssignArgs {
    /// Strategy to place clusters with.
    #[arg(long)]
    pub strategy: StrategyKind,
    /// Number of shards (0..N-1 live).
    #[arg(long, value_parser = at_least_one::<{ limits::MAX_SHARDS }>, required_unless_present = "live_shards", conflicts_with = "live_shards")]
    pub shards: Option<u32>,
    /// Live shard ids, comma-separated, when they are not 0..N-1 (e.g. 0,1,3).
    #[arg(long, value_delimiter = ',', value_parser = count::<u32>)]
    pub live_shards: Vec<u32>,
    /// YAML or JSON inventory of clusters (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub inventory: PathBuf,
    #[command(flatten)]
    pub strategy_args: StrategyFlags,
    /// Cut clusters too big for one shard into slices of their apps (Argo CD's algorithms,
    /// legacy-modulo, round-robin and argocd-consistent-hashing, never cut). An inventory counts apps without naming them, so the apps get
    /// random UIDs derived from their cluster's id, as in `simulate`.
    #[arg(long, value_enum, default_value_t = SliceSwitch::Auto)]
    pub slicing: SliceSwitch,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct PlanArgs {
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of the fleet (default: shardwise, or argocd with --source argocd).
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// What to read: FleetClusters and FleetApps, or Argo CD's cluster Secrets and Applications.
    #[arg(long, value_enum, default_value_t = Source::Shardwise)]
    pub source: Source,
    /// Argo CD's application.namespaces: namespaces, or patterns with `*` and `?`, whose
    /// Applications count besides --namespace's, comma-separated (default: read from the
    /// installation).
    #[arg(long, value_delimiter = ',', value_name = "NS")]
    pub app_namespaces: Vec<String>,
    /// StatefulSet whose replica count is the current one (default: shardwise, or
    /// argocd-application-controller with --source argocd, whose settings it also gives; for
    /// Argo CD, a Deployment of that name when there is no StatefulSet).
    #[arg(long, value_name = "NAME")]
    pub statefulset: Option<String>,
    /// Replicas now (default: read from the StatefulSet).
    #[arg(long, value_parser = at_least_one::<{ limits::MAX_SHARDS }>)]
    pub replicas: Option<u32>,
    /// Replicas to plan for (default: --replicas).
    #[arg(long, value_parser = at_least_one::<{ limits::MAX_SHARDS }>)]
    pub to: Option<u32>,
    /// Strategies to plan with, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub strategy: Vec<StrategyKind>,
    /// Argo CD's sharding algorithm today: legacy, round-robin or consistent-hashing (or
    /// shardwise's names for them). --source argocd only; default: read from the installation.
    #[arg(long, value_name = "NAME", value_parser = argocd_algorithm_named)]
    pub current_strategy: Option<(StrategyKind, &'static str)>,
    /// What a cluster's load is: its apps times its weight; for --source argocd, the resources
    /// its Applications manage (the length of each status.resources); for --source shardwise,
    /// the reconcile time its replicas measured, from the load reports of their shard Leases.
    #[arg(long, value_enum, default_value_t = PlanLoad::Apps)]
    pub load: PlanLoad,
    #[command(flatten)]
    pub strategy_args: StrategyFlags,
    /// Cut clusters too big for one shard into slices of their apps, by the FNV-1a hash of each
    /// app's UID (Argo CD's algorithms, legacy-modulo, round-robin and
    /// argocd-consistent-hashing, never cut).
    #[arg(long, value_enum, default_value_t = SliceSwitch::Auto)]
    pub slicing: SliceSwitch,
    /// Moved clusters listed per strategy in table format (0 lists all).
    #[arg(long, default_value_t = 20, value_parser = count::<usize>)]
    pub limit: usize,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Pin every cluster Argo CD shards where --strategy puts it at --to replicas, by the
    /// `shard` key of its Secret (--source argocd only). Shows the diff; writes only with --yes.
    #[arg(long)]
    pub apply: bool,
    /// With --apply: remove the `shard` key of every cluster Secret instead, handing placement
    /// back to Argo CD's algorithm.
    #[arg(long, requires = "apply")]
    pub unpin: bool,
    /// With --apply: write the Secrets (without it, --apply is a dry run).
    #[arg(long, requires = "apply")]
    pub yes: bool,
}
