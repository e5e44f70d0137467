//! Resource requests: get, list, create, update, patch (incl. server-side apply), delete,
//! deletecollection, and the status and scale subresources.

use std::sync::Arc;

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Method, Request, Response, header};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use crate::apply::{self, Scope, Writer};
use crate::auth::Identity;
use crate::error::{ApiError, FieldError};
use crate::lifecycle::{self, DeleteOptions, Outcome, Propagation, WriteCtx};
use crate::object::Key;
use crate::patch::{self, PatchError, PatchKind};
use crate::rbac::{self, Attributes};
use crate::registry::{GroupResource, ResourceDef, Special, VersionDef};
use crate::respond::{self, Body, Query};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::shared::Shared;
use crate::store::{Filter, ListOptions, StoreError, Stored};
use crate::{object, protobuf, reviews, table, watch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    Status,
    Scale,
}

/// The RBAC verb of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

/// A parsed resource request.
struct Req<'a> {
    shared: &'a Arc<Shared>,
    identity: &'a Identity,
    def: Arc<ResourceDef>,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<Sub>,
    query: Query,
    headers: HeaderMap,
}

impl Req<'_> {
    fn vdef(&self) -> Option<&VersionDef> {
        self.def.version(&self.version)
    }

    fn api_version(&self) -> String {
        self.def.api_version(&self.version)
    }

    fn key(&self) -> Key {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    fn gr(&self) -> &GroupResource {
        &self.def.gr
    }

    /// The field manager: the query parameter, else the User-Agent's product name.
    fn manager(&self) -> String {
        if let Some(m) = self.query.get("fieldManager") {
            return m.to_string();
        }
        self.headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }

    fn scope(&self) -> Scope {
        match self.sub {
            Some(Sub::Status) => Scope::Status,
            _ => Scope::Main {
                status_subresource: self.vdef().is_some_and(|v| v.status),
            },
        }
    }

    /// The object as the client asked for it: its apiVersion is the requested version.
    fn present(&self, stored: &Stored) -> Bytes {
        if self.version == self.def.storage_version {
            stored.json.clone()
        } else {
            self.present_value(&stored.value)
        }
    }

    fn present_value(&self, v: &Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&self.converted(v)).unwrap_or_default())
    }

    fn converted(&self, v: &Value) -> Value {
        let mut out = v.clone();
        if self.version != self.def.storage_version {
            object::ensure_object(&mut out).insert("apiVersion".into(), self.api_version().into());
        }
        out
    }

    fn present_outcome(&self, outcome: &Outcome) -> Bytes {
        match (outcome.json(), self.version == self.def.storage_version) {
            (Some(bytes), true) => bytes,
            _ => self.present_value(outcome.value()),
        }
    }

    fn wants_table(&self) -> bool {
        table::wanted(&respond::accept(&self.headers))
    }
}

