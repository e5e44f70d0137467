//! Errors of the simulator.

use shard_assign::AssignError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum SimError {
    #[error(
        "invalid app distribution {0:?}: expected uniform, random, zipf or zipf:EXPONENT (EXPONENT > 0)"
    )]
    InvalidDistribution(String),
    #[error("invalid scenario: {0}")]
    InvalidScenario(String),
    #[error("invalid inventory: {0}")]
    InvalidInventory(String),
    // Transparent: the assignment error says what failed, and a wrapper that repeated it would
    // print it twice in an error chain.
    #[error(transparent)]
    Assign(#[from] AssignError),
}
