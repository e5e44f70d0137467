//! Slices: parts of one cluster's apps, so that a cluster too big for one shard can be spread.
//!
//! An app's **key** is the 64-bit FNV-1a hash of its UID's text ([`app_key`]), the hash
//! Kubernetes adopted for server-side sharded list and watch (KEP-5866, "Server-side Sharded
//! List and Watch", alpha in 1.36 behind the `ShardedListAndWatch` gate), so that a slice is a
//! range an API server can filter on ([`KeyRange::selector`]). Keys spread evenly only because
//! UIDs are random: FNV-1a of names such as `app-1`, `app-2` is very uneven in its top bits. A **slice** of a cluster is an aligned binary range of keys
//! ([`KeyRange`]): the whole key space, or one half of a slice. Halving is the only way slices are
//! made, and merging two halves back the only way they go, so that a split leaves one half
//! exactly where the slice was and the slices of a cluster always cover its keys exactly once.
//!
//! [`slice_fleet`] decides how every cluster is cut, from its apps' keys, the per-shard target
//! and how it was cut before. It is pure and independent of input order, like the strategies.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::Cluster;
use crate::ratio::Ratio;

/// The key of an app: 64-bit FNV-1a of its UID's bytes.
pub fn app_key(uid: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    uid.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// The deepest a slice may be: 2^16 slices of one cluster is far beyond any fleet.
pub const MAX_DEPTH: u8 = 16;

/// An aligned binary range of app keys: the keys whose top `depth` bits are `index`. Ranges
/// order by their first key (then the wider first), so that a sorted cut reads left to right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyRange {
    depth: u8,
    index: u64,
}

impl KeyRange {
    /// Every key: the one slice of a cluster that is not split.
    pub const WHOLE: KeyRange = KeyRange { depth: 0, index: 0 };

    /// The range of the given depth and index; `None` unless `index < 2^depth` and
    /// `depth <= 16`.
    pub fn new(depth: u8, index: u64) -> Option<Self> {
        (depth <= MAX_DEPTH && index < (1u64 << depth)).then_some(Self { depth, index })
    }

    /// How many halvings of the whole key space give this range (0 for the whole).
    pub fn depth(self) -> u8 {
        self.depth
    }

    /// Which range of its depth this is, counted from the lowest keys.
    pub fn index(self) -> u64 {
        self.index
    }

    /// The first key of the range.
    pub fn start(self) -> u64 {
        if self.depth == 0 {
            0
        } else {
            self.index << (64 - u32::from(self.depth))
        }
    }

    /// The last key of the range (inclusive: the end of the last range is not a u64).
    pub fn last(self) -> u64 {
        if self.depth == 0 {
            u64::MAX
        } else {
            self.start() | (u64::MAX >> u32::from(self.depth))
        }
    }

    /// The range as a KEP-5866 shard selector on `metadata.uid` (alpha in Kubernetes 1.36,
    /// feature gate `ShardedListAndWatch`): 16 lowercase hex digits per bound, the end
    /// exclusive, and 2^64 written `0x10000000000000000`.
    pub fn selector(self) -> String {
        shard_range(self.start(), self.last())
    }

    /// Whether `key` is in the range.
    pub fn contains(self, key: u64) -> bool {
        self.start() <= key && key <= self.last()
    }

    /// The two halves; `None` at the deepest depth, 16.
    pub fn halves(self) -> Option<(KeyRange, KeyRange)> {
        (self.depth < MAX_DEPTH).then(|| {
            let depth = self.depth + 1;
            (
                KeyRange {
                    depth,
                    index: self.index << 1,
                },
                KeyRange {
                    depth,
                    index: (self.index << 1) | 1,
                },
            )
        })
    }

    /// The range this one is a half of; `None` for [`KeyRange::WHOLE`].
    pub fn parent(self) -> Option<KeyRange> {
        (self.depth > 0).then(|| KeyRange {
            depth: self.depth - 1,
            index: self.index >> 1,
        })
    }

    /// Whether `self` lies within `other` (a range lies within itself).
    pub fn within(self, other: KeyRange) -> bool {
        self.depth >= other.depth
            && (self.index >> u32::from(self.depth - other.depth)) == other.index
    }
}

