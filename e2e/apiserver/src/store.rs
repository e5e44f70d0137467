//! In-memory object store: one global resourceVersion (like etcd), per-resource tables with a
//! bounded event history, and per-watcher bounded channels fed on each write.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::object::{self, Key};
use crate::registry::{GroupResource, Registry};
use crate::selectors::{FieldSelector, LabelSelector};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("resource {0:?} is not served")]
    NoTable(GroupResource),
    #[error("too old resource version: {requested} ({oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("cannot serialize object: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// An object as stored: its JSON value and the same value serialized once, so that lists
/// and watch events copy bytes instead of serializing again.
#[derive(Debug)]
pub struct Stored {
    pub value: Value,
    pub json: Bytes,
    pub rv: u64,
}

impl Stored {
    fn new(mut value: Value, rv: u64) -> Result<Self, StoreError> {
        object::meta_mut(&mut value).insert("resourceVersion".into(), rv.to_string().into());
        let json = Bytes::from(serde_json::to_vec(&value)?);
        Ok(Self { value, json, rv })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// A committed change. For `Deleted`, `object` is the last state stamped with the deletion's
/// resourceVersion and `prev` the state before.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: Key,
    pub object: Arc<Stored>,
    pub prev: Option<Arc<Stored>>,
}

/// An event as one watcher sees it after its selectors are applied.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub kind: EventType,
    pub event: Arc<Event>,
    /// A modification that made the object stop matching is delivered as DELETED carrying the
    /// previous content with the new resourceVersion, as the real watch cache does.
    pub as_prev: bool,
}

/// What a list or watch selects.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, key: &Key, obj: &Value) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.0)
            && self.name.as_ref().is_none_or(|n| *n == key.1)
            && self.labels.matches_object(obj)
            && self.fields.matches(obj)
    }

    fn classify(&self, event: &Arc<Event>) -> Option<Delivery> {
        let now = event.kind != EventType::Deleted && self.matches(&event.key, &event.object.value);
        let before = match (&event.prev, event.kind) {
            (Some(prev), _) => self.matches(&event.key, &prev.value),
            (None, _) => false,
        };
        let (kind, as_prev) = match (before, now) {
            (false, false) => return None,
            (false, true) => (EventType::Added, false),
            (true, true) => (EventType::Modified, false),
            (true, false) => (EventType::Deleted, event.kind != EventType::Deleted),
        };
        Some(Delivery {
            kind,
            event: Arc::clone(event),
            as_prev,
        })
    }
}

struct Watcher {
    filter: Arc<Filter>,
    tx: mpsc::Sender<Delivery>,
}

struct Table {
    objects: BTreeMap<Key, Arc<Stored>>,
    history: VecDeque<Arc<Event>>,
    /// Every event of this resource with a resourceVersion above `floor` is in `history`.
    floor: u64,
    watchers: Vec<Watcher>,
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Events after this resourceVersion.
    After(u64),
    /// Synthetic ADDED events for the current state, then changes.
    Snapshot,
}

/// A registered watch: events to send first, then the live channel.
#[derive(Debug)]
pub struct Registration {
    pub initial: Vec<Delivery>,
    pub rx: mpsc::Receiver<Delivery>,
    /// The resourceVersion the initial events are consistent with.
    pub rv: u64,
}

/// A page of a list.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Arc<Stored>>,
    pub rv: u64,
    /// Key of the last item when more remain.
    pub next: Option<Key>,
    pub remaining: Option<u64>,
}

/// How to list.
#[derive(Debug, Default)]
pub struct ListOptions<'a> {
    pub filter: Option<&'a Filter>,
    pub limit: Option<usize>,
    pub after: Option<Key>,
    /// List the state as of this resourceVersion (continuation or an exact read).
    pub at: Option<u64>,
    pub count_remaining: bool,
}

/// A reference to a stored object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjRef {
    pub gr: GroupResource,
    pub key: Key,
}

/// Everything behind the store lock.
pub struct State {
    rv: u64,
    pub registry: Registry,
    tables: HashMap<GroupResource, Table>,
    /// Owner uid to dependents, for garbage collection.
    owners: HashMap<String, BTreeSet<ObjRef>>,
    history_len: usize,
    watch_capacity: usize,
    next_ip: u32,
    published: Arc<AtomicU64>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("rv", &self.rv)
            .field("tables", &self.tables.len())
            .finish_non_exhaustive()
    }
}

