//! How an Argo CD installation configures its application controller's sharding, read the way
//! the controller (v3.5) reads it: from the flags and the environment of its pod template (the
//! flags win; Argo CD's manifests fill the variables from `argocd-cmd-params-cm`), and from
//! each running pod what its process started with. No I/O: the workload, its pods and the
//! ConfigMaps its variables refer to are passed in.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, EnvVarSource, Pod, PodSpec, PodTemplateSpec,
};
use shard_assign::{ShardId, StrategyKind};

use super::argocd::parse_go_bool;

/// Argo CD's parameters ConfigMap, where its manifests point the variables below.
pub const CMD_PARAMS_CM: &str = "argocd-cmd-params-cm";
/// The controller's container in Argo CD's manifests.
const CONTAINER: &str = "argocd-application-controller";
/// The variable that gives each controller its replica count.
pub const REPLICAS_ENV: &str = "ARGOCD_CONTROLLER_REPLICAS";
const ALGORITHM_ENV: &str = "ARGOCD_CONTROLLER_SHARDING_ALGORITHM";
const NAMESPACES_ENV: &str = "ARGOCD_APPLICATION_NAMESPACES";
const DYNAMIC_ENV: &str = "ARGOCD_ENABLE_DYNAMIC_CLUSTER_DISTRIBUTION";
const SHARD_ENV: &str = "ARGOCD_CONTROLLER_SHARD";

/// The application controller's workload: a StatefulSet, or a Deployment under dynamic cluster
/// distribution.
#[derive(Debug)]
pub struct Workload<'a> {
    /// `StatefulSet argocd/argocd-application-controller`, for messages.
    pub what: String,
    /// Its `spec.replicas`.
    pub replicas: Option<i32>,
    /// Its pods' template, whose environment holds the sharding settings.
    pub template: &'a PodTemplateSpec,
}

/// A setting, and where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting<T> {
    /// The value.
    pub value: T,
    /// Where it was read (a ConfigMap key, an environment variable, a default).
    pub origin: String,
}

/// Argo CD's sharding as configured.
#[derive(Debug, PartialEq, Eq)]
pub struct Sharding {
    /// The shard count the controller computes placement with: 1 when it does not shard.
    pub replicas: Setting<u32>,
    /// When Argo CD does not shard although several pods run: their number, the natural
    /// replica count to plan for.
    pub unsharded_pods: Option<u32>,
    /// The strategy that reproduces the algorithm, under Argo CD's name for it.
    pub algorithm: Setting<(StrategyKind, &'static str)>,
    /// Namespaces (patterns) Applications are reconciled from besides the control plane's.
    pub app_namespaces: Setting<Vec<String>>,
    /// About the replica count: moot when `--replicas` overrides it.
    pub replica_notes: Vec<Message>,
    /// About the rest.
    pub notes: Vec<Message>,
    /// Dynamic cluster distribution is on: pods claim shards in [`SHARD_CM`].
    pub dynamic: bool,
}

/// A sentence about the installation: something to know, or something that hurts the fleet.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// Something to know.
    Note(String),
    /// Something that hurts the fleet.
    Warning(String),
}

/// ConfigMaps the variables of `pod`'s controller container refer to.
pub fn pod_config_maps(pod: &Pod) -> BTreeSet<String> {
    container_env(pod.spec.as_ref())
        .iter()
        .filter_map(|e| e.value_from.as_ref()?.config_map_key_ref.as_ref())
        .map(|r| r.name.clone())
        .collect()
}

/// ConfigMaps the controller's variables refer to: the ones to fetch. Without a workload, the
/// references of Argo CD's manifests.
pub fn referenced_config_maps(workload: Option<&Workload<'_>>) -> BTreeSet<String> {
    let Some(workload) = workload else {
        return BTreeSet::from([CMD_PARAMS_CM.to_string()]);
    };
    env(workload)
        .iter()
        .filter_map(|e| e.value_from.as_ref()?.config_map_key_ref.as_ref())
        .map(|r| r.name.clone())
        .collect()
}

