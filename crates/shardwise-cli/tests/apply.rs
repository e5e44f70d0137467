//! `shardwise plan --source argocd --apply` end to end: the real binary against the test
//! Kubernetes API server of `e2e/`, writing the `shard` keys of Argo CD's cluster Secrets.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use k8s_openapi::api::core::v1::Secret;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};
use serde_json::Value;
use shardwise_e2e::{Environment, Identity};

mod common;
use common::{USAGE, failure, shardwise};
use shardwise_e2e::argocd::{
    APPLICATION_CRD, application, cluster_secret, documented_role, secrets, shard_key,
    without_shard,
};

const STRATEGY: &str = "sticky-balanced";

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("UTF-8")
}

/// The six unpinned clusters and their app counts.
const LOADS: [(&str, usize); 6] = [
    ("alpha", 9),
    ("bravo", 7),
    ("charlie", 5),
    ("delta", 3),
    ("echo", 2),
    ("foxtrot", 1),
];

/// How many times the test draws new UIDs for the unpinned clusters' Secrets at most.
const RESHUFFLES: usize = 20;

/// The cluster Secrets of [`LOADS`], without a shard key.
fn unpinned_secrets() -> String {
    LOADS
        .iter()
        .map(|(name, _)| {
            cluster_secret(
                &format!("cluster-{name}"),
                &format!("name: {name}, server: \"https://{name}.example\""),
            )
        })
        .collect()
}

/// How many clusters the plan's strategy moves.
fn moved_clusters(report: &Value) -> u64 {
    report["strategies"][0]["moves"]["clusters"]
        .as_u64()
        .expect("moves.clusters is a count")
}

/// Argo CD with 3 shards, six clusters of uneven load, one pinned, one orphaned by a negative
/// pin, one whose server another Secret already has, and the in-cluster cluster without a
/// Secret; then its Applications (once the CRD is served).
fn installation() -> (String, String) {
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}\n---\n");
    yaml.push_str("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: argocd-application-controller, namespace: argocd}\nspec:\n  replicas: 3\n  serviceName: c\n  selector: {matchLabels: {app: c}}\n  template:\n    metadata: {labels: {app: c}}\n    spec: {containers: [{name: c, image: x, env: [{name: ARGOCD_CONTROLLER_REPLICAS, value: \"3\"}]}]}\n");
    yaml.push_str(&unpinned_secrets());
    yaml.push_str(&cluster_secret(
        "cluster-pinned",
        "name: pinned, server: \"https://pinned.example\", shard: \"2\"",
    ));
    yaml.push_str(&cluster_secret(
        "cluster-orphan",
        "name: orphan, server: \"https://orphan.example\", shard: \"-1\"",
    ));
    yaml.push_str(&cluster_secret(
        "cluster-twin",
        "name: twin, server: \"https://alpha.example\"",
    ));
    yaml.push_str("---\n");
    yaml.push_str(APPLICATION_CRD);
    let mut apps = String::new();
    for (name, count) in LOADS {
        for i in 0..count {
            apps.push_str(&application(&format!("{name}-{i}"), name));
        }
    }
    apps.push_str(&application("local", "in-cluster"));
    (yaml, apps)
}

/// Where `plan --strategy STRATEGY --slicing off` puts each cluster (by id) at 3 replicas: its
/// shard now unless the plan moves or places it.
/// Applies [`installation`] to `env`'s control plane.
async fn install(env: &Environment) {
    let (yaml, apps) = installation();
    let cp = env.control_plane();
    cp.apply_yaml("admin", &yaml)
        .await
        .expect("the installation is applied");
    cp.apply_yaml("admin", &apps)
        .await
        .expect("the Applications are applied");
}

