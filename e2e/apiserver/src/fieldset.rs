//! Field sets in the `FieldsV1` form used by `metadata.managedFields`.
//!
//! A set is a tree whose path elements are `f:<field>` for map fields and `k:<json>` for
//! elements of keyed lists. A node is a member when the path itself is owned; leaves are
//! always members.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::patch::merge_key;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

fn leaf() -> FieldSet {
    FieldSet {
        member: true,
        children: BTreeMap::new(),
    }
}

/// The `k:` element for a keyed-list item.
fn element_key(key: &str, item: &Value) -> String {
    let mut m = Map::new();
    m.insert(
        key.to_string(),
        item.get(key).cloned().unwrap_or(Value::Null),
    );
    format!("k:{}", Value::Object(m))
}

fn list_key<'a>(
    field: &str,
    lists: impl IntoIterator<Item = &'a Vec<Value>>,
) -> Option<&'static str> {
    let items: Vec<&Value> = lists.into_iter().flatten().collect();
    merge_key(field, &items)
}

impl FieldSet {
    pub fn is_empty(&self) -> bool {
        !self.member && self.children.is_empty()
    }

    /// The set of fields an object (or apply configuration) specifies.
    pub fn from_object(v: &Value) -> Self {
        match v {
            Value::Object(m) => Self::of_map(m),
            _ => Self::default(),
        }
    }

    fn of_map(m: &Map<String, Value>) -> Self {
        let mut fs = Self::default();
        for (k, v) in m {
            fs.children.insert(format!("f:{k}"), Self::of_value(k, v));
        }
        fs
    }

    fn of_value(field: &str, v: &Value) -> Self {
        match v {
            Value::Object(m) if !m.is_empty() => Self::of_map(m),
            Value::Array(items) => match list_key(field, [items]) {
                Some(key) => {
                    let mut fs = Self::default();
                    for item in items {
                        let mut el = item.as_object().map(Self::of_map).unwrap_or_default();
                        el.member = true;
                        fs.children.insert(element_key(key, item), el);
                    }
                    fs
                }
                None => leaf(),
            },
            _ => leaf(),
        }
    }

    pub fn from_fields_v1(v: &Value) -> Self {
        let mut fs = Self::default();
        if let Value::Object(m) = v {
            if m.is_empty() {
                fs.member = true;
            }
            for (k, child) in m {
                if k == "." {
                    fs.member = true;
                } else {
                    fs.children.insert(k.clone(), Self::from_fields_v1(child));
                }
            }
        }
        fs
    }

    pub fn to_fields_v1(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, child) in &self.children {
            m.insert(k.clone(), child.to_fields_v1());
        }
        Value::Object(m)
    }

    pub fn union(&mut self, other: &Self) {
        self.member |= other.member;
        for (k, child) in &other.children {
            self.children.entry(k.clone()).or_default().union(child);
        }
    }

    /// Removes from `self` every member of `other`.
    pub fn subtract(&mut self, other: &Self) {
        if other.member {
            self.member = false;
        }
        for (k, o) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.subtract(o);
                if mine.is_empty() {
                    self.children.remove(k);
                }
            }
        }
    }

    /// Member paths, parents before children.
    pub fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member && !prefix.is_empty() {
            out.push(prefix.clone());
        }
        for (k, child) in &self.children {
            prefix.push(k.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    pub fn contains(&self, path: &[String]) -> bool {
        match path.split_first() {
            None => self.member,
            Some((head, rest)) => self.children.get(head).is_some_and(|c| c.contains(rest)),
        }
    }

    /// Paths that changed from `old` to `new` (added or modified) and paths removed.
    pub fn diff(old: &Value, new: &Value) -> (Self, Self) {
        let empty = Map::new();
        let old_map = old.as_object().unwrap_or(&empty);
        let new_map = new.as_object().unwrap_or(&empty);
        let mut changed = Self::default();
        let mut removed = Self::default();
        diff_maps(old_map, new_map, &mut changed, &mut removed);
        (changed, removed)
    }
}

fn diff_maps(
    old: &Map<String, Value>,
    new: &Map<String, Value>,
    changed: &mut FieldSet,
    removed: &mut FieldSet,
) {
    for (k, nv) in new {
        let path = format!("f:{k}");
        let Some(ov) = old.get(k) else {
            changed.children.insert(path, FieldSet::of_value(k, nv));
            continue;
        };
        if ov == nv {
            continue;
        }
        let mut c = FieldSet::default();
        let mut r = FieldSet::default();
        match (ov, nv) {
            (Value::Object(om), Value::Object(nm)) if !nm.is_empty() && !om.is_empty() => {
                diff_maps(om, nm, &mut c, &mut r);
            }
            (Value::Array(oa), Value::Array(na)) if list_key(k, [oa, na]).is_some() => {
                let key = list_key(k, [oa, na]).unwrap_or("name");
                for item in na {
                    let id = item.get(key);
                    let ek = element_key(key, item);
                    match oa.iter().find(|o| o.get(key) == id) {
                        Some(prev) if prev == item => {}
                        Some(prev) => {
                            let mut ec = FieldSet::default();
                            let mut er = FieldSet::default();
                            if let (Some(pm), Some(im)) = (prev.as_object(), item.as_object()) {
                                diff_maps(pm, im, &mut ec, &mut er);
                            }
                            if !ec.is_empty() {
                                c.children.insert(ek.clone(), ec);
                            }
                            if !er.is_empty() {
                                r.children.insert(ek, er);
                            }
                        }
                        None => {
                            let mut el = item.as_object().map(FieldSet::of_map).unwrap_or_default();
                            el.member = true;
                            c.children.insert(ek, el);
                        }
                    }
                }
                for prev in oa {
                    let id = prev.get(key);
                    if !na.iter().any(|n| n.get(key) == id) {
                        let mut el = prev.as_object().map(FieldSet::of_map).unwrap_or_default();
                        el.member = true;
                        r.children.insert(element_key(key, prev), el);
                    }
                }
            }
            _ => {
                // A change of shape: the old subtree is gone and the new value is owned whole.
                r = FieldSet::of_value(k, ov);
                r.member = false;
                c = FieldSet::of_value(k, nv);
                c.member = true;
            }
        }
        if !c.is_empty() {
            changed.children.insert(path.clone(), c);
        }
        if !r.is_empty() {
            removed.children.insert(path, r);
        }
    }
    for (k, ov) in old {
        if !new.contains_key(k) {
            let mut gone = FieldSet::of_value(k, ov);
            gone.member = true;
            removed.children.insert(format!("f:{k}"), gone);
        }
    }
}

fn parse_element(step: &str) -> Option<Map<String, Value>> {
    let json = step.strip_prefix("k:")?;
    serde_json::from_str::<Value>(json)
        .ok()?
        .as_object()
        .cloned()
}

fn element_matches(item: &Value, key: &Map<String, Value>) -> bool {
    key.iter().all(|(k, v)| item.get(k) == Some(v))
}

/// The value at a field path, if present.
pub fn get<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for step in path {
        cur = if let Some(field) = step.strip_prefix("f:") {
            cur.get(field)?
        } else {
            let key = parse_element(step)?;
            cur.as_array()?.iter().find(|i| element_matches(i, &key))?
        };
    }
    Some(cur)
}

