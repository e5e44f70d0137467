//! Where an app may write: its destination namespace by default, more only by a FleetPolicy
//! that lists it. Pure decisions, checked for every object before anything is written.

use shardwise_api::{FleetPolicySpec, GroupKind, matches};
use thiserror::Error;

/// Why an object (or the whole app) is refused, naming the object and the rule.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("FleetPolicy {policy:?} does not list this app in spec.apps")]
    NotListed { policy: String },
    #[error(
        "{object} is cluster-scoped: an app without a FleetPolicy writes only namespaced objects, \
         into its destination namespace {namespace:?}"
    )]
    ClusterScoped { object: String, namespace: String },
    #[error(
        "{object} is outside the destination namespace {namespace:?}: an app without a \
         FleetPolicy writes only there"
    )]
    OtherNamespace { object: String, namespace: String },
    #[error(
        "{object} is cluster-scoped and FleetPolicy {policy:?} allows no {kind} in \
         spec.clusterResources"
    )]
    ClusterKindNotAllowed {
        object: String,
        kind: String,
        policy: String,
    },
    #[error(
        "{object}: FleetPolicy {policy:?} allows no destination namespace {namespace:?} on \
         FleetCluster {cluster:?} (spec.destinations)"
    )]
    DestinationNotAllowed {
        object: String,
        namespace: String,
        cluster: String,
        policy: String,
    },
    #[error("{object}: FleetPolicy {policy:?} denies {kind} in spec.namespaceResourcesDenied")]
    KindDenied {
        object: String,
        kind: String,
        policy: String,
    },
}

/// One object an app wants to write, its namespace defaulted.
#[derive(Clone, Copy, Debug)]
pub struct Object<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    /// `None` for cluster-scoped kinds.
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

impl Object<'_> {
    fn describe(&self) -> String {
        match self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind_name(), self.name),
            None => format!("{} {}", self.kind_name(), self.name),
        }
    }

    fn kind_name(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    fn is(&self, rule: &GroupKind) -> bool {
        matches(&rule.group, self.group) && matches(&rule.kind, self.kind)
    }
}

/// The rights of one app on its destination cluster.
#[derive(Clone, Copy, Debug)]
pub struct Admission<'a> {
    cluster: &'a str,
    namespace: &'a str,
    policy: Option<(&'a str, &'a FleetPolicySpec)>,
}

impl<'a> Admission<'a> {
    /// The rights of app `app` on FleetCluster `cluster` with destination namespace `namespace`
    /// and the policy it names, if any. Refused outright if the policy does not list it.
    pub fn new(
        app: &str,
        cluster: &'a str,
        namespace: &'a str,
        policy: Option<(&'a str, &'a FleetPolicySpec)>,
    ) -> Result<Self, Refusal> {
        if let Some((name, spec)) = policy
            && !spec.apps.iter().any(|pattern| matches(pattern, app))
        {
            return Err(Refusal::NotListed {
                policy: name.to_string(),
            });
        }
        Ok(Self {
            cluster,
            namespace,
            policy,
        })
    }

