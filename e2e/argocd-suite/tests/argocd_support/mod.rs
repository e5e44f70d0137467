//! The fleet the Argo CD suites run real Argo CD on, and what they read back: the owners
//! `shardwise plan` computes and the owners Argo CD's controllers report.

// Shared by the Argo CD suite and benchmark, each of which uses a part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, ResourceExt};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use shardwise_e2e::argocd::{
    ArgoCd, ArgoCdOptions, NAMESPACE, Owners, documented_role, secrets, shard_key,
};
use shardwise_e2e::{
    Environment, Identity, Process, ProcessSpec, free_port, wait_for, workspace_binary,
};

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
    let mut builder = Environment::builder().nodes(1).destinations(destinations);
    for c in clusters.iter().filter(|c| c.name != "in-cluster") {
        builder = builder.destination_identity(Identity::admin(identity_of(&c.name)));
    }
    builder.start().expect("the environment starts")
}

fn b64(data: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The server URL Applications give for `cluster`: the in-cluster address for Argo CD's own.
pub fn app_server(env: &Environment, cluster: &ClusterSpec) -> String {
    if cluster.name == "in-cluster" {
        IN_CLUSTER.to_string()
    } else {
        server_of(env, cluster)
    }
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
    pub clusters: BTreeMap<String, ClusterSpec>,
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
        let mut fleet = Self {
            clusters: BTreeMap::new(),
            app_cluster: BTreeMap::new(),
            unresolved: Vec::new(),
        };
        let repo = argocd.git().url();
        let mut files = Vec::new();
        let mut yaml = Vec::new();
        for app in (0..unresolved).map(|i| format!("nowhere-{i}")) {
            files.push(app_manifest(&app, 0));
            yaml.push(
                application(&app, &repo, "https://nowhere.invalid:6443", "nowhere").to_string(),
            );
            fleet.unresolved.push(format!("{NAMESPACE}/{app}"));
        }
        fleet.add(env, argocd, clusters, files, yaml).await;
        fleet
    }

    /// Adds clusters (their Secrets, apps and sources), with `files` and `yaml` besides.
    pub async fn add(
        &mut self,
        env: &Environment,
        argocd: &ArgoCd,
        clusters: Vec<ClusterSpec>,
        mut files: Vec<(String, String)>,
        mut yaml: Vec<String>,
    ) {
        let repo = argocd.git().url();
        for c in clusters {
            if c.name != "in-cluster" {
                yaml.push(cluster_secret(env, &c).to_string());
            }
            let server = app_server(env, &c);
            for app in c.app_names() {
                files.push(app_manifest(&app, 0));
                yaml.push(application(&app, &repo, &server, &c.name).to_string());
                self.app_cluster
                    .insert(format!("{NAMESPACE}/{app}"), c.name.clone());
            }
            self.clusters.insert(c.name.clone(), c);
        }
        argocd.git().commit(&files, "clusters added").unwrap();
        env.control_plane()
            .apply_yaml("admin", &yaml.join("\n---\n"))
            .await
            .unwrap();
    }

    /// Adds `apps` Applications to `cluster`.
    pub async fn grow(&mut self, env: &Environment, argocd: &ArgoCd, cluster: &str, apps: u32) {
        let c = self
            .clusters
            .get_mut(cluster)
            .expect("a cluster of the fleet");
        let first = c.apps;
        c.apps += apps;
        let c = c.clone();
        let server = server_of(env, &c);
        let repo = argocd.git().url();
        let names: Vec<String> = c.app_names().skip(first as usize).collect();
        let files: Vec<_> = names.iter().map(|a| app_manifest(a, 0)).collect();
        argocd.git().commit(&files, "apps added").unwrap();
        let yaml: Vec<String> = names
            .iter()
            .map(|a| application(a, &repo, &server, &c.name).to_string())
            .collect();
        env.control_plane()
            .apply_yaml("admin", &yaml.join("\n---\n"))
            .await
            .unwrap();
        for app in names {
            self.app_cluster
                .insert(format!("{NAMESPACE}/{app}"), c.name.clone());
        }
    }

    /// Each cluster's server as its Applications give it, by cluster name.
    pub fn servers(&self, env: &Environment) -> BTreeMap<String, String> {
        self.clusters
            .values()
            .map(|c| (c.name.clone(), app_server(env, c)))
            .collect()
    }

    /// Deletes and creates again the Secret of every cluster without a pin: the server gives
    /// each a new UID, which Argo CD's algorithms place them by.
    pub async fn recreate_secrets(&self, env: &Environment) {
        let api: Api<Secret> = Api::namespaced(
            env.control_plane().client("admin").await.unwrap(),
            NAMESPACE,
        );
        let mut yaml = Vec::new();
        for c in self
            .clusters
            .values()
            .filter(|c| c.pin.is_none() && c.name != "in-cluster")
        {
            let name = format!("cluster-{}", c.name);
            api.delete(&name, &DeleteParams::default()).await.unwrap();
            yaml.push(cluster_secret(env, c).to_string());
        }
        // Deleted for good before they are made again (a Secret has no finalizer: at once).
        env.control_plane()
            .apply_yaml("admin", &yaml.join("\n---\n"))
            .await
            .unwrap();
    }

    /// Removes a cluster as its owner would: its Applications, then its Secret.
    pub async fn remove(&mut self, env: &Environment, cluster: &str) {
        let c = self
            .clusters
            .remove(cluster)
            .expect("a cluster of the fleet");
        let client = env.control_plane().client("admin").await.unwrap();
        let apps: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NAMESPACE, &application_resource());
        for app in c.app_names() {
            apps.delete(&app, &DeleteParams::default()).await.unwrap();
            self.app_cluster.remove(&format!("{NAMESPACE}/{app}"));
        }
        let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
        secrets
            .delete(&format!("cluster-{cluster}"), &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// The sync operation of each Application that has one: its phase and when it started, by
/// `argocd/<app>`.
pub async fn operations(env: &Environment) -> BTreeMap<String, (String, jiff::Timestamp)> {
    let apps: Api<DynamicObject> = Api::namespaced_with(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
        &application_resource(),
    );
    let mut operations = BTreeMap::new();
    for app in apps.list(&Default::default()).await.unwrap() {
        let state = app.data.pointer("/status/operationState");
        let phase = state.and_then(|s| s.get("phase")).and_then(Value::as_str);
        let started = state
            .and_then(|s| s.get("startedAt"))
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok());
        if let (Some(phase), Some(started)) = (phase, started) {
            let name = app.metadata.name.clone().unwrap_or_default();
            operations.insert(format!("{NAMESPACE}/{name}"), (phase.to_string(), started));
        }
    }
    operations
}

fn application_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "argoproj.io",
        "v1alpha1",
        "Application",
    ))
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

