//! `round-robin`: clusters sorted by id (byte order), the k-th to shard `k % shards`.
//!
//! Pinned clusters keep their rank in the sequence, as in Argo CD, so pinning one cluster does
//! not shift every cluster after it.

use crate::engine::Plan;

pub(crate) fn place(plan: &mut Plan<'_>) {
    let shard_count = plan.shard_count();
    for index in plan.unplaced() {
        plan.place(index, index % shard_count);
    }
}
