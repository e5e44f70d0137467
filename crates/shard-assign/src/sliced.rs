//! Assignment of slices: cut the clusters that are too big for one shard ([`slice_fleet`]),
//! then place every slice with the chosen strategy as if it were a cluster of its own.
//!
//! A cluster that is not cut keeps its own id as its one unit, so that a fleet nothing needs to
//! cut is assigned exactly as without slicing. `legacy-modulo`, `round-robin` and
//! `argocd-consistent-hashing` never cut (they exist to place clusters as Argo CD does).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::engine::assign;
use crate::error::{AssignError, ParseError};
use crate::model::{Assignment, Cluster, Placement, PreviousPlacement, ShardId, ShardSet};
use crate::ratio::Ratio;
use crate::slicing::{
    AppKeys, KeyRange, SliceConfig, Slicing, count_in, per_shard_target, slice_fleet,
};
use crate::strategy::{StrategyConfig, StrategyKind};

/// The unit id of a slice: the cluster's id when the slice is the whole cluster,
/// `<cluster id>#<range>` otherwise.
pub fn slice_id(cluster_id: &str, range: KeyRange) -> String {
    if range == KeyRange::WHOLE {
        cluster_id.to_string()
    } else {
        format!("{cluster_id}#{range}")
    }
}

/// Where every slice went, and how the clusters were cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicedAssignment {
    /// The placement of every slice, by [`slice_id`].
    pub assignment: Assignment,
    /// How each cluster is cut.
    pub slicing: Slicing,
    /// Slice ids by cluster id, in range order.
    pub units: BTreeMap<String, Vec<(KeyRange, String)>>,
}

impl SlicedAssignment {
    /// An assignment of whole clusters, seen as one where nothing is cut.
    pub fn uncut(assignment: Assignment) -> Self {
        let units = assignment
            .placements()
            .keys()
            .map(|id| (id.clone(), vec![(KeyRange::WHOLE, id.clone())]))
            .collect();
        Self {
            assignment,
            slicing: Slicing::default(),
            units,
        }
    }

    /// The shards holding a slice of `cluster_id`.
    pub fn shards_of(&self, cluster_id: &str) -> BTreeSet<ShardId> {
        self.units
            .get(cluster_id)
            .into_iter()
            .flatten()
            .filter_map(|(_, unit)| self.assignment.shard_of(unit))
            .collect()
    }

    /// Caches of a cluster beyond its first: the (cluster, shard) pairs beyond one per cluster.
    /// Each costs the replica another watch of that cluster, and its API server another client.
    pub fn cache_copies(&self) -> usize {
        self.units
            .keys()
            .map(|id| self.shards_of(id).len().saturating_sub(1))
            .sum()
    }
}

/// What changed owner between two sliced assignments, counted per app: a slice that is cut or
/// merged moves only the apps whose shard actually changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceMoves {
    /// Clusters with at least one app on another shard.
    pub clusters: u64,
    /// Of those, clusters with an app that left a shard that is still live.
    pub voluntary_clusters: u64,
    /// Apps now on another shard.
    pub apps: u64,
    /// Apps that left a shard that is still live (the strategy's choice, not forced).
    pub voluntary_apps: u64,
}

impl SlicedAssignment {
    /// The moves from `before` to `self`. Clusters only in one of them move nothing.
    pub fn moves_since(&self, before: &SlicedAssignment, keys: &AppKeys) -> SliceMoves {
        let live = self.assignment.live_shards();
        let mut moves = SliceMoves::default();
        for (cluster, after) in &self.units {
            let Some(previous) = before.units.get(cluster) else {
                continue;
            };
            let (mut moved, mut voluntary) = (false, false);
            for (range, unit) in after {
                for (earlier_range, earlier_unit) in previous {
                    // Aligned ranges either nest or do not meet.
                    let common = if range.within(*earlier_range) {
                        *range
                    } else if earlier_range.within(*range) {
                        *earlier_range
                    } else {
                        continue;
                    };
                    let (Some(now), Some(then)) = (
                        self.assignment.shard_of(unit),
                        before.assignment.shard_of(earlier_unit),
                    ) else {
                        continue;
                    };
                    if now == then {
                        continue;
                    }
                    let apps = match keys.get(cluster) {
                        Some(k) => count_in(k, common),
                        None => self.assignment.placements().get(unit).map_or(0, |p| p.apps),
                    };
                    moved = true;
                    moves.apps += apps;
                    if live.contains(then) {
                        voluntary = true;
                        moves.voluntary_apps += apps;
                    }
                }
            }
            moves.clusters += u64::from(moved);
            moves.voluntary_clusters += u64::from(voluntary);
        }
        moves
    }
}

/// Whether `kind` may cut clusters.
pub fn slices(kind: StrategyKind) -> bool {
    !matches!(
        kind,
        StrategyKind::LegacyModulo
            | StrategyKind::RoundRobin
            | StrategyKind::ArgoCdConsistentHashing
    )
}