fn planned(report: &Value) -> BTreeMap<String, u64> {
    let mut shards: BTreeMap<String, u64> = report["clusters"]
        .as_array()
        .expect("clusters is a list")
        .iter()
        .filter_map(|c| Some((c["id"].as_str()?.to_string(), c["shard"].as_u64()?)))
        .collect();
    let plan = &report["strategies"][0];
    assert_eq!(plan["strategy"], STRATEGY);
    for entry in plan["moved"]
        .as_array()
        .expect("moved is a list")
        .iter()
        .chain(plan["placed"].as_array().expect("placed is a list"))
    {
        shards.insert(
            entry["id"].as_str().expect("an id").to_string(),
            entry["to"].as_u64().expect("a shard"),
        );
    }
    shards
}

fn plan_json(kubeconfig: &Path) -> Value {
    let output = shardwise(
        kubeconfig,
        &[
            "--source",
            "argocd",
            "--strategy",
            STRATEGY,
            "--slicing",
            "off",
            "--limit",
            "0",
            "--format",
            "json",
        ],
    );
    serde_json::from_str(&stdout(&output)).expect("plan prints JSON")
}

#[tokio::test]
async fn apply_pins_the_plan_and_unpin_hands_placement_back() {
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    install(&env).await;
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();
    let api: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
    let apply = ["--source", "argocd", "--apply", "--strategy", STRATEGY];

    // Refusals, before anything is read or written.
    let refused = failure(
        &shardwise(&kubeconfig, &["--apply", "--strategy", STRATEGY]),
        USAGE,
    );
    assert!(refused.contains("it needs --source argocd"), "{refused}");
    let refused = failure(
        &shardwise(&kubeconfig, &["--source", "argocd", "--apply"]),
        USAGE,
    );
    assert!(refused.contains("pass exactly one --strategy"), "{refused}");
    let refused = failure(
        &shardwise(
            &kubeconfig,
            &[
                "--source",
                "argocd",
                "--apply",
                "--strategy",
                "round-robin,legacy-modulo",
            ],
        ),
        USAGE,
    );
    assert!(refused.contains("pass exactly one --strategy"), "{refused}");
    let mut too_many = apply.to_vec();
    too_many.extend(["--to", "4", "--yes"]);
    let refused = failure(&shardwise(&kubeconfig, &too_many), USAGE);
    assert!(
        refused.contains("Argo CD runs 3 shard(s) (env ARGOCD_CONTROLLER_REPLICAS of StatefulSet argocd/argocd-application-controller) and --to is 4: scale the application controller first (set ARGOCD_CONTROLLER_REPLICAS and the replicas of StatefulSet argocd/argocd-application-controller to 4), then apply; or plan --to 3"),
        "{refused}"
    );

    // Argo CD places an unpinned cluster by a hash of its Secret's UID, which the server
    // draws at random: now and then that placement is already balanced and the strategy keeps
    // it. New Secrets draw new UIDs until the plan moves something.
    let mut report = plan_json(&kubeconfig);
    for _ in 0..RESHUFFLES {
        if moved_clusters(&report) > 0 {
            break;
        }
        for (name, _) in LOADS {
            api.delete(&format!("cluster-{name}"), &DeleteParams::default())
                .await
                .unwrap();
        }
        cp.apply_yaml("admin", &unpinned_secrets()).await.unwrap();
        report = plan_json(&kubeconfig);
    }
    assert!(
        moved_clusters(&report) > 0,
        "the fixture must make the strategy move clusters"
    );
    let before = secrets(&api).await;
    let expected = planned(&report);

    // A dry run writes nothing.
    let dry = stdout(&shardwise(&kubeconfig, &apply));
    assert!(
        dry.contains(r#"cluster-pinned   pinned   "2"        "2"     2 -> 2         unchanged"#),
        "{dry}"
    );
    assert!(
        dry.contains("dry run: nothing written; pass --yes"),
        "{dry}"
    );
    assert!(
        dry.contains(r#"warning: Secret "cluster-orphan" left as it is"#),
        "{dry}"
    );
    assert!(
        dry.contains(r#"warning: Secret "cluster-twin" left as it is"#),
        "{dry}"
    );
    assert!(
        dry.contains(r#"note: cluster "in-cluster" has no Secret, so it cannot be pinned"#),
        "{dry}"
    );
    let after_dry = secrets(&api).await;
    for (name, secret) in &before {
        assert_eq!(
            after_dry[name].resource_version(),
            secret.resource_version(),
            "{name}"
        );
    }

    // --yes writes the planned shard key of each Secret whose cluster Argo CD shards, and
    // nothing else.
    let mut yes = apply.to_vec();
    yes.push("--yes");
    let wrote = stdout(&shardwise(&kubeconfig, &yes));
    let changed: Vec<&str> = before
        .iter()
        .filter(|(name, s)| {
            !["cluster-orphan", "cluster-twin"].contains(&name.as_str())
                && s.uid()
                    .is_some_and(|id| shard_key(s) != Some(expected[&id].to_string()))
        })
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        wrote.contains(&format!("wrote {} Secret(s)", changed.len())),
        "{wrote}"
    );
    assert!(
        wrote.contains(&format!("{} Secret(s) to change", changed.len())),
        "{wrote}"
    );
    let applied = secrets(&api).await;
    for (name, old) in &before {
        let new = &applied[name];
        assert_eq!(without_shard(new), without_shard(old), "{name}");
        let id = old.uid().unwrap();
        if ["cluster-orphan", "cluster-twin"].contains(&name.as_str()) {
            assert_eq!(new.resource_version(), old.resource_version(), "{name}");
        } else {
            assert_eq!(shard_key(new), Some(expected[&id].to_string()), "{name}");
            let written = changed.contains(&name.as_str());
            assert_eq!(
                new.resource_version() != old.resource_version(),
                written,
                "{name}: only changed Secrets are written"
            );
        }
    }

    // Argo CD, reading the pins, places every Secret's cluster as the plan said.
    let replanned = plan_json(&kubeconfig);
    for cluster in replanned["clusters"].as_array().unwrap() {
        let id = cluster["id"].as_str().unwrap();
        let secret = before.values().find(|s| s.uid().as_deref() == Some(id));
        if secret.is_some_and(|s| s.name_any() != "cluster-orphan") {
            assert_eq!(cluster["pin"].as_u64(), Some(expected[id]), "{cluster}");
            assert_eq!(cluster["shard"].as_u64(), Some(expected[id]), "{cluster}");
        }
    }

    // A second apply has nothing to write.
    let again = stdout(&shardwise(&kubeconfig, &yes));
    assert!(again.contains("0 Secret(s) to change"), "{again}");
    assert!(again.contains("nothing to write"), "{again}");
    let unchanged = secrets(&api).await;
    for (name, secret) in &applied {
        assert_eq!(
            unchanged[name].resource_version(),
            secret.resource_version(),
            "{name}"
        );
    }

    // --unpin removes every key it wrote; the orphan keeps its negative pin.
    let refused = failure(
        &shardwise(
            &kubeconfig,
            &["--source", "argocd", "--apply", "--unpin", "--to", "3"],
        ),
        USAGE,
    );
    assert!(refused.contains("takes no --strategy or --to"), "{refused}");
    let unpin = ["--source", "argocd", "--apply", "--unpin"];
    let dry = stdout(&shardwise(&kubeconfig, &unpin));
    assert!(dry.contains("7 Secret(s) to change"), "{dry}");
    assert!(
        dry.contains("Argo CD's legacy algorithm then places"),
        "{dry}"
    );
    let mut yes = unpin.to_vec();
    yes.push("--yes");
    let wrote = stdout(&shardwise(&kubeconfig, &yes));
    assert!(wrote.contains("wrote 7 Secret(s)"), "{wrote}");
    let unpinned = secrets(&api).await;
    for (name, secret) in &unpinned {
        assert_eq!(
            without_shard(secret),
            without_shard(&before[name]),
            "{name}"
        );
        let key = shard_key(secret);
        match name.as_str() {
            "cluster-orphan" => assert_eq!(key.as_deref(), Some("-1")),
            _ => assert_eq!(key, None, "{name}"),
        }
    }
}

/// The documented Role is enough to plan, dry-run and write.
#[tokio::test]
async fn the_documented_role_is_enough_to_apply() {
    let env = Environment::builder()
        .identity(Identity::new("operator", "ada"))
        .start()
        .unwrap();
    let cp = env.control_plane();
    install(&env).await;
    let binding = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: shardwise-argocd, namespace: argocd}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: shardwise-argocd}\nsubjects: [{kind: User, name: ada, apiGroup: rbac.authorization.k8s.io}]\n";
    cp.apply_yaml(
        "admin",
        &format!("{}{binding}", documented_role("shardwise-argocd")),
    )
    .await
    .unwrap();
    let operator = cp.kubeconfig_path("operator").unwrap();

    let yes = [
        "--source",
        "argocd",
        "--apply",
        "--strategy",
        STRATEGY,
        "--yes",
    ];
    let wrote = stdout(&shardwise(&operator, &yes));
    assert!(wrote.contains("wrote 6 Secret(s)"), "{wrote}");
    let unpin = ["--source", "argocd", "--apply", "--unpin", "--yes"];
    let wrote = stdout(&shardwise(&operator, &unpin));
    assert!(wrote.contains("wrote 7 Secret(s)"), "{wrote}");
}

#[tokio::test]
async fn apply_refuses_while_a_balancer_holds_the_lease_and_takes_it_otherwise() {
    use common::RUNTIME;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::PostParams;
    let env = Environment::builder().start().unwrap();
    let cp = env.control_plane();
    install(&env).await;
    let kubeconfig = cp.kubeconfig_path("admin").unwrap();
    let client = cp.client("admin").await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "argocd");
    let leases: Api<Lease> = Api::namespaced(client, "argocd");
    let yes = [
        "--source",
        "argocd",
        "--apply",
        "--strategy",
        STRATEGY,
        "--yes",
    ];

    // A balancer holds the installation's Lease, renewed just now: --apply writes nothing.
    let held: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shardwise-argocd-balancer", "namespace": "argocd"},
        "spec": {"holderIdentity": "balancer-7d9f_0000000000000001", "leaseDurationSeconds": 15,
            "renewTime": jiff::Timestamp::now().to_string()},
    }))
    .unwrap();
    leases.create(&PostParams::default(), &held).await.unwrap();
    let before: BTreeMap<String, Value> = secrets_as_written(&secrets).await;
    let refused = failure(&shardwise(&kubeconfig, &yes), RUNTIME);
    assert!(
        refused.contains(
            "balancer-7d9f_0000000000000001 holds Lease argocd/shardwise-argocd-balancer"
        ),
        "{refused}"
    );
    assert_eq!(
        secrets_as_written(&secrets).await,
        before,
        "nothing written"
    );

    // Released (the balancer stopped): --apply takes the Lease, writes, and gives it back.
    let mut released = leases.get("shardwise-argocd-balancer").await.unwrap();
    released.spec.as_mut().unwrap().holder_identity = None;
    leases
        .replace(
            "shardwise-argocd-balancer",
            &PostParams::default(),
            &released,
        )
        .await
        .unwrap();
    let wrote = stdout(&shardwise(&kubeconfig, &yes));
    assert!(wrote.contains("wrote 6 Secret(s)"), "{wrote}");
    assert_ne!(secrets_as_written(&secrets).await, before);
    let after = leases.get("shardwise-argocd-balancer").await.unwrap();
    assert_eq!(
        after
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default(),
        "",
        "given back for a balancer to take at once"
    );
}

/// Every cluster Secret's data, by name.
async fn secrets_as_written(api: &Api<Secret>) -> BTreeMap<String, Value> {
    secrets(api)
        .await
        .into_iter()
        .map(|(name, s)| (name, serde_json::to_value(s.data).expect("data is JSON")))
        .collect()
}
