//! The plan of a live fleet, without I/O: where each cluster is now, where each strategy would
//! put it at `--replicas` and at `--to` replicas, and what moves on the way. Placement and diffs
//! are `shard_assign`'s; this module only arranges them for a report.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use shard_assign::{
    AssignError, Assignment, AssignmentDiff, Balance, Cluster, KeyRange, PreviousPlacement,
    ShardId, ShardSet, SliceSwitch, SlicedAssignment, Slicing, StrategyConfig, StrategyKind,
    Warning, assign, assign_sliced, count_in, slice_id,
};

use crate::argocd::ArgoCdLoad;
use crate::measured::MeasuredSummary;
use crate::{FleetSource, LiveFleet};

/// How the current placement is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Current {
    /// Recorded on the objects (shard labels of clusters, and of the slices of cut ones).
    Recorded,
    /// Not recorded: computed with the strategy the controller runs (Argo CD).
    Computed(StrategyConfig),
}

/// What to plan, besides the fleet.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// Where the fleet was read.
    pub source: FleetSource,
    /// The API server it was read from.
    pub server: String,
    /// The namespace it was read from.
    pub namespace: String,
    /// Replicas now, and where that number was read.
    pub replicas: u32,
    /// Where `replicas` was read.
    pub replicas_origin: String,
    /// Replicas to plan for.
    pub to: u32,
    /// How the current placement is known.
    pub current: Current,
    /// The strategies to plan with, in the order to report them.
    pub strategies: Vec<StrategyConfig>,
    /// Which strategies cut hot clusters into slices.
    pub slicing: SliceSwitch,
    /// Argo CD's settings as read, for `--source argocd`.
    pub argocd: Option<ArgoCdSettings>,
}

/// How Argo CD is configured, and where each setting was read.
#[derive(Clone, Debug, Serialize)]
pub struct ArgoCdSettings {
    /// Argo CD's name of its sharding algorithm.
    pub algorithm: &'static str,
    /// Where `algorithm` was read.
    pub algorithm_origin: String,
    /// The control plane's namespace, then the patterns of `application.namespaces`.
    pub app_namespaces: Vec<String>,
    /// Where `app_namespaces` was read.
    pub app_namespaces_origin: String,
    /// What an Application weighs.
    pub load: ArgoCdLoad,
}

/// The whole plan; its JSON form is documented in docs/plan.md.
#[derive(Debug, Serialize)]
pub struct PlanReport {
    /// Where the fleet was read.
    pub source: FleetSource,
    /// The API server it was read from.
    pub server: String,
    /// The namespace it was read from.
    pub namespace: String,
    /// Replicas now and to plan for.
    pub replicas: Replicas,
    /// The fleet's totals.
    pub fleet: FleetTotals,
    /// Where the clusters are now.
    pub current: CurrentPlacement,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Argo CD's settings as read, for an Argo CD fleet.
    pub argocd: Option<ArgoCdSettings>,
    /// With `--load measured`: where the weights came from. `load` is then in thousandths of an
    /// app of the fleet's average measured cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredSummary>,
    /// What the reader should know about the fleet as read.
    pub notes: Vec<String>,
    /// What hurts the fleet as read (Argo CD: orphaned clusters, ignored Secrets, ...).
    pub warnings: Vec<String>,
    /// Every cluster, in name order.
    pub clusters: Vec<ClusterRow>,
    /// The plan of each strategy asked for.
    pub strategies: Vec<StrategyPlan>,
}

/// Replicas now, to plan for, and where the count now was read.
#[derive(Debug, Serialize)]
pub struct Replicas {
    /// Replicas now.
    pub from: u32,
    /// Replicas to plan for.
    pub to: u32,
    /// Where `from` was read.
    pub origin: String,
}

/// The fleet's size.
#[derive(Debug, Serialize)]
pub struct FleetTotals {
    /// Clusters in the fleet.
    pub clusters: usize,
    /// Apps counted toward a cluster.
    pub apps: u64,
    /// Apps times cluster weight.
    pub load: u64,
    /// Apps that target no known cluster.
    pub unmatched_apps: u64,
    /// True when some cluster has a weight above 1, or weights are measured, so that load
    /// differs from apps.
    pub weighted: bool,
}

/// Where the clusters are now.
#[derive(Debug, Serialize)]
pub struct CurrentPlacement {
    /// `labels` or `computed`.
    pub placement: &'static str,
    /// The strategy a computed placement was made with.
    pub strategy: Option<StrategyKind>,
    /// Over the live shards `0..replicas.from`.
    pub balance: Balance,
    /// Every live shard, and any other shard a cluster or slice is recorded on.
    pub shards: Vec<CurrentShard>,
    /// Clusters, and their apps, on no shard.
    pub unplaced: Count,
    /// Clusters not on the shard they are pinned to.
    pub warnings: Vec<PinWarning>,
}

/// One shard of the current placement.
#[derive(Debug, Serialize)]
pub struct CurrentShard {
    /// The shard.
    pub shard: ShardId,
    /// Clusters with apps here: a cut cluster counts on every shard holding one of its slices.
    pub clusters: u64,
    /// Apps reconciled here.
    pub apps: u64,
    /// Their load (apps times weight).
    pub load: u64,
    /// False for a shard at or above the replica count: nothing reconciles its clusters.
    pub live: bool,
}

/// Clusters (or slices) and their apps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    /// Clusters (or slices).
    pub clusters: u64,
    /// Their apps.
    pub apps: u64,
}

/// One cluster of the fleet as read.
#[derive(Debug, Serialize)]
pub struct ClusterRow {
    /// The cluster's name.
    pub name: String,
    /// Its UID.
    pub id: String,
    /// Its apps.
    pub apps: u64,
    /// Its weight: the load of one of its apps.
    pub weight: u32,
    /// Apps times weight.
    pub load: u64,
    /// The shard it is pinned to, if any.
    pub pin: Option<ShardId>,
    /// Current shard (of a cut cluster: the one holding most of its apps); `None` when
    /// unplaced.
    pub shard: Option<ShardId>,
}

/// One strategy's plan.
#[derive(Debug, Serialize)]
pub struct StrategyPlan {
    /// The strategy.
    pub strategy: StrategyKind,
    /// Its parameters.
    pub config: StrategyConfig,
    /// The strategy's placement at `replicas.from`.
    pub at_from: Layout,
    /// The strategy's placement at `replicas.to`.
    pub at_to: Layout,
    /// From the current placement to `at_to`.
    pub moves: MoveTotals,
    /// Clusters that change shard, heaviest first.
    pub moved: Vec<MovedCluster>,
    /// Unplaced clusters and where they would go, heaviest first.
    pub placed: Vec<PlacedCluster>,
    /// About `at_to`.
    pub warnings: Vec<PinWarning>,
    /// How `at_to` cuts clusters, when the strategy slices (then `moved` and `placed` list
    /// slices, named `cluster#range`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slicing: Option<SlicePlan>,
}

