//! The labeller as a user runs it: three replicas on kube-apiserver with its RBAC
//! enforced, scaled to two and then to four. Every namespace and ConfigMap is stamped by the
//! replica that owns it, and the merged audit shows no instant at which two processes worked
//! on one namespace.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use shardwise_e2e::{Environment, Identity, Process, ProcessSpec, free_port, wait_for};
use shardwise_runtime::audit;
use twox_hash::XxHash3_64;

const HOME: &str = "labeller";
const TEAMS: usize = 12;
const MAPS_PER_TEAM: usize = 3;
const SETTLE: Duration = Duration::from_secs(90);
const SHARD: &str = "shardwise.io/shard";
const UNIT: &str = "shardwise.io/unit";
const DIGEST: &str = "labeller.shardwise.io/digest";
const COUNT: &str = "labeller.shardwise.io/configmaps";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Deployment {
    env: Environment,
    admin: kube::Client,
    replicas: BTreeMap<u32, Process>,
    audits: Vec<PathBuf>,
}

impl Deployment {
    async fn start(replicas: u32) -> Result<Self> {
        let mut builder = Environment::builder();
        for ordinal in 0..5 {
            builder = builder.identity(Identity::service_account(
                format!("{HOME}-{ordinal}"),
                HOME,
                "labeller",
            ));
        }
        let env = builder.start()?;
        let cp = env.control_plane();
        cp.apply_yaml(
            "admin",
            &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {HOME}\n"),
        )
        .await?;
        cp.apply_file(
            "admin",
            &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rbac.yaml"),
        )
        .await?;
        cp.apply_yaml("admin", &format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: {HOME}\n  namespace: {HOME}\nspec:\n  replicas: {replicas}\n  serviceName: {HOME}\n  selector:\n    matchLabels: {{app: labeller}}\n  template:\n    metadata:\n      labels: {{app: labeller}}\n    spec:\n      containers: [{{name: labeller, image: labeller:test}}]\n"
        ))
        .await?;
        let admin = cp.client("admin").await?;
        let mut deployment = Self {
            env,
            admin,
            replicas: BTreeMap::new(),
            audits: Vec::new(),
        };
        for team in 0..TEAMS {
            deployment.create_team(team).await?;
        }
        for ordinal in 0..replicas {
            deployment.spawn(ordinal)?;
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

    fn spawn(&mut self, ordinal: u32) -> Result<()> {
        let name = format!("{HOME}-{ordinal}");
        let port = free_port()?;
        let audit = self
            .env
            .dir()
            .join(format!("audit-{ordinal}-{}.jsonl", self.audits.len()));
        let spec = ProcessSpec::new(name.clone(), env!("CARGO_BIN_EXE_namespace-labeller"))
            .env("POD_NAME", &name)
            .env("POD_NAMESPACE", HOME)
            .env(
                "KUBECONFIG",
                self.env.control_plane().kubeconfig_path(&name)?,
            )
            .args([
                format!("--metrics-addr=127.0.0.1:{port}"),
                format!("--health-addr=127.0.0.1:{port}"),
                "--metrics-secure=false".to_string(),
                format!("--audit-file={}", audit.display()),
                // Short leases so that the test runs in seconds.
                "--lease-duration=6s".to_string(),
                "--renew-deadline=4s".to_string(),
                "--retry-period=1s".to_string(),
                "--plan-interval=3s".to_string(),
                "--resync-interval=5s".to_string(),
            ]);
        self.audits.push(audit);
        self.replicas.insert(ordinal, self.env.spawn(&spec)?);
        Ok(())
    }

    async fn scale(&self, replicas: u32) -> Result<()> {
        let api: Api<StatefulSet> = Api::namespaced(self.admin.clone(), HOME);
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        api.patch(HOME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn stop(&mut self, ordinal: u32) -> Result<()> {
        if let Some(mut process) = self.replicas.remove(&ordinal) {
            let status = process.stop(Duration::from_secs(30)).await?;
            if !status.success() {
                return Err(format!(
                    "replica {ordinal} exited with {status}:\n{}",
                    process.report()
                )
                .into());
            }
        }
        Ok(())
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
                        && ns.annotations().get(COUNT).map(String::as_str) != Some("3")
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

#[tokio::test]
async fn three_then_two_then_four_replicas_label_everything_and_never_overlap() -> Result<()> {
    let mut deployment = Deployment::start(3).await?;
    let first = deployment.settled(3).await?;
    // A real kube-apiserver keeps ConfigMaps of its own in kube-system (labelled as well): count
    // the test's.
    let ours = first.keys().filter(|k| k.starts_with("team-")).count();
    assert_eq!(ours, TEAMS * MAPS_PER_TEAM);

    deployment.scale(2).await?;
    deployment.stop(2).await?;
    deployment.settled(2).await?;
    // A change of data is seen and stamped by whichever replica owns the namespace now.
    let config_maps: Api<ConfigMap> = Api::namespaced(deployment.admin.clone(), "team-5");
    let patch = serde_json::json!({"data": {"value": "changed"}});
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
    deployment.spawn(2)?;
    deployment.spawn(3)?;
    deployment.settled(4).await?;
    for ordinal in 0..4 {
        deployment.stop(ordinal).await?;
    }

    let intervals = audit::read(&deployment.audits, "namespace")?;
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