/// Reads the sharding settings. `config_maps` holds the referenced ConfigMaps that exist.
pub fn sharding(
    workload: Option<&Workload<'_>>,
    config_maps: &BTreeMap<String, ConfigMap>,
) -> Result<Sharding, String> {
    // Without a workload, the variables Argo CD's manifests set from argocd-cmd-params-cm.
    let manifest_env = [
        manifest_ref(ALGORITHM_ENV, "controller.sharding.algorithm"),
        manifest_ref(NAMESPACES_ENV, "application.namespaces"),
    ];
    let (vars, owner): (&[EnvVar], String) = match workload {
        Some(w) => (env(w), w.what.clone()),
        None => (&manifest_env, "Argo CD's manifests".to_string()),
    };
    let mut notes = Vec::new();
    let mut read = |name: &str| lookup(vars, name, &owner, config_maps, &mut notes);
    // The controller's flags win over the variables, which only give their defaults. A flag
    // given twice: the last wins, but a string slice's values add up.
    let argv = workload.map_or_else(Vec::new, |w| container_argv(w.template.spec.as_ref()));
    let flag = |name: &str, boolean: bool, slice: bool| {
        let values = flag_values(&argv, name, boolean);
        let value = if slice {
            values.join(",")
        } else {
            values.last()?.clone()
        };
        (!values.is_empty()).then(|| Setting {
            value,
            origin: format!("flag --{name} of {owner}"),
        })
    };

    let dynamic = flag("dynamic-cluster-distribution-enabled", true, false)
        .or_else(|| read(DYNAMIC_ENV))
        .and_then(|s| parse_go_bool(&s.value).filter(|&on| on).map(|_| s));
    let algorithm_text = flag("sharding-method", false, false).or_else(|| read(ALGORITHM_ENV));
    let namespaces = flag("application-namespaces", false, true).or_else(|| read(NAMESPACES_ENV));
    let replicas_text = read(REPLICAS_ENV);
    let mut replica_notes = Vec::new();

    let replicas = match (&dynamic, workload) {
        (Some(dynamic), Some(w)) => {
            // Dynamic distribution: the Deployment's replica count, pods taking shards by
            // heartbeat in argocd-app-controller-shard-cm; placement by shard is unchanged.
            let n = w.replicas.ok_or_else(|| {
                format!(
                    "{} enables dynamic cluster distribution ({}) but sets no spec.replicas; pass --replicas N",
                    w.what, dynamic.origin
                )
            })?;
            Setting {
                value: u32::try_from(n).unwrap_or(0),
                origin: format!("{} spec.replicas (dynamic cluster distribution)", w.what),
            }
        }
        _ => go_int(replicas_text.as_ref(), &owner, &mut replica_notes),
    };
    let pods = workload.map(|w| u32::try_from(w.replicas.unwrap_or(1)).unwrap_or(0));
    let mut unsharded_pods = None;
    let replicas = if replicas.value <= 1 {
        // Argo CD's controller shards only with more than one replica; otherwise every pod
        // takes shard 0 and reconciles every cluster.
        if let Some(pods) = pods.filter(|&p| p > 1) {
            replica_notes.push(Message::Warning(format!(
                "Argo CD does not shard: the controller's replica count is {} ({}), so each of the {pods} pods of {owner} reconciles every cluster; planned as one shard, --to defaults to {pods}",
                replicas.value, replicas.origin
            )));
            unsharded_pods = Some(pods);
        }
        Setting {
            value: 1,
            origin: format!("{} (Argo CD does not shard)", replicas.origin),
        }
    } else {
        if let Some(pods) = pods.filter(|&p| p != replicas.value && dynamic.is_none()) {
            replica_notes.push(if pods < replicas.value {
                let last = replicas.value - 1;
                let missing = if pods == last {
                    format!("shard {last}")
                } else {
                    format!("shards {pods} to {last}")
                };
                Message::Warning(format!(
                    "{owner} runs {pods} pod(s) but Argo CD shards over {}: no pod reconciles the clusters of {missing}",
                    replicas.value
                ))
            } else {
                Message::Note(format!(
                    "{owner} runs {pods} pods but Argo CD shards over {}: the pods from ordinal {} on reconcile shard 0 again or nothing",
                    replicas.value, replicas.value
                ))
            });
        }
        replicas
    };

    let algorithm = match algorithm_text.filter(|s| !s.value.is_empty()) {
        None => Setting {
            value: (StrategyKind::LegacyModulo, "legacy"),
            origin: format!("Argo CD's default: {ALGORITHM_ENV} is not set in {owner}"),
        },
        Some(Setting { value, origin }) => match argocd_algorithm(&value) {
            Some(named) => Setting {
                value: named,
                origin,
            },
            None => {
                notes.push(Message::Warning(format!(
                    "Argo CD has no sharding algorithm {value:?} ({origin}): it falls back to legacy"
                )));
                Setting {
                    value: (StrategyKind::LegacyModulo, "legacy"),
                    origin: format!("Argo CD's fallback for {value:?} ({origin})"),
                }
            }
        },
    };

    let app_namespaces = match namespaces.filter(|s| !s.value.is_empty()) {
        // Go's StringsFromEnv: split on commas, trim each.
        Some(Setting { value, origin }) => Setting {
            value: value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            origin,
        },
        None => Setting {
            value: Vec::new(),
            origin: format!("{NAMESPACES_ENV} is not set in {owner}"),
        },
    };

    Ok(Sharding {
        dynamic: dynamic.is_some(),
        replicas,
        unsharded_pods,
        algorithm,
        app_namespaces,
        replica_notes,
        notes,
    })
}

