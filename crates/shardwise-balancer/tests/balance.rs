//! `shardwise-balancer` end to end: two real balancer processes against a real kube-apiserver,
//! with Argo CD's Application CRD and cluster Secret layout, RBAC enforced
//! with the Role docs/argocd.md gives. Clusters come and go and apps pile onto one cluster; the
//! keys must converge each time, and nothing is written but `data.shard` of cluster Secrets and
//! the refresh annotation of moved clusters' Applications. And a scale-down is met at once,
//! whatever the interval between passes.

mod support;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use shardwise_e2e::argocd::{documented_role, secrets, shard_key, without_shard};
use shardwise_e2e::{Environment, Identity, Poll, free_port, scrape, wait_for, wait_with};

use support::{
    APPS, REPLICAS, SETTLE, balancer, balancer_every, cluster, installation, ready_controller_pods,
};

/// The identity the balancers run as.
const BALANCER: &str = "balancer";

/// Apps per shard as Argo CD places them by the keys read (every key must be a live shard),
/// with each cluster's shard.
struct Keys {
    apps: Vec<u64>,
    shard: BTreeMap<String, u64>,
}

impl Keys {
    fn max_over_mean(&self) -> f64 {
        let total: u64 = self.apps.iter().sum();
        *self.apps.iter().max().expect("shards") as f64 * self.apps.len() as f64 / total as f64
    }
}

/// The `shard` key of each cluster Secret, by name.
type KeysRead = BTreeMap<String, Option<String>>;

