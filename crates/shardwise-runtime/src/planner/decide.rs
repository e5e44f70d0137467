//! What one planning pass writes, decided without I/O: from the index, the membership and the
//! planner's memory to the writes of records (on units, or on the UnitSlices of cut units) and
//! items, and the figures the metrics report.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use shard_assign::{Balance, KeyRange, ShardId, SliceSwitch, StrategyConfig, app_key, count_in};
use shardwise_handoff::drain::PlannerAction;
use shardwise_handoff::keys::{
    DRAIN_TO_ANNOTATION, DRAINED_ANNOTATION, EPOCH_ANNOTATION, HOLDER_ANNOTATION, SHARD_LABEL,
    SLICE_SHARDS_ANNOTATION, SLICES_LABEL, STATEFULSET_LABEL, UNIT_LABEL,
};
use shardwise_handoff::plan::{
    Membership, ObjectKey, Plan, PlanError, PlanMemory, RecordKey, plan,
};
use shardwise_handoff::slices::SliceAction;

use super::figures::ShardFigures;
use super::index::{Index, Shown};
use super::measured::unmeasured_weight;
use crate::slice::{UnitSlice, UnitSliceSpec, slice_name};

/// What the planner remembers for this pass.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PassMemory<'a> {
    /// The first pass of a planner that just took over: it plans as if it had made the current
    /// placement itself, so that a failover moves nothing.
    Takeover,
    /// The previous pass's memory: a pass with nothing changed moves nothing.
    Remembered(&'a PlanMemory),
    /// A periodic pass forgets, so that `sticky-balanced` may spend its move budget again
    /// while the fleet is above its target balance.
    Forgotten,
}

/// How the planner places: the strategy, whether it cuts units, and where the UnitSlices of
/// cut units live (the StatefulSet's namespace, labelled with its name).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlacementRules<'a> {
    pub strategy: &'a StrategyConfig,
    pub slicing: SliceSwitch,
    pub namespace: &'a str,
    pub statefulset: &'a str,
    /// The weight to place each unit with, by UID, when the load model sets them
    /// ([`super::measured`]); `None`: the spec's weight (items × weight).
    pub weights: Option<&'a BTreeMap<String, u32>>,
    /// What one cache copy (a unit on one shard more) costs, in the load units placed
    /// ([`super::measured::copy_cost`]): a cut must lower the busiest shard by more.
    pub copy_cost: u64,
}

/// One request to the control plane.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ControlPlaneWrite {
    /// A JSON merge patch of a unit.
    Unit {
        key: ObjectKey,
        patch: Value,
    },
    CreateSlice(Box<UnitSlice>),
    /// A JSON merge patch of a UnitSlice.
    PatchSlice {
        key: ObjectKey,
        patch: Value,
    },
    /// Deletes a UnitSlice, if it is still at this version.
    DeleteSlice {
        key: ObjectKey,
        resource_version: Option<String>,
    },
}

/// A write of a record: the whole unit's, or one slice's.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RecordWrite {
    pub record: RecordKey,
    pub action: SliceAction,
    pub write: ControlPlaneWrite,
    /// The shard the record named before this write, if any.
    pub owner_before: Option<ShardId>,
    /// The items under the record (whose keys it holds): those a move of it moves.
    pub items: u64,
}

impl RecordWrite {
    /// The ordinary placement step it makes, if it is one.
    pub fn placement(&self) -> Option<PlannerAction> {
        match self.action {
            SliceAction::Place { action, .. } => Some(action),
            _ => None,
        }
    }

    /// Whether it gives the record to another shard than the one it named: a first placement,
    /// or the same shard under a restarted process, is no move.
    pub fn moves(&self) -> bool {
        matches!(
            self.placement(),
            Some(PlannerAction::Assign { shard, .. })
                if self.owner_before.is_some_and(|before| before != shard)
        )
    }
}

/// The labels of an item: its unit's token, and a shard only for an item of a unit that does
/// not exist.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ItemWrite {
    pub key: ObjectKey,
    /// The object it is for: the server refuses the patch if the item was made again since.
    pub uid: String,
    pub token: String,
    pub shard: Option<ShardId>,
}

impl ItemWrite {
    /// The merge patch that writes them, on that object only.
    pub fn patch(&self) -> Value {
        let mut patch = item_patch(self.shard, &self.token);
        if !self.uid.is_empty() {
            patch["metadata"]["uid"] = Value::String(self.uid.clone());
        }
        patch
    }
}

/// The figures of a plan, for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Figures {
    /// Max over mean items per live shard.
    pub balance: f64,
    pub shards: BTreeMap<ShardId, ShardFigures>,
    /// Caches of units beyond one per unit, over the fleet.
    pub cache_copies: u64,
    /// Units cut into slices.
    pub cut_units: u64,
    /// Whether the plan is above the strategy's target balance (the planner then re-plans on
    /// the shorter converge interval).
    pub above_target: bool,
}

/// Everything a pass writes and reports.
#[derive(Clone, Debug)]
pub(crate) struct Decision {
    pub plan: Plan,
    /// Writes of records, in the order they must be made.
    pub record_writes: Vec<RecordWrite>,
    /// Writes of no record, made after those: what cut units show people, stray UnitSlices.
    pub other_writes: Vec<ControlPlaneWrite>,
    pub item_writes: Vec<ItemWrite>,
    pub figures: Figures,
}

