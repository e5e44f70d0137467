//! From a pod spec to a [`Launch`] per container, as a kubelet and its container runtime
//! would start it: the command and args against the image's ENTRYPOINT and CMD, the
//! environment in the kubelet's order (the image's, the cluster's service variables, `envFrom`,
//! then `env` with `$(VAR)` expansion and the downward API), the volume mounts, the user from
//! the security contexts. Pure: what the pod references (ConfigMaps, Secrets, its IP) comes in
//! a [`PodContext`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVarSource, ObjectFieldSelector, Pod, PodSecurityContext,
    ResourceFieldSelector, Secret, SecurityContext,
};

use crate::expand::expand;
use crate::image::ImageTable;
use crate::launch::{Launch, Mount, User};
use crate::quantity::{divide_up, parse_milli};

/// Why a container cannot start. The kubelet reports the first as `ErrImagePull` and every
/// other as `CreateContainerConfigError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The image is not in the agent's table.
    #[error("image {image:?} is not one this node can run (it runs {known})")]
    UnknownImage {
        /// The pod's `image`.
        image: String,
        /// The repositories the table has.
        known: String,
    },
    /// The command is not a program of the image.
    #[error("{command:?} is not a program of image {image:?}")]
    UnknownCommand {
        /// The command as resolved.
        command: String,
        /// The image.
        image: String,
    },
    /// Neither the container nor the image gives a command.
    #[error("no command: neither the container nor image {0:?} gives one")]
    NoCommand(String),
    /// A ConfigMap or Secret (or a key of it) that is referenced and not optional is missing.
    #[error("{kind} {name:?} {what}")]
    MissingReference {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// What is missing of it.
        what: String,
    },
    /// A downward-API field or resource the agent does not know.
    #[error("unsupported downward API reference {0:?}")]
    UnsupportedField(String),
    /// A quantity that cannot be read.
    #[error("invalid quantity {0:?}")]
    InvalidQuantity(String),
    /// A volume mount of a volume the pod does not have.
    #[error("volume mount {0:?} names no volume of the pod")]
    UnknownVolume(String),
    /// `runAsNonRoot` with a user of 0, which the kubelet refuses to start.
    #[error("container has runAsNonRoot and its user is root (uid 0)")]
    RootNotAllowed,
    /// The pod is missing something every pod has once created (its name, a spec).
    #[error("pod is incomplete: {0}")]
    Incomplete(&'static str),
}

/// What a node knows about itself, for the downward API and the resource defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// The Node's name.
    pub name: String,
    /// Its address (`status.hostIP`).
    pub host_ip: String,
    /// Allocatable CPU, what an unset CPU limit reads as.
    pub allocatable_cpu: String,
    /// Allocatable memory, what an unset memory limit reads as.
    pub allocatable_memory: String,
}

/// Everything outside the pod spec that its containers' start depends on.
#[derive(Clone, Debug)]
pub struct PodContext<'a> {
    /// The node the pod runs on.
    pub node: &'a NodeFacts,
    /// The pod's IP, once its sandbox has one.
    pub pod_ip: Option<&'a str>,
    /// The ConfigMaps of the pod's namespace that it references, by name.
    pub config_maps: &'a BTreeMap<String, ConfigMap>,
    /// The Secrets of the pod's namespace that it references, by name.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// The variables every container gets for the cluster's `kubernetes` Service
    /// (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`, ...).
    pub service_env: &'a [(String, String)],
    /// Where the pod's volumes are on the host: `<dir>/<volume name>`.
    pub volumes_dir: &'a Path,
    /// A file to mount at `/etc/hosts`, if the agent keeps one.
    pub hosts_file: Option<&'a Path>,
    /// The pod's network namespace, if it has its own.
    pub network_namespace: Option<&'a Path>,
}