pub(crate) async fn handle(
    shared: &Arc<Shared>,
    identity: &Identity,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Response<Body> {
    match dispatch(shared, identity, req, group, version, rest).await {
        Ok(r) => r,
        Err(e) => respond::error(&e),
    }
}

async fn dispatch(
    shared: &Arc<Shared>,
    identity: &Identity,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, ApiError> {
    let (watch_path, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, tail @ ..]
            if *resource != "status" && *resource != "finalize" =>
        {
            let mut parts = vec![*resource];
            parts.extend_from_slice(tail);
            (Some(ns.to_string()), parts)
        }
        _ => (None, rest.to_vec()),
    };
    let (resource, name, sub) = match rest.as_slice() {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(*s)),
        _ => return Err(ApiError::unknown_resource()),
    };
    let def = shared
        .store
        .read()
        .registry
        .lookup(group, version, resource)
        .ok_or_else(ApiError::unknown_resource)?;
    if (!def.namespaced && namespace.is_some())
        || (def.namespaced && namespace.is_none() && name.is_some())
    {
        return Err(ApiError::unknown_resource());
    }
    let vdef = def
        .version(version)
        .ok_or_else(ApiError::unknown_resource)?;
    let sub = match sub {
        None => None,
        Some("status") if vdef.status => Some(Sub::Status),
        Some("scale") if vdef.scale.is_some() => Some(Sub::Scale),
        Some(_) => return Err(ApiError::unknown_resource()),
    };
    let query = Query::parse(req.uri().query());
    let watching = watch_path || query.flag("watch");
    let method = req.method().clone();
    let verb = match (&method, name.is_some(), sub.is_some()) {
        (&Method::GET, _, _) if watching && sub.is_none() => Verb::Watch,
        (&Method::GET, true, _) => Verb::Get,
        (&Method::GET, false, false) => Verb::List,
        (&Method::POST, false, false) => Verb::Create,
        (&Method::PUT, true, _) => Verb::Update,
        (&Method::PATCH, true, _) => Verb::Patch,
        (&Method::DELETE, true, false) => Verb::Delete,
        (&Method::DELETE, false, false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    };
    if def.create_only && verb != Verb::Create {
        return Err(ApiError::method_not_allowed());
    }
    let (parts, body) = req.into_parts();
    let r = Req {
        shared,
        identity,
        def: Arc::clone(&def),
        version: version.to_string(),
        namespace,
        name,
        sub,
        query,
        headers: parts.headers,
    };
    authorize(&r, verb)?;
    match verb {
        Verb::Watch => {
            let mut filter = filter_from(&r)?;
            filter.name = r.name.clone();
            let table = r.wants_table().then(|| r.vdef().cloned()).flatten();
            watch::start(shared, &r.def, &r.version, filter, &r.query, table)
        }
        Verb::Get => get(&r),
        Verb::List => list(&r),
        Verb::Create => create(&r, &respond::read_body(body).await?),
        Verb::Update => update(&r, &respond::read_body(body).await?),
        Verb::Patch => patch(&r, &respond::read_body(body).await?),
        Verb::Delete => delete(&r, &respond::read_body(body).await?),
        Verb::DeleteCollection => delete_collection(&r, &respond::read_body(body).await?),
    }
}

fn authorize(r: &Req<'_>, verb: Verb) -> Result<(), ApiError> {
    // Every authenticated user may ask what it may do (the default system:basic-user role).
    let review = r.def.special == Special::SelfSubjectAccessReview;
    if review
        || !r
            .shared
            .enforce_rbac
            .load(std::sync::atomic::Ordering::Relaxed)
        || r.identity.is_admin()
    {
        return Ok(());
    }
    let pinned;
    let name = match (&r.name, verb) {
        (Some(n), _) => n.as_str(),
        (None, Verb::List | Verb::Watch) => {
            pinned = r
                .query
                .get("fieldSelector")
                .and_then(|fs| FieldSelector::parse(fs, &r.def.field_labels).ok())
                .and_then(|fs| fs.pinned_name().map(String::from))
                .unwrap_or_default();
            pinned.as_str()
        }
        _ => "",
    };
    let groups = r.identity.effective_groups();
    let attrs = Attributes {
        user: &r.identity.user,
        groups: &groups,
        verb: verb.as_str(),
        group: &r.def.gr.group,
        resource: &r.def.gr.resource,
        subresource: match r.sub {
            Some(Sub::Status) => "status",
            Some(Sub::Scale) => "scale",
            None => "",
        },
        namespace: r.namespace.as_deref().unwrap_or(""),
        name,
    };
    if rbac::allows(&r.shared.store.read(), &attrs) {
        Ok(())
    } else {
        let shown_name = if verb == Verb::Create || r.name.is_none() {
            ""
        } else {
            name
        };
        Err(ApiError::forbidden(r.gr(), shown_name, &attrs.denial()))
    }
}

fn filter_from(r: &Req<'_>) -> Result<Filter, ApiError> {
    let labels = match r.query.get("labelSelector") {
        Some(s) => LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.0))?,
        None => LabelSelector::everything(),
    };
    let fields = match r.query.get("fieldSelector") {
        Some(s) => {
            FieldSelector::parse(s, &r.def.field_labels).map_err(|e| ApiError::bad_request(e.0))?
        }
        None => FieldSelector::default(),
    };
    Ok(Filter {
        namespace: r.namespace.clone(),
        name: None,
        labels,
        fields,
    })
}

fn scale_of(vdef: &VersionDef, obj: &Value) -> Value {
    let Some(paths) = &vdef.scale else {
        return Value::Null;
    };
    let int = |path: &str| {
        object::get_path(obj, path)
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let selector = paths.label_selector.as_deref().and_then(|path| {
        let v = object::get_path(obj, path)?;
        if paths.selector_is_object {
            LabelSelector::from_object(v).ok().map(|s| s.to_string())
        } else {
            v.as_str().map(String::from)
        }
    });
    let mut meta = Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = obj.pointer(&format!("/metadata/{f}")) {
            meta.insert(f.into(), v.clone());
        }
    }
    let mut status = json!({"replicas": int(&paths.status_replicas)});
    if let (Some(sel), Some(m)) = (selector.filter(|s| !s.is_empty()), status.as_object_mut()) {
        m.insert("selector".into(), sel.into());
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": int(&paths.spec_replicas)},
        "status": status,
    })
}