/// The patch of a placement step; `None` for [`PlannerAction::Keep`]. `membership` is the one
/// the action was decided on: it names the identity behind an assignment's holder.
pub(crate) fn unit_patch(
    action: PlannerAction,
    membership: &Membership,
    resource_version: Option<&str>,
) -> Option<Value> {
    let metadata = match action {
        PlannerAction::Keep => return None,
        PlannerAction::Assign { shard, epoch, .. } => json!({
            "labels": {SHARD_LABEL: shard.to_string()},
            "annotations": {
                HOLDER_ANNOTATION: membership.identity(shard),
                EPOCH_ANNOTATION: epoch.to_string(),
                DRAIN_TO_ANNOTATION: null,
                DRAINED_ANNOTATION: null,
            },
        }),
        PlannerAction::RequestDrain { to } => {
            json!({"annotations": {DRAIN_TO_ANNOTATION: to.to_string()}})
        }
        PlannerAction::CancelDrain => json!({"annotations": {DRAIN_TO_ANNOTATION: null}}),
    };
    Some(conditioned(metadata, resource_version))
}

/// `{"metadata": metadata}`, conditioned on `resource_version`: a write based on a stale view
/// fails with 409.
fn conditioned(mut metadata: Value, resource_version: Option<&str>) -> Value {
    if let (Some(object), Some(version)) = (metadata.as_object_mut(), resource_version) {
        object.insert("resourceVersion".into(), Value::String(version.to_string()));
    }
    json!({ "metadata": metadata })
}

/// The patch of an item's labels: its unit's token, and its shard (removed when `None`).
pub(crate) fn item_patch(shard: Option<ShardId>, unit_token: &str) -> Value {
    // null removes the label.
    let shard = shard.map(|s| s.to_string());
    json!({"metadata": {"labels": {SHARD_LABEL: shard, UNIT_LABEL: unit_token}}})
}

/// What a cut unit shows of `layout`: its number of slices and their shards.
fn shown(layout: &[(KeyRange, ShardId)]) -> Shown {
    let shards: BTreeSet<ShardId> = layout.iter().map(|&(_, s)| s).collect();
    let shards: Vec<String> = shards.iter().map(ShardId::to_string).collect();
    Shown {
        slices: Some(layout.len().to_string()),
        shards: Some(shards.join(",")),
    }
}

/// The request that makes `action` on the record of `record`.
fn record_write(
    rules: &PlacementRules<'_>,
    index: &Index,
    membership: &Membership,
    record: &RecordKey,
    action: SliceAction,
    layout: &[(KeyRange, ShardId)],
) -> Option<ControlPlaneWrite> {
    let unit = index.unit(&record.unit)?;
    let identity = |shard: Option<ShardId>| shard.and_then(|s| membership.identity(s));
    if record.range == KeyRange::WHOLE {
        let key = record.unit.clone();
        let version = unit.resource_version.as_deref();
        let metadata = match action {
            SliceAction::Place { action, .. } => {
                return unit_patch(action, membership, version)
                    .map(|patch| ControlPlaneWrite::Unit { key, patch });
            }
            SliceAction::Create {
                owner,
                epoch,
                drain_to,
                ..
            } => json!({
                "labels": {
                    SHARD_LABEL: owner.map(|(s, _)| s.to_string()),
                    SLICES_LABEL: null,
                },
                "annotations": {
                    HOLDER_ANNOTATION: identity(owner.map(|(s, _)| s)),
                    EPOCH_ANNOTATION: epoch.to_string(),
                    DRAIN_TO_ANNOTATION: drain_to.map(|s| s.to_string()),
                    DRAINED_ANNOTATION: null,
                    SLICE_SHARDS_ANNOTATION: null,
                },
            }),
            SliceAction::Retire { .. } => {
                let owner = unit.view.record.owner?;
                json!({"annotations": {DRAIN_TO_ANNOTATION: owner.to_string()}})
            }
            SliceAction::Delete { .. } => {
                let show = shown(layout);
                json!({
                    "labels": {SHARD_LABEL: null, SLICES_LABEL: show.slices},
                    "annotations": {
                        HOLDER_ANNOTATION: null,
                        DRAIN_TO_ANNOTATION: null,
                        DRAINED_ANNOTATION: null,
                        SLICE_SHARDS_ANNOTATION: show.shards,
                    },
                })
            }
        };
        return Some(ControlPlaneWrite::Unit {
            key,
            patch: conditioned(metadata, version),
        });
    }
    let existing = index.slice(&record.unit, record.range);
    let version = existing.and_then(|s| s.resource_version.as_deref());
    let key = ObjectKey::new(
        rules.namespace,
        slice_name(rules.statefulset, &record.unit, record.range),
    );
    match action {
        SliceAction::Create {
            owner,
            epoch,
            drain_to,
            range,
        } => {
            let mut slice = UnitSlice::new(
                &key.name,
                UnitSliceSpec::new(&record.unit, &unit.view.uid, range),
            );
            slice.metadata.namespace = Some(key.namespace);
            let mut labels =
                BTreeMap::from([(STATEFULSET_LABEL.to_string(), rules.statefulset.to_string())]);
            let mut annotations =
                BTreeMap::from([(EPOCH_ANNOTATION.to_string(), epoch.to_string())]);
            if let Some((shard, _)) = owner {
                labels.insert(SHARD_LABEL.to_string(), shard.to_string());
                if let Some(identity) = identity(Some(shard)) {
                    annotations.insert(HOLDER_ANNOTATION.to_string(), identity.to_string());
                }
            }
            if let Some(to) = drain_to {
                annotations.insert(DRAIN_TO_ANNOTATION.to_string(), to.to_string());
            }
            slice.metadata.labels = Some(labels);
            slice.metadata.annotations = Some(annotations);
            Some(ControlPlaneWrite::CreateSlice(Box::new(slice)))
        }
        SliceAction::Place { action, .. } => unit_patch(action, membership, version)
            .map(|patch| ControlPlaneWrite::PatchSlice { key, patch }),
        SliceAction::Retire { .. } => {
            let owner = existing?.record?.record.owner?;
            Some(ControlPlaneWrite::PatchSlice {
                key,
                patch: conditioned(
                    json!({"annotations": {DRAIN_TO_ANNOTATION: owner.to_string()}}),
                    version,
                ),
            })
        }
        SliceAction::Delete { .. } => Some(ControlPlaneWrite::DeleteSlice {
            key: existing.map_or(key, |s| s.key.clone()),
            resource_version: version.map(str::to_string),
        }),
    }
}

