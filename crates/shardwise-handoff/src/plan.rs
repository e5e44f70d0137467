//! The planner's pass: from what it observes (clusters with their placement records, apps, the
//! shards that exist) to what it must write (cluster actions and app labels).

use std::collections::BTreeMap;

use shard_assign::{
    AssignError, Assignment, Cluster, PreviousPlacement, ShardId, ShardSet, StrategyConfig, assign,
    fnv1a_32,
};

use crate::drain::{ClusterRecord, Incarnation, PlannerAction, planner_action};

/// Namespace and name of an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// A cluster as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    pub key: ObjectKey,
    pub uid: String,
    pub pin: Option<ShardId>,
    pub weight: Option<u32>,
    pub record: ClusterRecord,
}

/// An app as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppView {
    pub key: ObjectKey,
    pub uid: String,
    /// The cluster it targets (same namespace as the app).
    pub cluster: ObjectKey,
    /// Its shard label.
    pub shard: Option<ShardId>,
}

/// Which shards exist and which are alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// The StatefulSet's `spec.replicas`: shards `0..expected` are expected.
    pub expected: u32,
    /// Shards whose lease is valid, with the identity holding it.
    pub alive: BTreeMap<ShardId, String>,
}

impl Membership {
    /// Shards that may be given work: expected and alive.
    pub fn live(&self) -> ShardSet {
        self.alive
            .keys()
            .copied()
            .filter(|&s| s < self.expected)
            .collect()
    }

    /// The identity holding the lease of `shard`, if the lease is valid.
    pub fn identity(&self, shard: ShardId) -> Option<&str> {
        self.alive.get(&shard).map(String::as_str)
    }

    /// The incarnation holding the lease of `shard`, if the lease is valid.
    pub fn holder(&self, shard: ShardId) -> Option<Incarnation> {
        self.identity(shard).map(Incarnation::of_identity)
    }
}

/// What the planner remembers of its last pass: the load each cluster was placed with and the
/// live shards. Given back to the next pass, it lets `sticky-balanced` tell a pass with nothing
/// changed (no extra moves) from one reacting to a change; without it (first pass, or a pass
/// meant to keep converging) every pass may spend the move budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanMemory {
    pub loads: BTreeMap<String, u64>,
    pub shards: ShardSet,
}

impl PlanMemory {
    /// The memory a planner would have if it had just placed the fleet as it stands: for a
    /// planner that takes over, so that its first pass spends no move on a fleet that did not
    /// change (a planner failover must not move clusters).
    pub fn of_current(clusters: &[ClusterView], apps: &[AppView], membership: &Membership) -> Self {
        let mut app_counts: BTreeMap<&ObjectKey, u64> = BTreeMap::new();
        for app in apps {
            *app_counts.entry(&app.cluster).or_default() += 1;
        }
        let loads = clusters
            .iter()
            .map(|c| {
                let apps = app_counts.get(&c.key).copied().unwrap_or(0);
                (
                    c.uid.clone(),
                    apps.saturating_mul(u64::from(c.weight.unwrap_or(1))),
                )
            })
            .collect();
        Self {
            loads,
            shards: membership.live(),
        }
    }
}

/// The outcome of a planning pass.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The strategy's placement of every cluster on a live shard.
    pub assignment: Assignment,
    /// Writes to cluster objects, in key order (only clusters that need one).
    pub cluster_actions: Vec<(ObjectKey, PlannerAction)>,
    /// Apps whose shard label must change, with the shard, in key order. An app follows its
    /// cluster's owner once the cluster's action is written.
    pub app_labels: Vec<AppLabel>,
    /// Clusters pinned to a shard that is not live, and where they were placed instead.
    pub unhonoured_pins: Vec<(ObjectKey, ShardId, ShardId)>,
    /// To give to the next pass.
    pub memory: PlanMemory,
}

/// A label change of an app.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppLabel {
    pub app: ObjectKey,
    pub shard: ShardId,
    /// The cluster whose action must succeed first, if the new label depends on one.
    pub after: Option<ObjectKey>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no live shard: no replica both exists in the StatefulSet and holds its lease")]
    NoLiveShards,
    #[error(transparent)]
    Assign(#[from] AssignError),
}

