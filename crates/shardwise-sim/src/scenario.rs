//! Scenarios: a fleet and shard set at step 0, then the changes a strategy must absorb.

use rand::{Rng, RngCore};
use serde::Serialize;
use shard_assign::{Cluster, ShardSet};

use crate::error::SimError;
use crate::fleet::{random_uid, shuffle};

/// What changes after the first assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Scenario {
    /// The StatefulSet goes from `from` to `to` replicas; a scale-down removes the highest
    /// ordinals, as Kubernetes does.
    Scale {
        /// Replicas at the start.
        from: u32,
        /// Replicas after the change.
        to: u32,
    },
    /// `count` new clusters join a fleet on `shards` shards.
    AddClusters {
        /// Shards throughout.
        shards: u32,
        /// Clusters that join.
        count: u32,
    },
    /// `count` clusters, chosen at random, leave a fleet on `shards` shards.
    RemoveClusters {
        /// Shards throughout.
        shards: u32,
        /// Clusters that leave.
        count: u32,
    },
    /// Over `steps` steps, `arrivals` ephemeral clusters join at each step and each leaves after
    /// a lifetime drawn uniformly from 1..=`max_lifetime` steps, beside the permanent fleet.
    Churn {
        /// Shards throughout.
        shards: u32,
        /// Steps after the initial one.
        steps: u32,
        /// Ephemeral clusters that join at each step.
        arrivals: u32,
        /// Most steps an ephemeral cluster stays.
        max_lifetime: u32,
    },
}

impl Scenario {
    /// The reference experiment: 10 shards scaled to 9.
    pub const REFERENCE: Scenario = Scenario::Scale { from: 10, to: 9 };

    /// Checks the scenario against a fleet of `fleet_size` clusters.
    pub(crate) fn validate(&self, fleet_size: usize) -> Result<(), SimError> {
        let invalid = |why: String| Err(SimError::InvalidScenario(why));
        match *self {
            Scenario::Scale { from, to } if from == 0 || to == 0 => invalid(format!(
                "shard counts must be at least 1 (got {from} -> {to})"
            )),
            Scenario::AddClusters { shards: 0, .. }
            | Scenario::RemoveClusters { shards: 0, .. }
            | Scenario::Churn { shards: 0, .. } => invalid("shard count must be at least 1".into()),
            Scenario::RemoveClusters { count, .. } if count as usize > fleet_size => invalid(
                format!("cannot remove {count} clusters from a fleet of {fleet_size}"),
            ),
            Scenario::Churn { steps: 0, .. } => invalid("churn needs at least 1 step".into()),
            Scenario::Churn {
                max_lifetime: 0, ..
            } => invalid("churn lifetime must be at least 1 step".into()),
            _ => Ok(()),
        }
    }

    /// Shards of the first step.
    pub fn initial_shards(&self) -> u32 {
        match *self {
            Scenario::Scale { from, .. } => from,
            Scenario::AddClusters { shards, .. }
            | Scenario::RemoveClusters { shards, .. }
            | Scenario::Churn { shards, .. } => shards,
        }
    }

