//! The fleet the Argo CD suites run real Argo CD on, and what they read back: the owners
//! `shardwise plan` computes and the owners Argo CD's controllers report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use kube::config::Kubeconfig;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use shardwise_e2e::argocd::{ArgoCd, ArgoCdOptions, NAMESPACE, Owners};
use shardwise_e2e::{Environment, Identity, workspace_binary};

/// The server of Argo CD's own cluster, as Applications name it.
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// How a cluster Secret authenticates to its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// `bearerToken`.
    Token,
    /// `tlsClientConfig.certData`/`keyData`.
    Certificate,
}

/// One cluster of the fleet: a cluster Secret (none for `in-cluster`) and its Applications.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub name: String,
    /// The destination kube-apiserver it reaches (through a link of its own).
    pub destination: usize,
    pub auth: Auth,
    pub apps: u32,
    /// The Secret's `shard` key.
    pub pin: Option<String>,
}

impl ClusterSpec {
    pub fn new(name: &str, destination: usize, auth: Auth, apps: u32) -> Self {
        Self {
            name: name.into(),
            destination,
            auth,
            apps,
            pin: None,
        }
    }

    pub fn pinned(mut self, pin: &str) -> Self {
        self.pin = Some(pin.into());
        self
    }

    /// Its Applications' names.
    pub fn app_names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.apps).map(|i| format!("{}-{i}", self.name))
    }
}

/// The identity a cluster's Secret authenticates as on its destination.
pub fn identity_of(cluster: &str) -> String {
    format!("argocd-{cluster}")
}

/// An environment with `destinations` destination servers, each with an admin identity per
/// cluster of `clusters`, so that every cluster has a URL of its own.
pub fn environment(destinations: usize, clusters: &[ClusterSpec]) -> Environment {
    let mut builder = Environment::builder().destinations(destinations);
    for c in clusters.iter().filter(|c| c.name != "in-cluster") {
        builder = builder.destination_identity(Identity::admin(identity_of(&c.name)));
    }
    builder.start().expect("the environment starts")
}

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The server URL of `cluster`.
pub fn server_of(env: &Environment, cluster: &ClusterSpec) -> String {
    env.destinations()[cluster.destination]
        .url_for(&identity_of(&cluster.name))
        .expect("the identity exists")
}

/// The cluster Secret of `cluster`, with Argo CD's `config` for its credentials.
pub fn cluster_secret(env: &Environment, cluster: &ClusterSpec) -> Value {
    let destination = &env.destinations()[cluster.destination];
    let identity = identity_of(&cluster.name);
    let mut tls = json!({"caData": b64(&destination.ca_pem())});
    let mut config = json!({});
    match cluster.auth {
        Auth::Token => config["bearerToken"] = json!(destination.token(&identity).unwrap()),
        Auth::Certificate => {
            let yaml = destination
                .kubeconfig_with_client_certificate(&identity)
                .unwrap();
            let kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
            let auth = kubeconfig.auth_infos[0].auth_info.clone().unwrap();
            tls["certData"] = json!(auth.client_certificate_data.unwrap());
            tls["keyData"] = json!(auth.client_key_data.unwrap().expose_secret());
        }
    }
    config["tlsClientConfig"] = tls;
    let mut data = json!({
        "name": cluster.name,
        "server": server_of(env, cluster),
        "config": config.to_string(),
    });
    if let Some(pin) = &cluster.pin {
        data["shard"] = json!(pin);
    }
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": format!("cluster-{}", cluster.name), "namespace": NAMESPACE,
            "labels": {"argocd.argoproj.io/secret-type": "cluster"},
        },
        "stringData": data,
    })
}

/// An Application syncing `apps/<name>` of the repository to `server`, namespace `namespace`,
/// automatically.
pub fn application(name: &str, repo: &str, server: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo, "targetRevision": "main", "path": format!("apps/{name}")},
            "destination": {"server": server, "namespace": namespace},
            "syncPolicy": {"automated": {}, "syncOptions": ["CreateNamespace=true"]},
        },
    })
}

/// The manifest of app `name` in the repository: one ConfigMap.
pub fn app_manifest(name: &str, revision: u32) -> (String, String) {
    (
        format!("apps/{name}/configmap.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{revision: \"{revision}\"}}\n"
        ),
    )
}

/// The fleet on Argo CD: its clusters, each app's cluster (by `argocd/<app>`), and apps whose
/// destination resolves to no cluster.
pub struct ArgoFleet {
    pub app_cluster: BTreeMap<String, String>,
    pub unresolved: Vec<String>,
}