/// The cut of a sliced plan at `replicas.to`.
#[derive(Debug, Serialize)]
pub struct SlicePlan {
    /// (cluster, shard) pairs beyond one per cluster: the extra caches of clusters.
    pub cache_copies: usize,
    /// Slices beyond one per cluster.
    pub extra_slices: usize,
    /// The clusters that are cut, by name.
    pub cut: Vec<CutCluster>,
}

/// A cluster the plan cuts into slices.
#[derive(Debug, Serialize)]
pub struct CutCluster {
    /// The cluster's name.
    pub cluster: String,
    /// Its UID.
    pub id: String,
    /// Its slices, in key order.
    pub slices: Vec<SliceRow>,
}

/// One slice of a cut cluster.
#[derive(Debug, Serialize)]
pub struct SliceRow {
    /// The unit id: `<cluster id>#<range>`.
    pub id: String,
    /// The range of app keys it holds.
    pub range: String,
    /// The range as a KEP-5866 selector on `metadata.uid`.
    pub selector: String,
    /// Its apps.
    pub apps: u64,
    /// The shard the plan gives it.
    pub shard: ShardId,
    /// Where the slice's apps are now: the recorded slice its range lies within, or the one
    /// holding most of its apps; `None` when its cluster is unplaced.
    pub now: Option<ShardId>,
}

/// A placement's balance and shards.
#[derive(Debug, Serialize)]
pub struct Layout {
    /// Over the live shards.
    pub balance: Balance,
    /// Every live shard.
    pub shards: Vec<ShardRow>,
}

/// One shard of a placement.
#[derive(Debug, Serialize)]
pub struct ShardRow {
    /// The shard.
    pub shard: ShardId,
    /// Clusters (or slices) placed on it.
    pub clusters: u64,
    /// Their apps.
    pub apps: u64,
    /// Their load.
    pub load: u64,
}

/// What moves from the current placement to the planned one.
#[derive(Debug, Serialize)]
pub struct MoveTotals {
    /// Clusters (or slices) that move.
    pub clusters: u64,
    /// Their apps.
    pub apps: u64,
    /// Moves off a shard that is not live at `replicas.to`.
    pub forced: Count,
    /// Moves between two shards that are both live at `replicas.to`.
    pub voluntary: Count,
    /// Unplaced clusters given a shard (not moves).
    pub placed: Count,
}

/// A cluster (or slice) that changes shard.
#[derive(Debug, Serialize)]
pub struct MovedCluster {
    /// The cluster's name (of a slice: `cluster#range`).
    pub cluster: String,
    /// Its unit id.
    pub id: String,
    /// Its apps.
    pub apps: u64,
    /// Their load.
    pub load: u64,
    /// The shard it leaves.
    pub from: ShardId,
    /// The shard it goes to.
    pub to: ShardId,
    /// True when `from` is not live at `replicas.to`.
    pub forced: bool,
}

/// An unplaced cluster (or slice) and the shard it would go to.
#[derive(Debug, Serialize)]
pub struct PlacedCluster {
    /// The cluster's name (of a slice: `cluster#range`).
    pub cluster: String,
    /// Its unit id.
    pub id: String,
    /// Its apps.
    pub apps: u64,
    /// Their load.
    pub load: u64,
    /// The shard it would go to.
    pub to: ShardId,
}

/// A cluster placed away from the shard it is pinned to.
#[derive(Debug, Serialize)]
pub struct PinWarning {
    /// The cluster's name.
    pub cluster: String,
    /// Its UID.
    pub id: String,
    /// The shard it is pinned to.
    pub pin: ShardId,
    /// The shard it is placed on instead.
    pub placed_on: ShardId,
}

/// The plan of `fleet`: where it is now, and where each strategy of `request` would put it
/// at the replicas now and at the replicas to plan for.
pub fn build(fleet: &LiveFleet, request: PlanRequest) -> Result<PlanReport, AssignError> {
    let from_shards = ShardSet::contiguous(request.replicas);
    let to_shards = ShardSet::contiguous(request.to);
    let by_id: BTreeMap<&str, &Cluster> =
        fleet.clusters.iter().map(|c| (c.id.as_str(), c)).collect();
    let current = current_assignment(fleet, &request)?;
    // What sticky-balanced keeps clusters on; the loads they were placed with are not recorded.
    let previous: PreviousPlacement = current
        .placements()
        .iter()
        .map(|(id, p)| (id.clone(), p.shard))
        .collect();
    // The same for strategies that slice: the recorded cut, each slice where it is.
    let (previous_slicing, previous_slices) = recorded_slicing(fleet, &current);

    let mut strategies = Vec::with_capacity(request.strategies.len());
    for config in &request.strategies {
        if request.slicing.slices(config.kind) {
            let place = |shards: &ShardSet| {
                assign_sliced(
                    config,
                    &request
                        .slicing
                        .config_for(config.kind)
                        .with_copy_cost(shard_assign::SliceConfig::MEASURED_COPY_COST_APPS),
                    &fleet.clusters,
                    &fleet.keys,
                    shards,
                    Some(&previous_slices),
                    &previous_slicing,
                )
            };
            let (at_from, at_to) = (place(&from_shards)?, place(&to_shards)?);
            strategies.push(sliced_plan(config, fleet, &current, &at_from, &at_to)?);
            continue;
        }
        // Where a strategy reproduces Argo CD, a pin Argo CD's replicas lack goes where Argo
        // CD sends it.
        let (mut clusters_from, _) = argocd_pin_rule(config.kind, &fleet.clusters, &from_shards);
        let (mut clusters_to, redirected) =
            argocd_pin_rule(config.kind, &fleet.clusters, &to_shards);
        keep_unpinnable(fleet, &current, &mut clusters_from);
        keep_unpinnable(fleet, &current, &mut clusters_to);
        let at_from = assign(config, &clusters_from, &from_shards, Some(&previous))?;
        let at_to = assign(config, &clusters_to, &to_shards, Some(&previous))?;
        strategies.push(strategy_plan(
            config,
            &by_id,
            &current,
            &at_from,
            &at_to,
            &redirected,
        ));
    }

    let clusters = cluster_rows(fleet, &current);
    let placement = current_placement(fleet, &current, &from_shards, request.current);

    Ok(PlanReport {
        source: request.source,
        server: request.server,
        namespace: request.namespace,
        replicas: Replicas {
            from: request.replicas,
            to: request.to,
            origin: request.replicas_origin,
        },
        fleet: FleetTotals {
            clusters: fleet.clusters.len(),
            apps: fleet.clusters.iter().map(|c| c.apps).sum(),
            load: fleet.clusters.iter().map(Cluster::load).sum(),
            unmatched_apps: fleet.unmatched_apps,
            weighted: fleet.measured.is_some()
                || fleet.clusters.iter().any(|c| c.weight.unwrap_or(1) > 1),
        },
        current: placement,
        argocd: request.argocd,
        measured: fleet.measured.clone(),
        notes: fleet.notes.clone(),
        warnings: fleet.warnings.clone(),
        clusters,
        strategies,
    })
}

