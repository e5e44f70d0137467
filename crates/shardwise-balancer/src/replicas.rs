//! `--manage-replicas`: the balancer changes the application controller's replica count itself,
//! so that no app has two owners and none goes unowned while it changes. No I/O: the
//! StatefulSet and the pods are read elsewhere and passed in; [`plan`] says what to do next.
//!
//! Argo CD reads a key at or above a pod's own count as shard 0, and a pod restarts to read a
//! new count. A change done by the user (replicas and `ARGOCD_CONTROLLER_REPLICAS` together,
//! rolled by the StatefulSet controller) leaves each replaced pod's clusters unowned while it
//! restarts. Done here, one pod at a time through the StatefulSet's rolling-update
//! `partition`, every pod's clusters are first moved to the others and dropped by it:
//!
//! - **down** (R to W): the clusters of shards W and above leave first (they are at or above
//!   the count every pod will agree on); once their pods list none of them, `spec.replicas`,
//!   the variable and `partition: W` are written together, so the leaving pods go and the
//!   others keep running;
//! - **up** (R to W): the same write with `partition: R` starts the new pods without touching
//!   the old ones; nothing moves onto them while any pod still reads keys with R;
//! - then each old pod in turn, highest ordinal first (the StatefulSet's own order): its
//!   clusters are moved away (as a rescue, so they come back), and once it lists none of them
//!   the partition is lowered to its ordinal and the StatefulSet controller replaces it; its
//!   clusters come back once it has been Ready for the settle time;
//! - last, `partition: 0` and the change's annotation removed.
//!
//! Every step is read back from the StatefulSet and the pods, so a balancer that restarts or
//! takes over mid-change carries on where the last one stopped.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::{Value, json};
use shard_assign::ShardId;
use shardwise_plan::installation::{REPLICAS_ENV, controller_container};

/// The annotation on the StatefulSet while the balancer changes its replica count: the count
/// it is changing to.
pub const CHANGE_ANNOTATION: &str = "shardwise.io/replica-change";

/// How long a restarted controller pod must have been Ready before clusters move onto it and
/// the next pod is drained. Argo CD's controller answers its readiness probe before its
/// informers have synced: in the suite, controllers started less than 20 s before a key change
/// took up to 13.6 s to follow it (docs/argocd.md).
pub const SETTLE: Duration = Duration::from_secs(20);

/// The controller's StatefulSet as the replica manager reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// `spec.replicas`.
    pub replicas: u32,
    /// `ARGOCD_CONTROLLER_REPLICAS` of the pod template, when it is a number written there.
    pub env: Option<u32>,
    /// `spec.updateStrategy.rollingUpdate.partition` (0 when not set).
    pub partition: u32,
    /// Whether the StatefulSet updates its pods by rolling update (the default); with
    /// `OnDelete` the partition means nothing.
    pub rolling: bool,
    /// Whether [`CHANGE_ANNOTATION`] is on it: a change of the balancer's is under way.
    pub changing: bool,
    /// Whether the StatefulSet controller has seen its current spec (its observed generation
    /// caught up): until then, which pods are of the current template cannot be told.
    pub observed: bool,
    /// The revision of its current template (`status.updateRevision`).
    pub update_revision: Option<String>,
}

/// One controller pod as the replica manager sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// Its ordinal in the StatefulSet.
    pub ordinal: u32,
    /// The replica count it reads keys with, if known.
    pub count: Option<u32>,
    /// Made from the StatefulSet's current template (its update revision).
    pub updated: bool,
    /// Ready, not being deleted, for [`SETTLE`] or longer.
    pub settled: bool,
    /// Whether it may still reconcile apps of a balanced cluster: its `argocd_app_info` lists
    /// some, or could not be read.
    pub holding: bool,
}

/// What the StatefulSet is to be set to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// `spec.replicas` and `ARGOCD_CONTROLLER_REPLICAS`, together.
    pub replicas: u32,
    /// The rolling update's partition: pods below it keep their revision.
    pub partition: u32,
    /// Whether [`CHANGE_ANNOTATION`] stays (the change goes on) or goes (it is over).
    pub changing: bool,
}

/// What to do about the replica count now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the count is the one wanted and no change is under way.
    Steady,
    /// Nothing to write yet, and why (a pod draining, starting or settling).
    Wait(String),
    /// Write the StatefulSet.
    Write(Change),
    /// The StatefulSet cannot be managed, and why (it is not changed).
    Refuse(String),
}

