//! `UnitSlice`: the record of one slice of a unit that is cut.
//!
//! A unit too big for one shard is cut into slices: ranges of its items' keys (64-bit FNV-1a of
//! each item's UID, the hash of KEP-5866's server-side sharded list and watch). While it is not
//! cut, its one record is on the unit's own object, as always. Once cut, each slice has its own
//! record on a UnitSlice object in the StatefulSet's namespace, in the same labels and
//! annotations (shard label, holder, epoch, drain); the unit is then labelled with
//! [`SLICES_LABEL`] and carries no record of its own. The planner alone creates, moves and
//! deletes UnitSlices; an owner writes only its drain acknowledgement on them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shard_assign::KeyRange;
use shardwise_handoff::plan::ObjectKey;
use twox_hash::XxHash3_64;

#[cfg(doc)]
use shardwise_handoff::keys::SLICES_LABEL;

/// The record of one slice of a cut unit.
// kube's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "shardwise.io",
    version = "v1alpha1",
    kind = "UnitSlice",
    plural = "unitslices",
    singular = "unitslice",
    shortname = "usl",
    category = "shardwise",
    namespaced,
    derive = "PartialEq",
    doc = "The placement record of one slice of a unit cut across shards",
    printcolumn(name = "Unit", type_ = "string", json_path = ".spec.unit.name"),
    printcolumn(name = "Range", type_ = "string", json_path = ".spec.range"),
    printcolumn(
        name = "Shard",
        type_ = "string",
        json_path = ".metadata.labels.shardwise\\.io/shard",
        description = "Shard that owns the slice"
    ),
    printcolumn(
        name = "Epoch",
        type_ = "string",
        json_path = ".metadata.annotations.shardwise\\.io/epoch"
    ),
    printcolumn(
        name = "Selector",
        type_ = "string",
        json_path = ".spec.selector",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UnitSliceSpec {
    /// The unit a slice belongs to.
    pub unit: UnitReference,
    /// The range is the keys whose top `depth` bits are `index`.
    #[schemars(range(max = 16))]
    pub depth: u8,
    /// The range's place among the `2^depth` ranges of its depth.
    #[schemars(range(max = 65535))]
    pub index: u64,
    /// The first and last key of the range, in hexadecimal (for people).
    pub range: String,
    /// The range as a KEP-5866 shard selector on `metadata.uid` (for people, and for API
    /// servers that filter on it).
    pub selector: String,
}

/// The unit a slice belongs to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnitReference {
    /// Empty for a cluster-scoped unit.
    #[serde(default)]
    pub namespace: String,
    /// The unit's name.
    pub name: String,
    /// The unit's UID: a slice of a unit that was deleted and made again is not one of the new
    /// unit's.
    pub uid: String,
}

impl UnitSliceSpec {
    /// The spec of `range` of `unit`, whose UID is `uid`.
    pub fn new(unit: &ObjectKey, uid: &str, range: KeyRange) -> Self {
        Self {
            unit: UnitReference {
                namespace: unit.namespace.clone(),
                name: unit.name.clone(),
                uid: uid.to_string(),
            },
            depth: range.depth(),
            index: range.index(),
            range: range.to_string(),
            selector: range.selector(),
        }
    }

    /// The slice's range; `None` for a range that is not one, or the whole key space (the
    /// record of a whole unit is on the unit).
    pub fn key_range(&self) -> Option<KeyRange> {
        KeyRange::new(self.depth, self.index).filter(|r| *r != KeyRange::WHOLE)
    }

    /// The key of the unit the slice belongs to.
    pub fn unit_key(&self) -> ObjectKey {
        ObjectKey::new(&self.unit.namespace, &self.unit.name)
    }
}

/// Longest part of the unit's name kept in a slice's name: the rest of the 253 characters is
/// for the hash, the depth and the index.
const NAME_PREFIX: usize = 200;

/// The name of the UnitSlice of `range` of `unit`, for the StatefulSet `statefulset`: the
/// unit's name (cut short if need be), a hash of everything that tells units and controllers
/// apart, the depth and the index. Always a valid object name.
pub fn slice_name(statefulset: &str, unit: &ObjectKey, range: KeyRange) -> String {
    let identity = format!("{statefulset}/{}/{}", unit.namespace, unit.name);
    let hash = XxHash3_64::oneshot(identity.as_bytes()) >> 16;
    let mut prefix: String = unit
        .name
        .chars()
        .take(NAME_PREFIX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    let suffix = format!("{hash:012x}-{}-{:x}", range.depth(), range.index());
    if prefix.is_empty() {
        format!("s-{suffix}")
    } else {
        format!("{prefix}-{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the API server checks of an object's name (IsDNS1123Subdomain).
    fn is_subdomain(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn names_are_valid_distinct_and_stable() {
        let (low, high) = KeyRange::WHOLE.halves().unwrap();
        let unit = ObjectKey::new("fleet", "hot.example-1");
        let a = slice_name("shardwise", &unit, low);
        assert_eq!(a, slice_name("shardwise", &unit, low), "stable");
        assert_ne!(a, slice_name("shardwise", &unit, high));
        assert_ne!(a, slice_name("other", &unit, low));
        assert_ne!(
            a,
            slice_name("shardwise", &ObjectKey::new("team", "hot.example-1"), low)
        );
        assert!(a.starts_with("hot.example-1-"), "{a}");
        let long = ObjectKey::new("fleet", format!("{}.-", "x".repeat(300)));
        let deep = KeyRange::new(16, 0xffff).unwrap();
        for name in [
            a,
            slice_name("s", &long, deep),
            slice_name("s", &ObjectKey::new("", "--"), low),
        ] {
            assert!(is_subdomain(&name), "{name}");
        }
    }

    #[test]
    fn the_spec_says_its_range_and_the_whole_range_is_no_slice() {
        let (_, high) = KeyRange::WHOLE.halves().unwrap();
        let (_, quarter) = high.halves().unwrap();
        let spec = UnitSliceSpec::new(&ObjectKey::new("fleet", "hot"), "u1", quarter);
        assert_eq!((spec.depth, spec.index), (2, 3));
        assert_eq!(spec.key_range(), Some(quarter));
        assert_eq!(spec.range, "c000000000000000-ffffffffffffffff");
        assert!(spec.selector.contains("'0xc000000000000000'"));
        let whole = UnitSliceSpec::new(&ObjectKey::new("fleet", "hot"), "u1", KeyRange::WHOLE);
        assert_eq!(whole.key_range(), None);
    }
}
