//! How many replicas the fleet needs, and whether the planner may set that count now. Pure:
//! the planner passes what it sees and the time; [`shardwise_scale`] does the arithmetic.
//!
//! The count needed is the largest of the items over `--items-per-replica` and, when set, the
//! measured busy time over `--busy-per-replica` and the reported cache bytes over
//! `--cache-per-replica`, within `--min-replicas..=--max-replicas`.
//! [`Stabilizer`] turns the needs seen over time into the count to set (up at once, down
//! after the window). The count is set only while the fleet is settled: every replica the
//! StatefulSet asks for holds its lease, and no record is being written or drained. A change
//! made in the middle of a handoff would re-plan what is moving; one made before the last
//! change's replicas are up would count on capacity that is not there yet.

use std::time::Duration;

use shardwise_handoff::plan::UnitView;
use shardwise_scale::{Sizing, SizingError, Stabilizer};

use crate::settings::ScaleSettings;

/// What the fleet asks of its replicas now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    /// Items placed on live shards.
    pub items: u64,
    /// Measured busy seconds per second over every record; `None` while nothing is measured.
    pub busy: Option<f64>,
    /// Bytes of cache reported over every record; `None` while none is reported.
    pub bytes: Option<u64>,
}

/// Where the fleet stands with its last changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The StatefulSet's replicas.
    pub expected: u32,
    /// Shards of those whose lease is held.
    pub live: u32,
    /// Writes the latest pass wanted: records and item labels.
    pub writes: usize,
    /// Records asked to drain and not yet handed over.
    pub draining: usize,
}

impl Progress {
    /// Records of `units` with a drain request on them.
    pub fn draining_in(units: &[UnitView]) -> usize {
        units
            .iter()
            .flat_map(UnitView::records)
            .filter(|r| r.record.drain_to.is_some())
            .count()
    }

    /// Why the count may not change now, if it may not.
    pub fn unsettled(&self) -> Option<Unsettled> {
        if self.live != self.expected {
            Some(Unsettled::Replicas)
        } else if self.writes > 0 || self.draining > 0 {
            Some(Unsettled::Handoff)
        } else {
            None
        }
    }
}

/// Why a change of the count waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsettled {
    /// Not every replica the StatefulSet asks for holds its lease (or one too many does).
    Replicas,
    /// Records or item labels are being written, or a record is draining.
    Handoff,
}

/// What the planner concludes about the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What the demand needs now: `shardwise_desired_replicas`.
    pub needed: u32,
    /// The count the needs seen over the windows call for.
    pub recommended: u32,
    /// The count to set now (autoscaling on, a change, the fleet settled).
    pub scale_to: Option<u32>,
    /// Why a change the needs call for waits.
    pub waiting: Option<Unsettled>,
}

/// The sizing and the needs seen over one planner term.
#[derive(Clone, Debug)]
pub struct Scaler {
    items: Sizing,
    busy: Option<Sizing>,
    cache: Option<Sizing>,
    stabilizer: Stabilizer,
    autoscale: bool,
}

impl Scaler {
    pub fn new(settings: &ScaleSettings) -> Result<Self, SizingError> {
        let sizing = |per_replica| Sizing::new(per_replica, settings.min, settings.max);
        Ok(Self {
            items: sizing(f64::from(settings.items_per_replica))?,
            busy: settings.busy_per_replica.map(sizing).transpose()?,
            cache: settings
                .cache_per_replica
                .map(|bytes| sizing(bytes as f64))
                .transpose()?,
            stabilizer: Stabilizer::new(settings.windows),
            autoscale: settings.autoscale,
        })
    }

