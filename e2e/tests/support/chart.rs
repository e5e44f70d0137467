//! charts/shardwise installed with the real `helm` on a control plane that runs pods, and what
//! the chart suite and the fleet benchmark's chart section look at while the real StatefulSet
//! controller runs the replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::api::PostParams;
use serde_json::json;
use shardwise_api::FleetCluster;
use shardwise_e2e::{Environment, control_plane_binary, pod_ready};

use shardwise_api::FleetApp;
use shardwise_e2e::Identity;

use super::{DESTINATION_IDENTITY, app_manifests, repo_file};

/// The release, its StatefulSet and the prefix of its Leases.
pub const RELEASE: &str = "shardwise";
/// Where the suite installs it.
pub const NAMESPACE: &str = "fleet";
/// The values every helm command of the suite sets, beside the chart's defaults: the image
/// (the node maps it to this workspace's binary), the audit file the overlap check reads, and
/// Prometheus' ServiceAccount as a metrics reader.
pub const VALUES: &[&str] = &[
    "--set",
    "image.tag=dev",
    "--set",
    "controller.auditFile=/var/log/shardwise/audit.jsonl",
    "--set-json",
    r#"metrics.readers=[{"kind":"ServiceAccount","name":"prometheus","namespace":"monitoring"}]"#,
];

/// Runs helm with the environment's admin kubeconfig; its output when it succeeds. The first
/// call of a test process prints which helm it is (`helm version`).
pub fn helm(env: &Environment, args: &[&str]) -> String {
    static VERSION: std::sync::Once = std::sync::Once::new();
    VERSION.call_once(|| {
        let version = Command::new(control_plane_binary("helm").unwrap())
            .arg("version")
            .output()
            .unwrap();
        eprintln!(
            "helm version: {}",
            String::from_utf8_lossy(&version.stdout).trim()
        );
    });
    let output = Command::new(control_plane_binary("helm").unwrap())
        .args(args)
        .env("KUBECONFIG", env.control_plane().kubeconfig_path_all())
        .env("HELM_CACHE_HOME", env.dir().join("helm/cache"))
        .env("HELM_CONFIG_HOME", env.dir().join("helm/config"))
        .env("HELM_DATA_HOME", env.dir().join("helm/data"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "helm {args:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// Runs kubectl in the release's namespace with the environment's admin kubeconfig; its output
/// when it succeeds.
pub fn kubectl(env: &Environment, args: &[&str]) -> String {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.control_plane().kubeconfig_path_all())
        .args(["--namespace", NAMESPACE])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `helm install --wait` of the chart with the suite's values and `extra`, after creating the
/// ServiceAccount metrics.readers names; helm's output.
pub async fn install(env: &Environment, extra: &[&str]) -> String {
    // Prometheus' ServiceAccount, the one metrics.readers names.
    env.control_plane()
        .apply_yaml(
            "admin",
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: prometheus, namespace: monitoring}\n",
        )
        .await
        .unwrap();
    let chart = repo_file("charts/shardwise");
    let mut install = vec![
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
    ];
    install.extend(VALUES);
    install.extend(extra);
    helm(env, &install)
}

/// One look at the clusters.
pub struct Sample {
    pub at: Instant,
    /// Clusters whose recorded holder holds its shard's Lease and that are not being drained.
    pub owned: BTreeSet<String>,
    pub clusters: BTreeSet<String>,
}

/// Pod name -> (revision, Ready) of the pods not being deleted, as of one event of a watch.
pub type Pods = BTreeMap<String, (String, bool)>;

/// What a [`Sampler`] saw: the clusters every 100 ms, and every state the pods went through.
pub struct Samples {
    pub clusters: Vec<Sample>,
    /// The pods after each event of one watch, in the server's order: a state that lasted a
    /// millisecond is here too, which polling could miss.
    pub pods: Vec<Pods>,
}

/// Samples Leases and FleetClusters every 100 ms, and follows the pods with a watch, until
/// stopped.
pub struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    clusters: tokio::task::JoinHandle<Vec<Sample>>,
    pods: tokio::task::JoinHandle<Vec<Pods>>,
}

impl Sampler {
    /// Samples StatefulSet `statefulset` of `namespace`: its pods, shard Leases and FleetClusters.
    pub fn start(client: kube::Client, namespace: &str, statefulset: &str) -> Self {
        let clusters: Api<FleetCluster> = Api::namespaced(client.clone(), namespace);
        Self::of(client, clusters, namespace, statefulset)
    }

    /// Samples StatefulSet `statefulset` of `namespace`: its pods, shard Leases, and the units
    /// `units` lists (wherever they are).
    pub fn of<K>(client: kube::Client, units: Api<K>, namespace: &str, statefulset: &str) -> Self
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let statefulset = statefulset.to_string();
        Self::sampling(client, namespace, move || {
            let (leases, units, statefulset) = (leases.clone(), units.clone(), statefulset.clone());
            async move { sample(&leases, &units, &statefulset).await }
        })
    }

    /// Samples StatefulSet `statefulset` of `namespace` whose replicas own ranges of the UIDs of
    /// the objects `objects` lists: its pods, shard Leases, and the records of the ranges
    /// ([`super::ranges`]). An object is owned when the record it falls under is held by the
    /// term that holds its shard's Lease, with no handoff under way.
    pub fn of_ranges<K>(
        client: kube::Client,
        objects: Api<K>,
        namespace: &str,
        statefulset: &str,
    ) -> Self
    where
        K: kube::Resource
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let (home, statefulset) = (namespace.to_string(), statefulset.to_string());
        let reader = client.clone();
        Self::sampling(client, namespace, move || {
            let (client, leases, objects) = (reader.clone(), leases.clone(), objects.clone());
            let (home, statefulset) = (home.clone(), statefulset.clone());
            async move { sample_ranges(&client, &leases, &objects, &home, &statefulset).await }
        })
    }

    /// Follows the pods of `namespace` and takes a sample with `sample` every 100 ms, until
    /// stopped.
    fn sampling<F, Fut>(client: kube::Client, namespace: &str, sample: F) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<Sample>> + Send,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let pods = tokio::spawn(pod_history(
            Api::namespaced(client, namespace),
            stopped.clone(),
        ));
        let clusters = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !*stopped.borrow() {
                samples.extend(sample().await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        Self {
            stop,
            clusters,
            pods,
        }
    }

    pub async fn stop(self) -> Samples {
        let _ = self.stop.send(true);
        Samples {
            clusters: self.clusters.await.unwrap(),
            pods: self.pods.await.unwrap(),
        }
    }
}

