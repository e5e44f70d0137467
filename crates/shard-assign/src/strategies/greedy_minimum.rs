//! `greedy-minimum`: largest cluster first, each onto the shard with the least load so far.
//!
//! This is Graham's LPT rule: the heaviest shard carries at most 4/3 of the optimal maximum
//! (minus a vanishing term), the best balance of the stateless strategies. Its weakness is
//! churn: any change early in the sequence changes most decisions after it.

use crate::draft::{Draft, LoadOrder};

pub(crate) fn place(draft: &mut Draft<'_>) {
    let mut order = draft.unplaced();
    draft.sort_largest_first(&mut order);
    let mut by_load = LoadOrder::of(draft);
    for index in order {
        let Some((_, position)) = by_load.lightest() else {
            return;
        };
        by_load.place(draft, index, position);
    }
}
