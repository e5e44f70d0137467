//! How a replica's objects make the units the planner places and the items owners work on.

use shard_assign::SliceSwitch;
use shardwise_handoff::plan::ObjectKey;

use crate::settings::WatchScope;

/// How a replica's objects make units and items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// The controller's own units and their items ([`crate::Sharded`]).
    UnitsAndItems,
    /// One kind whose every object is a unit with no item, placed by a label written on it
    /// ([`crate::kind`]).
    OwnObjects,
    /// One kind whose objects are the items of a single unit, the replicas' StatefulSet, which
    /// is always cut: a shard owns ranges of the objects' keys, and no object is written
    /// ([`crate::kind`]).
    KeyRanges,
}

impl Layout {
    /// Whether the program's own controller does the work (the runtime watches no items and
    /// runs no workers of its own).
    pub(crate) fn composed(self) -> bool {
        self != Self::UnitsAndItems
    }

    /// Where units are watched, and the field selector that keeps only this layout's units,
    /// for replicas of `statefulset` in `namespace` watching `scope`.
    pub(crate) fn unit_watch(
        self,
        namespace: &str,
        statefulset: &str,
        scope: &WatchScope,
    ) -> (WatchScope, Option<String>) {
        match self {
            Self::KeyRanges => (
                WatchScope::Namespace(namespace.to_string()),
                Some(format!("metadata.name={statefulset}")),
            ),
            Self::UnitsAndItems | Self::OwnObjects => (scope.clone(), None),
        }
    }

    /// The unit every object belongs to, for [`Self::KeyRanges`]: the StatefulSet.
    pub(crate) fn sole_unit(self, namespace: &str, statefulset: &str) -> Option<ObjectKey> {
        (self == Self::KeyRanges).then(|| ObjectKey::new(namespace, statefulset))
    }

    /// Whether the planner cuts units, given the configured switch: the one unit of
    /// [`Self::KeyRanges`] is always cut, or a single shard would own every object.
    pub(crate) fn slicing(self, configured: SliceSwitch) -> SliceSwitch {
        match self {
            Self::KeyRanges => SliceSwitch::On,
            Self::UnitsAndItems | Self::OwnObjects => configured,
        }
    }

    /// What a copy of a unit on one shard more costs placement, given the measured one: nothing
    /// for [`Self::KeyRanges`], whose unit no replica caches.
    pub(crate) fn copy_cost(self, measured: impl FnOnce() -> u64) -> u64 {
        match self {
            Self::KeyRanges => 0,
            Self::UnitsAndItems | Self::OwnObjects => measured(),
        }
    }
}
