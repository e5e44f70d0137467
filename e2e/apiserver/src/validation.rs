//! Name, label and annotation validation with the real server's messages.

use serde_json::Value;

use crate::error::FieldError;
use crate::registry::NameRule;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// Validates `metadata.name` (or `generateName` when `prefix`) by rule, returning the problem text.
pub fn name(rule: NameRule, name: &str, prefix: bool) -> Result<(), String> {
    // generateName is validated after trimming the trailing dash it usually carries.
    let candidate = if prefix {
        name.trim_end_matches('-')
    } else {
        name
    };
    if prefix && candidate.is_empty() {
        return Ok(());
    }
    match rule {
        NameRule::Subdomain if !is_dns1123_subdomain(candidate) => Err(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*')"
        )),
        NameRule::Label if !is_dns1123_label(candidate) => Err(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL_FMT}')"
        )),
        NameRule::Dns1035 if !is_dns1035_label(candidate) => Err(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string(),
        ),
        NameRule::PathSegment if candidate == "." || candidate == ".." => {
            Err(format!("may not be '{candidate}'"))
        }
        NameRule::PathSegment if candidate.contains('/') || candidate.contains('%') => {
            Err("may not contain '/' or '%'".to_string())
        }
        _ => Ok(()),
    }
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label or annotation key: optional DNS subdomain prefix, `/`, qualified name.
pub fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns1123_subdomain(p)
    {
        return Err(format!(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*')"
        ));
    }
    if !is_qualified_name_part(name) {
        return Err(format!(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '{QUALIFIED_NAME_FMT}')"
        ));
    }
    Ok(())
}

pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_qualified_name_part(value) {
        Ok(())
    } else {
        Err(format!(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(({QUALIFIED_NAME_FMT})?')"
        ))
    }
}

/// Checks the metadata fields the real ObjectMeta validation checks.
pub fn object_meta(rule: NameRule, meta: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match meta.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => {
            if let Err(e) = name(rule, n, false) {
                errs.push(FieldError::invalid("metadata.name", n, e));
            }
        }
        _ => match meta.get("generateName").and_then(Value::as_str) {
            Some(g) if !g.is_empty() => {
                if let Err(e) = name(rule, g, true) {
                    errs.push(FieldError::invalid("metadata.generateName", g, e));
                }
            }
            _ => errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            )),
        },
    }
    match meta.get("labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(labels)) => {
            for (k, v) in labels {
                if let Err(e) = label_key(k) {
                    errs.push(FieldError::invalid("metadata.labels", k.as_str(), e));
                }
                match v.as_str() {
                    Some(s) => {
                        if let Err(e) = label_value(s) {
                            errs.push(FieldError::invalid("metadata.labels", s, e));
                        }
                    }
                    None => errs.push(FieldError::invalid(
                        format!("metadata.labels.{k}"),
                        v.clone(),
                        "must be a string",
                    )),
                }
            }
        }
        Some(other) => errs.push(FieldError::invalid(
            "metadata.labels",
            other.clone(),
            "must be a map",
        )),
    }
    match meta.get("annotations") {
        None | Some(Value::Null) => {}
        Some(Value::Object(annotations)) => {
            let mut total = 0usize;
            for (k, v) in annotations {
                if let Err(e) = label_key(&k.to_lowercase()) {
                    errs.push(FieldError::invalid("metadata.annotations", k.as_str(), e));
                }
                match v.as_str() {
                    Some(s) => total += k.len() + s.len(),
                    None => errs.push(FieldError::invalid(
                        format!("metadata.annotations.{k}"),
                        v.clone(),
                        "must be a string",
                    )),
                }
            }
            if total > 256 * 1024 {
                errs.push(FieldError {
                    field: "metadata.annotations".into(),
                    kind: crate::error::FieldErrorKind::Invalid(Value::String(String::new())),
                    detail: "Too long: must have at most 262144 bytes".into(),
                });
            }
        }
        Some(other) => errs.push(FieldError::invalid(
            "metadata.annotations",
            other.clone(),
            "must be a map",
        )),
    }
    if let Some(f) = meta.get("finalizers") {
        match f.as_array() {
            Some(list) => {
                for (i, item) in list.iter().enumerate() {
                    let ok = item.as_str().is_some_and(|s| label_key(s).is_ok());
                    if !ok {
                        errs.push(FieldError::invalid(
                            format!("metadata.finalizers[{i}]"),
                            item.clone(),
                            "must be a qualified name",
                        ));
                    }
                }
            }
            None if f.is_null() => {}
            None => errs.push(FieldError::invalid(
                "metadata.finalizers",
                f.clone(),
                "must be a list",
            )),
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names() {
        assert!(name(NameRule::Subdomain, "a.b-c", false).is_ok());
        assert!(name(NameRule::Subdomain, "Bad_Name", false).is_err());
        assert!(name(NameRule::Label, "a.b", false).is_err());
        assert!(name(NameRule::Dns1035, "1abc", false).is_err());
        assert!(name(NameRule::PathSegment, "system:controller:x", false).is_ok());
        assert!(name(NameRule::PathSegment, "a/b", false).is_err());
        assert!(name(NameRule::Subdomain, "web-", true).is_ok());
    }

    #[test]
    fn labels_are_checked() {
        let errs = object_meta(
            NameRule::Subdomain,
            &json!({"name": "x", "labels": {"ok": "fine", "bad key": "v", "k": "bad value!"}}),
        );
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(object_meta(NameRule::Subdomain, &json!({})).len() == 1);
        assert!(label_key("app.kubernetes.io/name").is_ok());
        assert!(label_key("Example.com/x").is_err());
    }
}