/// Decides one pass.
pub(crate) fn decide(
    rules: &PlacementRules<'_>,
    index: &Index,
    membership: &Membership,
    recall: PassMemory<'_>,
) -> Result<Decision, PlanError> {
    let (mut units, items) = index.views();
    if let Some(weights) = rules.weights {
        for unit in &mut units {
            let weight = weights.get(&unit.uid).copied();
            unit.weight = Some(weight.unwrap_or_else(|| unmeasured_weight(unit.weight)));
        }
    }
    let takeover;
    let memory = match recall {
        PassMemory::Takeover => {
            takeover = PlanMemory::of_current(&units, &items, membership);
            Some(&takeover)
        }
        PassMemory::Remembered(memory) => Some(memory),
        PassMemory::Forgotten => None,
    };
    let slicing = if index.can_cut() {
        rules
            .slicing
            .config_for(rules.strategy.kind)
            .with_copy_cost(rules.copy_cost)
    } else {
        shard_assign::SliceConfig::disabled()
    };
    let plan = plan(rules.strategy, &slicing, &units, &items, membership, memory)?;
    // The sorted keys of each unit's items: how many a record holds.
    let mut keys: BTreeMap<&ObjectKey, Vec<u64>> = BTreeMap::new();
    for item in &items {
        keys.entry(&item.unit).or_default().push(app_key(&item.uid));
    }
    for unit_keys in keys.values_mut() {
        unit_keys.sort_unstable();
    }
    let no_layout = Vec::new();
    let mut record_writes = Vec::new();
    let mut written_units = BTreeSet::new();
    for (unit_key, action) in &plan.unit_actions {
        let record = RecordKey {
            unit: unit_key.clone(),
            range: action.range(),
        };
        let layout = plan.layouts.get(unit_key).unwrap_or(&no_layout);
        if let Some(write) = record_write(rules, index, membership, &record, *action, layout) {
            if record.range == KeyRange::WHOLE {
                written_units.insert(unit_key.clone());
            }
            let owner_before = if record.range == KeyRange::WHOLE {
                index.unit(unit_key).and_then(|u| u.view.record.owner)
            } else {
                index
                    .slice(unit_key, record.range)
                    .and_then(|s| s.record)
                    .and_then(|r| r.record.owner)
            };
            let items = keys.get(unit_key).map_or(0, |k| count_in(k, record.range));
            record_writes.push(RecordWrite {
                record,
                action: *action,
                write,
                owner_before,
                items,
            });
        }
    }
    let mut other_writes = Vec::new();
    // Cut units show their slices; a unit whose whole record is written this pass shows them
    // with that write (a second write would fail on the version).
    for (unit_key, layout) in &plan.layouts {
        let Some(unit) = index.unit(unit_key) else {
            continue;
        };
        if !unit.view.cut || written_units.contains(unit_key) {
            continue;
        }
        let show = shown(layout);
        if unit.shown != show {
            let metadata = json!({
                "labels": {SLICES_LABEL: show.slices},
                "annotations": {SLICE_SHARDS_ANNOTATION: show.shards},
            });
            other_writes.push(ControlPlaneWrite::Unit {
                key: unit_key.clone(),
                patch: conditioned(metadata, unit.resource_version.as_deref()),
            });
        }
    }
    for stray in index.stray_slices() {
        other_writes.push(ControlPlaneWrite::DeleteSlice {
            key: stray.key.clone(),
            resource_version: stray.resource_version.clone(),
        });
    }
    let item_writes = plan
        .item_labels
        .iter()
        .map(|label| ItemWrite {
            key: label.item.clone(),
            uid: label.uid.clone(),
            token: label.unit_token.clone(),
            shard: label.shard,
        })
        .collect();
    let figures = figures(rules.strategy, &plan);
    Ok(Decision {
        plan,
        record_writes,
        other_writes,
        item_writes,
        figures,
    })
}

fn figures(strategy: &StrategyConfig, plan: &Plan) -> Figures {
    let sliced = &plan.assignment;
    let shard_loads = sliced.assignment.shard_loads();
    let item_counts: Vec<u64> = shard_loads.values().map(|l| l.apps).collect();
    let loads: Vec<u64> = shard_loads.values().map(|l| l.load).collect();
    let total: u64 = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    let mut shards: BTreeMap<ShardId, ShardFigures> = shard_loads
        .iter()
        .map(|(&shard, load)| {
            let figures = ShardFigures {
                slices: load.clusters,
                items: load.apps,
                ..ShardFigures::default()
            };
            (shard, figures)
        })
        .collect();
    for unit_key in sliced.units.keys() {
        let on = sliced.shards_of(unit_key);
        let shared = u64::from(on.len() > 1);
        for shard in on {
            let figures = shards.entry(shard).or_default();
            figures.units += 1;
            figures.shared += shared;
        }
    }
    Figures {
        balance: Balance::of_loads(&item_counts).max_over_mean,
        shards,
        cache_copies: sliced.cache_copies() as u64,
        cut_units: sliced.slicing.cut().count() as u64,
        above_target: strategy.kind.uses_previous()
            && !strategy
                .target_balance
                .bounds(max.saturating_mul(loads.len() as u64), total),
    }
}