/// One planning pass. Clusters are identified by UID for placement; app counts come from the
/// apps that target each cluster.
pub fn plan(
    strategy: &StrategyConfig,
    clusters: &[ClusterView],
    apps: &[AppView],
    membership: &Membership,
    memory: Option<&PlanMemory>,
) -> Result<Plan, PlanError> {
    let live = membership.live();
    if live.is_empty() {
        return Err(PlanError::NoLiveShards);
    }
    let mut app_counts: BTreeMap<&ObjectKey, u64> = BTreeMap::new();
    for app in apps {
        *app_counts.entry(&app.cluster).or_default() += 1;
    }
    let inputs: Vec<Cluster> = clusters
        .iter()
        .map(|c| Cluster {
            id: c.uid.clone(),
            name: c.key.to_string(),
            apps: app_counts.get(&c.key).copied().unwrap_or(0),
            pin: c.pin,
            weight: c.weight,
        })
        .collect();
    // Where each cluster is or is going: a drain in progress counts as already decided.
    let mut previous = PreviousPlacement::new();
    for c in clusters {
        if let Some(shard) = c.record.intended_shard() {
            let load = memory.and_then(|m| m.loads.get(&c.uid).copied());
            previous.insert(c.uid.clone(), shard, load);
        }
    }
    if let Some(memory) = memory {
        previous = previous.with_live_shards(memory.shards.clone());
    }
    let assignment = assign(strategy, &inputs, &live, Some(&previous))?;
    let memory = PlanMemory {
        loads: assignment
            .placements()
            .iter()
            .map(|(id, p)| (id.clone(), p.load))
            .collect(),
        shards: live.clone(),
    };

    let mut cluster_actions = Vec::new();
    let mut unhonoured_pins = Vec::new();
    // The owner each cluster will have once this pass's writes land.
    let mut owner_after: BTreeMap<&ObjectKey, (ShardId, bool)> = BTreeMap::new();
    for c in clusters {
        let Some(desired) = assignment.shard_of(&c.uid) else {
            continue;
        };
        if let Some(pin) = c.pin
            && pin != desired
        {
            unhonoured_pins.push((c.key.clone(), pin, desired));
        }
        let action = planner_action(&c.record, desired, |s| membership.holder(s));
        match action {
            PlannerAction::Assign { shard, .. } => {
                owner_after.insert(&c.key, (shard, true));
            }
            _ => {
                if let Some(owner) = c.record.owner {
                    owner_after.insert(&c.key, (owner, false));
                }
            }
        }
        if action != PlannerAction::Keep {
            cluster_actions.push((c.key.clone(), action));
        }
    }
    cluster_actions.sort_by(|a, b| a.0.cmp(&b.0));

    let app_labels = app_labels(apps, &owner_after, &live);
    Ok(Plan {
        assignment,
        cluster_actions,
        app_labels,
        unhonoured_pins,
        memory,
    })
}

/// The label changes of apps: each follows its cluster's owner once that cluster's write lands
/// (`owner_after`: the owner each cluster has after this pass, and whether it changes).
fn app_labels(
    apps: &[AppView],
    owner_after: &BTreeMap<&ObjectKey, (ShardId, bool)>,
    live: &ShardSet,
) -> Vec<AppLabel> {
    let mut app_labels = Vec::new();
    for app in apps {
        let (shard, after) = match owner_after.get(&app.cluster) {
            Some(&(shard, changed)) => (shard, changed.then(|| app.cluster.clone())),
            // No such cluster: someone must still report that; keep a live label, or pick one
            // by hash so every planner picks the same.
            None => match app.shard.filter(|&s| live.contains(s)) {
                Some(s) => (s, None),
                None => {
                    let ids = live.as_slice();
                    let index = fnv1a_32(app.uid.as_bytes()) as usize % ids.len();
                    (ids[index], None)
                }
            },
        };
        if app.shard != Some(shard) {
            app_labels.push(AppLabel {
                app: app.key.clone(),
                shard,
                after,
            });
        }
    }
    app_labels.sort_by(|a, b| a.app.cmp(&b.app));
    app_labels
}