/// Removes the value at a field path, then any map or list it leaves empty unless `keep`
/// owns that parent.
pub fn remove(v: &mut Value, path: &[String], keep: &FieldSet) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let Some(parent) = get_mut(v, parents) else {
        return;
    };
    let removed = if let Some(field) = last.strip_prefix("f:") {
        parent
            .as_object_mut()
            .and_then(|m| m.remove(field))
            .is_some()
    } else if let (Some(key), Some(list)) = (parse_element(last), parent.as_array_mut()) {
        let before = list.len();
        list.retain(|i| !element_matches(i, &key));
        list.len() != before
    } else {
        false
    };
    let now_empty = match parent {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if removed && now_empty && !parents.is_empty() && !keep.contains(parents) {
        remove(v, parents, keep);
    }
}

fn get_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for step in path {
        cur = if let Some(field) = step.strip_prefix("f:") {
            cur.get_mut(field)?
        } else {
            let key = parse_element(step)?;
            cur.as_array_mut()?
                .iter_mut()
                .find(|i| element_matches(i, &key))?
        };
    }
    Some(cur)
}

/// Renders a path as the real server does in apply conflicts: `.spec.containers[name="app"].image`.
pub fn display(path: &[String]) -> String {
    let mut out = String::new();
    for step in path {
        if let Some(field) = step.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = parse_element(step) {
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else {
            out.push_str(&format!("[{step}]"));
        }
    }
    out
}

/// Whether the path ends in a list element (ownership of the element's existence only).
pub fn is_element(path: &[String]) -> bool {
    path.last().is_some_and(|s| s.starts_with("k:"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn p(parts: &[&str]) -> Vec<String> {
        parts.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn round_trips_fields_v1() {
        let obj = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}], "args": ["a"]}});
        let fs = FieldSet::from_object(&obj);
        let v1 = fs.to_fields_v1();
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:args": {}, "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}}})
        );
        assert_eq!(FieldSet::from_fields_v1(&v1), fs);
        assert!(!fs.contains(&p(&["f:spec", "k:{\"name\":\"c\"}"])));
        assert!(fs.contains(&p(&[
            "f:spec",
            "f:containers",
            "k:{\"name\":\"c\"}",
            "f:image"
        ])));
    }

    #[test]
    fn diff_and_subtract() {
        let old = json!({"data": {"a": "1", "b": "2"}});
        let new = json!({"data": {"a": "1", "b": "3", "c": "4"}});
        let (changed, removed) = FieldSet::diff(&old, &new);
        assert_eq!(
            changed.members(),
            vec![p(&["f:data", "f:b"]), p(&["f:data", "f:c"])]
        );
        assert!(removed.is_empty());
        let mut all = FieldSet::from_object(&old);
        all.subtract(&changed);
        assert_eq!(all.members(), vec![p(&["f:data", "f:a"])]);
        let (_, removed) = FieldSet::diff(&new, &old);
        assert_eq!(removed.members(), vec![p(&["f:data", "f:c"])]);
    }

    #[test]
    fn get_remove_display() {
        let mut v = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b"}]}, "data": {"k": "v"}});
        let path = p(&["f:spec", "f:containers", "k:{\"name\":\"a\"}", "f:image"]);
        assert_eq!(get(&v, &path), Some(&json!("x")));
        assert_eq!(display(&path), ".spec.containers[name=\"a\"].image");
        let keep = FieldSet::default();
        remove(&mut v, &path[..3], &keep);
        assert_eq!(v["spec"]["containers"], json!([{"name": "b"}]));
        remove(&mut v, &p(&["f:data", "f:k"]), &keep);
        assert!(v.get("data").is_none());
        let mut w = json!({"data": {"k": "v"}});
        remove(
            &mut w,
            &p(&["f:data", "f:k"]),
            &FieldSet::from_object(&json!({"data": {}})),
        );
        assert_eq!(w, json!({"data": {}}));
    }
}
