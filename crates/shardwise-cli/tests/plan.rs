//! `shardwise plan` end to end: the real binary against the test Kubernetes API server of
//! `e2e/`, reading shardwise's resources and Argo CD's, and failing cleanly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::Value;
use shard_assign::{
    Cluster, KeyRange, PreviousPlacement, ShardSet, StrategyConfig, StrategyKind, app_key, assign,
    count_in, fnv1a_32,
};
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_e2e::argocd::APPLICATION_CRD;
use shardwise_e2e::{Environment, Identity};
use shardwise_handoff::plan::ObjectKey;
use shardwise_wire::slice::{UnitSlice, UnitSliceSpec};

mod common;
use common::{RUNTIME, USAGE, failure, shard_lease, shardwise, statefulset};

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("plan prints JSON")
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// One FleetCluster of the shardwise fixture.
struct Spec {
    name: &'static str,
    label: Option<&'static str>,
    apps: u32,
    pin: Option<u32>,
    weight: Option<u32>,
}

const fn spec(name: &'static str, label: Option<&'static str>, apps: u32) -> Spec {
    Spec {
        name,
        label,
        apps,
        pin: None,
        weight: None,
    }
}

/// Three shards by label, golf unlabelled, hotel with a label that is no ordinal, india pinned to
/// a shard that does not exist and twice as costly per app.
const FLEET: &[Spec] = &[
    spec("alpha", Some("0"), 12),
    spec("bravo", Some("1"), 9),
    spec("charlie", Some("2"), 7),
    spec("delta", Some("0"), 5),
    spec("echo", Some("1"), 3),
    spec("foxtrot", Some("2"), 2),
    spec("golf", None, 4),
    spec("hotel", Some("two"), 1),
    Spec {
        name: "india",
        label: Some("1"),
        apps: 6,
        pin: Some(7),
        weight: Some(2),
    },
];

const ORPHANS: u64 = 521;

fn shardwise_plan_yaml() -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: shardwise}\n");
    yaml.push_str("---\n");
    yaml.push_str(&statefulset("shardwise", "shardwise", 3, ""));
    for &Spec {
        name,
        label,
        apps,
        pin,
        weight,
    } in FLEET
    {
        let labels = label.map_or(String::new(), |l| {
            format!(", labels: {{shardwise.io/shard: \"{l}\"}}")
        });
        let mut spec = format!("server: \"https://{name}.example:6443\"");
        if let Some(pin) = pin {
            spec.push_str(&format!(", shard: {pin}"));
        }
        if let Some(weight) = weight {
            spec.push_str(&format!(", weight: {weight}"));
        }
        yaml.push_str(&format!(
            "---\napiVersion: shardwise.io/v1alpha1\nkind: FleetCluster\nmetadata: {{name: {name}, namespace: shardwise{labels}}}\nspec: {{{spec}}}\n"
        ));
        for j in 0..apps {
            yaml.push_str(&fleet_app(&format!("{name}-{j}"), name));
        }
    }
    // Apps of no cluster: more than a list page (500), so that reading them takes two pages.
    for i in 0..ORPHANS {
        yaml.push_str(&fleet_app(&format!("orphan-{i:03}"), "zulu"));
    }
    yaml
}

fn fleet_app(name: &str, cluster: &str) -> String {
    format!(
        "---\napiVersion: shardwise.io/v1alpha1\nkind: FleetApp\nmetadata: {{name: {name}, namespace: shardwise}}\nspec: {{destination: {{cluster: {cluster}, namespace: default}}, source: {{manifests: \"{{}}\"}}}}\n"
    )
}

/// Moves as (name, from, to, forced), from a strategy's JSON.
fn moves(strategy: &Value) -> BTreeSet<(String, u64, u64, bool)> {
    strategy["moved"]
        .as_array()
        .expect("moved is a list")
        .iter()
        .map(|m| {
            (
                m["cluster"].as_str().expect("cluster").to_string(),
                m["from"].as_u64().expect("from"),
                m["to"].as_u64().expect("to"),
                m["forced"].as_bool().expect("forced"),
            )
        })
        .collect()
}

fn strategy<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["strategies"]
        .as_array()
        .expect("strategies is a list")
        .iter()
        .find(|s| s["strategy"] == name)
        .unwrap_or_else(|| panic!("no {name} in the plan"))
}

#[tokio::test]
async fn plans_a_shardwise_plan_from_its_labels() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
        .await
        .unwrap();
    cp.apply_yaml("admin", &shardwise_plan_yaml())
        .await
        .unwrap();
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();

    let output = shardwise(&kubeconfig, &["--to", "2", "--format", "json"]);
    let report = json(&output);
    check_fleet_and_replicas(&report, &cp.url());
    check_plan_is_an_inventory(&output.stdout, &report);
    check_current_placement(&report);
    check_strategies_empty_the_removed_shard(&report);
    check_moves_are_shard_assigns(&report, cp.client("admin").await.unwrap()).await;
    check_table_and_csv(&kubeconfig);
    check_fallbacks_and_failures(&kubeconfig);
}

