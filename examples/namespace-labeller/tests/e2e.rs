//! The labeller as a user runs it: its rbac.yaml and statefulset.yaml applied to a control
//! plane that runs pods, so that the real StatefulSet controller creates the three replicas,
//! and scales them to two and then to four, under the example's ServiceAccount with its RBAC
//! enforced. Every namespace and ConfigMap is stamped by the replica that owns it, and the
//! merged audit shows no instant at which two processes worked on one namespace. Needs root
//! and the binaries of scripts/control-plane.sh, as every node environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use shardwise_e2e::{Environment, pod_ready, wait_for};
use shardwise_runtime::audit;
use twox_hash::XxHash3_64;

const HOME: &str = "labeller";
const TEAMS: usize = 12;
const MAPS_PER_TEAM: usize = 3;
/// The test's ConfigMaps in each team namespace, and the `kube-root-ca.crt` that
/// kube-controller-manager publishes in every namespace.
const MAPS_IN_TEAM: usize = MAPS_PER_TEAM + 1;
const SETTLE: Duration = Duration::from_secs(120);
const SHARD: &str = "shardwise.io/shard";
const UNIT: &str = "shardwise.io/unit";
const DIGEST: &str = "labeller.shardwise.io/digest";
const COUNT: &str = "labeller.shardwise.io/configmaps";
/// Where the test has each replica write its audit (an emptyDir).
const AUDIT_DIR: &str = "/var/log/labeller";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Deployment {
    env: Environment,
    admin: kube::Client,
}

fn example_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// statefulset.yaml's documents, with what the test must add to the StatefulSet: `replicas`,
/// an audit file on an emptyDir, and short leases and resyncs so that it runs in seconds.
fn manifests(replicas: u32) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(example_file("statefulset.yaml"))?;
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&text)?;
    for doc in &mut docs {
        if doc["kind"] != "StatefulSet" {
            continue;
        }
        doc["spec"]["replicas"] = json!(replicas);
        let pod = &mut doc["spec"]["template"]["spec"];
        pod["volumes"] = json!([{"name": "audit", "emptyDir": {}}]);
        let container = &mut pod["containers"][0];
        container["args"] = json!(["--resync-interval=5s"]);
        container["volumeMounts"] = json!([{"name": "audit", "mountPath": AUDIT_DIR}]);
        let env = container["env"]
            .as_array_mut()
            .ok_or("statefulset.yaml: the container has no env")?;
        for (name, value) in [
            ("SHARDWISE_AUDIT_FILE", format!("{AUDIT_DIR}/audit.jsonl")),
            ("SHARDWISE_LEASE_DURATION", "6s".into()),
            ("SHARDWISE_RENEW_DEADLINE", "4s".into()),
            ("SHARDWISE_RETRY_PERIOD", "1s".into()),
            ("SHARDWISE_PLAN_INTERVAL", "3s".into()),
        ] {
            env.push(json!({"name": name, "value": value}));
        }
    }
    Ok(docs)
}

impl Deployment {
    async fn start(replicas: u32) -> Result<Self> {
        let env = Environment::builder().nodes(1).start()?;
        let cp = env.control_plane();
        let admin = cp.client("admin").await?;
        let deployment = Self { env, admin };
        for team in 0..TEAMS {
            deployment.create_team(team).await?;
        }
        let cp = deployment.env.control_plane();
        cp.apply_yaml(
            "admin",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {HOME}\n"),
        )
        .await?;
        cp.apply_file("admin", &example_file("rbac.yaml")).await?;
        for doc in manifests(replicas)? {
            cp.apply_yaml("admin", &doc.to_string()).await?;
        }
        Ok(deployment)
    }

