//! The handoff protocol on slices: one record per slice of a unit, and how the planner cuts
//! and merges them without two replicas ever working on the same item.
//!
//! Each slice has its own [`UnitRecord`] (owner label, holder, epoch, drain annotations) and
//! moves between shards exactly as a whole unit does ([`planner_action`], [`OwnerMachine`]).
//! A recut (a split or a merge) never moves anything. It happens inside one owner:
//!
//! ```text
//!  split of P (owner A1):  create P.low, P.high naming A1  ->  retire P  ->  A1 acks  ->  delete P
//!  merge into M:           move the parts to one owner     ->  create M naming it  ->  retire the parts
//!                          -> acks -> delete the parts
//! ```
//!
//! Only then may a new slice move, through the ordinary drain. The rules that make it safe:
//!
//! 1. **Overlap only within one owner.** Records overlap only while a recut is under way, and
//!    overlapping records whose holder is live name the same shard and holder: a record is
//!    created naming the one live holder of the records it overlaps (or nobody, when none is
//!    live), and a record that overlaps another is never placed elsewhere.
//! 2. **The deepest record decides.** An owner works on an item under the deepest record
//!    containing the item's key in its view ([`deepest`]). After a split the children take new
//!    work at once; after a merge the parts, retiring, hold new work back until they are deleted.
//! 3. **Retire before delete.** A record whose owner is live is deleted only after that owner
//!    acknowledged releasing it (no work in flight under it), exactly like a drain, so no work
//!    started under it outlives it. A record whose holder is not live is deleted at once: that
//!    incarnation fenced itself and never comes back.
//! 4. **Coverage.** A record is retired only when other records cover every key of it, so that
//!    every item always has a record (and, once assigned, an owner).
//!
//! Retiring is written as a drain request to the owner's own shard, which the owner handles as
//! any drain: stop new work, acknowledge when none is in flight.

use shard_assign::{KeyRange, ShardId};

use crate::drain::{Incarnation, PlannerAction, UnitRecord, planner_action};

#[cfg(doc)]
use crate::drain::OwnerMachine;

/// The record of one slice of a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceRecord {
    /// The keys of the slice.
    pub range: KeyRange,
    /// Its placement record.
    pub record: UnitRecord,
}

/// What the planner writes for the slices of one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceAction {
    /// Create the record of a new slice, naming `owner` (shard and holder) or nobody. When the
    /// slice should end on another shard than its owner's, `drain_to` asks for it at once: the
    /// record itself then says where the slice is going (a planner that takes over reads it
    /// back), and no new work starts under a slice that is about to move.
    Create {
        /// The keys of the new slice.
        range: KeyRange,
        /// The shard and holder the record names; `None` for nobody.
        owner: Option<(ShardId, Incarnation)>,
        /// The record's epoch, above that of every record it overlaps.
        epoch: u64,
        /// The shard the slice should end on, when it is not the owner's.
        drain_to: Option<ShardId>,
    },
    /// Ask the owner to stop work under this record (drain to its own shard).
    Retire {
        /// The keys of the record's slice.
        range: KeyRange,
    },
    /// Delete the record: released by its owner, or its holder is not live.
    Delete {
        /// The keys of the record's slice.
        range: KeyRange,
    },
    /// An ordinary placement step on the record.
    Place {
        /// The keys of the record's slice.
        range: KeyRange,
        /// The step.
        action: PlannerAction,
    },
}

impl SliceAction {
    /// The slice the action writes.
    pub fn range(&self) -> KeyRange {
        match *self {
            SliceAction::Create { range, .. }
            | SliceAction::Retire { range }
            | SliceAction::Delete { range }
            | SliceAction::Place { range, .. } => range,
        }
    }
}

impl UnitRecord {
    /// Whether the record is being retired by a recut (a drain to its own shard).
    pub fn retiring(&self) -> bool {
        self.owner.is_some() && self.drain_to == self.owner
    }
}

/// The deepest of `ranges` that contains `key`: the record an owner works on an item under.
pub fn deepest(ranges: impl IntoIterator<Item = KeyRange>, key: u64) -> Option<KeyRange> {
    ranges
        .into_iter()
        .filter(|r| r.contains(key))
        .max_by_key(|r| r.depth())
}

fn overlaps(a: KeyRange, b: KeyRange) -> bool {
    a.within(b) || b.within(a)
}

