//! A pod's volumes on the host, as the kubelet keeps them: the files of a ConfigMap, Secret,
//! downward-API or projected volume (the ServiceAccount token of `kube-api-access-*`
//! included) computed from the pod spec and what it references ([`contents`], pure), and
//! written by [`write_atomically`] the way the kubelet's AtomicWriter does, so that a process
//! reading a file while the agent refreshes it (a token every hour) sees the old or the new
//! version, never a mix: the files live in a timestamped directory that a `..data` symlink
//! names, and each visible name is a link through `..data`.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, Volume, VolumeProjection,
};

/// A volume's files: relative path to contents and mode.
pub type Files = BTreeMap<PathBuf, (Vec<u8>, u32)>;

/// Why a volume cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// A ConfigMap or Secret (or one of its keys) that is referenced and not optional.
    #[error("volume {volume:?}: {kind} {name:?} {what}")]
    Missing {
        /// The volume.
        volume: String,
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// What is missing of it.
        what: String,
    },
    /// A volume type the agent does not provide (hostPath, a claim, ...).
    #[error(
        "volume {0:?}: only emptyDir, configMap, secret, downwardAPI and projected volumes are supported"
    )]
    Unsupported(String),
    /// A token the agent has not requested.
    #[error("volume {volume:?}: no ServiceAccount token for audience {audience:?}")]
    NoToken {
        /// The volume.
        volume: String,
        /// The audience (empty: the API server's).
        audience: String,
    },
    /// A path that would leave the volume.
    #[error("volume {volume:?}: path {path:?} must be relative and stay inside the volume")]
    BadPath {
        /// The volume.
        volume: String,
        /// The path.
        path: String,
    },
    /// A downward-API item the agent cannot resolve.
    #[error("volume {volume:?}: {reason}")]
    DownwardApi {
        /// The volume.
        volume: String,
        /// Why.
        reason: String,
    },
}

/// What a volume's contents come from besides the pod spec.
#[derive(Clone, Debug)]
pub struct VolumeSources<'a> {
    /// The referenced ConfigMaps of the pod's namespace, by name.
    pub config_maps: &'a BTreeMap<String, ConfigMap>,
    /// The referenced Secrets of the pod's namespace, by name.
    pub secrets: &'a BTreeMap<String, Secret>,
    /// ServiceAccount tokens by audience (empty: the API server's own).
    pub tokens: &'a BTreeMap<String, String>,
}

/// The kubelet's default file mode (`defaultMode`).
const DEFAULT_MODE: u32 = 0o644;

fn mode(mode: Option<i32>, default: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok()).unwrap_or(default)
}

/// The files of `volume`; `None` for an `emptyDir` (a plain directory the pod writes).
pub fn contents(
    volume: &Volume,
    pod: &Pod,
    sources: &VolumeSources<'_>,
) -> Result<Option<Files>, VolumeError> {
    let name = volume.name.as_str();
    let mut files = Files::new();
    if volume.empty_dir.is_some() {
        return Ok(None);
    } else if let Some(cm) = &volume.config_map {
        let default = mode(cm.default_mode, DEFAULT_MODE);
        add_config_map(
            &mut files,
            name,
            &cm.name,
            cm.items.as_deref(),
            cm.optional,
            default,
            sources,
        )?;
    } else if let Some(secret) = &volume.secret {
        let default = mode(secret.default_mode, DEFAULT_MODE);
        let secret_name = secret.secret_name.clone().unwrap_or_default();
        add_secret(
            &mut files,
            name,
            &secret_name,
            secret.items.as_deref(),
            secret.optional,
            default,
            sources,
        )?;
    } else if let Some(downward) = &volume.downward_api {
        let default = mode(downward.default_mode, DEFAULT_MODE);
        add_downward(
            &mut files,
            name,
            downward.items.as_deref().unwrap_or_default(),
            default,
            pod,
        )?;
    } else if let Some(projected) = &volume.projected {
        let default = mode(projected.default_mode, DEFAULT_MODE);
        for source in projected.sources.iter().flatten() {
            add_projection(&mut files, name, source, default, pod, sources)?;
        }
    } else {
        return Err(VolumeError::Unsupported(name.to_string()));
    }
    Ok(Some(files))
}

fn add_projection(
    files: &mut Files,
    volume: &str,
    source: &VolumeProjection,
    default: u32,
    pod: &Pod,
    sources: &VolumeSources<'_>,
) -> Result<(), VolumeError> {
    if let Some(token) = &source.service_account_token {
        let audience = token.audience.clone().unwrap_or_default();
        let value = sources
            .tokens
            .get(&audience)
            .ok_or_else(|| VolumeError::NoToken {
                volume: volume.to_string(),
                audience: audience.clone(),
            })?;
        insert(
            files,
            volume,
            &token.path,
            value.as_bytes().to_vec(),
            default,
        )?;
    }
    if let Some(cm) = &source.config_map {
        add_config_map(
            files,
            volume,
            &cm.name,
            cm.items.as_deref(),
            cm.optional,
            default,
            sources,
        )?;
    }
    if let Some(secret) = &source.secret {
        add_secret(
            files,
            volume,
            &secret.name,
            secret.items.as_deref(),
            secret.optional,
            default,
            sources,
        )?;
    }
    if let Some(downward) = &source.downward_api {
        add_downward(
            files,
            volume,
            downward.items.as_deref().unwrap_or_default(),
            default,
            pod,
        )?;
    }
    Ok(())
}

