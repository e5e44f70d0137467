//! What one planning pass writes, decided without I/O: from the index, the membership and the
//! planner's memory to the patches of units and items and the figures the metrics report.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use shard_assign::{Balance, ShardId, StrategyConfig};
use shardwise_handoff::drain::PlannerAction;
use shardwise_handoff::keys::{
    DRAIN_TO_ANNOTATION, DRAINED_ANNOTATION, EPOCH_ANNOTATION, HOLDER_ANNOTATION, SHARD_LABEL,
};
use shardwise_handoff::plan::{Membership, ObjectKey, Plan, PlanError, PlanMemory, plan};

use super::index::Index;

/// What the planner remembers for this pass.
#[derive(Clone, Copy, Debug)]
pub enum Recall<'a> {
    /// The first pass of a planner that just took over: it plans as if it had made the current
    /// placement itself, so that a failover moves nothing.
    Takeover,
    /// The previous pass's memory: a pass with nothing changed moves nothing.
    Remembered(&'a PlanMemory),
    /// A periodic pass forgets, so that `sticky-balanced` may spend its move budget again
    /// while the fleet is above its target balance.
    Forgotten,
}

/// A write to a unit: the protocol's labels and annotations.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitWrite {
    pub key: ObjectKey,
    pub action: PlannerAction,
    /// A JSON merge patch, conditioned on the version the decision was made on.
    pub patch: Value,
}

/// A new shard label of an item.
#[derive(Clone, Debug, PartialEq)]
pub struct ItemWrite {
    pub key: ObjectKey,
    pub shard: ShardId,
    /// The unit whose write must land first, if the label follows a change of owner.
    pub after: Option<ObjectKey>,
    pub patch: Value,
}

/// The figures of a plan, for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// Max over mean items per live shard.
    pub balance: f64,
    /// Units and items per shard.
    pub shards: BTreeMap<ShardId, (u64, u64)>,
    /// Whether the plan is above the strategy's target balance (the planner then re-plans on
    /// the shorter converge interval).
    pub above_target: bool,
}

/// Everything a pass writes and reports.
#[derive(Clone, Debug)]
pub struct Decision {
    pub plan: Plan,
    pub unit_writes: Vec<UnitWrite>,
    pub item_writes: Vec<ItemWrite>,
    pub figures: Figures,
}

