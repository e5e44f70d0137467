//! The planner's index and pass on a synthetic fleet, with nothing else running, for the
//! `planner` bench (`cargo bench -p shardwise-runtime --features bench --bench planner`). Built
//! only with the `bench` feature; not part of the runtime's API.

use std::time::{Duration, Instant};

use shard_assign::{SliceSwitch, StrategyConfig, StrategyKind};
use shardwise_handoff::drain::{Incarnation, UnitRecord};
use shardwise_handoff::keys::unit_token;
use shardwise_handoff::plan::{Membership, ObjectKey, UnitView};

use crate::planner::decide::{PassMemory, PlacementRules, decide};
use crate::planner::index::{Index, ItemMeta, Shown, UnitEntry};

const NAMESPACE: &str = "fleet";

/// A fleet as a planner's index holds it.
#[derive(Debug)]
pub struct Fleet {
    index: Index,
    membership: Membership,
}

/// What one pass decided, and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    /// Index views and decision, writes not made.
    pub took: Duration,
    /// Records to write (placements, handoff steps, slices).
    pub record_writes: usize,
    /// Items to label.
    pub item_writes: usize,
    /// Max over mean items per shard after it.
    pub balance: f64,
    /// Units cut into slices after it.
    pub cut_units: u64,
}

/// The identity shard `s` runs as.
fn identity(shard: u32) -> String {
    format!("shardwise-{shard}_bench")
}

/// How many items of `total` unit `i` of `units` has: a few big units, most small (unit `i`
/// weighs `1 / (i % 50 + 1)`), as in a fleet of a few busy clusters and a long tail.
fn items_of(i: u32, units: u32, total: u32) -> u32 {
    let weight = |i: u32| 1.0 / f64::from(i % 50 + 1);
    let sum: f64 = (0..units).map(weight).sum();
    (f64::from(total) * weight(i) / sum).round() as u32
}

impl Fleet {
    /// `units` units with about `items` items in all over `shards` live shards. `settled`: every
    /// unit is placed (round robin) and every item carries its unit's token; otherwise nothing
    /// is placed and no item has a token yet (a cold start: the planner reads them in full).
    pub fn new(units: u32, items: u32, shards: u32, settled: bool) -> Self {
        let mut index = Index::default();
        let membership = Membership {
            expected: shards,
            alive: (0..shards).map(|s| (s, identity(s))).collect(),
        };
        index.set_expected(Some(shards));
        let mut n = 0u64;
        for i in 0..units {
            let name = format!("cluster-{i}");
            let owner = settled.then_some(i % shards);
            index.apply_unit(UnitEntry {
                view: UnitView {
                    key: ObjectKey::new(NAMESPACE, &name),
                    uid: format!("00000000-0000-4000-8000-{i:012x}"),
                    pin: None,
                    weight: None,
                    record: UnitRecord {
                        owner,
                        holder: owner.map(|s| Incarnation::of_identity(&identity(s))),
                        epoch: u64::from(settled),
                        ..Default::default()
                    },
                    cut: false,
                    slices: Vec::new(),
                },
                resource_version: Some("1".into()),
                deleting: false,
                shown: Shown::default(),
            });
            let token = unit_token(NAMESPACE, &name);
            for _ in 0..items_of(i, units, items) {
                n += 1;
                let key = ObjectKey::new(NAMESPACE, format!("app-{n}"));
                let meta = ItemMeta {
                    key: key.clone(),
                    uid: format!(
                        "{:08x}-1111-4222-8333-{:012x}",
                        n * 2_654_435_761 % (1 << 32),
                        n
                    ),
                    shard: None,
                    token: settled.then(|| token.clone()),
                };
                index.apply_item(meta);
                if !settled {
                    index.apply_unlabelled(key, Some(ObjectKey::new(NAMESPACE, &name)));
                }
            }
        }
        Self { index, membership }
    }

    /// Items in the index.
    pub fn items(&self) -> usize {
        self.index.item_counts().values().sum::<u64>() as usize
    }

    /// One pass of a planner that has just taken over (`sticky-balanced`, slicing on its
    /// default), as the controller makes it: the index's views, then the decision.
    pub fn pass(&self) -> Pass {
        let strategy = StrategyConfig::new(StrategyKind::StickyBalanced);
        let rules = PlacementRules {
            strategy: &strategy,
            slicing: SliceSwitch::Auto,
            namespace: NAMESPACE,
            statefulset: "shardwise",
            weights: None,
            copy_cost: 0,
        };
        let started = Instant::now();
        let decision = decide(&rules, &self.index, &self.membership, PassMemory::Takeover);
        let took = started.elapsed();
        let (record_writes, item_writes, balance, cut_units) =
            decision.map_or((0, 0, f64::NAN, 0), |d| {
                (
                    d.record_writes.len(),
                    d.item_writes.len(),
                    d.figures.balance,
                    d.figures.cut_units,
                )
            });
        Pass {
            took,
            record_writes,
            item_writes,
            balance,
            cut_units,
        }
    }
}