/// `plan --format json` read back as an inventory, from a file and from standard input, is the
/// fleet it describes: names, ids, apps, weights and pins, and no current shard taken for a pin.
fn check_plan_is_an_inventory(plan: &[u8], report: &Value) {
    assert_eq!(report["kind"], "plan");
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    // Numbers are rounded where they are written: 4 decimals at most.
    let mut fractions = Vec::new();
    numbers(report, &mut fractions);
    assert!(fractions.iter().any(|n| n.contains('.')), "{fractions:?}");
    for n in fractions {
        assert!(n.split_once('.').is_none_or(|(_, d)| d.len() <= 4), "{n}");
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan_file = dir.path().join("plan.json");
    std::fs::write(&plan_file, plan).expect("the directory is writable");
    // The same fleet written by hand.
    let mut inventory = String::new();
    for c in report["clusters"].as_array().expect("clusters is a list") {
        inventory.push_str(&format!(
            "- {{name: {}, id: {}, apps: {}, weight: {}",
            c["name"], c["id"], c["apps"], c["weight"]
        ));
        if let Some(pin) = c["pin"].as_u64() {
            inventory.push_str(&format!(", pin: {pin}"));
        }
        inventory.push_str("}\n");
    }
    let inventory_file = dir.path().join("fleet.yaml");
    std::fs::write(&inventory_file, inventory).expect("the directory is writable");

    // Eight shards: every current shard label (0 to 2) is live, so a label read as a pin
    // would show as one.
    let assign = |inventory: &Path, stdin: Option<&[u8]>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_shardwise"));
        command
            .args(["assign", "--strategy", "greedy-minimum", "--shards", "8"])
            .args(["--format", "json", "--inventory"])
            .arg(inventory)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("the shardwise binary runs");
        let mut input = child.stdin.take().expect("standard input is piped");
        if let Some(bytes) = stdin {
            std::io::Write::write_all(&mut input, bytes).expect("shardwise reads its input");
        }
        drop(input);
        let output = child.wait_with_output().expect("shardwise ends");
        json(&output);
        output.stdout
    };
    let from_plan = assign(&plan_file, None);
    assert_eq!(
        String::from_utf8_lossy(&from_plan),
        String::from_utf8_lossy(&assign(&inventory_file, None))
    );
    assert_eq!(from_plan, assign(Path::new("-"), Some(plan)));

    let assignment: Value = serde_json::from_slice(&from_plan).expect("assign prints JSON");
    let clusters = assignment["clusters"]
        .as_array()
        .expect("clusters is a list");
    assert_eq!(clusters.len(), FLEET.len());
    for c in clusters {
        let spec = FLEET
            .iter()
            .find(|s| c["name"] == s.name)
            .expect("a cluster of the fleet");
        assert_eq!(c["apps"], u64::from(spec.apps), "{c}");
        assert_eq!(c["pinned"], spec.pin.is_some(), "{c}");
    }
}

/// Every number of a document, as written.
fn numbers(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::Number(n) => into.push(n.to_string()),
        Value::Array(items) => items.iter().for_each(|item| numbers(item, into)),
        Value::Object(fields) => fields.values().for_each(|item| numbers(item, into)),
        _ => {}
    }
}

