//! The `measured` load model, without I/O: from the busy time owners report to the weight the
//! planner places each unit with, and whether a pass may move units for balance.
//!
//! Strategies balance items × weight ([`shard_assign::Cluster::load`]); measured cost enters
//! through the weight, in thousandths of the fleet's average cost per item
//! ([`AVERAGE_WEIGHT`]):
//!
//! - a unit whose spec sets a weight keeps it as an override: `weight × 1000`, measurement
//!   ignored;
//! - a measured unit weighs `round(1000 × its smoothed busy per item / the fleet's average busy
//!   per item)`, at least 1. Its busy per item is the busy time of its measured records (the
//!   whole unit, or the slices of a cut one) over the items those records hold, smoothed by the
//!   planner with an exponentially weighted average (half-life `--load-smoothing`);
//! - a unit not measured yet (or with no item measured) weighs 1000: an average item.
//!
//! Memory enters the same weight. Owners report, beside busy time, the bytes they keep for
//! each record beyond its items (a controller's caches of what the unit manages). Once any
//! unit's memory is known, a measured unit weighs `1000 × ((1 − m) × busy ratio + m × memory
//! ratio)`: each ratio is the unit's cost per item over the fleet's average per item, and `m`
//! is `--load-memory-weight` (0.2 by default). That is a weighted p-norm with p = 1 (as in
//! argocd-autoscaler's default load index): summed over a shard it is the same mix of the
//! shard's busy time and memory, each relative to the fleet's, so balancing the weights
//! balances that mix. A unit whose memory is not reported counts as average memory per item.
//! Both ratios average 1 over the fleet's items, so the total load is still the fleet's busy
//! time in average items, and figures stay in busy seconds per second.
//!
//! Placement follows these weights only when moves are allowed ([`MeasuredModel::pass`]):
//! otherwise each unit keeps the weight it was last placed with, so that noise in the
//! measurements changes no strategy's inputs. A pass may move units for balance when it is a
//! periodic pass and the [`Hysteresis`] band allows it (the busiest live shard, under the
//! current weights, went above the trigger and is not yet back at the target), or while the
//! fleet converges after its live shards changed (until the target is reached).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shard_assign::{Balance, Hysteresis, Ratio, ShardId, ShardSet, SlicedAssignment};
use shardwise_handoff::plan::{ObjectKey, RecordKey, UnitView};

use crate::load::MeasuredLoads;

/// The weight of an item of average cost.
pub const AVERAGE_WEIGHT: u32 = 1000;

/// The weight of a unit whose cost is not measured: its spec's weight (or 1) average items.
pub(crate) fn unmeasured_weight(spec: Option<u32>) -> u32 {
    spec.unwrap_or(1).saturating_mul(AVERAGE_WEIGHT)
}

/// A unit's smoothed busy seconds per second per item (and bytes per item, when every measured
/// record of it reports memory), and when they were last updated.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Estimate {
    per_item: f64,
    bytes_per_item: Option<f64>,
    at: Instant,
}

/// What one pass places with, under the measured model.
#[derive(Clone, Debug, PartialEq)]
pub struct PassLoads {
    /// The weight to place each unit with, by UID.
    pub(crate) placing: BTreeMap<String, u32>,
    /// Each unit's weight under the latest smoothed measurements, by UID: what balance is
    /// judged and reported on.
    pub current: BTreeMap<String, u32>,
    /// Busy seconds per second that one unit of load (one item of weight 1) stands for: the
    /// fleet's average busy per item over [`AVERAGE_WEIGHT`]. `None` while nothing is measured.
    pub busy_per_load: Option<f64>,
    /// Whether this pass may move units for balance.
    pub(crate) moves_allowed: bool,
}

/// The measured model's state for one planner term: a new planner starts with nothing smoothed
/// and no rebalance under way.
#[derive(Clone, Debug)]
pub struct MeasuredModel {
    half_life: Duration,
    /// The share of memory in a unit's weight, in `0..=1`.
    memory_weight: f64,
    target: Ratio,
    band: Hysteresis,
    /// By unit UID: units whose spec sets no weight, once measured.
    estimates: BTreeMap<String, Estimate>,
    /// The weight each unit was last placed with, by UID, with the spec weight it had then.
    placing: BTreeMap<String, (u32, Option<u32>)>,
    /// The live shards of the last pass.
    live: Option<ShardSet>,
    /// The live shards changed: passes move units for balance until the target is reached.
    converging: bool,
    /// The placement of the latest plan, which the next pass's balance is judged on.
    placed: Option<SlicedAssignment>,
}