/// The one switch for slicing, as the front ends offer it (`--slicing` of `simulate`, `assign`
/// and `plan`): `auto` slices with `sticky-balanced` only, `on` with every strategy that
/// may cut, `off` never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SliceSwitch {
    /// Slice with `sticky-balanced` only.
    #[default]
    Auto,
    /// Slice with every strategy that may cut.
    On,
    /// Never slice.
    Off,
}

impl SliceSwitch {
    pub(crate) const ALL: [SliceSwitch; 3] = [SliceSwitch::Auto, SliceSwitch::On, SliceSwitch::Off];

    pub(crate) fn name(self) -> &'static str {
        match self {
            SliceSwitch::Auto => "auto",
            SliceSwitch::On => "on",
            SliceSwitch::Off => "off",
        }
    }

    /// Whether `kind` cuts clusters under this switch.
    pub fn slices(self, kind: StrategyKind) -> bool {
        match self {
            SliceSwitch::Auto => kind == StrategyKind::StickyBalanced,
            SliceSwitch::On => slices(kind),
            SliceSwitch::Off => false,
        }
    }

    /// The slicing configuration of `kind` under this switch.
    pub fn config_for(self, kind: StrategyKind) -> SliceConfig {
        if self.slices(kind) {
            SliceConfig::enabled()
        } else {
            SliceConfig::disabled()
        }
    }
}

impl std::fmt::Display for SliceSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SliceSwitch {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SliceSwitch::ALL
            .into_iter()
            .find(|switch| switch.name() == s)
            .ok_or_else(|| ParseError::UnknownSliceSwitch(s.to_string()))
    }
}

/// Cuts the clusters that need it and places every slice. `previous` records earlier
/// placements by unit id, and `previous_slicing` the cut they were made with: a new slice
/// inherits the placement of the slice it was cut from, a merged one that of its heaviest part,
/// and the lower half of a slice cut in this pass stays where that slice was.
///
/// `sticky-balanced` spends a budget of moves per pass, counted in units; when inputs changed and
/// it ends above its target balance, the heaviest slice of a cut cluster on the heaviest shard is
/// halved and the pass placed again, as long as that lowers the heaviest load. Last, two halves
/// that ended on the same shard are one slice again: a cut costs nothing where it separates
/// nothing. A first placement (no `previous`) that left whole a cluster it had cut, because the
/// cut did not pay from scratch, is planned again from itself, as the next pass would plan it.
pub fn assign_sliced(
    config: &StrategyConfig,
    slice_config: &SliceConfig,
    clusters: &[Cluster],
    keys: &AppKeys,
    shards: &ShardSet,
    previous: Option<&PreviousPlacement>,
    previous_slicing: &Slicing,
) -> Result<SlicedAssignment, AssignError> {
    let pass = Pass {
        config,
        clusters,
        keys,
        shards,
        previous,
        previous_slicing,
    };
    let (sliced, cuts_rejected) = pass.run(slice_config)?;
    if !cuts_rejected || previous.is_some() {
        return Ok(sliced);
    }
    // A cut is judged from where the fleet is (its lower half stays home), and a first
    // placement has no "where": one that left a cluster whole because cutting it did not pay
    // from scratch is judged again from where it leaves the fleet, as the next pass would
    // judge it, so that re-planning a first placement never cuts what it left whole.
    let recorded = sliced.assignment.to_previous();
    let again = Pass {
        previous: Some(&recorded),
        previous_slicing: &sliced.slicing,
        ..pass
    };
    Ok(again.run(slice_config)?.0)
}

/// The busiest shard's load, each shard counting `copy_cost` for every cache copy it holds: what
/// a cut must lower to stand. A cut cluster's copies are held by the shards of its slices other
/// than that of its first slice (the lower half of a cut stays where the cluster was).
fn cost_with_copies(sliced: &SlicedAssignment, copy_cost: u64) -> u64 {
    let mut loads: BTreeMap<ShardId, u64> = sliced
        .assignment
        .shard_loads()
        .iter()
        .map(|(&shard, l)| (shard, l.load))
        .collect();
    for units in sliced.units.values().filter(|units| units.len() > 1) {
        let shards: Vec<ShardId> = units
            .iter()
            .filter_map(|(_, unit)| sliced.assignment.shard_of(unit))
            .collect();
        let Some((&home, rest)) = shards.split_first() else {
            continue;
        };
        let holders: BTreeSet<ShardId> = rest.iter().copied().filter(|&s| s != home).collect();
        for shard in holders {
            if let Some(load) = loads.get_mut(&shard) {
                *load = load.saturating_add(copy_cost);
            }
        }
    }
    loads.into_values().max().unwrap_or(0)
}

/// The inputs of one planning pass.
struct Pass<'a> {
    config: &'a StrategyConfig,
    clusters: &'a [Cluster],
    keys: &'a AppKeys,
    shards: &'a ShardSet,
    previous: Option<&'a PreviousPlacement>,
    previous_slicing: &'a Slicing,
}