/// The next step of a change to `wanted` replicas, and the shards whose clusters must be moved
/// off meanwhile (to come back once the shard's new pod has settled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Shards drained for a pod's restart.
    pub draining: BTreeSet<ShardId>,
    /// What to do.
    pub action: Action,
}

impl Plan {
    fn new(action: Action) -> Self {
        Self {
            draining: BTreeSet::new(),
            action,
        }
    }
}

/// The next step towards `wanted` replicas, from the StatefulSet and its running pods, and
/// `keyed`: the shards some cluster's key names now. A shard is drained once no key names it
/// and its pod lists none of the balanced clusters' apps (or has no pod).
pub fn plan(wanted: u32, workload: &Workload, pods: &[Pod], keyed: &BTreeSet<ShardId>) -> Plan {
    let mut plan = next(wanted, workload, pods, keyed);
    if undrained() {
        plan.draining.clear();
    }
    plan
}

/// The seeded defect [`shardwise_runtime::failpoints::RESTART_UNDRAINED_CONTROLLER`]: pods
/// restart with their clusters.
fn undrained() -> bool {
    shardwise_runtime::failpoints::seeded(
        shardwise_runtime::failpoints::RESTART_UNDRAINED_CONTROLLER,
    )
}

fn next(wanted: u32, workload: &Workload, pods: &[Pod], keyed: &BTreeSet<ShardId>) -> Plan {
    // A partition or a rollout that is not the balancer's own is left to whoever made it.
    let at_rest = !workload.changing && workload.replicas == wanted && workload.env == Some(wanted);
    if at_rest {
        return Plan::new(Action::Steady);
    }
    if !workload.rolling {
        return Plan::new(Action::Refuse(
            "its update strategy is OnDelete: the balancer changes the replica count only through a rolling update's partition".into(),
        ));
    }
    let drained = |shard: ShardId| {
        undrained()
            || !keyed.contains(&shard) && !pods.iter().any(|p| p.ordinal == shard && p.holding)
    };
    if workload.replicas > wanted {
        let draining: BTreeSet<ShardId> = (wanted..workload.replicas).collect();
        let waiting: Vec<ShardId> = draining.iter().copied().filter(|&s| !drained(s)).collect();
        let action = if waiting.is_empty() {
            Action::Write(Change {
                replicas: wanted,
                partition: wanted,
                changing: true,
            })
        } else {
            Action::Wait(format!(
                "{} -> {wanted} replicas: shard(s) {waiting:?} still hold clusters; their pods go once they hold none",
                workload.replicas
            ))
        };
        return Plan { draining, action };
    }
    if workload.replicas < wanted || workload.env != Some(wanted) {
        // New pods start at the new count; the running ones keep theirs until their turn.
        return Plan::new(Action::Write(Change {
            replicas: wanted,
            partition: workload.replicas.min(wanted),
            changing: true,
        }));
    }
    if !workload.observed {
        return Plan::new(Action::Wait(
            "the StatefulSet controller has not yet seen the last change".into(),
        ));
    }
    if let Some(leaving) = pods.iter().find(|p| p.ordinal >= wanted) {
        return Plan::new(Action::Wait(format!(
            "pod {} of the old count is still going",
            leaving.ordinal
        )));
    }
    // Done: of the StatefulSet's current template (its count, and whatever else it changed),
    // and settled.
    let done = |ordinal: u32| {
        pods.iter()
            .find(|p| p.ordinal == ordinal)
            .is_some_and(|p| p.count == Some(wanted) && p.updated && p.settled)
    };
    let undone: Vec<u32> = (0..wanted).filter(|&o| !done(o)).collect();
    // Pods at or above the partition are being replaced, starting or settling: all stay
    // drained until they are done, whatever this balancer saw of them before.
    let mut draining: BTreeSet<ShardId> = undone
        .iter()
        .copied()
        .filter(|&o| o >= workload.partition)
        .collect();
    if !draining.is_empty() {
        return Plan {
            action: Action::Wait(format!(
                "pod(s) {draining:?} start with {wanted} replicas and settle ({} s Ready)",
                SETTLE.as_secs()
            )),
            draining,
        };
    }
    let Some(&ordinal) = undone.last() else {
        return Plan::new(Action::Write(Change {
            replicas: wanted,
            partition: 0,
            changing: false,
        }));
    };
    draining.insert(ordinal);
    let action = if drained(ordinal) {
        Action::Write(Change {
            replicas: wanted,
            partition: ordinal,
            changing: true,
        })
    } else {
        Action::Wait(format!(
            "shard {ordinal} still holds clusters; its pod restarts with {wanted} replicas once it holds none"
        ))
    };
    Plan { draining, action }
}