#[cfg(test)]
mod tests {
    use shard_assign::StrategyKind;

    use std::time::{Duration, Instant};

    use shard_assign::Hysteresis;
    use shardwise_handoff::keys::unit_token;
    use shardwise_handoff::plan::ItemView;

    use super::super::index::SliceEntry;
    use super::super::index::fixtures::{identity, item, members, unit};
    use super::super::measured::{LoadFigures, MeasuredModel};
    use super::*;
    use crate::load::{LoadReport, MeasuredLoads, RecordLoad};

    /// An index of `units` (name, owner, items), each item labelled with its unit's token.
    fn index(units: &[(&str, Option<ShardId>, usize)]) -> Index {
        let mut index = Index::default();
        for &(name, owner, items) in units {
            index.apply_unit(unit(name, owner));
            for i in 0..items {
                index.apply_view(item(&format!("{name}-{i}"), name, None));
            }
        }
        index
    }

    /// [`index`], its items as they are created: no label.
    fn fresh_index(units: &[(&str, Option<ShardId>, usize)]) -> Index {
        let mut index = Index::default();
        for &(name, owner, items) in units {
            index.apply_unit(unit(name, owner));
            for i in 0..items {
                index.apply_view(ItemView {
                    unit_token: None,
                    ..item(&format!("{name}-{i}"), name, None)
                });
            }
        }
        index
    }

    fn sticky() -> StrategyConfig {
        StrategyConfig::new(StrategyKind::StickyBalanced)
    }

