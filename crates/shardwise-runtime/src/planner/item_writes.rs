//! The item labels the planner still has to write, written beside its passes rather than by
//! them. A fleet whose items carry no unit token yet (a first install) needs one label write per
//! item; at the control plane's pace that is minutes for tens of thousands of items, and a pass
//! that waited for them would hold every record decision (a cut, a drain, a new shard) back as
//! long. So a pass hands its item writes over and ends; the next pass decides again from the
//! index and replaces what is still unwritten.
//!
//! The watches then bring each landed write back to the index. Such an echo changes no record
//! decision, so it does not start a pass ([`ItemWrites::echoes`]): thousands of writes landing
//! would otherwise start a pass every debounce interval, each over the whole index.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use shard_assign::ShardId;
use shardwise_handoff::plan::ObjectKey;
use tokio::sync::Notify;

use super::decide::ItemWrite;

#[derive(Debug, Default)]
struct Writes {
    /// Decided by the latest pass and not started, in key order. One whose item has a write
    /// under way waits for it to finish: two at once could land in either order.
    pending: BTreeMap<ObjectKey, ItemWrite>,
    /// Started and not finished.
    in_flight: BTreeMap<ObjectKey, ItemWrite>,
    /// Landed, until a pass no longer decides them (its index has them) or the item is seen
    /// with other labels.
    landed: BTreeMap<ObjectKey, ItemWrite>,
}

/// The writes of item labels the latest pass decided, for the writer to take one by one.
#[derive(Debug, Default)]
pub(crate) struct ItemWrites {
    writes: Mutex<Writes>,
    added: Notify,
}

impl ItemWrites {
    fn lock(&self) -> MutexGuard<'_, Writes> {
        self.writes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pass's item writes replace those an earlier pass left unstarted: the latest decision
    /// is the one that counts (an item deleted or moved since is no longer written). A write
    /// under way, or landed and not seen back yet, with the same labels is not made twice.
    pub(crate) fn replace(&self, decided: &[ItemWrite]) {
        let mut writes = self.lock();
        let writes = &mut *writes;
        let mut pending = BTreeMap::new();
        let mut still_decided = BTreeMap::new();
        for write in decided {
            if writes.landed.get(&write.key) == Some(write) {
                still_decided.insert(write.key.clone(), write.clone());
            } else if writes.in_flight.get(&write.key) != Some(write) {
                pending.insert(write.key.clone(), write.clone());
            }
        }
        writes.pending = pending;
        writes.landed = still_decided;
        let any = !writes.pending.is_empty();
        if any {
            self.added.notify_one();
        }
    }

    /// The next write to make, now under way; `None` when none is pending (or each pending one
    /// waits for a write to its item under way).
    pub(crate) fn start_next(&self) -> Option<ItemWrite> {
        let mut writes = self.lock();
        let writes = &mut *writes;
        let key = writes
            .pending
            .keys()
            .find(|k| !writes.in_flight.contains_key(*k))?
            .clone();
        let write = writes.pending.remove(&key)?;
        writes.in_flight.insert(key, write.clone());
        Some(write)
    }

    /// The write to `key` ended: it landed, or failed (the next pass decides it again).
    pub(crate) fn finished(&self, key: &ObjectKey, landed: bool) {
        let mut writes = self.lock();
        if let Some(write) = writes.in_flight.remove(key)
            && landed
        {
            writes.landed.insert(key.clone(), write);
        }
        // A write to the same item that waited for this one may start.
        let waiting = writes.pending.contains_key(key);
        drop(writes);
        if waiting {
            self.added.notify_one();
        }
    }

    /// The next write to make, waiting for a pass to decide one.
    pub(crate) async fn next(&self) -> ItemWrite {
        loop {
            if let Some(write) = self.start_next() {
                return write;
            }
            // A replace since the look left a permit: this returns at once.
            self.added.notified().await;
        }
    }

    /// Whether item `key` seen as object `uid` with `token` and `shard` is the echo of a
    /// write: one that landed, or one under way (the watch may bring it back before its
    /// response arrives). Seen otherwise, it has moved on (or the event predates the write):
    /// its next events count again.
    pub(crate) fn echoes(
        &self,
        key: &ObjectKey,
        uid: &str,
        token: Option<&str>,
        shard: Option<ShardId>,
    ) -> bool {
        let mut writes = self.lock();
        let gives = |write: Option<&ItemWrite>| {
            write.is_some_and(|w| {
                w.uid == uid && Some(w.token.as_str()) == token && w.shard == shard
            })
        };
        let echo = gives(writes.landed.get(key)) || gives(writes.in_flight.get(key));
        if !echo {
            writes.landed.remove(key);
        }
        echo
    }

    /// Item `key` was seen without a token: no write's echo (each gives one), and its next
    /// events count.
    pub(crate) fn moved_on(&self, key: &ObjectKey) {
        self.lock().landed.remove(key);
    }

