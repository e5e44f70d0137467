//! What a plan gives each shard, as the planner's metrics report it.

/// What a plan gives one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardFigures {
    /// Units with at least one slice here.
    pub units: u64,
    /// Slices (a unit that is not cut is one).
    pub slices: u64,
    /// Items placed here.
    pub items: u64,
    /// Units cut across several shards with a slice here: each costs this shard a cache of
    /// the unit that another shard has too.
    pub shared: u64,
}