/// Where the fleet was read, its size, and the replica counts with their origin.
fn check_fleet_and_replicas(report: &Value, url: &str) {
    assert_eq!(report["source"], "shardwise");
    assert_eq!(report["namespace"], "shardwise");
    assert_eq!(report["server"], url.trim_end_matches('/'));
    assert_eq!(report["replicas"]["from"], 3);
    assert_eq!(report["replicas"]["to"], 2);
    assert_eq!(
        report["replicas"]["origin"],
        "StatefulSet shardwise/shardwise spec.replicas"
    );
    assert_eq!(report["fleet"]["clusters"], 9);
    assert_eq!(report["fleet"]["apps"], 49);
    assert_eq!(report["fleet"]["load"], 55);
    assert_eq!(report["fleet"]["unmatched_apps"], ORPHANS);
    let notes = report["notes"].to_string();
    assert!(
        notes.contains(r#"FleetCluster \"hotel\" has shard label \"two\""#),
        "{notes}"
    );
    assert!(
        notes.contains(r#"521 FleetApp(s) target no FleetCluster of the namespace and are not counted: \"orphan-000\", \"orphan-001\", \"orphan-002\" and 518 more"#),
        "{notes}"
    );
}

/// The placement now: the labels, weighted load included.
fn check_current_placement(report: &Value) {
    // Now: the labels, weighted load included; golf and hotel are unplaced.
    let current = &report["current"];
    assert_eq!(current["placement"], "labels");
    let shards: Vec<(u64, u64, u64, u64)> = current["shards"]
        .as_array()
        .expect("in the report")
        .iter()
        .map(|s| {
            let n = |k: &str| s[k].as_u64().expect("in the report");
            (n("shard"), n("clusters"), n("apps"), n("load"))
        })
        .collect();
    assert_eq!(shards, [(0, 2, 17, 17), (1, 3, 18, 24), (2, 2, 9, 9)]);
    assert_eq!(current["unplaced"]["clusters"], 2);
    assert_eq!(current["unplaced"]["apps"], 5);
    assert_eq!(current["warnings"][0]["cluster"], "india");
    assert_eq!(current["warnings"][0]["pin"], 7);
}

/// Every strategy, and whatever the strategy, the clusters of shard 2 leave it.
fn check_strategies_empty_the_removed_shard(report: &Value) {
    let names: Vec<&str> = report["strategies"]
        .as_array()
        .expect("in the report")
        .iter()
        .map(|s| s["strategy"].as_str().expect("in the report"))
        .collect();
    assert_eq!(names, StrategyKind::ALL.map(StrategyKind::name));
    for s in report["strategies"].as_array().expect("in the report") {
        // Shard 2 goes: whatever the strategy, charlie and foxtrot must leave it.
        assert_eq!(s["moves"]["forced"]["clusters"], 2, "{s}");
        assert_eq!(s["moves"]["forced"]["apps"], 9, "{s}");
        let forced: Vec<_> = moves(s).into_iter().filter(|m| m.3).collect();
        assert_eq!(
            forced
                .iter()
                .map(|m| (m.0.as_str(), m.1))
                .collect::<Vec<_>>(),
            [("charlie", 2), ("foxtrot", 2)]
        );
        assert_eq!(s["moves"]["placed"]["clusters"], 2);
        let to_shards: Vec<u64> = s["at_to"]["shards"]
            .as_array()
            .expect("in the report")
            .iter()
            .map(|r| r["shard"].as_u64().expect("in the report"))
            .collect();
        assert_eq!(to_shards, [0, 1]);
        let apps_after: u64 = s["at_to"]["shards"]
            .as_array()
            .expect("in the report")
            .iter()
            .map(|r| r["apps"].as_u64().expect("in the report"))
            .sum();
        assert_eq!(apps_after, 49);
        assert_eq!(s["warnings"][0]["cluster"], "india");
    }
    let sticky = strategy(report, "sticky-balanced");
    assert!(
        sticky["moves"]["voluntary"]["clusters"]
            .as_u64()
            .expect("in the report")
            <= 3
    );
}

/// The moves are exactly shard_assign's, from the labels to each strategy's plan at 2.
async fn check_moves_are_shard_assigns(report: &Value, client: kube::Client) {
    let api: Api<FleetCluster> = Api::namespaced(client, "shardwise");
    let listed = api
        .list(&ListParams::default())
        .await
        .expect("the control plane lists")
        .items;
    let uid = |name: &str| {
        listed
            .iter()
            .find(|c| c.name_any() == name)
            .and_then(|c| c.uid())
            .expect("in the report")
    };
    let clusters: Vec<Cluster> = FLEET
        .iter()
        .map(|c| Cluster {
            id: uid(c.name),
            name: c.name.into(),
            apps: c.apps.into(),
            pin: c.pin,
            weight: c.weight,
        })
        .collect();
    let labels: BTreeMap<String, u32> = FLEET
        .iter()
        .filter_map(|c| Some((uid(c.name), c.label?.parse().ok()?)))
        .collect();
    let previous: PreviousPlacement = labels.iter().map(|(id, &s)| (id.clone(), s)).collect();
    for kind in [StrategyKind::BoundedLoad, StrategyKind::StickyBalanced] {
        let planned = assign(
            &StrategyConfig::new(kind),
            &clusters,
            &ShardSet::contiguous(2),
            Some(&previous),
        )
        .expect("in the report");
        let expected: BTreeSet<(String, u64, u64, bool)> = clusters
            .iter()
            .filter_map(|c| {
                let from = *labels.get(&c.id)?;
                let to = planned.shard_of(&c.id)?;
                (from != to).then(|| (c.name.clone(), from.into(), to.into(), from >= 2))
            })
            .collect();
        assert_eq!(moves(strategy(report, kind.name())), expected, "{kind}");
    }
}

/// The table (summary, then each strategy's moves, capped) and CSV (every cluster once per
/// strategy).
fn check_table_and_csv(kubeconfig: &Path) {
    let table = shardwise(
        kubeconfig,
        &["--to", "2", "--strategy", "greedy-minimum", "--limit", "1"],
    );
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    let text = String::from_utf8(table.stdout).expect("UTF-8 output");
    assert!(text.starts_with("fleet: 9 clusters, 49 apps (FleetClusters and FleetApps in namespace shardwise at https://127.0.0.1:"), "{text}");
    assert!(
        text.contains(
            "\nreplicas: 3 -> 2 (3 from StatefulSet shardwise/shardwise spec.replicas)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\ngreedy-minimum with 2 replicas (max/mean "),
        "{text}"
    );
    assert!(text.contains("\n2 (not live)  "), "{text}");
    assert!(text.contains(" more (--limit 0 lists all)\n"), "{text}");
    assert!(
        text.contains("load @2"),
        "weighted fleets show load: {text}"
    );

    let csv = shardwise(
        kubeconfig,
        &[
            "--strategy",
            "sticky-balanced,legacy-modulo",
            "--format",
            "csv",
        ],
    );
    assert!(csv.status.success());
    assert_eq!(
        String::from_utf8(csv.stdout)
            .expect("UTF-8 output")
            .lines()
            .count(),
        1 + 2 * 9
    );
    assert!(String::from_utf8_lossy(&csv.stderr).contains("note: FleetCluster \"hotel\""));
}

/// Without the StatefulSet the labels tell the replica count; a missing CRD or an empty
/// namespace is a clear failure.
fn check_fallbacks_and_failures(kubeconfig: &Path) {
    let fallback = json(&shardwise(
        kubeconfig,
        &["--statefulset", "absent", "--format", "json"],
    ));
    assert_eq!(fallback["replicas"]["from"], 3);
    assert_eq!(fallback["replicas"]["to"], 3);
    assert_eq!(
        fallback["replicas"]["origin"],
        "the highest shard label + 1 (no StatefulSet shardwise/absent)"
    );

    // Argo CD's Application CRD is not installed here.
    let missing = failure(
        &shardwise(kubeconfig, &["--source", "argocd", "--replicas", "2"]),
        RUNTIME,
    );
    assert!(
        missing.starts_with("shardwise: applications.argoproj.io is not served by the API server at https://127.0.0.1:"),
        "{missing}"
    );
    assert!(
        missing.contains("Argo CD's Application CRD is not installed"),
        "{missing}"
    );
    let empty = failure(
        &shardwise(kubeconfig, &["--namespace", "elsewhere"]),
        RUNTIME,
    );
    assert!(
        empty.contains("no clusters in namespace elsewhere"),
        "{empty}"
    );
}

/// A cut FleetCluster is placed by its UnitSlices, each counting on its own shard; without
/// them (or without their CRD, as with shardwise's CRDs from before slices) it is unplaced.
#[tokio::test]
async fn plans_a_cut_cluster_from_its_unit_slices() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    let crds = std::fs::read_to_string(repo_file("deploy/crds.yaml")).unwrap();
    let without_slices: Vec<&str> = crds
        .split("---\n")
        .filter(|doc| !doc.contains("name: unitslices.shardwise.io"))
        .collect();
    cp.apply_yaml("admin", &without_slices.join("---\n"))
        .await
        .unwrap();
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: shardwise}\n");
    yaml.push_str("---\n");
    yaml.push_str(&statefulset("shardwise", "shardwise", 2, ""));
    yaml.push_str("---\napiVersion: shardwise.io/v1alpha1\nkind: FleetCluster\nmetadata: {name: hot, namespace: shardwise, labels: {shardwise.io/slices: \"2\"}}\nspec: {server: \"https://hot.example:6443\"}\n");
    yaml.push_str("---\napiVersion: shardwise.io/v1alpha1\nkind: FleetCluster\nmetadata: {name: cold, namespace: shardwise, labels: {shardwise.io/shard: \"1\"}}\nspec: {server: \"https://cold.example:6443\"}\n");
    for j in 0..40 {
        yaml.push_str(&fleet_app(&format!("hot-{j}"), "hot"));
    }
    for j in 0..10 {
        yaml.push_str(&fleet_app(&format!("cold-{j}"), "cold"));
    }
    cp.apply_yaml("admin", &yaml).await.unwrap();
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();
    let args = ["--strategy", "sticky-balanced", "--format", "json"];

    let unsliced = json(&shardwise(&kubeconfig, &args));
    assert_eq!(unsliced["current"]["unplaced"]["clusters"], 1);
    let notes = unsliced["notes"].to_string();
    assert!(
        notes.contains(r#"FleetCluster \"hot\" is cut (shardwise.io/slices) but its UnitSlices do not cover the key space (UnitSlices missing"#),
        "{notes}"
    );

    cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
        .await
        .unwrap();
    let client = cp.client("admin").await.unwrap();
    let clusters: Api<FleetCluster> = Api::namespaced(client.clone(), "shardwise");
    let uid = clusters.get("hot").await.unwrap().uid().unwrap();
    let apps: Api<FleetApp> = Api::namespaced(client.clone(), "shardwise");
    let mut keys: Vec<u64> = apps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|a| a.spec.destination.cluster == "hot")
        .map(|a| app_key(&a.uid().unwrap()))
        .collect();
    keys.sort_unstable();
    let (low, high) = KeyRange::WHOLE.halves().unwrap();
    let slices: Api<UnitSlice> = Api::namespaced(client, "shardwise");
    for (range, shard) in [(low, "0"), (high, "1")] {
        let spec = UnitSliceSpec::new(&ObjectKey::new("shardwise", "hot"), &uid, range);
        let mut slice = UnitSlice::new(&format!("hot-1-{:x}", range.index()), spec);
        slice
            .labels_mut()
            .insert("shardwise.io/shard".into(), shard.into());
        slices.create(&PostParams::default(), &slice).await.unwrap();
    }

    let report = json(&shardwise(&kubeconfig, &args));
    assert_eq!(report["notes"], serde_json::json!([]));
    assert_eq!(report["current"]["unplaced"]["clusters"], 0);
    let shards: Vec<(u64, u64, u64)> = report["current"]["shards"]
        .as_array()
        .expect("in the report")
        .iter()
        .map(|s| {
            let n = |k: &str| s[k].as_u64().expect("in the report");
            (n("shard"), n("clusters"), n("apps"))
        })
        .collect();
    let (on_low, on_high) = (count_in(&keys, low), count_in(&keys, high));
    assert_eq!(on_low + on_high, 40);
    assert_eq!(shards, [(0, 1, on_low), (1, 2, on_high + 10)]);
    let hot = report["clusters"]
        .as_array()
        .expect("in the report")
        .iter()
        .find(|c| c["name"] == "hot")
        .expect("in the report");
    assert_eq!(hot["shard"], if on_high > on_low { 1 } else { 0 });
}

