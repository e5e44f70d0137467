//! Errors of the assignment library.

use thiserror::Error;

/// Why an assignment could not be computed. Nothing is placed when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AssignError {
    /// The shard set is empty.
    #[error("no live shards: at least one shard is needed to place clusters")]
    NoLiveShards,
    /// Two clusters have the same id.
    #[error("cluster id {0:?} appears more than once; ids must be unique")]
    DuplicateClusterId(String),
    /// A cluster's weight is 0.
    #[error("cluster {0:?} has weight 0; a weight must be at least 1")]
    ZeroWeight(String),
    /// A strategy parameter is out of range.
    #[error("invalid {name}: {reason}")]
    InvalidParameter {
        /// The parameter, as users know it (e.g. `load factor`).
        name: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
}

/// A strategy name or a parameter that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// No strategy has this name; the second field lists the names there are.
    #[error("unknown strategy {0:?}; expected one of: {1}")]
    UnknownStrategy(String, String),
    /// Not a [`Ratio`](crate::Ratio): a plain decimal with at most 6 decimals.
    #[error("invalid ratio {0:?}: expected a decimal number such as 1.25, with at most 6 decimals")]
    InvalidRatio(String),
    /// Not a [`SliceSwitch`](crate::SliceSwitch) name.
    #[error("unknown slicing {0:?}; expected one of: auto, on, off")]
    UnknownSliceSwitch(String),
    /// Not a [`KeyRange`](crate::KeyRange) as it is printed.
    #[error(
        "invalid key range {0:?}: expected <first>-<last> in hexadecimal, the bounds of an aligned binary range"
    )]
    InvalidKeyRange(String),
}
