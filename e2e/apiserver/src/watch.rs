//! Watch streams: newline-delimited JSON events over a chunked response, with bookmarks,
//! timeouts and initial events.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::{ApiError, FieldError};
use crate::registry::{ResourceDef, VersionDef};
use crate::respond::{self, Body, Query};
use crate::shared::Shared;
use crate::store::{Delivery, Filter, Registration, StoreError, WatchStart};
use crate::{object, table};

/// Renders events for one watch: version conversion and optional Table rows.
struct Framer {
    def: Arc<ResourceDef>,
    version: String,
    table: Option<VersionDef>,
}

impl Framer {
    fn object(&self, v: &Value) -> Value {
        let mut out = v.clone();
        if self.version != self.def.storage_version {
            object::ensure_object(&mut out).insert(
                "apiVersion".into(),
                self.def.api_version(&self.version).into(),
            );
        }
        match &self.table {
            Some(vdef) => table::render(vdef, [&out], json!({})),
            None => out,
        }
    }

    fn frame(kind: &str, object: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(object.len() + 32);
        b.put_slice(b"{\"type\":\"");
        b.put_slice(kind.as_bytes());
        b.put_slice(b"\",\"object\":");
        b.put_slice(object);
        b.put_slice(b"}\n");
        b.freeze()
    }

    fn event(&self, d: &Delivery) -> Bytes {
        let kind = d.kind.as_str();
        let prev = d.event.prev.as_ref().filter(|_| d.as_prev);
        match prev {
            Some(prev) => {
                let mut v = prev.value.clone();
                object::meta_mut(&mut v)
                    .insert("resourceVersion".into(), d.event.rv.to_string().into());
                Self::frame(
                    kind,
                    &serde_json::to_vec(&self.object(&v)).unwrap_or_default(),
                )
            }
            None if self.table.is_none() && self.version == self.def.storage_version => {
                Self::frame(kind, &d.event.object.json)
            }
            None => Self::frame(
                kind,
                &serde_json::to_vec(&self.object(&d.event.object.value)).unwrap_or_default(),
            ),
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end && let Some(m) = meta.as_object_mut() {
            m.insert(
                "annotations".into(),
                json!({"k8s.io/initial-events-end": "true"}),
            );
        }
        let obj = json!({"kind": self.def.kind, "apiVersion": self.def.api_version(&self.version), "metadata": meta});
        Self::frame("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
    }

    fn error(e: &ApiError) -> Bytes {
        Self::frame(
            "ERROR",
            &serde_json::to_vec(&e.to_status()).unwrap_or_default(),
        )
    }
}

fn list_options_invalid(e: FieldError) -> ApiError {
    ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![e])
}

/// Starts a watch; the events flow from a task into the chunked response.
pub(crate) fn start(
    shared: &Arc<Shared>,
    def: &Arc<ResourceDef>,
    version: &str,
    filter: Filter,
    query: &Query,
    table: Option<VersionDef>,
) -> Result<Response<Body>, ApiError> {
    let bookmarks = query.flag("allowWatchBookmarks");
    let initial = query.flag("sendInitialEvents");
    if initial {
        if query.get("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(list_options_invalid(FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )));
        }
        if !bookmarks {
            return Err(list_options_invalid(FieldError::forbidden(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            )));
        }
    }
    let start = match query.get("resourceVersion") {
        _ if initial => WatchStart::Snapshot,
        None | Some("0") => WatchStart::Snapshot,
        Some(rv) => WatchStart::After(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => shared.default_watch_timeout,
    };
    let framer = Framer {
        def: Arc::clone(def),
        version: version.to_string(),
        table,
    };
    let (out, rx) = mpsc::channel(16);
    let registered = shared.store.write().watch(&def.gr, Arc::new(filter), start);
    let registration = match registered {
        Ok(r) => r,
        Err(StoreError::Expired { requested, oldest }) => {
            // The real server answers 200 and sends the 410 as an ERROR event.
            let e = ApiError::expired(format!("too old resource version: {requested} ({oldest})"));
            let _ = out.try_send(Ok(Framer::error(&e)));
            return Ok(respond::streaming(rx));
        }
        Err(StoreError::NoTable(_)) => return Err(ApiError::unknown_resource()),
        Err(e) => return Err(ApiError::internal(e.to_string())),
    };
    let task = WatchTask {
        shared: Arc::clone(shared),
        framer,
        out,
        bookmarks,
        initial_end: initial,
        timeout,
    };
    tokio::spawn(task.run(registration));
    Ok(respond::streaming(rx))
}

struct WatchTask {
    shared: Arc<Shared>,
    framer: Framer,
    out: mpsc::Sender<Result<Bytes, std::io::Error>>,
    bookmarks: bool,
    initial_end: bool,
    timeout: Duration,
}

impl WatchTask {
    /// Sends a frame; false when the client is gone.
    async fn send(&self, frame: Bytes) -> bool {
        self.out.send(Ok(frame)).await.is_ok()
    }

    /// Streams until the client leaves, the timeout, or the registration closes; then the
    /// response ends cleanly.
    async fn run(self, mut reg: Registration) {
        let mut last_rv = match reg.initial.last() {
            Some(d) => d.event.rv.max(reg.rv),
            None => reg.rv,
        };
        for d in std::mem::take(&mut reg.initial) {
            if !self.send(self.framer.event(&d)).await {
                return;
            }
        }
        if self.initial_end && !self.send(self.framer.bookmark(reg.rv, true)).await {
            return;
        }
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let every = self.shared.bookmark_interval.max(Duration::from_millis(10));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                biased;
                () = self.out.closed() => return,
                () = &mut deadline => return,
                delivery = reg.rx.recv() => match delivery {
                    Some(d) => {
                        last_rv = last_rv.max(d.event.rv);
                        if !self.send(self.framer.event(&d)).await {
                            return;
                        }
                    }
                    // Closed as too slow, or the resource stopped being served.
                    None => return,
                },
                _ = ticker.tick(), if self.bookmarks => {
                    // Everything committed up to `now` is already queued: drain it first so
                    // the bookmark never claims a version the client has not seen.
                    let now = self.shared.store.current_rv();
                    while let Ok(d) = reg.rx.try_recv() {
                        last_rv = last_rv.max(d.event.rv);
                        if !self.send(self.framer.event(&d)).await {
                            return;
                        }
                    }
                    last_rv = last_rv.max(now);
                    if !self.send(self.framer.bookmark(last_rv, false)).await {
                        return;
                    }
                }
            }
        }
    }
}
