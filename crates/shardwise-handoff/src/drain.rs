//! The handoff of a unit between shards, as two state machines: the planner's decision for a
//! unit, and the owner's life cycle of it.
//!
//! The record on the unit object is the only channel between them:
//!
//! ```text
//!  planner                         object (label, annotations)                 owner A
//!  desired B, owner A alive   -->  shard=A holder=A1 epoch=7 drain-to=B
//!                                                                  <--  sees drain-to: stops new work,
//!                                                                       waits for in-flight work,
//!                                  shard=A holder=A1 epoch=7 drain-to=B drained-epoch=7   (acknowledges)
//!  sees drained-epoch == epoch -->  shard=B holder=B1 epoch=8            A: no longer visible
//!                                                                       B: sees shard=B, starts
//! ```
//!
//! If A's lease has expired (A fenced itself before it could expire), the planner relabels at
//! once. Every relabel bumps the epoch, so an acknowledgement always refers to one assignment.
//!
//! The holder is the incarnation of the owner: the identity that held shard A's lease when the
//! planner assigned the unit. An owner works only on units stamped with its own
//! incarnation. Without it, a replica restarted as A (same shard, new process) could pick up a
//! unit that the planner, having just seen A's lease released, is giving to B at that moment.
//! A restarted replica gets its units back through a new assignment (new epoch) stamped with
//! its new incarnation.
//!
//! Safety: the label or holder changes away from (A, A1) only after A1 acknowledged (having
//! stopped), or after A's lease stopped being A1's: expired (A1 stopped `duration -
//! renew_deadline` earlier), released (A1 stops before it releases) or taken by another
//! incarnation (which could only take it expired or released). B1 starts only once the record
//! names (B, B1). Hence no instant at which two incarnations work on the unit.

use shard_assign::ShardId;
use twox_hash::XxHash3_64;

/// One incarnation of a replica: a 64-bit token of its lease holder identity. A replica that
/// restarts keeps its shard and gets a new incarnation. (The object records the identity
/// itself; the machines compare tokens, so that records stay small `Copy` values.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// The token of a lease holder identity. Stable across platforms and versions.
    pub fn of_identity(identity: &str) -> Self {
        Self(XxHash3_64::oneshot(identity.as_bytes()))
    }
}

/// An owner: the shard it serves and which incarnation of that shard it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerId {
    /// The shard the owner serves.
    pub shard: ShardId,
    /// The incarnation of the replica that serves it.
    pub incarnation: Incarnation,
}

/// Placement state of a unit as recorded on its object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnitRecord {
    /// The shard label; `None` when missing or not a valid ordinal.
    pub owner: Option<ShardId>,
    /// The incarnation of the owner the planner assigned the unit to.
    pub holder: Option<Incarnation>,
    /// The epoch annotation (0 when missing).
    pub epoch: u64,
    /// The shard the planner is moving the unit to.
    pub drain_to: Option<ShardId>,
    /// The epoch the owner acknowledged releasing.
    pub drained_epoch: Option<u64>,
}

impl UnitRecord {
    /// True when the owner acknowledged releasing the current assignment.
    pub fn released(&self) -> bool {
        self.owner.is_some() && self.drained_epoch == Some(self.epoch)
    }

    /// Whether the owner `me` may work on the unit under this record (unless draining).
    pub fn names(&self, me: OwnerId) -> bool {
        self.owner == Some(me.shard) && self.holder == Some(me.incarnation)
    }

    /// Where the unit is, or is going: the previous placement to give a sticky strategy.
    pub fn intended_shard(&self) -> Option<ShardId> {
        self.drain_to.or(self.owner)
    }
}

/// What the planner writes to a unit object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannerAction {
    /// Nothing to change.
    Keep,
    /// Set the owner label to `shard`, the holder to `holder` and the epoch to `epoch`; remove
    /// both drain annotations.
    Assign {
        /// The new owner.
        shard: ShardId,
        /// The incarnation holding the new owner's lease.
        holder: Incarnation,
        /// The new epoch, one more than the current.
        epoch: u64,
    },
    /// Ask the owner to release the unit, which will go to `to`.
    RequestDrain {
        /// The shard the unit will go to.
        to: ShardId,
    },
    /// Withdraw a drain request the owner has not acknowledged yet.
    CancelDrain,
}

/// The planner's decision for one unit: it should end on `desired`; `holder_of` gives the
/// incarnation holding a shard's lease, `None` when the lease is not valid.
pub fn planner_action(
    record: &UnitRecord,
    desired: ShardId,
    holder_of: impl Fn(ShardId) -> Option<Incarnation>,
) -> PlannerAction {
    let reassign = || match holder_of(desired) {
        Some(holder) => PlannerAction::Assign {
            shard: desired,
            holder,
            epoch: record.epoch + 1,
        },
        // Nobody could work on it there: leave it as it is until the shard is alive.
        None => PlannerAction::Keep,
    };
    let Some(owner) = record.owner else {
        // Never labelled (or garbage): no replica works on it, so it can be given at once.
        return reassign();
    };
    let current = holder_of(owner);
    if record.released() || current.is_none() || current != record.holder {
        // The assigned incarnation stopped: by acknowledgement, or by fencing before its lease
        // expired, or before it released its lease to a successor (or it was never stamped,
        // and then nobody works on the unit).
        return reassign();
    }
    if owner == desired {
        return if record.drain_to.is_some() {
            PlannerAction::CancelDrain
        } else {
            PlannerAction::Keep
        };
    }
    if record.drain_to == Some(desired) {
        PlannerAction::Keep
    } else {
        PlannerAction::RequestDrain { to: desired }
    }
}