impl MeasuredModel {
    /// Voluntary moves start above `trigger × mean` and stop at `target × mean`; each unit's
    /// cost per item is smoothed with a half-life of `half_life`.
    pub fn new(trigger: Ratio, target: Ratio, half_life: Duration) -> Self {
        Self {
            half_life,
            memory_weight: crate::settings::LoadSettings::DEFAULT.memory_weight,
            target,
            band: Hysteresis::new(trigger, target),
            estimates: BTreeMap::new(),
            placing: BTreeMap::new(),
            live: None,
            converging: false,
            placed: None,
        }
    }

    /// Memory counts for `weight` (clamped to `0..=1`) of a measured unit's weight, busy time
    /// for the rest.
    pub(crate) fn with_memory_weight(mut self, weight: f64) -> Self {
        self.memory_weight = if weight.is_finite() {
            weight.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Whether a rebalance is under way (the planner then passes every converge interval).
    pub(crate) fn rebalancing(&self) -> bool {
        self.band.is_active() || self.converging
    }

    /// The placement the latest plan made: the next pass judges balance on it.
    pub(crate) fn placed(&mut self, assignment: SlicedAssignment) {
        self.placed = Some(assignment);
    }

    /// One pass: takes in the latest measurements of `units` (with `items`, their item counts)
    /// at `now`, and says what to place with. `periodic` passes may move units for balance
    /// (the others react to a change of the fleet, and move only what it forces).
    pub fn pass(
        &mut self,
        units: &[UnitView],
        items: &BTreeMap<ObjectKey, u64>,
        measured: &MeasuredLoads,
        live: &ShardSet,
        periodic: bool,
        now: Instant,
    ) -> PassLoads {
        self.observe(units, measured, now);
        let (current, busy_per_load) = self.current_weights(units, items);
        if self.live.as_ref().is_some_and(|before| before != live) {
            self.converging = true;
        }
        self.live = Some(live.clone());
        let mut moves_allowed = false;
        if periodic && let Some(placed) = &self.placed {
            let balance = balance(&shard_loads(placed, &current, live));
            let triggered = self.band.allows_moves(balance);
            if balance <= self.target.as_f64() {
                self.converging = false;
            }
            moves_allowed = triggered || self.converging;
        }
        let specs: BTreeMap<&str, Option<u32>> =
            units.iter().map(|u| (u.uid.as_str(), u.weight)).collect();
        self.placing.retain(|uid, _| current.contains_key(uid));
        for (uid, &weight) in &current {
            let spec = specs.get(uid.as_str()).copied().flatten();
            let entry = self.placing.entry(uid.clone()).or_insert((weight, spec));
            // A changed override is a change of the fleet, not of its measurements.
            if moves_allowed || entry.1 != spec || spec.is_some() {
                *entry = (weight, spec);
            }
        }
        PassLoads {
            placing: self
                .placing
                .iter()
                .map(|(uid, &(w, _))| (uid.clone(), w))
                .collect(),
            current,
            busy_per_load,
            moves_allowed,
        }
    }

    /// Smooths each unit's busy per item with what the owners report now. A unit with a spec
    /// weight, or no longer there, is forgotten; one without a measurement keeps its estimate.
    fn observe(&mut self, units: &[UnitView], measured: &MeasuredLoads, now: Instant) {
        let mut kept = BTreeSet::new();
        for unit in units.iter().filter(|u| u.weight.is_none()) {
            kept.insert(unit.uid.as_str());
            let (mut busy, mut items, mut bytes) = (0.0, 0u64, Some(0u64));
            for record in unit.records() {
                let key = RecordKey {
                    unit: unit.key.clone(),
                    range: record.range,
                };
                if let Some(m) = measured.get(&key) {
                    busy += m.load.busy;
                    items += m.load.items;
                    bytes = bytes.zip(m.load.bytes).map(|(a, b)| a.saturating_add(b));
                }
            }
            if items == 0 {
                continue;
            }
            let observed = busy / items as f64;
            let observed_bytes = bytes.map(|b| b as f64 / items as f64);
            let half_life = self.half_life.as_secs_f64();
            self.estimates
                .entry(unit.uid.clone())
                .and_modify(|e| {
                    let elapsed = now.saturating_duration_since(e.at).as_secs_f64();
                    let factor = shard_assign::smoothing_factor(elapsed, half_life);
                    e.per_item += factor * (observed - e.per_item);
                    e.bytes_per_item = match (e.bytes_per_item, observed_bytes) {
                        (Some(before), Some(now)) => Some(before + factor * (now - before)),
                        (_, observed) => observed,
                    };
                    e.at = now;
                })
                .or_insert(Estimate {
                    per_item: observed,
                    bytes_per_item: observed_bytes,
                    at: now,
                });
        }
        self.estimates.retain(|uid, _| kept.contains(uid.as_str()));
    }

    /// Each unit's weight under the current estimates, and the busy time a unit of load
    /// stands for.
    fn current_weights(
        &self,
        units: &[UnitView],
        items: &BTreeMap<ObjectKey, u64>,
    ) -> (BTreeMap<String, u32>, Option<f64>) {
        let (mut busy, mut counted, mut bytes, mut counted_bytes) = (0.0, 0u64, 0.0, 0u64);
        for unit in units {
            if let Some(e) = self.estimates.get(&unit.uid) {
                let n = items.get(&unit.key).copied().unwrap_or(0);
                busy += e.per_item * n as f64;
                counted += n;
                if let Some(per_item) = e.bytes_per_item {
                    bytes += per_item * n as f64;
                    counted_bytes += n;
                }
            }
        }
        // With nothing measured, or everything idle, there is no average to compare with.
        let average = (counted > 0 && busy > 0.0).then(|| busy / counted as f64);
        let average_bytes =
            (counted_bytes > 0 && bytes > 0.0).then(|| bytes / counted_bytes as f64);
        let memory = self.memory_weight;
        let weights = units
            .iter()
            .map(|unit| {
                let weight = match (unit.weight, self.estimates.get(&unit.uid)) {
                    (None, Some(e)) if average.is_some() || average_bytes.is_some() => {
                        let busy = average.map_or(1.0, |a| e.per_item / a);
                        let ratio = match average_bytes {
                            Some(a) => {
                                let bytes = e.bytes_per_item.map_or(1.0, |b| b / a);
                                (1.0 - memory) * busy + memory * bytes
                            }
                            None => busy,
                        };
                        (f64::from(AVERAGE_WEIGHT) * ratio)
                            .round()
                            .clamp(1.0, f64::from(u32::MAX)) as u32
                    }
                    (spec, _) => unmeasured_weight(spec),
                };
                (unit.uid.clone(), weight)
            })
            .collect();
        (weights, average.map(|a| a / f64::from(AVERAGE_WEIGHT)))
    }
}

/// What one cache copy of `copy_bytes` costs in the load units the strategies balance: the
/// copy as a share of an average item's reported bytes, times what an item weighs
/// (`item_weight`: 1 counting apps, [`AVERAGE_WEIGHT`] under the measured model), times
/// memory's share of that weight (`memory_weight`, `--load-memory-weight`): a copy is memory,
/// not work, under either model, as the simulator counts it. 0 while no owner reports bytes.
pub(crate) fn copy_cost(
    copy_bytes: u64,
    measured: &MeasuredLoads,
    item_weight: u32,
    memory_weight: f64,
) -> u64 {
    let (mut bytes, mut items) = (0u64, 0u64);
    for (_, m) in measured.iter() {
        if let Some(b) = m.load.bytes {
            bytes = bytes.saturating_add(b);
            items = items.saturating_add(m.load.items);
        }
    }
    if bytes == 0 || items == 0 {
        return 0;
    }
    let items_worth = copy_bytes as f64 * items as f64 / bytes as f64;
    (items_worth * f64::from(item_weight) * memory_weight).round() as u64
}

/// The load of each live shard in `assignment` with each unit (by UID) at `weights` (units
/// not in it at [`AVERAGE_WEIGHT`]); slices on shards that are not live are left out.
pub(crate) fn shard_loads(
    assignment: &SlicedAssignment,
    weights: &BTreeMap<String, u32>,
    live: &ShardSet,
) -> BTreeMap<ShardId, u64> {
    let mut loads: BTreeMap<ShardId, u64> = live.iter().map(|s| (s, 0)).collect();
    let placements = assignment.assignment.placements();
    for (uid, slices) in &assignment.units {
        let weight = u64::from(weights.get(uid).copied().unwrap_or(AVERAGE_WEIGHT));
        for (_, id) in slices {
            if let Some(p) = placements.get(id)
                && let Some(load) = loads.get_mut(&p.shard)
            {
                *load = load.saturating_add(p.apps.saturating_mul(weight));
            }
        }
    }
    loads
}

/// The busiest shard over the mean.
pub(crate) fn balance(loads: &BTreeMap<ShardId, u64>) -> f64 {
    Balance::of_loads(&loads.values().copied().collect::<Vec<_>>()).max_over_mean
}

/// What the metrics show of a plan's load.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LoadFigures {
    /// Each live shard's load, in the model's unit: busy seconds per second when measured.
    pub shards: BTreeMap<ShardId, f64>,
    /// The busiest live shard over the mean.
    pub balance: f64,
}

impl LoadFigures {
    /// Under the `apps` model: items × weight, as placed.
    pub fn of_apps(assignment: &SlicedAssignment, live: &ShardSet) -> Self {
        let loads: BTreeMap<ShardId, u64> = live
            .iter()
            .map(|s| {
                let load = assignment
                    .assignment
                    .shard_loads()
                    .get(&s)
                    .map_or(0, |l| l.load);
                (s, load)
            })
            .collect();
        Self::scaled(&loads, 1.0)
    }