/// Reads back what [`KeyRange`]'s `Display` writes: `<first>-<last>` in hexadecimal.
impl std::str::FromStr for KeyRange {
    type Err = crate::error::ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || crate::error::ParseError::InvalidKeyRange(s.to_string());
        let (first, last) = s.split_once('-').ok_or_else(invalid)?;
        let first = u64::from_str_radix(first, 16).map_err(|_| invalid())?;
        let last = u64::from_str_radix(last, 16).map_err(|_| invalid())?;
        // An aligned range holds 2^(64 - depth) keys and starts at a multiple of that.
        let span = last
            .checked_sub(first)
            .map(|gap| u128::from(gap) + 1)
            .filter(|span| span.is_power_of_two())
            .ok_or_else(invalid)?;
        let depth = 64 - span.trailing_zeros();
        let depth = u8::try_from(depth).map_err(|_| invalid())?;
        let index = if depth == 0 {
            0
        } else {
            first >> (64 - u32::from(depth))
        };
        KeyRange::new(depth, index)
            .filter(|r| r.start() == first)
            .ok_or_else(invalid)
    }
}

impl Ord for KeyRange {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.start(), self.depth).cmp(&(other.start(), other.depth))
    }
}

impl PartialOrd for KeyRange {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// `start-last` in hexadecimal, e.g. `0-7fffffffffffffff`.
impl fmt::Display for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}-{:x}", self.start(), self.last())
    }
}

/// When clusters are cut into slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceConfig {
    /// Off: every cluster is one slice.
    pub enabled: bool,
    /// A cut cluster folds back into one slice once its whole load is at most this fraction of
    /// the per-shard target; between it and the target the cut stays as it is (hysteresis).
    pub merge_below: Ratio,
    /// What one cache copy costs (a cluster on one shard more), in the strategy's load units: a
    /// new cut or a further halving stands only if it lowers the busiest shard's load by more
    /// than the copies it adds cost.
    pub copy_cost: u64,
}

impl SliceConfig {
    const DEFAULT_MERGE_BELOW: Ratio = Ratio::from_thousandths(750);

    /// What a cache copy (a cluster on one shard more) costs when load is counted in apps of
    /// weight 1, as measured on shardwise's controller with the benchmarks' realistic apps
    /// (docs/benchmarks.md): holding a cluster more costs a replica 273 KiB of resident memory
    /// and an app's cache (three objects) 5,450 bytes, so a copy takes the memory of 51 apps.
    /// Memory is a fifth of what an app weighs (the planner's default `--load-memory-weight`),
    /// so a copy weighs as much as 10 apps.
    pub const MEASURED_COPY_COST_APPS: u64 = 10;

    /// Slicing on, with the default merge threshold (3/4 of the target) and free cache copies.
    pub const fn enabled() -> Self {
        Self {
            enabled: true,
            merge_below: Self::DEFAULT_MERGE_BELOW,
            copy_cost: 0,
        }
    }

    /// Slicing off: every cluster stays one slice.
    pub const fn disabled() -> Self {
        Self {
            enabled: false,
            merge_below: Self::DEFAULT_MERGE_BELOW,
            copy_cost: 0,
        }
    }

    /// This configuration with each cache copy costing `copy_cost` load units.
    pub const fn with_copy_cost(mut self, copy_cost: u64) -> Self {
        self.copy_cost = copy_cost;
        self
    }
}

/// How each cluster is cut: its slices, sorted by range, covering every key exactly once. A
/// cluster that is not cut has the single slice [`KeyRange::WHOLE`] (or is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slicing {
    cuts: BTreeMap<String, Vec<KeyRange>>,
}

impl Slicing {
    /// The slices of a cluster (one whole slice when it is not cut).
    pub fn slices_of(&self, cluster_id: &str) -> &[KeyRange] {
        self.cuts
            .get(cluster_id)
            .map_or(std::slice::from_ref(&KeyRange::WHOLE), Vec::as_slice)
    }

    /// Clusters that are cut, with their slices.
    pub fn cut(&self) -> impl Iterator<Item = (&str, &[KeyRange])> {
        self.cuts.iter().map(|(id, s)| (id.as_str(), s.as_slice()))
    }

    /// Records the slices of a cluster; `None` (and nothing recorded) unless they cover every key
    /// exactly once.
    pub fn with(
        mut self,
        cluster_id: impl Into<String>,
        mut slices: Vec<KeyRange>,
    ) -> Option<Self> {
        slices.sort();
        if !covers_exactly_once(&slices) {
            return None;
        }
        if slices != [KeyRange::WHOLE] {
            self.cuts.insert(cluster_id.into(), slices);
        }
        Some(self)
    }

