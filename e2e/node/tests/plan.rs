//! A pod spec in, each container's program, argv, environment, mounts and user out: what the
//! node agent would start, checked without a control plane.

// Test code: a fixture that does not parse fails the test.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::json;
use shardwise_e2e_node::{
    Image, ImageTable, Launch, Mount, NodeFacts, PlanError, PodContext, Programs, User, plan,
};

fn images() -> ImageTable {
    let mut table = ImageTable::default();
    table.insert(
        "ghcr.io/shardwise/shardwise",
        Image {
            entrypoint: vec!["/usr/local/bin/shardwise-controller".into()],
            cmd: Vec::new(),
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("HOME".into(), "/home/nonroot".into()),
            ],
            uid: 65532,
            gid: 65532,
            working_dir: "/".into(),
            programs: Programs::Files(BTreeMap::from([
                (
                    "/usr/local/bin/shardwise-controller".into(),
                    "/build/shardwise-controller".into(),
                ),
                (
                    "/usr/local/bin/shardwise-balancer".into(),
                    "/build/shardwise-balancer".into(),
                ),
            ])),
        },
    );
    table.insert(
        "busybox",
        Image {
            entrypoint: Vec::new(),
            cmd: vec!["sh".into()],
            env: vec![("PATH".into(), "/bin".into())],
            uid: 0,
            gid: 0,
            working_dir: "/".into(),
            programs: Programs::MultiCall {
                program: "/usr/bin/busybox".into(),
                applets: vec!["sh".into(), "wget".into()],
            },
        },
    );
    table
}

/// A pod as the StatefulSet controller creates it from the chart's template, after admission
/// injected the ServiceAccount token volume.
fn replica() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "shardwise-2", "namespace": "fleet", "uid": "u-2",
                     "labels": {"app.kubernetes.io/name": "shardwise"}},
        "spec": {
            "serviceAccountName": "shardwise",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
            "containers": [{
                "name": "controller",
                "image": "ghcr.io/shardwise/shardwise:0.1.0",
                "args": ["--shard-of=$(POD_NAME)", "--literal=$$(POD_NAME)"],
                "envFrom": [{"configMapRef": {"name": "tuning"}, "prefix": "TUNE_"}],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app.kubernetes.io/name']"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MEMORY_MIB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                    {"name": "ABSENT", "valueFrom": {"configMapKeyRef": {"name": "tuning", "key": "nope", "optional": true}}},
                    {"name": "TUNE_WORKERS", "value": "16"},
                    {"name": "GREETING", "value": "$(POD_NAME) in $(POD_NAMESPACE), $(UNSET)"}
                ],
                "resources": {"limits": {"memory": "512Mi"}, "requests": {"cpu": "100m"}},
                "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
                "volumeMounts": [
                    {"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                    {"name": "audit", "mountPath": "/var/log/shardwise"},
                    {"name": "audit", "mountPath": "/tmp/one-file", "subPath": "file"}
                ]
            }],
            "volumes": [
                {"name": "kube-api-access-x", "projected": {"sources": []}},
                {"name": "audit", "emptyDir": {}}
            ]
        }
    }))
    .unwrap()
}

struct Fixture {
    node: NodeFacts,
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    service_env: Vec<(String, String)>,
}

impl Fixture {
    fn new() -> Self {
        let tuning: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "tuning"}, "data": {"WORKERS": "8", "QPS": "50"}
        }))
        .unwrap();
        let creds: Secret = serde_json::from_value(json!({
            "metadata": {"name": "creds"}, "data": {"token": "czNjcjN0"}
        }))
        .unwrap();
        Self {
            node: NodeFacts {
                name: "node-0".into(),
                host_ip: "10.244.3.1".into(),
                allocatable_cpu: "16".into(),
                allocatable_memory: "64Gi".into(),
            },
            config_maps: BTreeMap::from([("tuning".into(), tuning)]),
            secrets: BTreeMap::from([("creds".into(), creds)]),
            service_env: vec![
                ("KUBERNETES_SERVICE_HOST".into(), "10.244.3.1".into()),
                ("KUBERNETES_SERVICE_PORT".into(), "40123".into()),
            ],
        }
    }

    fn context(&self) -> PodContext<'_> {
        PodContext {
            node: &self.node,
            pod_ip: Some("10.244.3.12"),
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            service_env: &self.service_env,
            volumes_dir: Path::new("/pods/u-2/volumes"),
            hosts_file: Some(Path::new("/pods/u-2/hosts")),
            network_namespace: Some(Path::new("/proc/7/fd/9")),
        }
    }

    fn plan(&self, pod: &Pod) -> Result<Launch, PlanError> {
        let container = &pod.spec.as_ref().unwrap().containers[0];
        plan(pod, container, &images(), &self.context())
    }
}