/// Every state of the namespace's pods from now until `stopped`, one per watch event. A relist
/// (after a watch error) adds one state, the list's, when it is complete.
async fn pod_history(pods: Api<Pod>, mut stopped: tokio::sync::watch::Receiver<bool>) -> Vec<Pods> {
    use futures::StreamExt;
    use kube_runtime::watcher::{self, Event};
    fn entry(pod: &Pod) -> Option<(String, (String, bool))> {
        let name = pod.metadata.name.clone()?;
        let revision = pod
            .metadata
            .labels
            .as_ref()?
            .get("controller-revision-hash")?
            .clone();
        let alive = pod.metadata.deletion_timestamp.is_none();
        alive.then(|| (name, (revision, pod_ready(pod))))
    }
    // With a backoff: without one, a watch whose server is gone retries without yielding.
    let mut events = std::pin::pin!(kube_runtime::WatchStreamExt::default_backoff(
        watcher::watcher(pods, watcher::Config::default())
    ));
    let mut current = Pods::new();
    let mut listing = Pods::new();
    let mut history = Vec::new();
    loop {
        let event = tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => break,
            event = events.next() => event,
        };
        match event {
            Some(Ok(Event::Apply(pod))) => {
                let name = pod.metadata.name.clone().unwrap_or_default();
                match entry(&pod) {
                    Some((name, state)) => current.insert(name, state),
                    None => current.remove(&name),
                };
            }
            Some(Ok(Event::Delete(pod))) => {
                current.remove(&pod.metadata.name.clone().unwrap_or_default());
            }
            Some(Ok(Event::Init)) => {
                listing.clear();
                continue;
            }
            Some(Ok(Event::InitApply(pod))) => {
                listing.extend(entry(&pod));
                continue;
            }
            Some(Ok(Event::InitDone)) => current = std::mem::take(&mut listing),
            Some(Err(_)) => continue,
            None => break,
        }
        history.push(current.clone());
    }
    history
}

async fn sample<K>(leases: &Api<Lease>, units: &Api<K>, statefulset: &str) -> Option<Sample>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let at = Instant::now();
    let params = ListParams::default();
    let lease_list = leases.list(&params).await.ok()?;
    // Metadata only: the record is all a sample reads.
    let unit_list = units.list_metadata(&params).await.ok()?;
    let holders: BTreeMap<String, String> = lease_list
        .items
        .into_iter()
        .filter_map(|l| Some((l.metadata.name?, l.spec?.holder_identity?)))
        .collect();
    let mut owned = BTreeSet::new();
    let mut all = BTreeSet::new();
    for unit in unit_list.items {
        let meta = &unit.metadata;
        let name = match &meta.namespace {
            Some(namespace) => format!("{namespace}/{}", meta.name.clone().unwrap_or_default()),
            None => meta.name.clone().unwrap_or_default(),
        };
        all.insert(name.clone());
        let annotations = meta.annotations.clone().unwrap_or_default();
        let holder = annotations.get(shardwise_handoff::keys::HOLDER_ANNOTATION);
        let draining = annotations.contains_key(shardwise_handoff::keys::DRAIN_TO_ANNOTATION);
        let live = super::shard_label(&unit)
            .and_then(|shard| holders.get(&format!("{statefulset}-shard-{shard}")))
            .is_some_and(|h| Some(h) == holder);
        if live && !draining {
            owned.insert(name);
        }
    }
    Some(Sample {
        at,
        owned,
        clusters: all,
    })
}

