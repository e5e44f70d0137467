//! What the planner concludes from a fleet's objects and its replicas' load reports, for tools
//! that plan a fleet without being its planner (`shardwise plan --load measured`): the reports
//! of the shard leases merged as the planner merges them, the placement records of the slices
//! of cut units, and the weight the planner's measured model gives each unit on its first pass.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shard_assign::{Hysteresis, StrategyConfig};
use shardwise_handoff::plan::ObjectKey;

// What the functions below take and give, from the crates that define them.
pub use shard_assign::ShardSet;
pub use shardwise_handoff::plan::UnitView;
pub use shardwise_handoff::slices::SliceRecord;

use crate::load::MeasuredLoads;
pub use crate::membership::{LeaseLoads, shard_lease_selector};
use crate::planner::index::SliceEntry;
use crate::planner::measured::{AVERAGE_WEIGHT, MeasuredModel};
use crate::slice::UnitSlice;

/// The placement records of the slices of cut units, by the unit they belong to and its UID
/// (a unit made again under the same name is another); slices whose spec names no range are
/// left out, as the planner deletes them.
pub fn slice_records(slices: &[UnitSlice]) -> BTreeMap<(ObjectKey, String), Vec<SliceRecord>> {
    let mut records: BTreeMap<(ObjectKey, String), Vec<SliceRecord>> = BTreeMap::new();
    for slice in slices {
        let entry = SliceEntry::of(slice);
        if let Some(record) = entry.record {
            records
                .entry((entry.unit, entry.unit_uid))
                .or_default()
                .push(record);
        }
    }
    records
}

/// The planner's measured weights of a fleet on a first pass.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstPass {
    /// The weight of each unit, by UID: measured units by their cost per item, the others as
    /// an average item times their weight.
    pub weights: BTreeMap<String, u32>,
    /// The fleet's average busy seconds per second of one item; `None` while nothing is
    /// measured.
    pub busy_per_item: Option<f64>,
}

/// The weights the planner's measured model gives `units` (with `items`, their item counts) on
/// its first pass with `measured` over the `live` shards: the latest reports alone, since a
/// new model has nothing to smooth; its trigger, target and half-life only matter from a second
/// pass on.
pub fn first_pass(
    units: &[UnitView],
    items: &BTreeMap<ObjectKey, u64>,
    measured: &MeasuredLoads,
    live: &ShardSet,
) -> FirstPass {
    let mut model = MeasuredModel::new(
        Hysteresis::DEFAULT_TRIGGER,
        StrategyConfig::DEFAULT_TARGET_BALANCE,
        Duration::ZERO,
    );
    let pass = model.pass(units, items, measured, live, false, Instant::now());
    FirstPass {
        weights: pass.current,
        busy_per_item: pass.busy_per_load.map(|b| b * f64::from(AVERAGE_WEIGHT)),
    }
}