    /// The slicing with `range` of `cluster_id` cut in halves; `None` if the cluster has no
    /// such slice or it cannot be halved.
    pub(crate) fn halved(&self, cluster_id: &str, range: KeyRange) -> Option<Self> {
        let (low, high) = range.halves()?;
        let mut slices = self.slices_of(cluster_id).to_vec();
        let at = slices.iter().position(|&s| s == range)?;
        slices.splice(at..=at, [low, high]);
        let mut halved = self.clone();
        halved.cuts.insert(cluster_id.to_string(), slices);
        Some(halved)
    }

    /// The slicing with `cluster_id` whole again.
    pub(crate) fn without(&self, cluster_id: &str) -> Self {
        let mut whole = self.clone();
        whole.cuts.remove(cluster_id);
        whole
    }

    /// Replaces the two halves of `parent` in the cut of `cluster_id` by `parent` itself.
    pub(crate) fn merge(&mut self, cluster_id: &str, parent: KeyRange) {
        let Some(slices) = self.cuts.get_mut(cluster_id) else {
            return;
        };
        slices.retain(|s| !s.within(parent));
        slices.push(parent);
        slices.sort();
        if slices.as_slice() == [KeyRange::WHOLE] {
            self.cuts.remove(cluster_id);
        }
    }

    /// Whether no cluster is cut.
    pub fn is_empty(&self) -> bool {
        self.cuts.is_empty()
    }

    /// Slices beyond one per cluster, over all clusters.
    pub fn extra_slices(&self) -> usize {
        self.cuts.values().map(|s| s.len() - 1).sum()
    }
}

/// The cut that the records of a cluster's slices describe, when a recut may be under way
/// (records overlap then): the finest records if they tile the key space (a split under way
/// counts as made), else the widest ones (a split written only in part is made again). Aligned
/// ranges nest or are apart, so the widest never overlap; they tile unless records are missing.
/// Sorted, without repeats.
pub fn recorded_cut(ranges: &[KeyRange]) -> Vec<KeyRange> {
    let mut ranges = ranges.to_vec();
    ranges.sort();
    ranges.dedup();
    let finest: Vec<KeyRange> = ranges
        .iter()
        .copied()
        .filter(|r| !ranges.iter().any(|o| o != r && o.within(*r)))
        .collect();
    if covers_exactly_once(&finest) {
        return finest;
    }
    ranges
        .iter()
        .copied()
        .filter(|r| !ranges.iter().any(|o| o != r && r.within(*o)))
        .collect()
}

/// Whether sorted `slices` tile the key space: each starts right after the previous one ends.
fn covers_exactly_once(slices: &[KeyRange]) -> bool {
    let mut next = Some(0u64);
    for slice in slices {
        if next != Some(slice.start()) {
            return false;
        }
        next = slice.last().checked_add(1);
    }
    next.is_none() && !slices.is_empty()
}

/// One `shardRange` term of a KEP-5866 selector, for the keys `first..=last`.
fn shard_range(first: u64, last: u64) -> String {
    let end = match last.checked_add(1) {
        Some(end) => format!("0x{end:016x}"),
        None => "0x10000000000000000".to_string(),
    };
    format!("shardRange(object.metadata.uid, '0x{first:016x}', '{end}')")
}

/// The most `shardRange` terms [`shard_selector`] joins: kube-apiserver parses the selector as
/// CEL, whose parser bounds the depth of a chain of `||`.
pub const MAX_SHARD_RANGES: usize = 32;

/// A KEP-5866 selector for the keys of `ranges` (adjacent ones joined, overlaps merged), or
/// `None` when it would select every key (nothing to gain: the server sends everything anyway)
/// or when it needs more than [`MAX_SHARD_RANGES`] terms.
pub fn shard_selector(ranges: &[KeyRange]) -> Option<String> {
    let mut ranges = ranges.to_vec();
    ranges.sort();
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for range in ranges {
        match spans.last_mut() {
            Some((_, last)) if last.checked_add(1).is_none_or(|next| range.start() <= next) => {
                *last = (*last).max(range.last());
            }
            _ => spans.push((range.start(), range.last())),
        }
    }
    if spans.is_empty() || spans == [(0, u64::MAX)] || spans.len() > MAX_SHARD_RANGES {
        return None;
    }
    let terms: Vec<String> = spans
        .iter()
        .map(|&(first, last)| shard_range(first, last))
        .collect();
    Some(terms.join(" || "))
}