/// Shard loads of a layout as (shard, apps, load).
fn shard_loads(layout: &Value) -> Vec<(u64, u64, u64)> {
    layout["shards"]
        .as_array()
        .expect("shards is a list")
        .iter()
        .map(|s| {
            let n = |k: &str| s[k].as_u64().expect("in the report");
            (n("shard"), n("apps"), n("load"))
        })
        .collect()
}

/// Two shards with 20 apps each, but shard 0's clusters cost three times as much per app as
/// shard 1's. Counting apps the fleet is balanced; weighed by the load reports of the shard
/// Leases, as the controller's planner weighs them, shard 0 carries three quarters of it and
/// sticky-balanced moves a costly cluster off it.
#[tokio::test]
async fn measured_load_moves_a_costly_cluster_off_an_overloaded_shard() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
        .await
        .unwrap();
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: shardwise}\n");
    yaml.push_str("---\n");
    yaml.push_str(&statefulset("shardwise", "shardwise", 2, ""));
    for (name, shard) in [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1)] {
        yaml.push_str(&format!(
            "---\napiVersion: shardwise.io/v1alpha1\nkind: FleetCluster\nmetadata: {{name: {name}, namespace: shardwise, labels: {{shardwise.io/shard: \"{shard}\"}}}}\nspec: {{server: \"https://{name}.example:6443\"}}\n"
        ));
        for j in 0..10 {
            yaml.push_str(&fleet_app(&format!("{name}-{j}"), name));
        }
    }
    // 0.3 busy seconds per second per app on shard 0, 0.1 on shard 1.
    yaml.push_str(&shard_lease(
        "shardwise",
        0,
        r#"{"v":1,"records":{"shardwise/a0":{"busy":3.0,"items":10},"shardwise/a1":{"busy":3.0,"items":10}}}"#,
    ));
    yaml.push_str(&shard_lease(
        "shardwise",
        1,
        r#"{"v":1,"records":{"shardwise/b0":{"busy":1.0,"items":10},"shardwise/b1":{"busy":1.0,"items":10}}}"#,
    ));
    // Left out: a report that is none, and the Lease of another StatefulSet.
    yaml.push_str(&shard_lease("shardwise", 2, "not a report"));
    yaml.push_str(&shard_lease(
        "other",
        1,
        r#"{"v":1,"records":{"shardwise/b0":{"busy":90.0,"items":10}}}"#,
    ));
    cp.apply_yaml("admin", &yaml).await.unwrap();
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();
    let args = ["--strategy", "sticky-balanced", "--format", "json"];

    let by_apps = json(&shardwise(&kubeconfig, &args));
    assert!(by_apps.get("measured").is_none());
    assert_eq!(by_apps["current"]["balance"]["max_over_mean"], 1.0);
    assert_eq!(
        strategy(&by_apps, "sticky-balanced")["moves"]["clusters"],
        0
    );

    let measured_args = [&args[..], &["--load", "measured"]].concat();
    let measured = json(&shardwise(&kubeconfig, &measured_args));
    let summary = &measured["measured"];
    assert_eq!(summary["leases"], 3);
    assert_eq!(summary["reports"], 2);
    assert_eq!(summary["clusters"], 4);
    assert_eq!(summary["measured"], 4);
    assert_eq!(summary["busy"], 8.0);
    assert_eq!(summary["busy_per_app"], 0.2);
    let warnings = measured["warnings"].to_string();
    assert!(
        warnings.contains(r#"shard Lease \"shardwise-shard-2\" has a shardwise.io/load annotation that cannot be read"#),
        "{warnings}"
    );
    // a0 and a1 weigh 1500 (0.3 / 0.2 per app), b0 and b1 500.
    let weights: BTreeMap<String, u64> = measured["clusters"]
        .as_array()
        .expect("clusters is a list")
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("a name").to_string();
            (name, c["weight"].as_u64().expect("a weight"))
        })
        .collect();
    let expected: BTreeMap<String, u64> = [("a0", 1500), ("a1", 1500), ("b0", 500), ("b1", 500)]
        .map(|(name, w)| (name.to_string(), w))
        .into();
    assert_eq!(weights, expected);
    let current = &measured["current"];
    assert_eq!(shard_loads(current), [(0, 20, 30_000), (1, 20, 10_000)]);
    assert_eq!(current["balance"]["max_over_mean"], 1.5);
    assert_eq!(measured["fleet"]["weighted"], true);

    let sticky = strategy(&measured, "sticky-balanced");
    let moved = moves(sticky);
    assert!(
        moved
            .iter()
            .any(|(name, from, to, forced)| name.starts_with('a')
                && (*from, *to, *forced) == (0, 1, false)),
        "{moved:?}"
    );
    let after: Vec<u64> = shard_loads(&sticky["at_to"])
        .iter()
        .map(|&(_, _, load)| load)
        .collect();
    assert_eq!(after.iter().sum::<u64>(), 40_000);
    assert!(after.iter().all(|&load| load < 30_000), "{after:?}");

    let table = shardwise(
        &kubeconfig,
        &["--strategy", "sticky-balanced", "--load", "measured"],
    );
    let text = String::from_utf8(table.stdout).expect("UTF-8 output");
    assert!(
        text.contains("\nload: measured, from the load reports of 2 of 3 shard Leases: 4 of 4 clusters measured, 8.000 busy seconds per second in total\n"),
        "{text}"
    );
    assert!(
        text.contains("\nload unit: apps x weight, where weight 1000 is an app of the fleet's average measured cost (0.2000 busy s/s); "),
        "{text}"
    );
    assert!(text.contains("load now"), "{text}");
}

