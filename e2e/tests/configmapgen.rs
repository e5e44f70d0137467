//! kube-rs's configmapgen controller sharded with shardwise-runtime (examples/configmapgen,
//! `configmapgen-sharded`), run as a user runs it: its rbac.yaml and statefulset.yaml applied
//! to a control plane that runs pods, so that the real StatefulSet controller creates three
//! replicas, under the example's ServiceAccount with its RBAC enforced. Through a scale from 3
//! to 2 and a SIGKILL, every generator's ConfigMap follows its content, the merged audit shows
//! no instant at which two processes reconciled one generator, and the server received no write
//! of a term after its lease could have expired. Then 300 generators through 3 -> 4 -> 2
//! replicas, placed by labels, and by ranges of their UIDs with kube-apiserver's shardSelector
//! (KEP-5866) on and off.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use configmapgen::ConfigMapGenerator;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use shardwise_e2e::{Environment, wait_for};
use shardwise_runtime::audit;
use shardwise_runtime::kind::Placement;
use support::chart::{Sampler, longest_handoff};
use support::fencing::{LeaseHistory, assert_no_late_writes};
use support::pods;

const HOME: &str = "configmapgen";
/// Generators of the scale-and-kill test, spread over [`NAMESPACES`] namespaces.
const GENERATORS: usize = 60;
const NAMESPACES: usize = 3;
/// How long a graceful handoff may leave a generator without a live owner (as the chart
/// suite's rolling update): the planner moves a gone replica's objects in one pass, within its
/// write budget (200 a second, a burst of 400).
const HANDOFF_BOUND: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(120);
const SHARD: &str = "shardwise.io/shard";
/// Where the test has each replica write its audit (an emptyDir).
const AUDIT_DIR: &str = "/var/log/configmapgen";
/// The sharded binary, as the node runs it.
const PROGRAM: &str = "configmapgen-sharded";

/// Held by each 300-object test while it runs.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn example_file(name: &str) -> PathBuf {
    support::repo_file("examples/configmapgen").join(name)
}

/// statefulset.yaml's documents, with what the test adds to the StatefulSet: `replicas`, the
/// placement, an audit file on an emptyDir, info logs, and short leases so that it runs in
/// seconds.
fn manifests(replicas: u32, placement: Placement) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(example_file("statefulset.yaml"))?;
    let mut docs: Vec<Value> = serde_saphyr::from_multiple(&text)?;
    for doc in docs.iter_mut().filter(|d| d["kind"] == "StatefulSet") {
        doc["spec"]["replicas"] = json!(replicas);
        let pod = &mut doc["spec"]["template"]["spec"];
        pod["volumes"] = json!([{"name": "audit", "emptyDir": {}}]);
        let container = &mut pod["containers"][0];
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
            ("SHARDWISE_PLACEMENT", placement_flag(placement).into()),
            ("RUST_LOG", "info".into()),
        ] {
            env.push(json!({"name": name, "value": value}));
        }
    }
    Ok(docs)
}

fn placement_flag(placement: Placement) -> &'static str {
    match placement {
        Placement::Labels => "labels",
        Placement::UidRanges => "uid-ranges",
    }
}

/// What the audit names the unit of a reconcile by.
fn unit_field(placement: Placement) -> &'static str {
    match placement {
        Placement::Labels => shardwise_runtime::kind::NOUNS.unit,
        Placement::UidRanges => shardwise_runtime::kind::UID_RANGE_NOUNS.unit,
    }
}

struct Deployment {
    env: Environment,
    admin: kube::Client,
    generators: usize,
    placement: Placement,
}

impl Deployment {
    async fn start(replicas: u32, generators: usize, placement: Placement) -> Result<Self> {
        Self::start_on(replicas, generators, placement, false).await
    }

    /// [`Self::start`], on a kube-apiserver with KEP-5866's `ShardedListAndWatch` gate on if
    /// `server_selects`.
    async fn start_on(
        replicas: u32,
        generators: usize,
        placement: Placement,
        server_selects: bool,
    ) -> Result<Self> {
        let mut builder = Environment::builder().nodes(1);
        if server_selects {
            builder = builder.apiserver_args(["--feature-gates=ShardedListAndWatch=true"]);
        }
        let env = builder.start()?;
        let admin = env.control_plane().client("admin").await?;
        let deployment = Self {
            env,
            admin,
            generators,
            placement,
        };
        deployment.install_crd().await?;
        if placement == Placement::UidRanges {
            deployment.install_shardwise_crds().await?;
        }
        let cp = deployment.env.control_plane();
        for namespace in std::iter::once(HOME.to_string()).chain((0..NAMESPACES).map(team)) {
            cp.apply_yaml(
                "admin",
                &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"),
            )
            .await?;
        }
        for i in 0..generators {
            let generator = ConfigMapGenerator::new(
                &format!("gen-{i}"),
                configmapgen::ConfigMapGeneratorSpec {
                    content: content(i, 1),
                },
            );
            Api::<ConfigMapGenerator>::namespaced(deployment.admin.clone(), &team(i % NAMESPACES))
                .create(&PostParams::default(), &generator)
                .await?;
        }
        cp.apply_file("admin", &example_file("rbac.yaml")).await?;
        for doc in manifests(replicas, placement)? {
            cp.apply_yaml("admin", &doc.to_string()).await?;
        }
        Ok(deployment)
    }