/// Where an owner stands with one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// Reconciling the unit and its items.
    Active {
        /// The epoch of the assignment being served.
        epoch: u64,
    },
    /// Asked to release: no new work; acknowledge when in-flight work is done.
    Draining {
        /// The epoch being released.
        epoch: u64,
    },
    /// No work in flight and an acknowledgement sent (or being sent); waiting for the planner
    /// to relabel.
    Released {
        /// The epoch released.
        epoch: u64,
    },
}

impl OwnerState {
    fn epoch(self) -> u64 {
        match self {
            OwnerState::Active { epoch }
            | OwnerState::Draining { epoch }
            | OwnerState::Released { epoch } => epoch,
        }
    }
}

/// What the owner must do after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerEffect {
    /// Write `drained-epoch = epoch` on the unit object.
    WriteAck {
        /// The epoch released.
        epoch: u64,
    },
    /// The unit is no longer this shard's: drop its client and queued work.
    Forget,
}

/// One owner's view of one unit: the gate every reconcile of the unit (and of its items)
/// goes through, and the drain protocol.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerMachine {
    state: Option<OwnerState>,
    in_flight: u32,
    /// An acknowledgement has been requested and not confirmed written.
    ack_pending: bool,
}

impl OwnerMachine {
    /// A machine that has not seen the unit yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the owner stands with the unit; `None` when the unit is not its own (not seen
    /// yet, or forgotten).
    pub fn state(&self) -> Option<OwnerState> {
        self.state
    }

    /// Reconciles admitted by [`begin`](Self::begin) that have not ended yet.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Whether new work may start.
    pub fn may_start(&self) -> bool {
        matches!(self.state, Some(OwnerState::Active { .. }))
    }

    /// The owner `me` observed the unit object as `record` (or it vanished from its view:
    /// `None`, e.g. relabelled elsewhere or deleted). A record for another incarnation of the
    /// same shard is not `me`'s.
    pub fn observe(&mut self, me: OwnerId, record: Option<&UnitRecord>) -> Option<OwnerEffect> {
        let Some(record) = record.filter(|r| r.names(me)) else {
            let had = self.state.take().is_some();
            self.ack_pending = false;
            return had.then_some(OwnerEffect::Forget);
        };
        let epoch = record.epoch;
        let current = self.state.map(OwnerState::epoch);
        if current.is_some_and(|c| epoch < c) {
            // An older view than one already seen: ignore it.
            return None;
        }
        let same_epoch = current == Some(epoch);
        if same_epoch && matches!(self.state, Some(OwnerState::Released { .. })) {
            // Committed to releasing this epoch. If our acknowledgement is not on the object
            // (lost, or overwritten by a concurrent write), send it again.
            if record.released() {
                self.ack_pending = false;
                return None;
            }
            return self.request_ack(epoch);
        }
        if record.released() && self.in_flight == 0 {
            self.state = Some(OwnerState::Released { epoch });
            self.ack_pending = false;
            return None;
        }
        if record.released() || record.drain_to.is_some() {
            self.state = Some(OwnerState::Draining { epoch });
            return if self.in_flight == 0 {
                self.request_ack(epoch)
            } else {
                None
            };
        }
        self.state = Some(OwnerState::Active { epoch });
        None
    }

    /// Commits to releasing `epoch`. From here on this epoch never reopens, even if the drain is
    /// cancelled: the acknowledgement may land at any time, and the planner then gives the
    /// unit away. Only a later epoch (the planner's reassignment) makes the unit active.
    fn request_ack(&mut self, epoch: u64) -> Option<OwnerEffect> {
        self.state = Some(OwnerState::Released { epoch });
        if self.ack_pending {
            return None;
        }
        self.ack_pending = true;
        Some(OwnerEffect::WriteAck { epoch })
    }

    /// A reconcile wants to start. True (and counted) only while the unit is active.
    pub fn begin(&mut self) -> bool {
        if self.may_start() {
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// A reconcile that [`begin`](Self::begin) admitted has ended (finished or cancelled).
    pub fn end(&mut self) -> Option<OwnerEffect> {
        self.in_flight = self.in_flight.saturating_sub(1);
        match self.state {
            Some(OwnerState::Draining { epoch }) if self.in_flight == 0 => self.request_ack(epoch),
            _ => None,
        }
    }

    /// The acknowledgement of `epoch` was written.
    pub fn ack_written(&mut self, epoch: u64) {
        if self.state.is_some_and(|s| s.epoch() == epoch) {
            self.ack_pending = false;
        }
    }

    /// Writing the acknowledgement failed; the next observation or `end` retries it.
    pub fn ack_failed(&mut self) {
        self.ack_pending = false;
    }
}

#[cfg(test)]
pub(crate) mod tests;