    /// Whether the app may write `object`.
    pub fn check(&self, object: &Object<'_>) -> Result<(), Refusal> {
        let Some((policy, spec)) = self.policy else {
            return match object.namespace {
                None => Err(Refusal::ClusterScoped {
                    object: object.describe(),
                    namespace: self.namespace.to_string(),
                }),
                Some(ns) if ns != self.namespace => Err(Refusal::OtherNamespace {
                    object: object.describe(),
                    namespace: self.namespace.to_string(),
                }),
                Some(_) => Ok(()),
            };
        };
        match object.namespace {
            None if spec.cluster_resources.iter().any(|r| object.is(r)) => Ok(()),
            None => Err(Refusal::ClusterKindNotAllowed {
                object: object.describe(),
                kind: object.kind_name(),
                policy: policy.to_string(),
            }),
            Some(ns) => {
                let allowed = spec
                    .destinations
                    .iter()
                    .any(|d| matches(&d.cluster, self.cluster) && matches(&d.namespace, ns));
                if !allowed {
                    return Err(Refusal::DestinationNotAllowed {
                        object: object.describe(),
                        namespace: ns.to_string(),
                        cluster: self.cluster.to_string(),
                        policy: policy.to_string(),
                    });
                }
                if spec.namespace_resources_denied.iter().any(|r| object.is(r)) {
                    return Err(Refusal::KindDenied {
                        object: object.describe(),
                        kind: object.kind_name(),
                        policy: policy.to_string(),
                    });
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use shardwise_api::PolicyDestination;

    use super::*;

    fn object<'a>(group: &'a str, kind: &'a str, namespace: Option<&'a str>) -> Object<'a> {
        Object {
            group,
            kind,
            namespace,
            name: "x",
        }
    }

    fn kind(group: &str, kind: &str) -> GroupKind {
        GroupKind {
            group: group.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn without_a_policy_an_app_writes_only_namespaced_objects_into_its_namespace() {
        let admission = Admission::new("web", "prod", "team-a", None).unwrap();
        assert_eq!(
            admission.check(&object("", "ConfigMap", Some("team-a"))),
            Ok(())
        );
        assert_eq!(
            admission
                .check(&object("", "ConfigMap", Some("kube-system")))
                .unwrap_err()
                .to_string(),
            "ConfigMap kube-system/x is outside the destination namespace \"team-a\": an app \
             without a FleetPolicy writes only there"
        );
        assert_eq!(
            admission
                .check(&object(
                    "rbac.authorization.k8s.io",
                    "ClusterRoleBinding",
                    None
                ))
                .unwrap_err()
                .to_string(),
            "ClusterRoleBinding.rbac.authorization.k8s.io x is cluster-scoped: an app without a \
             FleetPolicy writes only namespaced objects, into its destination namespace \"team-a\""
        );
    }

    #[test]
    fn a_policy_grants_exactly_what_it_lists_to_the_apps_it_lists() {
        let spec = FleetPolicySpec {
            apps: vec!["platform-*".into()],
            destinations: vec![
                PolicyDestination {
                    cluster: "prod-*".into(),
                    namespace: "monitoring".into(),
                },
                PolicyDestination {
                    cluster: "*".into(),
                    namespace: "platform-*".into(),
                },
            ],
            cluster_resources: vec![kind("rbac.authorization.k8s.io", "ClusterRole")],
            namespace_resources_denied: vec![kind("", "ResourceQuota")],
        };
        assert_eq!(
            Admission::new("web", "prod-eu", "monitoring", Some(("wide", &spec)))
                .unwrap_err()
                .to_string(),
            "FleetPolicy \"wide\" does not list this app in spec.apps"
        );
        let on_prod = Admission::new(
            "platform-agent",
            "prod-eu",
            "monitoring",
            Some(("wide", &spec)),
        )
        .unwrap();
        let on_dev = Admission::new(
            "platform-agent",
            "dev-1",
            "monitoring",
            Some(("wide", &spec)),
        )
        .unwrap();
        let ok = [
            object("", "ConfigMap", Some("monitoring")),
            object("apps", "Deployment", Some("platform-logs")),
            object("rbac.authorization.k8s.io", "ClusterRole", None),
        ];
        for o in ok {
            assert_eq!(on_prod.check(&o), Ok(()), "{o:?}");
        }
        let refused = [
            (
                on_prod,
                object("", "ConfigMap", Some("kube-system")),
                "ConfigMap kube-system/x: FleetPolicy \"wide\" allows no destination namespace \
                 \"kube-system\" on FleetCluster \"prod-eu\" (spec.destinations)",
            ),
            (
                on_dev,
                object("", "ConfigMap", Some("monitoring")),
                "allows no destination namespace \"monitoring\" on FleetCluster \"dev-1\"",
            ),
            (
                on_prod,
                object("rbac.authorization.k8s.io", "ClusterRoleBinding", None),
                "ClusterRoleBinding.rbac.authorization.k8s.io x is cluster-scoped and FleetPolicy \
                 \"wide\" allows no ClusterRoleBinding.rbac.authorization.k8s.io in \
                 spec.clusterResources",
            ),
            (
                on_prod,
                object("", "Namespace", None),
                "allows no Namespace in spec.clusterResources",
            ),
            (
                on_prod,
                object("", "ResourceQuota", Some("monitoring")),
                "ResourceQuota monitoring/x: FleetPolicy \"wide\" denies ResourceQuota in \
                 spec.namespaceResourcesDenied",
            ),
        ];
        for (admission, o, message) in refused {
            let err = admission.check(&o).unwrap_err().to_string();
            assert!(err.contains(message), "{o:?}: {err}");
        }
    }
}