fn insert(
    files: &mut Files,
    volume: &str,
    path: &str,
    data: Vec<u8>,
    mode: u32,
) -> Result<(), VolumeError> {
    let relative = Path::new(path);
    let inside = !path.is_empty()
        && relative
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(n) if !n.to_string_lossy().starts_with("..")));
    if !inside {
        return Err(VolumeError::BadPath {
            volume: volume.to_string(),
            path: path.to_string(),
        });
    }
    files.insert(relative.to_path_buf(), (data, mode));
    Ok(())
}

/// A ConfigMap's or Secret's keys into files: all keys, or only `items` under their paths.
fn add_keys(
    files: &mut Files,
    volume: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default: u32,
    (kind, name): (&'static str, &str),
) -> Result<(), VolumeError> {
    let missing = |what: String| VolumeError::Missing {
        volume: volume.to_string(),
        kind,
        name: name.to_string(),
        what,
    };
    let Some(data) = data else {
        return if optional == Some(true) {
            Ok(())
        } else {
            Err(missing("is not found".into()))
        };
    };
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                match data.get(&item.key) {
                    Some(value) => insert(
                        files,
                        volume,
                        &item.path,
                        value.clone(),
                        mode(item.mode, default),
                    )?,
                    None if optional == Some(true) => {}
                    None => return Err(missing(format!("has no key {:?}", item.key))),
                }
            }
        }
        _ => {
            for (key, value) in data {
                insert(files, volume, &key, value, default)?;
            }
        }
    }
    Ok(())
}

/// A ConfigMap's keys and values (`data`, then `binaryData`), as bytes.
pub(crate) fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let text = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
    let binary = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()));
    text.chain(binary).collect()
}

/// A Secret's keys and values (`data`, then `stringData`, which wins as the server does), as
/// bytes.
pub(crate) fn secret_data(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()));
    let strings = secret
        .string_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()));
    data.chain(strings).collect()
}

fn add_config_map(
    files: &mut Files,
    volume: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default: u32,
    sources: &VolumeSources<'_>,
) -> Result<(), VolumeError> {
    let data = sources.config_maps.get(name).map(config_map_data);
    add_keys(
        files,
        volume,
        data,
        items,
        optional,
        default,
        ("configmap", name),
    )
}

fn add_secret(
    files: &mut Files,
    volume: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default: u32,
    sources: &VolumeSources<'_>,
) -> Result<(), VolumeError> {
    let data = sources.secrets.get(name).map(secret_data);
    add_keys(
        files,
        volume,
        data,
        items,
        optional,
        default,
        ("secret", name),
    )
}

/// Downward-API files: the pod's name, namespace, uid, labels and annotations.
fn add_downward(
    files: &mut Files,
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default: u32,
    pod: &Pod,
) -> Result<(), VolumeError> {
    let meta = &pod.metadata;
    let lines = |map: &Option<BTreeMap<String, String>>| {
        map.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for item in items {
        let Some(field) = &item.field_ref else {
            return Err(VolumeError::DownwardApi {
                volume: volume.to_string(),
                reason: format!("{}: only fieldRef items are supported", item.path),
            });
        };
        let value = match field.field_path.as_str() {
            "metadata.name" => meta.name.clone().unwrap_or_default(),
            "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
            "metadata.uid" => meta.uid.clone().unwrap_or_default(),
            "metadata.labels" => lines(&meta.labels),
            "metadata.annotations" => lines(&meta.annotations),
            other => {
                return Err(VolumeError::DownwardApi {
                    volume: volume.to_string(),
                    reason: format!("unsupported field {other:?}"),
                });
            }
        };
        insert(
            files,
            volume,
            &item.path,
            value.into_bytes(),
            mode(item.mode, default),
        )?;
    }
    Ok(())
}

/// Writes `files` into `dir` as the kubelet's AtomicWriter does (see the module's doc),
/// replacing what an earlier call wrote; `group` (the pod's `fsGroup`) owns every file and
/// may read it.
pub fn write_atomically(dir: &Path, files: &Files, group: Option<u32>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let data_name = format!("..{stamp}");
    let data = dir.join(&data_name);
    std::fs::create_dir(&data)?;
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755))?;
    for (path, (contents, mode)) in files {
        let file = data.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, contents)?;
        let mode = if group.is_some() { mode | 0o040 } else { *mode };
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(&file, None, Some(gid))?;
        }
    }
    // Swap `..data` to the new directory in one rename.
    let link = dir.join("..data");
    let previous = std::fs::read_link(&link).ok();
    let staged = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&staged);
    symlink(&data_name, &staged)?;
    std::fs::rename(&staged, &link)?;
    // The visible names: one link per top-level entry, through `..data`.
    let top: std::collections::BTreeSet<_> = files
        .keys()
        .filter_map(|p| p.components().next())
        .map(|c| c.as_os_str().to_owned())
        .collect();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("..") && !top.contains(&name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    for name in &top {
        let visible = dir.join(name);
        if std::fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new("..data").join(name), &visible)?;
        }
    }
    if let Some(previous) = previous
        && previous != Path::new(&data_name)
    {
        std::fs::remove_dir_all(dir.join(previous))?;
    }
    Ok(())
}