/// The keys of each cluster's apps. A cluster without keys is never cut (there is nothing to
/// tell its halves apart).
pub type AppKeys = BTreeMap<String, Vec<u64>>;

/// The number of `keys` (sorted) within `range`.
pub fn count_in(keys: &[u64], range: KeyRange) -> u64 {
    let from = keys.partition_point(|&k| k < range.start());
    let to = keys.partition_point(|&k| k <= range.last());
    (to - from) as u64
}

/// How every cluster is cut for `shards` live shards, given how it was cut before.
///
/// The per-shard target is the fleet's load over the shards. A slice heavier than the target
/// is halved (the heaviest first) until none is. A cut cluster folds back into one slice once
/// its whole load is at most `merge_below` of the target; between that and the target its cut
/// stays as it is (hysteresis), so loads that hover near the target do not make slices come and
/// go. So nothing is cut while every cluster fits a shard, and a new cut is as coarse as the
/// target allows. Pinned clusters are never cut: a pin names one shard.
pub fn slice_fleet(
    clusters: &[Cluster],
    keys: &AppKeys,
    shards: usize,
    previous: &Slicing,
    config: &SliceConfig,
) -> Slicing {
    let mut slicing = Slicing::default();
    if !config.enabled || shards == 0 {
        return slicing;
    }
    let target = per_shard_target(clusters, shards);
    for cluster in clusters {
        let Some(cluster_keys) = keys.get(&cluster.id) else {
            continue;
        };
        if cluster.pin.is_some() {
            continue;
        }
        let weight = u64::from(cluster.weight.unwrap_or(1));
        let apps_in = |range: KeyRange| count_in(cluster_keys, range);
        let load_of = |range: KeyRange| apps_in(range).saturating_mul(weight);
        let cut = cut_cluster(
            previous.slices_of(&cluster.id),
            apps_in,
            load_of,
            target,
            config.merge_below,
        );
        if cut != [KeyRange::WHOLE] {
            slicing.cuts.insert(cluster.id.clone(), cut);
        }
    }
    slicing
}

/// The fleet's load over `shards`, rounded up (at least 1): the load a slice may carry.
pub(crate) fn per_shard_target(clusters: &[Cluster], shards: usize) -> u64 {
    let total = clusters
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.load()));
    total.div_ceil(shards.max(1) as u64).max(1)
}

