//! `sticky-balanced`: keep clusters where they are, place what must be placed largest first onto
//! the lightest shards, then spend a small budget of extra moves on balance.
//!
//! The rule, in order:
//! 1. Pins to live shards are honoured (as in every strategy).
//! 2. A cluster whose previous shard is still live stays there.
//! 3. New clusters, and clusters whose shard left, are placed largest first (ties by id) onto
//!    the lightest shard (ties: lowest shard id), as `greedy-minimum` would.
//! 4. If the inputs changed since the previous assignment (a cluster came, left, changed load or
//!    had to move; the live shards changed; or the previous loads are unknown), improvement
//!    steps follow while the heaviest shard is above `target_balance × mean`. A step is a
//!    *move* (an unpinned cluster from the heaviest shard to the lightest one) or a *swap* (an
//!    unpinned cluster of the heaviest shard against a lighter unpinned cluster of another
//!    shard). A step costs one unit of the `max_extra_moves` budget per cluster in it that was
//!    staying home; re-placing a cluster that is new or had to leave its shard anyway costs
//!    nothing, as it adds no churn. Among the affordable steps, the one that leaves the lowest
//!    maximum load wins; ties go to the cheaper step, then (only into a shard being filled, see
//!    below) to the step that carries the loads less far past the mean, then to the lower sum of
//!    squared loads, then to fewer apps moved, then to cluster id order. A step must lower the
//!    maximum, or keep it and lower the sum of squares (two shards tied for heaviest). A cluster
//!    moves at most once per run, so the steps end.
//!
//!    A shard is *being filled* when it is more than `FILLING` times as far below the mean as
//!    the heaviest shard is above it: a shard that just joined, typically. The sum of squares
//!    alone would fill it with the largest clusters of the heaviest shards, dropping them below
//!    the mean, and later passes would spend moves refilling them from other old shards. Taking
//!    from the heaviest shard what brings it to the mean and no further fills the new shard
//!    with the old shards' excess alone. Near balance the sum of squares is the better guide,
//!    hence the threshold.
//! 5. When no step can lower the heaviest shard (one cluster on it outweighs everything a move
//!    could gain, or what it holds is pinned), the target is out of reach for that shard: it is
//!    set aside, and the steps go on among the other shards, judged against *their* mean. So
//!    when the target balance cannot be reached, the strategy minimizes the largest load first,
//!    then the next largest, and so on: one outsized cluster costs the balance of its own shard
//!    only, never that of the rest of the fleet.
//!
//! Without a previous assignment, steps 2 and 4 have nothing to work with and the result is
//! exactly `greedy-minimum`. Fed its own output with unchanged inputs, step 4 does not run and
//! nothing moves.

use crate::draft::Draft;
use crate::model::PreviousPlacement;
use crate::strategies::greedy_minimum;
use crate::strategy::StrategyConfig;

pub(crate) fn place(
    draft: &mut Draft<'_>,
    config: &StrategyConfig,
    previous: Option<&PreviousPlacement>,
) {
    let Some(previous) = previous else {
        greedy_minimum::place(draft);
        return;
    };
    let mut stayed = vec![false; draft.len()];
    for index in draft.unplaced() {
        if let Some(recorded) = previous.get(&draft.cluster(index).id)
            && let Some(position) = draft.position_of(recorded.shard)
        {
            draft.place(index, position);
            stayed[index] = true;
        }
    }
    let changed = inputs_changed(draft, previous);
    greedy_minimum::place(draft);
    if changed {
        improve(draft, config, &stayed);
    }
}

/// Whether anything differs from what `previous` recorded. Called after the clusters that stay
/// have been placed, so a cluster that is unplaced, or placed off its previous shard by a pin,
/// is a change.
fn inputs_changed(draft: &Draft<'_>, previous: &PreviousPlacement) -> bool {
    if previous.len() != draft.len() {
        return true;
    }
    if previous.live_shards().map(|s| s.as_slice()) != Some(draft.shard_ids()) {
        return true;
    }
    (0..draft.len()).any(|index| {
        let cluster = draft.cluster(index);
        match previous.get(&cluster.id) {
            None => true,
            Some(recorded) => {
                recorded.load != Some(cluster.load())
                    || draft.shard_of(index) != draft.position_of(recorded.shard)
            }
        }
    })
}

/// An improvement step and how good the state after it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Step {
    max_after: u64,
    cost: u32,
    /// How far the step takes the heaviest shard below the mean plus the receiving shard above
    /// it, in loads scaled by the number of shards in play; zero unless the receiving shard is
    /// being filled.
    past_mean: u128,
    squares_after: u128,
    apps: u64,
    /// The cluster leaving the heaviest shard.
    out: usize,
    /// The shard it goes to.
    to: usize,
    /// The cluster coming back in a swap.
    back: Option<usize>,
}

/// The three heaviest shards still in play, to know the maximum over the shards a step does not
/// touch.
#[derive(Debug)]
struct Heaviest {
    top: Vec<(u64, usize)>,
}

impl Heaviest {
    fn of(loads: &[u64], set_aside: &[bool]) -> Self {
        let mut top: Vec<(u64, usize)> = loads
            .iter()
            .copied()
            .zip(0..)
            .filter(|&(_, p)| !set_aside[p])
            .collect();
        top.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        top.truncate(3);
        Self { top }
    }

    fn first(&self) -> (u64, usize) {
        self.top.first().copied().unwrap_or((0, 0))
    }

    fn max_excluding(&self, a: usize, b: usize) -> u64 {
        self.top
            .iter()
            .find(|&&(_, p)| p != a && p != b)
            .map_or(0, |&(load, _)| load)
    }
}

