//! What the balancer's end-to-end tests share: Argo CD's objects on a real kube-apiserver, the
//! controller pods as a kubelet would report them, and balancer processes.

use std::path::Path;
use std::time::Duration;

use kube::Api;
use shardwise_e2e::argocd::{APPLICATION_CRD, application, cluster_secret};
use shardwise_e2e::{Environment, Process, ProcessSpec, free_port};

pub const REPLICAS: u64 = 3;
/// Apps of each ordinary cluster.
pub const APPS: u64 = 10;
/// How long a phase may take to settle: passes run every second.
pub const SETTLE: Duration = Duration::from_secs(60);

/// Argo CD with 3 shards and its Application CRD.
pub fn installation() -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}\n---\n");
    // No controller-manager creates it here; the controller pods below need it.
    yaml.push_str(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: default, namespace: argocd}\n---\n",
    );
    yaml.push_str(&format!("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: argocd-application-controller, namespace: argocd}}\nspec:\n  replicas: {REPLICAS}\n  serviceName: c\n  selector: {{matchLabels: {{app: c}}}}\n  template:\n    metadata: {{labels: {{app: c}}}}\n    spec: {{containers: [{{name: c, image: x, env: [{{name: ARGOCD_CONTROLLER_REPLICAS, value: \"{REPLICAS}\"}}]}}]}}\n"));
    yaml.push_str("---\n");
    yaml.push_str(APPLICATION_CRD);
    yaml
}

/// The controller's pods as the balancer sees them: one per shard, reading keys with the
/// StatefulSet's count, Ready. No kubelet runs here, so the test writes their status as a
/// kubelet would; the balancer places clusters only on shards a Ready pod serves.
pub async fn ready_controller_pods(env: &Environment) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams, PostParams};
    let pods: Api<Pod> = Api::namespaced(
        env.control_plane().client("admin").await.expect("a client"),
        "argocd",
    );
    for ordinal in 0..REPLICAS {
        let name = format!("argocd-application-controller-{ordinal}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": "c"}},
            "spec": {"containers": [{"name": "c", "image": "x",
                "env": [{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": REPLICAS.to_string()}]}]},
        }))
        .expect("a pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("the pod is created");
        let status = serde_json::json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("the pod is Ready");
    }
}

/// Cluster `name`'s Secret (`name`, server `https://<name>.example`, `extra` stringData) and
/// `apps` Applications named after it from `first` on.
pub fn cluster(name: &str, extra: &str, first: u64, apps: u64) -> (String, String) {
    let secret = cluster_secret(
        name,
        &format!("name: {name}, server: \"https://{name}.example\"{extra}"),
    );
    let apps = (first..first + apps)
        .map(|i| application(&format!("{name}-{i}"), name))
        .collect();
    (secret, apps)
}

pub fn balancer(env: &Environment, kubeconfig: &Path, name: &str, metrics: u16) -> Process {
    balancer_every(env, kubeconfig, name, metrics, 1)
}

/// [`balancer`] with a pass every `interval` seconds.
pub fn balancer_every(
    env: &Environment,
    kubeconfig: &Path,
    name: &str,
    metrics: u16,
    interval: u32,
) -> Process {
    let health = free_port().expect("a free port");
    let spec = ProcessSpec::new(name, env!("CARGO_BIN_EXE_shardwise-balancer"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--interval", &interval.to_string()])
        // Undamped, so that each pass spends its moves (the pass's own tests check damping).
        .args(["--load-trigger", "1.03", "--min-move-interval", "0"])
        .args(["--hourly-move-budget", "10000"])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .args(["--health-addr", &format!("127.0.0.1:{health}")])
        .env("POD_NAMESPACE", "argocd")
        .env("POD_NAME", name)
        .env("SHARDWISE_LOG", "info");
    env.spawn(&spec).expect("the balancer starts")
}