/// One row per cluster, by name, with its shard now.
fn cluster_rows(fleet: &LiveFleet, current: &Assignment) -> Vec<ClusterRow> {
    let mut clusters: Vec<ClusterRow> = fleet
        .clusters
        .iter()
        .map(|c| ClusterRow {
            name: c.name.clone(),
            id: c.id.clone(),
            apps: c.apps,
            weight: c.weight.unwrap_or(1),
            load: c.load(),
            pin: c.pin,
            shard: current.shard_of(&c.id),
        })
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
    clusters
}

/// The recorded cut as a previous slicing, and the placement now by unit: each recorded slice of
/// a cut cluster by its [`slice_id`], every other placed cluster by its id.
fn recorded_slicing(fleet: &LiveFleet, current: &Assignment) -> (Slicing, PreviousPlacement) {
    let mut slicing = Slicing::default();
    for (id, cut) in &fleet.recorded_cuts {
        let ranges = cut.iter().map(|&(range, _)| range).collect();
        // Always some: the fleet records only cuts that tile the key space.
        if let Some(with_cut) = slicing.clone().with(id.as_str(), ranges) {
            slicing = with_cut;
        }
    }
    let placements = current
        .placements()
        .iter()
        .flat_map(|(id, p)| match fleet.recorded_cuts.get(id) {
            Some(cut) => cut
                .iter()
                .map(|&(range, shard)| (slice_id(id, range), shard))
                .collect(),
            None => vec![(id.clone(), p.shard)],
        })
        .collect();
    (slicing, placements)
}

/// Where the apps of `cluster` are now, as (shard, apps): each recorded slice of a cut cluster
/// on its own shard, any other placed cluster whole on its shard.
fn apps_now(fleet: &LiveFleet, current: &Assignment, cluster: &Cluster) -> Vec<(ShardId, u64)> {
    let keys = fleet.keys.get(&cluster.id);
    match fleet.recorded_cuts.get(&cluster.id) {
        // Without keys (an app without a UID) apps cannot be told to a slice: then they all
        // count on the shard the cluster is recorded on.
        Some(cut) if keys.is_some() || cluster.apps == 0 => cut
            .iter()
            .map(|&(range, shard)| (shard, keys.map_or(0, |k| count_in(k, range))))
            .collect(),
        _ => current
            .shard_of(&cluster.id)
            .map(|shard| (shard, cluster.apps))
            .into_iter()
            .collect(),
    }
}

/// The shard the apps of `range` of a cluster are on now. For a cut cluster: that of the
/// recorded slice `range` lies within or, when `range` spans several recorded slices, that of
/// the one holding most of its apps (ties: the lowest range). Otherwise the cluster's shard.
fn shard_now(
    fleet: &LiveFleet,
    current: &Assignment,
    cluster_id: &str,
    range: KeyRange,
) -> Option<ShardId> {
    let Some(cut) = fleet.recorded_cuts.get(cluster_id) else {
        return current.shard_of(cluster_id);
    };
    if let Some(&(_, shard)) = cut.iter().find(|&&(recorded, _)| range.within(recorded)) {
        return Some(shard);
    }
    let keys = fleet.keys.get(cluster_id).map_or(&[][..], Vec::as_slice);
    cut.iter()
        .filter(|&&(recorded, _)| recorded.within(range))
        .max_by_key(|&&(recorded, _)| (count_in(keys, recorded), Reverse(recorded)))
        .map(|&(_, shard)| shard)
}

/// The placement now (recorded or computed): loads per shard, what is unplaced, and pins that
/// explain why a cluster is elsewhere.
fn current_placement(
    fleet: &LiveFleet,
    current: &Assignment,
    from_shards: &ShardSet,
    how: Current,
) -> CurrentPlacement {
    let unplaced = fleet
        .clusters
        .iter()
        .filter(|c| current.shard_of(&c.id).is_none())
        .fold(Count::default(), |n, c| Count {
            clusters: n.clusters + 1,
            apps: n.apps + c.apps,
        });
    // A pin to a shard that is not live now explains why a cluster is elsewhere.
    let current_warnings = fleet
        .clusters
        .iter()
        .filter_map(|c| {
            let pin = c.pin.filter(|&p| !from_shards.contains(p))?;
            Some(PinWarning {
                cluster: c.name.clone(),
                id: c.id.clone(),
                pin,
                placed_on: current.shard_of(&c.id)?,
            })
        })
        .collect();
    // Counted from the apps, not from `current`, which holds a cut cluster whole on one shard.
    let empty = |shard: ShardId| CurrentShard {
        shard,
        clusters: 0,
        apps: 0,
        load: 0,
        live: from_shards.contains(shard),
    };
    let mut by_shard: BTreeMap<ShardId, CurrentShard> = current
        .shard_loads()
        .keys()
        .map(|&shard| (shard, empty(shard)))
        .collect();
    for cluster in &fleet.clusters {
        let weight = u64::from(cluster.weight.unwrap_or(1));
        let parts = apps_now(fleet, current, cluster);
        let shards: BTreeSet<ShardId> = parts.iter().map(|&(shard, _)| shard).collect();
        for (shard, apps) in parts {
            let row = by_shard.entry(shard).or_insert_with(|| empty(shard));
            row.apps += apps;
            row.load += apps.saturating_mul(weight);
        }
        for shard in shards {
            by_shard
                .entry(shard)
                .or_insert_with(|| empty(shard))
                .clusters += 1;
        }
    }
    let current_shards: Vec<CurrentShard> = by_shard.into_values().collect();
    let live_loads: Vec<u64> = current_shards
        .iter()
        .filter(|s| s.live)
        .map(|s| s.load)
        .collect();
    CurrentPlacement {
        placement: match how {
            Current::Recorded => "labels",
            Current::Computed(_) => "computed",
        },
        strategy: match how {
            Current::Recorded => None,
            Current::Computed(config) => Some(config.kind),
        },
        balance: Balance::of_loads(&live_loads),
        shards: current_shards,
        unplaced,
        warnings: current_warnings,
    }
}

/// What `plan --apply` writes from, for Argo CD: where its controller puts each cluster now
/// (`now`, at the replica count read) and where `config` puts each whole cluster at
/// `request.to` (`planned`), as the plan's strategy section computes it without slicing: Argo
/// CD pins whole clusters.
#[derive(Debug)]
pub struct ApplyPlacement {
    /// Where Argo CD runs each cluster now.
    pub now: Assignment,
    /// Where the plan puts it.
    pub planned: Assignment,
}

/// The placements `plan --apply` writes from: see [`ApplyPlacement`]. The in-cluster cluster
/// without a Secret cannot be pinned, so it stays where Argo CD's algorithm puts it (pins of the
/// others do not move it) and the strategy balances the other clusters around it.
pub fn apply_placement(
    fleet: &LiveFleet,
    request: &PlanRequest,
    config: &StrategyConfig,
) -> Result<ApplyPlacement, AssignError> {
    let now = current_assignment(fleet, request)?;
    let previous: PreviousPlacement = now
        .placements()
        .iter()
        .map(|(id, p)| (id.clone(), p.shard))
        .collect();
    let to = ShardSet::contiguous(request.to);
    let (mut clusters, _) = argocd_pin_rule(config.kind, &fleet.clusters, &to);
    keep_unpinnable(fleet, &now, &mut clusters);
    let planned = assign(config, &clusters, &to, Some(&previous))?;
    Ok(ApplyPlacement { now, planned })
}