/// The shardwise strategy that reproduces an Argo CD algorithm, and Argo CD's name for it.
pub fn argocd_algorithm(name: &str) -> Option<(StrategyKind, &'static str)> {
    match name {
        "legacy" => Some((StrategyKind::LegacyModulo, "legacy")),
        "round-robin" => Some((StrategyKind::RoundRobin, "round-robin")),
        "consistent-hashing" => Some((StrategyKind::ArgoCdConsistentHashing, "consistent-hashing")),
        _ => None,
    }
}

/// Argo CD's sharding algorithm as a user names it: by Argo CD's name (`legacy`,
/// `round-robin`, `consistent-hashing`) or by the name of the shardwise strategy that
/// reproduces it; that strategy and Argo CD's name, or a message that lists the names.
pub fn argocd_algorithm_named(text: &str) -> Result<(StrategyKind, &'static str), String> {
    let argocd = match text {
        "legacy-modulo" => "legacy",
        "argocd-consistent-hashing" => "consistent-hashing",
        other => other,
    };
    argocd_algorithm(argocd).ok_or_else(|| {
        format!(
            "Argo CD has no sharding algorithm {text:?}; it has legacy, round-robin and consistent-hashing"
        )
    })
}

/// Whether an Application namespace is one Argo CD's controller reconciles: the control
/// plane's, or one matching a pattern (`*` any run of characters, `?` one character).
pub fn namespace_allowed(patterns: &[String], control_plane: &str, namespace: &str) -> bool {
    namespace == control_plane || patterns.iter().any(|p| glob_match(p, namespace))
}

/// Patterns shardwise cannot evaluate as Argo CD does: `/regex/`, and glob classes `[...]`
/// and alternatives `{a,b}`.
pub fn unsupported_pattern(pattern: &str) -> bool {
    (pattern.len() > 1 && pattern.starts_with('/') && pattern.ends_with('/'))
        || pattern.contains(['[', '{', '\\'])
}

/// Whether a pattern names one namespace (no wildcard), so it can be listed alone.
pub fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?'])
}

fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // Iterative wildcard matching with one backtrack point: linear in practice.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn manifest_ref(name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                name: CMD_PARAMS_CM.into(),
                key: key.into(),
                optional: Some(true),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// The controller container's variables: the one named as in Argo CD's manifests, else the
/// first.
fn env<'a>(workload: &Workload<'a>) -> &'a [EnvVar] {
    container_env(workload.template.spec.as_ref())
}

fn container_env(spec: Option<&PodSpec>) -> &[EnvVar] {
    controller_container(spec)
        .and_then(|c| c.env.as_deref())
        .unwrap_or_default()
}

/// The application controller's container of a pod spec: the one named as in Argo CD's
/// manifests, else the first.
pub fn controller_container(spec: Option<&PodSpec>) -> Option<&Container> {
    let containers = spec.map_or(&[][..], |s| &s.containers[..]);
    containers
        .iter()
        .find(|c| c.name == CONTAINER)
        .or_else(|| containers.first())
}

/// The controller container's arguments after its program: the rest of `command`, then `args`.
fn container_argv(spec: Option<&PodSpec>) -> Vec<String> {
    let Some(container) = controller_container(spec) else {
        return Vec::new();
    };
    let command = container.command.iter().flatten().skip(1);
    command
        .chain(container.args.iter().flatten())
        .cloned()
        .collect()
}

/// Every value of flag `--name` in `argv`, in order, as Go's pflag reads it: `--name=value`,
/// or `--name value`; a boolean flag alone means `true` (and takes no separate value).
/// Parsing stops at `--`.
fn flag_values(argv: &[String], name: &str, boolean: bool) -> Vec<String> {
    let long = format!("--{name}");
    let mut values = Vec::new();
    let mut args = argv.iter().take_while(|a| *a != "--");
    while let Some(arg) = args.next() {
        if let Some(value) = arg.strip_prefix(&long).and_then(|r| r.strip_prefix('=')) {
            values.push(value.to_string());
        } else if *arg == long {
            if boolean {
                values.push("true".into());
            } else if let Some(value) = args.next() {
                values.push(value.clone());
            }
        }
    }
    values
}