    /// Records the demand seen at `now` (time since the term began) and says what to do.
    pub fn assess(&mut self, now: Duration, demand: Demand, progress: Progress) -> Verdict {
        let current = progress.expected;
        let by_items = self.items.needed(demand.items as f64, current);
        let by_busy = match (self.busy, demand.busy) {
            (Some(sizing), Some(busy)) => sizing.needed(busy, current),
            _ => self.items.min,
        };
        let by_cache = match (self.cache, demand.bytes) {
            (Some(sizing), Some(bytes)) => sizing.needed(bytes as f64, current),
            _ => self.items.min,
        };
        let needed = by_items.max(by_busy).max(by_cache);
        let recommended = self.stabilizer.recommend(now, needed, current);
        let change = (recommended != current).then_some(recommended);
        let waiting = change.and(progress.unsettled());
        Verdict {
            needed,
            recommended,
            scale_to: change.filter(|_| self.autoscale && waiting.is_none()),
            waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(autoscale: bool) -> ScaleSettings {
        ScaleSettings {
            items_per_replica: 1000,
            autoscale,
            max: 4,
            windows: shardwise_scale::Windows {
                up: Duration::ZERO,
                down: Duration::from_secs(60),
            },
            ..ScaleSettings::DEFAULT
        }
    }

    fn settled(expected: u32) -> Progress {
        Progress {
            expected,
            live: expected,
            writes: 0,
            draining: 0,
        }
    }

    fn items(items: u64) -> Demand {
        Demand {
            items,
            busy: None,
            bytes: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_growing_fleet_scales_up_at_once_and_down_after_the_window() {
        let mut scaler = Scaler::new(&settings(true)).unwrap();
        let v = scaler.assess(secs(0), items(500), settled(1));
        assert_eq!((v.needed, v.scale_to), (1, None));
        let v = scaler.assess(secs(10), items(4000), settled(1));
        assert_eq!((v.needed, v.scale_to), (4, Some(4)));
        let v = scaler.assess(secs(20), items(500), settled(4));
        assert_eq!((v.needed, v.recommended, v.scale_to), (1, 4, None));
        // The need of 4 seen at 10 s was in force until 20 s: a whole window of lower needs
        // ends at 80 s.
        let v = scaler.assess(secs(75), items(500), settled(4));
        assert_eq!((v.needed, v.scale_to), (1, None), "{v:?}");
        let v = scaler.assess(secs(80), items(500), settled(4));
        assert_eq!((v.needed, v.scale_to), (1, Some(1)), "{v:?}");
    }

    #[test]
    fn the_count_waits_for_handoffs_and_for_replicas_to_come_up() {
        let mut scaler = Scaler::new(&settings(true)).unwrap();
        let starting = Progress {
            live: 1,
            ..settled(2)
        };
        let v = scaler.assess(secs(0), items(3000), starting);
        assert_eq!(
            (v.needed, v.scale_to, v.waiting),
            (3, None, Some(Unsettled::Replicas))
        );
        let moving = Progress {
            writes: 3,
            ..settled(2)
        };
        let v = scaler.assess(secs(5), items(3000), moving);
        assert_eq!((v.scale_to, v.waiting), (None, Some(Unsettled::Handoff)));
        let draining = Progress {
            draining: 1,
            ..settled(2)
        };
        assert_eq!(
            scaler.assess(secs(6), items(3000), draining).waiting,
            Some(Unsettled::Handoff)
        );
        // Settled: the change goes through, and nothing waits when nothing changes.
        assert_eq!(
            scaler.assess(secs(7), items(3000), settled(2)).scale_to,
            Some(3)
        );
        let v = scaler.assess(secs(8), items(3000), moving_at(3));
        assert_eq!((v.scale_to, v.waiting), (None, None));
    }

    fn moving_at(expected: u32) -> Progress {
        Progress {
            writes: 1,
            ..settled(expected)
        }
    }

    #[test]
    fn without_autoscale_the_need_is_reported_and_nothing_is_set() {
        let mut scaler = Scaler::new(&settings(false)).unwrap();
        let v = scaler.assess(secs(0), items(3500), settled(1));
        assert_eq!((v.needed, v.recommended, v.scale_to), (4, 4, None));
    }

    #[test]
    fn measured_busy_time_raises_the_need_when_it_is_set() {
        let mut scaler = Scaler::new(&ScaleSettings {
            busy_per_replica: Some(2.0),
            ..settings(true)
        })
        .unwrap();
        let busy = |busy| Demand {
            busy: Some(busy),
            ..items(1000)
        };
        assert_eq!(scaler.assess(secs(0), busy(1.5), settled(1)).needed, 1);
        assert_eq!(scaler.assess(secs(1), busy(5.0), settled(1)).needed, 3);
        // Nothing measured yet: the items decide.
        assert_eq!(scaler.assess(secs(2), items(1000), settled(3)).needed, 1);
        assert_eq!(scaler.assess(secs(3), busy(99.0), settled(3)).needed, 4);
    }

    #[test]
    fn reported_cache_raises_the_need_when_it_is_set() {
        let mut scaler = Scaler::new(&ScaleSettings {
            cache_per_replica: Some(256 << 20),
            ..settings(true)
        })
        .unwrap();
        let cached = |bytes: u64| Demand {
            bytes: Some(bytes),
            ..items(1000)
        };
        assert_eq!(
            scaler.assess(secs(0), cached(100 << 20), settled(1)).needed,
            1
        );
        assert_eq!(
            scaler.assess(secs(1), cached(700 << 20), settled(1)).needed,
            3
        );
        // More items than the cache needs: the items decide.
        let both = Demand {
            items: 3500,
            ..cached(300 << 20)
        };
        assert_eq!(scaler.assess(secs(2), both, settled(3)).needed, 4);
        // Without the setting the cache is no reason to add replicas.
        let mut items_only = Scaler::new(&settings(true)).unwrap();
        assert_eq!(
            items_only
                .assess(secs(0), cached(1 << 40), settled(1))
                .needed,
            1
        );
    }

    #[test]
    fn a_demand_hovering_at_a_boundary_changes_the_count_once() {
        let mut scaler = Scaler::new(&settings(true)).unwrap();
        let mut current = 2;
        let mut changes = Vec::new();
        // 1,950 to 2,350 items every 10 s for an hour: 2 or 3 replicas, back and forth.
        for step in 0..360u64 {
            let demand = items(1950 + (step * 7919) % 400);
            let v = scaler.assess(secs(10 * step), demand, settled(current));
            if let Some(to) = v.scale_to {
                changes.push((step, current, to));
                current = to;
            }
        }
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(current, 3);
    }

    #[test]
    fn draining_records_are_counted_over_slices_too() {
        use shard_assign::KeyRange;
        use shardwise_handoff::drain::UnitRecord;
        use shardwise_handoff::plan::ObjectKey;
        use shardwise_handoff::slices::SliceRecord;
        let record = |drain_to| UnitRecord {
            owner: Some(0),
            drain_to,
            ..UnitRecord::default()
        };
        let whole = |name: &str, drain_to| UnitView {
            key: ObjectKey::new("fleet", name),
            uid: name.to_string(),
            pin: None,
            weight: None,
            record: record(drain_to),
            cut: false,
            slices: Vec::new(),
        };
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let cut = UnitView {
            cut: true,
            // A cut unit's own record is not a record any more, whatever it says.
            record: record(Some(3)),
            slices: vec![
                SliceRecord {
                    range: low,
                    record: record(Some(1)),
                },
                SliceRecord {
                    range: high,
                    record: record(None),
                },
            ],
            ..whole("c", None)
        };
        let units = [whole("a", Some(2)), whole("b", None), cut];
        assert_eq!(Progress::draining_in(&units), 2);
    }
}