/// The [`Launch`] of container `container` of `pod`.
pub fn plan(
    pod: &Pod,
    container: &Container,
    images: &ImageTable,
    context: &PodContext<'_>,
) -> Result<Launch, PlanError> {
    let spec = pod.spec.as_ref().ok_or(PlanError::Incomplete("no spec"))?;
    let name = pod
        .metadata
        .name
        .as_deref()
        .ok_or(PlanError::Incomplete("no name"))?;
    let reference = container.image.as_deref().unwrap_or_default();
    let image = images
        .get(reference)
        .ok_or_else(|| PlanError::UnknownImage {
            image: reference.to_string(),
            known: images.repositories().collect::<Vec<_>>().join(", "),
        })?;

    let env = environment(pod, container, context)?;
    let lookup = |var: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == var)
            .map(|(_, v)| v.clone())
    };
    // `command` replaces the ENTRYPOINT and drops the CMD; `args` replaces the CMD.
    let (command, args) = match (&container.command, &container.args) {
        (Some(command), args) if !command.is_empty() => {
            (command.clone(), args.clone().unwrap_or_default())
        }
        (_, Some(args)) if !args.is_empty() => (image.entrypoint.clone(), args.clone()),
        _ => (image.entrypoint.clone(), image.cmd.clone()),
    };
    let mut words: Vec<String> = command
        .iter()
        .chain(&args)
        .map(|word| expand(word, lookup))
        .collect();
    if words.is_empty() {
        return Err(PlanError::NoCommand(reference.to_string()));
    }
    let (program, arg0) = image
        .resolve(&words[0])
        .ok_or_else(|| PlanError::UnknownCommand {
            command: words[0].clone(),
            image: reference.to_string(),
        })?;
    words[0] = arg0;

    // The image's environment first; the container's own values override it.
    let mut full_env: Vec<(String, String)> = image
        .env
        .iter()
        .filter(|(n, _)| !env.iter().any(|(m, _)| m == n))
        .cloned()
        .collect();
    full_env.extend(env.iter().cloned());
    let hostname = spec
        .hostname
        .clone()
        .unwrap_or_else(|| name.chars().take(63).collect());
    if !full_env.iter().any(|(n, _)| n == "HOSTNAME") {
        full_env.push(("HOSTNAME".into(), hostname.clone()));
    }
    if !full_env.iter().any(|(n, _)| n == "HOME") {
        full_env.push(("HOME".into(), "/".into()));
    }

    let user = user(
        spec.security_context.as_ref(),
        container.security_context.as_ref(),
        image,
    )?;
    let container_security = container.security_context.as_ref();
    Ok(Launch {
        program,
        argv: words,
        env: full_env,
        mounts: mounts(pod, container, context)?,
        hostname,
        user,
        working_dir: container
            .working_dir
            .as_ref()
            .map_or_else(|| image.working_dir.clone(), PathBuf::from),
        read_only_root: container_security
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        no_new_privs: container_security
            .and_then(|s| s.allow_privilege_escalation)
            .is_some_and(|allowed| !allowed),
        network_namespace: context.network_namespace.map(Path::to_path_buf),
    })
}

/// The container's environment without the image's: the service variables, `envFrom`, then
/// `env`, later names replacing earlier ones in place.
fn environment(
    pod: &Pod,
    container: &Container,
    context: &PodContext<'_>,
) -> Result<Vec<(String, String)>, PlanError> {
    let mut env: Vec<(String, String)> = context.service_env.to_vec();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| match env
        .iter_mut()
        .find(|(n, _)| *n == name)
    {
        Some(slot) => slot.1 = value,
        None => env.push((name, value)),
    };
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.as_deref().unwrap_or_default();
        let data: BTreeMap<String, String> = if let Some(r) = &source.config_map_ref {
            match context.config_maps.get(&r.name) {
                Some(map) => map.data.clone().unwrap_or_default(),
                None if r.optional == Some(true) => BTreeMap::new(),
                None => return Err(missing("configmap", &r.name, "is not found")),
            }
        } else if let Some(r) = &source.secret_ref {
            match context.secrets.get(&r.name) {
                Some(secret) => secret_strings(secret),
                None if r.optional == Some(true) => BTreeMap::new(),
                None => return Err(missing("secret", &r.name, "is not found")),
            }
        } else {
            BTreeMap::new()
        };
        for (key, value) in data {
            set(&mut env, format!("{prefix}{key}"), value);
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value_from, &var.value) {
            (Some(source), _) => match value_from(source, pod, container, context)? {
                Some(value) => value,
                None => continue,
            },
            (None, value) => {
                let current = env.clone();
                expand(value.as_deref().unwrap_or_default(), |name| {
                    current
                        .iter()
                        .rev()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                })
            }
        };
        set(&mut env, var.name.clone(), value);
    }
    Ok(env)
}

