//! A control plane that runs workloads: kube-controller-manager and kube-scheduler beside
//! kube-apiserver, each controller the suites rely on seen doing its job, as a real cluster's.
//! Needs the binaries of scripts/control-plane.sh.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use shardwise_e2e::{Environment, wait_for};

const WAIT: Duration = Duration::from_secs(60);

const WORKLOAD: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: web}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: web}
spec:
  replicas: 3
  podManagementPolicy: Parallel
  serviceName: web
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      # No Node has this label: the ordinals stay unscheduled, so their deletion needs no
      # agent (the Node's not-ready taint alone would leave a window to bind them in, when
      # node-lifecycle-controller swaps it for the unreachable one).
      nodeSelector: {example.invalid/never: 'yes'}
      containers: [{name: web, image: example.invalid/web}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{name: http, port: 80}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: web}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: web-aggregate}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {web/aggregate: \"true\"}}]
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: web-part
  labels: {web/aggregate: \"true\"}
rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get]}]
---
apiVersion: v1
kind: Node
metadata: {name: node-0}
---
apiVersion: v1
kind: Pod
metadata: {name: bound, namespace: web}
spec:
  tolerations: [{operator: Exists}]
  containers: [{name: bound, image: example.invalid/bound}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_controller_manager_and_kube_scheduler_run_the_workloads_of_a_real_cluster() {
    let env = Environment::builder().runs_pods().start().unwrap();
    let cp = env.control_plane();
    let client = cp.client("admin").await.unwrap();
    cp.apply_yaml("admin", WORKLOAD).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "web");
    // What a kubelet would report: room for pods. No agent runs this Node, so it never gets
    // ready and keeps its not-ready taint.
    let nodes: Api<Node> = Api::all(client.clone());
    let room = json!({"status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                                 "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"}}});
    nodes
        .patch_status("node-0", &PatchParams::default(), &Patch::Merge(&room))
        .await
        .unwrap();

    // The StatefulSet controller creates the ordinals, owned by it; they stay Pending (no
    // Node matches their selector).
    let created = wait_for("3 pods of web owned by the StatefulSet", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        let mut names: Vec<String> = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "StatefulSet" && o.name == "web")
            })
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        if names.len() == 3 {
            Ok(names)
        } else {
            Err(format!("pods {names:?}"))
        }
    })
    .await
    .unwrap();
    assert_eq!(created, ["web-0", "web-1", "web-2"]);

    // The scheduler binds the pod that tolerates the Node's taint.
    wait_for("pod bound to be scheduled on node-0", WAIT, || async {
        let pod = pods.get("bound").await.map_err(|e| e.to_string())?;
        match pod.spec.and_then(|s| s.node_name) {
            Some(node) if node == "node-0" => Ok(()),
            other => Err(format!("node {other:?}")),
        }
    })
    .await
    .unwrap();
    // No agent runs it, so nothing would ever finish its graceful deletion.
    pods.delete(
        "bound",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();

    // The disruption controller counts them; none is ready, so none may be evicted.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "web");
    wait_for("the PDB to count 3 pods", WAIT, || async {
        let status = budgets.get("web").await.map_err(|e| e.to_string())?.status;
        match status {
            Some(s) if s.expected_pods == 3 && s.disruptions_allowed == 0 => Ok(()),
            other => Err(format!("status {other:?}")),
        }
    })
    .await
    .unwrap();

    // The EndpointSlice controller lists the Service's pods once they have addresses; until
    // then, the Service has its (empty) slice.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "web");
    wait_for("an EndpointSlice of web", WAIT, || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .map_err(|e| e.to_string())?;
        if list.items.is_empty() {
            Err("none".to_string())
        } else {
            Ok(())
        }
    })
    .await
    .unwrap();

    // ClusterRole aggregation.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    wait_for("web-aggregate to gain web-part's rule", WAIT, || async {
        let role = roles
            .get("web-aggregate")
            .await
            .map_err(|e| e.to_string())?;
        let rules = role.rules.unwrap_or_default();
        if rules
            .iter()
            .any(|r| r.resources == Some(vec!["configmaps".to_string()]))
        {
            Ok(())
        } else {
            Err(format!("rules {rules:?}"))
        }
    })
    .await
    .unwrap();

    // Deleting the namespace: the namespace controller empties it (the garbage collector and
    // the pods' deletion included), then removes it.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("namespace web to be gone", WAIT, || async {
        match namespaces.get_opt("web").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(ns) => Err(format!("still there: {:?}", ns.status)),
        }
    })
    .await
    .unwrap();
}

/// The log of the first run of container `container` of pod `namespace/name` on `node-0`.
fn first_log(env: &Environment, namespace: &str, name: &str, container: &str) -> String {
    let pods = env.dir().join("nodes").join("node-0");
    let prefix = format!("{namespace}_{name}_");
    let pod_dir = std::fs::read_dir(&pods)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .unwrap_or_else(|| {
            panic!(
                "no directory of {namespace}/{name} under {}",
                pods.display()
            )
        });
    std::fs::read_to_string(pod_dir.join(container).join("0.log")).unwrap_or_default()
}

const PRINTER: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: jobs}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: greeting, namespace: jobs}
data: {WORD: hello}
---
apiVersion: v1
kind: Pod
metadata: {name: printer, namespace: jobs, labels: {app: printer}}
spec:
  restartPolicy: Never
  containers:
  - name: print
    image: busybox:1.37
    command: [sh, -c]
    args:
    - >-
      echo \"pod=$POD_NAME word=$WORD ip=$POD_IP\";
      echo \"namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)\";
      test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token=present;
      grep -q 'BEGIN CERTIFICATE' /var/run/secrets/kubernetes.io/serviceaccount/ca.crt && echo ca=present;
      echo \"api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\";
      exit 3
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    envFrom:
    - configMapRef: {name: greeting}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_agent_runs_a_scheduled_pod_as_a_kubelet_would() {
    let env = Environment::builder().nodes(1).start().unwrap();
    let cp = env.control_plane();
    let client = cp.client("admin").await.unwrap();
    cp.apply_yaml("admin", PRINTER).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "jobs");
    // Scheduled by kube-scheduler once node-lifecycle-controller found the node ready, run by
    // the agent, ended with the script's exit code.
    let pod = wait_for(
        "printer to fail with exit code 3",
        Duration::from_secs(120),
        || async {
            let pod = pods.get("printer").await.map_err(|e| e.to_string())?;
            let status = pod.status.clone().unwrap_or_default();
            match status.phase.as_deref() {
                Some("Failed") => Ok(pod),
                other => Err(format!("phase {other:?}, status {status:?}")),
            }
        },
    )
    .await
    .unwrap();
    let status = pod.status.unwrap();
    let terminated = status.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(terminated.exit_code, 3);
    let ip = status.pod_ip.unwrap();
    let gateway = env.node_address().unwrap();
    let [a, b, c, _] = gateway.octets();
    assert!(
        ip.starts_with(&format!("{a}.{b}.{c}.")),
        "{ip} is not on the node network {gateway}"
    );
    let log = first_log(&env, "jobs", "printer", "print");
    assert!(
        log.contains(&format!("pod=printer word=hello ip={ip}")),
        "{log}"
    );
    assert!(log.contains("namespace=jobs"), "{log}");
    assert!(
        log.contains("token=present") && log.contains("ca=present"),
        "{log}"
    );
    assert!(log.contains(&format!("api={gateway}:")), "{log}");
}