fn owner_uids(v: &Value) -> BTreeSet<String> {
    v.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

impl State {
    pub fn rv(&self) -> u64 {
        self.rv
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn publish(&self) {
        self.published.store(self.rv, Ordering::Release);
    }

    pub fn add_table(&mut self, gr: GroupResource) {
        let floor = self.rv;
        self.tables.entry(gr).or_insert_with(|| Table {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            floor,
            watchers: Vec::new(),
        });
    }

    /// Stops storing a resource; its watchers see their channel close. Objects should be
    /// removed first so that watchers get their DELETED events.
    pub fn drop_table(&mut self, gr: &GroupResource) {
        self.tables.remove(gr);
    }

    pub fn get(&self, gr: &GroupResource, key: &Key) -> Option<&Arc<Stored>> {
        self.tables.get(gr)?.objects.get(key)
    }

    /// All objects of a resource, for scans over small sets (RBAC bindings).
    pub fn objects(&self, gr: &GroupResource) -> impl Iterator<Item = &Arc<Stored>> {
        self.tables
            .get(gr)
            .into_iter()
            .flat_map(|t| t.objects.values())
    }

    /// Objects in one namespace, across every namespaced resource.
    pub fn in_namespace(&self, ns: &str) -> Vec<ObjRef> {
        let mut out = Vec::new();
        for (gr, table) in &self.tables {
            let start = (ns.to_string(), String::new());
            for (key, _) in table.objects.range(start..) {
                if key.0 != ns {
                    break;
                }
                out.push(ObjRef {
                    gr: gr.clone(),
                    key: key.clone(),
                });
            }
        }
        out
    }

    pub fn dependents(&self, owner_uid: &str) -> Vec<ObjRef> {
        self.owners
            .get(owner_uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Allocates a ClusterIP from 10.96.0.0/12.
    pub fn next_cluster_ip(&mut self) -> String {
        self.next_ip += 1;
        let n = self.next_ip;
        format!(
            "10.{}.{}.{}",
            96 + ((n >> 16) & 0x0f),
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    /// Writes an object (create or replace), stamping a new resourceVersion.
    pub fn put(
        &mut self,
        gr: &GroupResource,
        key: Key,
        value: Value,
    ) -> Result<Arc<Stored>, StoreError> {
        if !self.tables.contains_key(gr) {
            return Err(StoreError::NoTable(gr.clone()));
        }
        let rv = self.bump();
        let stored = Arc::new(Stored::new(value, rv)?);
        let history_len = self.history_len;
        let Some(table) = self.tables.get_mut(gr) else {
            return Err(StoreError::NoTable(gr.clone()));
        };
        let prev = table.objects.insert(key.clone(), Arc::clone(&stored));
        let event = Arc::new(Event {
            rv,
            kind: if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            key: key.clone(),
            object: Arc::clone(&stored),
            prev: prev.clone(),
        });
        record(table, event, history_len);
        let old_owners = prev
            .as_ref()
            .map(|p| owner_uids(&p.value))
            .unwrap_or_default();
        let new_owners = owner_uids(&stored.value);
        if old_owners != new_owners {
            let me = ObjRef {
                gr: gr.clone(),
                key,
            };
            for uid in old_owners.difference(&new_owners) {
                if let Some(set) = self.owners.get_mut(uid) {
                    set.remove(&me);
                    if set.is_empty() {
                        self.owners.remove(uid);
                    }
                }
            }
            for uid in new_owners.difference(&old_owners) {
                self.owners
                    .entry(uid.clone())
                    .or_default()
                    .insert(me.clone());
            }
        }
        self.publish();
        Ok(stored)
    }

    /// Removes an object; the DELETED event carries its last state (`last`, or the stored
    /// one) stamped with the deletion's version.
    pub fn remove(
        &mut self,
        gr: &GroupResource,
        key: &Key,
        last: Option<Value>,
    ) -> Result<Option<Arc<Stored>>, StoreError> {
        let Some(prev) = self.get(gr, key).cloned() else {
            return Ok(None);
        };
        let rv = self.bump();
        let last = Arc::new(Stored::new(last.unwrap_or_else(|| prev.value.clone()), rv)?);
        let history_len = self.history_len;
        let Some(table) = self.tables.get_mut(gr) else {
            return Ok(None);
        };
        table.objects.remove(key);
        let event = Arc::new(Event {
            rv,
            kind: EventType::Deleted,
            key: key.clone(),
            object: Arc::clone(&last),
            prev: Some(prev.clone()),
        });
        record(table, event, history_len);
        let me = ObjRef {
            gr: gr.clone(),
            key: key.clone(),
        };
        for uid in owner_uids(&prev.value) {
            if let Some(set) = self.owners.get_mut(&uid) {
                set.remove(&me);
                if set.is_empty() {
                    self.owners.remove(&uid);
                }
            }
        }
        self.publish();
        Ok(Some(last))
    }

    /// Registers a watcher; the initial events and the registration are atomic, so nothing is
    /// lost or duplicated between them.
    pub fn watch(
        &mut self,
        gr: &GroupResource,
        filter: Arc<Filter>,
        start: WatchStart,
    ) -> Result<Registration, StoreError> {
        let rv = self.rv;
        let capacity = self.watch_capacity;
        let table = self
            .tables
            .get_mut(gr)
            .ok_or_else(|| StoreError::NoTable(gr.clone()))?;
        let initial = match start {
            WatchStart::After(since) => {
                if since < table.floor {
                    return Err(StoreError::Expired {
                        requested: since,
                        oldest: table.floor,
                    });
                }
                table
                    .history
                    .iter()
                    .filter(|e| e.rv > since)
                    .filter_map(|e| filter.classify(e))
                    .collect()
            }
            WatchStart::Snapshot => table
                .objects
                .iter()
                .filter(|(k, o)| filter.matches(k, &o.value))
                .map(|(k, o)| Delivery {
                    kind: EventType::Added,
                    event: Arc::new(Event {
                        rv: o.rv,
                        kind: EventType::Added,
                        key: k.clone(),
                        object: Arc::clone(o),
                        prev: None,
                    }),
                    as_prev: false,
                })
                .collect(),
        };
        let (tx, rx) = mpsc::channel(capacity);
        table.watchers.push(Watcher { filter, tx });
        Ok(Registration { initial, rx, rv })
    }

    /// Lists one page, optionally as of an earlier resourceVersion reconstructed from history.
    pub fn list(&self, gr: &GroupResource, opts: &ListOptions<'_>) -> Result<Page, StoreError> {
        let table = self
            .tables
            .get(gr)
            .ok_or_else(|| StoreError::NoTable(gr.clone()))?;
        let at = opts.at.filter(|at| *at < self.rv);
        let mut overlay: BTreeMap<&Key, Option<&Arc<Stored>>> = BTreeMap::new();
        if let Some(at) = at {
            if at < table.floor {
                return Err(StoreError::Expired {
                    requested: at,
                    oldest: table.floor,
                });
            }
            // The first change after `at` to each key tells its state at `at`.
            for e in table.history.iter().filter(|e| e.rv > at) {
                overlay.entry(&e.key).or_insert_with(|| match e.kind {
                    EventType::Added => None,
                    EventType::Modified | EventType::Deleted => e.prev.as_ref(),
                });
            }
        }
        let ns = opts.filter.and_then(|f| f.namespace.as_deref());
        let lower: Bound<Key> = match (&opts.after, ns) {
            (Some(after), Some(ns)) if after.0.as_str() > ns => {
                return Ok(Page {
                    items: Vec::new(),
                    rv: at.unwrap_or(self.rv),
                    next: None,
                    remaining: None,
                });
            }
            (Some(after), Some(ns)) if after.0 == ns => Bound::Excluded(after.clone()),
            (Some(_), Some(ns)) | (None, Some(ns)) => {
                Bound::Included((ns.to_string(), String::new()))
            }
            (Some(after), None) => Bound::Excluded(after.clone()),
            (None, None) => Bound::Unbounded,
        };
        let mut current = table
            .objects
            .range((lower.clone(), Bound::Unbounded))
            .peekable();
        let mut past = overlay
            .iter()
            .filter(|(k, _)| match &lower {
                Bound::Included(l) => **k >= l,
                Bound::Excluded(l) => **k > l,
                Bound::Unbounded => true,
            })
            .peekable();
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let unselective = opts
            .filter
            .is_none_or(|f| f.labels.is_empty() && f.fields.is_empty() && f.name.is_none());
        let mut items: Vec<Arc<Stored>> = Vec::new();
        let mut more = false;
        let mut remaining = 0u64;
        loop {
            let (key, obj): (&Key, Option<&Arc<Stored>>) = match (current.peek(), past.peek()) {
                (None, None) => break,
                (Some(_), None) => match current.next() {
                    Some((k, o)) => (k, Some(o)),
                    None => break,
                },
                (None, Some(_)) => match past.next() {
                    Some((k, o)) => (*k, *o),
                    None => break,
                },
                (Some((ck, _)), Some((pk, _))) => {
                    let (ck, pk): (&Key, &Key) = (ck, pk);
                    if pk <= ck {
                        if pk == ck {
                            current.next();
                        }
                        match past.next() {
                            Some((k, o)) => (*k, *o),
                            None => break,
                        }
                    } else {
                        match current.next() {
                            Some((k, o)) => (k, Some(o)),
                            None => break,
                        }
                    }
                }
            };
            if ns.is_some_and(|ns| key.0 != ns) {
                break;
            }
            let Some(obj) = obj else { continue };
            if opts.filter.is_some_and(|f| !f.matches(key, &obj.value)) {
                continue;
            }
            if items.len() >= limit {
                more = true;
                remaining += 1;
                if !opts.count_remaining {
                    break;
                }
                if overlay.is_empty() && unselective {
                    // Only the namespace filters: count the rest of the range without
                    // evaluating anything per object.
                    let rest = current
                        .take_while(|(k, _)| ns.is_none_or(|ns| k.0 == ns))
                        .count();
                    remaining += u64::try_from(rest).unwrap_or(u64::MAX);
                    break;
                }
                continue;
            }
            items.push(Arc::clone(obj));
        }
        let next = if more {
            items.last().map(|o| object::key(&o.value))
        } else {
            None
        };
        Ok(Page {
            items,
            rv: at.unwrap_or(self.rv),
            next,
            remaining: (more && opts.count_remaining).then_some(remaining),
        })
    }
}

fn record(table: &mut Table, event: Arc<Event>, history_len: usize) {
    table.watchers.retain(|w| {
        let Some(delivery) = w.filter.classify(&event) else {
            return !w.tx.is_closed();
        };
        match w.tx.try_send(delivery) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!("closing a watcher that cannot keep up");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
    table.history.push_back(event);
    while table.history.len() > history_len.max(1) {
        if let Some(evicted) = table.history.pop_front() {
            table.floor = evicted.rv;
        }
    }
}

/// The store: state behind a lock that is never held across an await.
#[derive(Debug)]
pub struct Store {
    state: RwLock<State>,
    published: Arc<AtomicU64>,
}

impl Store {
    pub fn new(history_len: usize, watch_capacity: usize) -> Self {
        let published = Arc::new(AtomicU64::new(1));
        let registry = Registry::with_builtins();
        let mut state = State {
            rv: 1,
            tables: HashMap::new(),
            owners: HashMap::new(),
            history_len,
            watch_capacity: watch_capacity.max(1),
            next_ip: 10,
            published: Arc::clone(&published),
            registry,
        };
        let grs: Vec<GroupResource> = state.registry.all().map(|d| d.gr.clone()).collect();
        for gr in grs {
            state.add_table(gr);
        }
        Self {
            state: RwLock::new(state),
            published,
        }
    }

    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write()
    }

    /// The latest resourceVersion, readable without the lock. Everything committed at or
    /// below it has already been queued to watchers.
    pub fn current_rv(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn cm(ns: &str, name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels}})
    }

    fn gr() -> GroupResource {
        GroupResource::new("", "configmaps")
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_string(), name.to_string())
    }

    #[test]
    fn rv_is_global_and_monotonic() {
        let store = Store::new(100, 10);
        let mut s = store.write();
        let a = s
            .put(&gr(), key("default", "a"), cm("default", "a", json!({})))
            .unwrap();
        let b = s
            .put(
                &GroupResource::new("coordination.k8s.io", "leases"),
                key("default", "l"),
                json!({"metadata":{"name":"l","namespace":"default"}}),
            )
            .unwrap();
        assert!(b.rv > a.rv);
        assert_eq!(store.current_rv(), b.rv);
        assert_eq!(a.value["metadata"]["resourceVersion"], a.rv.to_string());
    }

    #[test]
    fn list_pages_are_consistent_with_the_first_page() {
        let store = Store::new(100, 10);
        let mut s = store.write();
        for n in ["a", "b", "c", "d"] {
            s.put(&gr(), key("default", n), cm("default", n, json!({})))
                .unwrap();
        }
        let filter = Filter::default();
        let first = s
            .list(
                &gr(),
                &ListOptions {
                    filter: Some(&filter),
                    limit: Some(2),
                    count_remaining: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, Some(2));
        let after = first.next.clone().unwrap();
        // Changes after the first page must not show up in the continuation.
        s.remove(&gr(), &key("default", "c"), None).unwrap();
        s.put(&gr(), key("default", "bb"), cm("default", "bb", json!({})))
            .unwrap();
        s.put(
            &gr(),
            key("default", "d"),
            cm("default", "d", json!({"x": "y"})),
        )
        .unwrap();
        let second = s
            .list(
                &gr(),
                &ListOptions {
                    filter: Some(&filter),
                    limit: Some(2),
                    after: Some(after),
                    at: Some(first.rv),
                    ..Default::default()
                },
            )
            .unwrap();
        let names: Vec<&str> = second
            .items
            .iter()
            .map(|o| o.value["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["c", "d"]);
        assert!(
            second.items[1].value["metadata"]["labels"]
                .get("x")
                .is_none()
        );
        assert!(second.next.is_none());
    }

    #[test]
    fn history_eviction_expires_old_versions() {
        let store = Store::new(3, 10);
        let mut s = store.write();
        let first = s
            .put(&gr(), key("default", "a"), cm("default", "a", json!({})))
            .unwrap();
        for i in 0..5 {
            s.put(
                &gr(),
                key("default", "a"),
                cm("default", "a", json!({"i": i.to_string()})),
            )
            .unwrap();
        }
        let err = s
            .watch(
                &gr(),
                Arc::new(Filter::default()),
                WatchStart::After(first.rv),
            )
            .unwrap_err();
        assert!(matches!(err, StoreError::Expired { .. }));
        let recent = s.rv() - 1;
        assert!(
            s.watch(
                &gr(),
                Arc::new(Filter::default()),
                WatchStart::After(recent)
            )
            .is_ok()
        );
    }

    #[test]
    fn label_transitions_become_added_and_deleted() {
        let store = Store::new(100, 10);
        let mut s = store.write();
        let filter = Arc::new(Filter {
            labels: LabelSelector::parse("app=web").unwrap(),
            ..Default::default()
        });
        let now = s.rv();
        let mut reg = s.watch(&gr(), filter, WatchStart::After(now)).unwrap();
        s.put(
            &gr(),
            key("default", "a"),
            cm("default", "a", json!({"app": "db"})),
        )
        .unwrap();
        s.put(
            &gr(),
            key("default", "a"),
            cm("default", "a", json!({"app": "web"})),
        )
        .unwrap();
        s.put(
            &gr(),
            key("default", "a"),
            cm("default", "a", json!({"app": "web", "v": "2"})),
        )
        .unwrap();
        let relabel = s
            .put(
                &gr(),
                key("default", "a"),
                cm("default", "a", json!({"app": "db"})),
            )
            .unwrap();
        let kinds: Vec<(EventType, bool)> = std::iter::from_fn(|| reg.rx.try_recv().ok())
            .map(|d| (d.kind, d.as_prev))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (EventType::Added, false),
                (EventType::Modified, false),
                (EventType::Deleted, true)
            ]
        );
        assert_eq!(relabel.rv, s.rv());
    }

    #[test]
    fn slow_watchers_are_dropped() {
        let store = Store::new(100, 2);
        let mut s = store.write();
        let now = s.rv();
        let mut reg = s
            .watch(&gr(), Arc::new(Filter::default()), WatchStart::After(now))
            .unwrap();
        for i in 0..5 {
            s.put(
                &gr(),
                key("default", &format!("n{i}")),
                cm("default", "x", json!({})),
            )
            .unwrap();
        }
        assert!(reg.rx.try_recv().is_ok());
        assert!(reg.rx.try_recv().is_ok());
        assert!(matches!(
            reg.rx.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
    }
}