    /// Under the `measured` model: the plan with the current weights, in busy seconds per
    /// second (in average items × weight while nothing is measured).
    pub fn of_measured(assignment: &SlicedAssignment, loads: &PassLoads, live: &ShardSet) -> Self {
        let scale = loads
            .busy_per_load
            .unwrap_or(1.0 / f64::from(AVERAGE_WEIGHT));
        Self::scaled(&shard_loads(assignment, &loads.current, live), scale)
    }

    fn scaled(loads: &BTreeMap<ShardId, u64>, scale: f64) -> Self {
        Self {
            shards: loads.iter().map(|(&s, &l)| (s, l as f64 * scale)).collect(),
            balance: balance(loads),
        }
    }
}

#[cfg(test)]
mod tests {
    use shard_assign::{
        Cluster, KeyRange, PreviousPlacement, StrategyConfig, StrategyKind, assign,
    };
    use shardwise_handoff::slices::SliceRecord;

    use super::super::index::fixtures::unit;
    use super::*;
    use crate::load::{LoadReport, RecordLoad};

    const MINUTE: Duration = Duration::from_secs(60);

    fn view(name: &str, spec: Option<u32>) -> UnitView {
        let mut view = unit(name, Some(0)).view;
        view.weight = spec;
        view
    }

    fn whole(name: &str) -> RecordKey {
        RecordKey::whole(ObjectKey::new("fleet", name))
    }

