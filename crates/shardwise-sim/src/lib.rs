//! The rebalancing simulator behind `shardwise simulate`.
//!
//! A [`Simulation`] draws a fleet for each seed (or takes an inventory), walks it through a
//! [`Scenario`] — a scale change, clusters joining or leaving, or ephemeral clusters coming and
//! going — with every selected strategy, and summarises balance (max/mean, spread/mean and
//! coefficient of variation of load per shard), churn (clusters and apps that change shard) and,
//! when asked, the time each assignment took, as medians and 95th percentiles over seeds.
//!
//! Everything is reproducible: a seed fixes the fleet and the scenario's draws (ChaCha8).
//!
//! ```
//! use shardwise_sim::{FleetSource, FleetSpec, Simulation};
//!
//! // The reference experiment (10 -> 9 shards) on a small fleet, one seed.
//! let simulation = Simulation {
//!     fleet: FleetSource::Synthetic(FleetSpec {
//!         clusters: 20,
//!         apps: 500,
//!         ..FleetSpec::REFERENCE
//!     }),
//!     seeds: 1,
//!     ..Simulation::reference()
//! };
//! let report = simulation.run(|| {})?;
//! assert!(!report.strategies.is_empty());
//! # Ok::<(), shardwise_sim::SimError>(())
//! ```

#![deny(missing_docs)]

mod convergence;
mod drift;
mod error;
mod fleet;
mod inventory;
mod scenario;
mod simulate;
mod stats;

pub use convergence::{Convergence, ConvergenceReport, ConvergenceRow};
pub use drift::{Drift, DriftReport, DriftRow, LoadModel};
pub use error::SimError;
pub use fleet::{AppDistribution, FleetSpec, app_keys, app_uid, apportion};
pub use inventory::{InventoryFormat, parse_inventory};
pub use scenario::Scenario;
pub use simulate::{
    BalanceSummary, DiffCounts, FleetDescription, FleetSource, MovesSummary, Report, SeedRun,
    Simulation, SliceMode, StepSummary, StrategyReport,
};
pub use stats::Summary;