/// An application controller pod as its process shards: what it read when it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerPod {
    /// The pod's name.
    pub name: String,
    /// The pod's UID: a replaced pod's metrics start from zero.
    pub uid: String,
    /// The pod's address, once it has one: where its metrics are scraped.
    pub ip: Option<String>,
    /// The shard it serves, or `None` when it serves none.
    pub shard: Option<ShardId>,
    /// The replica count its process reads `shard` keys with, or `None` when it cannot be told.
    pub replicas: Option<u32>,
    /// Its `Ready` condition is true.
    pub ready: bool,
    /// It is being deleted: its process runs (and reconciles) until it exits.
    pub terminating: bool,
    /// The StatefulSet revision it was made from (its `controller-revision-hash` label).
    pub revision: Option<String>,
}

impl ControllerPod {
    /// Its ordinal in a StatefulSet (the number its name ends with), if it has one.
    pub fn ordinal(&self) -> Option<u32> {
        shardwise_handoff::identity::shard_from_pod_name(&self.name, None).ok()
    }

    fn of(pod: &Pod, shard: Option<ShardId>, replicas: Option<u32>) -> Self {
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            shard,
            replicas,
            ready,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            revision: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash").cloned()),
        }
    }
}

/// A pod of the controller's StatefulSet, read as its process read itself at start (Argo CD's
/// `GetClusterSharding`): the replica count from `ARGOCD_CONTROLLER_REPLICAS` of its own spec
/// (not the template's, which a rollout changes first), its shard from `ARGOCD_CONTROLLER_SHARD`
/// when that is 0 or more, else from its hostname's last `-` part (0 when that is no number),
/// and shard 0 when that is above the count. A variable taken from a ConfigMap is read as the
/// ConfigMap is now.
pub fn statefulset_pod(pod: &Pod, config_maps: &BTreeMap<String, ConfigMap>) -> ControllerPod {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let vars = container_env(pod.spec.as_ref());
    let owner = format!("pod {name}");
    let mut notes = Vec::new();
    let replicas = go_int(
        lookup(vars, REPLICAS_ENV, &owner, config_maps, &mut notes).as_ref(),
        &owner,
        &mut notes,
    )
    .value;
    let given = lookup(vars, SHARD_ENV, &owner, config_maps, &mut notes)
        .and_then(|s| s.value.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| name.clone());
    let shard = given.unwrap_or_else(|| {
        hostname
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    });
    let shard = if shard > replicas { 0 } else { shard };
    ControllerPod::of(pod, Some(shard), Some(replicas))
}
/// Argo CD's ConfigMap where, under dynamic cluster distribution, each controller pod claims a
/// shard by heartbeat.
pub const SHARD_CM: &str = "argocd-app-controller-shard-cm";

/// The shard each controller claims in [`SHARD_CM`], by hostname (its pod's name).
pub fn shard_mapping(cm: &ConfigMap) -> BTreeMap<String, ShardId> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        shard_number: i64,
        controller_name: String,
    }
    let entries: Vec<Entry> = cm
        .data
        .as_ref()
        .and_then(|d| d.get("shardControllerMapping"))
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    entries
        .into_iter()
        .filter(|e| !e.controller_name.is_empty())
        .filter_map(|e| Some((e.controller_name, u32::try_from(e.shard_number).ok()?)))
        .collect()
}

/// When the Deployment's replica count was last written, as far as its managedFields tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicasWritten {
    /// Not since the Deployment was created (in the same second): every pod reads that count.
    AtCreation,
    /// At this time (server time, in seconds).
    At(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time),
    /// The managedFields do not say.
    Unknown,
}

/// When the last writer of `spec.replicas` wrote it, by its managedFields entry: under
/// dynamic cluster distribution a controller reads the count once, when its process starts,
/// so only pods created after this read the count there is now.
pub fn replicas_written(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> ReplicasWritten {
    let last = metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.get("f:spec")
                    .and_then(|s| s.get("f:replicas"))
                    .is_some()
            })
        })
        .filter_map(|m| m.time.clone())
        .max();
    match (last, metadata.creation_timestamp.as_ref()) {
        (Some(last), Some(created)) if last.0.as_second() <= created.0.as_second() => {
            ReplicasWritten::AtCreation
        }
        (Some(last), _) => ReplicasWritten::At(last),
        (None, _) => ReplicasWritten::Unknown,
    }
}