fn missing(kind: &'static str, name: &str, what: &str) -> PlanError {
    PlanError::MissingReference {
        kind,
        name: name.to_string(),
        what: what.to_string(),
    }
}

fn secret_strings(secret: &Secret) -> BTreeMap<String, String> {
    crate::volumes::secret_data(secret)
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// The value of an `env[].valueFrom`; `None` for an optional reference that is missing (the
/// variable is then not set).
fn value_from(
    source: &EnvVarSource,
    pod: &Pod,
    container: &Container,
    context: &PodContext<'_>,
) -> Result<Option<String>, PlanError> {
    if let Some(field) = &source.field_ref {
        return field_value(field, pod, context).map(Some);
    }
    if let Some(resource) = &source.resource_field_ref {
        return resource_value(resource, pod, container, context).map(Some);
    }
    if let Some(key) = &source.config_map_key_ref {
        let optional = key.optional == Some(true);
        let value = match context.config_maps.get(&key.name) {
            Some(map) => map
                .data
                .as_ref()
                .and_then(|d| d.get(&key.key))
                .cloned()
                .ok_or_else(|| {
                    missing("configmap", &key.name, &format!("has no key {:?}", key.key))
                }),
            None => Err(missing("configmap", &key.name, "is not found")),
        };
        return optional_value(value, optional);
    }
    if let Some(key) = &source.secret_key_ref {
        let optional = key.optional == Some(true);
        let value = match context.secrets.get(&key.name) {
            Some(secret) => secret_strings(secret)
                .remove(&key.key)
                .ok_or_else(|| missing("secret", &key.name, &format!("has no key {:?}", key.key))),
            None => Err(missing("secret", &key.name, "is not found")),
        };
        return optional_value(value, optional);
    }
    Err(PlanError::UnsupportedField(
        "valueFrom without a source".into(),
    ))
}

fn optional_value(
    value: Result<String, PlanError>,
    optional: bool,
) -> Result<Option<String>, PlanError> {
    match value {
        Ok(value) => Ok(Some(value)),
        Err(_) if optional => Ok(None),
        Err(e) => Err(e),
    }
}

/// A `fieldRef`, as the kubelet resolves it (a field not set yet reads as empty).
fn field_value(
    field: &ObjectFieldSelector,
    pod: &Pod,
    context: &PodContext<'_>,
) -> Result<String, PlanError> {
    let path = field.field_path.as_str();
    let meta = &pod.metadata;
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        let key = path
            .strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key)).cloned())
    };
    let value = match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => Some(context.node.name.clone()),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        "status.hostIP" | "status.hostIPs" => Some(context.node.host_ip.clone()),
        "status.podIP" | "status.podIPs" => context.pod_ip.map(str::to_string),
        _ => keyed("metadata.labels", &meta.labels)
            .or_else(|| keyed("metadata.annotations", &meta.annotations))
            .ok_or_else(|| PlanError::UnsupportedField(path.to_string()))?,
    };
    Ok(value.unwrap_or_default())
}

