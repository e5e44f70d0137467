//! Decoding of the Kubernetes protobuf envelope for the few kinds kubectl's typed commands
//! send as protobuf (`kubectl create namespace|configmap|secret|serviceaccount|role|...`,
//! `kubectl auth can-i`). Requests only: answers are always JSON, which client-go accepts.

use base64::Engine as _;
use serde_json::{Map, Value};

const MAGIC: &[u8] = b"k8s\x00";

#[derive(Clone, Copy)]
enum Kind {
    Str,
    Bytes,
    Bool,
    Int,
    Time,
    MapStr,
    MapBytes,
    Msg(&'static [Field]),
}

#[derive(Clone, Copy)]
struct Field {
    num: u64,
    name: &'static str,
    kind: Kind,
    repeated: bool,
}

const fn f(num: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        num,
        name,
        kind,
        repeated: false,
    }
}

const fn rep(num: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        num,
        name,
        kind,
        repeated: true,
    }
}

const TYPE_META: &[Field] = &[f(1, "apiVersion", Kind::Str), f(2, "kind", Kind::Str)];
const UNKNOWN: &[Field] = &[
    f(1, "typeMeta", Kind::Msg(TYPE_META)),
    f(2, "raw", Kind::Bytes),
    f(3, "contentEncoding", Kind::Str),
    f(4, "contentType", Kind::Str),
];
const OWNER_REFERENCE: &[Field] = &[
    f(1, "kind", Kind::Str),
    f(3, "name", Kind::Str),
    f(4, "uid", Kind::Str),
    f(5, "apiVersion", Kind::Str),
    f(6, "controller", Kind::Bool),
    f(7, "blockOwnerDeletion", Kind::Bool),
];
const OBJECT_META: &[Field] = &[
    f(1, "name", Kind::Str),
    f(2, "generateName", Kind::Str),
    f(3, "namespace", Kind::Str),
    f(5, "uid", Kind::Str),
    f(6, "resourceVersion", Kind::Str),
    f(7, "generation", Kind::Int),
    f(8, "creationTimestamp", Kind::Time),
    f(11, "labels", Kind::MapStr),
    f(12, "annotations", Kind::MapStr),
    rep(13, "ownerReferences", Kind::Msg(OWNER_REFERENCE)),
    rep(14, "finalizers", Kind::Str),
];
const LOCAL_REF: &[Field] = &[f(1, "name", Kind::Str)];
const OBJECT_REF: &[Field] = &[
    f(1, "kind", Kind::Str),
    f(2, "namespace", Kind::Str),
    f(3, "name", Kind::Str),
    f(4, "uid", Kind::Str),
    f(5, "apiVersion", Kind::Str),
    f(6, "resourceVersion", Kind::Str),
    f(7, "fieldPath", Kind::Str),
];
const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "data", Kind::MapStr),
    f(3, "binaryData", Kind::MapBytes),
    f(4, "immutable", Kind::Bool),
];
const SECRET: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "data", Kind::MapBytes),
    f(3, "type", Kind::Str),
    f(4, "stringData", Kind::MapStr),
    f(5, "immutable", Kind::Bool),
];
const NAMESPACE_SPEC: &[Field] = &[rep(1, "finalizers", Kind::Str)];
const NAMESPACE: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "spec", Kind::Msg(NAMESPACE_SPEC)),
];
const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    rep(2, "secrets", Kind::Msg(OBJECT_REF)),
    rep(3, "imagePullSecrets", Kind::Msg(LOCAL_REF)),
    f(4, "automountServiceAccountToken", Kind::Bool),
];
const POLICY_RULE: &[Field] = &[
    rep(1, "verbs", Kind::Str),
    rep(2, "apiGroups", Kind::Str),
    rep(3, "resources", Kind::Str),
    rep(4, "resourceNames", Kind::Str),
    rep(5, "nonResourceURLs", Kind::Str),
];
const ROLE: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    rep(2, "rules", Kind::Msg(POLICY_RULE)),
];
const SUBJECT: &[Field] = &[
    f(1, "kind", Kind::Str),
    f(2, "apiGroup", Kind::Str),
    f(3, "name", Kind::Str),
    f(4, "namespace", Kind::Str),
];
const ROLE_REF: &[Field] = &[
    f(1, "apiGroup", Kind::Str),
    f(2, "kind", Kind::Str),
    f(3, "name", Kind::Str),
];
const BINDING: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    rep(2, "subjects", Kind::Msg(SUBJECT)),
    f(3, "roleRef", Kind::Msg(ROLE_REF)),
];
const RESOURCE_ATTRIBUTES: &[Field] = &[
    f(1, "namespace", Kind::Str),
    f(2, "verb", Kind::Str),
    f(3, "group", Kind::Str),
    f(4, "version", Kind::Str),
    f(5, "resource", Kind::Str),
    f(6, "subresource", Kind::Str),
    f(7, "name", Kind::Str),
];
const NON_RESOURCE_ATTRIBUTES: &[Field] = &[f(1, "path", Kind::Str), f(2, "verb", Kind::Str)];
const ACCESS_REVIEW_SPEC: &[Field] = &[
    f(1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRIBUTES)),
    f(
        2,
        "nonResourceAttributes",
        Kind::Msg(NON_RESOURCE_ATTRIBUTES),
    ),
];
const ACCESS_REVIEW: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "spec", Kind::Msg(ACCESS_REVIEW_SPEC)),
];