    fn rules(strategy: &StrategyConfig) -> PlacementRules<'_> {
        PlacementRules {
            strategy,
            slicing: SliceSwitch::Auto,
            namespace: "fleet",
            statefulset: "shardwise",
            weights: None,
            copy_cost: 0,
        }
    }

    #[test]
    fn a_new_fleet_is_assigned_with_stamps_and_versions_and_items_get_their_token() {
        let index = fresh_index(&[("a", None, 2), ("b", None, 1)]);
        let decision = decide(
            &rules(&sticky()),
            &index,
            &members(2, &[0, 1]),
            PassMemory::Forgotten,
        )
        .unwrap();
        assert_eq!(decision.record_writes.len(), 2);
        for write in &decision.record_writes {
            let Some(PlannerAction::Assign { shard, .. }) = write.placement() else {
                panic!("{write:?}");
            };
            let ControlPlaneWrite::Unit { key, patch } = &write.write else {
                panic!("{write:?}");
            };
            assert_eq!(key, &write.record.unit);
            let metadata = &patch["metadata"];
            assert_eq!(metadata["labels"][SHARD_LABEL], shard.to_string());
            assert_eq!(metadata["annotations"][HOLDER_ANNOTATION], identity(shard));
            assert_eq!(metadata["resourceVersion"], format!("rv-{}", key.name));
        }
        assert_eq!(decision.item_writes.len(), 3);
        for write in &decision.item_writes {
            let unit = &write.key.name[..1];
            let token = unit_token("fleet", unit);
            let patch = write.patch();
            let labels = &patch["metadata"]["labels"];
            assert_eq!(labels, &item_patch(None, &token)["metadata"]["labels"]);
            assert_eq!(patch["metadata"]["uid"], format!("uid-{}", write.key.name));
            assert_eq!(labels[UNIT_LABEL], token);
            // No shard: the unit's owner finds it by its token.
            assert_eq!(labels[SHARD_LABEL], Value::Null);
        }
        assert_eq!(decision.figures.shards.len(), 2);
        let counted: u64 = decision.figures.shards.values().map(|f| f.items).sum();
        assert_eq!(counted, 3);
    }

    #[test]
    fn a_kind_sharded_by_its_own_objects_places_each_as_one_and_labels_no_item() {
        let mut index = Index::of_own_objects();
        for name in ["a", "b", "c", "d"] {
            index.apply_unit(unit(name, None));
        }
        // One being deleted is placed no more, and stands for no item.
        index.apply_unit(crate::planner::UnitEntry {
            deleting: true,
            ..unit("gone", None)
        });
        let decision = decide(
            &rules(&sticky()),
            &index,
            &members(2, &[0, 1]),
            PassMemory::Forgotten,
        )
        .unwrap();
        assert_eq!(decision.record_writes.len(), 4);
        assert!(
            decision.item_writes.is_empty(),
            "{:?}",
            decision.item_writes
        );
        // Each object weighs one: two on each shard.
        let items: Vec<u64> = decision.figures.shards.values().map(|f| f.items).collect();
        assert_eq!(items, [2, 2]);

        // A relist mirrors the units it finds, and only those.
        index.relist_units();
        for name in ["a", "b"] {
            index.relisted_unit(unit(name, Some(0)));
        }
        index.relisted_units();
        let counts = index.item_counts();
        let counted: Vec<&str> = counts.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(counted, ["a", "b"]);
        assert!(counts.values().all(|&n| n == 1));
        index.delete_unit(&ObjectKey::new("fleet", "a"));
        assert_eq!(index.item_counts().len(), 1);
    }

    #[test]
    fn only_a_change_of_owner_is_a_move() {
        // A first placement moves nothing.
        let fresh = fresh_index(&[("a", None, 2), ("b", None, 1)]);
        let decision = decide(
            &rules(&sticky()),
            &fresh,
            &members(2, &[0, 1]),
            PassMemory::Forgotten,
        )
        .unwrap();
        assert_eq!(decision.record_writes.len(), 2);
        assert!(decision.record_writes.iter().all(|w| !w.moves()));

        // Shard 1 died: its unit and item go to shard 0, which is a move of each.
        let settled = index(&[("a", Some(0), 1), ("b", Some(1), 1)]);
        let decision = decide(
            &rules(&sticky()),
            &settled,
            &members(2, &[0]),
            PassMemory::Forgotten,
        )
        .unwrap();
        let moved: Vec<&str> = decision
            .record_writes
            .iter()
            .filter(|w| w.moves())
            .map(|w| w.record.unit.name.as_str())
            .collect();
        assert_eq!(moved, ["b"], "{:?}", decision.record_writes);
        // Its one item moves with it, and nothing of the item is written.
        let moved_items: u64 = decision
            .record_writes
            .iter()
            .filter(|w| w.moves())
            .map(|w| w.items)
            .sum();
        assert_eq!(moved_items, 1);
        assert!(
            decision.item_writes.is_empty(),
            "{:?}",
            decision.item_writes
        );

        // Shard 1 restarted: its unit is assigned to it again under the new process, no move.
        let mut restarted = members(2, &[0, 1]);
        restarted.alive.insert(1, "shardwise-1_second".into());
        let decision = decide(
            &rules(&sticky()),
            &settled,
            &restarted,
            PassMemory::Forgotten,
        )
        .unwrap();
        assert!(
            decision
                .record_writes
                .iter()
                .any(|w| w.record.unit.name == "b"
                    && matches!(w.placement(), Some(PlannerAction::Assign { shard: 1, .. }))),
            "{:?}",
            decision.record_writes
        );
        assert!(decision.record_writes.iter().all(|w| !w.moves()));
    }

    #[test]
    fn a_planner_that_takes_over_a_settled_fleet_writes_nothing() {
        let index = index(&[("a", Some(0), 10), ("b", Some(1), 1), ("c", Some(1), 1)]);
        let membership = members(2, &[0, 1]);
        // Settled without slices ("a" is too big for a shard and would be cut otherwise).
        let strategy = sticky();
        let uncut = PlacementRules {
            slicing: SliceSwitch::Off,
            ..rules(&strategy)
        };
        let decision = decide(&uncut, &index, &membership, PassMemory::Takeover).unwrap();
        assert!(
            decision.record_writes.is_empty(),
            "{:?}",
            decision.record_writes
        );
        assert!(decision.item_writes.is_empty());
        // Its memory, given back with nothing changed, still moves nothing.
        let again = decide(
            &uncut,
            &index,
            &membership,
            PassMemory::Remembered(&decision.plan.memory),
        )
        .unwrap();
        assert!(again.record_writes.is_empty());
    }

    #[test]
    fn a_unit_on_a_shard_that_went_away_is_drained_first_and_its_items_wait() {
        let index = index(&[("a", Some(0), 1), ("b", Some(1), 1)]);
        // Shard 1 is scaled away but its lease is still held: its unit is drained, not moved.
        let decision = decide(
            &rules(&sticky()),
            &index,
            &members(1, &[0, 1]),
            PassMemory::Forgotten,
        )
        .unwrap();
        let drain = decision
            .record_writes
            .iter()
            .find(|w| w.record.unit.name == "b")
            .expect("b is written");
        assert_eq!(
            drain.placement(),
            Some(PlannerAction::RequestDrain { to: 0 })
        );
        let ControlPlaneWrite::Unit { patch, .. } = &drain.write else {
            panic!("{drain:?}");
        };
        assert_eq!(patch["metadata"]["annotations"][DRAIN_TO_ANNOTATION], "0");
        assert!(
            decision.item_writes.iter().all(|w| w.key.name != "b-0"),
            "the item moves only once its unit has: {:?}",
            decision.item_writes
        );
    }

    #[test]
    fn a_fleet_above_its_target_balance_says_so() {
        // One heavy unit per shard and a third shard with nothing: sticky-balanced keeps its
        // placement within the move budget of this pass and reports being above target.
        let index = index(&[("a", Some(0), 50), ("b", Some(1), 50)]);
        let memory = PlanMemory::default();
        let decision = decide(
            &rules(&sticky()),
            &index,
            &members(3, &[0, 1, 2]),
            PassMemory::Remembered(&memory),
        )
        .unwrap();
        assert!(decision.figures.above_target, "{:?}", decision.figures);
        assert!(decision.figures.balance > 1.4);
    }

    /// What owners report: each named unit's busy seconds per second, over all its items.
    fn reports(busy: &[(&str, f64, u64)]) -> MeasuredLoads {
        let records = busy
            .iter()
            .map(|&(name, busy, items)| {
                let key = RecordKey::whole(ObjectKey::new("fleet", name));
                (key, RecordLoad::new(busy, items))
            })
            .collect();
        let report = LoadReport {
            records,
            omitted: 0,
        };
        let mut loads = MeasuredLoads::default();
        loads.apply(0, jiff::Timestamp::UNIX_EPOCH, &report, Instant::now());
        loads
    }

    fn moved(decision: &Decision) -> Vec<(String, ShardId)> {
        decision
            .record_writes
            .iter()
            .filter_map(|w| match w.placement() {
                Some(
                    PlannerAction::Assign { shard: to, .. } | PlannerAction::RequestDrain { to },
                ) => Some((w.record.unit.name.clone(), to)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn measured_load_moves_units_counted_load_does_not_see() {
        // Balanced by items: two units of 10 items on each shard; but shard 0's cost 3x more.
        let index = index(&[
            ("a0", Some(0), 10),
            ("a1", Some(0), 10),
            ("b0", Some(1), 10),
            ("b1", Some(1), 10),
        ]);
        let membership = members(2, &[0, 1]);
        let live = membership.live();
        let measured = reports(&[
            ("a0", 3.0, 10),
            ("a1", 3.0, 10),
            ("b0", 1.0, 10),
            ("b1", 1.0, 10),
        ]);
        let strategy = sticky();
        let mut model = MeasuredModel::new(
            Hysteresis::DEFAULT_TRIGGER,
            strategy.target_balance,
            Duration::from_secs(900),
        );
        let now = Instant::now();
        let pass = |model: &mut MeasuredModel, memory: Option<&PlanMemory>, periodic| {
            let loads = model.pass(
                &index.unit_views(),
                &index.item_counts(),
                &measured,
                &live,
                periodic,
                now,
            );
            let rules = PlacementRules {
                weights: Some(&loads.placing),
                ..rules(&strategy)
            };
            let recall = super::super::recall(memory, periodic, Some(&loads));
            let decision = decide(&rules, &index, &membership, recall).unwrap();
            model.placed(decision.plan.assignment.clone());
            (decision, loads)
        };

        // A planner that takes over moves nothing, however unbalanced the measurements.
        let (takeover, loads) = pass(&mut model, None, false);
        assert!(moved(&takeover).is_empty(), "{:?}", moved(&takeover));
        assert_eq!(loads.placing["uid-a0"], 1500);
        let live_figures = LoadFigures::of_measured(&takeover.plan.assignment, &loads, &live);
        assert!(
            (live_figures.balance - 1.5).abs() < 1e-9,
            "{live_figures:?}"
        );
        assert!((live_figures.shards[&0] - 6.0).abs() < 1e-9);
        // Nor does a pass that reacts to nothing.
        let (held, _) = pass(&mut model, Some(&takeover.plan.memory), false);
        assert!(moved(&held).is_empty());

        // The periodic pass: 1.5 is above the trigger; one a-unit swaps with a b-unit (each
        // first drained by its owner).
        let (rebalanced, loads) = pass(&mut model, Some(&held.plan.memory), true);
        assert!(loads.moves_allowed);
        let moves = moved(&rebalanced);
        assert_eq!(moves.len(), 2, "{moves:?}");
        assert!(
            moves
                .iter()
                .any(|(name, shard)| name.starts_with('a') && *shard == 1)
        );
        let after = LoadFigures::of_measured(&rebalanced.plan.assignment, &loads, &live);
        assert!((after.balance - 1.0).abs() < 1e-9, "{after:?}");

        // Counted by items, the same fleet is balanced: a periodic pass moves nothing.
        let counted = decide(
            &rules(&strategy),
            &index,
            &membership,
            super::super::recall(Some(&held.plan.memory), true, None),
        )
        .unwrap();
        assert!(moved(&counted).is_empty());
    }

    #[test]
    fn a_unit_costly_per_item_is_cut_by_its_measured_load_and_folds_back_when_it_is_cheap() {
        // Three units of 12 items on three shards: by count each is exactly a shard's share,
        // and nothing is cut.
        let mut index = Index::default();
        index.set_expected(Some(3));
        for (n, (name, owner)) in [("slow", 0), ("a", 1), ("b", 2)].into_iter().enumerate() {
            index.apply_unit(unit(name, Some(owner)));
            for i in 0..12 {
                let mut view = item(&format!("{name}-{i}"), name, None);
                view.uid = spread_uid(i + 100 * n as u64);
                index.apply_view(view);
            }
        }
        let membership = members(3, &[0, 1, 2]);
        let live = membership.live();
        let strategy = sticky();
        // Plans with "a" and "b" measured at 1 busy second per second each, and "slow" at
        // `slow_busy`, split over the records it has (its slices, once cut) by their items.
        let measured = |index: &Index, slow_busy: f64| {
            let units = index.unit_views();
            let slow = units.iter().find(|u| u.key.name == "slow").unwrap();
            let ranges: Vec<KeyRange> = slow.records().iter().map(|r| r.range).collect();
            let mut records: BTreeMap<RecordKey, RecordLoad> = ["a", "b"]
                .into_iter()
                .map(|name| {
                    let key = RecordKey::whole(ObjectKey::new("fleet", name));
                    (key, RecordLoad::new(1.0, 12))
                })
                .collect();
            let keys: Vec<u64> = (0..12)
                .map(|i| shard_assign::app_key(&spread_uid(i)))
                .collect();
            for range in ranges {
                let items = keys.iter().filter(|&&k| range.contains(k)).count() as u64;
                let key = RecordKey {
                    unit: ObjectKey::new("fleet", "slow"),
                    range,
                };
                let busy = slow_busy * items as f64 / 12.0;
                records.insert(key, RecordLoad::new(busy, items));
            }
            let mut reports = MeasuredLoads::default();
            let report = LoadReport {
                records,
                omitted: 0,
            };
            reports.apply(0, jiff::Timestamp::UNIX_EPOCH, &report, Instant::now());
            let mut model = MeasuredModel::new(
                Hysteresis::DEFAULT_TRIGGER,
                strategy.target_balance,
                Duration::ZERO,
            );
            let loads = model.pass(
                &units,
                &index.item_counts(),
                &reports,
                &live,
                true,
                Instant::now(),
            );
            let rules = PlacementRules {
                weights: Some(&loads.placing),
                ..rules(&strategy)
            };
            decide(&rules, index, &membership, PassMemory::Forgotten).unwrap()
        };
        let slices =
            |decision: &Decision| decision.plan.layouts[&ObjectKey::new("fleet", "slow")].len();
        let counted = decide(
            &rules(&strategy),
            &index,
            &membership,
            PassMemory::Forgotten,
        )
        .unwrap();
        assert_eq!((counted.figures.cut_units, slices(&counted)), (0, 1));
        // At the others' cost per item nothing is heavier than a share: nothing is cut.
        assert_eq!(slices(&measured(&index, 1.0)), 1);
        // "slow" costs 6x per item what the others cost: 3/4 of the fleet's load, more than a
        // shard's share, so it is cut and spread.
        let costly = measured(&index, 6.0);
        assert_eq!(costly.figures.cut_units, 1);
        assert!(slices(&costly) >= 2, "{:?}", costly.plan.layouts);

        // The cut is made: its UnitSlices exist, the unit's own record is gone, and the owners
        // measure each slice.
        for write in &costly.record_writes {
            if let ControlPlaneWrite::CreateSlice(_) = write.write {
                index.apply_slice(landed(&write.write));
            }
        }
        let mut cut = unit("slow", None);
        cut.view.cut = true;
        index.apply_unit(cut);
        // Still costly: it stays cut. At half the others' cost per item (a fifth of the fleet,
        // under 3/4 of a share) it folds back into one.
        assert!(slices(&measured(&index, 6.0)) >= 2);
        let cheap = measured(&index, 0.5);
        assert_eq!(slices(&cheap), 1, "{:?}", cheap.plan.layouts);
    }

    #[test]
    fn no_live_shard_is_an_error_not_a_plan() {
        let index = index(&[("a", None, 1)]);
        let result = decide(
            &rules(&sticky()),
            &index,
            &members(2, &[]),
            PassMemory::Forgotten,
        );
        assert!(matches!(result, Err(PlanError::NoLiveShards)));
    }

    /// A UUID-like UID whose key spreads like a real one (sequential names do not).
    fn spread_uid(i: u64) -> String {
        let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            x >> 32,
            x & 0xffff,
            i & 0xfff,
            (x >> 20) & 0xfff,
            x & 0xffff_ffff_ffff
        )
    }

    /// The UnitSlice a create made, as the planner's watch would see it.
    fn landed(write: &ControlPlaneWrite) -> SliceEntry {
        let ControlPlaneWrite::CreateSlice(slice) = write else {
            panic!("not a create: {write:?}");
        };
        let mut slice = (**slice).clone();
        slice.metadata.resource_version = Some("1".into());
        SliceEntry::of(&slice)
    }

    #[test]
    fn a_hot_unit_is_cut_through_unit_slices_and_its_whole_record_retired_then_deleted() {
        let mut index = Index::default();
        index.set_expected(Some(3));
        for (name, owner, items) in [("hot", 0, 40), ("a", 1, 5), ("b", 2, 5)] {
            index.apply_unit(unit(name, Some(owner)));
            for i in 0..items {
                let mut view = item(&format!("{name}-{i}"), name, None);
                view.uid = spread_uid(i as u64 + 1000 * owner as u64);
                index.apply_view(view);
            }
        }
        let strategy = sticky();
        let rules = rules(&strategy);
        let membership = members(3, &[0, 1, 2]);
        let first = decide(&rules, &index, &membership, PassMemory::Forgotten).unwrap();
        let creates: Vec<&RecordWrite> = first
            .record_writes
            .iter()
            .filter(|w| w.record.unit.name == "hot")
            .collect();
        assert!(creates.len() >= 2, "{creates:?}");
        for write in &creates {
            let ControlPlaneWrite::CreateSlice(slice) = &write.write else {
                panic!("a cut starts with creates only: {write:?}");
            };
            let labels = slice.metadata.labels.clone().unwrap();
            let annotations = slice.metadata.annotations.clone().unwrap();
            assert_eq!(
                labels[SHARD_LABEL], "0",
                "created on the owner of the whole"
            );
            assert_eq!(labels[STATEFULSET_LABEL], "shardwise");
            assert_eq!(annotations[HOLDER_ANNOTATION], identity(0));
            assert_eq!(annotations[EPOCH_ANNOTATION], "2");
            assert_eq!(slice.metadata.namespace.as_deref(), Some("fleet"));
            assert_eq!(slice.spec.unit.uid, "uid-hot");
            assert_eq!(slice.spec.key_range(), Some(write.record.range));
            assert_eq!(
                slice.metadata.name.as_deref(),
                Some(slice_name("shardwise", &write.record.unit, write.record.range).as_str())
            );
        }
        assert!(
            creates.iter().any(|w| matches!(
                w.action,
                SliceAction::Create { drain_to: Some(to), .. } if to != 0
            )),
            "some slice is headed to another shard"
        );
        // No app is written: each follows its slice by its unit's token.
        assert!(first.item_writes.is_empty(), "{:?}", first.item_writes);

        // The slices landed: the whole record is retired (a drain to its own shard).
        for write in &creates {
            index.apply_slice(landed(&write.write));
        }
        let second = decide(&rules, &index, &membership, PassMemory::Forgotten).unwrap();
        let retire = second
            .record_writes
            .iter()
            .find(|w| w.record == RecordKey::whole(ObjectKey::new("fleet", "hot")))
            .expect("the whole record is written");
        assert_eq!(
            retire.action,
            SliceAction::Retire {
                range: KeyRange::WHOLE
            }
        );
        let ControlPlaneWrite::Unit { patch, .. } = &retire.write else {
            panic!("{retire:?}");
        };
        assert_eq!(patch["metadata"]["annotations"][DRAIN_TO_ANNOTATION], "0");
        assert_eq!(patch["metadata"]["resourceVersion"], "rv-hot");

        // The owner released it: the record is deleted, and the unit marked as cut.
        let mut released = unit("hot", Some(0));
        released.view.record.drain_to = Some(0);
        released.view.record.drained_epoch = Some(1);
        index.apply_unit(released);
        let third = decide(&rules, &index, &membership, PassMemory::Forgotten).unwrap();
        let delete = third
            .record_writes
            .iter()
            .find(|w| w.record.range == KeyRange::WHOLE && w.record.unit.name == "hot")
            .expect("the whole record is deleted");
        assert_eq!(
            delete.action,
            SliceAction::Delete {
                range: KeyRange::WHOLE
            }
        );
        let ControlPlaneWrite::Unit { patch, .. } = &delete.write else {
            panic!("{delete:?}");
        };
        let metadata = &patch["metadata"];
        assert_eq!(metadata["labels"][SHARD_LABEL], Value::Null);
        let count: usize = metadata["labels"][SLICES_LABEL]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            count,
            third.plan.layouts[&ObjectKey::new("fleet", "hot")].len()
        );
        assert!(
            metadata["annotations"][SLICE_SHARDS_ANNOTATION]
                .as_str()
                .unwrap()
                .contains('0')
        );
        assert_eq!(metadata["annotations"][HOLDER_ANNOTATION], Value::Null);
        assert!(third.figures.cut_units == 1 && third.figures.cache_copies >= 1);
    }

    /// One kind placed by ranges of its objects' UIDs (`Layout::KeyRanges`): the one unit, the
    /// StatefulSet, is cut across every live shard even where slicing is configured off, and no
    /// object is written (each carries its unit, as the planner's watch gives it).
    #[test]
    fn the_objects_of_one_kind_placed_by_key_ranges_reach_every_shard_and_none_is_written() {
        use crate::layout::Layout;
        let mut index = Index::default();
        index.set_expected(Some(3));
        index.apply_unit(unit("objects", Some(0)));
        for i in 0..300 {
            let mut view = item(&format!("object-{i}"), "objects", None);
            view.uid = spread_uid(i);
            index.apply_view(view);
        }
        let strategy = sticky();
        let layout = Layout::KeyRanges;
        let rules = PlacementRules {
            slicing: layout.slicing(SliceSwitch::Off),
            copy_cost: layout.copy_cost(|| 1_000),
            ..rules(&strategy)
        };
        let decision = decide(
            &rules,
            &index,
            &members(3, &[0, 1, 2]),
            PassMemory::Forgotten,
        )
        .unwrap();
        assert!(
            decision.item_writes.is_empty(),
            "{:?}",
            decision.item_writes
        );
        let headed: BTreeSet<ShardId> = decision
            .record_writes
            .iter()
            .filter_map(|w| match w.action {
                SliceAction::Create { drain_to, .. } => Some(drain_to.unwrap_or(0)),
                _ => None,
            })
            .collect();
        assert_eq!(
            headed,
            BTreeSet::from([0, 1, 2]),
            "{:?}",
            decision.record_writes
        );
        // Where slicing is configured, the layout of units and items keeps it.
        assert_eq!(
            Layout::UnitsAndItems.slicing(SliceSwitch::Off),
            SliceSwitch::Off
        );
        assert_eq!(Layout::UnitsAndItems.copy_cost(|| 1_000), 1_000);
    }

    #[test]
    fn unit_slices_of_a_unit_that_is_gone_are_deleted() {
        let mut index = index(&[("a", Some(0), 2)]);
        let (low, _) = KeyRange::WHOLE.halves().unwrap();
        let mut slice = UnitSlice::new(
            "gone-0",
            UnitSliceSpec::new(&ObjectKey::new("fleet", "gone"), "uid-gone", low),
        );
        slice.metadata.namespace = Some("fleet".into());
        slice.metadata.resource_version = Some("7".into());
        index.apply_slice(SliceEntry::of(&slice));
        // Made again under another UID: the old unit's slice is not the new one's.
        let mut recreated = slice.clone();
        recreated.metadata.name = Some("a-0".into());
        recreated.spec = UnitSliceSpec::new(&ObjectKey::new("fleet", "a"), "uid-old-a", low);
        index.apply_slice(SliceEntry::of(&recreated));
        let decision = decide(
            &rules(&sticky()),
            &index,
            &members(1, &[0]),
            PassMemory::Forgotten,
        )
        .unwrap();
        let deleted: Vec<&ControlPlaneWrite> = decision
            .other_writes
            .iter()
            .filter(|w| matches!(w, ControlPlaneWrite::DeleteSlice { .. }))
            .collect();
        assert_eq!(
            deleted,
            [
                &ControlPlaneWrite::DeleteSlice {
                    key: ObjectKey::new("fleet", "a-0"),
                    resource_version: Some("7".into())
                },
                &ControlPlaneWrite::DeleteSlice {
                    key: ObjectKey::new("fleet", "gone-0"),
                    resource_version: Some("7".into())
                },
            ]
        );
        assert!(decision.plan.layouts[&ObjectKey::new("fleet", "a")] == [(KeyRange::WHOLE, 0)]);
    }
}