/// Argo CD's in-cluster cluster without a Secret has no key to pin: a plan keeps it on the
/// shard Argo CD gives it `now`, so that the plan shown is the one `--apply` can write.
fn keep_unpinnable(fleet: &LiveFleet, now: &Assignment, clusters: &mut [Cluster]) {
    let unpinnable = crate::argocd::implicit_in_cluster(fleet)
        .and_then(|c| Some((c.id.clone(), now.shard_of(&c.id)?)));
    if let Some((id, shard)) = unpinnable {
        for cluster in clusters.iter_mut().filter(|c| c.id == id) {
            cluster.pin = Some(shard);
        }
    }
}

/// Where Argo CD's controller, running `config` over `replicas` shards, puts each cluster of
/// `fleet` once each cluster's pin is the one `pins` gives (by id; `None` removes it).
/// Clusters `pins` does not name keep theirs.
pub fn argocd_placement_with(
    fleet: &LiveFleet,
    config: &StrategyConfig,
    replicas: u32,
    pins: &BTreeMap<String, Option<ShardId>>,
) -> Result<Assignment, AssignError> {
    let clusters: Vec<Cluster> = fleet
        .clusters
        .iter()
        .map(|c| Cluster {
            pin: pins.get(&c.id).copied().unwrap_or(c.pin),
            ..c.clone()
        })
        .collect();
    argocd_assignment_of(fleet, &clusters, config, &ShardSet::contiguous(replicas))
}

/// Argo CD's rule for a pin its replicas do not have, kept by the strategies that reproduce its
/// algorithms: Argo CD puts a cluster pinned at or above its replica count on shard 0, so
/// `legacy-modulo` and `round-robin` here put a cluster pinned to a shard that is not live on
/// the lowest live shard (`argocd-consistent-hashing` does so itself). shardwise's own
/// strategies keep shard-assign's rule: the strategy places the cluster until the shard is
/// live. Returns the clusters to place and a warning for each one redirected.
pub fn argocd_pin_rule(
    kind: StrategyKind,
    clusters: &[Cluster],
    shards: &ShardSet,
) -> (Vec<Cluster>, Vec<Warning>) {
    let lowest = shards.as_slice().first().copied();
    let mut redirected = Vec::new();
    let placed = clusters
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if matches!(kind, StrategyKind::LegacyModulo | StrategyKind::RoundRobin)
                && let (Some(pin), Some(lowest)) = (c.pin, lowest)
                && !shards.contains(pin)
            {
                redirected.push(Warning::PinNotLive {
                    cluster: c.id.clone(),
                    pin,
                    placed_on: lowest,
                });
                c.pin = Some(lowest);
            }
            c
        })
        .collect();
    (placed, redirected)
}

fn current_assignment(fleet: &LiveFleet, request: &PlanRequest) -> Result<Assignment, AssignError> {
    match request.current {
        Current::Recorded => recorded_assignment(fleet, request.replicas),
        Current::Computed(config) => {
            argocd_assignment(fleet, &config, &ShardSet::contiguous(request.replicas))
        }
    }
}

/// Where Argo CD's controller puts each cluster now, as it decides it (v3.5,
/// `ClusterSharding.updateDistribution`): a pin below the replica count wins, a pin at or above
/// it means shard 0, and a negative pin means no shard at all (the cluster is left out, so it
/// is unplaced). The algorithm still ranks and weighs every cluster (round-robin ranks and the
/// consistent-hashing walk include pinned and orphaned ones), so it runs on all of them; its
/// consistent-hashing counts the Applications that name a cluster by server.
fn argocd_assignment(
    fleet: &LiveFleet,
    config: &StrategyConfig,
    shards: &ShardSet,
) -> Result<Assignment, AssignError> {
    argocd_assignment_of(fleet, &fleet.clusters, config, shards)
}

/// [`argocd_assignment`] of `clusters`, the clusters of `fleet` with other pins.
fn argocd_assignment_of(
    fleet: &LiveFleet,
    clusters: &[Cluster],
    config: &StrategyConfig,
    shards: &ShardSet,
) -> Result<Assignment, AssignError> {
    let as_argocd: Vec<Cluster> = clusters
        .iter()
        .map(|c| Cluster {
            pin: c.pin.map(|p| if shards.contains(p) { p } else { 0 }),
            apps: if config.kind == StrategyKind::ArgoCdConsistentHashing {
                fleet.server_apps.get(&c.id).copied().unwrap_or(0)
            } else {
                c.apps
            },
            weight: None,
            ..c.clone()
        })
        .collect();
    let computed = assign(config, &as_argocd, shards, None)?;
    let placed: Vec<Cluster> = clusters
        .iter()
        .filter(|c| !fleet.orphaned.contains(&c.id))
        .map(|c| Cluster {
            pin: computed.shard_of(&c.id),
            ..c.clone()
        })
        .collect();
    pinned_assignment(&placed, shards)
}

/// The recorded placement as an [`Assignment`], so that `AssignmentDiff` can compare it with a
/// plan. `assign` is the only way to build one: each recorded cluster is pinned to its shard and
/// every recorded shard is live, so each lands exactly where it is recorded. Unplaced clusters
/// are left out; a diff counts them as added.
fn recorded_assignment(fleet: &LiveFleet, replicas: u32) -> Result<Assignment, AssignError> {
    let placed: Vec<Cluster> = fleet
        .clusters
        .iter()
        .filter_map(|c| {
            let shard = *fleet.recorded.get(&c.id)?;
            Some(Cluster {
                pin: Some(shard),
                ..c.clone()
            })
        })
        .collect();
    // Shards of slices too, so that a slice can be placed on its shard in `sliced_plan`.
    let shards: ShardSet = (0..replicas)
        .chain(fleet.recorded.values().copied())
        .chain(
            fleet
                .recorded_cuts
                .values()
                .flatten()
                .map(|&(_, shard)| shard),
        )
        .collect();
    pinned_assignment(&placed, &shards)
}

/// Clusters that are each pinned to one of `shards`, as an [`Assignment`]: every one lands on
/// its pin, whatever the strategy.
fn pinned_assignment(pinned: &[Cluster], shards: &ShardSet) -> Result<Assignment, AssignError> {
    assign(
        &StrategyConfig::new(StrategyKind::LegacyModulo),
        pinned,
        shards,
        None,
    )
}

