//! The real kubectl against the server: apply, get, label selection, scale, delete, RBAC.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::Value;
use shardwise_test_apiserver::ApiServer;

use crate::common::*;

const MANIFEST: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: front
  namespace: shop
  labels: {tier: web}
data:
  greeting: hello
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: back
  namespace: shop
  labels: {tier: db}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: shop
spec:
  replicas: 2
  serviceName: web
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1
        ports:
        - containerPort: 80
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
"#;

const GADGET: &str = r#"
apiVersion: example.com/v1
kind: Gadget
metadata:
  name: g1
  namespace: shop
spec:
  size: 3
"#;

struct Kubectl {
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(server: &ApiServer) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let kubeconfig = dir.path().join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig written");
        Self { kubeconfig, dir }
    }

    fn file(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("file written");
        path
    }

    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let binary = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
        let out = tokio::process::Command::new(&binary)
            .args(args)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .output()
            .await
            .unwrap_or_else(|e| {
                panic!("cannot run {binary} (install kubectl or set KUBECTL): {e}")
            });
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.run(args).await;
        assert!(ok, "kubectl {} failed:\n{stdout}\n{stderr}", args.join(" "));
        stdout
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_get_scale_delete() {
    let server = start_with(with_robot().rbac(true)).await;
    let client = admin(&server).await;
    let kubectl = Kubectl::new(&server);
    let manifest = kubectl.file("manifest.yaml", MANIFEST);
    let gadget = kubectl.file("gadget.yaml", GADGET);

    let applied = kubectl.ok(&["apply", "-f", path(&manifest)]).await;
    for line in [
        "namespace/shop created",
        "configmap/front created",
        "statefulset.apps/web created",
        "customresourcedefinition.apiextensions.k8s.io/gadgets.example.com created",
    ] {
        assert!(applied.contains(line), "{applied}");
    }
    kubectl
        .ok(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=10s",
            "crd/gadgets.example.com",
        ])
        .await;
    assert!(
        kubectl
            .ok(&["apply", "-f", path(&gadget)])
            .await
            .contains("gadget.example.com/g1 created")
    );
    let again = kubectl.ok(&["apply", "-f", path(&manifest)]).await;
    assert!(again.contains("configmap/front unchanged"), "{again}");

    let json = kubectl
        .ok(&["get", "configmaps", "-n", "shop", "-o", "json"])
        .await;
    let list: Value = serde_json::from_str(&json).unwrap();
    let mut names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["back", "front"]);
    let one: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "configmap", "front", "-n", "shop", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(one["data"]["greeting"], "hello");

    let selected = kubectl
        .ok(&[
            "get",
            "configmaps",
            "-n",
            "shop",
            "-l",
            "tier=web",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(selected.trim(), "configmap/front");
    let table = kubectl
        .ok(&["get", "cm", "-n", "shop", "-l", "tier in (web,db)"])
        .await;
    assert!(
        table.starts_with("NAME") && table.contains("front") && table.contains("back"),
        "{table}"
    );
    let gadgets = kubectl.ok(&["get", "gd", "-n", "shop"]).await;
    assert!(
        gadgets.contains("SIZE") && gadgets.contains("g1") && gadgets.contains('3'),
        "{gadgets}"
    );

    let scaled = kubectl
        .ok(&["scale", "statefulset", "web", "-n", "shop", "--replicas=4"])
        .await;
    assert!(scaled.contains("statefulset.apps/web scaled"), "{scaled}");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "shop");
    assert_eq!(
        sets.get("web").await.unwrap().spec.unwrap().replicas,
        Some(4)
    );

    // Changing one container field through client-side apply keeps the others.
    let bumped = kubectl.file("manifest2.yaml", &MANIFEST.replace("nginx:1", "nginx:2"));
    kubectl.ok(&["apply", "-f", path(&bumped)]).await;
    let container = sets
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .remove(0);
    assert_eq!(container.image.as_deref(), Some("nginx:2"));
    assert!(container.ports.is_some());

    let ssa = kubectl
        .ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path(&gadget),
        ])
        .await;
    assert!(ssa.contains("serverside-applied"), "{ssa}");

    let (ok, _, stderr) = kubectl
        .run(&["--context", "robot", "get", "configmaps", "-n", "shop"])
        .await;
    assert!(
        !ok && stderr.contains("Forbidden")
            && stderr.contains("cannot list resource \"configmaps\""),
        "{stderr}"
    );

    let deleted = kubectl
        .ok(&["delete", "configmap", "front", "-n", "shop"])
        .await;
    assert!(deleted.contains("configmap \"front\" deleted"), "{deleted}");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    assert!(cms.get_opt("front").await.unwrap().is_none());

    let all = kubectl
        .ok(&["delete", "-f", path(&bumped), "--ignore-not-found"])
        .await;
    assert!(all.contains("namespace \"shop\" deleted"), "{all}");
    assert!(all.contains("statefulset.apps \"web\" deleted"), "{all}");
    let (ok, _, stderr) = kubectl.run(&["get", "namespace", "shop"]).await;
    assert!(!ok && stderr.contains("NotFound"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_commands_and_auth_can_i() {
    let server = start_with(with_robot().rbac(true)).await;
    let client = admin(&server).await;
    let kubectl = Kubectl::new(&server);
    kubectl.ok(&["create", "namespace", "team"]).await;
    kubectl
        .ok(&[
            "create",
            "configmap",
            "settings",
            "-n",
            "team",
            "--from-literal=mode=fast",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "team",
            "--from-literal=token=s3cret",
        ])
        .await;
    kubectl
        .ok(&["create", "serviceaccount", "robot", "-n", "team"])
        .await;
    kubectl
        .ok(&[
            "create",
            "role",
            "reader",
            "-n",
            "team",
            "--verb=get,list",
            "--resource=configmaps,statefulsets.apps",
        ])
        .await;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    assert_eq!(
        cms.get("settings").await.unwrap().data.unwrap()["mode"],
        "fast"
    );
    let secret: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "secret", "creds", "-n", "team", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(secret["data"]["token"], "czNjcmV0");
    assert_eq!(secret["type"], "Opaque");
    let role: Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "role", "reader", "-n", "team", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(role["rules"][0]["apiGroups"], serde_json::json!([""]));
    assert_eq!(role["rules"][1]["apiGroups"], serde_json::json!(["apps"]));

    let can = |args: &'static [&'static str]| {
        let kubectl = &kubectl;
        async move {
            let (_, stdout, _) = kubectl.run(args).await;
            stdout.trim().to_string()
        }
    };
    assert_eq!(
        can(&[
            "--context",
            "robot",
            "auth",
            "can-i",
            "list",
            "configmaps",
            "-n",
            "team"
        ])
        .await,
        "no"
    );
    kubectl
        .ok(&[
            "create",
            "rolebinding",
            "robot-reads",
            "-n",
            "team",
            "--role=reader",
            "--serviceaccount=team:robot",
        ])
        .await;
    assert_eq!(
        can(&[
            "--context",
            "robot",
            "auth",
            "can-i",
            "list",
            "configmaps",
            "-n",
            "team"
        ])
        .await,
        "yes"
    );
    assert_eq!(
        can(&[
            "--context",
            "robot",
            "auth",
            "can-i",
            "delete",
            "configmaps",
            "-n",
            "team"
        ])
        .await,
        "no"
    );
    assert_eq!(
        can(&[
            "--context",
            "robot",
            "auth",
            "can-i",
            "get",
            "statefulsets.apps",
            "-n",
            "team"
        ])
        .await,
        "yes"
    );
    kubectl
        .ok(&[
            "create",
            "clusterrolebinding",
            "robot-admin",
            "--clusterrole=cluster-admin",
            "--user=system:serviceaccount:team:robot",
        ])
        .await;
    assert_eq!(
        can(&[
            "--context",
            "robot",
            "auth",
            "can-i",
            "delete",
            "leases",
            "-n",
            "default"
        ])
        .await,
        "yes"
    );

    let (ok, _, stderr) = kubectl
        .run(&["create", "deployment", "web", "--image=nginx"])
        .await;
    assert!(
        !ok && stderr.contains("send apps/v1 Deployment as JSON"),
        "{stderr}"
    );
}
