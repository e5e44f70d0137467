//! `greedy-minimum`: largest cluster first, each onto the shard with the least load so far.
//!
//! This is Graham's LPT rule: the heaviest shard carries at most 4/3 of the optimal maximum
//! (minus a vanishing term), the best balance of the stateless strategies. Its weakness is
//! churn: any change early in the sequence changes most decisions after it.

use crate::engine::{LoadOrder, Plan};

pub(crate) fn place(plan: &mut Plan<'_>) {
    let mut order = plan.unplaced();
    plan.sort_largest_first(&mut order);
    let mut by_load = LoadOrder::of(plan);
    for index in order {
        let Some((_, position)) = by_load.lightest() else {
            return;
        };
        by_load.place(plan, index, position);
    }
}