    /// What the owners report: (record, busy, items).
    fn measured(records: &[(RecordKey, f64, u64)], now: Instant) -> MeasuredLoads {
        let with_bytes: Vec<_> = records
            .iter()
            .map(|(k, busy, items)| (k.clone(), *busy, *items, None))
            .collect();
        measured_with_bytes(&with_bytes, now)
    }

    /// What the owners report: (record, busy, items, bytes).
    fn measured_with_bytes(
        records: &[(RecordKey, f64, u64, Option<u64>)],
        now: Instant,
    ) -> MeasuredLoads {
        let report = LoadReport {
            records: records
                .iter()
                .map(|(k, busy, items, bytes)| {
                    let load = RecordLoad {
                        bytes: *bytes,
                        ..RecordLoad::new(*busy, *items)
                    };
                    (k.clone(), load)
                })
                .collect(),
            omitted: 0,
        };
        let mut loads = MeasuredLoads::default();
        loads.apply(0, jiff::Timestamp::UNIX_EPOCH, &report, now);
        loads
    }

    fn counts(units: &[(&str, u64)]) -> BTreeMap<ObjectKey, u64> {
        units
            .iter()
            .map(|&(name, n)| (ObjectKey::new("fleet", name), n))
            .collect()
    }

    fn model() -> MeasuredModel {
        MeasuredModel::new(
            Hysteresis::DEFAULT_TRIGGER,
            StrategyConfig::DEFAULT_TARGET_BALANCE,
            15 * MINUTE,
        )
    }