/// The patch of a unit action; `None` for [`PlannerAction::Keep`]. `membership` is the one
/// the action was decided on: it names the identity behind an assignment's holder.
pub fn unit_patch(
    action: PlannerAction,
    membership: &Membership,
    resource_version: Option<&str>,
) -> Option<Value> {
    let mut metadata = match action {
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
    // The version the decision was made on: a write based on a stale view fails with 409.
    if let (Some(object), Some(version)) = (metadata.as_object_mut(), resource_version) {
        object.insert("resourceVersion".into(), Value::String(version.to_string()));
    }
    Some(json!({ "metadata": metadata }))
}

/// The patch of an item's shard label.
pub fn item_patch(shard: ShardId) -> Value {
    json!({"metadata": {"labels": {SHARD_LABEL: shard.to_string()}}})
}

/// Decides one pass.
pub fn decide(
    strategy: &StrategyConfig,
    index: &Index,
    membership: &Membership,
    recall: Recall<'_>,
) -> Result<Decision, PlanError> {
    let (units, items) = index.views();
    let takeover;
    let memory = match recall {
        Recall::Takeover => {
            takeover = PlanMemory::of_current(&units, &items, membership);
            Some(&takeover)
        }
        Recall::Remembered(memory) => Some(memory),
        Recall::Forgotten => None,
    };
    let plan = plan(strategy, &units, &items, membership, memory)?;
    let unit_writes = plan
        .cluster_actions
        .iter()
        .filter_map(|(key, action)| {
            let version = index.unit(key).and_then(|u| u.resource_version.as_deref());
            unit_patch(*action, membership, version).map(|patch| UnitWrite {
                key: key.clone(),
                action: *action,
                patch,
            })
        })
        .collect();
    let item_writes = plan
        .app_labels
        .iter()
        .map(|label| ItemWrite {
            key: label.app.clone(),
            shard: label.shard,
            after: label.after.clone(),
            patch: item_patch(label.shard),
        })
        .collect();
    let figures = figures(strategy, &plan);
    Ok(Decision {
        plan,
        unit_writes,
        item_writes,
        figures,
    })
}

fn figures(strategy: &StrategyConfig, plan: &Plan) -> Figures {
    let shard_loads = plan.assignment.shard_loads();
    let item_counts: Vec<u64> = shard_loads.values().map(|l| l.apps).collect();
    let loads: Vec<u64> = shard_loads.values().map(|l| l.load).collect();
    let total: u64 = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    Figures {
        balance: Balance::of_loads(&item_counts).max_over_mean,
        shards: shard_loads
            .iter()
            .map(|(&shard, load)| (shard, (load.clusters, load.apps)))
            .collect(),
        above_target: strategy.kind.uses_previous()
            && !strategy
                .target_balance
                .bounds(max.saturating_mul(loads.len() as u64), total),
    }
}

#[cfg(test)]
mod tests {
    use shard_assign::StrategyKind;

    use super::super::index::fixtures::{identity, item, members, unit};
    use super::*;

    /// An index of `units` (name, owner, items) with each item labelled like its unit.
    fn index(units: &[(&str, Option<ShardId>, usize)]) -> Index {
        let mut index = Index::default();
        for &(name, owner, items) in units {
            index.apply_unit(unit(name, owner));
            for i in 0..items {
                index.apply_item(item(&format!("{name}-{i}"), name, owner));
            }
        }
        index
    }

    fn sticky() -> StrategyConfig {
        StrategyConfig::new(StrategyKind::StickyBalanced)
    }

    #[test]
    fn a_new_fleet_is_assigned_with_stamps_and_versions_and_items_follow() {
        let index = index(&[("a", None, 2), ("b", None, 1)]);
        let decision = decide(&sticky(), &index, &members(2, &[0, 1]), Recall::Forgotten).unwrap();
        assert_eq!(decision.unit_writes.len(), 2);
        for write in &decision.unit_writes {
            let PlannerAction::Assign { shard, .. } = write.action else {
                panic!("{write:?}");
            };
            let metadata = &write.patch["metadata"];
            assert_eq!(metadata["labels"][SHARD_LABEL], shard.to_string());
            assert_eq!(metadata["annotations"][HOLDER_ANNOTATION], identity(shard));
            assert_eq!(
                metadata["resourceVersion"],
                format!("rv-{}", write.key.name)
            );
        }
        assert_eq!(decision.item_writes.len(), 3);
        for write in &decision.item_writes {
            let unit = write
                .after
                .as_ref()
                .expect("a label that follows a new owner");
            assert!(write.key.name.starts_with(&unit.name));
            assert_eq!(write.patch, item_patch(write.shard));
        }
        assert_eq!(decision.figures.shards.len(), 2);
        let counted: u64 = decision.figures.shards.values().map(|(_, i)| i).sum();
        assert_eq!(counted, 3);
    }

    #[test]
    fn a_planner_that_takes_over_a_settled_fleet_writes_nothing() {
        let index = index(&[("a", Some(0), 10), ("b", Some(1), 1), ("c", Some(1), 1)]);
        let membership = members(2, &[0, 1]);
        let decision = decide(&sticky(), &index, &membership, Recall::Takeover).unwrap();
        assert!(
            decision.unit_writes.is_empty(),
            "{:?}",
            decision.unit_writes
        );
        assert!(decision.item_writes.is_empty());
        // Its memory, given back with nothing changed, still moves nothing.
        let again = decide(
            &sticky(),
            &index,
            &membership,
            Recall::Remembered(&decision.plan.memory),
        )
        .unwrap();
        assert!(again.unit_writes.is_empty());
    }

    #[test]
    fn a_unit_on_a_shard_that_went_away_is_drained_first_and_its_items_wait() {
        let index = index(&[("a", Some(0), 1), ("b", Some(1), 1)]);
        // Shard 1 is scaled away but its lease is still held: its unit is drained, not moved.
        let decision = decide(&sticky(), &index, &members(1, &[0, 1]), Recall::Forgotten).unwrap();
        let drain = decision
            .unit_writes
            .iter()
            .find(|w| w.key.name == "b")
            .expect("b is written");
        assert_eq!(drain.action, PlannerAction::RequestDrain { to: 0 });
        assert_eq!(
            drain.patch["metadata"]["annotations"][DRAIN_TO_ANNOTATION],
            "0"
        );
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
            &sticky(),
            &index,
            &members(3, &[0, 1, 2]),
            Recall::Remembered(&memory),
        )
        .unwrap();
        assert!(decision.figures.above_target, "{:?}", decision.figures);
        assert!(decision.figures.balance > 1.4);
    }

    #[test]
    fn no_live_shard_is_an_error_not_a_plan() {
        let index = index(&[("a", None, 1)]);
        let result = decide(&sticky(), &index, &members(2, &[]), Recall::Forgotten);
        assert!(matches!(result, Err(PlanError::NoLiveShards)));
    }
}
