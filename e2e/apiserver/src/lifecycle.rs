//! The write path shared by create, update, patch, apply and delete: server-owned metadata,
//! status subresource semantics, generation, managed fields, no-op detection, finalizers,
//! garbage collection, namespace and CRD cascades.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::apply::{self, Entry, Scope, Writer};
use crate::error::{ApiError, FieldError};
use crate::object::Key;
use crate::registry::{GroupResource, ResourceDef, Special};
use crate::store::{State, Stored};
use crate::{crd, kinds, object, validation};

/// The result of a write: a stored object, or one that was computed but not persisted
/// (dry run).
#[derive(Debug)]
pub enum Outcome {
    Stored(Arc<Stored>),
    Transient(Value),
}

impl Outcome {
    pub fn value(&self) -> &Value {
        match self {
            Self::Stored(s) => &s.value,
            Self::Transient(v) => v,
        }
    }

    /// Serialized bytes when they already exist.
    pub fn json(&self) -> Option<Bytes> {
        match self {
            Self::Stored(s) => Some(s.json.clone()),
            Self::Transient(_) => None,
        }
    }
}

/// Who writes what, where.
#[derive(Clone, Copy, Debug)]
pub struct WriteCtx<'a> {
    pub def: &'a ResourceDef,
    /// The version of the request (its schema is used for custom resources).
    pub version: &'a str,
    pub writer: Writer<'a>,
    pub dry_run: bool,
}

impl WriteCtx<'_> {
    fn status_subresource(&self) -> bool {
        self.def.version(self.version).is_some_and(|v| v.status)
    }

    fn invalid(&self, name: &str, errs: Vec<FieldError>) -> ApiError {
        ApiError::invalid(&self.def.gr.group, &self.def.kind, name, errs)
    }

    fn schema_errors(&self, obj: &mut Value, old: Option<&Value>) -> Vec<FieldError> {
        match self
            .def
            .version(self.version)
            .and_then(|v| v.schema.as_ref())
        {
            Some(schema) if self.def.custom => crd::apply_schema(obj, schema, old),
            _ => Vec::new(),
        }
    }
}

const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn generate_name(prefix: &str) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| char::from(GENERATE_ALPHABET[rng.random_range(0..GENERATE_ALPHABET.len())]))
        .collect();
    format!("{prefix}{suffix}")
}

/// Everything but metadata (and status when it is a subresource): what generation tracks.
fn spec_part(v: &Value, without_status: bool) -> Map<String, Value> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !(*k == "metadata"
                        || *k == "apiVersion"
                        || *k == "kind"
                        || (without_status && *k == "status"))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Creates an object; `entries` are managed fields already computed by an apply.