/// A pod of the controller's Deployment under dynamic cluster distribution: its shard as
/// `mapping` ([`shard_mapping`]) gives it, and the Deployment's count `replicas` if the pod
/// reads it: the count has not changed since the Deployment was created, or the pod was
/// created after it was last written ([`replicas_written`]), in a later second; otherwise its
/// process may read keys with an earlier count, which cannot be told.
pub fn dynamic_pod(
    pod: &Pod,
    mapping: &BTreeMap<String, ShardId>,
    replicas: u32,
    written: &ReplicasWritten,
) -> ControllerPod {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let hostname = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| name.clone());
    let created = pod.metadata.creation_timestamp.as_ref();
    let reads = match (created, written) {
        (_, ReplicasWritten::AtCreation) => true,
        (Some(created), ReplicasWritten::At(written)) => {
            created.0.as_second() > written.0.as_second()
        }
        _ => false,
    } || shardwise_runtime::failpoints::seeded(
        shardwise_runtime::failpoints::TRUST_DYNAMIC_COUNT,
    );
    ControllerPod::of(
        pod,
        mapping.get(&hostname).copied(),
        reads.then_some(replicas),
    )
}

/// A variable's value as the pod sees it (`None`: unset), with where it came from.
fn lookup(
    vars: &[EnvVar],
    name: &str,
    owner: &str,
    config_maps: &BTreeMap<String, ConfigMap>,
    notes: &mut Vec<Message>,
) -> Option<Setting<String>> {
    // Kubernetes lets the last of duplicate variables win.
    let var = vars.iter().rev().find(|e| e.name == name)?;
    if let Some(value) = &var.value {
        return Some(Setting {
            value: value.clone(),
            origin: format!("env {name} of {owner}"),
        });
    }
    let source = var.value_from.as_ref()?;
    let Some(reference) = &source.config_map_key_ref else {
        notes.push(Message::Note(format!(
            "env {name} of {owner} comes from a source shardwise does not read (only values and configMapKeyRef); taken as unset"
        )));
        return None;
    };
    let value = config_maps
        .get(&reference.name)
        .and_then(|cm| cm.data.as_ref()?.get(&reference.key))?;
    Some(Setting {
        value: value.clone(),
        origin: format!("{} {}", reference.name, reference.key),
    })
}