fn get(r: &Req<'_>) -> Result<Response<Body>, ApiError> {
    let key = r.key();
    let stored = r
        .shared
        .store
        .read()
        .get(r.gr(), &key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(r.gr(), &key.1))?;
    if r.sub == Some(Sub::Scale) {
        let vdef = r.vdef().ok_or_else(ApiError::unknown_resource)?;
        return Ok(respond::json(200, &scale_of(vdef, &stored.value)));
    }
    if r.wants_table()
        && let Some(vdef) = r.vdef()
    {
        let meta = json!({"resourceVersion": stored.rv.to_string()});
        return Ok(respond::json(
            200,
            &table::render(vdef, [&stored.value], meta),
        ));
    }
    Ok(respond::json_bytes(200, r.present(&stored)))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

fn encode_continue(rv: u64, key: &Key) -> String {
    let token = ContinueToken {
        rv,
        ns: key.0.clone(),
        name: key.1.clone(),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&token).unwrap_or_default())
}

fn decode_continue(s: &str) -> Result<ContinueToken, ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}")))
}

fn list(r: &Req<'_>) -> Result<Response<Body>, ApiError> {
    let filter = filter_from(r)?;
    let limit = match r.query.get("limit") {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
        None => None,
    };
    let cont = match r.query.get("continue") {
        Some(c) => {
            if r.query.get("resourceVersion").is_some_and(|v| v != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            Some(decode_continue(c)?)
        }
        None => None,
    };
    let exact = match (
        r.query.get("resourceVersionMatch"),
        r.query.get("resourceVersion"),
    ) {
        (Some("Exact"), Some(rv)) => Some(parse_rv(rv)?),
        (Some("Exact"), None) => {
            return Err(ApiError::bad_request(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"\"",
            ));
        }
        (Some("NotOlderThan" | "") | None, Some(rv)) => {
            parse_rv(rv)?;
            None
        }
        (Some("NotOlderThan" | "") | None, None) => None,
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
    };
    let at = cont.as_ref().map(|c| c.rv).or(exact);
    let opts = ListOptions {
        filter: Some(&filter),
        limit,
        after: cont.as_ref().map(|c| (c.ns.clone(), c.name.clone())),
        at,
        count_remaining: filter.labels.is_empty() && filter.fields.is_empty(),
    };
    let page = r.shared.store.read().list(r.gr(), &opts).map_err(|e| match e {
        StoreError::Expired { requested, oldest } if cont.is_some() => ApiError::expired(format!(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter. (requested {requested}, oldest {oldest})"
        )),
        StoreError::Expired { requested, oldest } => {
            ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
        }
        StoreError::NoTable(_) => ApiError::unknown_resource(),
        other => ApiError::internal(other.to_string()),
    })?;
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(m) = meta.as_object_mut() {
        if let Some(next) = &page.next {
            m.insert("continue".into(), encode_continue(page.rv, next).into());
        }
        if let Some(n) = page.remaining {
            m.insert("remainingItemCount".into(), n.into());
        }
    }
    if r.wants_table()
        && let Some(vdef) = r.vdef()
    {
        return Ok(respond::json(
            200,
            &table::render(vdef, page.items.iter().map(|s| &s.value), meta),
        ));
    }
    let total: usize = page.items.iter().map(|i| i.json.len() + 1).sum();
    let mut buf = BytesMut::with_capacity(total + 256);
    buf.put_slice(b"{\"kind\":");
    buf.put_slice(&serde_json::to_vec(&r.def.list_kind).unwrap_or_default());
    buf.put_slice(b",\"apiVersion\":");
    buf.put_slice(&serde_json::to_vec(&r.api_version()).unwrap_or_default());
    buf.put_slice(b",\"metadata\":");
    buf.put_slice(&serde_json::to_vec(&meta).unwrap_or_default());
    buf.put_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            buf.put_u8(b',');
        }
        buf.put_slice(&r.present(item));
    }
    buf.put_slice(b"]}");
    Ok(respond::json_bytes(200, buf.freeze()))
}