/// A placement of slices, and the slices it held in place because they are the lower half of a
/// cut made in this pass (they are not pinned by the user).
struct Placed {
    sliced: SlicedAssignment,
    held: BTreeSet<String>,
}

impl Pass<'_> {
    /// The pass, and whether it left whole clusters it had cut because the cuts did not pay.
    fn run(&self, slice_config: &SliceConfig) -> Result<(SlicedAssignment, bool), AssignError> {
        let slicing = if slices(self.config.kind) {
            slice_fleet(
                self.clusters,
                self.keys,
                self.shards.len(),
                self.previous_slicing,
                slice_config,
            )
        } else {
            Slicing::default()
        };
        let copy_cost = slice_config.copy_cost;
        let mut placed = self.place(slicing)?;
        // Like the strategy itself, refinement leaves a pass alone whose inputs did not change
        // since `previous`: then the strategy gave back `previous` exactly.
        let unchanged = self
            .previous
            .is_some_and(|p| *p == placed.sliced.assignment.to_previous());
        if self.config.kind.uses_previous() && !placed.sliced.slicing.is_empty() && !unchanged {
            placed = refine(self, placed, copy_cost)?;
        }
        let (placed, cuts_rejected) = self.unless_cuts_pay(placed, copy_cost)?;
        let target = per_shard_target(self.clusters, self.shards.len());
        Ok((placed.finish(target, self.keys), cuts_rejected))
    }

    /// `placed`, or the same pass with the clusters it newly cut left whole when the cuts do
    /// not pay: a cut stands only if it lowers the busiest shard's load by more than its cache
    /// copies cost. (A cut that separates nothing, two halves on one shard, costs no copy and
    /// is merged by [`Placed::finish`].)
    /// Also says whether the cuts were left out.
    fn unless_cuts_pay(
        &self,
        placed: Placed,
        copy_cost: u64,
    ) -> Result<(Placed, bool), AssignError> {
        let fresh: Vec<String> = placed
            .sliced
            .slicing
            .cut()
            .filter(|(id, _)| self.previous_slicing.slices_of(id) == [KeyRange::WHOLE])
            .map(|(id, _)| id.to_string())
            .collect();
        if fresh.is_empty() {
            return Ok((placed, false));
        }
        let whole = fresh
            .iter()
            .fold(placed.sliced.slicing.clone(), |s, id| s.without(id));
        let uncut = self.place(whole)?;
        let pays = cost_with_copies(&placed.sliced, copy_cost)
            < cost_with_copies(&uncut.sliced, copy_cost);
        Ok(if pays { (placed, false) } else { (uncut, true) })
    }

    /// Places every slice of `slicing` with the strategy.
    fn place(&self, slicing: Slicing) -> Result<Placed, AssignError> {
        let mut units = BTreeMap::new();
        let mut inputs = Vec::new();
        let mut recorded = PreviousPlacement::new();
        let mut held = BTreeSet::new();
        for cluster in self.clusters {
            let cluster_keys = self.keys.get(&cluster.id);
            let cut = slicing.slices_of(&cluster.id);
            let mut ids = Vec::with_capacity(cut.len());
            for &range in cut {
                let id = slice_id(&cluster.id, range);
                let apps = match cluster_keys {
                    Some(k) if range != KeyRange::WHOLE => count_in(k, range),
                    _ => cluster.apps,
                };
                let mut pin = cluster.pin;
                if let Some(previous) = self.previous {
                    let before = self.previous_slicing.slices_of(&cluster.id);
                    match inherited(previous, &cluster.id, range, before, cluster_keys) {
                        Inherited::Same(placement) => {
                            recorded.insert(id.clone(), placement.shard, placement.load)
                        }
                        Inherited::From(shard, lower_half) => {
                            recorded.insert(id.clone(), shard, None);
                            if lower_half && pin.is_none() && self.shards.contains(shard) {
                                pin = Some(shard);
                                held.insert(id.clone());
                            }
                        }
                        Inherited::Nothing => {}
                    }
                }
                inputs.push(Cluster {
                    id: id.clone(),
                    name: if range == KeyRange::WHOLE {
                        cluster.name.clone()
                    } else {
                        format!("{}#{range}", cluster.name)
                    },
                    apps,
                    pin,
                    weight: cluster.weight,
                });
                ids.push((range, id));
            }
            units.insert(cluster.id.clone(), ids);
        }
        if let Some(live) = self.previous.and_then(PreviousPlacement::live_shards) {
            recorded = recorded.with_live_shards(live.clone());
        }
        let assignment = assign(
            self.config,
            &inputs,
            self.shards,
            self.previous.map(|_| &recorded),
        )?;
        Ok(Placed {
            sliced: SlicedAssignment {
                assignment,
                slicing,
                units,
            },
            held,
        })
    }
}

/// At most this many slices are halved to refine one pass.
const MAX_REFINEMENTS: usize = 32;