/// Go's `ParseNumFromEnv(name, 0, 0, MaxInt32)`: unset, unparsable or out of range is 0.
fn go_int(text: Option<&Setting<String>>, owner: &str, notes: &mut Vec<Message>) -> Setting<u32> {
    let Some(Setting { value, origin }) = text.filter(|s| !s.value.is_empty()) else {
        return Setting {
            value: 0,
            origin: format!("{REPLICAS_ENV} is not set in {owner}"),
        };
    };
    match value
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
    {
        Some(n) if n <= i32::MAX as u32 => Setting {
            value: n,
            origin: origin.clone(),
        },
        _ => {
            notes.push(Message::Note(format!(
                "{REPLICAS_ENV} is {value:?} ({origin}), which Argo CD does not take as a replica count: it uses 0"
            )));
            Setting {
                value: 0,
                origin: origin.clone(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::StatefulSet;

    use super::*;

    fn statefulset(replicas: i32, env: &str) -> StatefulSet {
        serde_json::from_str(&format!(
            r#"{{"spec": {{"replicas": {replicas}, "selector": {{}}, "serviceName": "c", "template": {{"spec": {{"containers": [
                {{"name": "sidecar", "env": [{{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "9"}}]}},
                {{"name": "argocd-application-controller", "env": [{env}]}}]}}}}}}}}"#
        ))
        .unwrap()
    }

    fn read(sts: &StatefulSet, cms: &[(&str, &[(&str, &str)])]) -> Sharding {
        let spec = sts.spec.as_ref().unwrap();
        let workload = Workload {
            what: "StatefulSet argocd/argocd-application-controller".into(),
            replicas: spec.replicas,
            template: &spec.template,
        };
        let config_maps = cms
            .iter()
            .map(|(name, data)| {
                let cm = ConfigMap {
                    data: Some(
                        data.iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..ConfigMap::default()
                };
                (name.to_string(), cm)
            })
            .collect();
        assert_eq!(
            referenced_config_maps(Some(&workload)),
            cms.iter()
                .map(|(n, _)| n.to_string())
                .filter(|n| n == CMD_PARAMS_CM)
                .collect()
        );
        sharding(Some(&workload), &config_maps).unwrap()
    }

    const FROM_PARAMS: &str = r#"
        {"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"},
        {"name": "ARGOCD_CONTROLLER_SHARDING_ALGORITHM", "valueFrom": {"configMapKeyRef": {"name": "argocd-cmd-params-cm", "key": "controller.sharding.algorithm", "optional": true}}},
        {"name": "ARGOCD_APPLICATION_NAMESPACES", "valueFrom": {"configMapKeyRef": {"name": "argocd-cmd-params-cm", "key": "application.namespaces", "optional": true}}}"#;

    #[test]
    fn settings_come_from_the_controller_env_and_argocd_cmd_params_cm() {
        let sts = statefulset(3, FROM_PARAMS);
        let read = read(
            &sts,
            &[(
                CMD_PARAMS_CM,
                &[
                    ("controller.sharding.algorithm", "round-robin"),
                    ("application.namespaces", " team-a, apps-* ,"),
                ],
            )],
        );
        assert_eq!(
            read.replicas,
            Setting {
                value: 3,
                origin: "env ARGOCD_CONTROLLER_REPLICAS of StatefulSet argocd/argocd-application-controller".into()
            }
        );
        assert_eq!(read.unsharded_pods, None);
        assert_eq!(
            read.algorithm,
            Setting {
                value: (StrategyKind::RoundRobin, "round-robin"),
                origin: "argocd-cmd-params-cm controller.sharding.algorithm".into()
            }
        );
        assert_eq!(read.app_namespaces.value, ["team-a", "apps-*"]);
        assert!(read.notes.is_empty(), "{:?}", read.notes);
        assert!(read.replica_notes.is_empty(), "{:?}", read.replica_notes);
    }

    #[test]
    fn an_unset_or_zero_replica_count_does_not_shard() {
        for env in [
            "",
            r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "0"}"#,
        ] {
            let read = read(&statefulset(4, env), &[]);
            assert_eq!(read.replicas.value, 1);
            assert_eq!(read.unsharded_pods, Some(4));
            assert!(
                matches!(&read.replica_notes[0], Message::Warning(t) if t.starts_with("Argo CD does not shard")),
                "{:?}",
                read.replica_notes
            );
            assert_eq!(read.algorithm.value.1, "legacy");
        }
        // Go's ParseInt takes no surrounding space: Argo CD then uses 0.
        let read = read(
            &statefulset(
                2,
                r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": " 2"}"#,
            ),
            &[],
        );
        assert_eq!(read.replicas.value, 1);
        assert!(
            matches!(&read.replica_notes[0], Message::Note(t) if t.contains("does not take as a replica count"))
        );
    }

    #[test]
    fn unknown_algorithms_fall_back_to_legacy_and_pod_counts_are_compared() {
        let env = r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"},
            {"name": "ARGOCD_CONTROLLER_SHARDING_ALGORITHM", "value": "fastest"}"#;
        let read = read(&statefulset(2, env), &[]);
        assert_eq!(read.algorithm.value, (StrategyKind::LegacyModulo, "legacy"));
        assert!(
            read.notes
                .iter()
                .any(|n| matches!(n, Message::Warning(t) if t.contains("falls back to legacy")))
        );
        let missing =
            "runs 2 pod(s) but Argo CD shards over 3: no pod reconciles the clusters of shard 2";
        assert!(
            read.replica_notes
                .iter()
                .any(|n| matches!(n, Message::Warning(t) if t.ends_with(missing)))
        );
    }

    #[test]
    fn dynamic_distribution_uses_the_workload_replicas() {
        let env = r#"{"name": "ARGOCD_ENABLE_DYNAMIC_CLUSTER_DISTRIBUTION", "value": "true"},
            {"name": "ARGOCD_CONTROLLER_SHARDING_ALGORITHM", "value": "consistent-hashing"}"#;
        let read = read(&statefulset(5, env), &[]);
        assert_eq!(read.replicas.value, 5);
        assert!(
            read.replicas
                .origin
                .ends_with("(dynamic cluster distribution)")
        );
        assert_eq!(
            read.algorithm.value.0,
            StrategyKind::ArgoCdConsistentHashing
        );
    }

    #[test]
    fn without_a_workload_the_manifests_references_are_read() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                "controller.sharding.algorithm".to_string(),
                "consistent-hashing".to_string(),
            )])),
            ..ConfigMap::default()
        };
        let cms = BTreeMap::from([(CMD_PARAMS_CM.to_string(), cm)]);
        assert_eq!(
            referenced_config_maps(None),
            BTreeSet::from([CMD_PARAMS_CM.to_string()])
        );
        let read = sharding(None, &cms).unwrap();
        assert_eq!(read.algorithm.value.1, "consistent-hashing");
    }

    #[test]
    fn namespaces_match_as_argo_cd_globs() {
        let patterns = vec!["team-*".to_string(), "a?c".to_string()];
        assert!(namespace_allowed(&patterns, "argocd", "argocd"));
        assert!(namespace_allowed(&patterns, "argocd", "team-"));
        assert!(namespace_allowed(&patterns, "argocd", "team-x-y"));
        assert!(namespace_allowed(&patterns, "argocd", "abc"));
        assert!(!namespace_allowed(&patterns, "argocd", "abbc"));
        assert!(!namespace_allowed(&patterns, "argocd", "other"));
        assert!(namespace_allowed(&["*".to_string()], "argocd", "any"));
        assert!(unsupported_pattern("/team-.*/"));
        assert!(unsupported_pattern("team-[ab]"));
        assert!(!unsupported_pattern("team-*"));
        assert!(is_literal("team-a") && !is_literal("team-*"));
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn controller_pod(name: &str, env: serde_json::Value, ready: bool) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": name, "creationTimestamp": "2026-12-06T10:00:05Z"},
            "spec": {"containers": [
                {"name": "sidecar", "env": [{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "9"}]},
                {"name": "argocd-application-controller", "env": env},
            ]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
    }

    #[test]
    fn a_statefulset_pod_reads_its_own_count_and_its_shard_as_argo_cd_does() {
        let cms = BTreeMap::from([(
            "params".to_string(),
            ConfigMap {
                data: Some(BTreeMap::from([("replicas".into(), "4".into())])),
                ..ConfigMap::default()
            },
        )]);
        let literal = serde_json::json!([{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"}]);
        let read = |name: &str, env: &serde_json::Value, ready| {
            statefulset_pod(&controller_pod(name, env.clone(), ready), &cms)
        };
        let p = read("argocd-application-controller-2", &literal, true);
        assert_eq!(
            (p.shard, p.replicas, p.ready, p.terminating),
            (Some(2), Some(3), true, false)
        );
        assert_eq!(p.name, "argocd-application-controller-2");
        // Argo CD keeps an ordinal equal to the count (it then matches no key) and takes one
        // above it as 0.
        assert_eq!(read("c-3", &literal, true).shard, Some(3));
        assert_eq!(read("c-4", &literal, true).shard, Some(0));
        // A hostname without an ordinal is shard 0; ARGOCD_CONTROLLER_SHARD wins over it.
        assert_eq!(read("controller", &literal, false).shard, Some(0));
        let given = serde_json::json!([
            {"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"},
            {"name": "ARGOCD_CONTROLLER_SHARD", "value": "1"},
        ]);
        assert_eq!(read("c-2", &given, true).shard, Some(1));
        // The count from a ConfigMap; unset or unparsable is 0, as Go's ParseNumFromEnv.
        let referenced = serde_json::json!([{"name": "ARGOCD_CONTROLLER_REPLICAS",
            "valueFrom": {"configMapKeyRef": {"name": "params", "key": "replicas"}}}]);
        assert_eq!(read("c-1", &referenced, true).replicas, Some(4));
        assert_eq!(read("c-1", &serde_json::json!([]), true).replicas, Some(0));
        let odd = serde_json::json!([{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "three"}]);
        assert_eq!(read("c-1", &odd, true).replicas, Some(0));
        let mut deleting = controller_pod("c-1", literal, true);
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        assert!(statefulset_pod(&deleting, &cms).terminating);
    }

    #[test]
    fn a_dynamic_pod_has_its_claimed_shard_and_the_count_only_if_created_after_it_was_written() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                "shardControllerMapping".into(),
                r#"[{"ShardNumber":0,"ControllerName":"c-a","HeartbeatTime":"2026-12-06T10:00:00Z"},
                    {"ShardNumber":1,"ControllerName":"","HeartbeatTime":null},
                    {"ShardNumber":2,"ControllerName":"c-b","HeartbeatTime":"2026-12-06T10:00:00Z"}]"#
                    .into(),
            )])),
            ..ConfigMap::default()
        };
        let mapping = shard_mapping(&cm);
        assert_eq!(
            mapping,
            BTreeMap::from([("c-a".to_string(), 0), ("c-b".to_string(), 2)])
        );
        assert!(shard_mapping(&ConfigMap::default()).is_empty());
        let deployment: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
            serde_json::from_value(serde_json::json!({
                "creationTimestamp": "2026-12-06T09:00:00Z",
                "managedFields": [
                {"manager": "helm", "operation": "Update", "time": "2026-12-06T09:00:00Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "kubectl", "operation": "Update", "subresource": "scale",
                 "time": "2026-12-06T10:00:04Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "helm", "operation": "Update", "time": "2026-12-06T10:00:09Z",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}},
            ]}))
            .unwrap();
        let written = replicas_written(&deployment);
        let ReplicasWritten::At(at) = &written else {
            panic!("{written:?}")
        };
        assert_eq!(at.0.to_string(), "2026-12-06T10:00:04Z");
        // Written only when the Deployment was created: every pod reads that count.
        let mut created = deployment.clone();
        created.managed_fields.as_mut().unwrap().remove(1);
        assert_eq!(replicas_written(&created), ReplicasWritten::AtCreation);
        let mut same = controller_pod("c-a", serde_json::json!([]), true);
        same.metadata.creation_timestamp = created.creation_timestamp.clone();
        assert_eq!(
            dynamic_pod(&same, &mapping, 3, &ReplicasWritten::AtCreation).replicas,
            Some(3)
        );
        created.managed_fields = None;
        assert_eq!(replicas_written(&created), ReplicasWritten::Unknown);
        // Created at 10:00:05, after the count was written: it read 3.
        let env = serde_json::json!([]);
        let p = dynamic_pod(
            &controller_pod("c-b", env.clone(), true),
            &mapping,
            3,
            &written,
        );
        assert_eq!((p.shard, p.replicas), (Some(2), Some(3)));
        // Created in the same second, or before: its count cannot be told.
        let mut same = controller_pod("c-a", env.clone(), true);
        same.metadata.creation_timestamp = Some(at.clone());
        assert_eq!(dynamic_pod(&same, &mapping, 3, &written).replicas, None);
        assert_eq!(
            dynamic_pod(&same, &mapping, 3, &ReplicasWritten::Unknown).replicas,
            None
        );
        // A pod that claimed no shard serves none.
        let p = dynamic_pod(&controller_pod("c-c", env, true), &mapping, 3, &written);
        assert_eq!(p.shard, None);
    }

    fn with_flags(env: &str, command: &[&str], args: &[&str]) -> StatefulSet {
        let mut sts = statefulset(3, env);
        let container = &mut sts
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[1];
        container.command = Some(command.iter().map(|a| a.to_string()).collect());
        container.args = Some(args.iter().map(|a| a.to_string()).collect());
        sts
    }

    #[test]
    fn the_controllers_flags_win_over_its_variables_as_pflag_reads_them() {
        let env = r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"},
            {"name": "ARGOCD_CONTROLLER_SHARDING_ALGORITHM", "value": "legacy"},
            {"name": "ARGOCD_APPLICATION_NAMESPACES", "value": "from-env"}"#;
        // Flags in the command after the program and in the args; `--name value` and
        // `--name=value`; the last of a repeated flag wins, a slice's values add up.
        let sts = with_flags(
            env,
            &[
                "argocd-application-controller",
                "--sharding-method",
                "legacy",
            ],
            &[
                "--sharding-method=round-robin",
                "--application-namespaces=team-a,team-b",
                "--application-namespaces",
                "team-c",
                "--",
                "--sharding-method=consistent-hashing",
            ],
        );
        let flagged = read(&sts, &[]);
        assert_eq!(flagged.algorithm.value.1, "round-robin");
        assert!(
            flagged.algorithm.origin.contains("flag --sharding-method"),
            "{:?}",
            flagged.algorithm
        );
        assert_eq!(flagged.app_namespaces.value, ["team-a", "team-b", "team-c"]);
        assert!(
            flagged
                .app_namespaces
                .origin
                .contains("flag --application-namespaces")
        );
        assert!(!flagged.dynamic);
        // Without flags, the variables.
        let read_env = read(
            &with_flags(env, &["argocd-application-controller"], &[]),
            &[],
        );
        assert_eq!(read_env.algorithm.value.1, "legacy");
        assert_eq!(read_env.app_namespaces.value, ["from-env"]);
    }

    #[test]
    fn dynamic_distribution_is_on_by_its_flag_alone_and_off_by_an_explicit_false() {
        let on_env = r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"},
            {"name": "ARGOCD_ENABLE_DYNAMIC_CLUSTER_DISTRIBUTION", "value": "true"}"#;
        let off_env = r#"{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "3"}"#;
        let program = ["argocd-application-controller"];
        let flag_on = with_flags(
            off_env,
            &program,
            &["--dynamic-cluster-distribution-enabled"],
        );
        assert!(read(&flag_on, &[]).dynamic);
        // A boolean flag takes no separate value: "false" here is an argument, not its value.
        let separate = with_flags(
            off_env,
            &program,
            &["--dynamic-cluster-distribution-enabled", "false"],
        );
        assert!(read(&separate, &[]).dynamic);
        let flag_off = with_flags(
            on_env,
            &program,
            &["--dynamic-cluster-distribution-enabled=false"],
        );
        assert!(!read(&flag_off, &[]).dynamic);
        assert!(read(&with_flags(on_env, &program, &[]), &[]).dynamic);
    }
}