/// Checks and completes the identity fields of a request body against the URL.
fn check_body(r: &Req<'_>, obj: &mut Value, require_type: bool) -> Result<(), ApiError> {
    let expected = r.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == expected => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        None if require_type => {
            return Err(ApiError::bad_request("apiVersion must be set"));
        }
        None => {}
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k == r.def.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                r.def.kind
            )));
        }
        None if require_type => return Err(ApiError::bad_request("kind must be set")),
        None => {}
    }
    let root = object::ensure_object(obj);
    root.insert("apiVersion".into(), expected.into());
    root.insert("kind".into(), r.def.kind.clone().into());
    let url_ns = r.namespace.clone().unwrap_or_default();
    let meta = object::meta_mut(obj);
    if r.def.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != url_ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), url_ns.into());
            }
        }
    }
    if let Some(url_name) = &r.name {
        match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != url_name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({url_name})"
                )));
            }
            _ => {
                meta.insert("name".into(), url_name.clone().into());
            }
        }
    }
    Ok(())
}

/// Decodes a create or update body: JSON, YAML, or protobuf for the kinds kubectl's typed
/// commands send that way.
fn decode_body(r: &Req<'_>, bytes: &[u8]) -> Result<Value, ApiError> {
    match respond::content_type(&r.headers).as_str() {
        "" | "application/json" | "application/yaml" | "*/*" => {
            respond::decode_object(bytes, &r.def)
        }
        ct if protobuf::is_protobuf(ct) => {
            protobuf::decode(bytes).map_err(ApiError::unsupported_protobuf)
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn now() -> String {
    object::now()
}

fn write_error(e: StoreError) -> ApiError {
    ApiError::internal(e.to_string())
}

fn create(r: &Req<'_>, bytes: &[u8]) -> Result<Response<Body>, ApiError> {
    let mut obj = decode_body(r, bytes)?;
    check_body(r, &mut obj, false)?;
    if r.def.special.is_review() {
        let answered = reviews::answer(r.shared, r.identity, r.def.special, obj)?;
        return Ok(respond::json(201, &answered));
    }
    let dry_run = r.query.dry_run()?;
    let manager = r.manager();
    let now = now();
    let api_version = r.api_version();
    let ctx = WriteCtx {
        def: &r.def,
        version: &r.version,
        writer: Writer {
            manager: &manager,
            api_version: &api_version,
            scope: r.scope(),
            now: &now,
        },
        dry_run,
    };
    let outcome = lifecycle::create(&mut r.shared.store.write(), &ctx, obj, None)?;
    Ok(respond::json_bytes(201, r.present_outcome(&outcome)))
}

fn update(r: &Req<'_>, bytes: &[u8]) -> Result<Response<Body>, ApiError> {
    let dry_run = r.query.dry_run()?;
    let manager = r.manager();
    let now = now();
    let api_version = r.api_version();
    let key = r.key();
    // Bodies are decoded before the store lock is taken.
    let body = if r.sub == Some(Sub::Scale) {
        respond::parse_document(bytes).map_err(ApiError::bad_request)?
    } else {
        let mut obj = decode_body(r, bytes)?;
        check_body(r, &mut obj, false)?;
        obj
    };
    let mut st = r.shared.store.write();
    let old = st
        .get(r.gr(), &key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(r.gr(), &key.1))?;
    if r.sub == Some(Sub::Scale) {
        return write_scale(r, &mut st, &old, &body, &manager, &now, dry_run);
    }
    if let Some(rv) = object::meta_str(&body, "resourceVersion").filter(|v| !v.is_empty())
        && rv != old.rv.to_string()
    {
        return Err(ApiError::stale(r.gr(), &key.1));
    }
    let ctx = WriteCtx {
        def: &r.def,
        version: &r.version,
        writer: Writer {
            manager: &manager,
            api_version: &api_version,
            scope: r.scope(),
            now: &now,
        },
        dry_run,
    };
    let outcome = lifecycle::update(&mut st, &ctx, &old, body, None)?;
    drop(st);
    Ok(respond::json_bytes(200, r.present_outcome(&outcome)))
}

fn write_scale(
    r: &Req<'_>,
    st: &mut crate::store::State,
    old: &Arc<Stored>,
    scale: &Value,
    manager: &str,
    now: &str,
    dry_run: bool,
) -> Result<Response<Body>, ApiError> {
    let vdef = r.vdef().ok_or_else(ApiError::unknown_resource)?;
    let Some(paths) = &vdef.scale else {
        return Err(ApiError::unknown_resource());
    };
    if let Some(rv) = object::meta_str(scale, "resourceVersion").filter(|v| !v.is_empty())
        && rv != old.rv.to_string()
    {
        return Err(ApiError::stale(r.gr(), object::name(&old.value)));
    }
    let replicas = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
    if replicas
        .as_i64()
        .is_none_or(|n| n < 0 || n > i64::from(i32::MAX))
    {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            object::name(&old.value),
            vec![FieldError::invalid(
                "spec.replicas",
                replicas,
                "must be greater than or equal to 0",
            )],
        ));
    }
    let mut new = old.value.clone();
    object::set_path(&mut new, &paths.spec_replicas, replicas);
    let api_version = r.api_version();
    let ctx = WriteCtx {
        def: &r.def,
        version: &r.version,
        writer: Writer {
            manager,
            api_version: &api_version,
            scope: Scope::Main {
                status_subresource: vdef.status,
            },
            now,
        },
        dry_run,
    };
    let outcome = lifecycle::update(st, &ctx, old, new, None)?;
    Ok(respond::json(200, &scale_of(vdef, outcome.value())))
}

fn patch(r: &Req<'_>, bytes: &[u8]) -> Result<Response<Body>, ApiError> {
    let content_type = respond::content_type(&r.headers);
    let kind = match content_type.as_str() {
        "application/apply-patch+yaml" => None,
        "application/merge-patch+json" => Some(PatchKind::Merge),
        "application/strategic-merge-patch+json" if !r.def.custom => Some(PatchKind::Strategic),
        "application/json-patch+json" => Some(PatchKind::Json),
        _ => return Err(ApiError::unsupported_patch_type(r.def.custom)),
    };
    let patch_options_error =
        |e: FieldError| ApiError::invalid("meta.k8s.io", "PatchOptions", "", vec![e]);
    if kind.is_some() && r.query.get("force").is_some() {
        return Err(patch_options_error(FieldError::forbidden(
            "force",
            "may not be specified for non-apply patch",
        )));
    }
    let dry_run = r.query.dry_run()?;
    let now = now();
    let api_version = r.api_version();
    let manager = match kind {
        None => r
            .query
            .get("fieldManager")
            .map(String::from)
            .ok_or_else(|| {
                patch_options_error(FieldError::required(
                    "fieldManager",
                    "is required for apply patch",
                ))
            })?,
        Some(_) => r.manager(),
    };
    let writer = Writer {
        manager: &manager,
        api_version: &api_version,
        scope: r.scope(),
        now: &now,
    };
    let ctx = WriteCtx {
        def: &r.def,
        version: &r.version,
        writer,
        dry_run,
    };
    let key = r.key();
    let Some(kind) = kind else {
        let mut config = respond::parse_document(bytes).map_err(ApiError::bad_request)?;
        if !config.is_object() {
            return Err(ApiError::bad_request(
                "apply configuration must be an object",
            ));
        }
        check_body(r, &mut config, true)?;
        if r.def.custom
            && let Some(schema) = r.vdef().and_then(|v| v.schema.as_ref())
        {
            crate::crd::prune(&mut config, schema);
        }
        let force = r.query.flag("force");
        let mut st = r.shared.store.write();
        let old = st.get(r.gr(), &key).cloned();
        return match old {
            Some(old) => {
                let entries = apply::read_entries(&old.value);
                let (merged, entries) = apply::apply(&old.value, entries, &config, force, &writer)
                    .map_err(|conflicts| {
                        let pairs: Vec<(String, String)> = conflicts
                            .into_iter()
                            .map(|c| (c.manager, c.field))
                            .collect();
                        ApiError::apply_conflict(&pairs)
                    })?;
                let outcome = lifecycle::update(&mut st, &ctx, &old, merged, Some(entries))?;
                drop(st);
                Ok(respond::json_bytes(200, r.present_outcome(&outcome)))
            }
            None if r.sub.is_some() => Err(ApiError::not_found(r.gr(), &key.1)),
            None => {
                let mut skeleton = json!({"apiVersion": api_version, "kind": r.def.kind, "metadata": {"name": key.1}});
                if r.def.namespaced {
                    object::meta_mut(&mut skeleton)
                        .insert("namespace".into(), key.0.clone().into());
                }
                let (merged, entries) =
                    apply::apply(&skeleton, Vec::new(), &config, force, &writer)
                        .map_err(|_| ApiError::internal("conflict on a new object"))?;
                let outcome = lifecycle::create(&mut st, &ctx, merged, Some(entries))?;
                drop(st);
                Ok(respond::json_bytes(201, r.present_outcome(&outcome)))
            }
        };
    };
    let mut st = r.shared.store.write();
    let old = st
        .get(r.gr(), &key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(r.gr(), &key.1))?;
    let patch_error = |e: PatchError| match e {
        PatchError::Decode(m) => ApiError::bad_request(m),
        PatchError::Apply(m) => ApiError::unprocessable(m),
    };
    if r.sub == Some(Sub::Scale) {
        let vdef = r.vdef().ok_or_else(ApiError::unknown_resource)?;
        let mut scale = scale_of(vdef, &old.value);
        patch::apply(kind, &mut scale, bytes).map_err(patch_error)?;
        return write_scale(r, &mut st, &old, &scale, &manager, &now, dry_run);
    }
    let mut target = r.converted(&old.value);
    patch::apply(kind, &mut target, bytes).map_err(patch_error)?;
    if let Some(rv) = object::meta_str(&target, "resourceVersion").filter(|v| !v.is_empty())
        && rv != old.rv.to_string()
    {
        return Err(ApiError::stale(r.gr(), &key.1));
    }
    let outcome = lifecycle::update(&mut st, &ctx, &old, target, None)?;
    drop(st);
    Ok(respond::json_bytes(200, r.present_outcome(&outcome)))
}

fn delete_options(r: &Req<'_>, bytes: &[u8]) -> Result<DeleteOptions, ApiError> {
    let body: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let policy = body
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| r.query.get("propagationPolicy").map(String::from));
    let orphan = body.get("orphanDependents").and_then(Value::as_bool) == Some(true)
        || r.query.flag("orphanDependents");
    let propagation = match policy.as_deref() {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        Some("Background") => Propagation::Background,
        None if orphan => Propagation::Orphan,
        None => Propagation::Background,
        Some(other) => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "DeleteOptions",
                "",
                vec![FieldError::not_supported(
                    "propagationPolicy",
                    other,
                    "supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
                )],
            ));
        }
    };
    let body_dry_run = body
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v == "All"));
    Ok(DeleteOptions {
        propagation,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
        dry_run: body_dry_run || r.query.dry_run()?,
    })
}