/// `--load` takes what each source has, refused before anything is read.
#[test]
fn load_is_refused_where_the_source_has_no_such_load() {
    let nowhere = Path::new("/nonexistent/kubeconfig");
    let resources = failure(&shardwise(nowhere, &["--load", "resources"]), USAGE);
    assert!(
        resources.contains("--load resources applies to --source argocd only"),
        "{resources}"
    );
    let measured = failure(
        &shardwise(nowhere, &["--source", "argocd", "--load", "measured"]),
        USAGE,
    );
    assert!(
        measured.contains("--load measured applies to --source shardwise only"),
        "{measured}"
    );
}

fn cluster_secret(name: &str, data: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: argocd, labels: {{argocd.argoproj.io/secret-type: cluster}}}}\nstringData: {{{data}}}\n"
    )
}

fn application(name: &str, destination: &str) -> String {
    format!(
        "---\napiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {{name: {name}, namespace: argocd}}\nspec: {{project: default, destination: {{{destination}, namespace: x}}}}\n"
    )
}

#[tokio::test]
async fn plans_an_argo_cd_fleet_as_its_legacy_sharding_places_it() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}\n---\n");
    yaml.push_str(&statefulset(
        "argocd",
        "argocd-application-controller",
        4,
        "{name: ARGOCD_CONTROLLER_REPLICAS, value: \"3\"}",
    ));
    let clusters = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    for name in clusters {
        yaml.push_str(&cluster_secret(
            &format!("cluster-{name}"),
            &format!("name: {name}, server: \"https://{name}.example:6443\""),
        ));
    }
    yaml.push_str(&cluster_secret(
        "cluster-pinned",
        "name: pinned, server: \"https://pinned.example:6443\", shard: \"2\"",
    ));
    // Not a cluster: no secret-type label.
    yaml.push_str("---\napiVersion: v1\nkind: Secret\nmetadata: {name: repo, namespace: argocd}\nstringData: {url: \"https://git.example\"}\n");
    cp.apply_yaml("admin", &yaml).await.unwrap();
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();

    let missing = failure(&shardwise(&kubeconfig, &["--source", "argocd"]), RUNTIME);
    assert!(
        missing.contains("applications.argoproj.io is not served"),
        "{missing}"
    );

    let mut apps = format!("---\n{APPLICATION_CRD}");
    for (i, name) in clusters.iter().enumerate() {
        for j in 0..=i {
            // Alternately by server and by name.
            let destination = if j % 2 == 0 {
                format!("server: \"https://{name}.example:6443\"")
            } else {
                format!("name: {name}")
            };
            apps.push_str(&application(&format!("{name}-{j}"), &destination));
        }
    }
    apps.push_str(&application(
        "local-1",
        "server: \"https://kubernetes.default.svc\"",
    ));
    apps.push_str(&application("local-2", "name: in-cluster"));
    apps.push_str(&application("pinned-1", "name: pinned"));
    apps.push_str(&application("lost", "name: nowhere"));
    cp.apply_yaml("admin", &apps).await.unwrap();

    let report = json(&shardwise(
        &kubeconfig,
        &["--source", "argocd", "--to", "2", "--format", "json"],
    ));
    assert_eq!(report["source"], "argocd");
    assert_eq!(report["namespace"], "argocd");
    assert_eq!(report["replicas"]["from"], 3);
    assert_eq!(
        report["replicas"]["origin"],
        "env ARGOCD_CONTROLLER_REPLICAS of StatefulSet argocd/argocd-application-controller"
    );
    // The StatefulSet runs 4 pods for 3 shards.
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .contains("runs 4 pods but Argo CD shards over 3"),
        "{}",
        report["notes"]
    );
    assert_eq!(report["argocd"]["algorithm"], "legacy");
    assert_eq!(
        report["argocd"]["algorithm_origin"],
        "Argo CD's default: ARGOCD_CONTROLLER_SHARDING_ALGORITHM is not set in StatefulSet argocd/argocd-application-controller"
    );
    assert_eq!(report["current"]["placement"], "computed");
    assert_eq!(report["current"]["strategy"], "legacy-modulo");
    assert_eq!(report["fleet"]["clusters"], 8);
    assert_eq!(report["fleet"]["apps"], 21 + 2 + 1);
    assert_eq!(report["fleet"]["unmatched_apps"], 1);

    // Every cluster, as Argo CD sees it: Secret UID as id, apps by server or name, the implicit
    // in-cluster cluster with an empty id.
    let secrets: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
    let uid = |list: &[Secret], name: &str| {
        list.iter()
            .find(|s| s.name_any() == format!("cluster-{name}"))
            .and_then(|s| s.uid())
            .unwrap()
    };
    let listed = secrets.list(&ListParams::default()).await.unwrap().items;
    let rows: BTreeMap<String, (String, u64, Option<u64>, Option<u64>)> = report["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                (
                    c["id"].as_str().unwrap().to_string(),
                    c["apps"].as_u64().unwrap(),
                    c["pin"].as_u64(),
                    c["shard"].as_u64(),
                ),
            )
        })
        .collect();
    assert_eq!(rows["in-cluster"], (String::new(), 2, None, Some(0)));
    assert_eq!(
        rows["pinned"],
        (uid(&listed, "pinned"), 1, Some(2), Some(2))
    );
    for (i, name) in clusters.iter().enumerate() {
        let id = uid(&listed, name);
        // Argo CD's legacy sharding: FNV-1a of the Secret's UID modulo the replicas.
        let shard = u64::from(fnv1a_32(id.as_bytes()) % 3);
        assert_eq!(rows[*name], (id, i as u64 + 1, None, Some(shard)), "{name}");
    }

    // legacy-modulo at 2: each cluster goes where FNV-1a modulo 2 says; those on shard 2 are
    // forced, the others moved because the modulus changed. The one pinned to shard 2 goes to
    // shard 0, where Argo CD puts a pin at or above its replica count.
    let legacy = strategy(&report, "legacy-modulo");
    let expected: BTreeSet<(String, u64, u64, bool)> = clusters
        .iter()
        .filter_map(|name| {
            let hash = fnv1a_32(uid(&listed, name).as_bytes());
            let (from, to) = (u64::from(hash % 3), u64::from(hash % 2));
            (from != to).then(|| (name.to_string(), from, to, from == 2))
        })
        .chain(std::iter::once(("pinned".to_string(), 2, 0, true)))
        .collect();
    assert_eq!(moves(legacy), expected);
    assert_eq!(legacy["warnings"][0]["cluster"], "pinned");
    assert_eq!(legacy["warnings"][0]["pin"], 2);
    assert_eq!(legacy["warnings"][0]["placed_on"], 0);
    let sticky = strategy(&report, "sticky-balanced");
    assert!(sticky["moves"]["voluntary"]["clusters"].as_u64().unwrap() <= 3);
    let forced = |s: &Value| s["moves"]["forced"]["clusters"].as_u64().unwrap();
    assert_eq!(forced(sticky), forced(legacy));

    // Another current algorithm.
    let round_robin = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--current-strategy",
            "round-robin",
            "--strategy",
            "round-robin",
            "--format",
            "json",
        ],
    ));
    assert_eq!(round_robin["current"]["strategy"], "round-robin");
    assert_eq!(round_robin["strategies"][0]["moves"]["clusters"], 0);

    let refused = failure(
        &shardwise(&kubeconfig, &["--current-strategy", "round-robin"]),
        USAGE,
    );
    assert!(
        refused.contains("--current-strategy applies to --source argocd only"),
        "{refused}"
    );
}