    /// The example's CRD, from its type, once the server serves it.
    async fn install_crd(&self) -> Result<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin.clone());
        let crd = ConfigMapGenerator::crd();
        let name = crd.name_any();
        crds.create(&PostParams::default(), &crd).await?;
        wait_for("the ConfigMapGenerator CRD established", SETTLE, || async {
            let crd = crds.get(&name).await.map_err(|e| e.to_string())?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                Ok(())
            } else {
                Err("not established".to_string())
            }
        })
        .await?;
        Ok(())
    }

    /// shardwise's CRDs (deploy/crds.yaml), for the UnitSlices of placement by UID ranges, once
    /// the server serves UnitSlices.
    async fn install_shardwise_crds(&self) -> Result<()> {
        let cp = self.env.control_plane();
        cp.apply_file("admin", &support::repo_file("deploy/crds.yaml"))
            .await?;
        let slices: Api<shardwise_runtime::slice::UnitSlice> =
            Api::namespaced(self.admin.clone(), HOME);
        wait_for("UnitSlices served", SETTLE, || async {
            slices
                .list(&ListParams::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await?;
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

    /// Waits until the StatefulSet runs exactly `replicas` pods, all with their process.
    async fn pods_running(&self, replicas: u32) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), HOME);
        wait_for(
            &format!("{replicas} configmapgen pods running"),
            SETTLE,
            || async {
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let running = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        pods::container_pid(&p.name_any(), p.metadata.uid.as_deref(), PROGRAM)
                            .is_some()
                    })
                    .count();
                if list.items.len() == replicas as usize && running == replicas as usize {
                    Ok(())
                } else {
                    Err(format!("{running} running of {} pods", list.items.len()))
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Sets every generator's content to its `version`.
    async fn rewrite(&self, version: u32) -> Result<()> {
        for i in 0..self.generators {
            let api: Api<ConfigMapGenerator> =
                Api::namespaced(self.admin.clone(), &team(i % NAMESPACES));
            let patch = json!({"spec": {"content": content(i, version)}});
            api.patch(
                &format!("gen-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
        Ok(())
    }

    /// Waits until every generator is placed on one of `0..replicas` (each of them holding
    /// some), and its ConfigMap holds its content of `version` and is owned by it.
    async fn settled(&self, replicas: u32, version: u32) -> Result<()> {
        let generators: Api<ConfigMapGenerator> = Api::all(self.admin.clone());
        let config_maps: Api<ConfigMap> = Api::all(self.admin.clone());
        wait_for(
            &format!("{replicas} replicas to generate version {version} of every ConfigMap"),
            SETTLE,
            || async {
                let mut shards = BTreeSet::new();
                let mut uids = BTreeMap::new();
                let ranges = match self.placement {
                    Placement::Labels => Vec::new(),
                    Placement::UidRanges => support::ranges::records(&self.admin, HOME, HOME)
                        .await
                        .map_err(|e| e.to_string())?,
                };
                for g in generators
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let shard = match self.placement {
                        Placement::Labels => {
                            g.labels().get(SHARD).and_then(|s| s.parse::<u32>().ok())
                        }
                        Placement::UidRanges => {
                            support::ranges::record_of(&ranges, &g.uid().unwrap_or_default())
                                .filter(|r| !r.draining)
                                .and_then(|r| r.shard)
                        }
                    };
                    let Some(shard) = shard.filter(|&s| s < replicas) else {
                        return Err(format!("generator {} has shard {shard:?}", g.name_any()));
                    };
                    shards.insert(shard);
                    let key = format!("{}/{}", g.namespace().unwrap_or_default(), g.name_any());
                    uids.insert(key, g.uid().unwrap_or_default());
                }
                if shards.len() != replicas as usize || uids.len() != self.generators {
                    return Err(format!("{} generators on shards {shards:?}", uids.len()));
                }
                let mut generated = 0;
                for cm in config_maps
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                {
                    let key = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
                    let Some(uid) = uids.get(&key) else { continue };
                    let i: usize = cm.name_any()["gen-".len()..]
                        .parse()
                        .map_err(|_| key.clone())?;
                    let data = cm.data.as_ref().and_then(|d| d.get("content"));
                    if data != Some(&content(i, version)) {
                        return Err(format!("ConfigMap {key} holds {data:?}"));
                    }
                    let owned = cm.owner_references().iter().any(|o| &o.uid == uid);
                    if !owned {
                        return Err(format!("ConfigMap {key} is not owned by its generator"));
                    }
                    generated += 1;
                }
                if generated == self.generators {
                    Ok(())
                } else {
                    Err(format!(
                        "{generated} of {} ConfigMaps generated",
                        self.generators
                    ))
                }
            },
        )
        .await?;
        Ok(())
    }
}

impl Deployment {
    /// The merged audit of every replica that ran, once checked: `replicas` of them
    /// reconciled, every generator was reconciled, and no two processes reconciled one
    /// generator at once (a process killed at a time in `deaths` worked until then).
    fn audited(
        &self,
        replicas: usize,
        deaths: &BTreeMap<u32, u64>,
    ) -> Result<Vec<audit::Interval>> {
        let files = pods::audit_files(&self.env, HOME, HOME);
        let intervals = audit::read(&files, unit_field(self.placement))?;
        let shards: BTreeSet<u32> = intervals.iter().map(|i| i.shard).collect();
        assert_eq!(
            shards.len(),
            replicas,
            "every replica reconciled: {shards:?}"
        );
        // The generator is the unit with labels, the reconciled key of the StatefulSet's ranges
        // with UID ranges.
        let reconciled: BTreeSet<&str> = intervals
            .iter()
            .map(|i| match self.placement {
                Placement::Labels => i.unit.as_str(),
                Placement::UidRanges => i.key.as_str(),
            })
            .collect();
        for i in 0..self.generators {
            let key = format!("{}/gen-{i}", team(i % NAMESPACES));
            assert!(
                reconciled.contains(key.as_str()),
                "{key} was never reconciled"
            );
        }
        let overlaps = audit::overlaps(&intervals, deaths);
        assert!(
            overlaps.is_empty(),
            "{} overlaps, first: {}",
            overlaps.len(),
            overlaps[0]
        );
        Ok(intervals)
    }
}

fn team(i: usize) -> String {
    format!("team-{i}")
}

fn content(i: usize, version: u32) -> String {
    format!("generator {i}, version {version}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sharded_kube_runtime_controller_generates_everything_through_a_scale_and_a_sigkill()
-> Result<()> {
    let deployment = Deployment::start(3, GENERATORS, Placement::Labels).await?;
    let leases = LeaseHistory::record(deployment.admin.clone(), HOME);
    deployment.pods_running(3).await?;
    deployment.settled(3, 1).await?;

    deployment.scale(2).await?;
    deployment.pods_running(2).await?;
    deployment.rewrite(2).await?;
    deployment.settled(2, 2).await?;

    // Replica 1 killed outright: the StatefulSet's node starts it again, and its new process
    // takes its shard once the old term's lease has expired.
    let victim = format!("{HOME}-1");
    let pid = pods::container_pid(&victim, None, PROGRAM).ok_or("no process of replica 1")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid)?),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    let deaths = BTreeMap::from([(pid, audit::now_nanos())]);
    deployment.rewrite(3).await?;
    deployment.settled(2, 3).await?;

    // Every replica stopped gracefully: its in-flight reconciles end in the audit.
    deployment.scale(0).await?;
    deployment.pods_running(0).await?;

    let files = pods::audit_files(&deployment.env, HOME, HOME);
    let intervals = audit::read(&files, shardwise_runtime::kind::NOUNS.unit)?;
    let shards: BTreeSet<u32> = intervals.iter().map(|i| i.shard).collect();
    assert_eq!(shards.len(), 3, "every replica reconciled: {shards:?}");
    let reconciled: BTreeSet<&str> = intervals.iter().map(|i| i.unit.as_str()).collect();
    for i in 0..GENERATORS {
        let key = format!("{}/gen-{i}", team(i % NAMESPACES));
        assert!(
            reconciled.contains(key.as_str()),
            "{key} was never reconciled"
        );
    }
    let overlaps = audit::overlaps(&intervals, &deaths);
    assert!(
        overlaps.is_empty(),
        "{} overlaps, first: {}",
        overlaps.len(),
        overlaps[0]
    );

    // From the server's side: every write of a replica but its lease renewals names its term,
    // and none arrived after that term's lease could have expired.
    let account = format!("system:serviceaccount:{HOME}:{HOME}");
    let writes: Vec<_> = deployment
        .env
        .control_plane()
        .server()
        .writes()
        .into_iter()
        .filter(|w| w.user == account && !w.path.starts_with("/apis/coordination.k8s.io/"))
        .collect();
    let checked = assert_no_late_writes(&writes, &leases.renewals(), HOME, "control-plane");
    assert!(checked >= 3 * GENERATORS, "{checked} writes checked");
    println!(
        "{} reconciles by {} replicas, {} writes of their terms checked",
        intervals.len(),
        shards.len(),
        checked
    );
    Ok(())
}

/// The one-kind mode's own test: 300 objects through 3 -> 4 -> 2 replicas. No instant with two
/// owners, and no generator longer than the handoff bound without a live owner (the record it
/// falls under held by the term that holds its shard's lease, no drain under way). Returns the
/// replicas' logs.
async fn three_hundred_objects(placement: Placement, server_selects: bool) -> Result<String> {
    // One at a time: each runs a control plane and four replicas moving 300 objects, and two
    // side by side on two cores measure the machine's contention more than the handoff.
    let _alone = ONE_AT_A_TIME.lock().await;
    let deployment = Deployment::start_on(3, 300, placement, server_selects).await?;
    deployment.pods_running(3).await?;
    deployment.settled(3, 1).await?;

    let generators: Api<ConfigMapGenerator> = Api::all(deployment.admin.clone());
    let sampler = match placement {
        Placement::Labels => Sampler::of(deployment.admin.clone(), generators, HOME, HOME),
        Placement::UidRanges => {
            Sampler::of_ranges(deployment.admin.clone(), generators, HOME, HOME)
        }
    };
    for (replicas, version) in [(4, 2), (2, 3)] {
        deployment.scale(replicas).await?;
        deployment.pods_running(replicas).await?;
        deployment.rewrite(version).await?;
        deployment.settled(replicas, version).await?;
    }
    let samples = sampler.stop().await;
    if placement == Placement::UidRanges {
        let api: Api<ConfigMapGenerator> = Api::all(deployment.admin.clone());
        for g in api.list_metadata(&ListParams::default()).await? {
            let written = g
                .labels()
                .keys()
                .chain(g.annotations().keys())
                .any(|k| k.starts_with("shardwise.io/"));
            assert!(
                !written,
                "generator {} was written: {:?}",
                g.name_any(),
                g.metadata
            );
        }
    }
    let longest = longest_handoff(&samples.clusters);
    println!(
        "{} (shardSelector {}), 3 -> 4 -> 2 replicas: the longest a generator went without a live owner: {longest:.1?}",
        placement_flag(placement),
        if server_selects { "on" } else { "off" }
    );
    assert!(
        longest < HANDOFF_BOUND,
        "a generator went {longest:?} without a live owner (a graceful handoff takes less than {HANDOFF_BOUND:?})"
    );

    deployment.scale(0).await?;
    deployment.pods_running(0).await?;
    let intervals = deployment.audited(4, &BTreeMap::new())?;
    println!("{} reconciles by 4 replicas checked", intervals.len());
    let logs = pods::pod_dirs(deployment.env.dir(), HOME, &format!("{HOME}-"))
        .iter()
        .flat_map(|dir| pods::container_logs(dir, HOME))
        .filter_map(|log| std::fs::read_to_string(log).ok())
        .collect();
    Ok(logs)
}

/// Each generator placed by a label on it: every API server selects by label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_objects_placed_by_labels_move_through_three_four_two_replicas() -> Result<()>
{
    three_hundred_objects(Placement::Labels, false).await?;
    Ok(())
}

/// The generators placed by ranges of their UIDs, nothing written to them, on a kube-apiserver
/// that serves KEP-5866's shardSelector: each replica's controller asks for its ranges alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_objects_placed_by_uid_ranges_move_with_the_servers_shard_selector()
-> Result<()> {
    let logs = three_hundred_objects(Placement::UidRanges, true).await?;
    assert!(
        logs.contains("the API server selects the objects of slices by key range"),
        "no replica found the server selecting by key range"
    );
    Ok(())
}

/// The same without the gate: the server sends every generator to every replica, and the
/// reconcile wrapper keeps each to its ranges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_objects_placed_by_uid_ranges_move_without_the_servers_shard_selector()
-> Result<()> {
    let logs = three_hundred_objects(Placement::UidRanges, false).await?;
    assert!(
        logs.contains("the API server does not select objects by key range"),
        "a replica found a server without the gate selecting by key range"
    );
    Ok(())
}
