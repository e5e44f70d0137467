//! `greedy-minimum`: largest cluster first, each onto the shard with the least load so far.
//!
//! This is Graham's LPT rule: the heaviest shard carries at most 4/3 of the optimal maximum
//! (minus a vanishing term), the best balance of the stateless strategies. Its weakness is
//! churn: any change early in the sequence changes most decisions after it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::engine::Plan;

pub(crate) fn place(plan: &mut Plan<'_>) {
    let mut order = plan.unplaced();
    plan.sort_largest_first(&mut order);
    let mut lightest: BinaryHeap<Reverse<(u64, usize)>> = plan
        .loads()
        .iter()
        .enumerate()
        .map(|(position, &load)| Reverse((load, position)))
        .collect();
    for index in order {
        let Some(Reverse((_, position))) = lightest.pop() else {
            return;
        };
        plan.place(index, position);
        lightest.push(Reverse((plan.loads()[position], position)));
    }
}