#[tokio::test]
async fn forbidden_and_unreachable_servers_give_one_line() {
    let env = Environment::builder()
        .identity(Identity::new("viewer", "jane"))
        .start()
        .unwrap();
    let cp = env.control_plane();
    cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
        .await
        .unwrap();
    let viewer = cp.kubeconfig_path("viewer").unwrap();
    let forbidden = failure(&shardwise(&viewer, &["--replicas", "2"]), RUNTIME);
    assert!(
        forbidden.starts_with("shardwise: forbidden (403): cannot list fleetclusters.shardwise.io in namespace shardwise: "),
        "{forbidden}"
    );

    // The same kubeconfig, pointed at port 0, on which nothing can listen: refused every time.
    let port = 0;
    let text = std::fs::read_to_string(cp.kubeconfig_path("admin").unwrap()).unwrap();
    let url = cp.url();
    let unreachable = env
        .write_file(
            "unreachable.kubeconfig",
            &text.replace(&url, &format!("https://127.0.0.1:{port}")),
        )
        .unwrap();
    let down = failure(&shardwise(&unreachable, &[]), RUNTIME);
    assert!(
        down.starts_with(&format!(
            "shardwise: cannot reach the API server at https://127.0.0.1:{port}: "
        )),
        "{down}"
    );

    let no_file = failure(
        &shardwise(Path::new("/nonexistent/kubeconfig"), &[]),
        RUNTIME,
    );
    assert!(
        no_file.contains("cannot load a Kubernetes configuration"),
        "{no_file}"
    );
    // clap's refusal, whole: what is wrong and where to read more.
    let zero = shardwise(&viewer, &["--to", "0"]);
    assert_eq!(zero.status.code(), Some(USAGE));
    let text = String::from_utf8_lossy(&zero.stderr);
    assert!(
        text.contains("'--to <TO>'") && text.contains("--help"),
        "{text}"
    );
    let over = failure(&shardwise(&viewer, &["--to", "10001"]), USAGE);
    assert!(
        over.contains("--to 10001 is over the limit of 10000"),
        "{over}"
    );
}

/// An Argo CD Application in `namespace` with `status.resources` of `resources` entries.
fn argocd_application(namespace: &str, name: &str, destination: &str, resources: usize) -> String {
    let resources = vec!["{kind: ConfigMap, name: r, version: v1}"; resources].join(", ");
    format!(
        "---\napiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{project: default, destination: {{{destination}, namespace: x}}}}\nstatus: {{resources: [{resources}]}}\n"
    )
}