pub fn create(
    st: &mut State,
    ctx: &WriteCtx<'_>,
    mut obj: Value,
    entries: Option<Vec<Entry>>,
) -> Result<Outcome, ApiError> {
    let def = ctx.def;
    let now = ctx.writer.now;
    let ns = object::namespace(&obj).to_string();
    if def.namespaced {
        let namespaces = GroupResource::new("", "namespaces");
        match st.get(&namespaces, &(String::new(), ns.clone())) {
            None => return Err(ApiError::not_found(&namespaces, &ns)),
            Some(n) if object::is_deleting(&n.value) => {
                return Err(ApiError::forbidden(
                    &def.gr,
                    object::name(&obj),
                    &format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    if object::meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if object::name(&obj).is_empty()
        && let Some(prefix) = object::meta_str(&obj, "generateName").map(String::from)
        && !prefix.is_empty()
        && validation::name(def.name_rule, &prefix, true).is_ok()
    {
        let mut candidate = generate_name(&prefix);
        while st.get(&def.gr, &(ns.clone(), candidate.clone())).is_some() {
            candidate = generate_name(&prefix);
        }
        object::meta_mut(&mut obj).insert("name".into(), candidate.into());
    }
    {
        let root = object::ensure_object(&mut obj);
        root.insert("apiVersion".into(), def.storage_api_version().into());
        root.insert("kind".into(), def.kind.clone().into());
    }
    let meta = object::meta_mut(&mut obj);
    for f in [
        "uid",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "resourceVersion",
    ] {
        meta.remove(f);
    }
    if !def.namespaced {
        meta.remove("namespace");
    }
    meta.insert("uid".into(), object::new_uid().into());
    meta.insert("creationTimestamp".into(), now.into());
    if def.generation {
        meta.insert("generation".into(), 1.into());
    } else {
        meta.remove("generation");
    }
    if ctx.status_subresource() {
        let root = object::ensure_object(&mut obj);
        match &def.initial_status {
            Some(initial) => {
                root.insert("status".into(), initial.clone());
            }
            None => {
                root.remove("status");
            }
        }
    }
    let mut errs = kinds::prepare(st, def, None, &mut obj, now)?;
    errs.extend(ctx.schema_errors(&mut obj, None));
    errs.extend(validation::object_meta(
        def.name_rule,
        obj.get("metadata").unwrap_or(&Value::Null),
    ));
    let name = object::name(&obj).to_string();
    if !errs.is_empty() {
        return Err(ctx.invalid(&name, errs));
    }
    let key = object::key(&obj);
    if st.get(&def.gr, &key).is_some() {
        return Err(ApiError::already_exists(&def.gr, &name));
    }
    if def.special == Special::Service {
        kinds::allocate_cluster_ip(st, &mut obj);
    }
    let entries = match entries {
        Some(e) => e,
        None => apply::track_update(&Value::Object(Map::new()), &obj, Vec::new(), &ctx.writer),
    };
    apply::write_entries(&mut obj, &entries, &[]);
    if ctx.dry_run {
        return Ok(Outcome::Transient(obj));
    }
    let stored = st
        .put(&def.gr, key, obj)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    after_put(st, def, &stored);
    Ok(Outcome::Stored(stored))
}

/// Replaces `old` with `new` (a PUT body, a patched object or an apply result). `entries` are
/// managed fields already computed by an apply; otherwise the write is tracked as an Update.
pub fn update(
    st: &mut State,
    ctx: &WriteCtx<'_>,
    old: &Arc<Stored>,
    new: Value,
    entries: Option<Vec<Entry>>,
) -> Result<Outcome, ApiError> {
    let def = ctx.def;
    let old_v = &old.value;
    let name = object::name(old_v).to_string();
    let new_uid = object::uid(&new).to_string();
    if !new_uid.is_empty() && new_uid != object::uid(old_v) {
        return Err(ApiError::conflict(
            &def.gr,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {}",
                object::uid(old_v)
            ),
        ));
    }
    let old_entries = apply::read_entries(old_v);
    // A body may reset managedFields (empty list) or replace them; absent keeps the old ones.
    let base_entries = match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if a.is_empty() => Vec::new(),
        Some(Value::Array(_)) => apply::read_entries(&new),
        _ => old_entries.clone(),
    };
    let mut obj = match ctx.writer.scope {
        Scope::Status => {
            let mut merged = old_v.clone();
            let root = object::ensure_object(&mut merged);
            match new.get("status") {
                Some(s) => {
                    root.insert("status".into(), s.clone());
                }
                None => {
                    root.remove("status");
                }
            }
            merged
        }
        Scope::Main { .. } => {
            let mut obj = new;
            if ctx.status_subresource() {
                let root = object::ensure_object(&mut obj);
                match old_v.get("status") {
                    Some(s) => {
                        root.insert("status".into(), s.clone());
                    }
                    None => {
                        root.remove("status");
                    }
                }
            }
            obj
        }
    };
    {
        let root = object::ensure_object(&mut obj);
        root.insert("apiVersion".into(), def.storage_api_version().into());
        root.insert("kind".into(), def.kind.clone().into());
    }
    let old_meta = old_v
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let meta = object::meta_mut(&mut obj);
    meta.remove("selfLink");
    for f in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
    ] {
        match old_meta.get(f) {
            Some(v) => {
                meta.insert(f.into(), v.clone());
            }
            None => {
                meta.remove(f);
            }
        }
    }
    let mut errs = Vec::new();
    if object::is_deleting(old_v) {
        let before = object::finalizers(old_v);
        if object::finalizers(&obj).iter().any(|f| !before.contains(f)) {
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                "no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    errs.extend(kinds::prepare(
        st,
        def,
        Some(old_v),
        &mut obj,
        ctx.writer.now,
    )?);
    errs.extend(ctx.schema_errors(&mut obj, Some(old_v)));
    errs.extend(validation::object_meta(
        def.name_rule,
        obj.get("metadata").unwrap_or(&Value::Null),
    ));
    if !errs.is_empty() {
        return Err(ctx.invalid(&name, errs));
    }
    let entries = match entries {
        Some(applied) => applied,
        None => apply::track_update(old_v, &obj, base_entries, &ctx.writer),
    };
    apply::write_entries(&mut obj, &entries, &old_entries);
    if def.generation {
        let without_status = ctx.status_subresource();
        if spec_part(old_v, without_status) != spec_part(&obj, without_status) {
            let g = old_v
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            object::meta_mut(&mut obj).insert("generation".into(), (g + 1).into());
        }
    }
    commit(st, ctx, old, obj)
}

fn commit(
    st: &mut State,
    ctx: &WriteCtx<'_>,
    old: &Arc<Stored>,
    obj: Value,
) -> Result<Outcome, ApiError> {
    // The real server skips writes that change nothing: no new resourceVersion, no event.
    if obj == old.value {
        return Ok(Outcome::Stored(Arc::clone(old)));
    }
    let key = object::key(&old.value);
    if object::is_deleting(&obj) && object::finalizers(&obj).is_empty() {
        if ctx.dry_run {
            return Ok(Outcome::Transient(obj));
        }
        let removed = remove_cascade(st, &ctx.def.gr, &key, Some(obj), Propagation::Background)?;
        return match removed {
            Some(r) => Ok(Outcome::Stored(r)),
            None => Err(ApiError::not_found(&ctx.def.gr, &key.1)),
        };
    }
    if ctx.dry_run {
        return Ok(Outcome::Transient(obj));
    }
    let stored = st
        .put(&ctx.def.gr, key, obj)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    after_put(st, ctx.def, &stored);
    Ok(Outcome::Stored(stored))
}

/// Reacts to a stored write: a CRD starts (or keeps) serving its resource.
fn after_put(st: &mut State, def: &ResourceDef, stored: &Stored) {
    if def.special == Special::Crd {
        let defined = crd::definition(&stored.value);
        let gr = defined.gr.clone();
        st.registry.insert(defined);
        st.add_table(gr);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// `DeleteOptions` the server honours.
#[derive(Clone, Debug)]
pub struct DeleteOptions {
    pub propagation: Propagation,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

/// Deletes an object. With finalizers it is only marked (deletionTimestamp) and stays until
/// they are removed; a namespace turns Terminating until [`finish_namespace`]. The bool says
/// whether the object is gone.
pub fn delete(
    st: &mut State,
    def: &ResourceDef,
    key: &Key,
    opts: &DeleteOptions,
    now: &str,
) -> Result<(Outcome, bool), ApiError> {
    let Some(old) = st.get(&def.gr, key).cloned() else {
        return Err(ApiError::not_found(&def.gr, &key.1));
    };
    if let Some(uid) = &opts.uid
        && uid != object::uid(&old.value)
    {
        return Err(ApiError::conflict(
            &def.gr,
            &key.1,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                object::uid(&old.value)
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && *rv != old.rv.to_string()
    {
        return Err(ApiError::conflict(
            &def.gr,
            &key.1,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.rv
            ),
        ));
    }
    if def.special == Special::Namespace
        && ["default", "kube-system", "kube-public"].contains(&key.1.as_str())
    {
        return Err(ApiError::forbidden(
            &def.gr,
            &key.1,
            "this namespace may not be deleted",
        ));
    }
    let namespace = def.special == Special::Namespace;
    if namespace || !object::finalizers(&old.value).is_empty() {
        if object::is_deleting(&old.value) {
            return Ok((Outcome::Stored(old), false));
        }
        let mut marked = old.value.clone();
        if namespace {
            object::set_path(&mut marked, ".status.phase", "Terminating".into());
        }
        let meta = object::meta_mut(&mut marked);
        meta.insert("deletionTimestamp".into(), now.into());
        meta.insert("deletionGracePeriodSeconds".into(), 0.into());
        if def.generation {
            let g = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
            meta.insert("generation".into(), (g + 1).into());
        }
        if opts.dry_run {
            return Ok((Outcome::Transient(marked), false));
        }
        let stored = st
            .put(&def.gr, key.clone(), marked)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        return Ok((Outcome::Stored(stored), false));
    }
    if opts.dry_run {
        return Ok((Outcome::Stored(old), true));
    }
    match remove_cascade(st, &def.gr, key, None, opts.propagation)? {
        Some(removed) => Ok((Outcome::Stored(removed), true)),
        None => Err(ApiError::not_found(&def.gr, &key.1)),
    }
}

/// Completes the deletion of a Terminating namespace: its contents go, then the namespace
/// unless finalizers hold it.
pub fn finish_namespace(st: &mut State, name: &str) -> Result<(), ApiError> {
    let gr = GroupResource::new("", "namespaces");
    let key = (String::new(), name.to_string());
    let Some(ns) = st.get(&gr, &key).cloned() else {
        return Ok(());
    };
    if !object::is_deleting(&ns.value) {
        return Ok(());
    }
    for r in st.in_namespace(name) {
        remove_cascade(st, &r.gr, &r.key, None, Propagation::Background)?;
    }
    if object::finalizers(&ns.value).is_empty() {
        remove_cascade(st, &gr, &key, None, Propagation::Background)?;
    }
    Ok(())
}

/// Removes an object (with `last` as its final state, if given) and whatever depends on it:
/// dependents (garbage collection), a namespace's contents, a CRD's resources.
fn remove_cascade(
    st: &mut State,
    gr: &GroupResource,
    key: &Key,
    last: Option<Value>,
    propagation: Propagation,
) -> Result<Option<Arc<Stored>>, ApiError> {
    let removed = st
        .remove(gr, key, last)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let Some(removed) = removed else {
        return Ok(None);
    };
    let special = st.registry.get(gr).map(|d| d.special);
    match special {
        Some(Special::Namespace) => {
            for r in st.in_namespace(&key.1) {
                remove_cascade(st, &r.gr, &r.key, None, Propagation::Background)?;
            }
        }
        Some(Special::Crd) => {
            let defined = crd::definition(&removed.value);
            let keys: Vec<Key> = st
                .objects(&defined.gr)
                .map(|o| object::key(&o.value))
                .collect();
            for k in keys {
                remove_cascade(st, &defined.gr, &k, None, Propagation::Background)?;
            }
            st.drop_table(&defined.gr);
            st.registry.remove(&defined.gr);
        }
        _ => {}
    }
    let uid = object::uid(&removed.value).to_string();
    for dep in st.dependents(&uid) {
        let Some(dependent) = st.get(&dep.gr, &dep.key).cloned() else {
            continue;
        };
        let refs = dependent
            .value
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if propagation == Propagation::Orphan || refs.len() > 1 {
            let mut kept = dependent.value.clone();
            let remaining: Vec<Value> = refs
                .into_iter()
                .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()))
                .collect();
            let meta = object::meta_mut(&mut kept);
            if remaining.is_empty() {
                meta.remove("ownerReferences");
            } else {
                meta.insert("ownerReferences".into(), remaining.into());
            }
            st.put(&dep.gr, dep.key.clone(), kept)
                .map_err(|e| ApiError::internal(e.to_string()))?;
        } else if !object::finalizers(&dependent.value).is_empty() {
            if !object::is_deleting(&dependent.value) {
                let mut marked = dependent.value.clone();
                object::meta_mut(&mut marked)
                    .insert("deletionTimestamp".into(), object::now().into());
                st.put(&dep.gr, dep.key.clone(), marked)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
            }
        } else {
            remove_cascade(st, &dep.gr, &dep.key, None, Propagation::Background)?;
        }
    }
    Ok(Some(removed))
}