/// Halves slices of cut clusters on the heaviest shard while the pass ends above the strategy's
/// target balance and halving lowers the heaviest load plus the cost of the cache copies (then
/// the sum of squared loads). Only clusters already cut are refined, so a cluster that fits a
/// shard is never cut; halves that end on one shard are merged again by [`Placed::finish`].
fn refine(pass: &Pass<'_>, mut best: Placed, copy_cost: u64) -> Result<Placed, AssignError> {
    let mut halvings = 0;
    // Ends when no shard is above the target balance (nothing is halvable then), or when no
    // halving lowers the heaviest load.
    'refine: while halvings < MAX_REFINEMENTS {
        let score = |s: &SlicedAssignment| -> (u64, u128) {
            let loads = s.assignment.shard_loads().values().map(|l| l.load);
            (
                cost_with_copies(s, copy_cost),
                loads.map(|l| u128::from(l) * u128::from(l)).sum(),
            )
        };
        let current = score(&best.sliced);
        for (cluster, range) in halvable(&best, pass.keys, pass.config.target_balance) {
            let Some(slicing) = best.sliced.slicing.halved(&cluster, range) else {
                continue;
            };
            halvings += 1;
            let candidate = pass.place(slicing)?;
            if score(&candidate.sliced) < current {
                best = candidate;
                continue 'refine;
            }
            if halvings >= MAX_REFINEMENTS {
                break;
            }
        }
        break;
    }
    Ok(best)
}

/// Slices that may be halved, on the shards above `target_balance` times the mean, heaviest
/// shard first, then heaviest slice first (ties: unit id): slices of clusters that are cut,
/// with more than one app, not held in place.
fn halvable(placed: &Placed, keys: &AppKeys, target_balance: Ratio) -> Vec<(String, KeyRange)> {
    let sliced = &placed.sliced;
    let shard_loads = sliced.assignment.shard_loads();
    let total: u64 = shard_loads.values().map(|l| l.load).sum();
    let count = shard_loads.len() as u64;
    let over = |shard: ShardId| {
        shard_loads
            .get(&shard)
            .is_some_and(|l| !target_balance.bounds(l.load.saturating_mul(count), total))
    };
    let mut found: Vec<(u64, u64, String, String, KeyRange)> = Vec::new();
    for (cluster, units) in &sliced.units {
        if units.len() < 2 {
            continue;
        }
        for (range, unit) in units {
            let Some(placement) = sliced.assignment.placements().get(unit) else {
                continue;
            };
            let apps = keys.get(cluster).map_or(0, |k| count_in(k, *range));
            if over(placement.shard) && apps > 1 && !placed.held.contains(unit) {
                let shard_load = shard_loads.get(&placement.shard).map_or(0, |l| l.load);
                found.push((
                    shard_load,
                    placement.load,
                    unit.clone(),
                    cluster.clone(),
                    *range,
                ));
            }
        }
    }
    found.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then_with(|| a.2.cmp(&b.2))
    });
    found
        .into_iter()
        .map(|(_, _, _, cluster, range)| (cluster, range))
        .collect()
}

impl Placed {
    /// The final assignment: sibling slices that share a shard merged while the merged slice
    /// fits the per-shard target (so that the next pass does not cut it again), and slices held
    /// in place for this pass no longer reported as pinned.
    fn finish(self, target: u64, keys: &AppKeys) -> SlicedAssignment {
        let Placed { mut sliced, held } = self;
        for id in &held {
            if let Some(placement) = sliced.assignment.placements.get_mut(id) {
                placement.pinned = false;
            }
        }
        let cut: Vec<String> = sliced.slicing.cut().map(|(id, _)| id.to_string()).collect();
        for cluster in cut {
            while let Some(parent) = mergeable_pair(&sliced, &cluster, target) {
                merge_units(&mut sliced, &cluster, parent, keys);
            }
        }
        sliced
    }
}

/// Two halves of a cut cluster on the same shard whose parent fits `target`, the first in range
/// order.
fn mergeable_pair(sliced: &SlicedAssignment, cluster: &str, target: u64) -> Option<KeyRange> {
    let units = sliced.units.get(cluster)?;
    units.windows(2).find_map(|pair| {
        let [(low, low_id), (high, high_id)] = pair else {
            return None;
        };
        let parent = low.parent()?;
        let placements = sliced.assignment.placements();
        let (a, b) = (placements.get(low_id)?, placements.get(high_id)?);
        (high.parent() == Some(parent)
            && low < high
            && a.shard == b.shard
            && a.load.saturating_add(b.load) <= target)
            .then_some(parent)
    })
}