    #[test]
    fn memory_shares_the_weight_once_known_and_the_total_stays_the_fleets_busy_time() {
        let now = Instant::now();
        let units = [view("slow", None), view("fast", None), view("old", None)];
        let items = counts(&[("slow", 100), ("fast", 100), ("old", 100)]);
        let pass = |loads: &MeasuredLoads, memory: f64| {
            model().with_memory_weight(memory).pass(
                &units,
                &items,
                loads,
                &ShardSet::contiguous(2),
                false,
                now,
            )
        };
        // Busy per item 0.05, 0.005 and 0.005 (average 0.02); the same bytes per item, except
        // that "old" reports none (a replica of a version before memory was measured).
        let even = measured_with_bytes(
            &[
                (whole("slow"), 5.0, 100, Some(1_000_000)),
                (whole("fast"), 0.5, 100, Some(1_000_000)),
                (whole("old"), 0.5, 100, None),
            ],
            now,
        );
        let weights = pass(&even, 0.2).current;
        // 0.8 × 2.5 + 0.2 × 1 and 0.8 × 0.25 + 0.2 × 1: memory, even, dilutes the busy ratio.
        assert_eq!(weights["uid-slow"], 2200);
        assert_eq!(weights["uid-fast"], 400);
        assert_eq!(weights["uid-old"], 400, "unknown memory counts as average");
        let total: u32 = weights.values().sum();
        assert_eq!(total, 3 * AVERAGE_WEIGHT, "the mix keeps the fleet's total");
        assert_eq!(pass(&even, 0.0).current["uid-slow"], 2500);
        // Equal busy time, one unit's objects four times as big as the other's.
        let skewed = measured_with_bytes(
            &[
                (whole("slow"), 1.0, 100, Some(4_000_000)),
                (whole("fast"), 1.0, 100, Some(1_000_000)),
            ],
            now,
        );
        let weights = pass(&skewed, 0.2).current;
        // Average bytes per item 25,000: ratios 1.6 and 0.4.
        assert_eq!(weights["uid-slow"], 1120);
        assert_eq!(weights["uid-fast"], 880);
        assert_eq!(pass(&skewed, 1.0).current["uid-slow"], 1600);
        // Nobody reports memory: busy time alone, whatever the weight.
        let none = measured(&[(whole("slow"), 5.0, 100), (whole("fast"), 0.5, 100)], now);
        assert_eq!(pass(&none, 0.2).current["uid-slow"], 1818);
    }

    #[test]
    fn a_copy_costs_its_bytes_in_average_items() {
        let now = Instant::now();
        // 300 items reported with 3,000,000 bytes: 10,000 per item; one record without bytes.
        let loads = measured_with_bytes(
            &[
                (whole("a"), 1.0, 100, Some(1_000_000)),
                (whole("b"), 1.0, 200, Some(2_000_000)),
                (whole("c"), 1.0, 50, None),
            ],
            now,
        );
        // 250,000 bytes: 25 items, at memory's share of an item's weight: counting apps,
        // 25 × 0.2; measured, 25 × 1000 × 0.2.
        assert_eq!(copy_cost(250_000, &loads, 1, 0.2), 5);
        assert_eq!(copy_cost(250_000, &loads, 1, 1.0), 25);
        assert_eq!(copy_cost(250_000, &loads, AVERAGE_WEIGHT, 0.2), 5000);
        assert_eq!(copy_cost(250_000, &loads, AVERAGE_WEIGHT, 0.0), 0);
        assert_eq!(copy_cost(0, &loads, 1, 0.2), 0);
        // Nothing reports memory: copies cost nothing.
        let none = measured(&[(whole("a"), 1.0, 100)], now);
        assert_eq!(copy_cost(250_000, &none, 1, 0.2), 0);
    }

