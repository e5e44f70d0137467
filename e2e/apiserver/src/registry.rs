//! The resources the server knows: built-in kinds and those defined by CRDs.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

/// A resource independent of version, as storage and RBAC see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    pub group: String,
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }

    /// `resource.group`, or just `resource` in the core group, as in error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// JSON paths (`.spec.replicas`) of a scale subresource.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
    /// Built-in workloads keep a `metav1.LabelSelector` object at `.spec.selector`
    /// while CRDs point at a string; this says which.
    pub selector_is_object: bool,
}

/// Which validation applies to `metadata.name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (namespaces).
    Label,
    /// RFC 1035 label (services).
    Dns1035,
    /// Any string usable as a path segment (RBAC objects).
    PathSegment,
}

/// Kinds that get kind-specific behaviour on write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    Plain,
    Namespace,
    Secret,
    ConfigMap,
    Service,
    StatefulSet,
    Deployment,
    Crd,
    SelfSubjectAccessReview,
    SubjectAccessReview,
    TokenReview,
}

impl Special {
    /// Review resources: only `create`, answered without storing anything.
    pub fn is_review(self) -> bool {
        matches!(
            self,
            Special::SelfSubjectAccessReview | Special::SubjectAccessReview | Special::TokenReview
        )
    }
}

/// An additional printer column of a CRD version.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub json_path: String,
    pub description: String,
    pub priority: i64,
}

/// One served version of a resource.
#[derive(Clone, Debug, PartialEq)]
pub struct VersionDef {
    pub name: String,
    pub schema: Option<Value>,
    pub status: bool,
    pub scale: Option<ScalePaths>,
    pub columns: Vec<PrinterColumn>,
}

impl VersionDef {
    fn plain(name: &str) -> Self {
        Self {
            name: name.to_string(),
            schema: None,
            status: false,
            scale: None,
            columns: Vec::new(),
        }
    }
}

/// Everything the server needs to serve one resource.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceDef {
    pub gr: GroupResource,
    pub kind: String,
    pub list_kind: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Served versions; the storage version is among them.
    pub versions: Vec<VersionDef>,
    pub storage_version: String,
    /// Whether `metadata.generation` is maintained.
    pub generation: bool,
    pub name_rule: NameRule,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub field_labels: Vec<String>,
    pub special: Special,
    /// Only `create` is served (review resources).
    pub create_only: bool,
    /// What the status of a newly created object is reset to (status subresource only).
    pub initial_status: Option<Value>,
    pub custom: bool,
}

impl ResourceDef {
    pub fn version(&self, name: &str) -> Option<&VersionDef> {
        self.versions.iter().find(|v| v.name == name)
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.gr.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.gr.group)
        }
    }

    pub fn storage_api_version(&self) -> String {
        self.api_version(&self.storage_version)
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            vec!["create"]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    status: Option<Value>,
    scale: bool,
    generation: bool,
    name_rule: NameRule,
    field_labels: &'static [&'static str],
    special: Special,
}

impl Builtin {
    fn new(
        group: &'static str,
        version: &'static str,
        plural: &'static str,
        kind: &'static str,
    ) -> Self {
        Self {
            group,
            version,
            plural,
            singular: "",
            kind,
            namespaced: true,
            short_names: &[],
            categories: &[],
            status: None,
            scale: false,
            generation: false,
            name_rule: NameRule::Subdomain,
            field_labels: &[],
            special: Special::Plain,
        }
    }

    fn cluster(mut self) -> Self {
        self.namespaced = false;
        self
    }

    fn short(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }

    fn categories(mut self, c: &'static [&'static str]) -> Self {
        self.categories = c;
        self
    }

    fn status(mut self, initial: Value) -> Self {
        self.status = Some(initial);
        self
    }

    fn workload(mut self) -> Self {
        self.generation = true;
        self
    }

    fn scale(mut self) -> Self {
        self.scale = true;
        self
    }

    fn names(mut self, rule: NameRule) -> Self {
        self.name_rule = rule;
        self
    }

    fn fields(mut self, f: &'static [&'static str]) -> Self {
        self.field_labels = f;
        self
    }

    fn special(mut self, s: Special) -> Self {
        self.special = s;
        self
    }

    fn build(self) -> ResourceDef {
        let singular = if self.singular.is_empty() {
            self.kind.to_lowercase()
        } else {
            self.singular.to_string()
        };
        let version = VersionDef {
            status: self.status.is_some(),
            scale: self.scale.then(|| ScalePaths {
                spec_replicas: ".spec.replicas".into(),
                status_replicas: ".status.replicas".into(),
                label_selector: Some(".spec.selector".into()),
                selector_is_object: true,
            }),
            ..VersionDef::plain(self.version)
        };
        ResourceDef {
            gr: GroupResource::new(self.group, self.plural),
            list_kind: format!("{}List", self.kind),
            kind: self.kind.to_string(),
            singular,
            namespaced: self.namespaced,
            short_names: self.short_names.iter().map(ToString::to_string).collect(),
            categories: self.categories.iter().map(ToString::to_string).collect(),
            versions: vec![version],
            storage_version: self.version.to_string(),
            generation: self.generation,
            name_rule: self.name_rule,
            field_labels: self.field_labels.iter().map(ToString::to_string).collect(),
            special: self.special,
            create_only: self.special.is_review(),
            initial_status: self.status,
            custom: false,
        }
    }
}