    /// Whether item `key` leaving the watch of items without a token is the echo of a write
    /// landed or under way (every write gives a token).
    pub(crate) fn echoes_token(&self, key: &ObjectKey) -> bool {
        let writes = self.lock();
        writes.landed.contains_key(key) || writes.in_flight.contains_key(key)
    }

    /// Writes decided and not finished.
    pub(crate) fn outstanding(&self) -> usize {
        let writes = self.lock();
        writes.pending.len() + writes.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn write(name: &str, token: &str) -> ItemWrite {
        ItemWrite {
            key: ObjectKey::new("fleet", name),
            uid: format!("uid-{name}"),
            token: token.into(),
            shard: None,
        }
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("fleet", name)
    }

    fn names(writes: &ItemWrites) -> Vec<String> {
        std::iter::from_fn(|| writes.start_next())
            .map(|w| w.key.name)
            .collect()
    }

    #[test]
    fn a_later_pass_replaces_the_writes_left_unstarted() {
        let writes = ItemWrites::default();
        writes.replace(&[write("a", "x"), write("b", "x"), write("c", "x")]);
        let started = writes.start_next().unwrap();
        assert_eq!(started.key.name, "a", "in key order");
        assert_eq!(writes.outstanding(), 3);
        // The next pass no longer wants "b" (deleted, say) and wants "d"; "a" is under way
        // with the same labels, so it is not written again.
        writes.replace(&[write("a", "x"), write("c", "x"), write("d", "x")]);
        assert_eq!(names(&writes), ["c", "d"]);
        assert_eq!(writes.outstanding(), 3, "a, c and d under way");
        for name in ["a", "c", "d"] {
            writes.finished(&key(name), true);
        }
        assert_eq!(writes.outstanding(), 0);
    }

    #[test]
    fn a_write_under_way_with_other_labels_is_made_again_once_it_ends() {
        let writes = ItemWrites::default();
        writes.replace(&[write("a", "x"), write("b", "x")]);
        assert_eq!(writes.start_next().unwrap().key.name, "a");
        writes.replace(&[write("a", "y"), write("b", "x")]);
        // Not two writes to a at once: b goes first.
        assert_eq!(names(&writes), ["b"]);
        writes.finished(&key("a"), true);
        let again = writes.start_next().expect("the newer labels");
        assert_eq!(again.token, "y");
        // It failed: decided again, it is written again.
        writes.finished(&again.key, false);
        writes.replace(&[write("a", "y")]);
        assert_eq!(names(&writes), ["a"]);
    }

    #[test]
    fn a_landed_write_is_not_made_again_and_its_echoes_start_no_pass() {
        let writes = ItemWrites::default();
        writes.replace(&[write("a", "x"), write("b", "x")]);
        assert_eq!(names(&writes), ["a", "b"]);
        writes.finished(&key("a"), true);
        writes.finished(&key("b"), true);
        // A pass before the watches brought them back decides both again: not rewritten.
        writes.replace(&[write("a", "x"), write("b", "x")]);
        assert!(names(&writes).is_empty());
        // a comes back as written, twice (its metadata, and it leaves the watch of items
        // without a token): echoes.
        assert!(writes.echoes(&key("a"), "uid-a", Some("x"), None));
        assert!(writes.echoes_token(&key("a")));
        // b is seen without its token (removed since, or an event from before the write):
        // not an echo, and from then on nothing of it is.
        assert!(!writes.echoes(&key("b"), "uid-b", None, None));
        assert!(!writes.echoes_token(&key("b")));
        // So the next pass that decides it writes it again.
        writes.replace(&[write("b", "x")]);
        assert_eq!(names(&writes), ["b"]);
        // a's write is no longer decided (the index has it): its memory goes, and a later
        // change of a is not taken for an echo.
        assert!(!writes.echoes_token(&key("a")));
        assert!(!writes.echoes(&key("a"), "uid-a", Some("x"), Some(2)));
    }

    #[test]
    fn a_write_seen_back_before_its_response_is_an_echo_too() {
        let writes = ItemWrites::default();
        writes.replace(&[write("a", "x")]);
        writes.start_next().unwrap();
        assert!(writes.echoes_token(&key("a")));
        assert!(writes.echoes(&key("a"), "uid-a", Some("x"), None));
        assert!(
            !writes.echoes(&key("a"), "uid-a", Some("x"), Some(1)),
            "other labels"
        );
        writes.finished(&key("a"), true);
        assert!(writes.echoes(&key("a"), "uid-a", Some("x"), None));
    }

    #[tokio::test]
    async fn the_writer_waits_for_a_pass_to_decide_a_write() {
        let writes = std::sync::Arc::new(ItemWrites::default());
        let writer = {
            let writes = writes.clone();
            tokio::spawn(async move { writes.next().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!writer.is_finished(), "nothing decided yet");
        writes.replace(&[write("a", "x")]);
        let next = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("woken by the pass")
            .unwrap();
        assert_eq!(next.key.name, "a");
    }
}
