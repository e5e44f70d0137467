//! The review resources, answered from the server's own authenticator and RBAC without storing
//! anything: TokenReview (whose is this bearer token), SubjectAccessReview (may this user do
//! that) and SelfSubjectAccessReview (may I). Delegated authentication and authorization, as
//! kube-rbac-proxy and controller-runtime's secure metrics endpoints use them, rest on the first
//! two.

use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::auth::Identity;
use crate::error::{ApiError, FieldError};
use crate::object;
use crate::rbac::{self, Attributes, PathAttributes};
use crate::registry::Special;
use crate::shared::Shared;

/// The paths the default bootstrap policy (`system:discovery`, `system:public-info-viewer`)
/// opens to every authenticated user; RBAC decides every other non-resource path.
const DISCOVERY_PATHS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/version",
    "/version/",
    "/openapi",
    "/openapi/*",
];

/// The audience of tokens this server issues, reported when a TokenReview names none.
const DEFAULT_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// Answers a review created by `requester`: the review with its `status` filled in.
pub(crate) fn answer(
    shared: &Shared,
    requester: &Identity,
    special: Special,
    mut review: Value,
) -> Result<Value, ApiError> {
    let status = match special {
        Special::TokenReview => token_review(shared, &review)?,
        Special::SubjectAccessReview | Special::SelfSubjectAccessReview => {
            let spec = review.get("spec").cloned().unwrap_or(Value::Null);
            let mut errors = attribute_errors(&spec);
            let (user, groups, kind) = if special == Special::SubjectAccessReview {
                let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
                let groups: Vec<String> = spec
                    .get("groups")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect();
                if user.is_empty() && groups.is_empty() {
                    errors.push(FieldError::invalid(
                        "spec.user",
                        user,
                        "at least one of user or group must be specified",
                    ));
                }
                (user.to_string(), groups, "SubjectAccessReview")
            } else {
                (
                    requester.user.clone(),
                    requester.effective_groups(),
                    "SelfSubjectAccessReview",
                )
            };
            if !errors.is_empty() {
                return Err(ApiError::invalid("authorization.k8s.io", kind, "", errors));
            }
            access_status(shared, &user, &groups, &spec)
        }
        _ => return Err(ApiError::internal("not a review resource")),
    };
    let root = object::ensure_object(&mut review);
    root.insert("status".into(), status);
    object::meta_mut(&mut review).insert("creationTimestamp".into(), Value::Null);
    Ok(review)
}

fn token_review(shared: &Shared, review: &Value) -> Result<Value, ApiError> {
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or("");
    if token.is_empty() {
        // The real server's words (pkg/registry/authentication/tokenreview).
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let audiences = match review.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!([DEFAULT_AUDIENCE]),
    };
    Ok(match shared.auth.authenticate(token) {
        Some(identity) => json!({
            "authenticated": true,
            "user": {
                "username": identity.user,
                "uid": format!("uid-{}", identity.name),
                "groups": identity.effective_groups(),
            },
            "audiences": audiences,
        }),
        // `authenticated: false` is omitted, as Go's omitempty drops it from the real answer.
        None => json!({
            "user": {},
            "error": "[invalid bearer token, token lookup failed]",
        }),
    })
}

/// Exactly one of `resourceAttributes` and `nonResourceAttributes`, as the real validation
/// requires.
fn attribute_errors(spec: &Value) -> Vec<FieldError> {
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let path = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    match (resource, path) {
        (Some(_), Some(p)) => vec![FieldError::invalid(
            "spec.nonResourceAttributes",
            p.clone(),
            "cannot be specified in combination with resourceAttributes",
        )],
        (None, None) => vec![FieldError::invalid(
            "spec.resourceAttributes",
            Value::Null,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )],
        _ => Vec::new(),
    }
}

fn access_status(shared: &Shared, user: &str, groups: &[String], spec: &Value) -> Value {
    let field = |section: &str, f: &str| {
        spec.pointer(&format!("/{section}/{f}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let open = !shared.enforce_rbac.load(Ordering::Relaxed)
        || groups.iter().any(|g| g == "system:masters");
    let allowed = open
        || if spec
            .get("nonResourceAttributes")
            .is_some_and(|v| !v.is_null())
        {
            let (path, verb) = (
                field("nonResourceAttributes", "path"),
                field("nonResourceAttributes", "verb"),
            );
            let authenticated = groups.iter().any(|g| g == "system:authenticated");
            (authenticated && verb == "get" && discovery_path(&path))
                || rbac::allows_path(
                    &shared.store.read(),
                    &PathAttributes {
                        user,
                        groups,
                        verb: &verb,
                        path: &path,
                    },
                )
        } else {
            let f = |name: &str| field("resourceAttributes", name);
            rbac::allows(
                &shared.store.read(),
                &Attributes {
                    user,
                    groups,
                    verb: &f("verb"),
                    group: &f("group"),
                    resource: &f("resource"),
                    subresource: &f("subresource"),
                    namespace: &f("namespace"),
                    name: &f("name"),
                },
            )
        };
    json!({ "allowed": allowed })
}

fn discovery_path(path: &str) -> bool {
    DISCOVERY_PATHS.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => *p == path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_paths_are_those_of_the_bootstrap_policy() {
        assert!(discovery_path("/version"));
        assert!(discovery_path("/apis/apps/v1"));
        assert!(!discovery_path("/metrics"));
        assert!(!discovery_path("/debug/pprof"));
    }

    #[test]
    fn exactly_one_kind_of_attributes() {
        assert!(attribute_errors(&json!({"resourceAttributes": {"verb": "get"}})).is_empty());
        assert!(attribute_errors(&json!({"nonResourceAttributes": {"path": "/x"}})).is_empty());
        let both = attribute_errors(
            &json!({"resourceAttributes": {}, "nonResourceAttributes": {"path": "/x"}}),
        );
        assert_eq!(both[0].field, "spec.nonResourceAttributes");
        assert_eq!(
            attribute_errors(&json!({}))[0].field,
            "spec.resourceAttributes"
        );
    }
}