/// Identities and records of replicas for tests: shard `s` runs as `fleet-s_first`.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn identity(shard: ShardId) -> String {
        format!("fleet-{shard}_first")
    }

    pub fn holder(shard: ShardId) -> Incarnation {
        Incarnation::of_identity(&identity(shard))
    }

    pub fn members(expected: u32, alive: &[ShardId]) -> Membership {
        Membership {
            expected,
            alive: alive.iter().map(|&s| (s, identity(s))).collect(),
        }
    }

    /// Assigned to `owner` (stamped with its incarnation) at epoch 1.
    pub fn cluster(name: &str, owner: Option<ShardId>) -> ClusterView {
        ClusterView {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            pin: None,
            weight: None,
            record: ClusterRecord {
                owner,
                holder: owner.map(holder),
                epoch: 1,
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{cluster, holder, identity, members};
    use super::*;
    use shard_assign::StrategyKind;

    fn app(name: &str, cluster: &str, shard: Option<ShardId>) -> AppView {
        AppView {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            cluster: ObjectKey::new("fleet", cluster),
            shard,
        }
    }

    #[test]
    fn live_shards_are_expected_and_alive() {
        let m = members(3, &[0, 2, 3]);
        assert_eq!(m.live(), [0, 2].into_iter().collect());
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let err = plan(&config, &[cluster("a", None)], &[], &members(0, &[0]), None).unwrap_err();
        assert_eq!(err, PlanError::NoLiveShards);
    }

    #[test]
    fn new_clusters_and_their_apps_are_labelled_in_one_pass() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let clusters = [cluster("a", None), cluster("b", None)];
        let apps = [
            app("x", "a", None),
            app("y", "a", None),
            app("z", "b", None),
        ];
        let p = plan(&config, &clusters, &apps, &members(2, &[0, 1]), None).unwrap();
        // a (2 apps) goes first to shard 0, b to shard 1.
        assert_eq!(
            p.cluster_actions,
            vec![
                (
                    ObjectKey::new("fleet", "a"),
                    PlannerAction::Assign {
                        shard: 0,
                        holder: holder(0),
                        epoch: 2
                    }
                ),
                (
                    ObjectKey::new("fleet", "b"),
                    PlannerAction::Assign {
                        shard: 1,
                        holder: holder(1),
                        epoch: 2
                    }
                ),
            ]
        );
        let labels: Vec<(String, ShardId, bool)> = p
            .app_labels
            .iter()
            .map(|l| (l.app.name.clone(), l.shard, l.after.is_some()))
            .collect();
        assert_eq!(
            labels,
            vec![
                ("x".into(), 0, true),
                ("y".into(), 0, true),
                ("z".into(), 1, true)
            ]
        );
    }

    #[test]
    fn a_live_owner_is_asked_to_drain_and_apps_wait() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        // Both on shard 0; greedy wants one on each.
        let clusters = [cluster("a", Some(0)), cluster("b", Some(0))];
        let apps = [app("x", "a", Some(0)), app("z", "b", Some(0))];
        let p = plan(&config, &clusters, &apps, &members(2, &[0, 1]), None).unwrap();
        assert_eq!(p.cluster_actions.len(), 1);
        assert!(matches!(
            p.cluster_actions[0].1,
            PlannerAction::RequestDrain { to: 1 }
        ));
        // Until the drain is acknowledged the apps keep their owner.
        assert!(p.app_labels.is_empty());
    }

    #[test]
    fn a_dead_owners_clusters_and_apps_move_at_once() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let clusters = [cluster("a", Some(0)), cluster("b", Some(1))];
        let apps = [app("x", "a", Some(0)), app("z", "b", Some(1))];
        // Shard 1 is expected but its lease expired.
        let p = plan(&config, &clusters, &apps, &members(2, &[0]), None).unwrap();
        assert_eq!(
            p.cluster_actions,
            vec![(
                ObjectKey::new("fleet", "b"),
                PlannerAction::Assign {
                    shard: 0,
                    holder: holder(0),
                    epoch: 2
                }
            )]
        );
        assert_eq!(
            p.app_labels,
            vec![AppLabel {
                app: ObjectKey::new("fleet", "z"),
                shard: 0,
                after: Some(ObjectKey::new("fleet", "b")),
            }]
        );
    }

    #[test]
    fn a_restarted_owner_gets_its_clusters_back_under_its_new_incarnation() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let clusters = [cluster("a", Some(0)), cluster("b", Some(1))];
        let apps = [app("x", "a", Some(0)), app("z", "b", Some(1))];
        // Shard 1 restarted: its lease is valid again, held by a new process.
        let mut membership = members(2, &[0, 1]);
        membership.alive.insert(1, "fleet-1_second".into());
        let p = plan(&config, &clusters, &apps, &membership, None).unwrap();
        assert_eq!(
            p.cluster_actions,
            vec![(
                ObjectKey::new("fleet", "b"),
                PlannerAction::Assign {
                    shard: 1,
                    holder: Incarnation::of_identity("fleet-1_second"),
                    epoch: 2
                }
            )]
        );
        // Same shard: the apps keep their label.
        assert!(p.app_labels.is_empty());
        assert_eq!(membership.identity(0), Some(identity(0).as_str()));
    }

    #[test]
    fn apps_of_missing_clusters_still_get_a_live_owner() {
        let config = StrategyConfig::new(StrategyKind::RoundRobin);
        let apps = [
            app("lost", "nowhere", None),
            app("kept", "nowhere", Some(1)),
            app("stale", "nowhere", Some(7)),
        ];
        let p = plan(&config, &[], &apps, &members(3, &[0, 1, 2]), None).unwrap();
        let shards: BTreeMap<String, ShardId> = p
            .app_labels
            .iter()
            .map(|l| (l.app.name.clone(), l.shard))
            .collect();
        assert!(!shards.contains_key("kept"), "a live label is kept");
        assert!(shards["lost"] < 3 && shards["stale"] < 3);
        // Deterministic: the same pass gives the same labels.
        let again = plan(&config, &[], &apps, &members(3, &[0, 1, 2]), None).unwrap();
        assert_eq!(p.app_labels, again.app_labels);
    }

    #[test]
    fn scale_down_drains_the_departing_shard_while_it_lives() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        let clusters = [
            cluster("a", Some(0)),
            cluster("b", Some(1)),
            cluster("c", Some(2)),
        ];
        // replicas 3 -> 2, replica 2 still running.
        let p = plan(&config, &clusters, &[], &members(2, &[0, 1, 2]), None).unwrap();
        assert_eq!(p.cluster_actions.len(), 1);
        assert_eq!(p.cluster_actions[0].0.name, "c");
        assert!(matches!(
            p.cluster_actions[0].1,
            PlannerAction::RequestDrain { to: 0 | 1 }
        ));
    }

    #[test]
    fn unhonoured_pins_are_reported() {
        let config = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let mut pinned = cluster("p", Some(0));
        pinned.pin = Some(5);
        let p = plan(&config, &[pinned], &[], &members(2, &[0, 1]), None).unwrap();
        assert_eq!(
            p.unhonoured_pins,
            vec![(ObjectKey::new("fleet", "p"), 5, 0)]
        );
    }
}