/// Namespaces are removed a little after they turn Terminating, so that deletes of their
/// contents issued right after (as `kubectl delete -f` does) still find them.
fn schedule_namespace_cleanup(r: &Req<'_>, name: String) {
    let shared = Arc::clone(r.shared);
    tokio::spawn(async move {
        tokio::time::sleep(shared.namespace_deletion_delay).await;
        if let Err(e) = lifecycle::finish_namespace(&mut shared.store.write(), &name) {
            tracing::warn!(namespace = %name, error = %e, "namespace cleanup failed");
        }
    });
}

fn delete(r: &Req<'_>, bytes: &[u8]) -> Result<Response<Body>, ApiError> {
    let opts = delete_options(r, bytes)?;
    let key = r.key();
    let (outcome, gone) =
        lifecycle::delete(&mut r.shared.store.write(), &r.def, &key, &opts, &now())?;
    if r.def.special == Special::Namespace && !gone && !opts.dry_run {
        schedule_namespace_cleanup(r, key.1);
        return Ok(respond::json_bytes(200, r.present_outcome(&outcome)));
    }
    Ok(respond::json_bytes(
        if gone { 200 } else { 202 },
        r.present_outcome(&outcome),
    ))
}

fn delete_collection(r: &Req<'_>, bytes: &[u8]) -> Result<Response<Body>, ApiError> {
    let opts = delete_options(r, bytes)?;
    let filter = filter_from(r)?;
    let now = now();
    let mut st = r.shared.store.write();
    let page = st
        .list(
            r.gr(),
            &ListOptions {
                filter: Some(&filter),
                ..ListOptions::default()
            },
        )
        .map_err(write_error)?;
    let mut items = Vec::new();
    for obj in page.items {
        let key = object::key(&obj.value);
        match lifecycle::delete(&mut st, &r.def, &key, &opts, &now) {
            Ok((outcome, gone)) => {
                if r.def.special == Special::Namespace && !gone && !opts.dry_run {
                    schedule_namespace_cleanup(r, key.1);
                }
                items.push(r.converted(outcome.value()));
            }
            // Removed meanwhile by a cascade from an earlier item.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = st.rv();
    drop(st);
    Ok(respond::json(
        200,
        &json!({
            "kind": r.def.list_kind,
            "apiVersion": r.api_version(),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    ))
}