impl Workload {
    /// The StatefulSet as the replica manager reads it.
    pub fn of(set: &StatefulSet) -> Self {
        let spec = set.spec.as_ref();
        let strategy = spec.and_then(|s| s.update_strategy.as_ref());
        let env = controller_container(spec.and_then(|s| s.template.spec.as_ref()))
            .and_then(|c| c.env.as_ref())
            .and_then(|vars| vars.iter().find(|v| v.name == REPLICAS_ENV))
            .and_then(|v| v.value.as_deref())
            .and_then(|v| v.trim().parse().ok());
        let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        Self {
            // Kubernetes defaults an unset count to 1.
            replicas: spec.map_or(1, |s| count(s.replicas.or(Some(1)))),
            env,
            partition: count(
                strategy
                    .and_then(|s| s.rolling_update.as_ref())
                    .and_then(|r| r.partition),
            ),
            rolling: strategy
                .and_then(|s| s.type_.as_deref())
                .is_none_or(|t| t == "RollingUpdate"),
            changing: set
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(CHANGE_ANNOTATION)),
            observed: set
                .status
                .as_ref()
                .is_some_and(|s| s.observed_generation >= set.metadata.generation),
            update_revision: set.status.as_ref().and_then(|s| s.update_revision.clone()),
        }
    }
}

/// The strategic merge patch that writes `change` to `set`: the replicas, the variable of the
/// controller container (a literal, replacing a reference if there was one), the partition and
/// the annotation, in one write, so that no pod starts with a count the others do not share.
pub fn patch(set: &StatefulSet, change: Change) -> Value {
    let container = controller_container(set.spec.as_ref().and_then(|s| s.template.spec.as_ref()))
        .map_or("argocd-application-controller", |c| c.name.as_str());
    let annotation = change.changing.then(|| change.replicas.to_string());
    json!({
        "metadata": {
            // Written only over the StatefulSet this plan was made from.
            "resourceVersion": set.metadata.resource_version,
            "annotations": {CHANGE_ANNOTATION: annotation},
        },
        "spec": {
            "replicas": change.replicas,
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"partition": change.partition},
            },
            "template": {"spec": {"containers": [{
                "name": container,
                "env": [{
                    "name": REPLICAS_ENV,
                    "value": change.replicas.to_string(),
                    "valueFrom": null,
                }],
            }]}},
        },
    })
}

