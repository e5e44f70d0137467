//! Errors of the assignment library.

use thiserror::Error;

/// Why an assignment could not be computed. Nothing is placed when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AssignError {
    #[error("no live shards: at least one shard is needed to place clusters")]
    NoLiveShards,
    #[error("cluster id {0:?} appears more than once; ids must be unique")]
    DuplicateClusterId(String),
    #[error("cluster {0:?} has weight 0; a weight must be at least 1")]
    ZeroWeight(String),
    #[error("invalid {name}: {reason}")]
    InvalidParameter { name: &'static str, reason: String },
}

/// A strategy name or a parameter that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("unknown strategy {0:?}; expected one of: {1}")]
    UnknownStrategy(String, String),
    #[error("invalid ratio {0:?}: expected a decimal number such as 1.25, with at most 6 decimals")]
    InvalidRatio(String),
    #[error("unknown slicing {0:?}; expected one of: auto, on, off")]
    UnknownSliceSwitch(String),
    #[error(
        "invalid key range {0:?}: expected <first>-<last> in hexadecimal, the bounds of an aligned binary range"
    )]
    InvalidKeyRange(String),
}
