//! A pod's volumes: what each holds, computed from the spec and what it references, and the
//! kubelet's atomic layout on disk, rewritten in place while a reader holds the old version.

// Test code: a fixture that does not parse fails the test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Volume};
use serde_json::json;
use shardwise_e2e_node::volumes::{Files, VolumeError, VolumeSources, contents, write_atomically};

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "shardwise-0", "namespace": "fleet", "uid": "u-0",
                     "labels": {"app": "shardwise", "shard": "0"}},
        "spec": {"containers": []}
    }))
    .unwrap()
}

fn volume(value: serde_json::Value) -> Volume {
    serde_json::from_value(value).unwrap()
}

struct Refs {
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    tokens: BTreeMap<String, String>,
}

impl Refs {
    fn new() -> Self {
        let root_ca: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----"}
        }))
        .unwrap();
        let tls: Secret = serde_json::from_value(json!({
            "metadata": {"name": "metrics-tls"}, "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}
        }))
        .unwrap();
        Self {
            config_maps: BTreeMap::from([("kube-root-ca.crt".into(), root_ca)]),
            secrets: BTreeMap::from([("metrics-tls".into(), tls)]),
            tokens: BTreeMap::from([(String::new(), "eyJhbGciOi".into())]),
        }
    }

    fn sources(&self) -> VolumeSources<'_> {
        VolumeSources {
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            tokens: &self.tokens,
        }
    }
}

fn text(files: &Files) -> Vec<(String, String, u32)> {
    files
        .iter()
        .map(|(p, (d, m))| {
            (
                p.display().to_string(),
                String::from_utf8_lossy(d).into_owned(),
                *m,
            )
        })
        .collect()
}

#[test]
fn the_injected_service_account_volume_holds_token_ca_and_namespace() {
    let refs = Refs::new();
    // As the ServiceAccount admission plugin injects it.
    let access = volume(
        json!({"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}),
    );
    let files = contents(&access, &pod(), &refs.sources()).unwrap().unwrap();
    assert_eq!(
        text(&files),
        [
            ("ca.crt".into(), "-----BEGIN CERTIFICATE-----".into(), 0o644),
            ("namespace".into(), "fleet".into(), 0o644),
            ("token".into(), "eyJhbGciOi".into(), 0o644),
        ]
    );
}

#[test]
fn config_maps_secrets_and_the_downward_api_become_files_as_specified() {
    let refs = Refs::new();
    let secret = volume(
        json!({"name": "tls", "secret": {"secretName": "metrics-tls", "defaultMode": 0o400,
        "items": [{"key": "tls.crt", "path": "certs/tls.crt", "mode": 0o444}, {"key": "tls.key", "path": "tls.key"}]}}),
    );
    assert_eq!(
        text(&contents(&secret, &pod(), &refs.sources()).unwrap().unwrap()),
        [
            ("certs/tls.crt".into(), "cert".into(), 0o444),
            ("tls.key".into(), "key".into(), 0o400)
        ]
    );
    let labels = volume(json!({"name": "info", "downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}));
    assert_eq!(
        text(&contents(&labels, &pod(), &refs.sources()).unwrap().unwrap()),
        [
            (
                "labels".into(),
                "app=\"shardwise\"\nshard=\"0\"".into(),
                0o644
            ),
            ("name".into(), "shardwise-0".into(), 0o644)
        ]
    );
    let optional = volume(json!({"name": "o", "configMap": {"name": "absent", "optional": true}}));
    assert_eq!(
        contents(&optional, &pod(), &refs.sources()).unwrap(),
        Some(Files::new())
    );
    let empty = volume(json!({"name": "scratch", "emptyDir": {}}));
    assert_eq!(contents(&empty, &pod(), &refs.sources()).unwrap(), None);
}

#[test]
fn what_a_kubelet_cannot_mount_is_refused_with_the_reason() {
    let refs = Refs::new();
    let refused = |v: serde_json::Value| contents(&volume(v), &pod(), &refs.sources()).unwrap_err();
    assert!(matches!(
        refused(json!({"name": "c", "configMap": {"name": "absent"}})),
        VolumeError::Missing { kind: "configmap", what, .. } if what == "is not found"
    ));
    assert!(matches!(
        refused(json!({"name": "s", "secret": {"secretName": "metrics-tls", "items": [{"key": "ca.crt", "path": "ca"}]}})),
        VolumeError::Missing { kind: "secret", what, .. } if what.contains("ca.crt")
    ));
    assert!(matches!(
        refused(json!({"name": "h", "hostPath": {"path": "/etc"}})),
        VolumeError::Unsupported(name) if name == "h"
    ));
    assert!(matches!(
        refused(
            json!({"name": "e", "secret": {"secretName": "metrics-tls", "items": [{"key": "tls.key", "path": "../escape"}]}})
        ),
        VolumeError::BadPath { .. }
    ));
    assert!(matches!(
        refused(json!({"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "vault"}}]}})),
        VolumeError::NoToken { audience, .. } if audience == "vault"
    ));
}

#[test]
fn a_rewrite_swaps_every_file_at_once_and_a_reader_keeps_the_version_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("kube-api-access");
    let files = |token: &str, extra: bool| {
        let mut files = Files::from([
            (PathBuf::from("token"), (token.as_bytes().to_vec(), 0o600)),
            (PathBuf::from("ca.crt"), (b"ca".to_vec(), 0o644)),
        ]);
        if extra {
            files.insert(PathBuf::from("sub/extra"), (b"x".to_vec(), 0o644));
        }
        files
    };
    write_atomically(&volume, &files("first", true), Some(4242)).unwrap();
    assert_eq!(
        std::fs::read_to_string(volume.join("token")).unwrap(),
        "first"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("sub/extra")).unwrap(),
        "x"
    );
    let meta = std::fs::metadata(volume.join("token")).unwrap();
    assert_eq!((meta.gid(), meta.mode() & 0o777), (4242, 0o640));
    assert_eq!(
        std::fs::read_link(volume.join("token")).unwrap(),
        PathBuf::from("..data/token")
    );
    let opened = std::fs::File::open(volume.join("token")).unwrap();

    write_atomically(&volume, &files("second", false), Some(4242)).unwrap();
    assert_eq!(
        std::fs::read_to_string(volume.join("token")).unwrap(),
        "second"
    );
    assert!(
        !volume.join("sub").exists(),
        "a removed entry's link is removed"
    );
    assert_eq!(std::io::read_to_string(opened).unwrap(), "first");
    // One data directory, `..data` and the visible links: nothing else is left.
    let mut names: Vec<String> = std::fs::read_dir(&volume)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    assert_eq!(&names[2..], ["ca.crt", "token"]);
    assert!(
        names[0].starts_with("..") && names[1] == "..data",
        "{names:?}"
    );
}
