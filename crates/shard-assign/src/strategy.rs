//! Strategy names and parameters.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{AssignError, ParseError};
use crate::ratio::Ratio;

/// The placement strategies, by the names users select them with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// FNV-1a of the cluster id modulo the shard count (Argo CD's legacy algorithm).
    LegacyModulo,
    /// Clusters sorted by id, dealt out in turn.
    RoundRobin,
    /// Largest cluster first, each onto the shard with the least load so far.
    GreedyMinimum,
    /// A consistent-hash ring whose shards accept clusters less readily as they fill.
    WeightedRingHash,
    /// Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam).
    BoundedLoad,
    /// Keeps clusters where they were and spends a small budget of moves on balance.
    StickyBalanced,
    /// Argo CD v3.5's `consistent-hashing` placement, bit for bit: a BLAKE2b ring of 1000 points
    /// per shard, clusters in id order each walking to the first shard under 1.25 × the mean
    /// app count so far. Reads ids, app counts and pins; ignores weights and ring parameters.
    #[serde(rename = "argocd-consistent-hashing")]
    ArgoCdConsistentHashing,
}

impl StrategyKind {
    /// The strategies reports compare by default, in the order they list them.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::LegacyModulo,
        StrategyKind::RoundRobin,
        StrategyKind::GreedyMinimum,
        StrategyKind::WeightedRingHash,
        StrategyKind::BoundedLoad,
        StrategyKind::StickyBalanced,
    ];

    /// Strategies selectable by name but left out of [`StrategyKind::ALL`], the default
    /// comparison: reproductions of another system's placement, for fleets migrating from it.
    pub const OPT_IN: [StrategyKind; 1] = [StrategyKind::ArgoCdConsistentHashing];

    /// Every strategy that can be selected by name: [`StrategyKind::ALL`], then
    /// [`StrategyKind::OPT_IN`].
    pub fn every() -> impl Iterator<Item = StrategyKind> {
        Self::ALL.into_iter().chain(Self::OPT_IN)
    }

    /// The name users select the strategy by, as `Display` prints it and `FromStr` reads it.
    pub const fn name(self) -> &'static str {
        match self {
            StrategyKind::LegacyModulo => "legacy-modulo",
            StrategyKind::RoundRobin => "round-robin",
            StrategyKind::GreedyMinimum => "greedy-minimum",
            StrategyKind::WeightedRingHash => "weighted-ring-hash",
            StrategyKind::BoundedLoad => "bounded-load",
            StrategyKind::StickyBalanced => "sticky-balanced",
            StrategyKind::ArgoCdConsistentHashing => "argocd-consistent-hashing",
        }
    }

    /// Whether placement depends on app counts, so that a planner should re-plan when they change.
    pub const fn is_load_aware(self) -> bool {
        !matches!(self, StrategyKind::LegacyModulo | StrategyKind::RoundRobin)
    }

    /// Whether placement reads the previous assignment.
    pub const fn uses_previous(self) -> bool {
        matches!(self, StrategyKind::StickyBalanced)
    }
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StrategyKind {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyKind::every()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = StrategyKind::every().map(|k| k.name()).collect();
                ParseError::UnknownStrategy(s.to_string(), names.join(", "))
            })
    }
}

/// A strategy with its parameters. Parameters a strategy does not use are ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct StrategyConfig {
    /// The strategy.
    pub kind: StrategyKind,
    /// Points per shard on the ring (`weighted-ring-hash`, `bounded-load`).
    pub virtual_nodes: u32,
    /// `c` in the cap `ceil(c * total / shards)` (`bounded-load`); at least 1.
    pub load_factor: Ratio,
    /// Moves beyond the forced ones that may be spent on balance (`sticky-balanced`).
    pub max_extra_moves: u32,
    /// Max/mean load at or under which no extra move is made (`sticky-balanced`); at least 1.
    pub target_balance: Ratio,
}

impl StrategyConfig {
    /// Default of [`virtual_nodes`](Self::virtual_nodes).
    pub const DEFAULT_VIRTUAL_NODES: u32 = 100;
    /// The most [`virtual_nodes`](Self::virtual_nodes) that [`validate`](Self::validate)
    /// accepts.
    pub const MAX_VIRTUAL_NODES: u32 = 10_000;
    /// Default of [`load_factor`](Self::load_factor): 1.25.
    pub const DEFAULT_LOAD_FACTOR: Ratio = Ratio::from_thousandths(1250);
    /// Default of [`max_extra_moves`](Self::max_extra_moves).
    pub const DEFAULT_MAX_EXTRA_MOVES: u32 = 3;
    /// Default of [`target_balance`](Self::target_balance): 1.03.
    pub const DEFAULT_TARGET_BALANCE: Ratio = Ratio::from_thousandths(1030);