/// Replaces the two halves of `parent` by one slice on their shard.
fn merge_units(sliced: &mut SlicedAssignment, cluster: &str, parent: KeyRange, keys: &AppKeys) {
    let Some(units) = sliced.units.get_mut(cluster) else {
        return;
    };
    let halves: Vec<String> = units
        .iter()
        .filter(|(range, _)| range.within(parent))
        .map(|(_, id)| id.clone())
        .collect();
    units.retain(|(range, _)| !range.within(parent));
    let id = slice_id(cluster, parent);
    units.push((parent, id.clone()));
    units.sort();
    let assignment = &mut sliced.assignment;
    let mut merged: Option<Placement> = None;
    for half in &halves {
        let Some(p) = assignment.placements.remove(half) else {
            continue;
        };
        merged = Some(match merged {
            None => p,
            Some(m) => {
                if let Some(shard) = assignment.shards.get_mut(&m.shard) {
                    shard.clusters -= 1;
                }
                Placement {
                    shard: m.shard,
                    apps: m.apps + p.apps,
                    load: m.load + p.load,
                    pinned: false,
                }
            }
        });
    }
    if let Some(mut placement) = merged {
        if let Some(k) = keys.get(cluster) {
            placement.apps = count_in(k, parent);
        }
        assignment.placements.insert(id, placement);
    }
    sliced.slicing.merge(cluster, parent);
}

/// What a slice inherits from the previous placement.
enum Inherited {
    /// The same slice was placed before.
    Same(crate::model::RecordedPlacement),
    /// A new slice: the shard of the slice it was cut from (and whether it lies in that slice's
    /// lower half, which stays there), or of the heaviest part it merges.
    From(ShardId, bool),
    Nothing,
}