/// The ordinals of the pods `change`, written to `workload`, restarts (the partition lowered
/// past them) or removes (at or above its count): what they list goes unowned unless it was
/// moved first.
pub fn restarted(workload: &Workload, change: Change) -> BTreeSet<u32> {
    (change.partition..workload.partition)
        .chain(change.replicas..workload.replicas)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A StatefulSet at rest with `replicas`.
    fn at_rest(replicas: u32) -> Workload {
        Workload {
            replicas,
            env: Some(replicas),
            partition: 0,
            rolling: true,
            changing: false,
            observed: true,
            update_revision: None,
        }
    }

    /// A settled pod that holds nothing.
    fn pod(ordinal: u32, count: u32) -> Pod {
        Pod {
            ordinal,
            count: Some(count),
            updated: true,
            settled: true,
            holding: false,
        }
    }

    /// What the StatefulSet controller does with `change`: the workload written, and the
    /// pods at or above the partition that are not of the template written replaced by
    /// unsettled pods of it (those above the replicas gone).
    fn apply(workload: &mut Workload, pods: &mut Vec<Pod>, change: Change) {
        // A new count is a new template: every pod is of the old one until replaced.
        if workload.env != Some(change.replicas) {
            pods.iter_mut().for_each(|p| p.updated = false);
        }
        *workload = Workload {
            replicas: change.replicas,
            env: Some(change.replicas),
            partition: change.partition,
            rolling: true,
            changing: change.changing,
            observed: true,
            update_revision: None,
        };
        pods.retain(|p| p.ordinal < change.replicas);
        for ordinal in change.partition..change.replicas {
            let fresh = Pod {
                settled: false,
                ..pod(ordinal, change.replicas)
            };
            match pods.iter_mut().find(|p| p.ordinal == ordinal) {
                Some(p) if p.updated => {}
                Some(p) => *p = fresh,
                None => pods.push(fresh),
            }
        }
        pods.sort_by_key(|p| p.ordinal);
    }

    /// Drives a change to `wanted` to its end, the pods settling and dropping their clusters
    /// one step after they are asked to; returns every step's plan.
    fn drive(workload: &mut Workload, pods: &mut Vec<Pod>, wanted: u32) -> Vec<Plan> {
        let mut plans = Vec::new();
        let none = BTreeSet::new();
        for _ in 0..100 {
            let step = plan(wanted, workload, pods, &none);
            plans.push(step.clone());
            match step.action {
                Action::Steady => return plans,
                Action::Write(change) => apply(workload, pods, change),
                Action::Wait(_) => {
                    for p in pods.iter_mut() {
                        p.settled = true;
                    }
                }
                Action::Refuse(why) => panic!("{why}"),
            }
        }
        panic!("no end: {plans:?}");
    }

    /// The pods' counts after each write, and whether any pod was replaced while its shard
    /// was not drained.
    fn every_restart_is_drained(plans: &[Plan], from: u32) {
        let mut partition = from;
        for step in plans {
            if let Action::Write(change) = step.action {
                if change.partition < partition && change.changing {
                    assert!(
                        (change.partition..partition)
                            .all(|s| step.draining.contains(&s) || s >= change.replicas),
                        "pods from {} restart undrained: {step:?}",
                        change.partition
                    );
                }
                partition = change.partition;
            }
        }
    }

    #[test]
    fn every_write_names_exactly_the_pods_it_restarts_or_removes() {
        for (from, to) in [(3, 4), (4, 3), (2, 5), (5, 2)] {
            let mut workload = at_rest(from);
            let mut pods: Vec<Pod> = (0..from).map(|o| pod(o, from)).collect();
            let none = BTreeSet::new();
            for _ in 0..100 {
                let step = plan(to, &workload, &pods, &none);
                match step.action {
                    Action::Steady => break,
                    Action::Write(change) => {
                        let named = restarted(&workload, change);
                        let before = pods.clone();
                        apply(&mut workload, &mut pods, change);
                        let replaced: BTreeSet<u32> = before
                            .iter()
                            .filter(|b| {
                                pods.iter()
                                    .find(|p| p.ordinal == b.ordinal)
                                    // Replaced: a new pod, unsettled (a template
                                    // change alone only marks the old pods outdated).
                                    .is_none_or(|p| p.settled != b.settled || p.count != b.count)
                            })
                            .map(|b| b.ordinal)
                            .collect();
                        assert_eq!(named, replaced, "{from} -> {to}: {change:?}");
                    }
                    Action::Wait(_) => pods.iter_mut().for_each(|p| p.settled = true),
                    Action::Refuse(why) => panic!("{why}"),
                }
            }
            assert_eq!(workload, at_rest(to));
        }
    }

    #[test]
    fn at_rest_nothing_is_done() {
        let plan = plan(
            3,
            &at_rest(3),
            &[pod(0, 3), pod(1, 3), pod(2, 3)],
            &BTreeSet::new(),
        );
        assert_eq!(plan, Plan::new(Action::Steady));
    }

    #[test]
    fn up_starts_the_new_pods_then_restarts_each_old_one_drained_highest_first() {
        let mut workload = at_rest(3);
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 3)];
        let plans = drive(&mut workload, &mut pods, 4);
        let writes: Vec<Change> = plans
            .iter()
            .filter_map(|p| match p.action {
                Action::Write(c) => Some(c),
                _ => None,
            })
            .collect();
        let at = |replicas, partition, changing| Change {
            replicas,
            partition,
            changing,
        };
        assert_eq!(
            writes,
            [
                at(4, 3, true),
                at(4, 2, true),
                at(4, 1, true),
                at(4, 0, true),
                at(4, 0, false)
            ]
        );
        every_restart_is_drained(&plans, 3);
        assert_eq!(workload, at_rest(4));
        assert!(pods.iter().all(|p| p.count == Some(4)) && pods.len() == 4);
    }

    #[test]
    fn down_drains_the_leaving_shards_before_they_go_then_restarts_the_rest() {
        let mut workload = at_rest(4);
        let mut pods = vec![pod(0, 4), pod(1, 4), pod(2, 4), pod(3, 4)];
        // Shard 3 still holds clusters: nothing is written.
        pods[3].holding = true;
        let first = plan(3, &workload, &pods, &BTreeSet::new());
        assert_eq!(first.draining, BTreeSet::from([3]));
        assert!(
            matches!(first.action, Action::Wait(ref w) if w.contains("[3]")),
            "pod 3 is removed while it still holds clusters: {first:?}"
        );
        // A key still names it: not drained either.
        pods[3].holding = false;
        let keyed = plan(3, &workload, &pods, &BTreeSet::from([3]));
        assert!(matches!(keyed.action, Action::Wait(_)));
        let plans = drive(&mut workload, &mut pods, 3);
        assert_eq!(
            plans[0].action,
            Action::Write(Change {
                replicas: 3,
                partition: 3,
                changing: true
            })
        );
        every_restart_is_drained(&plans, 4);
        assert_eq!(workload, at_rest(3));
        assert!(pods.iter().all(|p| p.count == Some(3)) && pods.len() == 3);
    }

    #[test]
    fn a_pod_is_replaced_only_once_it_holds_nothing_and_the_one_above_has_settled() {
        // 3 -> 4 under way: pod 3 started, pods 0 to 2 still read 3.
        let workload = Workload {
            replicas: 4,
            env: Some(4),
            partition: 3,
            rolling: true,
            changing: true,
            observed: true,
            update_revision: None,
        };
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 3), pod(3, 4)];
        pods[3].settled = false;
        let none = BTreeSet::new();
        let step = plan(4, &workload, &pods, &none);
        assert!(matches!(step.action, Action::Wait(ref w) if w.contains("pod(s) {3}")));
        pods[3].settled = true;
        pods[2].holding = true;
        let step = plan(4, &workload, &pods, &none);
        assert!(
            step.draining == BTreeSet::from([2])
                && matches!(step.action, Action::Wait(ref w) if w.contains("shard 2")),
            "pod 2 is replaced while it still holds clusters (its shard drained first, and waited for): {step:?}"
        );
        pods[2].holding = false;
        let step = plan(4, &workload, &pods, &none);
        assert_eq!(step.draining, BTreeSet::from([2]));
        assert_eq!(
            step.action,
            Action::Write(Change {
                replicas: 4,
                partition: 2,
                changing: true
            })
        );
        // Replaced and Ready, not settled: still drained, nothing more written.
        pods[2] = Pod {
            settled: false,
            ..pod(2, 4)
        };
        let lowered = Workload {
            partition: 2,
            ..workload
        };
        let step = plan(4, &lowered, &pods, &none);
        assert_eq!(step.draining, BTreeSet::from([2]));
        assert!(matches!(step.action, Action::Wait(ref w) if w.contains("pod(s) {2}")));
        // A missing pod holds nothing: drained at once.
        pods[2].settled = true;
        pods.remove(1);
        let step = plan(4, &lowered, &pods, &none);
        assert_eq!(step.draining, BTreeSet::from([1]));
        assert!(matches!(
            step.action,
            Action::Write(Change { partition: 1, .. })
        ));
    }

    #[test]
    fn a_change_of_mind_midway_and_a_restart_carry_on_from_what_is_read() {
        // 3 -> 4 half done (pods 3 and 2 at 4), then 3 wanted again.
        let mut workload = Workload {
            replicas: 4,
            env: Some(4),
            partition: 2,
            rolling: true,
            changing: true,
            observed: true,
            update_revision: None,
        };
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 4), pod(3, 4)];
        let plans = drive(&mut workload, &mut pods, 3);
        every_restart_is_drained(&plans, 2);
        assert_eq!(workload, at_rest(3));
        assert!(pods.iter().all(|p| p.count == Some(3)) && pods.len() == 3);
        // The user set the replicas alone: the variable follows, no pod restarts undrained.
        let mut workload = Workload {
            env: Some(3),
            ..at_rest(4)
        };
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 3)];
        let plans = drive(&mut workload, &mut pods, 4);
        every_restart_is_drained(&plans, 3);
        assert_eq!(workload, at_rest(4));
    }

    #[test]
    fn the_statefulset_is_read_and_written_in_one_patch() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "argocd-application-controller", "resourceVersion": "7", "generation": 2, "annotations": {CHANGE_ANNOTATION: "4"}},
            "spec": {
                "replicas": 4,
                "selector": {},
                "serviceName": "c",
                "updateStrategy": {"rollingUpdate": {"partition": 2}},
                "template": {"spec": {"containers": [
                    {"name": "sidecar", "env": [{"name": REPLICAS_ENV, "value": "9"}]},
                    {"name": "argocd-application-controller", "env": [{"name": REPLICAS_ENV, "value": " 4"}]},
                ]}},
            },
            "status": {"replicas": 4, "observedGeneration": 2, "updateRevision": "r2"},
        }))
        .unwrap();
        assert_eq!(
            Workload::of(&set),
            Workload {
                replicas: 4,
                env: Some(4),
                partition: 2,
                rolling: true,
                changing: true,
                observed: true,
                update_revision: Some("r2".into()),
            }
        );
        // A spec the StatefulSet controller has not seen yet, and no step taken meanwhile.
        let mut unseen = set.clone();
        unseen.metadata.generation = Some(3);
        let unseen = Workload::of(&unseen);
        assert!(!unseen.observed);
        let step = plan(
            4,
            &unseen,
            &[pod(0, 4), pod(1, 4), pod(2, 4), pod(3, 4)],
            &BTreeSet::new(),
        );
        assert!(
            matches!(step.action, Action::Wait(ref w) if w.contains("not yet seen")),
            "{step:?}"
        );
        let body = patch(
            &set,
            Change {
                replicas: 3,
                partition: 3,
                changing: false,
            },
        );
        assert_eq!(
            body["metadata"]["annotations"][CHANGE_ANNOTATION],
            Value::Null
        );
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["replicas"], 3);
        assert_eq!(
            body["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
            3
        );
        let container = &body["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["name"], "argocd-application-controller");
        assert_eq!(container["env"][0]["value"], "3");
        // A reference, OnDelete, no replicas: no count, not rolling, Kubernetes' default of 1.
        let set: StatefulSet = serde_json::from_value(json!({
            "spec": {
                "selector": {},
                "serviceName": "c",
                "updateStrategy": {"type": "OnDelete"},
                "template": {"spec": {"containers": [{"name": "c", "env": [
                    {"name": REPLICAS_ENV, "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}
                ]}]}},
            },
        }))
        .unwrap();
        let read = Workload::of(&set);
        assert_eq!(
            (read.replicas, read.env, read.rolling, read.changing),
            (1, None, false, false)
        );
        assert_eq!(
            patch(
                &set,
                Change {
                    replicas: 2,
                    partition: 2,
                    changing: true
                }
            )["metadata"]["annotations"][CHANGE_ANNOTATION],
            "2"
        );
    }

    #[test]
    fn a_count_read_from_a_config_map_is_written_and_every_pod_restarts_drained() {
        // The count is right but not a number in the template: writing it is a new template,
        // so every pod restarts, each drained first, though each already reads 3.
        let mut workload = Workload {
            env: None,
            ..at_rest(3)
        };
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 3)];
        let plans = drive(&mut workload, &mut pods, 3);
        every_restart_is_drained(&plans, 3);
        let partitions: Vec<u32> = plans
            .iter()
            .filter_map(|p| match p.action {
                Action::Write(c) => Some(c.partition),
                _ => None,
            })
            .collect();
        assert_eq!(partitions, [3, 2, 1, 0, 0]);
        assert_eq!(workload, at_rest(3));
        assert!(pods.iter().all(|p| p.updated && p.settled));
    }

    #[test]
    fn a_balancer_that_takes_over_midway_keeps_every_unsettled_pod_drained() {
        // 3 -> 4 under way, pods 3 and 2 replaced; a new leader has seen neither settle.
        let workload = Workload {
            replicas: 4,
            env: Some(4),
            partition: 2,
            rolling: true,
            changing: true,
            observed: true,
            update_revision: None,
        };
        let mut pods = vec![pod(0, 3), pod(1, 3), pod(2, 4), pod(3, 4)];
        pods[2].settled = false;
        pods[3].settled = false;
        let step = plan(4, &workload, &pods, &BTreeSet::new());
        assert_eq!(step.draining, BTreeSet::from([2, 3]));
        assert!(matches!(step.action, Action::Wait(_)), "{step:?}");
        // A user's own partition, no change of the balancer's under way: left alone.
        let theirs = Workload {
            partition: 2,
            ..at_rest(4)
        };
        assert_eq!(
            plan(4, &theirs, &pods, &BTreeSet::new()),
            Plan::new(Action::Steady)
        );
    }

    #[test]
    fn on_delete_is_refused() {
        let workload = Workload {
            rolling: false,
            ..at_rest(3)
        };
        let step = plan(4, &workload, &[pod(0, 3)], &BTreeSet::new());
        assert!(matches!(step.action, Action::Refuse(ref w) if w.contains("OnDelete")));
    }
}