    /// The strategy with default parameters.
    pub const fn new(kind: StrategyKind) -> Self {
        Self {
            kind,
            virtual_nodes: Self::DEFAULT_VIRTUAL_NODES,
            load_factor: Self::DEFAULT_LOAD_FACTOR,
            max_extra_moves: Self::DEFAULT_MAX_EXTRA_MOVES,
            target_balance: Self::DEFAULT_TARGET_BALANCE,
        }
    }

    /// Checks the parameters, so that a bad configuration is refused before anything is placed.
    pub fn validate(&self) -> Result<(), AssignError> {
        if self.virtual_nodes == 0 || self.virtual_nodes > Self::MAX_VIRTUAL_NODES {
            return Err(AssignError::InvalidParameter {
                name: "virtual nodes",
                reason: format!(
                    "{} is out of range 1..={}",
                    self.virtual_nodes,
                    Self::MAX_VIRTUAL_NODES
                ),
            });
        }
        if self.load_factor < Ratio::ONE {
            return Err(AssignError::InvalidParameter {
                name: "load factor",
                reason: format!(
                    "{} is below 1; the cap would be under the mean load",
                    self.load_factor
                ),
            });
        }
        if self.target_balance < Ratio::ONE {
            return Err(AssignError::InvalidParameter {
                name: "target balance",
                reason: format!(
                    "{} is below 1; no shard can be lighter than the mean on all shards",
                    self.target_balance
                ),
            });
        }
        Ok(())
    }
}

impl From<StrategyKind> for StrategyConfig {
    fn from(kind: StrategyKind) -> Self {
        Self::new(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_strategies_that_ignore_app_counts_are_not_load_aware() {
        for kind in StrategyKind::every() {
            let ignores_counts =
                matches!(kind, StrategyKind::LegacyModulo | StrategyKind::RoundRobin);
            assert_eq!(kind.is_load_aware(), !ignores_counts, "{kind}");
            // Only sticky-balanced reads where clusters were.
            assert_eq!(
                kind.uses_previous(),
                kind == StrategyKind::StickyBalanced,
                "{kind}"
            );
        }
    }

    #[test]
    fn virtual_nodes_are_taken_from_one_up_to_the_maximum() {
        let with = |virtual_nodes| StrategyConfig {
            virtual_nodes,
            ..StrategyConfig::new(StrategyKind::BoundedLoad)
        };
        assert!(with(1).validate().is_ok());
        assert!(with(StrategyConfig::MAX_VIRTUAL_NODES).validate().is_ok());
        for bad in [0, StrategyConfig::MAX_VIRTUAL_NODES + 1] {
            assert!(with(bad).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_round_trip() {
        for kind in StrategyKind::every() {
            assert_eq!(kind.name().parse::<StrategyKind>().unwrap(), kind);
            assert_eq!(kind.to_string(), kind.name());
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
        }
    }

    #[test]
    fn unknown_name_lists_the_valid_ones() {
        let err = "consistent-hashing".parse::<StrategyKind>().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("consistent-hashing"), "{text}");
        assert!(text.contains("bounded-load"), "{text}");
        assert!(text.contains("argocd-consistent-hashing"), "{text}");
    }

    #[test]
    fn every_strategy_is_listed_once() {
        let mut names: Vec<&str> = StrategyKind::every().map(StrategyKind::name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        assert_eq!(count, StrategyKind::ALL.len() + StrategyKind::OPT_IN.len());
        assert!(!StrategyKind::ALL.contains(&StrategyKind::ArgoCdConsistentHashing));
        assert_eq!(
            "argocd-consistent-hashing".parse::<StrategyKind>(),
            Ok(StrategyKind::ArgoCdConsistentHashing)
        );
    }

    #[test]
    fn validation_rejects_out_of_range_parameters() {
        let mut config = StrategyConfig::new(StrategyKind::BoundedLoad);
        assert!(config.validate().is_ok());
        config.virtual_nodes = 0;
        assert!(config.validate().is_err());
        config.virtual_nodes = 10;
        config.load_factor = "0.9".parse().unwrap();
        assert!(config.validate().is_err());
        config.load_factor = Ratio::ONE;
        config.target_balance = "0.5".parse().unwrap();
        assert!(config.validate().is_err());
    }
}