impl ArgoFleet {
    /// Writes the repository, the cluster Secrets and the Applications (`in-cluster`'s apps
    /// target Argo CD's own server by its in-cluster address; `unresolved` apps a server no
    /// Secret names).
    pub async fn create(
        env: &Environment,
        argocd: &ArgoCd,
        clusters: Vec<ClusterSpec>,
        unresolved: u32,
    ) -> Self {
        let mut app_cluster = BTreeMap::new();
        let mut files = Vec::new();
        let mut yaml = Vec::new();
        let repo = argocd.git().url();
        for c in &clusters {
            let server = if c.name == "in-cluster" {
                IN_CLUSTER.to_string()
            } else {
                yaml.push(cluster_secret(env, c).to_string());
                server_of(env, c)
            };
            for app in c.app_names() {
                files.push(app_manifest(&app, 0));
                yaml.push(application(&app, &repo, &server, &c.name).to_string());
                app_cluster.insert(format!("{NAMESPACE}/{app}"), c.name.clone());
            }
        }
        let unresolved: Vec<String> = (0..unresolved).map(|i| format!("nowhere-{i}")).collect();
        for app in &unresolved {
            files.push(app_manifest(app, 0));
            yaml.push(
                application(app, &repo, "https://nowhere.invalid:6443", "nowhere").to_string(),
            );
        }
        argocd.git().commit(&files, "the fleet").unwrap();
        env.control_plane()
            .apply_yaml("admin", &yaml.join("\n---\n"))
            .await
            .unwrap();
        Self {
            app_cluster,
            unresolved: unresolved
                .iter()
                .map(|a| format!("{NAMESPACE}/{a}"))
                .collect(),
        }
    }
}

/// `shardwise` with `args` against the control plane (as its admin); its standard output.
pub fn shardwise_cli(env: &Environment, args: &[&str]) -> String {
    let output = std::process::Command::new(shardwise())
        .args(args)
        .arg("--kubeconfig")
        .arg(env.control_plane().kubeconfig_path_all())
        .output()
        .expect("shardwise runs");
    assert!(
        output.status.success(),
        "shardwise {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// `shardwise plan --source argocd --format json` with `extra` arguments; its JSON.
pub fn plan(env: &Environment, extra: &[&str]) -> Value {
    let mut args = vec!["plan", "--source", "argocd", "--format", "json"];
    args.extend(extra);
    serde_json::from_str(&shardwise_cli(env, &args)).expect("plan prints JSON")
}

/// Each cluster's current shard in `plan`'s JSON (none when unplaced).
pub fn current_shards(plan: &Value) -> BTreeMap<String, Option<u64>> {
    plan["clusters"]
        .as_array()
        .expect("clusters[]")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("a name").to_string(),
                c["shard"].as_u64(),
            )
        })
        .collect()
}

/// The `shardwise` CLI, built from the current source.
pub fn shardwise() -> PathBuf {
    workspace_binary("shardwise-cli", "shardwise").expect("shardwise builds")
}

/// Each app's owners as `plan`'s JSON says: the current shard of its cluster (none when the
/// cluster is unplaced), every live shard for apps whose destination resolves to no cluster,
/// and shard 0 for every pod when Argo CD does not shard.
pub fn planned_owners(plan: &Value, fleet: &ArgoFleet, pods: u32) -> Owners {
    let shards = current_shards(plan);
    let sharded = plan["replicas"]["from"].as_u64().unwrap_or(0) > 1
        && plan["warnings"].as_array().is_none_or(|w| {
            !w.iter()
                .any(|w| w.as_str().is_some_and(|w| w.contains("does not shard")))
        });
    let mut owners = Owners::new();
    for (app, cluster) in &fleet.app_cluster {
        let owned_by = match shards.get(cluster).copied().flatten() {
            Some(shard) if sharded => vec![u32::try_from(shard).expect("a shard")],
            Some(_) => (0..pods).collect(),
            None => vec![],
        };
        owners.insert(app.clone(), owned_by);
    }
    for app in &fleet.unresolved {
        owners.insert(app.clone(), (0..pods).collect());
    }
    owners.retain(|_, o| !o.is_empty());
    owners
}

/// How long Argo CD may take to report a change of owners.
pub const OWNERS_SETTLE: Duration = Duration::from_secs(90);

/// Starts Argo CD with `options` in `env`.
pub async fn install(env: &Environment, options: ArgoCdOptions) -> ArgoCd {
    ArgoCd::install(env, options).await.expect("Argo CD starts")
}
