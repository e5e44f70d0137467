//! Errors of the simulator.

use shard_assign::AssignError;
use thiserror::Error;

/// Why a simulation, an experiment or an inventory was refused, or an assignment failed.
#[derive(Debug, Error)]
pub enum SimError {
    /// An app distribution that does not parse; holds the text given.
    #[error(
        "invalid app distribution {0:?}: expected uniform, random, zipf or zipf:EXPONENT (EXPONENT > 0)"
    )]
    InvalidDistribution(String),
    /// Settings that cannot run: a shard count, fleet, seed range or experiment parameter out
    /// of bounds. Holds the reason.
    #[error("invalid scenario: {0}")]
    InvalidScenario(String),
    /// An inventory that does not parse or holds a bad entry. Holds the reason.
    #[error("invalid inventory: {0}")]
    InvalidInventory(String),
    // Transparent: the assignment error says what failed, and a wrapper that repeated it would
    // print it twice in an error chain.
    /// A strategy refused its configuration or could not place the fleet.
    #[error(transparent)]
    Assign(#[from] AssignError),
}