/// A `resourceFieldRef`: the container's limit or request divided by the divisor, rounded up;
/// an unset limit reads as the node's allocatable amount, an unset request as 0.
fn resource_value(
    selector: &ResourceFieldSelector,
    pod: &Pod,
    container: &Container,
    context: &PodContext<'_>,
) -> Result<String, PlanError> {
    let target = match selector.container_name.as_deref() {
        None | Some("") => container,
        Some(name) => pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == name))
            .ok_or_else(|| PlanError::UnsupportedField(format!("container {name}")))?,
    };
    let (kind, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| PlanError::UnsupportedField(selector.resource.clone()))?;
    let resources = target.resources.as_ref();
    let set = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err(PlanError::UnsupportedField(selector.resource.clone())),
    };
    let fallback = match (kind, resource) {
        ("limits", "cpu") => context.node.allocatable_cpu.as_str(),
        ("limits", "memory") => context.node.allocatable_memory.as_str(),
        ("requests", "cpu" | "memory") => "0",
        _ => return Err(PlanError::UnsupportedField(selector.resource.clone())),
    };
    let quantity = set
        .and_then(|s| s.get(resource))
        .map_or(fallback, |q| q.0.as_str());
    let divisor = selector.divisor.as_ref().map_or("1", |d| d.0.as_str());
    let value = parse_milli(quantity).ok_or_else(|| PlanError::InvalidQuantity(quantity.into()))?;
    let divisor_value =
        parse_milli(divisor).ok_or_else(|| PlanError::InvalidQuantity(divisor.into()))?;
    divide_up(value, divisor_value)
        .map(|v| v.to_string())
        .ok_or_else(|| PlanError::InvalidQuantity(divisor.into()))
}

/// The container's bind mounts: each `volumeMount` from the pod's volume directory (a
/// `subPath` inside it), then `/etc/hosts` when the agent keeps one.
fn mounts(
    pod: &Pod,
    container: &Container,
    context: &PodContext<'_>,
) -> Result<Vec<Mount>, PlanError> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .map(|v| v.iter().map(|v| v.name.as_str()).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        if !volumes.contains(&mount.name.as_str()) {
            return Err(PlanError::UnknownVolume(mount.name.clone()));
        }
        let mut source = context.volumes_dir.join(&mount.name);
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            source = source.join(sub);
        }
        mounts.push(Mount {
            source,
            target: PathBuf::from(&mount.mount_path),
            read_only: mount.read_only.unwrap_or(false),
        });
    }
    if let Some(hosts) = context.hosts_file
        && !mounts.iter().any(|m| m.target == Path::new("/etc/hosts"))
    {
        mounts.push(Mount {
            source: hosts.to_path_buf(),
            target: "/etc/hosts".into(),
            read_only: false,
        });
    }
    Ok(mounts)
}

/// The user from the container's security context, else the pod's, else the image's; groups
/// from the pod's `fsGroup` and `supplementalGroups`.
fn user(
    pod: Option<&PodSecurityContext>,
    container: Option<&SecurityContext>,
    image: &crate::image::Image,
) -> Result<User, PlanError> {
    let pick = |from_container: Option<i64>, from_pod: Option<i64>| from_container.or(from_pod);
    let id =
        |v: Option<i64>, default: u32| v.and_then(|v| u32::try_from(v).ok()).unwrap_or(default);
    let uid = id(
        pick(
            container.and_then(|c| c.run_as_user),
            pod.and_then(|p| p.run_as_user),
        ),
        image.uid,
    );
    let gid = id(
        pick(
            container.and_then(|c| c.run_as_group),
            pod.and_then(|p| p.run_as_group),
        ),
        image.gid,
    );
    let non_root = container
        .and_then(|c| c.run_as_non_root)
        .or(pod.and_then(|p| p.run_as_non_root))
        .unwrap_or(false);
    if non_root && uid == 0 {
        return Err(PlanError::RootNotAllowed);
    }
    let mut groups: Vec<u32> = pod
        .and_then(|p| p.fs_group)
        .into_iter()
        .chain(
            pod.and_then(|p| p.supplemental_groups.clone())
                .into_iter()
                .flatten(),
        )
        .filter_map(|g| u32::try_from(g).ok())
        .collect();
    groups.dedup();
    Ok(User { uid, gid, groups })
}