/// The seven ways Argo CD's controller (v3.5) reads a fleet that a naive reading gets wrong, on
/// Argo CD's own formats: settings from argocd-cmd-params-cm through the controller's env, pins
/// out of range and negative, no replica count, unreadable config, no name, duplicate names and
/// servers, and Applications in the namespaces `application.namespaces` allows.
#[tokio::test]
async fn plans_an_argo_cd_fleet_exactly_as_argo_cd_shards_it() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    let mut yaml = String::new();
    for ns in ["argocd", "team-a", "other"] {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
        ));
    }
    yaml.push_str("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: argocd-cmd-params-cm, namespace: argocd}\ndata: {controller.sharding.algorithm: round-robin, application.namespaces: \"team-*\"}\n");
    // As Argo CD's manifests set them, with 2 replicas.
    let from_params = |var: &str, key: &str| {
        format!(
            "{{name: {var}, valueFrom: {{configMapKeyRef: {{name: argocd-cmd-params-cm, key: {key}, optional: true}}}}}}"
        )
    };
    let params_env = format!(
        "{}, {}",
        from_params(
            "ARGOCD_CONTROLLER_SHARDING_ALGORITHM",
            "controller.sharding.algorithm"
        ),
        from_params("ARGOCD_APPLICATION_NAMESPACES", "application.namespaces")
    );
    yaml.push_str("---\n");
    yaml.push_str(&statefulset(
        "argocd",
        "argocd-application-controller",
        2,
        &format!("{{name: ARGOCD_CONTROLLER_REPLICAS, value: \"2\"}}, {params_env}"),
    ));
    // Case 3: no ARGOCD_CONTROLLER_REPLICAS, three pods.
    yaml.push_str("---\n");
    yaml.push_str(&statefulset("argocd", "unsharded", 3, &params_env));
    // Dynamic cluster distribution: a Deployment, whose replica count Argo CD shards over.
    yaml.push_str(&format!(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: dynamic, namespace: argocd}}\nspec:\n  replicas: 4\n  selector: {{matchLabels: {{app: dynamic}}}}\n  template:\n    metadata: {{labels: {{app: dynamic}}}}\n    spec: {{containers: [{{name: argocd-application-controller, image: x, env: [{{name: ARGOCD_ENABLE_DYNAMIC_CLUSTER_DISTRIBUTION, value: \"true\"}}, {params_env}]}}]}}\n"
    ));
    for name in ["alpha", "bravo", "charlie"] {
        yaml.push_str(&cluster_secret(
            &format!("cluster-{name}"),
            &format!("name: {name}, server: \"https://{name}.example\""),
        ));
    }
    // Case 1: pinned at or above the replica count.
    yaml.push_str(&cluster_secret(
        "cluster-high",
        "name: high, server: \"https://high.example\", shard: \"5\"",
    ));
    // Case 2: a negative pin.
    yaml.push_str(&cluster_secret(
        "cluster-orphan",
        "name: orphan, server: \"https://orphan.example\", shard: \"-1\"",
    ));
    // Case 4: a config that is not JSON.
    yaml.push_str(&cluster_secret(
        "cluster-broken",
        "name: broken, server: \"https://broken.example\", config: \"{bearerToken: t\"",
    ));
    // Case 5: no name key.
    yaml.push_str(&cluster_secret(
        "cluster-nameless",
        "server: \"https://nameless.example\"",
    ));
    // Case 6: two Secrets with one name, two with one server.
    for (secret, server) in [("cluster-twin-1", "twin-1"), ("cluster-twin-2", "twin-2")] {
        yaml.push_str(&cluster_secret(
            secret,
            &format!("name: twin, server: \"https://{server}.example\""),
        ));
    }
    for secret in ["cluster-dup-a", "cluster-dup-b"] {
        yaml.push_str(&cluster_secret(
            secret,
            "name: dup, server: \"https://dup.example\"",
        ));
    }
    yaml.push_str("---\n");
    yaml.push_str(APPLICATION_CRD);
    cp.apply_yaml("admin", &yaml).await.unwrap();

    let mut apps = String::new();
    for (name, resources) in [
        ("alpha", 3),
        ("bravo", 1),
        ("charlie", 2),
        ("high", 4),
        ("orphan", 5),
    ] {
        apps.push_str(&argocd_application(
            "argocd",
            &format!("{name}-app"),
            &format!("server: \"https://{name}.example\""),
            resources,
        ));
    }
    // team-a matches team-*; other does not, so its Application is not read.
    apps.push_str(&argocd_application(
        "team-a",
        "alpha-team",
        "name: alpha",
        6,
    ));
    apps.push_str(&argocd_application(
        "other",
        "alpha-other",
        "name: alpha",
        7,
    ));
    apps.push_str(&argocd_application(
        "argocd",
        "nameless-by-server",
        "server: \"https://nameless.example\"",
        1,
    ));
    // Unresolvable: by the nameless Secret's object name, by the ambiguous name, to the
    // ignored cluster.
    apps.push_str(&argocd_application(
        "argocd",
        "nameless-by-name",
        "name: cluster-nameless",
        1,
    ));
    apps.push_str(&argocd_application("argocd", "twin-app", "name: twin", 1));
    apps.push_str(&argocd_application(
        "argocd",
        "broken-app",
        "server: \"https://broken.example\"",
        1,
    ));
    apps.push_str(&argocd_application(
        "argocd",
        "dup-app",
        "server: \"https://dup.example\"",
        1,
    ));
    cp.apply_yaml("admin", &apps).await.unwrap();
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();

    let report = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--strategy",
            "round-robin",
            "--format",
            "json",
        ],
    ));
    // Case 7: every setting detected, with where it came from.
    assert_eq!(report["replicas"]["from"], 2);
    assert_eq!(
        report["replicas"]["origin"],
        "env ARGOCD_CONTROLLER_REPLICAS of StatefulSet argocd/argocd-application-controller"
    );
    assert_eq!(report["argocd"]["algorithm"], "round-robin");
    assert_eq!(
        report["argocd"]["algorithm_origin"],
        "argocd-cmd-params-cm controller.sharding.algorithm"
    );
    assert_eq!(report["current"]["strategy"], "round-robin");
    assert_eq!(
        report["argocd"]["app_namespaces"],
        serde_json::json!(["argocd", "team-*"])
    );
    assert_eq!(
        report["argocd"]["app_namespaces_origin"],
        "argocd (the control plane's) and argocd-cmd-params-cm application.namespaces"
    );

    let secrets: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
    let listed = secrets.list(&ListParams::default()).await.unwrap().items;
    let uid = |secret: &str| {
        listed
            .iter()
            .find(|s| s.name_any() == secret)
            .and_then(|s| s.uid())
            .unwrap()
    };
    let rows: BTreeMap<String, (String, u64, Option<u64>, Option<u64>)> = report["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                (
                    c["id"].as_str().unwrap().to_string(),
                    c["apps"].as_u64().unwrap(),
                    c["pin"].as_u64(),
                    c["shard"].as_u64(),
                ),
            )
        })
        .collect();
    // Case 4: the broken Secret is no cluster; case 6: one dup Secret is kept.
    let names: Vec<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "(Secret cluster-nameless)",
            "alpha",
            "bravo",
            "charlie",
            "dup",
            "high",
            "in-cluster",
            "orphan",
            "twin"
        ]
    );
    // Two "twin" rows share a name; the map kept one, the JSON has both.
    assert_eq!(report["fleet"]["clusters"], 10);
    assert_eq!(rows["alpha"].1, 2, "argocd and team-a, not other");
    assert_eq!(rows["(Secret cluster-nameless)"].1, 1);
    assert_eq!(report["fleet"]["unmatched_apps"], 3);

    // Argo CD's round-robin: every cluster it keeps (the orphan and the pinned one too, and
    // in-cluster with an empty id) ranked by id, rank modulo 2; a pin at or above 2 is shard 0,
    // a negative pin no shard.
    let mut ids: Vec<String> = [
        "cluster-alpha",
        "cluster-bravo",
        "cluster-charlie",
        "cluster-high",
        "cluster-orphan",
        "cluster-nameless",
        "cluster-twin-1",
        "cluster-twin-2",
        "cluster-dup-a",
    ]
    .iter()
    .map(|s| uid(s))
    .chain([String::new()])
    .collect();
    ids.sort();
    let by_id: BTreeMap<String, Option<u64>> = report["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), c["shard"].as_u64()))
        .collect();
    for (rank, id) in ids.iter().enumerate() {
        let expected = if *id == uid("cluster-high") {
            Some(0)
        } else if *id == uid("cluster-orphan") {
            None
        } else {
            Some(rank as u64 % 2)
        };
        assert_eq!(by_id[id], expected, "rank {rank}");
    }
    assert_eq!(rows["high"].2, Some(5));
    assert_eq!(report["current"]["unplaced"]["clusters"], 1);
    assert_eq!(report["current"]["warnings"][0]["cluster"], "high");
    assert_eq!(report["current"]["warnings"][0]["placed_on"], 0);

    let texts = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    };
    let (notes, warnings) = (texts("notes"), texts("warnings"));
    let has = |list: &[String], text: &str| {
        assert!(
            list.iter().any(|n| n.contains(text)),
            "none with {text:?}: {list:#?}"
        )
    };
    // What hurts is a warning: orphaned, ignored, ambiguous, unresolved.
    has(
        &warnings,
        r#"Secret "cluster-orphan" has shard -1: no Argo CD replica reconciles cluster "orphan""#,
    );
    has(
        &warnings,
        r#"Secret "cluster-broken" has a config Argo CD cannot read (not JSON"#,
    );
    has(
        &warnings,
        "Argo CD ignores this cluster, so no replica reconciles it",
    );
    has(
        &warnings,
        r#"Secrets "cluster-twin-1", "cluster-twin-2" all name their cluster "twin""#,
    );
    has(
        &warnings,
        r#"Secrets "cluster-dup-a" and "cluster-dup-b" have the same server "https://dup.example": Argo CD keeps one of them"#,
    );
    has(
        &warnings,
        "3 Application(s) have a destination Argo CD cannot resolve to one cluster, so every replica processes them",
    );
    has(
        &notes,
        r#"Secret "cluster-nameless" has no name key: Argo CD gives its cluster no name"#,
    );
    // The StatefulSet runs no pod here: no cluster is reconciled, whatever the status says.
    has(
        &warnings,
        r#"7 Application(s) on 9 cluster(s) have no live controller now, whatever their status says ("(Secret cluster-nameless)", "alpha", "bravo", "charlie", "dup", 4 more): no controller pod runs"#,
    );
    assert_eq!(
        (notes.len(), warnings.len()),
        (1, 6),
        "{notes:#?} {warnings:#?}"
    );

    // The table says it too.
    let table = shardwise(
        &kubeconfig,
        &["--source", "argocd", "--strategy", "round-robin"],
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success());
    assert!(
        text.contains("as Argo CD's round-robin algorithm places clusters (algorithm from argocd-cmd-params-cm controller.sharding.algorithm); 1 cluster (1 app) unplaced"),
        "{text}"
    );
    assert!(text.contains("application namespaces: argocd, team-* (from argocd (the control plane's) and argocd-cmd-params-cm application.namespaces)"), "{text}");
    assert!(
        text.contains(r#"warning: Secret "cluster-orphan" has shard -1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"warning: cluster "high" is pinned to shard 5, which is not live with 2 replicas; it is on shard 0"#),
        "{text}"
    );

    // Case 3: without ARGOCD_CONTROLLER_REPLICAS, Argo CD does not shard: one shard, every
    // cluster but the orphan on it, planned toward the 3 pods.
    let unsharded = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--statefulset",
            "unsharded",
            "--format",
            "json",
        ],
    ));
    assert_eq!(unsharded["replicas"]["from"], 1);
    assert_eq!(unsharded["replicas"]["to"], 3);
    assert_eq!(
        unsharded["replicas"]["origin"],
        "ARGOCD_CONTROLLER_REPLICAS is not set in StatefulSet argocd/unsharded (Argo CD does not shard)"
    );
    assert!(
        unsharded["warnings"][0].as_str().unwrap().starts_with(
            "Argo CD does not shard: the controller's replica count is 0 (ARGOCD_CONTROLLER_REPLICAS is not set in StatefulSet argocd/unsharded), so each of the 3 pods"
        ),
        "{}",
        unsharded["warnings"]
    );
    let shards: Vec<(u64, u64)> = unsharded["current"]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().unwrap(),
                s["clusters"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shards, [(0, 9)]);

    let dynamic = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--statefulset",
            "dynamic",
            "--format",
            "json",
        ],
    ));
    assert_eq!(dynamic["replicas"]["from"], 4);
    assert_eq!(
        dynamic["replicas"]["origin"],
        "Deployment argocd/dynamic spec.replicas (dynamic cluster distribution)"
    );
    assert_eq!(dynamic["argocd"]["algorithm"], "round-robin");

    // Case 7: Argo CD's names, flags over the installation; --load resources.
    let legacy = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--current-strategy",
            "legacy",
            "--app-namespaces",
            "other",
            "--load",
            "resources",
            "--format",
            "json",
        ],
    ));
    assert_eq!(legacy["current"]["strategy"], "legacy-modulo");
    assert_eq!(legacy["argocd"]["algorithm"], "legacy");
    assert_eq!(legacy["argocd"]["algorithm_origin"], "--current-strategy");
    assert_eq!(legacy["argocd"]["load"], "resources");
    let alpha = legacy["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "alpha")
        .unwrap();
    // argocd (3 resources) and other (7), not team-a.
    assert_eq!(alpha["apps"], 3 + 7);
    let hashing = json(&shardwise(
        &kubeconfig,
        &[
            "--source",
            "argocd",
            "--current-strategy",
            "consistent-hashing",
            "--format",
            "json",
        ],
    ));
    assert_eq!(hashing["current"]["strategy"], "argocd-consistent-hashing");
    assert_eq!(hashing["argocd"]["algorithm"], "consistent-hashing");
    // clap refuses it, with its usage hint.
    let refused = shardwise(
        &kubeconfig,
        &["--source", "argocd", "--current-strategy", "greedy-minimum"],
    );
    assert_eq!(refused.status.code(), Some(USAGE));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(r#"Argo CD has no sharding algorithm "greedy-minimum"; it has legacy, round-robin and consistent-hashing"#),
        "{stderr}"
    );
}
