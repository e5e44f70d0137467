//! One bad or hostile object must never break the fleet: end-to-end tests with the chart's
//! replica pods on a real control plane. Each test reproduces a way a careless or hostile user hurt
//! the fleet, and checks that the damage stays with the object at fault.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use shardwise_api::{FleetApp, FleetCluster};
use shardwise_e2e::wait_for;
use shardwise_runtime::lenient::Lenient;
use support::{Fleet, FleetOptions, NAMESPACE, app_manifests, get, shard_label};

const SETTLE: Duration = Duration::from_secs(120);

/// Tests share the machine: one fleet at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// shardwise's CRDs as an older release might have had them: the spec of each kind unchecked.
fn loose_crds() -> String {
    let text = std::fs::read_to_string(repo_file("deploy/crds.yaml")).unwrap();
    let mut crds: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    crds.retain(|c| !c.is_null());
    for crd in &mut crds {
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] =
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    }
    crds.iter()
        .map(|c| format!("---\n{}\n", serde_json::to_string(c).unwrap()))
        .collect()
}

/// Creates a FleetCluster or FleetApp from JSON as written, bypassing the Rust types (which
/// could not hold what a careless user can send).
async fn create_raw<K: kube::Resource<DynamicType = ()>>(
    fleet: &Fleet,
    name: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(fleet.admin.clone(), NAMESPACE, &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec,
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await
}

/// Waits until the status of the FleetCluster or FleetApp `name` has `field` equal to `value`
/// and a message containing `text`. Read untyped: the object may be one the types cannot hold.
async fn wait_status<K: kube::Resource<DynamicType = ()>>(
    fleet: &Fleet,
    name: &str,
    (field, value): (&str, &str),
    text: &str,
) {
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(fleet.admin.clone(), NAMESPACE, &resource);
    let expected = format!(
        "{} {name}: {field} {value}, message with {text:?}",
        resource.kind
    );
    wait_for(&expected, SETTLE, || async {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
        let status = object.data.get("status").cloned().unwrap_or_default();
        let got = status[field].as_str().unwrap_or_default();
        let message = status["message"].as_str().unwrap_or_default();
        if got == value && message.contains(text) {
            Ok(())
        } else {
            Err(format!("{got}: {message}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));
}

async fn wait_event(fleet: &Fleet, name: &str, reason: &str) {
    wait_for(
        &format!("a {reason} event about {name}"),
        SETTLE,
        || async {
            let reasons = fleet.event_reasons(name).await.map_err(|e| e.to_string())?;
            if reasons.iter().any(|r| r == reason) {
                Ok(())
            } else {
                Err(format!("events: {reasons:?}"))
            }
        },
    )
    .await
    .unwrap();
}

/// The API server refuses numbers the controller's types cannot hold. Objects stored before the
/// schema said so (or that otherwise cannot be read) get a status and an Event, and planning
/// carries on for everything else, through a change of planner and a scale-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_the_controller_cannot_read_stop_nothing() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 3,
        clusters: 10,
        apps: 100,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
    let server = fleet.destination_url(0);
    let credentials = json!({"secretRef": {"name": "dest-0-credentials"}});

    // Today's schema: the API server refuses what the types cannot hold.
    for (weight, bound) in [
        (json!(4294967296u64), "less than or equal to 1000"),
        (json!(-1), "greater than or equal to 1"),
    ] {
        let refused = create_raw::<FleetCluster>(
            &fleet,
            "refused",
            json!({"server": server, "credentials": credentials, "weight": weight}),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&refused, kube::Error::Api(s) if s.code == 422 && s.message.contains(bound)),
            "{refused}"
        );
    }

    // Under an older, looser schema the same objects were stored; the schema then tightened.
    let cp = fleet.env.control_plane();
    cp.apply_yaml("admin", &loose_crds()).await.unwrap();
    create_raw::<FleetCluster>(
        &fleet,
        "oversized",
        json!({"server": server, "credentials": credentials, "weight": 4294967296u64}),
    )
    .await
    .unwrap();
    create_raw::<FleetApp>(
        &fleet,
        "unreadable",
        json!({"destination": {"cluster": 7, "namespace": "team-0"}, "source": {}}),
    )
    .await
    .unwrap();
    create_raw::<FleetApp>(
        &fleet,
        "on-oversized",
        json!({"destination": {"cluster": "oversized", "namespace": "team-0"},
               "source": {"manifests": app_manifests(9000, 1)}}),
    )
    .await
    .unwrap();
    cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
        .await
        .unwrap();

    // A new planner lists everything from scratch.
    let planner = fleet.planner(SETTLE).await.unwrap();
    fleet.stop_replica(planner).await.unwrap();
    fleet.spawn_replica(planner).await.unwrap();

    // Each object that cannot be read says why, naming the field.
    wait_status::<FleetCluster>(
        &fleet,
        "oversized",
        ("phase", "Invalid"),
        "spec.weight: invalid value: integer `4294967296`, expected u32",
    )
    .await;
    wait_event(&fleet, "oversized", "InvalidSpec").await;
    wait_status::<FleetApp>(
        &fleet,
        "unreadable",
        ("syncPhase", "Failed"),
        "spec.destination.cluster",
    )
    .await;
    wait_event(&fleet, "unreadable", "InvalidSpec").await;
    wait_status::<FleetApp>(
        &fleet,
        "on-oversized",
        ("syncPhase", "Failed"),
        "FleetCluster \"oversized\" is invalid",
    )
    .await;

    // Meanwhile the fleet goes on: a new cluster with apps is placed and synced, and a new
    // shard gets its share.
    fleet.create_clusters(10..11).await.unwrap();
    let apps = fleet.apps_api();
    for i in 0..5 {
        let app: FleetApp = serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
            "metadata": {"name": format!("late-{i}"), "namespace": NAMESPACE},
            "spec": {"destination": {"cluster": "cluster-10", "namespace": "team-1"},
                     "source": {"manifests": app_manifests(10_000 + i, 1)}},
        }))
        .unwrap();
        apps.create(&PostParams::default(), &app).await.unwrap();
    }
    for i in 0..5 {
        wait_status::<FleetApp>(&fleet, &format!("late-{i}"), ("syncPhase", "Synced"), "").await;
    }
    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    // Listed leniently: the typed list would fail on "oversized", as the controller's did.
    let clusters: Api<Lenient<FleetCluster>> =
        Api::namespaced_with(fleet.admin.clone(), NAMESPACE, &());
    wait_for("shard 3 to own clusters", SETTLE, || async {
        let list = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let owned = list
            .items
            .into_iter()
            .filter_map(|c| c.decoded().ok())
            .filter(|c| shard_label(c) == Some(3))
            .count();
        if owned > 0 {
            Ok(())
        } else {
            Err("shard 3 owns nothing".to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));
}

/// One cluster whose load dwarfs the rest of the fleet cannot be balanced, but it must not
/// freeze the balancing of the others: after a scale-up the new shard gets its share of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_outsized_cluster_never_freezes_rebalancing() {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 3,
        clusters: 10,
        apps: 200,
        // Whole clusters only: slices would cut the outsized one (e2e/tests/slices.rs).
        args: vec!["--slicing=off".into()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let clusters = fleet.clusters_api();
    // 20 apps of weight 1000 (the most the schema allows): 20,000 against 180 for the rest.
    clusters
        .patch(
            "cluster-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"weight": 1000}})),
        )
        .await
        .unwrap();
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    // The shards other than the outsized cluster's are balanced among themselves.
    let started = std::time::Instant::now();
    wait_for("the other shards to be balanced", SETTLE, || async {
        let list = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let mut apps_per_shard = [0u64; 4];
        let mut outsized = None;
        for c in &list.items {
            let Some(shard) = shard_label(c) else {
                return Err(format!("{} is not placed", c.name_any()));
            };
            if c.name_any() == "cluster-0" {
                outsized = Some(shard);
            } else {
                apps_per_shard[shard as usize] += 20;
            }
        }
        let outsized = outsized.ok_or("cluster-0 is missing")?;
        let others: Vec<u64> = (0..4)
            .filter(|&s| s != outsized as usize)
            .map(|s| apps_per_shard[s])
            .collect();
        let mean = others.iter().sum::<u64>() as f64 / others.len() as f64;
        let max = others.iter().copied().max().unwrap_or(0) as f64;
        if apps_per_shard[outsized as usize] == 0 && max / mean <= 1.15 {
            Ok(())
        } else {
            Err(format!(
                "cluster-0 on {outsized}, other apps per shard {apps_per_shard:?}"
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", fleet.report()));
    eprintln!(
        "balanced around the outsized cluster in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await.unwrap();
}

/// Mistakes in apps and clusters get a status that names them in plain words, and hurt no other
/// app: an object declared twice, an object two apps claim, a token that cannot be sent, a
/// token the destination refuses, a cluster deleted under its apps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_are_reported_plainly_and_stay_with_their_object() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start(FleetOptions {
        replicas: 3,
        clusters: 10,
        apps: 100,
        // A long resync: what must happen within seconds cannot wait for it.
        args: vec!["--resync-interval=3m".into()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
    let apps = fleet.apps_api();
    let app = |name: &str, cluster: &str, namespace: &str, manifests: &str| -> FleetApp {
        serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"destination": {"cluster": cluster, "namespace": namespace},
                     "source": {"manifests": manifests}},
        }))
        .unwrap()
    };
    let config_map = |name: &str, namespace: Option<&str>, value: &str| {
        let namespace = namespace.map_or(String::new(), |n| format!("\n  namespace: {n}"));
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}{namespace}\ndata:\n  value: {value}\n"
        )
    };

    // The same object twice once its namespace is defaulted: refused, nothing written.
    let twice = format!(
        "{}---\n{}",
        config_map("twice", Some("dupns"), "a"),
        config_map("twice", None, "b")
    );
    apps.create(
        &PostParams::default(),
        &app("dup", "cluster-0", "dupns", &twice),
    )
    .await
    .unwrap();
    wait_status::<FleetApp>(
        &fleet,
        "dup",
        ("syncPhase", "Failed"),
        "ConfigMap dupns/twice is declared twice",
    )
    .await;

    // Two apps, one object: the first keeps it, the second says who has it.
    apps.create(
        &PostParams::default(),
        &app(
            "first",
            "cluster-1",
            "shared",
            &config_map("shared", None, "first"),
        ),
    )
    .await
    .unwrap();
    wait_status::<FleetApp>(&fleet, "first", ("syncPhase", "Synced"), "").await;
    apps.create(
        &PostParams::default(),
        &app(
            "second",
            "cluster-1",
            "shared",
            &config_map("shared", None, "second"),
        ),
    )
    .await
    .unwrap();
    wait_status::<FleetApp>(
        &fleet,
        "second",
        ("syncPhase", "Failed"),
        "ConfigMap shared/shared is managed by FleetApp shardwise/first",
    )
    .await;
    let destination = fleet.env.destinations()[1].client("admin").await.unwrap();
    let live: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(destination, "shared");
    let value = live.get("shared").await.unwrap().data.unwrap_or_default();
    assert_eq!(value.get("value").map(String::as_str), Some("first"));
    wait_status::<FleetApp>(&fleet, "first", ("syncPhase", "Synced"), "").await;

    // Tokens: one that cannot travel in a header, one the destination refuses.
    let server = fleet.destination_url(0);
    let ca = fleet.env.destinations()[0].ca_pem();
    let cp = fleet.env.control_plane();
    for (secret, token) in [("accented", "jeton-à-accent"), ("stale", "not-the-token")] {
        let body = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": secret,
                "namespace": NAMESPACE,
                "labels": {"shardwise.io/secret-type": "cluster"},
            },
            "stringData": {"server": server, "token": token, "ca.crt": ca},
        });
        cp.apply_yaml("admin", &body.to_string()).await.unwrap();
        create_raw::<FleetCluster>(
            &fleet,
            secret,
            json!({"server": server, "credentials": {"secretRef": {"name": secret}}}),
        )
        .await
        .unwrap();
    }
    apps.create(
        &PostParams::default(),
        &app(
            "refused",
            "stale",
            "team-0",
            &config_map("refused", None, "x"),
        ),
    )
    .await
    .unwrap();
    wait_status::<FleetCluster>(
        &fleet,
        "accented",
        ("phase", "Invalid"),
        "key \"token\" of Secret \"accented\" is not valid bearer token",
    )
    .await;
    wait_status::<FleetCluster>(
        &fleet,
        "stale",
        ("phase", "Unauthorized"),
        "credentials rejected (401)",
    )
    .await;
    wait_status::<FleetApp>(
        &fleet,
        "refused",
        ("syncPhase", "Failed"),
        "credentials rejected (401)",
    )
    .await;

    // A deleted cluster's apps say so within seconds, not at their next resync.
    let orphans: Vec<String> = (0..100)
        .filter(|i| i % 10 == 3)
        .map(|i| format!("app-{i}"))
        .collect();
    fleet
        .clusters_api()
        .delete("cluster-3", &Default::default())
        .await
        .unwrap();
    let started = std::time::Instant::now();
    for name in &orphans {
        wait_status::<FleetApp>(
            &fleet,
            name,
            ("syncPhase", "Failed"),
            "FleetCluster \"cluster-3\" does not exist",
        )
        .await;
    }
    let took = started.elapsed();
    eprintln!(
        "apps of a deleted cluster failed after {:.1} s",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
    // And none of it disturbed the other apps.
    for i in (0..100).filter(|i| i % 10 != 3) {
        wait_status::<FleetApp>(&fleet, &format!("app-{i}"), ("syncPhase", "Synced"), "").await;
    }
}

/// A server on `address` that records every connection it gets and answers nothing: where an
/// attacker would like credentials to be sent.
async fn listening_attacker(
    address: &str,
) -> (
    u16,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind(format!("{address}:0"))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, peer)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut bytes = vec![0u8; 4096];
                let n = tokio::time::timeout(Duration::from_secs(2), socket.read(&mut bytes))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or(0);
                record
                    .lock()
                    .unwrap()
                    .push(format!("{peer}: {}", String::from_utf8_lossy(&bytes[..n])));
            });
        }
    });
    (port, seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_go_only_where_their_secret_says() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start(FleetOptions {
        replicas: 2,
        clusters: 4,
        apps: 40,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1], SETTLE).await.unwrap();
    // Where the replicas could reach it.
    let host = fleet.test_address();
    let (port, seen, attacker) = listening_attacker(&host).await;
    let cp = fleet.env.control_plane();
    // Another team's Secret: not cluster credentials, so the controller must use none of it.
    cp.apply_yaml(
        "admin",
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "team-b-database", "namespace": NAMESPACE},
            "stringData": {"password": "hunter2", "server": format!("https://{host}:{port}")},
        })
        .to_string(),
    )
    .await
    .unwrap();
    // Real cluster credentials, but marked for plain http (an admin's mistake).
    cp.apply_yaml(
        "admin",
        &json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "plain", "namespace": NAMESPACE,
                         "labels": {"shardwise.io/secret-type": "cluster"}},
            "stringData": {"token": "plain-token", "server": format!("http://{host}:{port}")},
        })
        .to_string(),
    )
    .await
    .unwrap();
    let other_team = json!({"name": "team-b-database", "tokenKey": "password"});
    let probes = [
        (
            "probe-http",
            json!({"server": format!("http://{host}:{port}"), "credentials": {"secretRef": other_team}}),
            "is plain http: credentials are only sent over https".to_string(),
        ),
        (
            "probe-https",
            json!({"server": format!("https://{host}:{port}"), "credentials": {"secretRef": other_team}}),
            "Secret \"team-b-database\" is not cluster credentials".to_string(),
        ),
        (
            "probe-stolen",
            json!({"server": format!("https://{host}:{port}"),
                   "credentials": {"secretRef": {"name": "dest-0-credentials"}}}),
            format!(
                "Secret \"dest-0-credentials\" holds credentials for {:?}, not for spec.server \"https://{host}:{port}\"",
                fleet.destination_url(0)
            ),
        ),
        (
            "probe-plain",
            json!({"server": format!("http://{host}:{port}"),
                   "credentials": {"secretRef": {"name": "plain"}}}),
            "is plain http".to_string(),
        ),
    ];
    for (name, spec, _) in &probes {
        create_raw::<FleetCluster>(&fleet, name, spec.clone())
            .await
            .unwrap();
    }
    for (name, _, message) in &probes {
        wait_status::<FleetCluster>(&fleet, name, ("phase", "Invalid"), message).await;
        let cluster = fleet.clusters_api().get(name).await.unwrap();
        let ready = cluster
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
    }
    // Let every probe run a few more times: the attacker still gets nothing at all.
    tokio::time::sleep(Duration::from_secs(12)).await;
    attacker.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.is_empty(),
        "the attacker's server was contacted:\n{}",
        seen.join("\n")
    );
    // Nothing of it disturbed the fleet.
    fleet.check_settled(&[0, 1]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_stay_in_their_namespace_unless_an_admin_policy_says_otherwise() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start(FleetOptions {
        replicas: 2,
        clusters: 2,
        apps: 20,
        // A long resync: a new policy must take effect through its watch, not a resync.
        args: vec!["--resync-interval=3m".into()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1], SETTLE).await.unwrap();
    let config_map = |name: &str, namespace: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\ndata:\n  v: x\n"
        )
    };
    let cluster_admin = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: take-over\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: User, name: mallory, apiGroup: rbac.authorization.k8s.io}]\n";
    let cluster_role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: agent-reader\nrules: [{apiGroups: [\"\"], resources: [pods], verbs: [get]}]\n";
    let network_policy = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: open\n  namespace: monitoring\nspec: {podSelector: {}}\n";
    let app = |policy: Option<&str>, manifests: String| {
        let mut spec = json!({
            "destination": {"cluster": "cluster-0", "namespace": "team-0"},
            "source": {"manifests": manifests},
        });
        if let Some(p) = policy {
            spec["policy"] = json!(p);
        }
        spec
    };
    let cases = [
        (
            "escape-ns",
            app(
                None,
                format!(
                    "{}---\n{}",
                    config_map("fine", "team-0"),
                    config_map("escape", "kube-system")
                ),
            ),
            "ConfigMap kube-system/escape is outside the destination namespace \"team-0\": an app without a FleetPolicy writes only there",
        ),
        (
            "escape-crb",
            app(None, cluster_admin.to_string()),
            "ClusterRoleBinding.rbac.authorization.k8s.io take-over is cluster-scoped: an app without a FleetPolicy writes only namespaced objects",
        ),
        (
            "sneaky",
            app(Some("platform"), cluster_role.to_string()),
            "FleetPolicy \"platform\" does not list this app in spec.apps",
        ),
        (
            "platform-wide",
            app(Some("platform"), cluster_admin.to_string()),
            "ClusterRoleBinding.rbac.authorization.k8s.io take-over is cluster-scoped and FleetPolicy \"platform\" allows no ClusterRoleBinding.rbac.authorization.k8s.io in spec.clusterResources",
        ),
        (
            "platform-netpol",
            app(Some("platform"), network_policy.to_string()),
            "NetworkPolicy.networking.k8s.io monitoring/open: FleetPolicy \"platform\" denies NetworkPolicy.networking.k8s.io in spec.namespaceResourcesDenied",
        ),
        (
            "platform-system",
            app(Some("platform"), config_map("escape", "kube-system")),
            "ConfigMap kube-system/escape: FleetPolicy \"platform\" allows no destination namespace \"kube-system\" on FleetCluster \"cluster-0\"",
        ),
    ];
    // The platform policy, written by an admin.
    let policy = json!({
        "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetPolicy",
        "metadata": {"name": "platform", "namespace": NAMESPACE},
        "spec": {
            "apps": ["platform-*"],
            "destinations": [{"cluster": "*", "namespace": "monitoring"}],
            "clusterResources": [{"group": "rbac.authorization.k8s.io", "kind": "ClusterRole"}],
            "namespaceResourcesDenied": [{"group": "networking.k8s.io", "kind": "NetworkPolicy"}],
        },
    });
    // Without a policy: nothing outside the destination namespace.
    let (confined, granted) = cases.split_at(2);
    for (name, spec, _) in confined {
        create_raw::<FleetApp>(&fleet, name, spec.clone())
            .await
            .unwrap();
    }
    for (name, _, message) in confined {
        wait_status::<FleetApp>(&fleet, name, ("syncPhase", "Failed"), message).await;
    }
    let cp = fleet.env.control_plane();
    cp.apply_yaml("admin", &policy.to_string()).await.unwrap();
    for (name, spec, _) in granted {
        create_raw::<FleetApp>(&fleet, name, spec.clone())
            .await
            .unwrap();
    }
    // Granted by the policy: a ClusterRole and a ConfigMap in monitoring.
    create_raw::<FleetApp>(
        &fleet,
        "platform-agent",
        app(
            Some("platform"),
            format!("{cluster_role}---\n{}", config_map("agent", "monitoring")),
        ),
    )
    .await
    .unwrap();
    // A policy that does not exist yet: the app fails, then syncs as soon as it appears.
    create_raw::<FleetApp>(
        &fleet,
        "later-agent",
        app(Some("later"), config_map("later", "monitoring")),
    )
    .await
    .unwrap();
    for (name, _, message) in granted {
        wait_status::<FleetApp>(&fleet, name, ("syncPhase", "Failed"), message).await;
    }
    wait_status::<FleetApp>(&fleet, "platform-agent", ("syncPhase", "Synced"), "").await;
    wait_status::<FleetApp>(
        &fleet,
        "later-agent",
        ("syncPhase", "Failed"),
        "FleetPolicy \"later\" does not exist",
    )
    .await;
    let mut later = policy.clone();
    later["metadata"]["name"] = json!("later");
    later["spec"]["apps"] = json!(["later-*"]);
    cp.apply_yaml("admin", &later.to_string()).await.unwrap();
    let created = std::time::Instant::now();
    wait_status::<FleetApp>(&fleet, "later-agent", ("syncPhase", "Synced"), "").await;
    assert!(
        created.elapsed() < Duration::from_secs(60),
        "a new policy took {:?} to apply",
        created.elapsed()
    );

    // From the destination's side: what was refused was never written, not even in part.
    let destination = fleet.env.destinations()[0].client("admin").await.unwrap();
    let config_maps = |ns: &str| -> Api<k8s_openapi::api::core::v1::ConfigMap> {
        Api::namespaced(destination.clone(), ns)
    };
    assert!(
        config_maps("kube-system")
            .get_opt("escape")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        config_maps("team-0")
            .get_opt("fine")
            .await
            .unwrap()
            .is_none()
    );
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
        Api::all(destination.clone());
    assert!(bindings.get_opt("take-over").await.unwrap().is_none());
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(destination.clone(), "monitoring");
    assert!(policies.get_opt("open").await.unwrap().is_none());
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(destination.clone());
    assert!(roles.get_opt("agent-reader").await.unwrap().is_some());
    assert!(
        config_maps("monitoring")
            .get_opt("agent")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        config_maps("monitoring")
            .get_opt("later")
            .await
            .unwrap()
            .is_some()
    );
    // And the fleet's own apps never noticed.
    for i in 0..20 {
        wait_status::<FleetApp>(&fleet, &format!("app-{i}"), ("syncPhase", "Synced"), "").await;
    }
}

/// Secure by default: a replica's metrics go over HTTPS only to a bearer token the control
/// plane accepts for a user allowed to read /metrics; its probes stay plain HTTP for the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_only_to_authorized_scrapers() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::start(FleetOptions {
        replicas: 1,
        clusters: 2,
        apps: 10,
        secure_metrics: true,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let access = fleet.metrics_access.clone().unwrap();
    let cp = fleet.env.control_plane();
    cp.add_identity(shardwise_e2e::Identity::service_account(
        "intruder",
        "monitoring",
        "intruder",
    ))
    .unwrap();
    let token = |name: &str| cp.token(name).unwrap();
    let ca = access.ca.clone();
    let replica = &fleet.replicas[&0];
    let metrics = replica.metrics_url.trim_end_matches("/metrics");
    let ready = replica.ready_url.trim_end_matches("/readyz");

    let (code, body) = wait_for("the replica to listen", SETTLE, || async {
        match get(metrics, Some(&ca), Some(&access.token), "/metrics").await {
            (0, error) => Err(error),
            answer => Ok(answer),
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("shardwise_lease_held"), "{body}");
    // The same request again is answered from the cache of reviews.
    assert_eq!(
        get(metrics, Some(&ca), Some(&access.token), "/metrics")
            .await
            .0,
        200
    );

    let (code, body) = get(metrics, Some(&ca), None, "/metrics").await;
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = get(metrics, Some(&ca), Some("made-up"), "/metrics").await;
    assert_eq!(code, 401, "a token the control plane does not know: {body}");
    let (code, body) = get(metrics, Some(&ca), Some(&token("intruder")), "/metrics").await;
    assert_eq!(code, 403, "an identity without the reader role: {body}");
    assert!(
        body.contains("system:serviceaccount:monitoring:intruder") && body.contains("/metrics"),
        "{body}"
    );
    // Nothing in the clear on the metrics port.
    let plain = metrics.replace("https://", "http://");
    let (code, body) = get(&plain, None, Some(&access.token), "/metrics").await;
    assert_ne!(code, 200, "metrics served over plain HTTP: {body}");

    // The probes need no token: the kubelet has none.
    let (code, body) = get(ready, None, None, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = get(ready, None, None, "/metrics").await;
    assert_eq!(code, 404, "metrics on the probes' port: {body}");
}
