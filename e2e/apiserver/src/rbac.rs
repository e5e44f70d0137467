//! RBAC authorization from the Role/ClusterRole/RoleBinding/ClusterRoleBinding objects in the
//! store, evaluated per request like the real RBAC authorizer.

use serde_json::Value;

use crate::registry::GroupResource;
use crate::store::State;

/// What a request asks to do.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Attributes<'_> {
    /// The reason text of a denial, in the real server's wording.
    pub fn denial(&self) -> String {
        let resource = if self.subresource.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        if self.namespace.is_empty() {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                self.user, self.verb, self.group
            )
        } else {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                self.user, self.verb, self.group, self.namespace
            )
        }
    }
}

fn strings<'a>(rule: &'a Value, field: &str) -> impl Iterator<Item = &'a str> {
    rule.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    let verb_ok = strings(rule, "verbs").any(|v| v == "*" || v == a.verb);
    let group_ok = strings(rule, "apiGroups").any(|g| g == "*" || g == a.group);
    let combined = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource_ok = strings(rule, "resources").any(|r| {
        r == "*"
            || r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource))
    });
    let mut names = strings(rule, "resourceNames").peekable();
    let names_ok = names.peek().is_none() || (!a.name.is_empty() && names.any(|n| n == a.name));
    verb_ok && group_ok && resource_ok && names_ok
}

/// A request for a non-resource URL (`/metrics`, `/healthz`, discovery), as a
/// SubjectAccessReview's `nonResourceAttributes` asks.
#[derive(Clone, Copy, Debug)]
pub struct PathAttributes<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    pub path: &'a str,
}

fn subject_matches(
    subject: &Value,
    binding_namespace: &str,
    user: &str,
    groups: &[String],
) -> bool {
    let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
    match subject.get("kind").and_then(Value::as_str) {
        Some("User") => name == user,
        Some("Group") => groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// `nonResourceURLs` as the real authorizer matches them: `*`, the exact path, or a prefix
/// ending in `*`.
fn path_rule_allows(rule: &Value, a: &PathAttributes<'_>) -> bool {
    strings(rule, "verbs").any(|v| v == "*" || v == a.verb)
        && strings(rule, "nonResourceURLs").any(|u| match u.strip_suffix('*') {
            Some(prefix) => a.path.starts_with(prefix),
            None => u == a.path,
        })
}

fn bound(binding: &Value, user: &str, groups: &[String]) -> bool {
    let ns = crate::object::namespace(binding);
    binding
        .get("subjects")
        .and_then(Value::as_array)
        .is_some_and(|subjects| {
            subjects
                .iter()
                .any(|s| subject_matches(s, ns, user, groups))
        })
}

fn role_rules<'a>(state: &'a State, binding: &Value, binding_namespace: &str) -> Option<&'a Value> {
    let role_ref = binding.get("roleRef")?;
    let name = role_ref.get("name")?.as_str()?;
    let (resource, ns) = match role_ref.get("kind")?.as_str()? {
        "ClusterRole" => ("clusterroles", ""),
        "Role" => ("roles", binding_namespace),
        _ => return None,
    };
    let role = state.get(
        &GroupResource::new("rbac.authorization.k8s.io", resource),
        &(ns.to_string(), name.to_string()),
    )?;
    role.value.get("rules")
}

fn binding_allows(state: &State, binding: &Value, a: &Attributes<'_>) -> bool {
    let ns = crate::object::namespace(binding);
    bound(binding, a.user, a.groups)
        && role_rules(state, binding, ns)
            .and_then(Value::as_array)
            .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, a)))
}

/// Whether RBAC grants the request. Cluster bindings apply everywhere; role bindings only in
/// their namespace.
pub fn allows(state: &State, a: &Attributes<'_>) -> bool {
    let crb = GroupResource::new("rbac.authorization.k8s.io", "clusterrolebindings");
    if state
        .objects(&crb)
        .any(|b| binding_allows(state, &b.value, a))
    {
        return true;
    }
    if a.namespace.is_empty() {
        return false;
    }
    let rb = GroupResource::new("rbac.authorization.k8s.io", "rolebindings");
    state
        .objects(&rb)
        .filter(|b| crate::object::namespace(&b.value) == a.namespace)
        .any(|b| binding_allows(state, &b.value, a))
}

