//! `legacy-modulo`: `fnv1a_32(id) % shards`, bit-compatible with Argo CD's legacy sharding.
//!
//! With live shards `0..N` this is exactly Argo CD's placement, so a fleet can migrate without
//! reshuffling. With a gap in the live set the modulo indexes the sorted live shards.

use crate::draft::Draft;
use crate::hashing::fnv1a_32;

pub(crate) fn place(draft: &mut Draft<'_>) {
    let shard_count = draft.shard_count() as u32;
    for index in draft.unplaced() {
        let id = draft.cluster(index).id.as_bytes();
        // Argo CD gives a cluster without an id to the first shard rather than hashing "".
        let position = if id.is_empty() {
            0
        } else {
            fnv1a_32(id) % shard_count
        };
        draft.place(index, position as usize);
    }
}