fn env_of(launch: &Launch) -> Vec<(&str, &str)> {
    launch
        .env
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

#[test]
fn a_replica_of_the_chart_starts_as_its_kubelet_would_start_it() {
    let launch = Fixture::new().plan(&replica()).unwrap();
    assert_eq!(launch.program, PathBuf::from("/build/shardwise-controller"));
    assert_eq!(
        launch.argv,
        [
            "/usr/local/bin/shardwise-controller",
            "--shard-of=shardwise-2",
            "--literal=$(POD_NAME)"
        ]
    );
    assert_eq!(
        env_of(&launch),
        [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("HOME", "/home/nonroot"),
            ("KUBERNETES_SERVICE_HOST", "10.244.3.1"),
            ("KUBERNETES_SERVICE_PORT", "40123"),
            ("TUNE_QPS", "50"),
            ("TUNE_WORKERS", "16"),
            ("POD_NAME", "shardwise-2"),
            ("POD_NAMESPACE", "fleet"),
            ("APP", "shardwise"),
            ("POD_IP", "10.244.3.12"),
            ("MEMORY_MIB", "512"),
            ("CPU_LIMIT", "16"),
            ("TOKEN", "s3cr3t"),
            ("GREETING", "shardwise-2 in fleet, $(UNSET)"),
            ("HOSTNAME", "shardwise-2"),
        ]
    );
    assert_eq!(
        launch.mounts,
        [
            Mount {
                source: "/pods/u-2/volumes/kube-api-access-x".into(),
                target: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                read_only: true,
            },
            Mount {
                source: "/pods/u-2/volumes/audit".into(),
                target: "/var/log/shardwise".into(),
                read_only: false,
            },
            Mount {
                source: "/pods/u-2/volumes/audit/file".into(),
                target: "/tmp/one-file".into(),
                read_only: false,
            },
            Mount {
                source: "/pods/u-2/hosts".into(),
                target: "/etc/hosts".into(),
                read_only: false
            },
        ]
    );
    assert_eq!(
        launch.user,
        User {
            uid: 65532,
            gid: 65532,
            groups: vec![65532]
        }
    );
    assert_eq!(launch.hostname, "shardwise-2");
    assert!(launch.read_only_root);
    assert!(launch.no_new_privs);
    assert_eq!(
        launch.network_namespace,
        Some(PathBuf::from("/proc/7/fd/9"))
    );
    assert_eq!(launch.working_dir, PathBuf::from("/"));
}

#[test]
fn command_replaces_the_entrypoint_and_drops_the_image_cmd() {
    let fixture = Fixture::new();
    let mut pod = replica();
    let container = &mut pod.spec.as_mut().unwrap().containers[0];
    container.command = Some(vec!["shardwise-balancer".into()]);
    container.args = None;
    let launch = fixture.plan(&pod).unwrap();
    assert_eq!(launch.program, PathBuf::from("/build/shardwise-balancer"));
    assert_eq!(launch.argv, ["shardwise-balancer"]);

    // busybox: no ENTRYPOINT, CMD `sh`; `command` runs an applet under its own name.
    let test: Pod = serde_json::from_value(json!({
        "metadata": {"name": "t", "namespace": "fleet"},
        "spec": {"containers": [{"name": "t", "image": "busybox:1.37",
                                 "command": ["sh", "-c"], "args": ["wget -qO- $(URL)"],
                                 "env": [{"name": "URL", "value": "http://x/readyz"}]}]}
    }))
    .unwrap();
    let launch = fixture.plan(&test).unwrap();
    assert_eq!(launch.program, PathBuf::from("/usr/bin/busybox"));
    assert_eq!(launch.argv, ["sh", "-c", "wget -qO- http://x/readyz"]);
    assert_eq!(
        launch.user,
        User {
            uid: 0,
            gid: 0,
            groups: vec![]
        }
    );
    // No security context: a writable root, privileges as the image has them.
    assert!(!launch.read_only_root && !launch.no_new_privs);
}

#[test]
fn what_a_kubelet_refuses_to_start_is_refused_with_the_reason() {
    let fixture = Fixture::new();
    let refused = |edit: &dyn Fn(&mut Pod)| {
        let mut pod = replica();
        edit(&mut pod);
        fixture.plan(&pod).unwrap_err()
    };
    fn container(pod: &mut Pod) -> &mut k8s_openapi::api::core::v1::Container {
        &mut pod.spec.as_mut().unwrap().containers[0]
    }
    assert!(matches!(
        refused(&|p| container(p).image = Some("nginx:1".into())),
        PlanError::UnknownImage { image, known } if image == "nginx:1" && known.contains("busybox")
    ));
    assert!(matches!(
        refused(&|p| container(p).command = Some(vec!["/bin/bash".into()])),
        PlanError::UnknownCommand { .. }
    ));
    assert!(matches!(
        refused(&|p| p
            .spec
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .run_as_user = Some(0)),
        PlanError::RootNotAllowed
    ));
    assert!(matches!(
        refused(&|p| container(p).env_from.as_mut().unwrap()[0]
            .config_map_ref
            .as_mut()
            .unwrap()
            .name = "gone".into()),
        PlanError::MissingReference {
            kind: "configmap",
            ..
        }
    ));
    assert!(matches!(
        refused(&|p| container(p).volume_mounts.as_mut().unwrap()[1].name = "nowhere".into()),
        PlanError::UnknownVolume(name) if name == "nowhere"
    ));
    let bad_field = refused(&|p| {
        container(p).env.as_mut().unwrap()[0]
            .value_from
            .as_mut()
            .unwrap()
            .field_ref
            .as_mut()
            .unwrap()
            .field_path = "spec.priority".into();
    });
    assert_eq!(
        bad_field,
        PlanError::UnsupportedField("spec.priority".into())
    );
}