/// Whether RBAC grants a non-resource request: only ClusterRoles bound cluster-wide can.
pub fn allows_path(state: &State, a: &PathAttributes<'_>) -> bool {
    let crb = GroupResource::new("rbac.authorization.k8s.io", "clusterrolebindings");
    state.objects(&crb).any(|b| {
        bound(&b.value, a.user, a.groups)
            && role_rules(state, &b.value, "")
                .and_then(Value::as_array)
                .is_some_and(|rules| rules.iter().any(|r| path_rule_allows(r, a)))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attrs<'a>(
        groups: &'a [String],
        verb: &'a str,
        resource: &'a str,
        sub: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            user: "system:serviceaccount:sw:ctl",
            groups,
            verb,
            group: "apps",
            resource,
            subresource: sub,
            namespace: "sw",
            name,
        }
    }

    #[test]
    fn rules_match_like_kubernetes() {
        let g = vec![];
        let rule = json!({"apiGroups": ["apps"], "resources": ["statefulsets", "*/scale"], "verbs": ["get", "patch"]});
        assert!(rule_allows(
            &rule,
            &attrs(&g, "get", "statefulsets", "", "x")
        ));
        assert!(rule_allows(
            &rule,
            &attrs(&g, "patch", "deployments", "scale", "x")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs(&g, "get", "statefulsets", "status", "x")
        ));
        assert!(!rule_allows(
            &rule,
            &attrs(&g, "list", "statefulsets", "", "")
        ));
        let named =
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "resourceNames": ["a"]});
        assert!(rule_allows(
            &named,
            &attrs(&g, "get", "statefulsets", "", "a")
        ));
        assert!(!rule_allows(
            &named,
            &attrs(&g, "get", "statefulsets", "", "b")
        ));
        assert!(!rule_allows(
            &named,
            &attrs(&g, "list", "statefulsets", "", "")
        ));
    }

    #[test]
    fn subjects() {
        let g = vec!["system:serviceaccounts:sw".to_string()];
        let a = attrs(&g, "get", "x", "", "");
        let subject_matches =
            |s: &Value, ns: &str, a: &Attributes<'_>| subject_matches(s, ns, a.user, a.groups);
        assert!(subject_matches(
            &json!({"kind": "ServiceAccount", "name": "ctl"}),
            "sw",
            &a
        ));
        assert!(!subject_matches(
            &json!({"kind": "ServiceAccount", "name": "ctl", "namespace": "other"}),
            "sw",
            &a
        ));
        assert!(subject_matches(
            &json!({"kind": "Group", "name": "system:serviceaccounts:sw"}),
            "",
            &a
        ));
        assert!(subject_matches(
            &json!({"kind": "User", "name": "system:serviceaccount:sw:ctl"}),
            "",
            &a
        ));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let a = |verb: &'static str, path: &'static str| PathAttributes {
            user: "u",
            groups: &[],
            verb,
            path,
        };
        let rule = json!({"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]});
        assert!(path_rule_allows(&rule, &a("get", "/metrics")));
        assert!(path_rule_allows(&rule, &a("get", "/debug/pprof/heap")));
        assert!(!path_rule_allows(&rule, &a("get", "/metrics/extra")));
        assert!(!path_rule_allows(&rule, &a("post", "/metrics")));
        assert!(!path_rule_allows(&rule, &a("get", "/healthz")));
        let resource_rule = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(!path_rule_allows(&resource_rule, &a("get", "/metrics")));
        assert!(path_rule_allows(
            &json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
            &a("get", "/anything")
        ));
    }

    #[test]
    fn denial_wording() {
        let g = vec![];
        let a = attrs(&g, "list", "statefulsets", "", "");
        assert_eq!(
            a.denial(),
            "User \"system:serviceaccount:sw:ctl\" cannot list resource \"statefulsets\" in API group \"apps\" in the namespace \"sw\""
        );
    }
}