/// One cluster's cut: the previous one, folded up if the cluster is light again, then with its
/// heavy slices halved.
fn cut_cluster(
    previous: &[KeyRange],
    apps_in: impl Fn(KeyRange) -> u64,
    load_of: impl Fn(KeyRange) -> u64,
    target: u64,
    merge_below: Ratio,
) -> Vec<KeyRange> {
    let mut slices: Vec<KeyRange> = if merge_below.bounds(load_of(KeyRange::WHOLE), target) {
        vec![KeyRange::WHOLE]
    } else {
        previous.to_vec()
    };
    // Split: the heaviest slice over the target first (ties: the lowest range). A slice of one
    // app cannot be split.
    loop {
        let heaviest = slices
            .iter()
            .copied()
            .filter(|&s| load_of(s) > target && apps_in(s) > 1)
            .max_by_key(|&s| (load_of(s), std::cmp::Reverse(s)));
        let Some(heavy) = heaviest else {
            break;
        };
        let Some((low, high)) = heavy.halves() else {
            break;
        };
        slices.retain(|&s| s != heavy);
        slices.extend([low, high]);
        slices.sort();
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_keys_are_64_bit_fnv_1a() {
        // Reference values of FNV-1a 64 (the empty string is the offset basis).
        assert_eq!(app_key(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(app_key("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(app_key("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_recut_under_way_reads_as_its_finest_tiling_else_its_widest() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let (hl, hh) = high.halves().unwrap();
        // A split of the high half under way: the finest records tile.
        assert_eq!(recorded_cut(&[hh, low, high, hl]), [low, hl, hh]);
        // Only one quarter written yet: the widest records stand.
        assert_eq!(recorded_cut(&[high, low, hh]), [low, high]);
        // A merge into the whole under way, parts all there: the parts.
        assert_eq!(recorded_cut(&[KeyRange::WHOLE, low, high]), [low, high]);
        // A record missing: neither tiles, and the widest say so.
        assert_eq!(recorded_cut(&[low, hl]), [low, hl]);
        assert_eq!(recorded_cut(&[]), []);
    }

    #[test]
    fn ranges_read_back_what_they_write_and_nothing_else() {
        let mut ranges = vec![KeyRange::WHOLE];
        for depth in 1..=MAX_DEPTH {
            let index = (0x9e37_79b9_7f4a_7c15u64 >> (64 - u32::from(depth))) & ((1 << depth) - 1);
            ranges.extend(KeyRange::new(depth, index));
            ranges.extend(KeyRange::new(depth, (1 << depth) - 1));
        }
        for range in ranges {
            assert_eq!(range.to_string().parse::<KeyRange>(), Ok(range));
        }
        // Not aligned, reversed, too deep, not hexadecimal, one bound only.
        for bad in [
            "1-ffffffffffffffff",
            "8000000000000000-7fffffffffffffff",
            "0-0",
            "0-7fffffffffffffffg",
            "0-bfffffffffffffff",
            "x-ff",
            "ffff",
        ] {
            assert!(bad.parse::<KeyRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges_halve_and_fold_back() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        assert_eq!(low.to_string(), "0-7fffffffffffffff");
        assert_eq!(high.to_string(), "8000000000000000-ffffffffffffffff");
        assert_eq!(low.parent(), Some(KeyRange::WHOLE));
        assert!(high.contains(u64::MAX) && !high.contains(0));
        let (a, b) = high.halves().unwrap();
        assert!(a.within(high) && b.within(KeyRange::WHOLE) && !a.within(low));
        assert_eq!(KeyRange::new(2, 4), None);
        // The example of KEP-5866, and the end of the key space.
        assert_eq!(
            low.selector(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
        );
        assert_eq!(
            high.selector(),
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
        );
        assert!(covers_exactly_once(&[low, a, b]));
        assert!(!covers_exactly_once(&[low, a]));
        assert!(!covers_exactly_once(&[low, high, a]));
    }

    #[test]
    fn every_range_knows_its_place_its_bounds_its_halves_and_its_parent() {
        // Bounds computed apart from the code under test, in 128 bits: range `index` of depth
        // `d` holds the keys [index * 2^(64-d), (index + 1) * 2^(64-d)).
        for depth in 0..=MAX_DEPTH {
            let count = 1u64 << depth;
            for index in [0, count / 3, count / 2, count - 1] {
                let range = KeyRange::new(depth, index).unwrap();
                assert_eq!((range.depth(), range.index()), (depth, index));
                let width = 1u128 << (64 - u32::from(depth));
                let first = u128::from(index) * width;
                assert_eq!(u128::from(range.start()), first, "{range}");
                assert_eq!(u128::from(range.last()), first + width - 1, "{range}");
                match range.halves() {
                    Some((low, high)) => {
                        assert!(depth < MAX_DEPTH);
                        assert_eq!((low.depth(), low.index()), (depth + 1, 2 * index));
                        assert_eq!((high.depth(), high.index()), (depth + 1, 2 * index + 1));
                        assert_eq!(low.start(), range.start());
                        assert_eq!(u128::from(low.last()) + 1, u128::from(high.start()));
                        assert_eq!(high.last(), range.last());
                        assert_eq!((low.parent(), high.parent()), (Some(range), Some(range)));
                    }
                    None => assert_eq!(depth, MAX_DEPTH, "{range}"),
                }
                let parent = range.parent();
                assert_eq!(parent.is_none(), depth == 0, "{range}");
                if let Some(parent) = parent {
                    assert_eq!((parent.depth(), parent.index()), (depth - 1, index / 2));
                    assert!(range.within(parent) && !parent.within(range));
                }
            }
        }
        assert_eq!(KeyRange::new(MAX_DEPTH + 1, 0), None);
    }

    /// A cluster of `apps` apps of `weight`, and its keys in `keys`.
    fn weighed(id: &str, apps: u64, weight: u32, keys: &mut AppKeys) -> Cluster {
        let mut k: Vec<u64> = (0..apps).map(|n| app_key(&format!("{id}/{n}"))).collect();
        k.sort_unstable();
        keys.insert(id.to_string(), k);
        Cluster {
            weight: Some(weight),
            ..Cluster::new(id, apps)
        }
    }

    #[test]
    fn only_a_slice_over_the_target_with_two_apps_or_more_is_cut_and_only_when_enabled() {
        let mut keys = AppKeys::new();
        let whole = Slicing::default();
        // Two clusters of the target's load each (20 over 2 shards): at the target is not over.
        let even = [
            weighed("a", 10, 1, &mut keys),
            weighed("b", 10, 1, &mut keys),
        ];
        assert_eq!(per_shard_target(&even, 2), 10);
        assert!(slice_fleet(&even, &keys, 2, &whole, &SliceConfig::enabled()).is_empty());
        // One app of load 100 against a target of 55: over, but one app cannot be parted.
        let solo = [
            weighed("solo", 1, 100, &mut keys),
            weighed("c", 10, 1, &mut keys),
        ];
        assert_eq!(per_shard_target(&solo, 2), 55);
        assert!(slice_fleet(&solo, &keys, 2, &whole, &SliceConfig::enabled()).is_empty());
        // A hot cluster is cut when slicing is on, never when it is off.
        let hot = [
            weighed("hot", 90, 1, &mut keys),
            weighed("d", 10, 1, &mut keys),
        ];
        let cut = slice_fleet(&hot, &keys, 2, &whole, &SliceConfig::enabled());
        assert!(cut.slices_of("hot").len() > 1, "{cut:?}");
        assert!(slice_fleet(&hot, &keys, 2, &whole, &SliceConfig::disabled()).is_empty());
        assert!(slice_fleet(&hot, &keys, 0, &whole, &SliceConfig::enabled()).is_empty());
    }

    #[test]
    fn a_key_counts_in_the_range_it_starts_or_ends_and_in_no_other() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let keys = [0, low.last(), high.start(), u64::MAX];
        assert_eq!((count_in(&keys, low), count_in(&keys, high)), (2, 2));
        assert_eq!(count_in(&keys[2..3], high), 1);
        assert_eq!(count_in(&keys[1..2], low), 1);
        assert_eq!(count_in(&keys, KeyRange::WHOLE), 4);
    }

    #[test]
    fn a_cluster_made_whole_again_leaves_the_other_cuts_as_they_are() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let cut = Slicing::default()
            .with("a", vec![high, low])
            .and_then(|s| s.with("b", vec![low, high]))
            .unwrap();
        assert_eq!(cut.extra_slices(), 2);
        let without = cut.without("a");
        assert_eq!(without.slices_of("a"), [KeyRange::WHOLE]);
        assert_eq!(without.slices_of("b"), [low, high]);
        assert_eq!(without.extra_slices(), 1);
    }

    #[test]
    fn a_shard_selector_joins_ranges_and_leaves_out_the_whole_key_space() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let (high_a, high_b) = high.halves().unwrap();
        let (low_a, _) = low.halves().unwrap();
        // One range: its own term.
        assert_eq!(shard_selector(&[high_b]), Some(high_b.selector()));
        // Apart: one term each, in key order, whatever the order given.
        assert_eq!(
            shard_selector(&[high_b, low_a]),
            Some(format!("{} || {}", low_a.selector(), high_b.selector()))
        );
        // Adjacent, or one within another: a single term.
        assert_eq!(shard_selector(&[high_b, high_a]), Some(high.selector()));
        assert_eq!(shard_selector(&[high, high_a]), Some(high.selector()));
        // Every key, or nothing: no selector.
        assert_eq!(shard_selector(&[low, high_a, high_b]), None);
        assert_eq!(shard_selector(&[KeyRange::WHOLE]), None);
        assert_eq!(shard_selector(&[]), None);
        // Too many terms for the server's parser: none.
        let apart: Vec<KeyRange> = (0..=MAX_SHARD_RANGES as u64)
            .map(|i| KeyRange::new(8, i * 2).unwrap())
            .collect();
        assert_eq!(
            shard_selector(&apart[..MAX_SHARD_RANGES]).map(|s| s.matches("||").count()),
            Some(MAX_SHARD_RANGES - 1)
        );
        assert_eq!(shard_selector(&apart), None);
    }
}
