//! The strategies' tuning as command-line flags (feature `clap`): one definition for every
//! program that places (the controller's replicas, the `shardwise` CLI, the Argo CD balancer),
//! so their names, defaults, ranges and messages cannot drift apart. Each flag has an
//! environment variable for a container's env.

use crate::{Ratio, StrategyConfig, StrategyKind};

/// `--virtual-nodes`, `--load-factor`, `--max-extra-moves` and `--target-balance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct StrategyFlags {
    /// Points per shard on the ring (weighted-ring-hash, bounded-load, Argo CD's
    /// consistent-hashing).
    #[arg(long, env = "SHARDWISE_VIRTUAL_NODES", default_value_t = StrategyConfig::DEFAULT_VIRTUAL_NODES, value_parser = clap::value_parser!(u32).range(1..=i64::from(StrategyConfig::MAX_VIRTUAL_NODES)))]
    pub virtual_nodes: u32,
    /// Bounded-load factor c: no shard takes a cluster past ceil(c x mean) unless none can.
    #[arg(long, env = "SHARDWISE_LOAD_FACTOR", default_value_t = StrategyConfig::DEFAULT_LOAD_FACTOR)]
    pub load_factor: Ratio,
    /// Moves sticky-balanced may spend on balance per pass.
    #[arg(long, env = "SHARDWISE_MAX_EXTRA_MOVES", default_value_t = StrategyConfig::DEFAULT_MAX_EXTRA_MOVES, value_parser = count)]
    pub max_extra_moves: u32,
    /// Max/mean load at or under which sticky-balanced stops moving clusters for balance.
    #[arg(long, env = "SHARDWISE_TARGET_BALANCE", default_value_t = StrategyConfig::DEFAULT_TARGET_BALANCE)]
    pub target_balance: Ratio,
}

impl StrategyFlags {
    /// The configuration of strategy `kind` with these settings.
    pub fn config(&self, kind: StrategyKind) -> StrategyConfig {
        StrategyConfig {
            kind,
            virtual_nodes: self.virtual_nodes,
            load_factor: self.load_factor,
            max_extra_moves: self.max_extra_moves,
            target_balance: self.target_balance,
        }
    }
}

/// A whole number of at least 0, with a message that says so (clap's own would call "-5" an
/// unexpected argument).
fn count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<i128>() {
        Ok(n) if n < 0 => Err(format!("must be 0 or more, got {n}")),
        Ok(n) => u32::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("must be a whole number, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    #[command(allow_negative_numbers = true)]
    struct Program {
        #[command(flatten)]
        strategy: StrategyFlags,
    }

    fn parse(args: &[&str]) -> Result<StrategyFlags, String> {
        Program::try_parse_from(std::iter::once("program").chain(args.iter().copied()))
            .map(|p| p.strategy)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_the_strategy_configs_and_flags_override_them() {
        let defaults = parse(&[]).unwrap();
        assert_eq!(
            defaults.config(StrategyKind::StickyBalanced),
            StrategyConfig::new(StrategyKind::StickyBalanced)
        );
        let set = parse(&[
            "--virtual-nodes=7",
            "--load-factor=1.5",
            "--max-extra-moves=3",
            "--target-balance=1.1",
        ])
        .unwrap();
        assert_eq!(set.virtual_nodes, 7);
        assert_eq!(set.load_factor, "1.5".parse().unwrap());
        assert_eq!(set.max_extra_moves, 3);
        assert_eq!(set.target_balance, "1.1".parse().unwrap());
    }

    #[test]
    fn out_of_range_values_are_refused_saying_why() {
        let too_many = parse(&["--virtual-nodes=10001"]).unwrap_err();
        assert!(too_many.contains("1..=10000"), "{too_many}");
        let none = parse(&["--virtual-nodes=0"]).unwrap_err();
        assert!(none.contains("1..=10000"), "{none}");
        // 0 is the smallest count taken: no move for balance at all.
        assert_eq!(parse(&["--max-extra-moves=0"]).unwrap().max_extra_moves, 0);
        let negative = parse(&["--max-extra-moves=-5"]).unwrap_err();
        assert!(negative.contains("must be 0 or more, got -5"), "{negative}");
        let word = parse(&["--max-extra-moves=many"]).unwrap_err();
        assert!(word.contains("must be a whole number"), "{word}");
    }
}
