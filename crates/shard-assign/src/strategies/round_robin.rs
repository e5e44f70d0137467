//! `round-robin`: clusters sorted by id (byte order), the k-th to shard `k % shards`.
//!
//! Pinned clusters keep their rank in the sequence, as in Argo CD, so pinning one cluster does
//! not shift every cluster after it.

use crate::draft::Draft;

pub(crate) fn place(draft: &mut Draft<'_>) {
    let shard_count = draft.shard_count();
    for index in draft.unplaced() {
        draft.place(index, index % shard_count);
    }
}