/// `(apiVersion, kind)` pairs this decoder understands.
const KINDS: &[(&str, &str, &[Field])] = &[
    ("v1", "Namespace", NAMESPACE),
    ("v1", "ConfigMap", CONFIG_MAP),
    ("v1", "Secret", SECRET),
    ("v1", "ServiceAccount", SERVICE_ACCOUNT),
    ("rbac.authorization.k8s.io/v1", "Role", ROLE),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", ROLE),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", BINDING),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        BINDING,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        ACCESS_REVIEW,
    ),
];

/// A short list of what can be sent as protobuf, for error messages.
pub fn supported_kinds() -> String {
    KINDS
        .iter()
        .map(|(_, k, _)| *k)
        .collect::<Vec<_>>()
        .join(", ")
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
        let end = self.pos.checked_add(len).ok_or("length overflow")?;
        let out = self.buf.get(self.pos..end).ok_or("truncated field")?;
        self.pos = end;
        Ok(out)
    }

    fn skip(&mut self, wire: u64) -> Result<(), String> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.advance(8),
            2 => self.bytes().map(|_| ()),
            5 => self.advance(4),
            other => Err(format!("unsupported wire type {other}")),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), String> {
        if self.pos + n > self.buf.len() {
            return Err("truncated field".into());
        }
        self.pos += n;
        Ok(())
    }
}

fn string(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
}

fn map_entry(bytes: &[u8], binary: bool) -> Result<(String, Value), String> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    while !r.done() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            (1, 2) => key = string(r.bytes()?)?,
            (2, 2) => {
                let raw = r.bytes()?;
                value = if binary {
                    base64::engine::general_purpose::STANDARD.encode(raw).into()
                } else {
                    string(raw)?.into()
                };
            }
            (_, wire) => r.skip(wire)?,
        }
    }
    Ok((key, value))
}

fn time(bytes: &[u8]) -> Result<Option<Value>, String> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let mut seconds: i64 = 0;
    while !r.done() {
        let tag = r.varint()?;
        match (tag >> 3, tag & 7) {
            // Two's complement, as protobuf encodes negative int64.
            (1, 0) => seconds = r.varint()?.cast_signed(),
            (_, wire) => r.skip(wire)?,
        }
    }
    if seconds <= 0 {
        return Ok(None);
    }
    let ts = jiff::Timestamp::from_second(seconds).map_err(|e| e.to_string())?;
    Ok(Some(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string().into()))
}

