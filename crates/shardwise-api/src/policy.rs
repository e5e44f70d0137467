//! `FleetPolicy`: what a platform admin lets some apps write beyond their destination namespace.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Rights, granted by a platform admin, for the FleetApps it names: the destinations their
/// objects may go to, the cluster-scoped kinds they may write, and namespaced kinds they may not.
///
/// Without a policy an app writes only namespaced objects, only into its
/// `spec.destination.namespace`. An app that names a policy (`spec.policy`) and is listed in
/// its `apps` gets exactly what the policy allows instead. Only platform admins should be able
/// to write FleetPolicies: grant app authors `fleetapps`, never `fleetpolicies`.
// kube's repeated `printcolumn(...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "shardwise.io",
    version = "v1alpha1",
    kind = "FleetPolicy",
    plural = "fleetpolicies",
    singular = "fleetpolicy",
    shortname = "fpol",
    category = "shardwise",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "Rights beyond its destination namespace that a platform admin grants to named FleetApps",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FleetPolicySpec {
    /// Names of the FleetApps (in this namespace) that may use the policy; `*` matches any run
    /// of characters. An app not listed here that names the policy fails.
    #[schemars(length(min = 1))]
    pub apps: Vec<String>,
    /// Where the apps' namespaced objects may go. Each entry matches a FleetCluster name and a
    /// namespace there (`*` wildcards). An empty list allows no namespaced object at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destinations: Vec<PolicyDestination>,
    /// Cluster-scoped kinds the apps may write (an allow-list; empty allows none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_resources: Vec<GroupKind>,
    /// Namespaced kinds the apps may not write, even into an allowed namespace (a deny-list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_resources_denied: Vec<GroupKind>,
}

/// A FleetCluster and a namespace in it, as patterns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDestination {
    /// FleetCluster name pattern (default `*`).
    #[serde(default = "any")]
    pub cluster: String,
    /// Namespace pattern.
    #[schemars(length(min = 1))]
    pub namespace: String,
}

/// An API group and a kind, as patterns: `group: ""` is the core group, `*` matches anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupKind {
    /// API group pattern (default `""`, the core group).
    #[serde(default)]
    pub group: String,
    /// Kind pattern.
    #[schemars(length(min = 1))]
    pub kind: String,
}

fn any() -> String {
    "*".into()
}

/// Whether `text` matches `pattern`, in which `*` stands for any run of characters (none
/// included) and every other character for itself.
pub fn matches(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    // Classic greedy matching with one backtrack point: linear for patterns without `*`,
    // O(pattern x text) at worst.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_with_stars_only() {
        for (pattern, text) in [
            ("*", ""),
            ("*", "anything"),
            ("team-a", "team-a"),
            ("team-*", "team-a"),
            ("team-*", "team-"),
            ("*-prod", "eu-prod"),
            ("a*b*c", "aXXbYYc"),
            ("a*b*c", "abc"),
            ("**", "x"),
        ] {
            assert!(matches(pattern, text), "{pattern} ~ {text}");
        }
        for (pattern, text) in [
            ("team-a", "team-ab"),
            ("team-*", "team"),
            ("team-*", "xteam-a"),
            ("*-prod", "eu-prod-2"),
            ("a*b*c", "aXXbYY"),
            ("", "x"),
            ("kube-system", "kube-public"),
        ] {
            assert!(!matches(pattern, text), "{pattern} !~ {text}");
        }
    }
}