    /// The successive states (fleet, live shards), starting with the initial one.
    /// `mean_apps` sizes the clusters that join.
    pub(crate) fn steps(&self, fleet: Vec<Cluster>, rng: &mut impl RngCore) -> Vec<Step> {
        let initial = ShardSet::contiguous(self.initial_shards());
        let mean_apps = mean_apps(&fleet);
        let first = Step {
            clusters: fleet.clone(),
            shards: initial.clone(),
        };
        match *self {
            Scenario::Scale { to, .. } => vec![
                first,
                Step {
                    clusters: fleet,
                    shards: ShardSet::contiguous(to),
                },
            ],
            Scenario::AddClusters { count, .. } => {
                let mut grown = fleet;
                grown.extend((0..count).map(|i| new_cluster(rng, "joined", i, mean_apps)));
                vec![
                    first,
                    Step {
                        clusters: grown,
                        shards: initial,
                    },
                ]
            }
            Scenario::RemoveClusters { count, .. } => {
                let mut shrunk = fleet;
                shuffle(&mut shrunk, rng);
                shrunk.truncate(shrunk.len() - count as usize);
                vec![
                    first,
                    Step {
                        clusters: shrunk,
                        shards: initial,
                    },
                ]
            }
            Scenario::Churn {
                steps,
                arrivals,
                max_lifetime,
                ..
            } => {
                let mut out = vec![first];
                // (cluster, last step it is present)
                let mut ephemeral: Vec<(Cluster, u32)> = Vec::new();
                for step in 1..=steps {
                    ephemeral.retain(|(_, until)| *until >= step);
                    for i in 0..arrivals {
                        let lifetime = rng.random_range(1..=max_lifetime);
                        let cluster = new_cluster(rng, &format!("ephemeral-{step}"), i, mean_apps);
                        ephemeral.push((cluster, step + lifetime - 1));
                    }
                    let mut clusters = fleet.clone();
                    clusters.extend(ephemeral.iter().map(|(c, _)| c.clone()));
                    out.push(Step {
                        clusters,
                        shards: initial.clone(),
                    });
                }
                out
            }
        }
    }
}

/// One state of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Step {
    pub clusters: Vec<Cluster>,
    pub shards: ShardSet,
}

fn mean_apps(fleet: &[Cluster]) -> u64 {
    if fleet.is_empty() {
        return 100;
    }
    fleet.iter().map(|c| c.apps).sum::<u64>() / fleet.len() as u64
}

/// A joining cluster with between none and twice the fleet's mean app count.
fn new_cluster(rng: &mut impl RngCore, prefix: &str, index: u32, mean_apps: u64) -> Cluster {
    let apps = rng.random_range(0..=2 * mean_apps);
    Cluster {
        id: random_uid(rng),
        name: format!("{prefix}-{index}"),
        apps,
        pin: None,
        weight: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn fleet(n: usize) -> Vec<Cluster> {
        (0..n).map(|i| Cluster::new(format!("c{i}"), 10)).collect()
    }

    #[test]
    fn scale_keeps_the_fleet_and_removes_the_highest_ordinals() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let steps = Scenario::REFERENCE.steps(fleet(5), &mut rng);
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].shards, ShardSet::contiguous(10));
        assert_eq!(steps[1].shards, ShardSet::contiguous(9));
        assert_eq!(steps[0].clusters, steps[1].clusters);
    }

    #[test]
    fn churn_clusters_come_and_go_within_their_lifetime() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let scenario = Scenario::Churn {
            shards: 4,
            steps: 20,
            arrivals: 3,
            max_lifetime: 4,
        };
        let steps = scenario.steps(fleet(10), &mut rng);
        assert_eq!(steps.len(), 21);
        for (t, step) in steps.iter().enumerate().skip(1) {
            let extra = step.clusters.len() - 10;
            // At least this step's arrivals, at most those of the last 4 steps.
            assert!(
                (3..=12).contains(&extra),
                "step {t}: {extra} ephemeral clusters"
            );
        }
        let first_arrivals: Vec<&str> = steps[1].clusters[10..]
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        let gone = steps[5]
            .clusters
            .iter()
            .all(|c| !first_arrivals.contains(&c.id.as_str()));
        assert!(gone, "clusters of step 1 outlived the maximum lifetime");
    }

    #[test]
    fn add_and_remove_change_the_fleet_by_count() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let add = Scenario::AddClusters {
            shards: 3,
            count: 4,
        }
        .steps(fleet(10), &mut rng);
        assert_eq!(add[1].clusters.len(), 14);
        let remove = Scenario::RemoveClusters {
            shards: 3,
            count: 4,
        }
        .steps(fleet(10), &mut rng);
        assert_eq!(remove[1].clusters.len(), 6);
        assert!(
            Scenario::RemoveClusters {
                shards: 3,
                count: 11
            }
            .validate(10)
            .is_err()
        );
        assert!(Scenario::Scale { from: 0, to: 1 }.validate(10).is_err());
    }
}