fn inherited(
    previous: &PreviousPlacement,
    cluster_id: &str,
    range: KeyRange,
    before: &[KeyRange],
    keys: Option<&Vec<u64>>,
) -> Inherited {
    if before.contains(&range) {
        return previous
            .get(&slice_id(cluster_id, range))
            .map_or(Inherited::Nothing, Inherited::Same);
    }
    // Cut from an earlier, larger slice.
    if let Some(&ancestor) = before.iter().find(|&&b| range.within(b)) {
        let Some(placement) = previous.get(&slice_id(cluster_id, ancestor)) else {
            return Inherited::Nothing;
        };
        // The lower half of the slice that was stays, however finely it is cut now.
        let lower_half = ancestor.halves().is_some_and(|(low, _)| range.within(low));
        return Inherited::From(placement.shard, lower_half);
    }
    // Merged from earlier, smaller slices: where most of its apps were.
    let heaviest = before
        .iter()
        .filter(|b| b.within(range))
        .filter_map(|&b| {
            let placement = previous.get(&slice_id(cluster_id, b))?;
            let apps = keys.map_or(0, |k| count_in(k, b));
            Some((apps, std::cmp::Reverse(b), placement.shard))
        })
        .max();
    heaviest.map_or(Inherited::Nothing, |(_, _, shard)| {
        Inherited::From(shard, false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slicing::app_key;

    /// A UID as the API server makes them: a random (here: derived) version-4 UUID. Only
    /// random UIDs spread evenly over the key space; FNV-1a of `app-1`, `app-2`, ... does not.
    fn uid(cluster: &str, n: u64) -> String {
        let a = app_key(&format!("{cluster}/{n}/a"));
        let b = app_key(&format!("{cluster}/{n}/b"));
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    /// A cluster with `apps` apps, and their keys.
    fn cluster(id: &str, apps: u64, keys: &mut AppKeys) -> Cluster {
        let mut k: Vec<u64> = (0..apps).map(|n| app_key(&uid(id, n))).collect();
        k.sort_unstable();
        keys.insert(id.to_string(), k);
        Cluster::new(id, apps)
    }

    #[test]
    fn a_slicing_switch_reads_back_its_name_and_nothing_else() {
        for switch in SliceSwitch::ALL {
            assert_eq!(switch.name().parse::<SliceSwitch>(), Ok(switch));
        }
        for kind in StrategyKind::every() {
            assert_eq!(
                SliceSwitch::Auto.slices(kind),
                kind == StrategyKind::StickyBalanced
            );
            assert_eq!(SliceSwitch::On.slices(kind), slices(kind), "{kind}");
            assert!(!SliceSwitch::Off.slices(kind));
        }
        assert!(!slices(StrategyKind::LegacyModulo) && slices(StrategyKind::BoundedLoad));
        assert_eq!(SliceSwitch::On.to_string(), "on");
        for text in ["", "ON", "auto ", "of"] {
            assert_eq!(
                text.parse::<SliceSwitch>(),
                Err(ParseError::UnknownSliceSwitch(text.to_string())),
                "{text:?}"
            );
        }
    }

    fn sticky() -> StrategyConfig {
        StrategyConfig::new(StrategyKind::StickyBalanced)
    }

    /// A first assignment, with slicing on.
    fn fresh(
        config: &StrategyConfig,
        clusters: &[Cluster],
        keys: &AppKeys,
        shards: &ShardSet,
    ) -> SlicedAssignment {
        let slicing = SliceConfig::enabled();
        assign_sliced(
            config,
            &slicing,
            clusters,
            keys,
            shards,
            None,
            &Slicing::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_hot_cluster_is_cut_and_spread_and_the_rest_stay_whole() {
        let mut keys = AppKeys::new();
        let mut clusters = vec![cluster("hot", 600, &mut keys)];
        for i in 0..8 {
            clusters.push(cluster(&format!("c{i}"), 50, &mut keys));
        }
        let shards = ShardSet::contiguous(4);
        let whole = assign(&sticky(), &clusters, &shards, None).unwrap();
        let sliced = fresh(&sticky(), &clusters, &keys, &shards);
        assert!(whole.balance().max_over_mean > 2.0);
        assert!(
            sliced.assignment.balance().max_over_mean < 1.3,
            "{:?}",
            sliced.assignment.shard_loads()
        );
        let cut = sliced.slicing.slices_of("hot");
        assert!(cut.len() >= 4, "{cut:?}");
        assert_eq!(sliced.slicing.slices_of("c0"), [KeyRange::WHOLE]);
        assert!(sliced.cache_copies() >= 3 && sliced.cache_copies() < cut.len());
        let apps: u64 = sliced
            .assignment
            .placements()
            .values()
            .map(|p| p.apps)
            .sum();
        assert_eq!(apps, 1000, "every app in exactly one slice");
    }

    #[test]
    fn every_cut_lowers_the_busiest_shard_small_fleets_and_skewed_ones() {
        let busiest = |a: &Assignment| a.shard_loads().values().map(|l| l.load).max().unwrap();
        let (mut cut, mut whole) = (0, 0);
        for seed in 0..200u64 {
            // 2 to 6 clusters of 1 to 12 apps, every fourth fleet with one of 20 to 60.
            let mut keys = AppKeys::new();
            let count = 2 + seed % 5;
            let clusters: Vec<Cluster> = (0..count)
                .map(|i| {
                    let size = if i == 0 && seed % 4 == 0 {
                        20 + app_key(&format!("{seed}/{i}")) % 41
                    } else {
                        1 + app_key(&format!("{seed}/{i}")) % 12
                    };
                    cluster(&format!("s{seed}c{i}"), size, &mut keys)
                })
                .collect();
            let shards = ShardSet::contiguous(2 + (seed % 3) as u32);
            for kind in [StrategyKind::StickyBalanced, StrategyKind::BoundedLoad] {
                let config = StrategyConfig::new(kind);
                let sliced = fresh(&config, &clusters, &keys, &shards);
                let uncut = assign(&config, &clusters, &shards, None).unwrap();
                if sliced.cache_copies() == 0 {
                    whole += 1;
                    continue;
                }
                cut += 1;
                assert!(
                    busiest(&sliced.assignment) < busiest(&uncut),
                    "seed {seed} {kind:?}: cut {:?} against whole {:?}",
                    sliced.assignment.shard_loads(),
                    uncut.shard_loads()
                );
            }
        }
        // Both cases occur.
        assert!(cut > 10 && whole > 10, "{cut} cut, {whole} whole");
    }

    #[test]
    fn a_cut_must_lower_the_busiest_shard_by_more_than_its_copies_cost() {
        // A cluster of 60 apps beside four of 10 on 2 shards: whole, the busiest shard holds
        // 60; cut, about 50 on each (100 / 2), one of them holding a copy.
        let mut keys = AppKeys::new();
        let mut clusters = vec![cluster("big", 60, &mut keys)];
        for i in 0..4 {
            clusters.push(cluster(&format!("c{i}"), 10, &mut keys));
        }
        let shards = ShardSet::contiguous(2);
        let place = |copy_cost| {
            assign_sliced(
                &sticky(),
                &SliceConfig::enabled().with_copy_cost(copy_cost),
                &clusters,
                &keys,
                &shards,
                None,
                &Slicing::default(),
            )
            .unwrap()
        };
        let busiest = |s: &SlicedAssignment| {
            s.assignment
                .shard_loads()
                .values()
                .map(|l| l.load)
                .max()
                .unwrap()
        };
        let free = place(0);
        assert_eq!(free.cache_copies(), 1, "{:?}", free.slicing);
        assert!(busiest(&free) < 60, "{:?}", free.assignment.shard_loads());
        // The shard holding the copy, with the copy's cost, must stay under 60.
        let copy_shard = free.units["big"]
            .iter()
            .filter_map(|(_, unit)| free.assignment.shard_of(unit))
            .next_back()
            .unwrap();
        let copy_load = free.assignment.shard_loads()[&copy_shard].load;
        let headroom = 60 - copy_load;
        assert_eq!(place(headroom - 1).slicing, free.slicing);
        let dear = place(headroom);
        assert_eq!(dear.slicing, Slicing::default());
        assert_eq!(busiest(&dear), 60);
    }

    #[test]
    fn without_need_or_for_argo_cds_strategies_nothing_is_cut() {
        let mut keys = AppKeys::new();
        let clusters: Vec<Cluster> = (0..6)
            .map(|i| cluster(&format!("c{i}"), 100, &mut keys))
            .collect();
        let shards = ShardSet::contiguous(3);
        let sliced = fresh(&sticky(), &clusters, &keys, &shards);
        assert_eq!(sliced.slicing, Slicing::default());
        assert_eq!(
            sliced.assignment,
            assign(&sticky(), &clusters, &shards, None).unwrap()
        );
        let mut hot = clusters.clone();
        hot.push(cluster("hot", 5000, &mut keys));
        for kind in [
            StrategyKind::LegacyModulo,
            StrategyKind::ArgoCdConsistentHashing,
        ] {
            let result = fresh(&StrategyConfig::new(kind), &hot, &keys, &shards);
            assert_eq!(result.slicing, Slicing::default(), "{kind}");
        }
    }

    #[test]
    fn a_fresh_cut_keeps_its_lower_half_in_place_and_replanning_moves_nothing() {
        let mut keys = AppKeys::new();
        let mut clusters = vec![cluster("hot", 100, &mut keys)];
        for i in 0..6 {
            clusters.push(cluster(&format!("c{i}"), 40, &mut keys));
        }
        let shards = ShardSet::contiguous(3);
        let first = assign(&sticky(), &clusters, &shards, None).unwrap();
        let hot_shard = first.shard_of("hot").unwrap();
        // The hot cluster grows past the per-shard target.
        let mut grown = clusters.clone();
        grown[0] = cluster("hot", 900, &mut keys);
        let cut = assign_sliced(
            &sticky(),
            &SliceConfig::enabled(),
            &grown,
            &keys,
            &shards,
            Some(&first.to_previous()),
            &Slicing::default(),
        )
        .unwrap();
        let slices = cut.slicing.slices_of("hot");
        assert!(slices.len() > 1);
        assert_eq!(
            cut.assignment.shard_of(&slice_id("hot", slices[0])),
            Some(hot_shard)
        );
        // Held in place for the pass, but not reported as pinned: nobody pinned it.
        assert!(!cut.assignment.placements()[&slice_id("hot", slices[0])].pinned);
        // Planning again on its own output, nothing changed: nothing moves, nothing is re-cut.
        let again = assign_sliced(
            &sticky(),
            &SliceConfig::enabled(),
            &grown,
            &keys,
            &shards,
            Some(&cut.assignment.to_previous()),
            &cut.slicing,
        )
        .unwrap();
        assert_eq!(again.slicing, cut.slicing);
        assert_eq!(again.moves_since(&cut, &keys), SliceMoves::default());
        let shards_of = |a: &SlicedAssignment| -> Vec<(String, ShardId)> {
            a.assignment
                .placements()
                .iter()
                .map(|(id, p)| (id.clone(), p.shard))
                .collect()
        };
        assert_eq!(shards_of(&again), shards_of(&cut));
    }

    /// A placement of `hot`'s slices `cut` and of a whole cluster `c0`, each on the shard given
    /// (by pins), finished with `target`.
    fn finished(cut: &[(KeyRange, ShardId)], target: u64) -> SlicedAssignment {
        let mut keys = AppKeys::new();
        cluster("hot", 64, &mut keys);
        let c0 = cluster("c0", 10, &mut keys);
        let mut inputs: Vec<Cluster> = cut
            .iter()
            .map(|&(range, shard)| Cluster {
                pin: Some(shard),
                ..Cluster::new(slice_id("hot", range), count_in(&keys["hot"], range))
            })
            .collect();
        inputs.push(Cluster { pin: Some(2), ..c0 });
        let assignment = assign(&sticky(), &inputs, &ShardSet::contiguous(3), None).unwrap();
        let ranges: Vec<KeyRange> = cut.iter().map(|&(range, _)| range).collect();
        let units = BTreeMap::from([
            (
                "hot".to_string(),
                ranges.iter().map(|&r| (r, slice_id("hot", r))).collect(),
            ),
            ("c0".to_string(), vec![(KeyRange::WHOLE, "c0".to_string())]),
        ]);
        let placed = Placed {
            sliced: SlicedAssignment {
                assignment,
                slicing: Slicing::default().with("hot", ranges).unwrap(),
                units,
            },
            held: BTreeSet::new(),
        };
        placed.finish(target, &keys)
    }

    #[test]
    fn halves_that_share_a_shard_are_one_slice_again_while_it_fits_the_target() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let (high_a, high_b) = high.halves().unwrap();
        let apps =
            |s: &SlicedAssignment, range| s.assignment.placements()[&slice_id("hot", range)].apps;
        // The quarters of the high half share shard 1; the low half is not their sibling.
        let merged = finished(&[(low, 1), (high_a, 1), (high_b, 1)], 64);
        // Folded pairwise up to the whole cluster, its apps and load those of all its parts.
        assert_eq!(merged.slicing, Slicing::default());
        assert_eq!(merged.units["hot"], [(KeyRange::WHOLE, "hot".to_string())]);
        let hot = &merged.assignment.placements()["hot"];
        assert_eq!(
            (hot.shard, hot.apps, hot.load, hot.pinned),
            (1, 64, 64, false)
        );
        assert_eq!(merged.assignment.placements().len(), 2);
        let shard_1 = merged.assignment.shard_loads()[&1];
        assert_eq!((shard_1.clusters, shard_1.load), (1, 64));
        assert_eq!(merged.assignment.shard_loads()[&2].clusters, 1);
        // The whole would exceed the target: only the quarters fold, into the high half.
        let folded = finished(&[(low, 1), (high_a, 1), (high_b, 1)], 63);
        assert_eq!(folded.slicing.slices_of("hot"), [low, high]);
        assert_eq!(folded.assignment.shard_of(&slice_id("hot", high)), Some(1));
        assert_eq!(apps(&folded, low) + apps(&folded, high), 64);
        assert_eq!(folded.assignment.shard_loads()[&1].clusters, 2);
        // Halves on two shards stay apart, whatever the target; so do cousins on one shard.
        let apart = finished(&[(low, 0), (high_a, 1), (high_b, 0)], 64);
        assert_eq!(apart.slicing.slices_of("hot"), [low, high_a, high_b]);
        assert_eq!(apart.assignment.shard_loads()[&0].clusters, 2);
    }

    #[test]
    fn moves_count_the_apps_that_changed_shard_and_which_left_a_live_one() {
        let mut keys = AppKeys::new();
        let a = cluster("a", 64, &mut keys);
        let b = cluster("b", 10, &mut keys);
        let pinned = |id: &str, apps, shard| Cluster {
            pin: Some(shard),
            ..Cluster::new(id, apps)
        };
        let before = SlicedAssignment::uncut(
            assign(
                &sticky(),
                &[pinned("a", 64, 0), pinned("b", 10, 1)],
                &ShardSet::contiguous(3),
                None,
            )
            .unwrap(),
        );
        // Shard 1 is gone: a's high half leaves live shard 0 for 2, b leaves gone shard 1.
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let (low_apps, high_apps) = (count_in(&keys["a"], low), count_in(&keys["a"], high));
        let live: ShardSet = [0, 2].into_iter().collect();
        let after = SlicedAssignment {
            assignment: assign(
                &sticky(),
                &[
                    pinned(&slice_id("a", low), low_apps, 0),
                    pinned(&slice_id("a", high), high_apps, 2),
                    pinned("b", 10, 2),
                ],
                &live,
                None,
            )
            .unwrap(),
            slicing: Slicing::default().with("a", vec![low, high]).unwrap(),
            units: BTreeMap::from([
                (
                    "a".to_string(),
                    vec![(low, slice_id("a", low)), (high, slice_id("a", high))],
                ),
                ("b".to_string(), vec![(KeyRange::WHOLE, "b".to_string())]),
            ]),
        };
        assert!(high_apps > 0 && low_apps > 0 && a.apps == 64 && b.apps == 10);
        assert_eq!(
            after.moves_since(&before, &keys),
            SliceMoves {
                clusters: 2,
                voluntary_clusters: 1,
                apps: high_apps + 10,
                voluntary_apps: high_apps,
            }
        );
        assert_eq!(before.moves_since(&before, &keys), SliceMoves::default());
    }

    #[test]
    fn a_scale_down_of_a_skewed_fleet_is_refined_to_the_target_balance() {
        // Zipf-distributed app counts (exponent 1.5): the first cluster holds 40% of the apps.
        let mut keys = AppKeys::new();
        let clusters: Vec<Cluster> = (1..=60u32)
            .map(|rank| {
                let apps = (4000.0 / f64::from(rank).powf(1.5)).round() as u64;
                cluster(&format!("c{rank:02}"), apps.max(1), &mut keys)
            })
            .collect();
        let ten = fresh(&sticky(), &clusters, &keys, &ShardSet::contiguous(10));
        let nine_shards = ShardSet::contiguous(9);
        let previous = ten.assignment.to_previous();
        let pass = Pass {
            config: &sticky(),
            clusters: &clusters,
            keys: &keys,
            shards: &nine_shards,
            previous: Some(&previous),
            previous_slicing: &ten.slicing,
        };
        let slicing = slice_fleet(&clusters, &keys, 9, &ten.slicing, &SliceConfig::enabled());
        let unrefined = pass.place(slicing).unwrap().sliced;
        let nine = assign_sliced(
            &sticky(),
            &SliceConfig::enabled(),
            &clusters,
            &keys,
            &nine_shards,
            Some(&previous),
            &ten.slicing,
        )
        .unwrap();
        let before = unrefined.assignment.balance().max_over_mean;
        let after = nine.assignment.balance().max_over_mean;
        assert!(before > 1.05 && after <= 1.05, "{before} -> {after}");
        // No shard holds both halves of one slice.
        for (cluster, units) in &nine.units {
            for pair in units.windows(2) {
                let same_parent = pair[0].0.parent() == pair[1].0.parent();
                let shard = |id: &str| nine.assignment.shard_of(id);
                assert!(
                    !(same_parent && shard(&pair[0].1) == shard(&pair[1].1)),
                    "{cluster}: {pair:?}"
                );
            }
        }
        assert!(nine.cache_copies() <= 8, "{}", nine.cache_copies());
    }
}