/// The balancer's ServiceAccount, bound to the Role docs/argocd.md gives.
pub const BALANCER: &str = "shardwise-argocd-balancer";

/// The balancer's Lease (its default `--lease-name`), in Argo CD's namespace.
pub const BALANCER_LEASE: &str = "shardwise-argocd-balancer";

/// Starts `shardwise-balancer` against Argo CD's namespace as its ServiceAccount (the documented
/// Role), a pass every second, with `args` added.
pub async fn start_balancer(env: &Environment, args: &[&str]) -> (Process, u16) {
    start_balancer_as(env, BALANCER, args).await
}

/// [`start_balancer`] as ServiceAccount `account` of Argo CD's namespace, bound to the same
/// Role, and named `account` in the Lease: each instance its own user on the server, so that
/// the server's audit log tells which one sent a write.
pub async fn start_balancer_as(env: &Environment, account: &str, args: &[&str]) -> (Process, u16) {
    let cp = env.control_plane();
    let binding = format!(
        "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {account}, namespace: {NAMESPACE}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {BALANCER}}}\nsubjects: [{{kind: ServiceAccount, name: {account}, namespace: {NAMESPACE}}}]\n"
    );
    cp.apply_yaml("admin", &format!("{}{binding}", documented_role(BALANCER)))
        .await
        .unwrap();
    let kubeconfig = cp
        .add_identity(Identity::service_account(account, NAMESPACE, account))
        .unwrap();
    let (metrics, health) = (free_port().unwrap(), free_port().unwrap());
    let binary = workspace_binary("shardwise-balancer", "shardwise-balancer").unwrap();
    // Undamped: moves for balance start above the target, as often as a pass allows, syncing
    // or not (the suite's apps sync whenever their cluster joins or grows), unless `args` set
    // these flags; the suite times moves, and the pure pass's tests check the damping.
    let target = args
        .iter()
        .position(|a| *a == "--target-balance")
        .and_then(|i| args.get(i + 1))
        .copied()
        .unwrap_or("1.03");
    let sync_wait = args
        .iter()
        .position(|a| *a == "--sync-wait")
        .and_then(|i| args.get(i + 1))
        .copied();
    // Each undamped default unless `args` sets the flag itself.
    let defaults = [
        ("--interval", "1"),
        ("--load-trigger", target),
        ("--min-move-interval", "0"),
        ("--hourly-move-budget", "10000"),
    ];
    let unset = defaults
        .into_iter()
        .filter(|(flag, _)| !args.contains(flag))
        .flat_map(|(flag, value)| [flag, value]);
    let spec = ProcessSpec::new(account, binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(unset)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
        .args(["--health-addr", &format!("127.0.0.1:{health}")])
        .args(args)
        .args(
            sync_wait
                .is_none()
                .then_some(["--sync-wait", "0"])
                .into_iter()
                .flatten(),
        )
        .env("POD_NAMESPACE", NAMESPACE)
        .env("POD_NAME", account)
        .env("SHARDWISE_LOG", "info");
    let process = env.spawn(&spec).unwrap();
    // Serving before anything reads its metrics: a scrape sent while the process still starts
    // is refused (seen once in a clean-clone CI run, right after the start).
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    wait_for(
        &format!("balancer {account} to serve its metrics"),
        Duration::from_secs(60),
        || async {
            shardwise_e2e::scrape(&url)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", process.report()));
    (process, metrics)
}

/// The user the server authenticates a balancer started as `account` as.
pub fn balancer_user(account: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{account}")
}

/// The `shard` key of each cluster Secret, by cluster name (`name` of its data).
/// The clusters whose Secret says the balancer moved them away from a shard and will bring
/// them back (`shardwise.io/rescued-from`), by name.
pub async fn away(env: &Environment) -> Vec<String> {
    let api: Api<Secret> = Api::namespaced(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
    );
    secrets(&api)
        .await
        .values()
        .filter(|s| s.annotations().contains_key("shardwise.io/rescued-from"))
        .filter_map(|s| {
            let data = s.data.as_ref()?;
            String::from_utf8(data.get("name")?.0.clone()).ok()
        })
        .collect()
}

pub async fn keys(env: &Environment) -> BTreeMap<String, Option<String>> {
    let api: Api<Secret> = Api::namespaced(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
    );
    secrets(&api)
        .await
        .values()
        .filter(|s| {
            s.labels()
                .get("argocd.argoproj.io/secret-type")
                .map(String::as_str)
                == Some("cluster")
        })
        .filter_map(|s| {
            let data = s.data.as_ref()?;
            let name = String::from_utf8(data.get("name")?.0.clone()).ok()?;
            Some((name, shard_key(s)))
        })
        .collect()
}

/// Apps owned per controller `0..replicas`, counting apps with exactly one owner.
pub fn apps_per_controller(owners: &Owners, replicas: u32) -> Vec<u64> {
    let mut apps = vec![0; replicas as usize];
    for owned_by in owners.values() {
        if let [one] = owned_by.as_slice()
            && let Some(n) = apps.get_mut(*one as usize)
        {
            *n += 1;
        }
    }
    apps
}

/// Max over mean of `loads`.
pub fn max_over_mean(loads: &[u64]) -> f64 {
    let total: u64 = loads.iter().sum();
    if total == 0 {
        return 1.0;
    }
    *loads.iter().max().unwrap_or(&0) as f64 * loads.len() as f64 / total as f64
}

/// How long after a change of its cluster (a key written, a Secret or app created) an app may
/// be owned by no controller or by two: each controller's informers see the change on their
/// own. Within a second as a rule; right after a rollout, 3 to 4 s; 7 s measured for a
/// controller that had just started while a build kept both cores busy (its Secret informer
/// logged four key changes at once, 4 to 7 s after the other controllers); 10.8 s with the
/// suite alone on 2 cores (load average 10 to 14) and 13.6 s with the chaos suite beside it
/// (load average 16 to 21), each time in a controller started 0 to 20 s before the change
/// (the 13.6 s by its own log's "has changed shard" line). The grace starts at the change,
/// never before it.
pub const CHANGE_GRACE: Duration = Duration::from_secs(15);

/// How long `pod` has been Ready by its Ready condition's last transition (the server's
/// clock, which is this machine's), `None` when it is not Ready.
///
/// A controller Ready for less than [`CHANGE_GRACE`] has not settled: one that had become
/// Ready a second before listed none of the 24 apps its key named (2026-12-06, a 3 -> 4
/// rollout), after listing some of them at the sample before, while its cluster informer
/// and sharding were still starting.
fn ready_for(pod: &k8s_openapi::api::core::v1::Pod, now: jiff::Timestamp) -> Option<Duration> {
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    let since = ready.last_transition_time.as_ref()?.0;
    Some(Duration::try_from(now.duration_since(since)).unwrap_or_default())
}

/// One sample of an app owned by no controller or by several.
struct Odd {
    at: Instant,
    wall: jiff::Timestamp,
    app: String,
    cluster: String,
    owners: Vec<u32>,
    /// The controller its cluster's key names had no pod serving the cluster at the sample:
    /// none Ready, one Ready for less than [`CHANGE_GRACE`], one deleted while the sample
    /// read the owners (read before and after), or one that has not yet listed
    /// any app of that cluster (being replaced and still syncing that cluster's cache, or
    /// down). The app then has no owner by Argo CD's own doing; a pod that never takes its
    /// cluster shows in the steps' settling.
    owner_down: bool,
    /// The key and the controller pods as the sample saw them, for messages.
    seen: String,
}

/// What the test saw of a live Argo CD, poll by poll: when each cluster changed, and every
/// sample of an app owned by no controller or by several.
#[derive(Default)]
pub struct Observer {
    /// When a cluster's key or Secret was seen to change, or the test changed its apps.
    changes: Vec<(Instant, String)>,
    keys: BTreeMap<String, Option<String>>,
    keys_since: Option<Instant>,
    odd: Vec<Odd>,
    /// The UIDs of the controller pods that have listed an app in `argocd_app_info`.
    serving: std::collections::BTreeSet<String>,
    /// (pod UID, cluster): the pods that have listed an app of the cluster.
    taken: std::collections::BTreeSet<(String, String)>,
    /// Which shard each controller pod had at the last sample, by pod name (under dynamic
    /// cluster distribution, as `argocd-app-controller-shard-cm` maps them).
    shards: BTreeMap<String, u32>,
    /// When that mapping was seen to change, or to leave a pod unmapped.
    reshuffles: Vec<Instant>,
    /// Key changes seen since the last [`Observer::step`].
    pub key_writes: u64,
    pub samples: u64,
    /// Apps owned by no controller, times the time since the sample before, summed.
    unowned_app_seconds: f64,
    /// The same, by cluster.
    unowned_by_cluster: BTreeMap<String, f64>,
    /// The same, by cluster, but for samples within [`CHANGE_GRACE`] after a change of the
    /// app's cluster (a key write takes each controller a moment to see).
    unowned_beyond_grace: BTreeMap<String, f64>,
    /// When the last sample read the owners.
    last_at: Option<Instant>,
    /// Since when each shard below the replica count has had no serving pod.
    unserved_since: BTreeMap<u32, Instant>,
    /// The longest time a shard below the replica count went without a serving pod.
    longest_unserved: Duration,
}

impl Observer {
    /// Records that the test changed `cluster` (its Secret or apps) now.
    pub fn changed(&mut self, cluster: &str) {
        self.changes.push((Instant::now(), cluster.to_string()));
    }

    /// Starts counting a new step's key writes.
    pub fn step(&mut self) {
        self.key_writes = 0;
    }

    /// Reads the keys, the controller pods and the owners once; returns the owners. The keys
    /// are read before and after the owners: a key that changed meanwhile counts as changed
    /// from the sample's start, the first moment the owners read could reflect it.
    pub async fn sample(
        &mut self,
        env: &Environment,
        argocd: &ArgoCd,
        fleet: &ArgoFleet,
    ) -> Owners {
        let started = Instant::now();
        let before = keys(env).await;
        let pods = argocd
            .pods()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", argocd.report()));
        let scraped = argocd
            .scrape()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", argocd.report()));
        let owners = shardwise_e2e::argocd::owners_of(&scraped);
        // Read again: a pod deleted while it was scraped (its process gone, so not scraped)
        // served at the first read. A pod serves the sample only if both reads say so.
        let pods_after = argocd
            .pods()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", argocd.report()));
        let shards: BTreeMap<String, u32> = pods
            .iter()
            .map(|(s, p)| (p.metadata.name.clone().unwrap_or_default(), *s))
            .collect();
        if (shards != self.shards && self.samples > 0)
            || shards
                .values()
                .any(|s| *s >= shardwise_e2e::argocd::UNMAPPED)
        {
            self.reshuffles.push(started);
        }
        self.shards = shards;
        let listing: std::collections::BTreeSet<u32> = owners.values().flatten().copied().collect();
        let uid = |o: &u32| pods.get(o).and_then(|p| p.metadata.uid.clone());
        self.serving.extend(listing.iter().filter_map(uid));
        for (app, owned_by) in &owners {
            let Some(cluster) = fleet.app_cluster.get(app) else {
                continue;
            };
            for u in owned_by.iter().filter_map(uid) {
                self.taken.insert((u, cluster.clone()));
            }
        }
        let now = jiff::Timestamp::now();
        let serving: std::collections::BTreeSet<u32> = pods
            .iter()
            .filter(|(o, p)| {
                pods_after.get(o).is_some_and(|after| {
                    after.metadata.uid == p.metadata.uid && shardwise_e2e::pod_serving(after)
                })
            })
            .filter(|(_, p)| shardwise_e2e::pod_serving(p))
            .filter(|(_, p)| ready_for(p, now).is_some_and(|d| d >= CHANGE_GRACE))
            .filter(|(_, p)| {
                p.metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| self.serving.contains(u))
            })
            .map(|(o, _)| *o)
            .collect();
        let (at, wall) = (Instant::now(), jiff::Timestamp::now());
        let replicas = argocd.options().replicas;
        for shard in 0..replicas {
            let served = pods.get(&shard).is_some_and(|p| {
                shardwise_e2e::pod_serving(p)
                    && pods_after.get(&shard).is_some_and(|after| {
                        after.metadata.uid == p.metadata.uid && shardwise_e2e::pod_serving(after)
                    })
            });
            if served {
                if let Some(since) = self.unserved_since.remove(&shard) {
                    self.longest_unserved = self.longest_unserved.max(at.duration_since(since));
                }
            } else {
                self.unserved_since.entry(shard).or_insert(at);
            }
        }
        self.unserved_since.retain(|shard, _| *shard < replicas);
        let after = keys(env).await;
        let clusters: std::collections::BTreeSet<String> = before
            .keys()
            .chain(after.keys())
            .chain(self.keys.keys())
            .cloned()
            .collect();
        // The first sample is the baseline: what it sees has not changed.
        let first = self.samples == 0;
        for cluster in clusters.iter().filter(|_| !first) {
            let seen = [
                self.keys.get(cluster),
                before.get(cluster),
                after.get(cluster),
            ];
            if seen[0] != seen[1] || seen[1] != seen[2] {
                self.changes.push((started, cluster.to_string()));
                if after.get(cluster).is_some_and(Option::is_some) {
                    self.key_writes += 1;
                }
            }
        }
        if after != self.keys || self.keys_since.is_none() {
            self.keys_since = Some(started);
        }
        self.samples += 1;
        let unowned: Vec<&String> = fleet
            .app_cluster
            .iter()
            .filter(|(app, _)| owners.get(*app).is_none_or(Vec::is_empty))
            .map(|(_, cluster)| cluster)
            .collect();
        if let Some(last) = self.last_at {
            let seconds = at.duration_since(last).as_secs_f64();
            self.unowned_app_seconds += unowned.len() as f64 * seconds;
            for cluster in unowned {
                *self.unowned_by_cluster.entry(cluster.clone()).or_default() += seconds;
                let changed = self
                    .changes
                    .iter()
                    .any(|(t, c)| c == cluster && *t <= at && at <= *t + CHANGE_GRACE);
                if !changed {
                    *self
                        .unowned_beyond_grace
                        .entry(cluster.clone())
                        .or_default() += seconds;
                }
            }
        }
        self.last_at = Some(at);
        for (app, cluster) in &fleet.app_cluster {
            let owned_by = owners.get(app).cloned().unwrap_or_default();
            if owned_by.len() != 1 {
                let key = before.get(cluster).cloned().flatten();
                // A cluster without a key is placed by Argo CD's algorithm: any controller not
                // serving may be its owner.
                let owner_down = match key.as_deref().map(|k| k.trim().parse::<u32>()) {
                    Some(Ok(k)) => {
                        !serving.contains(&k)
                            || !uid(&k).is_some_and(|u| self.taken.contains(&(u, cluster.clone())))
                    }
                    _ => serving.len() < pods.len() || pods.is_empty(),
                };
                // Per pod: Ready, and how many apps it listed (None: not scraped).
                let seen = format!(
                    "key {key:?}; pods serving {serving:?} of {:?} (ordinal, Ready, apps listed)",
                    pods.iter()
                        .map(|(o, p)| (
                            *o,
                            shardwise_e2e::pod_ready(p),
                            scraped
                                .contains_key(o)
                                .then(|| { owners.values().filter(|by| by.contains(o)).count() })
                        ))
                        .collect::<Vec<_>>()
                );
                self.odd.push(Odd {
                    at,
                    wall,
                    app: app.clone(),
                    cluster: cluster.clone(),
                    owners: owned_by,
                    owner_down,
                    seen,
                });
            }
        }
        self.keys = after;
        owners
    }

    /// When the keys were first seen as they are (`None` before the first sample).
    pub fn keys_since(&self) -> Option<Instant> {
        self.keys_since
    }

    /// How long the keys have been as they are.
    pub fn keys_stable_for(&self) -> Duration {
        self.keys_since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Samples of an app owned by two controllers, or by none while the controller its key
    /// names had a pod serving, with no change of its cluster in the [`CHANGE_GRACE`] before
    /// it.
    pub fn violations(&self) -> Vec<String> {
        self.violations_beyond(Duration::ZERO)
    }

    /// [`Observer::violations`] but those within `reshuffle` of Argo CD moving a shard between
    /// its own pods.
    pub fn violations_beyond(&self, reshuffle: Duration) -> Vec<String> {
        self.odd
            .iter()
            .filter(|odd| reshuffle.is_zero() || !self.in_reshuffle(odd.at, reshuffle))
            .filter(|odd| odd.owners.len() > 1 || !odd.owner_down)
            .filter(|odd| {
                !self
                    .changes
                    .iter()
                    .any(|(t, c)| *c == odd.cluster && *t <= odd.at && odd.at <= *t + CHANGE_GRACE)
            })
            .map(|odd| self.describe(odd))
            .collect()
    }

    /// One odd sample, for a message.
    fn describe(&self, odd: &Odd) -> String {
        let since = self
            .changes
            .iter()
            .filter(|(t, c)| *c == odd.cluster && *t <= odd.at)
            .map(|(t, _)| format!("{:.1} s", odd.at.duration_since(*t).as_secs_f64()))
            .next_back()
            .unwrap_or_else(|| "never".into());
        format!(
            "{} (cluster {}) owned by {:?} at {} ({}); its cluster last changed {since} before",
            odd.app, odd.cluster, odd.owners, odd.wall, odd.seen
        )
    }

    /// Samples of an app owned by two controllers.
    pub fn two_owner_samples(&self) -> usize {
        self.odd.iter().filter(|o| o.owners.len() > 1).count()
    }

    /// Every sample of an app owned by two controllers, whatever changed before it, for a
    /// message.
    pub fn two_owners(&self) -> Vec<String> {
        self.odd
            .iter()
            .filter(|o| o.owners.len() > 1)
            .map(|odd| self.describe(odd))
            .collect()
    }

    /// Whether a sample at `at` came within `window` after Argo CD itself moved a shard from
    /// one pod to another (dynamic cluster distribution: each pod claims a shard in
    /// `argocd-app-controller-shard-cm` at every readiness probe, and the pod that held it
    /// drops it only at its own next probe), or while a pod had no shard there.
    fn in_reshuffle(&self, at: Instant, window: Duration) -> bool {
        self.reshuffles
            .iter()
            .any(|t| *t <= at && at <= *t + window)
    }

    /// Samples of an app owned by two controllers within `window` of a reshuffle.
    pub fn two_owner_samples_in_reshuffles(&self, window: Duration) -> usize {
        self.odd
            .iter()
            .filter(|o| o.owners.len() > 1 && self.in_reshuffle(o.at, window))
            .count()
    }

    /// Samples of an app owned by no controller while the controller its key names had no pod
    /// serving.
    pub fn unowned_while_down(&self) -> usize {
        self.odd
            .iter()
            .filter(|o| o.owners.is_empty() && o.owner_down)
            .count()
    }

    /// Samples of an app owned by no controller or by two (excused or not).
    pub fn odd_samples(&self) -> usize {
        self.odd.len()
    }

    /// The longest time a shard below the replica count went without a Ready, not deleting
    /// pod, as the samples saw it (a gap still open at the last sample does not count).
    pub fn longest_unserved(&self) -> Duration {
        self.longest_unserved
    }

    /// App-seconds without an owner since the first sample: each sample's apps owned by no
    /// controller times the time since the sample before.
    pub fn unowned_app_seconds(&self) -> f64 {
        self.unowned_app_seconds
    }

    /// [`Observer::unowned_app_seconds`] by cluster name (clusters never unowned left out).
    pub fn unowned_by_cluster(&self) -> &BTreeMap<String, f64> {
        &self.unowned_by_cluster
    }

    /// [`Observer::unowned_by_cluster`] but the samples within [`CHANGE_GRACE`] after a
    /// change of the cluster.
    pub fn unowned_beyond_grace(&self) -> &BTreeMap<String, f64> {
        &self.unowned_beyond_grace
    }
}

/// Writes `shard` as the `shard` key of `cluster`'s Secret (a merge patch, as `--apply` does).
pub async fn write_key(env: &Environment, cluster: &str, shard: u32) {
    let api: Api<Secret> = Api::namespaced(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
    );
    api.patch(
        &format!("cluster-{cluster}"),
        &PatchParams::default(),
        &Patch::Merge(json!({"stringData": {"shard": shard.to_string()}})),
    )
    .await
    .unwrap();
}

/// Asks Argo CD to refresh every app of `cluster` (the `argocd.argoproj.io/refresh` annotation).
pub async fn refresh_apps(env: &Environment, cluster: &ClusterSpec) {
    let apps: Api<DynamicObject> = Api::namespaced_with(
        env.control_plane().client("admin").await.unwrap(),
        NAMESPACE,
        &application_resource(),
    );
    for app in cluster.app_names() {
        apps.patch(
            &app,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": "normal"}}}),
            ),
        )
        .await
        .unwrap();
    }
}
