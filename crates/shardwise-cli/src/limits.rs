//! Refusals of a command line, and the sizes it may ask for: each is checked before any work,
//! so that a size that would take hours or exhaust memory gets one line instead.

use std::fmt::Display;

use thiserror::Error;

/// A command line that cannot run as given (exit code 2).
#[derive(Debug, Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);

impl Usage {
    /// A refusal that says why, with the reason of a lower layer (an invalid parameter, a
    /// malformed inventory).
    pub(crate) fn of(reason: impl Display) -> Self {
        Usage(reason.to_string())
    }
}

/// Shards (replicas of a StatefulSet): the weighted ring holds `--virtual-nodes` points for
/// each, 100 million at this many shards and the largest ring.
pub(crate) const MAX_SHARDS: u64 = 10_000;
/// Clusters in a fleet: one seed of a million takes about 45 s and 1.6 GB.
pub(crate) const MAX_CLUSTERS: u64 = 1_000_000;
/// Apps in a fleet: with slices each gets a key, 80 MB at this many.
pub(crate) const MAX_APPS: u64 = 10_000_000;
/// Apps a scenario may reach with the clusters that join it.
pub(crate) const MAX_SCENARIO_APPS: u64 = 2 * MAX_APPS;
pub(crate) const MAX_SEEDS: u64 = 100_000;
/// Churn steps, and the longest life of an ephemeral cluster.
pub(crate) const MAX_STEPS: u64 = 10_000;
/// Simulated hours of the drift experiment: a year.
pub(crate) const MAX_HOURS: u64 = 8_760;
/// Minutes between passes, or of smoothing, in the drift experiment: a day.
pub(crate) const MAX_MINUTES: u64 = 1_440;
/// Assignments an experiment (`converge`, `drift`) makes over all its seeds, passes and
/// strategies: about a minute of work.
pub(crate) const MAX_EXPERIMENT_ASSIGNMENTS: u64 = 5_000_000;
/// Clusters summed over every step of a scenario, all of which are held at once.
pub(crate) const MAX_CLUSTER_STATES: u64 = 10_000_000;

/// `flag value` within `limit`.
pub(crate) fn at_most(flag: &str, value: impl Into<u64>, limit: u64) -> Result<(), Usage> {
    let value = value.into();
    if value > limit {
        return Err(Usage(format!(
            "{flag} {value} is over the limit of {limit}"
        )));
    }
    Ok(())
}

/// A fleet read from an inventory, within the sizes of a synthetic one.
pub(crate) fn fleet(clusters: usize, apps: u64, what: &str) -> Result<(), Usage> {
    if clusters as u64 > MAX_CLUSTERS {
        return Err(Usage(format!(
            "{what} lists {clusters} clusters, over the limit of {MAX_CLUSTERS}"
        )));
    }
    if apps > MAX_APPS {
        return Err(Usage(format!(
            "{what} holds {apps} apps, over the limit of {MAX_APPS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_over_its_limit_is_named_with_the_limit() {
        assert!(at_most("--seeds", 100_000u32, MAX_SEEDS).is_ok());
        let err = at_most("--clusters", 4_000_000_000u32, MAX_CLUSTERS).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--clusters 4000000000 is over the limit of 1000000"
        );
        let err = fleet(3, MAX_APPS + 1, "inventory fleet.yaml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "inventory fleet.yaml holds 10000001 apps, over the limit of 10000000"
        );
        assert!(fleet(MAX_CLUSTERS as usize + 1, 0, "x").is_err());
    }
}
