//! One pass of the Argo CD balancer, decided from objects already read: which `shard` keys
//! to write, and the figures of the resulting placement.
//!
//! Argo CD places a cluster on the shard its Secret's `shard` key names. The balancer owns those
//! keys: on each pass it reads the installation as `shardwise plan --source argocd` does, takes
//! where Argo CD runs each cluster now as the previous placement, lets `sticky-balanced` keep
//! clusters home and spend its move budget only while the busiest shard is above the target,
//! and writes the keys that differ, through a handover ([`crate::handover`]) where a live
//! controller has the cluster now. [`decide`] is that pass without I/O, tested by feeding it
//! objects; `balancer` runs it under a Lease.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use shard_assign::{
    AssignError, Assignment, Cluster, Hysteresis, PreviousPlacement, ShardId, StrategyConfig,
    assign,
};
use shardwise_runtime::metrics::ShardFigures;

use shardwise_plan::LiveFleet;
use shardwise_plan::argocd::{self, HANDOVER_ANNOTATION, PinTarget};
use shardwise_plan::planning;

use crate::controllers::Shards;

/// A cluster Secret annotated with this (`"true"`) keeps its `shard` key: the balancer counts
/// the cluster where Argo CD runs it and never writes the key. The balancer only reads it.
pub const KEEP_SHARD_ANNOTATION: &str = "shardwise.io/keep-shard";

/// The shard a cluster was rescued from when its controller stayed down past the grace period,
/// written with the key that moved it away: the cluster goes back there once a Ready pod serves
/// it again, and the annotation is removed with the key that moves it back.
pub const RESCUED_FROM_ANNOTATION: &str = "shardwise.io/rescued-from";

/// A move whose Applications are yet to be refreshed, written with the key that made it (the
/// shard moved to): removed once every Application of the cluster has been asked to refresh.
/// A balancer stopped or deposed between the two leaves it for the next pass, its own or its
/// successor's.
pub const REFRESH_PENDING_ANNOTATION: &str = "shardwise.io/refresh-pending";

/// The balancer's moves of a cluster within the last hour, written with each key that moves it:
/// `time=load` pairs (RFC 3339 times), comma-separated, oldest first. The minimum time between
/// two moves and the hourly budget count from them, whichever balancer made the moves.
pub const MOVES_ANNOTATION: &str = "shardwise.io/moves";

/// The window of the hourly budget, and how long a move stays in [`MOVES_ANNOTATION`].
const BUDGET_WINDOW: SignedDuration = SignedDuration::from_secs(3_600);

/// How the balancer damps moves made for balance alone, beside the start and stop thresholds
/// ([`Hysteresis`]). Moves it must make (off a shard every pod does not read alike or no Ready
/// pod serves, back from a rescue) are never held back, but count in the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damping {
    /// Seconds after a move of a cluster before it may move again for balance.
    pub min_move_interval: u32,
    /// Percent of the fleet's load that moves may carry within any hour.
    pub hourly_budget_percent: u32,
    /// Seconds a cluster with a sync operation running on one of its Applications stays where
    /// it is, from the operation's start: moved then, the new controller would start the
    /// operation's remaining steps over while the old one may still run hooks. Also delays the
    /// return of a rescued cluster.
    pub sync_wait: u32,
}

/// One move as [`MOVES_ANNOTATION`] records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// When the key that made it was decided.
    pub at: Timestamp,
    /// The cluster's load then (apps, or resources under `--load=resources`).
    pub load: u64,
}

/// The moves of [`MOVES_ANNOTATION`]'s `value` made after `since`, oldest first; entries that
/// do not parse are skipped.
pub fn moves_since(value: &str, since: Timestamp) -> Vec<Move> {
    let mut moves: Vec<Move> = value
        .split(',')
        .filter_map(|entry| {
            let (at, load) = entry.trim().split_once('=')?;
            Some(Move {
                at: at.trim().parse().ok()?,
                load: load.trim().parse().ok()?,
            })
        })
        .filter(|m| m.at > since)
        .collect();
    moves.sort_by_key(|m| m.at);
    moves
}

/// [`MOVES_ANNOTATION`]'s value for `moves`.
pub fn moves_value(moves: &[Move]) -> String {
    moves
        .iter()
        .map(|m| format!("{}={}", m.at, m.load))
        .collect::<Vec<_>>()
        .join(",")
}

/// A cluster Secret that says a refresh is pending ([`REFRESH_PENDING_ANNOTATION`]), as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// The Secret's name.
    pub secret: String,
    /// The cluster's id (the Secret's UID).
    pub id: String,
    /// As read: the precondition of the write that records the refresh done.
    pub resource_version: String,
}

/// What one pass reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// Argo CD's fleet as read.
    pub fleet: &'a LiveFleet,
    /// Argo CD's cluster Secrets, as read (their resourceVersions are the writes' preconditions).
    pub secrets: &'a [Secret],
    /// Argo CD's own algorithm, which places every cluster without a pin it honours.
    pub algorithm: &'a StrategyConfig,
    /// The shards as the running controller pods allow them.
    pub shards: &'a Shards,
    /// How the balancer places: `sticky-balanced` and its move budget per pass.
    pub strategy: &'a StrategyConfig,
    /// The start and stop thresholds of moves for balance, and whether a rebalance is under way
    /// (as the last pass left it).
    pub band: Hysteresis,
    /// The minimum time between moves of one cluster and the hourly budget.
    pub damping: &'a Damping,
    /// The time of the pass: what [`MOVES_ANNOTATION`]'s entries are compared with.
    pub now: Timestamp,
}

/// One Secret a pass rewrites.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyWrite {
    /// The Secret, as read.
    pub target: PinTarget,
    /// The `shard` key to write.
    pub shard: ShardId,
    /// [`RESCUED_FROM_ANNOTATION`]: set to a shard (`Some(Some(_))`), removed (`Some(None)`)
    /// or left as it is (`None`).
    pub rescued_from: Option<Option<ShardId>>,
    /// The write hands the cluster to another controller (or gives it one at last).
    pub moves: bool,
    /// A controller may reconcile the cluster now (it moves off a live shard, or its owner
    /// depends on each pod's count): the key is parked first, and written once no controller
    /// lists the cluster's apps ([`crate::handover`]). A cluster rescued from a dead shard, or
    /// one that does not move, is written at once.
    pub handover: bool,
    /// [`MOVES_ANNOTATION`]'s new value, when the write moves the cluster: its moves of the last
    /// hour and this one.
    pub moves_record: Option<String>,
}

impl KeyWrite {
    /// The annotations written with the key (`None`: removed), the refresh of a move marked
    /// pending when `refreshing`.
    pub fn annotations(&self, refreshing: bool) -> BTreeMap<String, Option<String>> {
        let mut annotations = BTreeMap::new();
        if let Some(from) = self.rescued_from {
            annotations.insert(
                RESCUED_FROM_ANNOTATION.to_string(),
                from.map(|s| s.to_string()),
            );
        }
        if let Some(record) = &self.moves_record {
            annotations.insert(MOVES_ANNOTATION.to_string(), Some(record.clone()));
        }
        if self.moves && refreshing {
            annotations.insert(
                REFRESH_PENDING_ANNOTATION.to_string(),
                Some(self.shard.to_string()),
            );
        }
        if self.handover {
            annotations.insert(HANDOVER_ANNOTATION.to_string(), None);
        }
        annotations
    }
}

/// What one pass decides.
#[derive(Debug)]
pub struct Pass {
    /// The Secrets to rewrite, in Secret name order.
    pub writes: Vec<KeyWrite>,
    /// Clusters whose Argo CD controller changes once the writes land (the writes that
    /// [`KeyWrite::moves`]).
    pub moved_clusters: u64,
    /// Their apps.
    pub moved_apps: u64,
    /// Busiest shard over the mean after the pass, over the shards clusters may move onto.
    pub balance: f64,
    /// Every shard of Argo CD after the pass: its clusters and apps.
    pub shards: BTreeMap<ShardId, ShardFigures>,
    /// Secrets the balancer leaves as they are, and why.
    pub left_out: Vec<String>,
    /// Why the pass writes nothing at all, if so.
    pub held: Option<String>,
    /// Secrets read with a refresh pending, in name order.
    pub pending: Vec<Pending>,
    /// The band as this pass leaves it: the next pass's [`Inputs::band`].
    pub band: Hysteresis,
    /// Clusters that would have moved for balance but were moved less than the minimum time
    /// ago, have a sync running, or weigh more than the hourly budget has left.
    pub held_back: u64,
}

/// What `placement` gives each shard.
fn figures_of(placement: &Assignment) -> BTreeMap<ShardId, ShardFigures> {
    placement
        .shard_loads()
        .iter()
        .map(|(&shard, load)| {
            let figures = ShardFigures {
                units: load.clusters,
                slices: load.clusters,
                items: load.apps,
                shared: 0,
            };
            (shard, figures)
        })
        .collect()
}

/// Where a cluster runs now, as far as every running controller pod agrees.
fn home(cluster: &Cluster, now: Option<ShardId>, shards: &Shards) -> Option<ShardId> {
    match cluster.pin {
        Some(key) => (key < shards.agreed).then_some(key),
        // Argo CD's algorithm places it alike on every pod only if they all read with one count.
        None => now.filter(|_| shards.uniform),
    }
}