fn strategy_plan(
    config: &StrategyConfig,
    by_id: &BTreeMap<&str, &Cluster>,
    current: &Assignment,
    at_from: &Assignment,
    at_to: &Assignment,
    redirected: &[Warning],
) -> StrategyPlan {
    let diff = AssignmentDiff::between(current, at_to);
    let cluster = |id: &str| by_id.get(id).copied();
    let mut moved: Vec<MovedCluster> = diff
        .moves
        .iter()
        .filter_map(|m| {
            let c = cluster(&m.cluster)?;
            Some(MovedCluster {
                cluster: c.name.clone(),
                id: c.id.clone(),
                apps: m.apps,
                load: c.load(),
                from: m.from,
                to: m.to,
                forced: m.forced,
            })
        })
        .collect();
    moved.sort_by(|a, b| (b.apps, &a.cluster, &a.id).cmp(&(a.apps, &b.cluster, &b.id)));
    let mut placed: Vec<PlacedCluster> = at_to
        .placements()
        .iter()
        .filter(|(id, _)| current.shard_of(id).is_none())
        .filter_map(|(id, p)| {
            let c = cluster(id)?;
            Some(PlacedCluster {
                cluster: c.name.clone(),
                id: c.id.clone(),
                apps: c.apps,
                load: c.load(),
                to: p.shard,
            })
        })
        .collect();
    placed.sort_by(|a, b| (b.apps, &a.cluster, &a.id).cmp(&(a.apps, &b.cluster, &b.id)));
    let placed_count = Count {
        clusters: placed.len() as u64,
        apps: placed.iter().map(|p| p.apps).sum(),
    };
    let warnings = at_to
        .warnings()
        .iter()
        .chain(redirected)
        .filter_map(|w| match w {
            Warning::PinNotLive {
                cluster: id,
                pin,
                placed_on,
            } => Some(PinWarning {
                cluster: cluster(id)?.name.clone(),
                id: id.clone(),
                pin: *pin,
                placed_on: *placed_on,
            }),
        })
        .collect();
    StrategyPlan {
        strategy: config.kind,
        config: *config,
        at_from: layout(at_from),
        at_to: layout(at_to),
        moves: MoveTotals {
            clusters: diff.clusters_moved() as u64,
            apps: diff.apps_moved(),
            forced: Count {
                clusters: diff.forced_clusters as u64,
                apps: diff.forced_apps,
            },
            voluntary: Count {
                clusters: diff.voluntary_clusters as u64,
                apps: diff.voluntary_apps,
            },
            placed: placed_count,
        },
        moved,
        placed,
        warnings,
        slicing: None,
    }
}

/// The plan of a strategy that slices. Every slice is compared with where its apps are now
/// ([`shard_now`]), so moves are counted per slice.
fn sliced_plan(
    config: &StrategyConfig,
    fleet: &LiveFleet,
    current: &Assignment,
    at_from: &SlicedAssignment,
    at_to: &SlicedAssignment,
) -> Result<StrategyPlan, AssignError> {
    // The slices of the plan as clusters of their own, named `cluster#range`.
    let mut units: Vec<Cluster> = Vec::new();
    // Where each slice is now (pinned there).
    let mut now: Vec<Cluster> = Vec::new();
    let mut cut = Vec::new();
    for cluster in &fleet.clusters {
        let Some(slices) = at_to.units.get(&cluster.id) else {
            continue;
        };
        let mut rows = Vec::new();
        for (range, unit) in slices {
            let Some(placed) = at_to.assignment.placements().get(unit) else {
                continue;
            };
            let whole = slices.len() == 1;
            let slice = Cluster {
                id: unit.clone(),
                name: if whole {
                    cluster.name.clone()
                } else {
                    format!("{}#{range}", cluster.name)
                },
                apps: placed.apps,
                ..cluster.clone()
            };
            let current_shard = shard_now(fleet, current, &cluster.id, *range);
            if let Some(shard) = current_shard {
                now.push(Cluster {
                    pin: Some(shard),
                    ..slice.clone()
                });
            }
            units.push(slice);
            if !whole {
                rows.push(SliceRow {
                    id: unit.clone(),
                    range: range.to_string(),
                    selector: range.selector(),
                    apps: placed.apps,
                    shard: placed.shard,
                    now: current_shard,
                });
            }
        }
        if !rows.is_empty() {
            cut.push(CutCluster {
                cluster: cluster.name.clone(),
                id: cluster.id.clone(),
                slices: rows,
            });
        }
    }
    let current_units = pinned_assignment(&now, &current.live_shards())?;
    let by_unit: BTreeMap<&str, &Cluster> = units.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut plan = strategy_plan(
        config,
        &by_unit,
        &current_units,
        &at_from.assignment,
        &at_to.assignment,
        &[],
    );
    plan.slicing = Some(SlicePlan {
        cache_copies: at_to.cache_copies(),
        extra_slices: at_to.slicing.extra_slices(),
        cut,
    });
    Ok(plan)
}