/// A shard more than this many times as far below the mean as the heaviest shard is above it
/// is being filled (rule 4).
const FILLING: u128 = 3;

fn square(x: u64) -> u128 {
    u128::from(x) * u128::from(x)
}

fn improve(draft: &mut Draft<'_>, config: &StrategyConfig, stayed: &[bool]) {
    let shard_count = draft.shard_count();
    if shard_count < 2 {
        return;
    }
    let mut budget = config.max_extra_moves;
    let mut moved = vec![false; draft.len()];
    // Shards whose load no step can lower (rule 5).
    let mut set_aside = vec![false; shard_count];
    // Each round moves a cluster that never moved before or sets a shard aside, so this ends.
    for _ in 0..draft.len() + shard_count {
        let in_play = set_aside.iter().filter(|&&out| !out).count();
        if in_play < 2 {
            return;
        }
        let heaviest = Heaviest::of(draft.loads(), &set_aside);
        let (max, from) = heaviest.first();
        let total: u64 = (0..shard_count)
            .filter(|&p| !set_aside[p])
            .map(|p| draft.loads()[p])
            .sum();
        let scaled_max = max.saturating_mul(in_play as u64);
        if config.target_balance.bounds(scaled_max, total) {
            return;
        }
        let Some(step) = best_step(draft, &heaviest, &moved, stayed, &set_aside, budget) else {
            set_aside[from] = true;
            continue;
        };
        let from = draft.shard_of(step.out).unwrap_or(step.to);
        draft.place(step.out, step.to);
        moved[step.out] = true;
        if let Some(back) = step.back {
            draft.place(back, from);
            moved[back] = true;
        }
        budget -= step.cost;
    }
}

fn best_step(
    draft: &Draft<'_>,
    heaviest: &Heaviest,
    moved: &[bool],
    stayed: &[bool],
    set_aside: &[bool],
    budget: u32,
) -> Option<Step> {
    let loads = draft.loads();
    let (max, from) = heaviest.first();
    let squares: u128 = loads.iter().map(|&l| square(l)).sum();
    let movable = |index: usize| !draft.is_pinned(index) && !moved[index];
    // Moving a cluster that is new or must leave anyway adds no churn: it costs nothing.
    let cost = |index: usize| u32::from(stayed[index]);

    // Movable clusters of every shard, lightest first, for the swap search.
    let mut members: Vec<Vec<(u64, usize)>> = vec![Vec::new(); draft.shard_count()];
    for index in (0..draft.len()).filter(|&i| movable(i)) {
        if let Some(position) = draft.shard_of(index) {
            members[position].push((draft.cluster(index).load(), index));
        }
    }
    for list in &mut members {
        list.sort_unstable();
    }

    // Against the mean of the shards in play, scaled by their count to stay in integers.
    let in_play = set_aside.iter().filter(|&&out| !out).count() as u128;
    let total: u128 = (0..loads.len())
        .filter(|&p| !set_aside[p])
        .map(|p| u128::from(loads[p]))
        .sum();
    let excess = (u128::from(max) * in_play).saturating_sub(total);
    let past_mean = |to: usize, delta: u64| -> u128 {
        let deficit = total.saturating_sub(u128::from(loads[to]) * in_play);
        if deficit <= FILLING * excess {
            return 0;
        }
        let delta = u128::from(delta) * in_play;
        delta.saturating_sub(excess) + delta.saturating_sub(deficit)
    };
    let evaluate = |to: usize, delta: u64| -> (u64, u128) {
        let from_after = max - delta;
        let to_after = loads[to] + delta;
        let max_after = heaviest
            .max_excluding(from, to)
            .max(from_after)
            .max(to_after);
        let squares_after =
            squares - square(max) - square(loads[to]) + square(from_after) + square(to_after);
        (max_after, squares_after)
    };

    let lightest = (0..loads.len())
        .filter(|&p| p != from && !set_aside[p])
        .min_by_key(|&p| (loads[p], p))?;
    let mut best: Option<Step> = None;
    let mut consider = |step: Step| {
        let improves = (step.max_after, step.squares_after) < (max, squares);
        if improves && best.is_none_or(|b| step < b) {
            best = Some(step);
        }
    };
    for &(out_load, out) in &members[from] {
        if out_load == 0 {
            continue;
        }
        if cost(out) <= budget {
            let (max_after, squares_after) = evaluate(lightest, out_load);
            consider(Step {
                max_after,
                squares_after,
                past_mean: past_mean(lightest, out_load),
                cost: cost(out),
                apps: draft.cluster(out).apps,
                out,
                to: lightest,
                back: None,
            });
        }
        for (to, list) in members.iter().enumerate() {
            if to == from || set_aside[to] || loads[to] >= max {
                continue;
            }
            // The exchange `delta = out_load - back_load` is best near half the gap.
            let ideal = out_load.saturating_sub((max - loads[to]) / 2);
            let at = list.partition_point(|&(load, _)| load < ideal);
            for candidate in [at.checked_sub(1), Some(at)].into_iter().flatten() {
                let Some(&(back_load, back)) = list.get(candidate) else {
                    continue;
                };
                if back_load >= out_load || cost(out) + cost(back) > budget {
                    continue;
                }
                let (max_after, squares_after) = evaluate(to, out_load - back_load);
                consider(Step {
                    max_after,
                    squares_after,
                    past_mean: past_mean(to, out_load - back_load),
                    cost: cost(out) + cost(back),
                    apps: draft.cluster(out).apps + draft.cluster(back).apps,
                    out,
                    to,
                    back: Some(back),
                });
            }
        }
    }
    best
}