/// The value of annotation `key` of each Secret that has it, by Secret UID.
fn annotated(secrets: &[Secret], key: &str) -> BTreeMap<String, String> {
    secrets
        .iter()
        .filter_map(|s| Some((s.uid()?, s.annotations().get(key)?.clone())))
        .collect()
}

/// The clusters whose Secret says to keep its key ([`KEEP_SHARD_ANNOTATION`]), by UID.
fn kept(secrets: &[Secret]) -> BTreeSet<String> {
    annotated(secrets, KEEP_SHARD_ANNOTATION)
        .into_iter()
        .filter(|(_, v)| argocd::parse_go_bool(v) == Some(true))
        .map(|(id, _)| id)
        .collect()
}

/// The clusters the balancer moves, by id: those of a cluster Secret it may write, not
/// annotated [`KEEP_SHARD_ANNOTATION`]. Argo CD's own cluster without a Secret is not one.
pub fn movable(secrets: &[Secret], fleet: &LiveFleet) -> BTreeSet<String> {
    let kept = kept(secrets);
    argocd::pin_targets(secrets, fleet)
        .0
        .into_iter()
        .map(|t| t.id)
        .filter(|id| !kept.contains(id))
        .collect()
}

/// Decides one pass. Every cluster Argo CD shards gets a key (so that Argo CD's algorithm no
/// longer decides), except those annotated with [`KEEP_SHARD_ANNOTATION`]; a key that already
/// names the planned shard (spelled as Argo CD reads it) is not rewritten. Keys name only
/// shards every running pod reads alike and a Ready pod serves ([`Shards`]): a cluster on a
/// shard at or above the agreed count, or on a shard down past the grace period, moves at once
/// whatever the budget; one on a shard down for less waits where it is. A pass fed the Secrets
/// its own writes produced writes nothing, unless the busiest shard is above the target and a
/// move can lower it.
pub fn decide(inputs: &Inputs<'_>) -> Result<Pass, AssignError> {
    let Inputs {
        fleet,
        secrets,
        algorithm,
        shards,
        strategy,
        band,
        damping,
        now: time,
    } = *inputs;
    let (targets, mut left_out) = argocd::pin_targets(secrets, fleet);
    let mut pending: Vec<Pending> = secrets
        .iter()
        .filter(|s| s.annotations().contains_key(REFRESH_PENDING_ANNOTATION))
        .filter_map(|s| {
            Some(Pending {
                secret: s.metadata.name.clone()?,
                id: s.uid()?,
                resource_version: s.resource_version()?,
            })
        })
        .collect();
    pending.sort_by(|a, b| a.secret.cmp(&b.secret));
    let annotated = |key: &str| annotated(secrets, key);
    let kept = kept(secrets);
    let rescued: BTreeMap<String, ShardId> = annotated(RESCUED_FROM_ANNOTATION)
        .into_iter()
        .filter_map(|(id, v)| Some((id, v.trim().parse().ok()?)))
        .collect();
    let balanced: BTreeSet<String> = targets
        .iter()
        .map(|t| t.id.clone())
        .filter(|id| !kept.contains(id))
        .collect();
    for target in targets.iter().filter(|t| kept.contains(&t.id)) {
        left_out.push(format!(
            "Secret {:?} left as it is: annotated {KEEP_SHARD_ANNOTATION}",
            target.secret
        ));
    }

    // Where Argo CD runs each cluster now: the previous placement. Its pins are the balancer's
    // own state, not constraints, except where the balancer may not write.
    let now =
        planning::argocd_placement_with(fleet, algorithm, shards.agreed.max(1), &BTreeMap::new())?;
    if let Some(why) = &shards.hold {
        // Nothing is placed: the figures are Argo CD's placement as it stands.
        return Ok(Pass {
            writes: Vec::new(),
            moved_clusters: 0,
            moved_apps: 0,
            balance: now.balance().max_over_mean,
            shards: figures_of(&now),
            left_out,
            held: Some(why.clone()),
            pending,
            band,
            held_back: 0,
        });
    }
    // The moves of the last hour, by cluster id: the minimum time and the budget count them.
    let since = time - BUDGET_WINDOW;
    let history: BTreeMap<String, Vec<Move>> = annotated(MOVES_ANNOTATION)
        .into_iter()
        .map(|(id, value)| (id, moves_since(&value, since)))
        .filter(|(_, moves)| !moves.is_empty())
        .collect();
    let total: u64 = fleet.clusters.iter().map(Cluster::load).sum();
    let budget = u64::from(damping.hourly_budget_percent).saturating_mul(total) / 100;
    let spent: u64 = history.values().flatten().map(|m| m.load).sum();
    let budget_left = budget.saturating_sub(spent);
    let settle_until = SignedDuration::from_secs(damping.min_move_interval.into());
    let sync_wait = SignedDuration::from_secs(damping.sync_wait.into());
    let syncing = |id: &str| {
        fleet
            .syncing
            .get(id)
            .is_some_and(|&started| time < started + sync_wait)
    };
    let resting = |id: &str| {
        history
            .get(id)
            .and_then(|moves| moves.last())
            .is_some_and(|last| time < last.at + settle_until)
    };
    let mut waiting: BTreeMap<ShardId, (u64, u64)> = BTreeMap::new();
    let mut voluntary: BTreeMap<String, u64> = BTreeMap::new();
    let mut staying: BTreeSet<String> = BTreeSet::new();
    let mut clusters = Vec::new();
    let mut homes: BTreeMap<String, ShardId> = BTreeMap::new();
    let mut going: BTreeMap<String, ShardId> = BTreeMap::new();
    for c in &fleet.clusters {
        // Parked by an earlier pass for a handover: no controller has it, so it is placed
        // anew, where it was going if it may still go there.
        let parked = fleet.parked.get(&c.id);
        let placed = now.shard_of(&c.id);
        if placed.is_none() && parked.is_none() {
            continue;
        }
        if let Some(&to) = parked.filter(|&&to| shards.ready.contains(to)) {
            going.insert(c.id.clone(), to);
        }
        let home = placed.and_then(|p| home(c, Some(p), shards));
        if !balanced.contains(&c.id) {
            // Never written: it counts where it runs, if clusters may move there.
            if let Some(home) = home.filter(|h| shards.ready.contains(*h)) {
                clusters.push(Cluster {
                    pin: Some(home),
                    weight: None,
                    ..c.clone()
                });
            }
            continue;
        }
        if let Some(home) = home.filter(|h| shards.down.contains(h)) {
            // Its controller may be back within the grace period: it stays, and nothing moves.
            let w = waiting.entry(home).or_default();
            *w = (w.0 + 1, w.1 + c.apps);
            continue;
        }
        let serving = home.filter(|h| shards.ready.contains(*h));
        // Back from a rescue, unless a sync runs where it is now.
        let back = rescued
            .get(&c.id)
            .copied()
            .filter(|h| shards.ready.contains(*h))
            .filter(|_| serving.is_none() || !syncing(&c.id));
        // Free to move for balance: home on a shard clusters may stay on, no way back to take.
        let free = serving.filter(|_| back.is_none());
        if free.is_some() {
            voluntary.insert(c.id.clone(), c.load());
        }
        // Moved too recently, syncing, or heavier than the budget has left: it stays home.
        let stays = free.filter(|_| resting(&c.id) || syncing(&c.id) || c.load() > budget_left);
        if stays.is_some() {
            staying.insert(c.id.clone());
        }
        clusters.push(Cluster {
            pin: back.or(stays),
            weight: None,
            ..c.clone()
        });
        if let Some(home) = home {
            homes.insert(c.id.clone(), home);
        }
    }
    let previous: PreviousPlacement = homes
        .iter()
        .chain(&going)
        .map(|(id, &s)| (id.clone(), s))
        .collect();
    let place = |extra_moves: u32| {
        let config = StrategyConfig {
            max_extra_moves: extra_moves,
            ..*strategy
        };
        assign(&config, &clusters, &shards.ready, Some(&previous))
    };
    // Only the moves that must happen: the placement the start and stop thresholds judge.
    let forced = place(0)?;
    let mut band = band;
    let mut planned = forced;
    let mut held_back = 0;
    if band.allows_moves(planned.balance().max_over_mean) {
        let moved =
            |placement: &Assignment, id: &str| placement.shard_of(id) != homes.get(id).copied();
        // The most extra moves the strategy allows whose load the hourly budget has left.
        for extra in (1..=strategy.max_extra_moves).rev() {
            let candidate = place(extra)?;
            let load: u64 = voluntary
                .iter()
                .filter(|(id, _)| moved(&candidate, id))
                .map(|(_, load)| load)
                .sum();
            if load <= budget_left {
                planned = candidate;
                break;
            }
        }
        // The clusters that stayed only because of the minimum time or the budget, so that
        // the report can say why a pass above the target moved less.
        if !staying.is_empty() {
            let unpinned: Vec<Cluster> = clusters
                .iter()
                .map(|c| Cluster {
                    pin: c.pin.filter(|_| !staying.contains(&c.id)),
                    ..c.clone()
                })
                .collect();
            let unheld = assign(strategy, &unpinned, &shards.ready, Some(&previous))?;
            held_back = staying.iter().filter(|id| moved(&unheld, id)).count() as u64;
        }
    }

    let loads: BTreeMap<&str, u64> = clusters.iter().map(|c| (c.id.as_str(), c.load())).collect();
    let mut writes = Vec::new();
    for t in targets.into_iter().filter(|t| balanced.contains(&t.id)) {
        let Some(shard) = planned.shard_of(&t.id) else {
            continue;
        };
        let home = homes.get(&t.id).copied();
        let rescued_from = match (rescued.get(&t.id), home) {
            // Leaving a dead or draining shard: remember it (the first one, if rescued twice).
            (None, Some(home))
                if shards.dead.contains(&home) || shards.draining.contains(&home) =>
            {
                Some(Some(home))
            }
            // Back home, or home is gone for good.
            (Some(&from), _) if from == shard || from >= shards.agreed => Some(None),
            _ => None,
        };
        let key_differs = t.key.as_deref() != Some(shard.to_string().as_str());
        if key_differs || rescued_from.is_some() {
            let moves = home != Some(shard);
            // Off a dead shard, nobody reconciles it now.
            let handover = moves
                && !home.is_some_and(|h| shards.dead.contains(&h))
                && !shardwise_runtime::failpoints::seeded(
                    shardwise_runtime::failpoints::SKIP_BALANCER_HANDOVER,
                );
            let moves_record = moves.then(|| {
                let mut record = history.get(&t.id).cloned().unwrap_or_default();
                record.push(Move {
                    at: time,
                    load: loads.get(t.id.as_str()).copied().unwrap_or(0),
                });
                moves_value(&record)
            });
            writes.push(KeyWrite {
                target: t,
                shard,
                rescued_from,
                moves,
                handover,
                moves_record,
            });
        }
    }
    let apps: BTreeMap<&str, u64> = fleet
        .clusters
        .iter()
        .map(|c| (c.id.as_str(), c.apps))
        .collect();
    let moved: Vec<&str> = writes
        .iter()
        .filter(|w| w.moves)
        .map(|w| w.target.id.as_str())
        .collect();
    let moved_apps = moved
        .iter()
        .map(|id| apps.get(id).copied().unwrap_or(0))
        .sum();
    let mut figures = figures_of(&planned);
    for (shard, (count, apps)) in waiting {
        let f = figures.entry(shard).or_default();
        f.units += count;
        f.slices += count;
        f.items += apps;
    }
    Ok(Pass {
        moved_clusters: moved.len() as u64,
        moved_apps,
        balance: planned.balance().max_over_mean,
        shards: figures,
        left_out,
        held: None,
        pending,
        writes,
        band,
        held_back,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use kube::api::DynamicObject;
    use serde_json::json;
    use shard_assign::StrategyKind;

    use shardwise_plan::argocd::ArgoCdLoad;
    use shardwise_plan::shardwise::fixtures::argocd_application;

    use super::*;
    use crate::controllers::{ControllerPod, Health, ready_pod as controller};
    use std::time::{Duration, Instant};

    /// A fleet on Argo CD: cluster Secrets and Applications, changed between passes as Argo CD
    /// and the API server would (a write bumps the resourceVersion).
    struct ArgoCd {
        secrets: Vec<Secret>,
        apps: Vec<DynamicObject>,
        algorithm: StrategyConfig,
        replicas: u32,
        /// The controller pods as the balancer sees them; `None`: `replicas` Ready pods.
        shards: Option<Shards>,
        /// The thresholds, as the last pass left them.
        band: Hysteresis,
        damping: Damping,
        /// The time of the next pass.
        now: Timestamp,
        /// Loads by cluster name, in place of the apps counted (measured loads).
        loads: BTreeMap<String, u64>,
        /// sticky-balanced's extra moves per pass.
        extra_moves: u32,
        /// By cluster name, since when a sync operation runs on one of its apps.
        syncing: BTreeMap<String, Timestamp>,
    }

    /// No damping: every pass above the target may move any cluster.
    const UNDAMPED: Damping = Damping {
        min_move_interval: 0,
        hourly_budget_percent: 100,
        sync_wait: 0,
    };

    /// `replicas` Ready pods reading keys with `replicas`.
    fn all_ready(replicas: u32) -> Shards {
        let pods: Vec<ControllerPod> = (0..replicas).map(|i| controller(i, replicas)).collect();
        Health::default().observe(replicas, &pods, Instant::now(), Duration::from_secs(60))
    }

    fn secret(name: &str, shard: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("argocd".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.metadata.resource_version = Some("1".into());
        let mut data = BTreeMap::from([
            ("name".to_string(), ByteString(name.as_bytes().to_vec())),
            (
                "server".to_string(),
                ByteString(format!("https://{name}.example").into_bytes()),
            ),
        ]);
        if let Some(shard) = shard {
            data.insert("shard".into(), ByteString(shard.as_bytes().to_vec()));
        }
        s.data = Some(data);
        s
    }

    fn app(name: &str, cluster: &str) -> DynamicObject {
        argocd_application(name, json!({"name": cluster}))
    }

    impl ArgoCd {
        /// `apps[i]` apps on cluster `c{i}`, no keys, Argo CD's legacy algorithm.
        fn new(apps: &[u64], replicas: u32) -> Self {
            let mut fleet = Self {
                secrets: Vec::new(),
                apps: Vec::new(),
                algorithm: StrategyConfig::new(StrategyKind::LegacyModulo),
                replicas,
                shards: None,
                band: Hysteresis::new(
                    StrategyConfig::DEFAULT_TARGET_BALANCE,
                    StrategyConfig::DEFAULT_TARGET_BALANCE,
                ),
                damping: UNDAMPED,
                now: "2026-12-01T00:00:00Z".parse().unwrap(),
                loads: BTreeMap::new(),
                extra_moves: StrategyConfig::DEFAULT_MAX_EXTRA_MOVES,
                syncing: BTreeMap::new(),
            };
            for (i, &n) in apps.iter().enumerate() {
                fleet.add_cluster(&format!("c{i:02}"), n);
            }
            fleet
        }

        fn add_cluster(&mut self, name: &str, apps: u64) {
            self.secrets.push(secret(name, None));
            self.add_apps(name, apps);
        }

        fn add_apps(&mut self, cluster: &str, apps: u64) {
            let first = self.apps.len();
            for i in first..first + apps as usize {
                self.apps.push(app(&format!("a{i}"), cluster));
            }
        }

        fn fleet(&self) -> LiveFleet {
            let mut fleet =
                argocd::fleet(&self.secrets, &self.apps, false, ArgoCdLoad::Apps).unwrap();
            for c in &mut fleet.clusters {
                if let Some(&load) = self.loads.get(&c.name) {
                    c.apps = load;
                }
                if let Some(&started) = self.syncing.get(&c.name) {
                    fleet.syncing.insert(c.id.clone(), started);
                }
            }
            fleet
        }

        /// One pass every 30 s: decided, written, its band kept. Returns the moves it made:
        /// the Secret and the load recorded with the move.
        fn tick(&mut self) -> Vec<(String, u64)> {
            let pass = self.pass();
            self.write(&pass);
            self.band = pass.band;
            let moves = pass
                .writes
                .iter()
                .filter(|w| w.moves)
                .map(|w| {
                    let record = w.moves_record.as_deref().unwrap();
                    let last = *moves_since(record, Timestamp::MIN).last().unwrap();
                    assert_eq!(last.at, self.now);
                    (w.target.secret.clone(), last.load)
                })
                .collect();
            self.now += SignedDuration::from_secs(30);
            moves
        }

        fn pass(&self) -> Pass {
            let fleet = self.fleet();
            let strategy = StrategyConfig {
                max_extra_moves: self.extra_moves,
                ..StrategyConfig::new(StrategyKind::StickyBalanced)
            };
            let shards = self
                .shards
                .clone()
                .unwrap_or_else(|| all_ready(self.replicas));
            decide(&Inputs {
                fleet: &fleet,
                secrets: &self.secrets,
                algorithm: &self.algorithm,
                shards: &shards,
                strategy: &strategy,
                band: self.band,
                damping: &self.damping,
                now: self.now,
            })
            .unwrap()
        }

        /// What the API server does with the writes: the key set, the version bumped.
        fn write(&mut self, pass: &Pass) {
            for w in &pass.writes {
                let s = self
                    .secrets
                    .iter_mut()
                    .find(|s| s.name_any() == w.target.secret)
                    .unwrap();
                assert_eq!(
                    s.metadata.resource_version.as_ref(),
                    Some(&w.target.resource_version)
                );
                let data = s.data.get_or_insert_default();
                data.insert("shard".into(), ByteString(w.shard.to_string().into_bytes()));
                let annotations = s.metadata.annotations.get_or_insert_default();
                for (key, value) in w.annotations(false) {
                    match value {
                        Some(value) => annotations.insert(key, value),
                        None => annotations.remove(&key),
                    };
                }
                let version: u64 = s
                    .metadata
                    .resource_version
                    .as_deref()
                    .unwrap()
                    .parse()
                    .unwrap();
                s.metadata.resource_version = Some((version + 1).to_string());
            }
        }

        /// What a balancer stopped between the two writes of a handover leaves: the key
        /// parked, the annotation naming the shard it was going to.
        fn park(&mut self, name: &str, to: ShardId) {
            let s = self
                .secrets
                .iter_mut()
                .find(|s| s.name_any() == name)
                .unwrap();
            s.data.get_or_insert_default().insert(
                "shard".into(),
                ByteString(argocd::PARKED_KEY.as_bytes().to_vec()),
            );
            s.metadata
                .annotations
                .get_or_insert_default()
                .insert(HANDOVER_ANNOTATION.into(), to.to_string());
            s.metadata.resource_version = Some("99".into());
        }

        /// Passes (each written) until one writes nothing: the passes that wrote, the moves.
        fn settle(&mut self) -> (u32, u64) {
            let (mut passes, mut moves) = (0, 0);
            loop {
                let pass = self.pass();
                if pass.writes.is_empty() {
                    return (passes, moves);
                }
                assert!(passes < 50, "no fixpoint after 50 passes");
                passes += 1;
                moves += pass.moved_clusters;
                self.write(&pass);
            }
        }

        fn key(&self, name: &str) -> Option<String> {
            let s = self.secrets.iter().find(|s| s.name_any() == name)?;
            let bytes = s.data.as_ref()?.get("shard")?;
            Some(String::from_utf8(bytes.0.clone()).unwrap())
        }

        fn balance(&self) -> f64 {
            self.pass().balance
        }

        /// The Secrets whose key names `shard`.
        fn on(&self, shard: &str) -> BTreeSet<String> {
            self.secrets
                .iter()
                .map(|s| s.name_any())
                .filter(|n| self.key(n).as_deref() == Some(shard))
                .collect()
        }
    }

    /// Argo CD's placement of `fleet` as it stands: apps per shard.
    fn argocd_loads(argocd: &ArgoCd) -> Vec<u64> {
        let fleet = argocd.fleet();
        let placed = planning::argocd_placement_with(
            &fleet,
            &argocd.algorithm,
            argocd.replicas,
            &BTreeMap::new(),
        )
        .unwrap();
        (0..argocd.replicas)
            .map(|s| placed.shard_loads().get(&s).map_or(0, |l| l.apps))
            .collect()
    }

    fn max_over_mean(loads: &[u64]) -> f64 {
        let total: u64 = loads.iter().sum();
        *loads.iter().max().unwrap() as f64 * loads.len() as f64 / total as f64
    }

    #[test]
    fn the_first_pass_pins_every_cluster_and_moves_within_the_budget() {
        let sizes = [40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5];
        let mut argocd = ArgoCd::new(&sizes, 3);
        let before = argocd_loads(&argocd);
        let pass = argocd.pass();
        // Every cluster gets a key, even those that stay where Argo CD runs them.
        assert_eq!(pass.writes.len(), sizes.len());
        let budget = u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES);
        assert!(pass.moved_clusters <= budget, "{pass:?}");
        argocd.write(&pass);
        for i in 0..sizes.len() {
            assert!(argocd.key(&format!("c{i:02}")).is_some());
        }
        // Argo CD, honouring the keys, now runs what the pass planned.
        let after = argocd_loads(&argocd);
        let planned: Vec<u64> = (0..3).map(|s| pass.shards[&s].items).collect();
        assert_eq!(after, planned);
        assert!(max_over_mean(&after) < max_over_mean(&before));
        assert!((max_over_mean(&after) - pass.balance).abs() < 1e-9);
    }

    #[test]
    fn a_pass_names_the_clusters_it_moves_and_the_fleet_their_applications() {
        let mut argocd = ArgoCd::new(&[40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5], 3);
        let fleet = argocd.fleet();
        let shard_now = |argocd: &ArgoCd, id: &str| {
            planning::argocd_placement_with(
                &argocd.fleet(),
                &argocd.algorithm,
                argocd.replicas,
                &BTreeMap::new(),
            )
            .unwrap()
            .shard_of(id)
        };
        let before: BTreeMap<String, Option<ShardId>> = fleet
            .clusters
            .iter()
            .map(|c| (c.id.clone(), shard_now(&argocd, &c.id)))
            .collect();
        let pass = argocd.pass();
        argocd.write(&pass);
        let changed: Vec<String> = before
            .iter()
            .filter(|(id, shard)| shard_now(&argocd, id) != **shard)
            .map(|(id, _)| id.clone())
            .collect();
        assert!(!changed.is_empty(), "the unbalanced fleet moves: {pass:?}");
        let mut moved: Vec<String> = pass
            .writes
            .iter()
            .filter(|w| w.moves)
            .map(|w| w.target.id.clone())
            .collect();
        moved.sort();
        assert_eq!(moved, changed);
        assert_eq!(pass.moved_clusters, changed.len() as u64);
        // What the balancer refreshes for each: exactly the Applications of that cluster.
        for id in &moved {
            let cluster = fleet.clusters.iter().find(|c| &c.id == id).unwrap();
            let apps = &fleet.cluster_apps[id];
            assert_eq!(apps.len() as u64, cluster.apps);
            for (namespace, name) in apps {
                let app = argocd
                    .apps
                    .iter()
                    .find(|a| a.metadata.name.as_deref() == Some(name.as_str()))
                    .unwrap();
                assert_eq!(app.metadata.namespace.as_deref(), Some(namespace.as_str()));
                assert_eq!(app.data["spec"]["destination"]["name"], cluster.name);
            }
        }
    }

    #[test]
    fn a_settled_fleet_writes_nothing_and_keys_spelled_otherwise_are_rewritten() {
        let mut argocd = ArgoCd::new(&[30, 20, 20, 10, 10, 10], 3);
        let (passes, _) = argocd.settle();
        assert!(passes >= 1);
        let settled = argocd.pass();
        assert!(settled.writes.is_empty());
        assert_eq!(settled.moved_clusters, 0);
        // "+1" reads as 1 in Argo CD; the balancer writes the plain spelling, moving nothing.
        let key = argocd.key("c01").unwrap();
        let s = argocd
            .secrets
            .iter_mut()
            .find(|s| s.name_any() == "c01")
            .unwrap();
        s.data
            .as_mut()
            .unwrap()
            .insert("shard".into(), ByteString(format!("+{key}").into_bytes()));
        let pass = argocd.pass();
        assert_eq!(pass.writes.len(), 1);
        assert_eq!(pass.writes[0].target.secret, "c01");
        assert_eq!(pass.writes[0].shard.to_string(), key);
        assert!(!pass.writes[0].moves);
        assert_eq!(pass.moved_clusters, 0);
    }

    #[test]
    fn clusters_added_and_removed_are_balanced_within_the_budget_per_pass() {
        let mut argocd = ArgoCd::new(&[20; 9], 3);
        argocd.settle();
        // Three clusters arrive; Argo CD's algorithm runs them somewhere until pinned.
        for name in ["n0", "n1", "n2"] {
            argocd.add_cluster(name, 20);
        }
        let pass = argocd.pass();
        let written: BTreeSet<&str> = pass
            .writes
            .iter()
            .map(|w| w.target.secret.as_str())
            .collect();
        assert!(written.is_superset(&BTreeSet::from(["n0", "n1", "n2"])));
        assert!(pass.moved_clusters <= u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES));
        argocd.settle();
        assert!(
            argocd.balance() <= 1.0 + 1e-9,
            "12 equal clusters over 3 shards"
        );
        // Three clusters of shard 0 leave.
        let gone: Vec<String> = argocd
            .secrets
            .iter()
            .map(|s| s.name_any())
            .filter(|n| argocd.key(n).as_deref() == Some("0"))
            .take(3)
            .collect();
        argocd.secrets.retain(|s| !gone.contains(&s.name_any()));
        let keys = |argocd: &ArgoCd| -> BTreeMap<String, Option<String>> {
            argocd
                .secrets
                .iter()
                .map(|s| (s.name_any(), argocd.key(&s.name_any())))
                .collect()
        };
        let before = keys(&argocd);
        let (_, moves) = argocd.settle();
        // 9 equal clusters over 3 shards, one holding 1: 2 moves at best, and only those.
        assert_eq!(moves, 2);
        assert!(argocd.balance() <= 1.0 + 1e-9);
        let after = keys(&argocd);
        let changed = before.iter().filter(|(n, k)| after[*n] != **k).count();
        assert_eq!(changed, 2);
    }

    #[test]
    fn apps_piling_on_one_cluster_move_the_others_off_its_shard() {
        let mut argocd = ArgoCd::new(&[10; 12], 4);
        argocd.settle();
        assert!(argocd.balance() <= 1.0 + 1e-9);
        let hot_shard = argocd.key("c05").unwrap();
        argocd.add_apps("c05", 60);
        // 90 apps on the hot cluster's shard, 30 on each other: twice the mean.
        assert_eq!(max_over_mean(&argocd_loads(&argocd)), 2.0);
        let (passes, moves) = argocd.settle();
        // The hot cluster (70 apps) stays; its shard's other two clusters leave.
        assert_eq!(argocd.key("c05").unwrap(), hot_shard);
        assert_eq!(moves, 2, "after {passes} passes");
        let fleet = argocd.fleet();
        let on_hot = fleet
            .clusters
            .iter()
            .filter(|c| argocd.key(&c.name).as_deref() == Some(hot_shard.as_str()))
            .count();
        assert_eq!(on_hot, 1);
    }

    #[test]
    fn keys_at_or_above_the_count_move_at_once_whatever_the_budget() {
        let mut argocd = ArgoCd::new(&[10; 12], 4);
        argocd.settle();
        // Argo CD scaled to 2: the keys 2 and 3 now mean shard 0.
        argocd.replicas = 2;
        assert_eq!(argocd_loads(&argocd), vec![90, 30]);
        let first = argocd.pass();
        argocd.write(&first);
        // Every rewrite off a shard that left hands its cluster over: each is a move.
        assert_eq!(first.moved_clusters, 6);
        assert!(first.moved_clusters > u64::from(StrategyConfig::DEFAULT_MAX_EXTRA_MOVES));
        assert!(first.writes.iter().all(|w| w.moves));
        assert_eq!(argocd_loads(&argocd), vec![60, 60]);
        for i in 0..12 {
            let key: u32 = argocd.key(&format!("c{i:02}")).unwrap().parse().unwrap();
            assert!(key < 2);
        }
        assert!(argocd.pass().writes.is_empty());
    }

    /// Argo CD's controllers during a rollout: each pod reads keys with the count it started
    /// with (`ARGOCD_CONTROLLER_REPLICAS` of its own spec).
    struct Pods(Vec<ControllerPod>);

    impl Pods {
        fn new(replicas: u32) -> Self {
            Self((0..replicas).map(|i| controller(i, replicas)).collect())
        }

        fn get(&mut self, shard: u32) -> &mut ControllerPod {
            self.0.iter_mut().find(|p| p.shard == Some(shard)).unwrap()
        }

        /// The StatefulSet controller's steps to `replicas` pods reading with `replicas`:
        /// pods above the count deleted from the top, new ones created and made Ready, then
        /// every other pod replaced from the highest ordinal, the next only once the one
        /// above is Ready. `step` runs after each change.
        fn roll(&mut self, from: u32, replicas: u32, step: &mut impl FnMut(&[ControllerPod])) {
            for shard in (replicas..from).rev() {
                self.get(shard).terminating = true;
                step(&self.0);
                self.0.retain(|p| p.shard != Some(shard));
                step(&self.0);
            }
            for shard in from..replicas {
                let mut new = controller(shard, replicas);
                new.ready = false;
                self.0.push(new);
                step(&self.0);
                self.get(shard).ready = true;
                step(&self.0);
            }
            for shard in (0..from.min(replicas)).rev() {
                self.get(shard).terminating = true;
                self.get(shard).ready = false;
                step(&self.0);
                self.0.retain(|p| p.shard != Some(shard));
                step(&self.0);
                let mut new = controller(shard, replicas);
                new.ready = false;
                self.0.push(new);
                step(&self.0);
                self.get(shard).ready = true;
                step(&self.0);
            }
        }
    }

    /// The running pods (terminating ones too: their processes still reconcile) that own a
    /// cluster keyed `key`, as Argo CD decides: a key at or above a pod's count is shard 0.
    fn owners(key: u32, pods: &[ControllerPod]) -> Vec<String> {
        pods.iter()
            .filter(|p| {
                let count = p.replicas.unwrap();
                let read = if key < count { key } else { 0 };
                p.shard == Some(read)
            })
            .map(|p| p.name.clone())
            .collect()
    }

    #[test]
    fn no_cluster_has_two_owners_at_any_step_of_a_rollout_up_and_down() {
        let sizes = [40, 35, 30, 25, 20, 18, 15, 12, 10, 8, 6, 5, 30, 20, 10, 5];
        let mut argocd = ArgoCd::new(&sizes, 3);
        argocd.settle();
        let names: Vec<String> = argocd.secrets.iter().map(|s| s.name_any()).collect();
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        // Per step: whether every pod read with 4, and how many clusters were on shard 3.
        let seen: std::cell::RefCell<Vec<(bool, usize)>> = Default::default();
        let mut step = |argocd: &mut ArgoCd, target: u32, pods: &[ControllerPod]| {
            let mut seen = seen.borrow_mut();
            argocd.shards = Some(health.observe(target, pods, now, grace));
            let pass = argocd.pass();
            argocd.write(&pass);
            let mut on_new = 0;
            for name in &names {
                let key: u32 = argocd.key(name).unwrap().parse().unwrap();
                let owners = owners(key, pods);
                assert!(
                    owners.len() <= 1,
                    "step {}: {name} (key {key}) is owned by two controllers, {owners:?}: {pods:?}",
                    seen.len()
                );
                on_new += usize::from(key == 3);
            }
            seen.push((pods.iter().all(|p| p.replicas == Some(4)), on_new));
        };
        // 3 -> 4 and back, the balancer passing after every step of each rollout.
        let mut pods = Pods::new(3);
        pods.roll(3, 4, &mut |p| step(&mut argocd, 4, p));
        let up = seen.borrow().len();
        pods.roll(4, 3, &mut |p| step(&mut argocd, 3, p));
        let seen = seen.into_inner();
        assert!(up >= 10 && seen.len() >= 2 * up - 2, "{seen:?}");
        // Shard 3 got clusters only once every pod read with 4, and did get some then.
        assert!(
            seen[..up].iter().all(|&(all_new, on)| all_new || on == 0),
            "{seen:?}"
        );
        assert!(seen[up - 1].1 > 0, "{seen:?}");
        // From the first step down (the count asked is 3), no key names shard 3.
        assert!(seen[up..].iter().all(|&(_, on)| on == 0), "{seen:?}");
    }

    #[test]
    fn the_new_shard_gets_clusters_only_once_every_pod_reads_the_new_count() {
        let mut argocd = ArgoCd::new(&[10; 12], 3);
        argocd.settle();
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        let mut pods = Pods::new(3);
        pods.0.push(controller(3, 4));
        argocd.shards = Some(health.observe(4, &pods.0, now, grace));
        argocd.settle();
        let keys = |argocd: &ArgoCd| -> Vec<String> {
            argocd
                .secrets
                .iter()
                .map(|s| argocd.key(&s.name_any()).unwrap())
                .collect()
        };
        assert!(
            !keys(&argocd).contains(&"3".to_string()),
            "pods 0 to 2 read key 3 as 0"
        );
        pods = Pods::new(4);
        argocd.shards = Some(health.observe(4, &pods.0, now, grace));
        argocd.settle();
        assert_eq!(keys(&argocd).iter().filter(|k| *k == "3").count(), 3);
    }

    #[test]
    fn a_dead_shards_clusters_wait_the_grace_then_are_rescued_and_go_back_when_it_recovers() {
        let mut argocd = ArgoCd::new(&[10; 9], 3);
        argocd.settle();
        let home = argocd.on("1");
        assert_eq!(home.len(), 3);
        let start = Instant::now();
        let grace = Duration::from_secs(60);
        let mut health = Health::default();
        let mut pods = Pods::new(3);
        pods.get(1).ready = false;
        // Down within the grace: its clusters stay, and no cluster moves anywhere.
        argocd.shards = Some(health.observe(3, &pods.0, start, grace));
        let waiting = argocd.pass();
        assert!(waiting.writes.is_empty(), "{waiting:?}");
        assert_eq!(waiting.shards[&1].units, 3);
        // Past the grace: all three leave at once, each recording where it came from.
        argocd.shards = Some(health.observe(3, &pods.0, start + grace, grace));
        let rescue = argocd.pass();
        assert_eq!(rescue.moved_clusters, 3);
        // Nobody reconciles them now: no handover, the keys are written at once.
        assert!(
            rescue
                .writes
                .iter()
                .all(|w| w.rescued_from == Some(Some(1)) && w.moves && !w.handover)
        );
        argocd.write(&rescue);
        assert!(argocd.on("1").is_empty());
        assert_eq!(argocd_loads(&argocd)[1], 0);
        // Rescued and still dead: nothing more to write.
        assert!(argocd.pass().writes.is_empty());
        // Back: the same three return, and their annotations go; one with a sync running where
        // it was rescued to returns once the sync ends.
        pods.get(1).ready = true;
        argocd.shards = Some(health.observe(3, &pods.0, start + 2 * grace, grace));
        let busy = home.iter().next().unwrap().clone();
        argocd.damping.sync_wait = 600;
        argocd.syncing.insert(busy.clone(), argocd.now);
        let waiting = argocd.pass();
        let returned: BTreeSet<String> = waiting
            .writes
            .iter()
            .filter(|w| w.rescued_from == Some(None))
            .map(|w| w.target.secret.clone())
            .collect();
        assert_eq!(returned.len(), 2, "{waiting:?}");
        assert!(!returned.contains(&busy));
        assert!(waiting.writes.iter().all(|w| w.target.secret != busy));
        argocd.syncing.clear();
        let back = argocd.pass();
        assert_eq!(back.moved_clusters, 3);
        // Each leaves a live controller: handed over.
        assert!(
            back.writes
                .iter()
                .all(|w| w.rescued_from == Some(None) && w.shard == 1 && w.handover)
        );
        argocd.write(&back);
        assert_eq!(argocd.on("1"), home);
        assert!(
            argocd
                .secrets
                .iter()
                .all(|s| !s.annotations().contains_key(RESCUED_FROM_ANNOTATION))
        );
        assert!(argocd.pass().writes.is_empty());
    }

    #[test]
    fn moves_off_a_live_controller_are_handed_over_and_other_writes_are_not() {
        // Unpinned, legacy-modulo puts c00 and c02 on shard 0 and c01 on shard 1: the first
        // pass pins them where they are (no move) and moves one of shard 0's heavy pair.
        let mut argocd = ArgoCd::new(&[30, 1, 30, 1], 2);
        let first = argocd.pass();
        assert!(first.moved_clusters >= 1, "{first:?}");
        for w in &first.writes {
            assert_eq!(
                w.handover, w.moves,
                "a move off a live controller is written without a handover, or a write that moves nothing parks: {w:?}"
            );
            // The write that ends a handover takes the annotation away; a plain one has no
            // annotation to take.
            assert_eq!(
                w.annotations(false).get(HANDOVER_ANNOTATION),
                w.handover.then_some(&None),
                "{w:?}"
            );
        }
        // A key at or above the count: pods of different counts read it differently, so its
        // cluster may have a controller whichever shard it goes to.
        argocd.settle();
        let name = argocd.on("0").into_iter().next().unwrap();
        let s = argocd
            .secrets
            .iter_mut()
            .find(|s| s.name_any() == name)
            .unwrap();
        s.data
            .get_or_insert_default()
            .insert("shard".into(), ByteString(b"7".to_vec()));
        let pass = argocd.pass();
        let w = pass
            .writes
            .iter()
            .find(|w| w.target.secret == name)
            .unwrap();
        assert!(
            w.moves && w.handover,
            "a move off a live controller is written without a handover: {w:?}"
        );
    }

    #[test]
    fn a_cluster_left_parked_is_placed_where_it_was_going_and_its_handover_completed() {
        // Three clusters on four shards: one shard free.
        let mut argocd = ArgoCd::new(&[10; 3], 4);
        argocd.settle();
        let free = (0..4u32)
            .find(|s| argocd.on(&s.to_string()).is_empty())
            .unwrap();
        let name = "c01".to_string();
        let home: ShardId = argocd.key(&name).unwrap().parse().unwrap();
        // Parked on its way from its shard to the free one, then back: once parked, its shard
        // and the free one are equally free, and it goes where it was going each time.
        for to in [free, home] {
            argocd.park(&name, to);
            let pass = argocd.pass();
            assert_eq!(pass.writes.len(), 1, "{pass:?}");
            let w = &pass.writes[0];
            assert_eq!((w.target.secret.as_str(), w.shard), (name.as_str(), to));
            assert_eq!(w.target.resource_version, "99");
            // Nobody has it: it moves (refreshed, recorded) and the annotation goes.
            assert!(w.moves && w.handover && w.moves_record.is_some(), "{w:?}");
            argocd.write(&pass);
            assert_eq!(argocd.key(&name), Some(to.to_string()));
            let s = argocd
                .secrets
                .iter()
                .find(|s| s.name_any() == name)
                .unwrap();
            assert!(!s.annotations().contains_key(HANDOVER_ANNOTATION));
            assert!(argocd.pass().writes.is_empty());
        }
        // Going to a shard that is gone since: placed on a live one all the same.
        argocd.park(&name, 5);
        let pass = argocd.pass();
        assert_eq!(pass.writes.len(), 1, "{pass:?}");
        assert!(pass.writes[0].shard < 4 && pass.writes[0].handover);
    }

    #[test]
    fn a_draining_shards_clusters_leave_at_once_ready_pod_or_not_and_come_back_after() {
        let mut argocd = ArgoCd::new(&[10; 9], 3);
        argocd.settle();
        let home = argocd.on("2");
        assert_eq!(home.len(), 3);
        // Its pod Ready, but about to restart: every cluster leaves in one pass, as a rescue,
        // and none goes onto it.
        let mut shards = all_ready(3);
        shards.drain(2);
        assert!(!shards.ready.contains(2) && shards.draining.contains(&2));
        argocd.shards = Some(shards.clone());
        let drain = argocd.pass();
        assert_eq!(drain.moved_clusters, 3, "{drain:?}");
        assert!(
            drain
                .writes
                .iter()
                .all(|w| w.rescued_from == Some(Some(2)) && w.moves && w.shard != 2 && w.handover)
        );
        argocd.write(&drain);
        assert!(argocd.on("2").is_empty());
        assert!(argocd.pass().writes.is_empty());
        // Drained no more: the same three come back, annotations gone.
        argocd.shards = Some(all_ready(3));
        let back = argocd.pass();
        assert!(
            back.writes
                .iter()
                .all(|w| w.rescued_from == Some(None) && w.shard == 2)
        );
        argocd.write(&back);
        assert_eq!(argocd.on("2"), home);
    }

    #[test]
    fn only_the_clusters_of_secrets_the_balancer_writes_are_movable() {
        let mut argocd = ArgoCd::new(&[10, 10, 10], 3);
        argocd.secrets[0]
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(KEEP_SHARD_ANNOTATION.into(), "true".into());
        argocd.secrets.push(secret("orphan", Some("-1")));
        argocd.add_apps("orphan", 5);
        let fleet = argocd.fleet();
        let movable = movable(&argocd.secrets, &fleet);
        let names: BTreeSet<&str> = fleet
            .clusters
            .iter()
            .filter(|c| movable.contains(&c.id))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, BTreeSet::from(["c01", "c02"]));
    }

    #[test]
    fn nothing_moves_onto_a_shard_that_is_down() {
        let mut argocd = ArgoCd::new(&[10; 6], 3);
        argocd.settle();
        // Shard 0 is down, and a big cluster arrives: it may go to 1 or 2 only.
        argocd.add_cluster("big", 50);
        let mut pods = Pods::new(3);
        pods.get(0).ready = false;
        argocd.shards =
            Some(Health::default().observe(3, &pods.0, Instant::now(), Duration::from_secs(60)));
        let pass = argocd.pass();
        assert!(!pass.writes.is_empty());
        assert!(pass.writes.iter().all(|w| w.shard != 0), "{pass:?}");
    }

    #[test]
    fn secrets_with_a_refresh_pending_are_listed_as_read() {
        let mut argocd = ArgoCd::new(&[10; 4], 2);
        argocd.settle();
        assert!(argocd.pass().pending.is_empty());
        let s = argocd
            .secrets
            .iter_mut()
            .find(|s| s.name_any() == "c02")
            .unwrap();
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(REFRESH_PENDING_ANNOTATION.into(), "1".into());
        s.metadata.resource_version = Some("7".into());
        let pass = argocd.pass();
        assert!(
            pass.writes.is_empty(),
            "a pending refresh is no reason to write a key"
        );
        assert_eq!(
            pass.pending,
            [Pending {
                secret: "c02".into(),
                id: "uid-c02".into(),
                resource_version: "7".into(),
            }]
        );
    }

    #[test]
    fn a_held_pass_writes_nothing_and_says_why() {
        let mut argocd = ArgoCd::new(&[10; 6], 3);
        let now = Instant::now();
        let grace = Duration::from_secs(60);
        let mut unknown = Pods::new(3);
        unknown.get(2).replicas = None;
        argocd.shards = Some(Health::default().observe(3, &unknown.0, now, grace));
        let pass = argocd.pass();
        assert!(pass.writes.is_empty());
        assert!(pass.held.unwrap().contains("controller-2"));
        // No pod Ready at all: nothing to place on, and no error either.
        let mut none = Pods::new(3);
        none.0.iter_mut().for_each(|p| p.ready = false);
        argocd.shards = Some(Health::default().observe(3, &none.0, now, grace));
        let pass = argocd.pass();
        assert!(pass.writes.is_empty());
        assert!(pass.held.unwrap().contains("no controller pod is Ready"));
        assert_eq!(pass.shards.values().map(|f| f.items).sum::<u64>(), 60);
    }

    #[test]
    fn kept_orphaned_and_skipped_clusters_are_never_written_but_kept_ones_count() {
        let mut argocd = ArgoCd::new(&[], 2);
        argocd.secrets.push(secret("kept", Some("1")));
        argocd.add_apps("kept", 50);
        argocd.secrets[0]
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(KEEP_SHARD_ANNOTATION.into(), "true".into());
        argocd.secrets.push(secret("orphan", Some("-1")));
        argocd.add_apps("orphan", 50);
        let mut skipped = secret("skipped", None);
        skipped
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("argocd.argoproj.io/skip-reconcile".into(), "true".into());
        argocd.secrets.push(skipped);
        for name in ["x", "y", "z"] {
            argocd.add_cluster(name, 20);
        }
        let pass = argocd.pass();
        let written: Vec<&str> = pass
            .writes
            .iter()
            .map(|w| w.target.secret.as_str())
            .collect();
        assert_eq!(written, ["x", "y", "z"]);
        // The kept cluster's 50 apps weigh on shard 1: the three others (60) are best on 0.
        let to_zero = pass.writes.iter().filter(|w| w.shard == 0).count();
        assert_eq!(to_zero, 3);
        assert_eq!(pass.left_out.len(), 3, "{:?}", pass.left_out);
        assert!(
            pass.left_out
                .iter()
                .any(|l| l.contains(KEEP_SHARD_ANNOTATION))
        );
    }

    /// A fleet damped as the balancer's defaults damp it (the budget aside), settled first.
    fn damped(loads: &[u64], replicas: u32, damping: Damping) -> ArgoCd {
        let mut argocd = ArgoCd::new(&vec![1; loads.len()], replicas);
        for (i, &load) in loads.iter().enumerate() {
            argocd.loads.insert(format!("c{i:02}"), load);
        }
        argocd.settle();
        argocd.band = Hysteresis::new(
            Hysteresis::DEFAULT_TRIGGER,
            StrategyConfig::DEFAULT_TARGET_BALANCE,
        );
        argocd.damping = damping;
        argocd
    }

    #[test]
    fn moves_for_balance_start_above_the_trigger_and_go_on_to_the_target() {
        let mut loads = vec![100; 6];
        loads.extend([50; 6]);
        loads.extend([10; 12]);
        let mut argocd = damped(&loads, 3, UNDAMPED);
        assert!(argocd.balance() <= 1.03, "{}", argocd.balance());
        // Drifting up within the band: nothing moves.
        let busiest = |argocd: &ArgoCd| {
            let pass = argocd.pass();
            let (&shard, _) = pass.shards.iter().max_by_key(|(_, f)| f.items).unwrap();
            let on: Vec<String> = (0..loads.len())
                .map(|i| format!("c{i:02}"))
                .filter(|c| argocd.key(c) == Some(shard.to_string()))
                .collect();
            on
        };
        let first = busiest(&argocd)[0].clone();
        *argocd.loads.get_mut(&first).unwrap() += 20;
        let now = |argocd: &ArgoCd| max_over_mean(&argocd_loads(argocd));
        let within = now(&argocd);
        assert!(within > 1.03 && within <= 1.10, "{within}");
        for _ in 0..5 {
            assert_eq!(argocd.tick(), Vec::new(), "moved inside the band");
        }
        // Past the trigger: moves start, and go on until the target, not only the trigger.
        *argocd.loads.get_mut(&first).unwrap() += 60;
        assert!(now(&argocd) > 1.10);
        argocd.extra_moves = 1;
        let (mut moved, mut inside) = (0, 0);
        for _ in 0..10 {
            let before = now(&argocd);
            let moves = argocd.tick().len();
            moved += moves;
            if before <= 1.10 {
                inside += moves;
            }
        }
        assert!(moved > 0);
        assert!(inside > 0, "no pass moved inside the band once started");
        assert!(now(&argocd) <= 1.03, "stopped at {}", now(&argocd));
        assert!(!argocd.band.is_active());
    }

    /// c00 (60) and c01 (80) on shard 0, c02 (20) on shard 1, keyed so; c02 moved 20 minutes
    /// ago with a load of 30 if `c02_moved`, and c00 `moved_ago` seconds ago if at all. Moving
    /// c00 balances the two shards exactly; moving c01 only better.
    fn two_shards(damping: Damping, c02_moved: bool, moved_ago: Option<i64>) -> ArgoCd {
        let mut argocd = ArgoCd::new(&[1, 1, 1], 2);
        argocd.damping = damping;
        argocd.band = Hysteresis::new(
            Hysteresis::DEFAULT_TRIGGER,
            StrategyConfig::DEFAULT_TARGET_BALANCE,
        );
        let mut moved = Vec::new();
        if c02_moved {
            moved.push(("c02", 1_200, 30));
        }
        moved.extend(moved_ago.map(|ago| ("c00", ago, 60)));
        for (i, (name, load)) in [("c00", 60), ("c01", 80), ("c02", 20)]
            .into_iter()
            .enumerate()
        {
            argocd.loads.insert(name.into(), load);
            let mut keyed = secret(name, Some(if i < 2 { "0" } else { "1" }));
            if let Some((_, ago, load)) = moved.iter().find(|(n, _, _)| *n == name) {
                let at = argocd.now - SignedDuration::from_secs(*ago);
                keyed
                    .annotations_mut()
                    .insert(MOVES_ANNOTATION.into(), format!("{at}={load}"));
            }
            argocd.secrets[i] = keyed;
        }
        argocd
    }

    fn moved(pass: &Pass) -> Vec<&str> {
        pass.writes
            .iter()
            .filter(|w| w.moves)
            .map(|w| w.target.secret.as_str())
            .collect()
    }

    #[test]
    fn a_moved_cluster_waits_the_minimum_time_before_moving_for_balance_again() {
        let damping = Damping {
            min_move_interval: 600,
            hourly_budget_percent: 100,
            sync_wait: 0,
        };
        // Never moved, or long ago: the move that balances best.
        assert_eq!(moved(&two_shards(damping, false, None).pass()), ["c00"]);
        assert_eq!(
            moved(&two_shards(damping, false, Some(600)).pass()),
            ["c00"]
        );
        // Moved 599 s ago: it stays, and the next best step is taken (c01 and c02 swap).
        let pass = two_shards(damping, false, Some(599)).pass();
        assert_eq!(moved(&pass), ["c01", "c02"]);
        assert_eq!(pass.held_back, 1);
        // The record of a move carries the earlier ones of the hour.
        let record = pass.writes.iter().find(|w| w.moves).unwrap();
        assert_eq!(
            record.moves_record.as_deref().map(|r| r.split(',').count()),
            Some(1)
        );
    }

    #[test]
    fn a_cluster_with_a_sync_running_stays_until_the_wait_is_over_unless_it_must_move() {
        let damping = Damping {
            min_move_interval: 0,
            hourly_budget_percent: 100,
            sync_wait: 600,
        };
        let mut argocd = two_shards(damping, false, None);
        let now = argocd.now;
        argocd
            .syncing
            .insert("c00".into(), now - SignedDuration::from_secs(599));
        let pass = argocd.pass();
        assert_eq!(moved(&pass), ["c01", "c02"], "the next best step");
        assert_eq!(pass.held_back, 1);
        // Syncing for longer than the wait: it moves.
        argocd
            .syncing
            .insert("c00".into(), now - SignedDuration::from_secs(600));
        assert_eq!(moved(&argocd.pass()), ["c00"]);
        // A key no shard reads alike holds no wait: c02 moves at once, syncing or not.
        argocd
            .syncing
            .insert("c02".into(), now - SignedDuration::from_secs(1));
        argocd.secrets[2] = secret("c02", Some("7"));
        let pass = argocd.pass();
        assert!(moved(&pass).contains(&"c02"), "{pass:?}");
    }

    #[test]
    fn moves_for_balance_stay_within_the_hourly_budget() {
        let budget = |percent| Damping {
            min_move_interval: 0,
            hourly_budget_percent: percent,
            sync_wait: 0,
        };
        // 160 in all, 30 spent by c02: 100 % leaves 130, 57 % leaves 61, 56 % leaves 59, which
        // neither c00 (60) nor c01 (80) fits.
        assert_eq!(moved(&two_shards(budget(100), true, None).pass()), ["c00"]);
        let pass = two_shards(budget(57), true, None).pass();
        assert_eq!(moved(&pass), ["c00"], "91 - 30 leaves 61");
        let pass = two_shards(budget(56), true, None).pass();
        assert_eq!(moved(&pass), Vec::<&str>::new(), "89 - 30 leaves 59");
        assert_eq!(pass.held_back, 1, "c00 would have moved");
        // A move of the hour counts once it is in the record, whichever cluster it was.
        let mut argocd = two_shards(budget(100), true, Some(3_000));
        assert_eq!(moved(&argocd.pass()), ["c00"], "30 + 60 spent, 70 left");
        argocd.damping = budget(90);
        assert_eq!(
            moved(&argocd.pass()),
            Vec::<&str>::new(),
            "144 - 90 = 54 left"
        );
    }

    #[test]
    fn a_forced_move_is_not_held_back_by_the_minimum_time() {
        let loads = [100, 100, 100, 100, 100, 100];
        let damping = Damping {
            min_move_interval: 3_600,
            hourly_budget_percent: 1,
            sync_wait: 0,
        };
        let mut argocd = damped(&loads, 3, damping);
        // Every cluster just moved, and the budget is spent.
        for c in 0..6 {
            let name = format!("c{c:02}");
            let s = argocd
                .secrets
                .iter_mut()
                .find(|s| s.name_any() == name)
                .unwrap();
            s.annotations_mut().insert(
                MOVES_ANNOTATION.into(),
                format!("{}=100", argocd.now - SignedDuration::from_secs(60)),
            );
        }
        // Shard 2 leaves: its clusters move at once all the same.
        argocd.replicas = 2;
        let pass = argocd.pass();
        let leaving: Vec<&KeyWrite> = pass.writes.iter().filter(|w| w.moves).collect();
        assert_eq!(leaving.len(), 2, "{pass:?}");
        assert!(pass.writes.iter().all(|w| w.shard < 2));
    }

    #[test]
    fn the_moves_of_the_last_hour_are_recorded_and_older_ones_dropped() {
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let value = "2026-12-01T10:59:00Z=5, 2026-12-01T11:30:00Z=7,garbage,2026-12-01T11:10:00Z=x,2026-12-01T11:05:00Z=3";
        let moves = moves_since(value, now - BUDGET_WINDOW);
        let loads: Vec<u64> = moves.iter().map(|m| m.load).collect();
        assert_eq!(loads, [3, 7]);
        assert_eq!(
            moves_value(&moves),
            "2026-12-01T11:05:00Z=3,2026-12-01T11:30:00Z=7"
        );
    }

    /// A move made in a pass: when, the cluster, its load, and the fleet's load then.
    type Made = (Timestamp, String, u64, u64);

    /// 24 hours of passes every 30 s while each cluster's load moves at random within ±5 % of
    /// its own: the moves made.
    fn noisy_day(damping: Damping, band: Hysteresis) -> Vec<Made> {
        use rand::{Rng, SeedableRng};
        let base: Vec<u64> = (0..24).map(|i| 20 + 3 * i).collect();
        let mut argocd = damped(&base, 3, damping);
        argocd.band = band;
        let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut moves = Vec::new();
        for _ in 0..24 * 120 {
            for (i, &b) in base.iter().enumerate() {
                let load = b * random.random_range(950..=1050) / 1000;
                argocd.loads.insert(format!("c{i:02}"), load);
            }
            let total = argocd.loads.values().sum();
            let at = argocd.now;
            moves.extend(argocd.tick().into_iter().map(|(c, l)| (at, c, l, total)));
        }
        moves
    }

    /// The first pair of moves of one cluster closer than `interval` seconds, and the first
    /// hour whose moves carry more than `percent` % of the fleet's load when the last was made.
    fn broken_rules(
        moves: &[Made],
        interval: i64,
        percent: u64,
    ) -> (Option<String>, Option<String>) {
        let mut last: BTreeMap<&str, Timestamp> = BTreeMap::new();
        let (mut too_soon, mut over) = (None, None);
        for (at, cluster, _, total) in moves {
            if let Some(before) = last.insert(cluster, *at) {
                let gap = at.duration_since(before).as_secs();
                if gap < interval && too_soon.is_none() {
                    too_soon = Some(format!("{cluster} moved twice {gap} s apart"));
                }
            }
            let window: u64 = moves
                .iter()
                .filter(|(t, ..)| t <= at && at.duration_since(*t) < BUDGET_WINDOW)
                .map(|(_, _, load, _)| load)
                .sum();
            if window * 100 > total * percent && over.is_none() {
                over = Some(format!(
                    "{window} moved in the hour to {at}, over {percent} % of {total}"
                ));
            }
        }
        (too_soon, over)
    }

    /// The loads of a drifting day at pass `n` (of 2,880, one every 30 s): 24 clusters of 20 to
    /// 89, the first six growing fourfold over the day, each within ±5 % noise.
    fn drifting_loads(n: u64, random: &mut rand_chacha::ChaCha8Rng) -> Vec<u64> {
        use rand::Rng;
        (0..24u64)
            .map(|i| {
                let base = 20 + 3 * i;
                let drifted = if i < 6 {
                    base + 3 * base * n / 2_880
                } else {
                    base
                };
                drifted * random.random_range(950..=1050) / 1000
            })
            .collect()
    }

    /// Longest-processing-time partitions under two-phase hysteresis, as argocd-autoscaler
    /// describes its evaluator (this is a reading of its design, not its code): each poll
    /// proposes greedy-minimum's partition of the loads as they are (phase one); the partition
    /// proposed most often over the stabilization period is applied once it has stayed the most
    /// proposed for the whole period (phase two).
    struct LptHysteresis {
        stabilization: usize,
        proposals: std::collections::VecDeque<Vec<ShardId>>,
        most_wanted: Option<(Vec<ShardId>, usize)>,
        current: Vec<ShardId>,
    }

    impl LptHysteresis {
        /// One poll over `loads` on `shards` shards: the load moved.
        fn poll(&mut self, loads: &[u64], shards: u32) -> u64 {
            let clusters: Vec<Cluster> = loads
                .iter()
                .enumerate()
                .map(|(i, &l)| Cluster::new(format!("c{i:02}"), l))
                .collect();
            let lpt = assign(
                &StrategyConfig::new(StrategyKind::GreedyMinimum),
                &clusters,
                &shard_assign::ShardSet::contiguous(shards),
                None,
            )
            .unwrap();
            let proposal: Vec<ShardId> = clusters
                .iter()
                .map(|c| lpt.shard_of(&c.id).unwrap())
                .collect();
            if self.current.is_empty() {
                self.current = proposal.clone();
            }
            self.proposals.push_back(proposal);
            if self.proposals.len() > self.stabilization {
                self.proposals.pop_front();
            }
            let mut counts: BTreeMap<&Vec<ShardId>, usize> = BTreeMap::new();
            for p in &self.proposals {
                *counts.entry(p).or_default() += 1;
            }
            let top = counts.values().copied().max().unwrap_or(0);
            let mode = self
                .proposals
                .iter()
                .rev()
                .find(|p| counts[p] == top)
                .cloned()
                .unwrap();
            let polls = match self.most_wanted.take() {
                Some((wanted, polls)) if wanted == mode => polls + 1,
                _ => 1,
            };
            self.most_wanted = Some((mode.clone(), polls));
            if polls < self.stabilization || mode == self.current {
                return 0;
            }
            let moved = (0..loads.len())
                .filter(|&i| mode[i] != self.current[i])
                .map(|i| loads[i])
                .sum();
            self.current = mode;
            moved
        }
    }

    fn shard_loads(loads: &[u64], placement: &[ShardId], shards: u32) -> Vec<u64> {
        (0..shards)
            .map(|s| {
                (0..loads.len())
                    .filter(|&i| placement[i] == s)
                    .map(|i| loads[i])
                    .sum()
            })
            .collect()
    }

    /// Balance and churn over the drifting day: the balancer at its defaults against LPT under
    /// two-phase hysteresis (a 10-minute stabilization), on the same
    /// loads, side by side. `cargo test -p shardwise-balancer --bin shardwise-balancer
    /// lpt -- --nocapture` prints the figures (docs/benchmarks.md).
    #[test]
    fn over_a_drifting_day_the_balancer_moves_less_than_lpt_under_two_phase_hysteresis() {
        use rand::SeedableRng;
        let shards = 3;
        let damping = Damping {
            min_move_interval: 1_800,
            hourly_budget_percent: 10,
            sync_wait: 0,
        };
        let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let mut argocd = damped(&drifting_loads(0, &mut random), shards, damping);
        let mut lpt = LptHysteresis {
            stabilization: 20,
            proposals: Default::default(),
            most_wanted: None,
            current: Vec::new(),
        };
        let (mut balancer_moved, mut lpt_moved) = (0u64, 0u64);
        let (mut balancer_balance, mut lpt_balance) = (Vec::new(), Vec::new());
        // Both see each cluster's mean over the last hour, as argocd-autoscaler reads its
        // metrics over an hour (it takes a p95).
        let mut hour: std::collections::VecDeque<Vec<u64>> = Default::default();
        for n in 0..2_880 {
            hour.push_back(drifting_loads(n, &mut random));
            if hour.len() > 120 {
                hour.pop_front();
            }
            let loads: Vec<u64> = (0..24)
                .map(|i| hour.iter().map(|l| l[i]).sum::<u64>() / hour.len() as u64)
                .collect();
            for (i, &l) in loads.iter().enumerate() {
                argocd.loads.insert(format!("c{i:02}"), l);
            }
            balancer_moved += argocd.tick().iter().map(|(_, l)| l).sum::<u64>();
            balancer_balance.push(max_over_mean(&argocd_loads(&argocd)));
            lpt_moved += lpt.poll(&loads, shards);
            lpt_balance.push(max_over_mean(&shard_loads(&loads, &lpt.current, shards)));
        }
        let mean = |b: &[f64]| b.iter().sum::<f64>() / b.len() as f64;
        let worst = |b: &[f64]| b.iter().copied().fold(0.0, f64::max);
        eprintln!(
            "| approach | max/mean, mean over the day | max/mean, worst | load moved per hour |\n|---|---:|---:|---:|\n| shardwise-balancer (defaults) | {:.3} | {:.3} | {:.1} |\n| LPT, two-phase hysteresis | {:.3} | {:.3} | {:.1} |\nratio, balancer / LPT: mean balance {:.3}, load moved {:.3}",
            mean(&balancer_balance),
            worst(&balancer_balance),
            balancer_moved as f64 / 24.0,
            mean(&lpt_balance),
            worst(&lpt_balance),
            lpt_moved as f64 / 24.0,
            mean(&balancer_balance) / mean(&lpt_balance),
            balancer_moved as f64 / lpt_moved.max(1) as f64,
        );
        assert!(
            lpt_moved > 0,
            "LPT under hysteresis moved nothing: the day does not drift"
        );
        assert!(
            balancer_moved < lpt_moved,
            "the balancer moved {balancer_moved}, LPT under hysteresis {lpt_moved}"
        );
        assert!(
            mean(&balancer_balance) <= Hysteresis::DEFAULT_TRIGGER.as_f64(),
            "the balancer's mean max/mean {:.3} is above its trigger",
            mean(&balancer_balance)
        );
    }

    #[test]
    fn noisy_loads_for_a_day_move_no_cluster_within_the_minimum_time_nor_past_the_budget() {
        let target = StrategyConfig::DEFAULT_TARGET_BALANCE;
        let damping = Damping {
            min_move_interval: 1_800,
            hourly_budget_percent: 10,
            sync_wait: 0,
        };
        // The balancer's defaults: the noise stays under the trigger.
        let band = Hysteresis::new(Hysteresis::DEFAULT_TRIGGER, target);
        let moves = noisy_day(damping, band);
        assert_eq!(broken_rules(&moves, 1_800, 10), (None, None));
        // No band: moves start on noise, and only the minimum time and the budget hold them.
        let banded_off = noisy_day(damping, Hysteresis::new(target, target));
        assert!(banded_off.len() > 10, "{} moves", banded_off.len());
        assert_eq!(broken_rules(&banded_off, 1_800, 10), (None, None));
        // Undamped, the same day breaks both rules: the test can see them broken.
        let free = noisy_day(UNDAMPED, Hysteresis::new(target, target));
        let (too_soon, over) = broken_rules(&free, 1_800, 10);
        assert!(too_soon.is_some() && over.is_some(), "{} moves", free.len());
        assert!(
            moves.len() * 10 < free.len() && banded_off.len() < free.len(),
            "{} moves with the defaults, {} without the band, {} undamped",
            moves.len(),
            banded_off.len(),
            free.len()
        );
    }
}