async fn sample_ranges<K>(
    client: &kube::Client,
    leases: &Api<Lease>,
    objects: &Api<K>,
    namespace: &str,
    statefulset: &str,
) -> Option<Sample>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let at = Instant::now();
    let params = ListParams::default();
    let lease_list = leases.list(&params).await.ok()?;
    let records = super::ranges::records(client, namespace, statefulset)
        .await
        .ok()?;
    let object_list = objects.list_metadata(&params).await.ok()?;
    let holders: BTreeMap<String, String> = lease_list
        .items
        .into_iter()
        .filter_map(|l| Some((l.metadata.name?, l.spec?.holder_identity?)))
        .collect();
    let mut owned = BTreeSet::new();
    let mut all = BTreeSet::new();
    for object in object_list.items {
        let meta = &object.metadata;
        let name = format!(
            "{}/{}",
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default()
        );
        all.insert(name.clone());
        let record = super::ranges::record_of(&records, meta.uid.as_deref().unwrap_or_default());
        let live = record.is_some_and(|r| {
            let shard = r.shard.map(|s| format!("{statefulset}-shard-{s}"));
            !r.draining
                && r.holder.is_some()
                && shard.and_then(|s| holders.get(&s)) == r.holder.as_ref()
        });
        if live {
            owned.insert(name);
        }
    }
    Some(Sample {
        at,
        owned,
        clusters: all,
    })
}

/// The longest time any cluster spent without an owner that holds its lease and is not
/// draining it.
pub fn longest_handoff(samples: &[Sample]) -> Duration {
    let mut since: BTreeMap<&str, Instant> = BTreeMap::new();
    let mut longest = Duration::ZERO;
    for sample in samples {
        for cluster in &sample.clusters {
            if sample.owned.contains(cluster) {
                if let Some(start) = since.remove(cluster.as_str()) {
                    longest = longest.max(sample.at - start);
                }
            } else {
                since.entry(cluster).or_insert(sample.at);
            }
        }
    }
    let end = samples.last().map(|s| s.at);
    for start in since.values() {
        longest = longest.max(end.unwrap_or(*start) - *start);
    }
    longest
}

/// A control plane with one node and one destination cluster, reached as
/// [`DESTINATION_IDENTITY`].
pub fn environment() -> Environment {
    Environment::builder()
        .nodes(1)
        .destinations(1)
        .destination_identity(Identity::admin(DESTINATION_IDENTITY))
        .start()
        .unwrap()
}

/// The fleet in [`NAMESPACE`]: `clusters` FleetClusters on the destination, sharing one
/// credentials Secret, and apps `apps` spread over them.
pub async fn add_fleet(env: &Environment, clusters: u32, apps: std::ops::Range<u32>) {
    let cp = env.control_plane();
    let destination = &env.destinations()[0];
    let server = destination.url_for(DESTINATION_IDENTITY).unwrap();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "dest-0-credentials", "namespace": NAMESPACE,
                     "labels": {"shardwise.io/secret-type": "cluster"}},
        "stringData": {"server": server,
                       "token": destination.token(DESTINATION_IDENTITY).unwrap(),
                       "ca.crt": destination.ca_pem()},
    });
    cp.apply_yaml("admin", &secret.to_string()).await.unwrap();
    for i in 0..clusters {
        let cluster = json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetCluster",
            "metadata": {"name": format!("cluster-{i}"), "namespace": NAMESPACE},
            "spec": {"server": server,
                     "credentials": {"secretRef": {"name": "dest-0-credentials"}}},
        });
        cp.apply_yaml("admin", &cluster.to_string()).await.unwrap();
    }
    add_apps(env, clusters, apps).await;
}

/// Apps `apps` in [`NAMESPACE`], app `i` on `cluster-{i % clusters}` in namespace
/// `team-{i % 5}`.
async fn add_apps(env: &Environment, clusters: u32, apps: std::ops::Range<u32>) {
    let admin = env.control_plane().client("admin").await.unwrap();
    let api: Api<FleetApp> = Api::namespaced(admin, NAMESPACE);
    for i in apps {
        let app: FleetApp = serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
            "metadata": {"name": format!("app-{i}"), "namespace": NAMESPACE},
            "spec": {"destination": {"cluster": format!("cluster-{}", i % clusters), "namespace": format!("team-{}", i % 5)},
                     "source": {"manifests": app_manifests(i, 1)}},
        }))
        .unwrap();
        api.create(&PostParams::default(), &app).await.unwrap();
    }
}