/// Decodes one message; zero values are omitted, as Go's JSON `omitempty` would.
fn message(bytes: &[u8], schema: &[Field]) -> Result<Map<String, Value>, String> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let mut out = Map::new();
    while !r.done() {
        let tag = r.varint()?;
        let (num, wire) = (tag >> 3, tag & 7);
        let Some(field) = schema.iter().find(|f| f.num == num) else {
            r.skip(wire)?;
            continue;
        };
        let value = match (field.kind, wire) {
            // Empty strings matter in lists (the core group `""` in apiGroups).
            (Kind::Str, 2) => {
                Some(string(r.bytes()?)?.into()).filter(|v: &Value| field.repeated || v != "")
            }
            (Kind::Bytes, 2) => Some(
                base64::engine::general_purpose::STANDARD
                    .encode(r.bytes()?)
                    .into(),
            ),
            (Kind::Bool, 0) => (r.varint()? != 0).then_some(Value::Bool(true)),
            (Kind::Int, 0) => match r.varint()?.cast_signed() {
                0 => None,
                n => Some(Value::from(n)),
            },
            (Kind::Time, 2) => time(r.bytes()?)?,
            (Kind::MapStr | Kind::MapBytes, 2) => {
                let (k, v) = map_entry(r.bytes()?, matches!(field.kind, Kind::MapBytes))?;
                let entry = out
                    .entry(field.name)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = entry {
                    m.insert(k, v);
                }
                continue;
            }
            (Kind::Msg(inner), 2) => Some(Value::Object(message(r.bytes()?, inner)?)),
            (_, wire) => {
                r.skip(wire)?;
                continue;
            }
        };
        if field.repeated {
            let entry = out
                .entry(field.name)
                .or_insert_with(|| Value::Array(Vec::new()));
            if let (Value::Array(items), Some(v)) = (entry, value) {
                items.push(v);
            }
        } else if let Some(v) = value {
            out.insert(field.name.to_string(), v);
        }
    }
    Ok(out)
}

pub fn is_protobuf(content_type: &str) -> bool {
    content_type == "application/vnd.kubernetes.protobuf"
}

/// Decodes a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let payload = body
        .strip_prefix(MAGIC)
        .ok_or("missing the k8s protobuf envelope")?;
    let unknown = message(payload, UNKNOWN)?;
    let api_version = unknown
        .get("typeMeta")
        .and_then(|t| t.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = unknown
        .get("typeMeta")
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some((_, _, schema)) = KINDS
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
    else {
        return Err(format!(
            "protobuf bodies are decoded only for {}; send {api_version} {kind} as JSON",
            supported_kinds()
        ));
    };
    let raw = unknown
        .get("raw")
        .and_then(Value::as_str)
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b))
        .transpose()
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let mut obj = message(&raw, schema)?;
    obj.insert("apiVersion".into(), api_version.into());
    obj.insert("kind".into(), kind.into());
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn field(num: u64, payload: &[u8], out: &mut Vec<u8>) {
        varint(num << 3 | 2, out);
        varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let mut meta = Vec::new();
        field(1, b"cm", &mut meta);
        field(2, b"", &mut meta);
        let mut entry = Vec::new();
        field(1, b"k", &mut entry);
        field(2, b"v", &mut entry);
        let mut cm = Vec::new();
        field(1, &meta, &mut cm);
        field(2, &entry, &mut cm);
        varint(4 << 3, &mut cm);
        varint(1, &mut cm);
        let mut type_meta = Vec::new();
        field(1, b"v1", &mut type_meta);
        field(2, b"ConfigMap", &mut type_meta);
        let mut body = MAGIC.to_vec();
        field(1, &type_meta, &mut body);
        field(2, &cm, &mut body);
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"k": "v"}, "immutable": true})
        );
        assert!(decode(b"{}").is_err());
    }
}