/// Waits until every balanced Secret has a key for a live shard, nothing has been written for
/// 3 passes, and `settled` holds of the keys.
async fn converge(
    api: &Api<Secret>,
    apps_of: &BTreeMap<String, u64>,
    what: &str,
    settled: impl Fn(&Keys) -> Result<(), String>,
) -> Keys {
    // The keys last seen, and since when they have not changed.
    let last: Mutex<Option<(KeysRead, Instant)>> = Mutex::new(None);
    let poll = Poll::timeout(SETTLE).every(Duration::from_millis(250));
    wait_with(what, poll, || {
        let (last, settled) = (&last, &settled);
        async move {
            let all = secrets(api).await;
            let now = Instant::now();
            let keys: KeysRead = apps_of
                .keys()
                .map(|name| (name.clone(), all.get(name).and_then(shard_key)))
                .collect();
            let since = {
                let mut last = last.lock().expect("not poisoned");
                let since = match &*last {
                    Some((before, at)) if *before == keys => *at,
                    _ => now,
                };
                *last = Some((keys.clone(), since));
                since
            };
            let mut placed = Keys {
                apps: vec![0; REPLICAS as usize],
                shard: BTreeMap::new(),
            };
            for (name, key) in &keys {
                let shard: u64 = key
                    .as_deref()
                    .ok_or(format!("{name} has no key"))?
                    .parse()
                    .map_err(|e| format!("{name}: {e}"))?;
                if shard >= REPLICAS {
                    return Err(format!("{name} has key {shard}"));
                }
                placed.apps[shard as usize] += apps_of[name];
                placed.shard.insert(name.clone(), shard);
            }
            settled(&placed).map_err(|e| format!("{e}: apps per shard {:?}", placed.apps))?;
            if now.duration_since(since) < Duration::from_secs(3) {
                return Err(format!("keys changed less than 3 s ago: {:?}", placed.apps));
            }
            Ok(placed)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn perfect(keys: &Keys) -> Result<(), String> {
    if keys.max_over_mean() > 1.0 + 1e-9 {
        return Err("not perfectly balanced".into());
    }
    Ok(())
}

async fn metric(port: u16, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape(&format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .get(name, labels)
}

#[tokio::test]
async fn the_balancer_keeps_argocd_balanced_and_writes_only_shard_keys() {
    let env = Environment::builder()
        .identity(Identity::new(
            BALANCER,
            "system:serviceaccount:argocd:balancer",
        ))
        .start()
        .unwrap();
    let cp = env.control_plane();
    cp.apply_yaml("admin", &installation()).await.unwrap();
    ready_controller_pods(&env).await;
    let binding = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: balancer, namespace: argocd}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: shardwise-argocd-balancer}\nsubjects: [{kind: ServiceAccount, name: balancer, namespace: argocd}]\n";
    cp.apply_yaml(
        "admin",
        &format!("{}{binding}", documented_role("shardwise-argocd-balancer")),
    )
    .await
    .unwrap();

    // 12 equal clusters; one kept by hand on shard 2 and one orphaned, both without apps, and a
    // Secret that is not a cluster's.
    let mut apps_of: BTreeMap<String, u64> = BTreeMap::new();
    let (mut objects, mut apps) = (String::new(), String::new());
    for i in 0..12 {
        let name = format!("c{i:02}");
        let (secret, its_apps) = cluster(&name, "", 0, APPS);
        objects.push_str(&secret);
        apps.push_str(&its_apps);
        apps_of.insert(name, APPS);
    }
    objects.push_str(&cluster("orphan", ", shard: \"-1\"", 0, 0).0);
    objects.push_str(&cluster("kept", ", shard: \"2\"", 0, 0).0.replace(
        "team: platform",
        "team: platform, shardwise.io/keep-shard: \"true\"",
    ));
    objects.push_str("---\napiVersion: v1\nkind: Secret\nmetadata: {name: repo, namespace: argocd}\nstringData: {url: \"https://git.example\"}\n");
    cp.apply_yaml("admin", &objects).await.unwrap();
    cp.apply_yaml("admin", &apps).await.unwrap();
    let api: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
    let initial = secrets(&api).await;

    let kubeconfig = cp.kubeconfig_path(BALANCER).unwrap();
    let (first_port, second_port) = (free_port().unwrap(), free_port().unwrap());
    let mut first = balancer(&env, &kubeconfig, "balancer-a", first_port);

    // Every cluster pinned, and equal clusters balance perfectly.
    let keys = converge(&api, &apps_of, "12 clusters pinned", perfect).await;
    assert_eq!(keys.apps, vec![40, 40, 40]);
    // A second balancer stands by: it holds no lease, so it exports no plan.
    let mut second = balancer(&env, &kubeconfig, "balancer-b", second_port);
    wait_for("both balancers serve metrics", SETTLE, || async {
        let a = metric(
            first_port,
            "shardwise_planner_leader",
            &[("shard", "argocd-balancer")],
        )
        .await;
        let b = metric(second_port, "process_resident_memory_bytes", &[]).await;
        match (a, b) {
            (Some(1.0), Some(_)) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", first.report(), second.report()));
    assert_eq!(
        metric(second_port, "shardwise_assignment_balance", &[]).await,
        None
    );
    assert_eq!(
        metric(first_port, "shardwise_assignment_balance", &[]).await,
        Some(1.0)
    );
    assert_eq!(
        metric(first_port, "shardwise_members", &[("state", "expected")]).await,
        Some(REPLICAS as f64)
    );
    let mut clusters = 0.0;
    for shard in ["0", "1", "2"] {
        let labels = [("shard", shard)];
        assert_eq!(
            metric(first_port, "shardwise_assigned_items", &labels).await,
            Some(40.0)
        );
        clusters += metric(first_port, "shardwise_assigned_units", &labels)
            .await
            .unwrap_or(0.0);
    }
    // The 12, the kept one and Argo CD's in-cluster cluster (no Secret, no apps); not the
    // orphan, which no shard runs.
    assert_eq!(clusters, 14.0);
    // Every controller is Ready: only the orphan goes unreconciled, and it has no apps.
    let reconciled = |cluster| {
        let labels = [("cluster", cluster)];
        async move { metric(first_port, "shardwise_argocd_cluster_reconciled", &labels).await }
    };
    assert_eq!(reconciled("orphan").await, Some(0.0));
    assert_eq!(reconciled("c00").await, Some(1.0));
    assert_eq!(
        metric(first_port, "shardwise_argocd_unreconciled_clusters", &[]).await,
        Some(1.0)
    );
    assert_eq!(
        metric(first_port, "shardwise_argocd_unreconciled_apps", &[]).await,
        Some(0.0)
    );

    // Three clusters arrive (Argo CD runs them where its algorithm says until pinned).
    let mut objects = String::new();
    let mut apps = String::new();
    for name in ["n0", "n1", "n2"] {
        let (secret, its_apps) = cluster(name, "", 0, APPS);
        objects.push_str(&secret);
        apps.push_str(&its_apps);
        apps_of.insert(name.into(), APPS);
    }
    cp.apply_yaml("admin", &format!("{objects}{apps}"))
        .await
        .unwrap();
    let keys = converge(&api, &apps_of, "15 clusters pinned", perfect).await;
    assert_eq!(keys.apps, vec![50, 50, 50]);

    // Three clusters of shard 0 leave: 2 moves are needed, and only those are made.
    let gone: Vec<String> = keys
        .shard
        .iter()
        .filter(|(_, s)| **s == 0)
        .map(|(n, _)| n.clone())
        .take(3)
        .collect();
    for name in &gone {
        api.delete(name, &DeleteParams::default()).await.unwrap();
        apps_of.remove(name);
    }
    let before = keys.shard;
    let keys = converge(&api, &apps_of, "12 clusters after 3 left", perfect).await;
    assert_eq!(keys.apps, vec![40, 40, 40]);
    let moved: Vec<&String> = keys
        .shard
        .iter()
        .filter(|(n, s)| before[*n] != **s)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(moved.len(), 2, "moved: {moved:?}");
    // Each move is recorded on its Secret, for the minimum time and the hourly budget.
    for name in &moved {
        let secret = api.get(name).await.unwrap();
        let record = secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("shardwise.io/moves"))
            .unwrap_or_else(|| panic!("{name} moved with no record"));
        let (at, load) = record.rsplit(',').next().unwrap().split_once('=').unwrap();
        assert!(
            at.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
            "{record}"
        );
        assert_eq!(load, APPS.to_string(), "{record}");
    }

    // The leader stops; the standby takes over (the lease is released on SIGTERM).
    first.stop(Duration::from_secs(10)).await.unwrap();
    wait_for("the standby leads", SETTLE, || async {
        match metric(
            second_port,
            "shardwise_planner_leader",
            &[("shard", "argocd-balancer")],
        )
        .await
        {
            Some(1.0) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await
    .unwrap();

    // Apps pile onto one cluster: its shard's other clusters leave it; it stays.
    let hot = keys.shard.keys().next().expect("a cluster").clone();
    let hot_shard = keys.shard[&hot];
    let (_, more) = cluster(&hot, "", APPS, 40);
    cp.apply_yaml("admin", &more).await.unwrap();
    *apps_of.get_mut(&hot).unwrap() += 40;
    // 160 apps of clusters of 10 and one of 50 over 3 shards: 60 is the best a shard can carry.
    let keys = converge(&api, &apps_of, "the hot cluster's shard relieved", |k| {
        if k.apps.iter().max() > Some(&60) {
            return Err("a shard carries more than 60 apps".into());
        }
        Ok(())
    })
    .await;
    assert_eq!(keys.shard[&hot], hot_shard);
    let moves = metric(
        second_port,
        "shardwise_planner_moves_total",
        &[("kind", "cluster")],
    )
    .await
    .unwrap_or(0.0);
    assert!(moves >= 1.0, "the standby's moves: {moves}");

    // A move whose refresh a deposed balancer never sent (its Secret says it is pending): the
    // balancer in charge refreshes the cluster's apps and records it done within two passes.
    let apps_api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        cp.client("admin").await.unwrap(),
        "argocd",
        &shardwise_plan::api::application_resource(),
    );
    let refreshed = |apps: Vec<kube::api::DynamicObject>| -> Vec<String> {
        apps.into_iter()
            .filter(|a| {
                a.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|n| n.contains_key("argocd.argoproj.io/refresh"))
            })
            .filter_map(|a| a.metadata.name)
            .collect()
    };
    let quiet = keys
        .shard
        .keys()
        .find(|c| *c != &hot)
        .expect("another cluster")
        .clone();
    let quiet_apps = |all: Vec<kube::api::DynamicObject>| -> Vec<kube::api::DynamicObject> {
        all.into_iter()
            .filter(|a| {
                a.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{quiet}-")))
            })
            .collect()
    };
    let unmark =
        serde_json::json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": null}}});
    for app in quiet_apps(apps_api.list(&Default::default()).await.unwrap().items) {
        let name = app.metadata.name.unwrap();
        apps_api
            .patch(
                &name,
                &Default::default(),
                &kube::api::Patch::Merge(&unmark),
            )
            .await
            .unwrap();
    }
    let pending = serde_json::json!({"metadata": {"annotations": {"shardwise.io/refresh-pending": keys.shard[&quiet].to_string()}}});
    api.patch(
        &quiet,
        &Default::default(),
        &kube::api::Patch::Merge(&pending),
    )
    .await
    .unwrap();
    let passes = || {
        metric(
            second_port,
            "shardwise_planner_runs_total",
            &[("result", "success")],
        )
    };
    let before = passes().await.unwrap_or(0.0);
    wait_for("the pending refresh done", SETTLE, || async {
        let secret = api.get(&quiet).await.map_err(|e| e.to_string())?;
        let apps = quiet_apps(
            apps_api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items,
        );
        let total = apps.len();
        let done = refreshed(apps).len();
        let still = secret
            .metadata
            .annotations
            .is_some_and(|a| a.contains_key("shardwise.io/refresh-pending"));
        if !still && done == total && total > 0 {
            Ok(())
        } else {
            Err(format!("pending {still}; {done} of {total} apps refreshed"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Within two passes, besides the one that may have read the Secret before it was marked.
    let took = passes().await.unwrap_or(0.0) - before;
    assert!(took <= 3.0, "the pending refresh took {took} passes");

    // A handover a stopped balancer left half done (the key parked, where it was going
    // named): the balancer in charge gives the cluster a shard again, takes the annotation
    // away and refreshes its apps, within two passes.
    let parked = keys
        .shard
        .keys()
        .find(|c| *c != &hot && *c != &quiet)
        .expect("a third cluster")
        .clone();
    let parked_apps = |all: Vec<kube::api::DynamicObject>| -> Vec<kube::api::DynamicObject> {
        all.into_iter()
            .filter(|a| {
                a.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{parked}-")))
            })
            .collect()
    };
    for app in parked_apps(apps_api.list(&Default::default()).await.unwrap().items) {
        let name = app.metadata.name.unwrap();
        apps_api
            .patch(
                &name,
                &Default::default(),
                &kube::api::Patch::Merge(&unmark),
            )
            .await
            .unwrap();
    }
    let park = serde_json::json!({
        "metadata": {"annotations": {"shardwise.io/handover-to": keys.shard[&parked].to_string()}},
        "stringData": {"shard": "-1"},
    });
    api.patch(
        &parked,
        &Default::default(),
        &kube::api::Patch::Merge(&park),
    )
    .await
    .unwrap();
    let before = passes().await.unwrap_or(0.0);
    wait_for("the parked cluster handed over", SETTLE, || async {
        let secret = api.get(&parked).await.map_err(|e| e.to_string())?;
        let key = shard_key(&secret);
        let annotated = secret
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("shardwise.io/handover-to"));
        let apps = parked_apps(
            apps_api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items,
        );
        let total = apps.len();
        let done = refreshed(apps).len();
        let placed = key
            .as_deref()
            .and_then(|k| k.parse::<u64>().ok())
            .is_some_and(|k| k < REPLICAS);
        if placed && !annotated && done == total && total > 0 {
            Ok(())
        } else {
            Err(format!(
                "key {key:?}, annotated {annotated}; {done} of {total} apps refreshed"
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", second.report()));
    let took = passes().await.unwrap_or(0.0) - before;
    assert!(took <= 3.0, "the parked cluster took {took} passes");

    second.stop(Duration::from_secs(10)).await.unwrap();

    // Nothing but `data.shard` of the balanced cluster Secrets was written ...
    let now = secrets(&api).await;
    for (name, secret) in &now {
        if let Some(was) = initial.get(name) {
            assert_eq!(without_shard(secret), without_shard(was), "{name}");
        }
    }
    assert_eq!(shard_key(&now["orphan"]).as_deref(), Some("-1"));
    assert_eq!(shard_key(&now["kept"]).as_deref(), Some("2"));
    assert_eq!(shard_key(&now["repo"]), None);
    // ... and nothing else: every write of the balancers was a patch of such a Secret or of
    // their Lease.
    let writes: Vec<_> = cp
        .writes()
        .into_iter()
        .filter(|w| w.identity == BALANCER)
        .collect();
    let secret_patches = writes
        .iter()
        .filter(|w| w.path.starts_with("/api/v1/namespaces/argocd/secrets/"))
        .inspect(|w| {
            assert_eq!(w.method, "PATCH", "{w:?}");
            let name = w.path.rsplit('/').next().unwrap_or_default();
            assert!(
                apps_of.contains_key(name) || gone.iter().any(|g| g == name),
                "a write of Secret {name}: {w:?}"
            );
        })
        .count();
    assert!(secret_patches >= 15, "{secret_patches} Secret patches");
    // The refreshes of moved clusters' Applications: patches of the fleet's own apps.
    let applications = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/";
    let app_patches = writes
        .iter()
        .filter(|w| w.path.starts_with(applications))
        .inspect(|w| {
            assert_eq!(w.method, "PATCH", "{w:?}");
            let app = w.path.rsplit('/').next().unwrap_or_default();
            let cluster = app.rsplit_once('-').map(|(c, _)| c).unwrap_or_default();
            assert!(
                apps_of.contains_key(cluster) || gone.iter().any(|g| g == cluster),
                "a write of Application {app}, of no cluster: {w:?}"
            );
        })
        .count();
    assert!(app_patches > 0, "moved clusters' apps are refreshed");
    // Every move's refresh done: no Secret says one is still pending.
    wait_for("no refresh pending", Duration::from_secs(30), || async {
        let pending: Vec<String> = api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|s| {
                s.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("shardwise.io/refresh-pending"))
            })
            .filter_map(|s| s.metadata.name)
            .collect();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!("refreshes still pending for {pending:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    for w in &writes {
        let lease = w
            .path
            .starts_with("/apis/coordination.k8s.io/v1/namespaces/argocd/leases");
        let secret = w.path.starts_with("/api/v1/namespaces/argocd/secrets/");
        let application = w.path.starts_with(applications);
        assert!(lease || secret || application, "an unexpected write: {w:?}");
    }
}

// The balancer meets a change of Argo CD's controller workload at once: a scale-down leaves
// keys that the pods of the new count read as shard 0 while the leaving pod still runs its
// own, so their clusters must move before the next `--interval` would come.

/// The keys of the scale-down test's six clusters, by name.
async fn scaled_keys(api: &Api<Secret>) -> Vec<(String, Option<String>)> {
    secrets(api)
        .await
        .into_iter()
        .filter(|(name, _)| name.starts_with('w'))
        .map(|(name, s)| (name, shard_key(&s)))
        .collect()
}

#[tokio::test]
async fn a_scale_down_moves_the_leaving_shards_clusters_at_once_whatever_the_interval() {
    let env = Environment::builder()
        .identity(Identity::new(
            BALANCER,
            "system:serviceaccount:argocd:balancer",
        ))
        .start()
        .unwrap();
    let cp = env.control_plane();
    cp.apply_yaml("admin", &installation()).await.unwrap();
    ready_controller_pods(&env).await;
    let binding = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: balancer, namespace: argocd}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: shardwise-argocd-balancer}\nsubjects: [{kind: ServiceAccount, name: balancer, namespace: argocd}]\n";
    cp.apply_yaml(
        "admin",
        &format!("{}{binding}", documented_role("shardwise-argocd-balancer")),
    )
    .await
    .unwrap();
    let (mut objects, mut apps) = (String::new(), String::new());
    for i in 0..6 {
        let (secret, its_apps) = cluster(&format!("w{i}"), "", 0, 5);
        objects.push_str(&secret);
        apps.push_str(&its_apps);
    }
    cp.apply_yaml("admin", &format!("{objects}{apps}"))
        .await
        .unwrap();
    let api: Api<Secret> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");

    // One pass at the start, the next an hour later: only a watch can explain a second one.
    let kubeconfig = cp.kubeconfig_path(BALANCER).unwrap();
    let mut process = balancer_every(&env, &kubeconfig, "balancer", free_port().unwrap(), 3600);
    wait_for("the first pass pins every cluster", SETTLE, || async {
        let keys = scaled_keys(&api).await;
        let on_2 = keys
            .iter()
            .filter(|(_, k)| k.as_deref() == Some("2"))
            .count();
        if keys.len() == 6 && keys.iter().all(|(_, k)| k.is_some()) && on_2 == 2 {
            Ok(())
        } else {
            Err(format!("{keys:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", process.report()));

    // The user scales Argo CD to 2, replicas and ARGOCD_CONTROLLER_REPLICAS together. Pod 2
    // runs on (nothing replaces pods here) and reads key 2 as its own, the others as 0.
    let sets: Api<StatefulSet> = Api::namespaced(cp.client("admin").await.unwrap(), "argocd");
    let scale = serde_json::json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "c", "image": "x", "env": [{"name": "ARGOCD_CONTROLLER_REPLICAS", "value": "2"}]}
    ]}}}});
    let scaled = Instant::now();
    sets.patch(
        "argocd-application-controller",
        &PatchParams::default(),
        &Patch::Merge(&scale),
    )
    .await
    .unwrap();
    // Well within the hour the next pass would take, on a machine as loaded as it gets.
    wait_for(
        "no key names shard 2 any more (the scale-down met at once)",
        Duration::from_secs(120),
        || async {
            let keys = scaled_keys(&api).await;
            let placed = keys
                .iter()
                .all(|(_, k)| matches!(k.as_deref(), Some("0") | Some("1")));
            if placed {
                Ok(())
            } else {
                Err(format!("{keys:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", process.report()));
    eprintln!(
        "the leaving shard's clusters moved {:.2} s after the scale-down",
        scaled.elapsed().as_secs_f64()
    );
    process.stop(Duration::from_secs(10)).await.unwrap();
}