    async fn create_team(&self, team: usize) -> Result<()> {
        let cp = self.env.control_plane();
        cp.apply_yaml(
            "admin",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-{team}\n"),
        )
        .await?;
        for map in 0..MAPS_PER_TEAM {
            cp.apply_yaml("admin", &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{map}\n  namespace: team-{team}\ndata:\n  value: \"{team}-{map}\"\n"
            ))
            .await?;
        }
        Ok(())
    }

    /// `kubectl scale` as the API sees it: the StatefulSet controller does the rest.
    async fn scale(&self, replicas: u32) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.admin.clone(), HOME);
        let patch = json!({"spec": {"replicas": replicas}});
        api.patch(HOME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Waits until the StatefulSet runs exactly `replicas` pods, all Ready.
    async fn pods_ready(&self, replicas: u32) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), HOME);
        wait_for(
            &format!("{replicas} labeller pods Ready"),
            SETTLE,
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = list.items.iter().filter(|p| pod_ready(p)).count();
                if list.items.len() == replicas as usize && ready == replicas as usize {
                    Ok(())
                } else {
                    Err(format!("{ready} Ready of {} pods", list.items.len()))
                }
            },
        )
        .await?;
        Ok(())
    }

    /// The audit files of every labeller pod the node ran, running or gone.
    fn audits(&self) -> Result<Vec<PathBuf>> {
        let pods = self.env.dir().join("nodes").join("node-0");
        let mut files = Vec::new();
        for pod in std::fs::read_dir(&pods)? {
            let pod = pod?.path();
            let ours = pod
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{HOME}_{HOME}-")));
            let file = pod.join("volumes/audit/audit.jsonl");
            if ours && Path::new(&file).is_file() {
                files.push(file);
            }
        }
        Ok(files)
    }

    /// Waits until every team namespace is owned by one of `0..replicas` (each of them owning
    /// some), counted, and every ConfigMap in it is digested and labelled with its namespace's
    /// token (16 hex digits of the XXH3-64 of its name), and with no shard.
    /// Returns the digests.
    async fn settled(&self, replicas: u32) -> Result<BTreeMap<String, String>> {
        let namespaces: Api<Namespace> = Api::all(self.admin.clone());
        let config_maps: Api<ConfigMap> = Api::all(self.admin.clone());
        let digests = wait_for(
            &format!("{replicas} replicas to label every team"),
            SETTLE,
            || async {
                let mut owners = BTreeMap::new();
                for ns in namespaces
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let shard = ns.labels().get(SHARD).and_then(|s| s.parse::<u32>().ok());
                    let Some(shard) = shard.filter(|&s| s < replicas) else {
                        return Err(format!("namespace {} has shard {shard:?}", ns.name_any()));
                    };
                    if ns.name_any().starts_with("team-")
                        && ns.annotations().get(COUNT) != Some(&MAPS_IN_TEAM.to_string())
                    {
                        return Err(format!(
                            "namespace {} counted {:?}",
                            ns.name_any(),
                            ns.annotations().get(COUNT)
                        ));
                    }
                    owners.insert(ns.name_any(), shard);
                }
                let busy: std::collections::BTreeSet<u32> = owners.values().copied().collect();
                if busy.len() != replicas as usize {
                    return Err(format!("only shards {busy:?} own namespaces"));
                }
                let mut digests = BTreeMap::new();
                for cm in config_maps
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let namespace = cm.namespace().unwrap_or_default();
                    let token = format!("{:016x}", XxHash3_64::oneshot(namespace.as_bytes()));
                    let labels = (cm.labels().get(UNIT), cm.labels().get(SHARD));
                    if labels != (Some(&token), None) {
                        return Err(format!(
                            "ConfigMap {namespace}/{} has unit and shard labels {labels:?}",
                            cm.name_any()
                        ));
                    }
                    let Some(digest) = cm.annotations().get(DIGEST) else {
                        return Err(format!(
                            "ConfigMap {namespace}/{} has no digest",
                            cm.name_any()
                        ));
                    };
                    digests.insert(format!("{namespace}/{}", cm.name_any()), digest.clone());
                }
                Ok(digests)
            },
        )
        .await?;
        Ok(digests)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_then_two_then_four_replicas_label_everything_and_never_overlap() -> Result<()> {
    let deployment = Deployment::start(3).await?;
    deployment.pods_ready(3).await?;
    let first = deployment.settled(3).await?;
    // A real kube-apiserver keeps ConfigMaps of its own in kube-system (labelled as well): count
    // the test's.
    let ours = first.keys().filter(|k| k.starts_with("team-")).count();
    assert_eq!(ours, TEAMS * MAPS_IN_TEAM);

    deployment.scale(2).await?;
    deployment.pods_ready(2).await?;
    deployment.settled(2).await?;
    // A change of data is seen and stamped by whichever replica owns the namespace now.
    let config_maps: Api<ConfigMap> = Api::namespaced(deployment.admin.clone(), "team-5");
    let patch = json!({"data": {"value": "changed"}});
    config_maps
        .patch("settings-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let before = first["team-5/settings-0"].clone();
    wait_for(
        "the changed ConfigMap to be digested again",
        SETTLE,
        || async {
            let cm = config_maps
                .get("settings-0")
                .await
                .map_err(|e| e.to_string())?;
            match cm.annotations().get(DIGEST) {
                Some(d) if *d != before => Ok(()),
                other => Err(format!("digest {other:?}")),
            }
        },
    )
    .await?;

    deployment.scale(4).await?;
    deployment.pods_ready(4).await?;
    deployment.settled(4).await?;
    // Every replica stopped gracefully (its in-flight reconciles end in the audit).
    deployment.scale(0).await?;
    deployment.pods_ready(0).await?;

    let intervals = audit::read(&deployment.audits()?, "namespace")?;
    let shards: std::collections::BTreeSet<u32> = intervals.iter().map(|i| i.shard).collect();
    assert_eq!(shards.len(), 4, "every replica reconciled: {shards:?}");
    assert!(
        intervals.iter().any(|i| i.unit == "team-5"),
        "the audit names namespaces"
    );
    println!(
        "{} reconciles by {} replicas checked",
        intervals.len(),
        shards.len()
    );
    let overlaps = audit::overlaps(&intervals, &BTreeMap::new());
    assert!(
        overlaps.is_empty(),
        "{} overlaps, first: {}",
        overlaps.len(),
        overlaps[0]
    );
    Ok(())
}