fn layout(assignment: &Assignment) -> Layout {
    Layout {
        balance: assignment.balance(),
        shards: assignment
            .shard_loads()
            .iter()
            .map(|(&shard, load)| ShardRow {
                shard,
                clusters: load.clusters,
                apps: load.apps,
                load: load.load,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shardwise::fixtures::cut_fleet;

    fn cluster(id: &str, apps: u64) -> Cluster {
        Cluster {
            name: format!("name-{id}"),
            ..Cluster::new(id, apps)
        }
    }

    /// Six clusters on three shards by label, one on shard 5 (not live), one unplaced.
    fn labelled_fleet() -> LiveFleet {
        let mut fleet = LiveFleet {
            clusters: vec![
                cluster("a", 40),
                cluster("b", 30),
                cluster("c", 20),
                cluster("d", 10),
                cluster("e", 5),
                cluster("f", 8),
                cluster("stray", 7),
                cluster("new", 12),
            ],
            ..LiveFleet::default()
        };
        for (id, shard) in [
            ("a", 0),
            ("b", 1),
            ("c", 2),
            ("d", 2),
            ("e", 0),
            ("f", 1),
            ("stray", 5),
        ] {
            fleet.recorded.insert(id.into(), shard);
        }
        fleet
    }

    fn request(replicas: u32, to: u32, current: Current, kinds: &[StrategyKind]) -> PlanRequest {
        PlanRequest {
            source: FleetSource::Shardwise,
            server: "https://example:6443".into(),
            namespace: "shardwise".into(),
            replicas,
            replicas_origin: "--replicas".into(),
            to,
            current,
            strategies: kinds.iter().map(|&k| StrategyConfig::new(k)).collect(),
            slicing: SliceSwitch::Auto,
            argocd: None,
        }
    }

    #[test]
    fn plan_and_apply_keep_the_unpinnable_in_cluster_cluster_home_and_balance_around_it() {
        // Argo CD's legacy algorithm: the in-cluster cluster (empty id) and c0 on shard 0, c3 on
        // shard 1, shard 2 empty. Moving in-cluster (fewer apps) would balance as well, but
        // without a Secret it cannot be pinned: c0 moves instead.
        let mut fleet = LiveFleet::default();
        fleet.clusters.push(Cluster {
            name: "in-cluster".into(),
            ..Cluster::new("", 10)
        });
        fleet.clusters.push(cluster("c0", 20));
        fleet.clusters.push(cluster("c3", 15));
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let request = request(
            3,
            3,
            Current::Computed(legacy),
            &[StrategyKind::StickyBalanced],
        );
        let sticky = StrategyConfig::new(StrategyKind::StickyBalanced);
        let placement = apply_placement(&fleet, &request, &sticky).unwrap();
        for (id, shard) in [("", 0), ("c0", 0), ("c3", 1)] {
            assert_eq!(placement.now.shard_of(id), Some(shard), "{id}");
        }
        assert_eq!(placement.planned.shard_of(""), Some(0));
        assert_eq!(placement.planned.shard_of("c0"), Some(2));
        assert_eq!(placement.planned.shard_of("c3"), Some(1));

        // The plan shows what --apply writes: the same one move, of c0.
        let report = build(
            &fleet,
            PlanRequest {
                slicing: SliceSwitch::Off,
                ..request
            },
        )
        .unwrap();
        let moved: Vec<(&str, ShardId, ShardId)> = report.strategies[0]
            .moved
            .iter()
            .map(|m| (m.id.as_str(), m.from, m.to))
            .collect();
        assert_eq!(moved, [("c0", 0, 2)]);
    }

    #[test]
    fn sticky_balanced_cuts_a_hot_cluster_and_counts_moves_per_slice() {
        // One cluster with 600 of 750 apps, all on shard 0 of 3; its apps have random UIDs.
        let mut fleet = LiveFleet::default();
        for (id, apps) in [("hot", 600u64), ("a", 50), ("b", 60), ("c", 40)] {
            fleet.clusters.push(cluster(id, apps));
            fleet
                .recorded
                .insert(id.into(), if id == "hot" { 0 } else { 1 });
            for n in 0..apps {
                let uid = shardwise_sim::app_uid(id, n);
                fleet.add_app_key(id, Some(&uid));
            }
        }
        fleet.finish_keys();
        let kinds = [StrategyKind::StickyBalanced, StrategyKind::LegacyModulo];
        let report = build(&fleet, request(3, 3, Current::Recorded, &kinds)).unwrap();
        let sticky = &report.strategies[0];
        let slicing = sticky
            .slicing
            .as_ref()
            .expect("sticky-balanced slices by default");
        assert_eq!(slicing.cut.len(), 1);
        let hot = &slicing.cut[0];
        assert_eq!(hot.cluster, "name-hot");
        assert_eq!(hot.slices.iter().map(|s| s.apps).sum::<u64>(), 600);
        // Whole, the hot cluster alone is 2.4 times the mean.
        assert!(
            sticky.at_to.balance.max_over_mean < 1.2,
            "{:?}",
            sticky.at_to.balance
        );
        // Moves are of slices: every slice of the hot cluster not left on shard 0.
        let off_zero: u64 = hot
            .slices
            .iter()
            .filter(|s| s.shard != 0)
            .map(|s| s.apps)
            .sum();
        let moved_hot: u64 = sticky
            .moved
            .iter()
            .filter(|m| m.cluster.starts_with("name-hot#"))
            .map(|m| m.apps)
            .sum();
        assert_eq!(moved_hot, off_zero);
        assert!(off_zero > 0);
        assert!(sticky.moved.iter().all(|m| !m.forced));
        let shards: std::collections::BTreeSet<ShardId> =
            hot.slices.iter().map(|s| s.shard).collect();
        assert_eq!(slicing.cache_copies, shards.len() - 1);
        // Argo CD's legacy placement never cuts.
        assert!(report.strategies[1].slicing.is_none());
        // Off: nothing is cut.
        let mut off = request(3, 3, Current::Recorded, &kinds);
        off.slicing = SliceSwitch::Off;
        assert!(build(&fleet, off).unwrap().strategies[0].slicing.is_none());
    }

    #[test]
    fn the_current_placement_is_the_labels_with_stray_shards_not_live() {
        let report = build(&labelled_fleet(), request(3, 3, Current::Recorded, &[])).unwrap();
        let shards: Vec<_> = report
            .current
            .shards
            .iter()
            .map(|s| (s.shard, s.clusters, s.apps, s.live))
            .collect();
        assert_eq!(
            shards,
            [
                (0, 2, 45, true),
                (1, 2, 38, true),
                (2, 2, 30, true),
                (5, 1, 7, false)
            ]
        );
        // Balance over the live shards only: mean 113 / 3.
        assert!((report.current.balance.max_over_mean - 45.0 * 3.0 / 113.0).abs() < 1e-9);
        assert_eq!(
            report.current.unplaced,
            Count {
                clusters: 1,
                apps: 12
            }
        );
        assert_eq!(report.current.placement, "labels");
        assert_eq!(report.fleet.apps, 132);
        let new = report.clusters.iter().find(|c| c.id == "new").unwrap();
        assert_eq!(new.shard, None);
    }

    #[test]
    fn moves_are_counted_from_the_labels_forced_off_removed_and_stray_shards() {
        let report = build(
            &labelled_fleet(),
            request(3, 2, Current::Recorded, &[StrategyKind::StickyBalanced]),
        )
        .unwrap();
        let plan = &report.strategies[0];
        // c and d leave removed shard 2, stray leaves shard 5: all three are forced.
        let forced: Vec<(&str, ShardId)> = plan
            .moved
            .iter()
            .filter(|m| m.forced)
            .map(|m| (m.id.as_str(), m.from))
            .collect();
        assert_eq!(forced, [("c", 2), ("d", 2), ("stray", 5)]);
        assert_eq!(
            plan.moves.forced,
            Count {
                clusters: 3,
                apps: 37
            }
        );
        // sticky-balanced keeps the rest home, but for its budget of extra moves.
        assert!(plan.moves.voluntary.clusters <= 3);
        assert_eq!(
            plan.moves.clusters,
            plan.moves.forced.clusters + plan.moves.voluntary.clusters
        );
        // The unplaced cluster is placed, not moved.
        assert_eq!(plan.placed.len(), 1);
        assert_eq!(plan.placed[0].id, "new");
        assert!(plan.placed[0].to < 2);
        assert!(plan.moved.iter().all(|m| m.id != "new"));
        assert_eq!(plan.at_to.shards.len(), 2);
        assert_eq!(plan.at_from.shards.len(), 3);
        // Heaviest first.
        assert!(plan.moved.windows(2).all(|w| w[0].apps >= w[1].apps));
    }

    #[test]
    fn sticky_balanced_starts_from_the_current_placement() {
        // Perfectly balanced labels: sticky-balanced has nothing to improve and moves nothing,
        // where greedy-minimum re-plans from scratch.
        let mut fleet = LiveFleet {
            clusters: vec![
                cluster("a", 10),
                cluster("b", 10),
                cluster("c", 10),
                cluster("d", 10),
            ],
            ..LiveFleet::default()
        };
        for (id, shard) in [("a", 1), ("b", 1), ("c", 0), ("d", 0)] {
            fleet.recorded.insert(id.into(), shard);
        }
        let report = build(
            &fleet,
            request(
                2,
                2,
                Current::Recorded,
                &[StrategyKind::StickyBalanced, StrategyKind::RoundRobin],
            ),
        )
        .unwrap();
        assert_eq!(report.strategies[0].moves.clusters, 0);
        assert!(report.strategies[1].moves.clusters > 0);
    }

    #[test]
    fn a_computed_current_placement_is_the_strategy_at_the_current_replicas() {
        let fleet = LiveFleet {
            clusters: (0..40).map(|i| cluster(&format!("c{i}"), i)).collect(),
            ..LiveFleet::default()
        };
        let legacy = StrategyConfig::new(StrategyKind::LegacyModulo);
        let report = build(
            &fleet,
            request(
                4,
                3,
                Current::Computed(legacy),
                &[StrategyKind::LegacyModulo],
            ),
        )
        .unwrap();
        assert_eq!(report.current.placement, "computed");
        assert_eq!(report.current.strategy, Some(StrategyKind::LegacyModulo));
        assert!(report.current.shards.iter().all(|s| s.live));
        // Exactly what shard_assign says Argo CD's legacy sharding moves from 4 to 3 replicas.
        let before = assign(&legacy, &fleet.clusters, &ShardSet::contiguous(4), None).unwrap();
        let after = assign(&legacy, &fleet.clusters, &ShardSet::contiguous(3), None).unwrap();
        let diff = AssignmentDiff::between(&before, &after);
        let plan = &report.strategies[0];
        assert_eq!(plan.moves.clusters, diff.clusters_moved() as u64);
        assert_eq!(plan.moves.forced.clusters, diff.forced_clusters as u64);
        assert_eq!(plan.moves.voluntary.apps, diff.voluntary_apps);
        assert_eq!(plan.moves.placed, Count::default());
        // Planning at the same replica count with the same strategy moves nothing.
        let same = build(
            &fleet,
            request(
                4,
                4,
                Current::Computed(legacy),
                &[StrategyKind::LegacyModulo],
            ),
        )
        .unwrap();
        assert_eq!(same.strategies[0].moves.clusters, 0);
    }

    /// Clusters `a` to `e` of 10 apps each, ids in name order.
    fn five_clusters() -> LiveFleet {
        LiveFleet {
            clusters: ["a", "b", "c", "d", "e"]
                .iter()
                .map(|id| cluster(id, 10))
                .collect(),
            ..LiveFleet::default()
        }
    }

    #[test]
    fn argo_cd_sends_pins_out_of_range_to_shard_0_and_negative_pins_nowhere() {
        // Ids sort as a < b < c < d < e: round-robin ranks 0..4 over 2 replicas.
        let mut fleet = five_clusters();
        // b is pinned past the replica count; c has a negative shard (orphaned).
        fleet.clusters[1].pin = Some(5);
        fleet.orphaned.insert("c".into());
        let round_robin = StrategyConfig::new(StrategyKind::RoundRobin);
        let report = build(
            &fleet,
            request(
                2,
                2,
                Current::Computed(round_robin),
                &[StrategyKind::RoundRobin],
            ),
        )
        .unwrap();
        let now: Vec<(&str, Option<ShardId>)> = report
            .clusters
            .iter()
            .map(|c| (c.id.as_str(), c.shard))
            .collect();
        // The orphan keeps its rank, so d and e stay where Argo CD puts them.
        assert_eq!(
            now,
            [
                ("a", Some(0)),
                ("b", Some(0)),
                ("c", None),
                ("d", Some(1)),
                ("e", Some(0))
            ]
        );
        assert_eq!(
            report.current.unplaced,
            Count {
                clusters: 1,
                apps: 10
            }
        );
        let warnings: Vec<_> = report
            .current
            .warnings
            .iter()
            .map(|w| (w.cluster.as_str(), w.pin, w.placed_on))
            .collect();
        assert_eq!(warnings, [("name-b", 5, 0)]);
        // shardwise's round-robin would reconcile the orphan: it is placed.
        assert_eq!(report.strategies[0].moves.placed.clusters, 1);
    }

    fn pinned(id: &str, pin: Option<u32>) -> Cluster {
        Cluster {
            pin,
            ..Cluster::new(id, 1)
        }
    }

    #[test]
    fn argo_cd_strategies_send_pins_that_are_not_live_to_the_lowest_live_shard() {
        let clusters = [
            pinned("a", Some(7)),
            pinned("b", Some(1)),
            pinned("c", None),
        ];
        let shards: ShardSet = [1, 2].into_iter().collect();
        for kind in [StrategyKind::LegacyModulo, StrategyKind::RoundRobin] {
            let (placed, redirected) = argocd_pin_rule(kind, &clusters, &shards);
            let pins: Vec<Option<u32>> = placed.iter().map(|c| c.pin).collect();
            assert_eq!(pins, [Some(1), Some(1), None], "{kind}");
            assert_eq!(
                redirected,
                [Warning::PinNotLive {
                    cluster: "a".into(),
                    pin: 7,
                    placed_on: 1
                }]
            );
        }
        // shardwise's own strategies, and the one that applies the rule itself, are left alone.
        for kind in [
            StrategyKind::GreedyMinimum,
            StrategyKind::StickyBalanced,
            StrategyKind::ArgoCdConsistentHashing,
        ] {
            let (placed, redirected) = argocd_pin_rule(kind, &clusters, &shards);
            assert_eq!(placed, clusters, "{kind}");
            assert!(redirected.is_empty());
        }
    }

    #[test]
    fn plan_gives_a_pin_argo_cd_lacks_the_shard_argo_cd_gives_it() {
        // Argo CD runs 3 replicas; "b" is pinned to shard 2. At 2 replicas Argo CD puts it on
        // shard 0, and so must the strategies that reproduce Argo CD.
        let mut fleet = five_clusters();
        fleet.clusters[1].pin = Some(2);
        for kind in [StrategyKind::LegacyModulo, StrategyKind::RoundRobin] {
            let config = StrategyConfig::new(kind);
            let report = build(&fleet, request(3, 2, Current::Computed(config), &[kind])).unwrap();
            let b = report.clusters.iter().find(|c| c.id == "b").unwrap();
            assert_eq!(b.shard, Some(2), "{kind}: Argo CD at 3 replicas");
            let plan = &report.strategies[0];
            let moved = plan.moved.iter().find(|m| m.id == "b").unwrap();
            assert_eq!((moved.from, moved.to), (2, 0), "{kind}");
            let at_two = argocd_placement_with(&fleet, &config, 2, &BTreeMap::new()).unwrap();
            assert_eq!(
                at_two.shard_of("b"),
                Some(0),
                "{kind}: Argo CD at 2 replicas"
            );
            let warned: Vec<_> = plan
                .warnings
                .iter()
                .map(|w| (w.id.as_str(), w.pin, w.placed_on))
                .collect();
            assert_eq!(warned, [("b", 2, 0)], "{kind}");
        }
        // shardwise's own strategies keep shard-assign's rule: the strategy places it.
        let greedy = StrategyConfig::new(StrategyKind::GreedyMinimum);
        let report = build(
            &fleet,
            request(
                3,
                2,
                Current::Computed(greedy),
                &[StrategyKind::GreedyMinimum],
            ),
        )
        .unwrap();
        assert_eq!(report.strategies[0].warnings.len(), 1);
    }

    #[test]
    fn pins_to_shards_that_are_not_live_are_reported_by_name() {
        let mut fleet = labelled_fleet();
        fleet.clusters[0].pin = Some(2);
        fleet.clusters[1].pin = Some(7);
        let report = build(
            &fleet,
            request(3, 2, Current::Recorded, &[StrategyKind::GreedyMinimum]),
        )
        .unwrap();
        let now: Vec<_> = report
            .current
            .warnings
            .iter()
            .map(|w| (w.cluster.as_str(), w.pin, w.placed_on))
            .collect();
        assert_eq!(now, [("name-b", 7, 1)]);
        let mut planned: Vec<_> = report.strategies[0]
            .warnings
            .iter()
            .map(|w| (w.cluster.as_str(), w.pin))
            .collect();
        planned.sort();
        assert_eq!(planned, [("name-a", 2), ("name-b", 7)]);
    }

    #[test]
    fn weights_make_load_differ_from_apps() {
        let mut fleet = labelled_fleet();
        fleet.clusters[0].weight = Some(3);
        let report = build(&fleet, request(3, 3, Current::Recorded, &[])).unwrap();
        assert!(report.fleet.weighted);
        assert_eq!(report.fleet.load, report.fleet.apps + 80);
        assert_eq!(report.current.shards[0].load, 125);
        assert_eq!(report.clusters[0].weight, 3);
    }

    #[test]
    fn zero_replicas_cannot_be_planned() {
        let fleet = LiveFleet {
            clusters: vec![cluster("a", 1)],
            ..LiveFleet::default()
        };
        assert_eq!(
            build(
                &fleet,
                request(2, 0, Current::Recorded, &[StrategyKind::RoundRobin])
            )
            .unwrap_err(),
            AssignError::NoLiveShards
        );
    }

    #[test]
    fn a_cut_cluster_counts_each_recorded_slice_on_its_shard() {
        let (fleet, cut, in_slice) = cut_fleet();
        let kinds = [StrategyKind::StickyBalanced, StrategyKind::GreedyMinimum];
        let report = build(&fleet, request(3, 3, Current::Recorded, &kinds)).unwrap();
        let shards: Vec<_> = report
            .current
            .shards
            .iter()
            .map(|s| (s.shard, s.clusters, s.apps, s.load, s.live))
            .collect();
        assert_eq!(
            shards,
            [
                (0, 2, 200, 200, true),
                (1, 2, 200, 200, true),
                (2, 2, 200, 200, true)
            ]
        );
        assert_eq!(report.current.balance.max_over_mean, 1.0);
        assert_eq!(report.current.unplaced, Count::default());
        // Its row names the shard of its biggest slice, the high half.
        assert!(in_slice[2] > in_slice[0].max(in_slice[1]));
        let hot = report.clusters.iter().find(|c| c.name == "hot").unwrap();
        assert_eq!(hot.shard, Some(2));
        assert!(report.notes[0].contains(r#"are ignored: "hot-1-0""#));

        // Nothing changed and the shards are balanced: sticky-balanced keeps the recorded cut
        // where it is.
        let sticky = &report.strategies[0];
        assert_eq!(sticky.moves.clusters, 0, "{:?}", sticky.moved);
        assert_eq!(sticky.moves.apps, 0);
        assert!(sticky.placed.is_empty());
        let slicing = sticky.slicing.as_ref().unwrap();
        assert_eq!(slicing.cut.len(), 1);
        let slices: Vec<_> = slicing.cut[0]
            .slices
            .iter()
            .map(|r| (r.range.clone(), r.apps, r.shard, r.now))
            .collect();
        let expected: Vec<_> = (0..3u32)
            .map(|i| {
                let n = i as usize;
                (cut[n].to_string(), in_slice[n], i, Some(i))
            })
            .collect();
        assert_eq!(slices, expected);
        // A strategy that places whole clusters (greedy-minimum puts the heaviest on shard 0)
        // moves hot from the shard of most of its apps.
        let greedy = &report.strategies[1];
        assert!(greedy.slicing.is_none());
        let hot = greedy.moved.iter().find(|m| m.cluster == "hot").unwrap();
        assert_eq!((hot.from, hot.to, hot.apps), (2, 0, 360));
    }

    #[test]
    fn scaling_down_forces_the_recorded_slices_off_the_removed_shard() {
        let (fleet, _, in_slice) = cut_fleet();
        let report = build(
            &fleet,
            request(3, 2, Current::Recorded, &[StrategyKind::StickyBalanced]),
        )
        .unwrap();
        let plan = &report.strategies[0];
        // The high half of hot and cluster c leave shard 2: 200 apps, however hot is cut now.
        assert_eq!(plan.moves.forced.apps, 200);
        assert!(plan.moved.iter().any(|m| m.cluster.starts_with("hot#")));
        for m in &plan.moved {
            assert_eq!(m.forced, m.from == 2, "{m:?}");
        }
        let hot_forced: u64 = plan
            .moved
            .iter()
            .filter(|m| m.forced && m.cluster.starts_with("hot"))
            .map(|m| m.apps)
            .sum();
        assert_eq!(hot_forced, in_slice[2]);
    }

    #[test]
    fn a_plan_slice_is_where_most_of_its_recorded_apps_are() {
        let (mut fleet, cut, in_slice) = cut_fleet();
        let current = recorded_assignment(&fleet, 3).unwrap();
        let range = |depth, index| KeyRange::new(depth, index).unwrap();
        // Within a recorded slice: that slice's shard.
        assert_eq!(shard_now(&fleet, &current, "uid-hot", range(3, 1)), Some(0));
        assert_eq!(shard_now(&fleet, &current, "uid-hot", range(2, 3)), Some(2));
        assert_eq!(shard_now(&fleet, &current, "uid-hot", cut[1]), Some(1));
        // Spanning recorded slices: the shard of the one with most apps.
        let low = if in_slice[1] > in_slice[0] { 1 } else { 0 };
        assert_eq!(
            shard_now(&fleet, &current, "uid-hot", range(1, 0)),
            Some(low)
        );
        assert_eq!(
            shard_now(&fleet, &current, "uid-hot", KeyRange::WHOLE),
            Some(2)
        );
        // A whole cluster: its shard, whatever the range.
        assert_eq!(shard_now(&fleet, &current, "uid-a", range(1, 1)), Some(0));

        // Each slice weighs its apps times the cluster's weight, on its own shard.
        for c in fleet.clusters.iter_mut().filter(|c| c.name == "hot") {
            c.weight = Some(2);
        }
        let report = build(&fleet, request(3, 3, Current::Recorded, &[])).unwrap();
        let loads: Vec<u64> = report.current.shards.iter().map(|s| s.load).collect();
        assert_eq!(loads, in_slice.map(|apps| 200 + apps).to_vec());
    }
}