/// The planner's writes for one unit whose slices are `records` (any order) and should be
/// `desired`: a tiling of the key space, each slice with the shard it should end on.
/// `holder_of` gives the incarnation holding a shard's lease, `None` when it is not valid.
pub fn slice_actions(
    records: &[SliceRecord],
    desired: &[(KeyRange, ShardId)],
    holder_of: impl Fn(ShardId) -> Option<Incarnation>,
) -> Vec<SliceAction> {
    let live = |r: &UnitRecord| match (r.owner, r.holder) {
        (Some(owner), Some(holder)) => holder_of(owner) == Some(holder),
        _ => false,
    };
    let wanted = |range: KeyRange| desired.iter().find(|(d, _)| *d == range).map(|(_, s)| *s);
    let others = |me: KeyRange| records.iter().filter(move |r| r.range != me);
    // A live record on its way to another shard that nothing overlaps: its move will finish.
    // (One created by a split names its destination at once, but moves only once the record it
    // was cut from is gone.)
    let moving = |slice: &SliceRecord| {
        live(&slice.record)
            && slice
                .record
                .drain_to
                .is_some_and(|to| Some(to) != slice.record.owner)
            && others(slice.range).all(|r| !overlaps(r.range, slice.range))
    };
    let mut actions = Vec::new();
    // An ordinary placement step toward `shard`, when there is one.
    let place = |actions: &mut Vec<SliceAction>, slice: &SliceRecord, shard: ShardId| {
        let action = planner_action(&slice.record, shard, &holder_of);
        if action != PlannerAction::Keep {
            actions.push(SliceAction::Place {
                range: slice.range,
                action,
            });
        }
    };

    for slice in records {
        let record = &slice.record;
        let range = slice.range;
        if let Some(shard) = wanted(range) {
            // A current slice moves only once no recut overlaps it.
            if others(range).all(|r| !overlaps(r.range, range)) {
                place(&mut actions, slice, shard);
            }
            continue;
        }
        // A stale slice: finish a move in flight (one that no recut holds back), then retire
        // and delete it once covered.
        if moving(slice) {
            if let Some(to) = record.drain_to {
                place(&mut actions, slice, to);
            }
            continue;
        }
        // Covered by current slices, or by an ancestor this record folds into: one with the
        // same live holder, or any when this record's holder is not live. (Only ancestors, so
        // that two stale records never count on each other and go together.)
        let cover: Vec<KeyRange> = others(range)
            .filter(|r| {
                wanted(r.range).is_some()
                    || (range.within(r.range)
                        && (!live(record)
                            || (live(&r.record)
                                && r.record.owner == record.owner
                                && r.record.holder == record.holder)))
            })
            .map(|r| r.range)
            .collect();
        if !covers(&cover, range) {
            continue;
        }
        if !live(record) || record.released() {
            actions.push(SliceAction::Delete { range });
        } else if !record.retiring() {
            actions.push(SliceAction::Retire { range });
        }
    }

    for &(range, shard) in desired {
        if records.iter().any(|r| r.range == range) {
            continue;
        }
        let overlapping: Vec<&SliceRecord> = records
            .iter()
            .filter(|r| overlaps(r.range, range))
            .collect();
        let live_ones: Vec<&SliceRecord> = overlapping
            .iter()
            .copied()
            .filter(|r| live(&r.record))
            .collect();
        if live_ones.iter().any(|r| moving(r)) {
            // A move is under way: let it finish first. (A retiring record is no obstacle: the
            // new one names the same owner.)
            continue;
        }
        let mut holders: Vec<(ShardId, Incarnation)> = live_ones
            .iter()
            .filter_map(|r| Some((r.record.owner?, r.record.holder?)))
            .collect();
        holders.sort_unstable();
        holders.dedup();
        if holders.len() <= 1 {
            let epoch = overlapping
                .iter()
                .map(|r| r.record.epoch)
                .max()
                .unwrap_or(0)
                + 1;
            let owner = holders.first().copied();
            actions.push(SliceAction::Create {
                range,
                owner,
                epoch,
                drain_to: owner.map(|(s, _)| s).filter(|&s| s != shard).map(|_| shard),
            });
            continue;
        }
        // Parts on several owners: bring them together where the merged slice should go.
        for part in live_ones {
            let alone = records
                .iter()
                .filter(|r| r.range != part.range)
                .all(|r| !overlaps(r.range, part.range));
            if alone {
                place(&mut actions, part, shard);
            }
        }
    }
    actions
}

/// Whether the union of `parts` contains every key of `range`.
fn covers(parts: &[KeyRange], range: KeyRange) -> bool {
    let mut spans: Vec<(u64, u64)> = parts
        .iter()
        .filter(|p| overlaps(**p, range))
        .map(|p| (p.start().max(range.start()), p.last().min(range.last())))
        .collect();
    spans.sort_unstable();
    // The first key not covered yet (u128: the end of the key space is 2^64).
    let mut reached = u128::from(range.start());
    for (start, last) in spans {
        if u128::from(start) > reached {
            return false;
        }
        reached = reached.max(u128::from(last) + 1);
    }
    reached > u128::from(range.last())
}

#[cfg(test)]
mod tests;