#[cfg(test)]
mod memory_tests {
    use super::fixtures::{cluster, members};
    use super::*;
    use shard_assign::StrategyKind;

    #[test]
    fn with_memory_an_unchanged_fleet_is_left_alone_and_without_it_keeps_converging() {
        let config = StrategyConfig::new(StrategyKind::StickyBalanced);
        // Everything on shard 0 of two: far from balanced.
        let clusters: Vec<ClusterView> =
            (0..6).map(|i| cluster(&format!("c{i}"), Some(0))).collect();
        let apps: Vec<AppView> = (0..6)
            .flat_map(|i| {
                (0..=i).map(move |j| AppView {
                    key: ObjectKey::new("fleet", format!("a{i}-{j}")),
                    uid: format!("app-{i}-{j}"),
                    cluster: ObjectKey::new("fleet", format!("c{i}")),
                    shard: Some(0),
                })
            })
            .collect();
        let members = members(2, &[0, 1]);
        let remembered = PlanMemory {
            loads: clusters
                .iter()
                .enumerate()
                .map(|(i, c)| (c.uid.clone(), i as u64 + 1))
                .collect(),
            shards: members.live(),
        };
        let quiet = plan(&config, &clusters, &apps, &members, Some(&remembered)).unwrap();
        assert!(
            quiet.cluster_actions.is_empty(),
            "{:?}",
            quiet.cluster_actions
        );
        let converging = plan(&config, &clusters, &apps, &members, None).unwrap();
        assert!(!converging.cluster_actions.is_empty());
        assert!(
            converging.cluster_actions.len() <= 3,
            "the budget bounds a pass"
        );
    }
}
