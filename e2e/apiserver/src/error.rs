//! Errors as `metav1.Status`, with the codes, reasons and message formats of the real server.

use serde_json::{Map, Value, json};

use crate::registry::GroupResource;

/// One field-level problem inside an `Invalid` (422) answer.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub detail: String,
}

/// The field error types of `k8s.io/apimachinery/pkg/util/validation/field`.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldErrorKind {
    Invalid(Value),
    Required,
    Forbidden,
    NotSupported(Value),
    Duplicate(Value),
    /// A string longer than the schema's `maxLength` (in bytes).
    TooLong(usize),
    /// A list or map with more entries than `maxItems` / `maxProperties`: (actual, limit).
    TooMany(usize, usize),
}

impl FieldError {
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Invalid(value.into()),
            detail: detail.into(),
        }
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
        }
    }

    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::NotSupported(value.into()),
            detail: detail.into(),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::Duplicate(value.into()),
            detail: String::new(),
        }
    }

    pub fn too_long(field: impl Into<String>, limit: usize) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::TooLong(limit),
            detail: String::new(),
        }
    }

    pub fn too_many(field: impl Into<String>, actual: usize, limit: usize) -> Self {
        Self {
            field: field.into(),
            kind: FieldErrorKind::TooMany(actual, limit),
            detail: String::new(),
        }
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::NotSupported(_) => "FieldValueNotSupported",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::TooLong(_) => "FieldValueTooLong",
            FieldErrorKind::TooMany(..) => "FieldValueTooMany",
        }
    }

    /// The message without the field prefix, as in a Status cause.
    fn body(&self) -> String {
        let with_detail = |head: String| {
            if self.detail.is_empty() {
                head
            } else {
                format!("{head}: {}", self.detail)
            }
        };
        match &self.kind {
            FieldErrorKind::Invalid(v) => {
                with_detail(format!("Invalid value: {}", render_value(v)))
            }
            FieldErrorKind::Required => with_detail("Required value".to_string()),
            FieldErrorKind::Forbidden => with_detail("Forbidden".to_string()),
            FieldErrorKind::NotSupported(v) => {
                with_detail(format!("Unsupported value: {}", render_value(v)))
            }
            FieldErrorKind::Duplicate(v) => {
                with_detail(format!("Duplicate value: {}", render_value(v)))
            }
            FieldErrorKind::TooLong(limit) => {
                with_detail(format!("Too long: may not be more than {limit} bytes"))
            }
            FieldErrorKind::TooMany(actual, limit) => with_detail(format!(
                "Too many: {actual}: must have at most {limit} items"
            )),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// An error answered to a client as a `metav1.Status`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Map<String, Value>>,
}

fn details(gr: &GroupResource, name: &str) -> Map<String, Value> {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), name.into());
    }
    if !gr.group.is_empty() {
        d.insert("group".into(), gr.group.clone().into());
    }
    d.insert("kind".into(), gr.resource.clone().into());
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Map<String, Value>) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", gr.qualified()),
        )
        .with_details(details(gr, name))
    }

    /// A path that names no resource this server serves.
    pub fn unknown_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Map::new())
    }

    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", gr.qualified()),
        )
        .with_details(details(gr, name))
    }

    /// The optimistic-concurrency conflict of a stale `resourceVersion`.
    pub fn stale(gr: &GroupResource, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict(gr: &GroupResource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                gr.qualified()
            ),
        )
        .with_details(details(gr, name))
    }

    /// A server-side apply conflict; `conflicts` holds (manager, field path) pairs.
    pub fn apply_conflict(conflicts: &[(String, String)]) -> Self {
        let message = if let [(manager, field)] = conflicts {
            format!("Apply failed with 1 conflict: conflict with {manager:?}: {field}")
        } else {
            let mut m = format!("Apply failed with {} conflicts:", conflicts.len());
            let mut last_manager: Option<&str> = None;
            for (manager, field) in conflicts {
                if last_manager != Some(manager.as_str()) {
                    m.push_str(&format!(" conflicts with {manager:?}:"));
                    last_manager = Some(manager);
                }
                m.push_str(&format!("\n- {field}"));
            }
            m
        };
        let causes = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager:?}"), "field": field})
            })
            .collect::<Vec<_>>();
        let mut d = Map::new();
        d.insert("causes".into(), causes.into());
        Self::new(409, "Conflict", message).with_details(d)
    }

    /// 422 for an object that failed validation; `kind` is the object's kind (not resource).
    pub fn invalid(group: &str, kind: &str, name: &str, errors: Vec<FieldError>) -> Self {
        let list = if let [only] = errors.as_slice() {
            only.to_string()
        } else {
            format!(
                "[{}]",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let causes = errors
            .iter()
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect::<Vec<_>>();
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), name.into());
        }
        if !group.is_empty() {
            d.insert("group".into(), group.into());
        }
        d.insert("kind".into(), kind.into());
        d.insert("causes".into(), causes.into());
        Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} {name:?} is invalid: {list}"),
        )
        .with_details(d)
    }

    /// 422 without field errors, as the real server answers for a failed JSON patch.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn forbidden(gr: &GroupResource, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{} is forbidden: {why}", gr.qualified())
        } else {
            format!("{} {name:?} is forbidden: {why}", gr.qualified())
        };
        Self::new(403, "Forbidden", message).with_details(details(gr, name))
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(Map::new())
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/apply-patch+yaml, application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json (got {content_type:?})"
            ),
        )
    }

    /// A PATCH whose content type the resource does not take; kube-apiserver lists the patch
    /// types it does take (no strategic merge for custom resources), and not the one sent.
    pub fn unsupported_patch_type(custom: bool) -> Self {
        let accepted = if custom {
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        } else {
            "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        };
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    }

    pub fn unsupported_protobuf(reason: String) -> Self {
        Self::new(415, "UnsupportedMediaType", reason)
    }

    pub fn request_too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Some(obj)) = (&self.details, status.as_object_mut()) {
            obj.insert("details".into(), Value::Object(d.clone()));
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_names_the_qualified_resource() {
        let e = ApiError::not_found(&GroupResource::new("apps", "statefulsets"), "web");
        assert_eq!(e.code, 404);
        assert_eq!(e.message, "statefulsets.apps \"web\" not found");
        let s = e.to_status();
        assert_eq!(s["details"]["group"], "apps");
        assert_eq!(s["details"]["kind"], "statefulsets");
    }

    #[test]
    fn invalid_lists_every_field_error() {
        let e = ApiError::invalid(
            "",
            "ConfigMap",
            "x",
            vec![
                FieldError::required("metadata.name", "name or generateName is required"),
                FieldError::invalid("metadata.labels", "a b", "bad"),
            ],
        );
        assert_eq!(
            e.message,
            "ConfigMap \"x\" is invalid: [metadata.name: Required value: name or generateName is required, metadata.labels: Invalid value: \"a b\": bad]"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][1]["reason"],
            "FieldValueInvalid"
        );
    }
}