    #[test]
    fn weights_compare_each_unit_with_the_average_item_and_spec_weights_override() {
        let now = Instant::now();
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        // "cut" is cut in two slices: its cost per item is their busy time over their items.
        let mut cut = view("cut", None);
        cut.cut = true;
        cut.slices = [low, high]
            .map(|range| SliceRecord {
                range,
                record: cut.record,
            })
            .to_vec();
        let units = [
            view("cheap", None),
            view("dear", None),
            cut,
            view("new", None),
            view("pinned-cost", Some(3)),
        ];
        let slice = |range| RecordKey {
            unit: ObjectKey::new("fleet", "cut"),
            range,
        };
        let loads = measured(
            &[
                (whole("cheap"), 1.0, 100),
                (whole("dear"), 3.0, 100),
                (slice(low), 1.5, 50),
                (slice(high), 0.5, 50),
                // Measured, but its spec's weight stands.
                (whole("pinned-cost"), 100.0, 10),
            ],
            now,
        );
        let items = counts(&[
            ("cheap", 100),
            ("dear", 100),
            ("cut", 100),
            ("new", 40),
            ("pinned-cost", 10),
        ]);
        let mut model = model();
        let pass = model.pass(&units, &items, &loads, &ShardSet::contiguous(2), false, now);
        // Busy per item: 0.01, 0.03 and 0.02; the average over the 300 measured items: 0.02.
        let weight = |name: &str| pass.current[&format!("uid-{name}")];
        assert_eq!(weight("cheap"), 500);
        assert_eq!(weight("dear"), 1500);
        assert_eq!(weight("cut"), 1000);
        assert_eq!(
            weight("new"),
            AVERAGE_WEIGHT,
            "not measured: an average item"
        );
        assert_eq!(weight("pinned-cost"), 3 * AVERAGE_WEIGHT);
        let busy = pass.busy_per_load.unwrap();
        assert!((busy - 0.02 / 1000.0).abs() < 1e-15, "{busy}");
        assert_eq!(
            pass.placing, pass.current,
            "a new planner places as measured"
        );
        assert!(!pass.moves_allowed);

        // Nothing measured, or everything idle: every unit at its spec's weight (or 1) × 1000.
        let idle = measured(&[(whole("cheap"), 0.0, 100)], now);
        let pass = MeasuredModel::new(Ratio::ONE, Ratio::ONE, MINUTE).pass(
            &units,
            &items,
            &idle,
            &ShardSet::contiguous(2),
            false,
            now,
        );
        assert_eq!(pass.busy_per_load, None);
        assert_eq!(pass.current[&"uid-dear".to_string()], 1000);
        assert_eq!(pass.current[&"uid-pinned-cost".to_string()], 3000);
    }

    #[test]
    fn each_unit_cost_is_smoothed_over_passes() {
        let t0 = Instant::now();
        let units = [view("a", None), view("b", None)];
        let items = counts(&[("a", 10), ("b", 10)]);
        let live = ShardSet::contiguous(1);
        let mut model = model();
        let at = |a: f64| measured(&[(whole("a"), a, 10), (whole("b"), 1.0, 10)], t0);
        let pass = model.pass(&units, &items, &at(1.0), &live, false, t0);
        assert_eq!(pass.current["uid-a"], 1000);
        // a triples; one half-life later its estimate is halfway: 0.2 per item against b's 0.1.
        let pass = model.pass(&units, &items, &at(3.0), &live, false, t0 + 15 * MINUTE);
        assert_eq!(pass.current["uid-a"], 1333);
        assert_eq!(pass.current["uid-b"], 667);
        // A pass with no new time passed changes nothing.
        let again = model.pass(&units, &items, &at(3.0), &live, false, t0 + 15 * MINUTE);
        assert_eq!(again.current, pass.current);
        // Not a periodic pass: the placement keeps the weights it started with.
        assert_eq!(pass.placing["uid-a"], 1000);
    }

    /// Units a0, a1 on shard 0 and b0, b1 on shard 1, 10 items each, placed by sticky-balanced.
    fn placed(model: &mut MeasuredModel) -> (Vec<UnitView>, BTreeMap<ObjectKey, u64>) {
        let names = ["a0", "a1", "b0", "b1"];
        let units: Vec<UnitView> = names.iter().map(|n| view(n, None)).collect();
        let clusters: Vec<Cluster> = names
            .iter()
            .map(|n| Cluster::new(format!("uid-{n}"), 10))
            .collect();
        let shards = ShardSet::contiguous(2);
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let previous: PreviousPlacement = names
            .iter()
            .map(|n| (format!("uid-{n}"), u32::from(n.starts_with('b'))))
            .collect();
        let assignment = assign(&config, &clusters, &shards, Some(&previous)).unwrap();
        assert_eq!(assignment.shard_of("uid-a1"), Some(0));
        model.placed(SlicedAssignment::uncut(assignment));
        (units, counts(&names.map(|n| (n, 10))))
    }