fn builtins() -> Vec<ResourceDef> {
    use serde_json::json;
    let all: &'static [&'static str] = &["all"];
    vec![
        Builtin::new("", "v1", "namespaces", "Namespace")
            .cluster()
            .short(&["ns"])
            .status(json!({"phase": "Active"}))
            .names(NameRule::Label)
            .fields(&["status.phase"])
            .special(Special::Namespace),
        Builtin::new("", "v1", "configmaps", "ConfigMap")
            .short(&["cm"])
            .special(Special::ConfigMap),
        Builtin::new("", "v1", "secrets", "Secret")
            .fields(&["type"])
            .special(Special::Secret),
        Builtin::new("", "v1", "services", "Service")
            .short(&["svc"])
            .categories(all)
            .status(json!({"loadBalancer": {}}))
            .names(NameRule::Dns1035)
            .special(Special::Service),
        Builtin::new("", "v1", "serviceaccounts", "ServiceAccount").short(&["sa"]),
        Builtin::new("", "v1", "events", "Event").short(&["ev"]).fields(&[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]),
        Builtin::new("", "v1", "pods", "Pod")
            .short(&["po"])
            .categories(all)
            .status(json!({"phase": "Pending"}))
            .fields(&[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ]),
        Builtin::new("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
            .short(&["pvc"])
            .status(json!({"phase": "Pending"})),
        Builtin::new("events.k8s.io", "v1", "events", "Event"),
        Builtin::new("coordination.k8s.io", "v1", "leases", "Lease"),
        Builtin::new("apps", "v1", "statefulsets", "StatefulSet")
            .short(&["sts"])
            .categories(all)
            .status(json!({"replicas": 0, "availableReplicas": 0}))
            .workload()
            .scale()
            .special(Special::StatefulSet),
        Builtin::new("apps", "v1", "deployments", "Deployment")
            .short(&["deploy"])
            .categories(all)
            .status(json!({}))
            .workload()
            .scale()
            .special(Special::Deployment),
        Builtin::new("apps", "v1", "replicasets", "ReplicaSet")
            .short(&["rs"])
            .categories(all)
            .status(json!({"replicas": 0}))
            .workload()
            .scale(),
        Builtin::new("apps", "v1", "daemonsets", "DaemonSet")
            .short(&["ds"])
            .categories(all)
            .status(json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0}))
            .workload(),
        Builtin::new("batch", "v1", "jobs", "Job")
            .categories(all)
            .status(json!({}))
            .workload(),
        Builtin::new("batch", "v1", "cronjobs", "CronJob")
            .short(&["cj"])
            .categories(all)
            .status(json!({}))
            .workload(),
        Builtin::new("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
            .short(&["pdb"])
            .status(json!({"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}))
            .workload(),
        Builtin::new("networking.k8s.io", "v1", "ingresses", "Ingress")
            .short(&["ing"])
            .status(json!({"loadBalancer": {}}))
            .workload(),
        Builtin::new("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
            .short(&["netpol"])
            .workload(),
        Builtin::new("rbac.authorization.k8s.io", "v1", "roles", "Role").names(NameRule::PathSegment),
        Builtin::new("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
            .names(NameRule::PathSegment),
        Builtin::new("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole")
            .cluster()
            .names(NameRule::PathSegment),
        Builtin::new("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding")
            .cluster()
            .names(NameRule::PathSegment),
        Builtin::new("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
            .cluster()
            .short(&["crd", "crds"])
            .categories(&["api-extensions"])
            .status(json!({}))
            .workload()
            .special(Special::Crd),
        Builtin::new("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview")
            .cluster()
            .special(Special::SelfSubjectAccessReview),
        Builtin::new("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview")
            .cluster()
            .special(Special::SubjectAccessReview),
        Builtin::new("authentication.k8s.io", "v1", "tokenreviews", "TokenReview")
            .cluster()
            .special(Special::TokenReview),
    ]
    .into_iter()
    .map(Builtin::build)
    .collect()
}

/// All definitions, keyed by group and plural.
#[derive(Clone, Debug)]
pub struct Registry {
    defs: BTreeMap<GroupResource, Arc<ResourceDef>>,
}

/// One API group as discovery presents it.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupInfo {
    pub name: String,
    /// Most preferred first.
    pub versions: Vec<String>,
}

impl Registry {
    pub fn with_builtins() -> Self {
        let defs = builtins()
            .into_iter()
            .map(|d| (d.gr.clone(), Arc::new(d)))
            .collect();
        Self { defs }
    }

    pub fn get(&self, gr: &GroupResource) -> Option<&Arc<ResourceDef>> {
        self.defs.get(gr)
    }

    /// Resolves a URL's group, version and plural to a served resource.
    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceDef>> {
        let def = self.defs.get(&GroupResource::new(group, resource))?;
        def.version(version).map(|_| Arc::clone(def))
    }

    pub fn insert(&mut self, def: ResourceDef) {
        self.defs.insert(def.gr.clone(), Arc::new(def));
    }

    pub fn remove(&mut self, gr: &GroupResource) -> Option<Arc<ResourceDef>> {
        self.defs.remove(gr)
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<ResourceDef>> {
        self.defs.values()
    }

    /// Groups in discovery order: built-in groups first in a fixed order, then CRD groups by name.
    pub fn groups(&self) -> Vec<GroupInfo> {
        let mut by_group: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        let mut builtin_order: Vec<&str> = Vec::new();
        for def in self.defs.values() {
            let entry = by_group.entry(def.gr.group.as_str()).or_default();
            for v in &def.versions {
                if !entry.contains(&v.name) {
                    entry.push(v.name.clone());
                }
            }
            if !def.custom && !builtin_order.contains(&def.gr.group.as_str()) {
                builtin_order.push(def.gr.group.as_str());
            }
        }
        builtin_order.sort_by_key(|g| builtin_rank(g));
        let mut names: Vec<&str> = builtin_order.clone();
        names.extend(by_group.keys().filter(|g| !builtin_order.contains(g)));
        names
            .into_iter()
            .filter_map(|name| {
                let mut versions = by_group.get(name)?.clone();
                versions.sort_by(|a, b| compare_versions(a, b));
                Some(GroupInfo {
                    name: name.to_string(),
                    versions,
                })
            })
            .collect()
    }

    /// The resources served at one group version.
    pub fn resources_in(&self, group: &str, version: &str) -> Vec<Arc<ResourceDef>> {
        self.defs
            .values()
            .filter(|d| d.gr.group == group && d.version(version).is_some())
            .cloned()
            .collect()
    }
}

fn builtin_rank(group: &str) -> usize {
    const ORDER: &[&str] = &[
        "",
        "apps",
        "events.k8s.io",
        "authorization.k8s.io",
        "batch",
        "networking.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
        "coordination.k8s.io",
    ];
    ORDER
        .iter()
        .position(|g| *g == group)
        .unwrap_or(ORDER.len())
}

/// Parses `v1`, `v2beta1`, `v1alpha3` into (major, stability, minor).
fn parse_kube_version(v: &str) -> Option<(u64, u8, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major: u64 = rest[..digits_end].parse().ok()?;
    let tail = &rest[digits_end..];
    if tail.is_empty() {
        return Some((major, 3, 0));
    }
    let (stability, minor) = if let Some(m) = tail.strip_prefix("beta") {
        (2, m)
    } else if let Some(m) = tail.strip_prefix("alpha") {
        (1, m)
    } else {
        return None;
    };
    Some((major, stability, minor.parse().ok()?))
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first, then others by name.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    match (parse_kube_version(a), parse_kube_version(b)) {
        (Some((ma, sa, na)), Some((mb, sb, nb))) => sb.cmp(&sa).then(mb.cmp(&ma)).then(nb.cmp(&na)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority_matches_kubernetes() {
        let mut v = vec![
            "v1alpha1",
            "foo",
            "v1",
            "v2beta1",
            "v1beta2",
            "v2",
            "v11alpha2",
            "bar",
        ];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(
            v,
            vec![
                "v2",
                "v1",
                "v2beta1",
                "v1beta2",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo"
            ]
        );
    }

    #[test]
    fn core_group_comes_first() {
        let r = Registry::with_builtins();
        let groups = r.groups();
        assert_eq!(groups[0].name, "");
        assert_eq!(groups[1].name, "apps");
        assert!(r.lookup("apps", "v1", "statefulsets").is_some());
        assert!(r.lookup("apps", "v2", "statefulsets").is_none());
    }
}