    #[test]
    fn moves_wait_for_the_trigger_and_go_on_until_the_target() {
        let t0 = Instant::now();
        let mut model = MeasuredModel::new(
            Hysteresis::DEFAULT_TRIGGER,
            StrategyConfig::DEFAULT_TARGET_BALANCE,
            Duration::ZERO,
        );
        let (units, items) = placed(&mut model);
        let live = ShardSet::contiguous(2);
        // Shard 0's units cost `a` per item, shard 1's 0.1.
        let with = |a: f64| {
            let mut records: Vec<(RecordKey, f64, u64)> =
                ["a0", "a1"].map(|n| (whole(n), a * 10.0, 10)).to_vec();
            records.extend(["b0", "b1"].map(|n| (whole(n), 1.0, 10)));
            measured(&records, t0)
        };
        let pass = |model: &mut MeasuredModel, a: f64, periodic: bool| {
            let loads = model.pass(&units, &items, &with(a), &live, periodic, t0);
            (loads.moves_allowed, loads.placing["uid-a0"])
        };
        // 0.108 against 0.1: 1.038, inside the band; nothing moves, weights stay.
        assert_eq!(pass(&mut model, 0.1, true), (false, 1000));
        assert_eq!(pass(&mut model, 0.108, true), (false, 1000));
        // 0.125: 1.111, above the trigger. An event pass does not move for balance...
        assert_eq!(pass(&mut model, 0.125, false), (false, 1000));
        // ...a periodic one does, and places with the current weights.
        assert_eq!(pass(&mut model, 0.125, true), (true, 1111));
        // Still above the target (the placement has not changed): moves go on.
        assert_eq!(pass(&mut model, 0.108, true), (true, 1038));
        assert!(model.rebalancing());
        // At the target: they stop, and stay stopped inside the band, with the weights of
        // the last pass that moved.
        assert!(!pass(&mut model, 0.106, true).0);
        assert_eq!(pass(&mut model, 0.109, true), (false, 1038));
        assert!(!model.rebalancing());
    }

    #[test]
    fn a_change_of_the_live_shards_converges_to_the_target_without_the_trigger() {
        let t0 = Instant::now();
        // A trigger so high that only the change of shards can allow moves.
        let trigger = Ratio::from_thousandths(2000);
        let mut model =
            MeasuredModel::new(trigger, StrategyConfig::DEFAULT_TARGET_BALANCE, 15 * MINUTE);
        let (units, items) = placed(&mut model);
        let loads = measured(&[], t0);
        let mut pass = |live: u32, periodic: bool| {
            let live = ShardSet::contiguous(live);
            model
                .pass(&units, &items, &loads, &live, periodic, t0)
                .moves_allowed
        };
        assert!(!pass(2, true));
        // A third shard, empty: 1.5 under the current placement, below the trigger. The pass
        // reacting to it moves what the change forces; periodic passes go on converging.
        assert!(!pass(3, false));
        assert!(pass(3, true));
        assert!(pass(3, true));
        // Down to one shard: balanced at once, nothing more to converge to.
        assert!(!pass(1, false));
        assert!(!pass(1, true));
        assert!(!model.rebalancing());
    }

    #[test]
    fn figures_are_in_busy_seconds_per_second_under_the_current_weights() {
        let t0 = Instant::now();
        let mut model = model();
        let (units, items) = placed(&mut model);
        let records: Vec<(RecordKey, f64, u64)> = [("a0", 3.0), ("a1", 1.0), ("b0", 1.0)]
            .map(|(n, busy)| (whole(n), busy, 10))
            .to_vec();
        let live = ShardSet::contiguous(2);
        let loads = model.pass(&units, &items, &measured(&records, t0), &live, false, t0);
        let assignment = model.placed.clone().unwrap();
        let shard_a = assignment.assignment.shard_of("uid-a0").unwrap();
        let figures = LoadFigures::of_measured(&assignment, &loads, &live);
        // Shard a: 4 busy seconds per second; shard b: b0's 1 and b1, unmeasured, an
        // average unit of the measured ones (5/3).
        let a = figures.shards[&shard_a];
        let b = figures.shards[&(1 - shard_a)];
        assert!(
            (a - 4.0).abs() < 1e-3 && (b - (1.0 + 5.0 / 3.0)).abs() < 1e-3,
            "{figures:?}"
        );
        assert!((figures.balance - a / ((a + b) / 2.0)).abs() < 1e-3);
        let apps = LoadFigures::of_apps(&assignment, &live);
        assert_eq!(apps.shards[&shard_a], 20.0);
        assert_eq!(apps.balance, 1.0);
    }
}
