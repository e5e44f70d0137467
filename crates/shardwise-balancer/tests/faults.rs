//! The balancer's moves complete through faults: a balancer stopped between its key writes and
//! their refreshes, API errors, write conflicts, and two balancers of two releases at once.
//! Real balancer processes on a real kube-apiserver, each as a ServiceAccount of its own, the
//! errors injected by the harness's proxy and the conflicts by a client that keeps rewriting
//! the cluster Secrets.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use shardwise_e2e::argocd::{documented_role, secrets, shard_key};
use shardwise_e2e::{Environment, ErrorFault, FaultScope, Identity, free_port, scrape, wait_for};

use support::{APPS, REPLICAS, SETTLE, balancer, cluster, installation, ready_controller_pods};

const CLUSTERS: u64 = 12;
/// The balancer that may not patch Applications: every move it makes is cut off before its
/// refresh, as a balancer stopped between the two leaves it.
const CUT: &str = "balancer-cut";
/// Two balancers as two releases would install them: each its own ServiceAccount.
const RELEASES: [&str; 2] = ["release-a", "release-b"];
const PENDING: &str = "shardwise.io/refresh-pending";
const REFRESH: &str = "argocd.argoproj.io/refresh";

fn annotated(object: &kube::api::ObjectMeta, key: &str) -> bool {
    object
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// The cluster Secrets that say a refresh is pending, by name.
async fn pending(api: &Api<Secret>) -> Vec<String> {
    secrets(api)
        .await
        .into_iter()
        .filter(|(_, s)| annotated(&s.metadata, PENDING))
        .map(|(name, _)| name)
        .collect()
}

async fn passes(ports: &[u16], result: &str) -> f64 {
    let mut total = 0.0;
    for port in ports {
        if let Ok(m) = scrape(&format!("http://127.0.0.1:{port}/metrics")).await {
            total += m.sum("shardwise_planner_runs_total", &[("result", result)]);
        }
    }
    total
}

#[tokio::test]
async fn moves_cut_off_before_their_refresh_are_refreshed_within_two_passes_of_the_faults_ending() {
    let mut builder = Environment::builder();
    for name in [CUT, RELEASES[0], RELEASES[1]] {
        builder = builder.identity(Identity::new(
            name,
            format!("system:serviceaccount:argocd:{name}"),
        ));
    }
    let env = builder.start().unwrap();
    let cp = env.control_plane();
    cp.apply_yaml("admin", &installation()).await.unwrap();
    ready_controller_pods(&env).await;
    // The documented Role, and one without `patch` on Applications for the cut-off balancer.
    let role = documented_role("shardwise-argocd-balancer");
    let no_refresh = role
        .replace(
            "resources: [applications]\n    verbs: [list, patch]",
            "resources: [applications]\n    verbs: [list]",
        )
        .replace("name: shardwise-argocd-balancer", "name: no-refresh");
    assert_ne!(
        no_refresh,
        role.replace("shardwise-argocd-balancer", "no-refresh")
    );
    let binding = |account: &str, role: &str| {
        format!(
            "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {account}, namespace: argocd}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {role}}}\nsubjects: [{{kind: ServiceAccount, name: {account}, namespace: argocd}}]\n"
        )
    };
    let mut rbac = format!("{role}---\n{no_refresh}");
    rbac.push_str(&binding(CUT, "no-refresh"));
    for release in RELEASES {
        rbac.push_str(&binding(release, "shardwise-argocd-balancer"));
    }
    cp.apply_yaml("admin", &rbac).await.unwrap();
    // Every cluster on shard 0: two thirds of them must move.
    let (mut objects, mut apps) = (String::new(), String::new());
    for i in 0..CLUSTERS {
        let (secret, its_apps) = cluster(&format!("c{i:02}"), ", shard: \"0\"", 0, APPS);
        objects.push_str(&secret);
        apps.push_str(&its_apps);
    }
    cp.apply_yaml("admin", &format!("{objects}{apps}"))
        .await
        .unwrap();
    let admin = cp.client("admin").await.unwrap();
    let api: Api<Secret> = Api::namespaced(admin.clone(), "argocd");
    let apps_api: Api<DynamicObject> = Api::namespaced_with(
        admin,
        "argocd",
        &shardwise_plan::api::application_resource(),
    );

    // The cut-off balancer balances the keys; none of its refreshes can be sent.
    let cut_port = free_port().unwrap();
    let mut cut = balancer(&env, &cp.kubeconfig_path(CUT).unwrap(), CUT, cut_port);
    let balanced = CLUSTERS / REPLICAS * APPS;
    wait_for("the keys balanced", SETTLE, || async {
        let mut per_shard = vec![0; REPLICAS as usize];
        for (name, s) in secrets(&api).await {
            let key = shard_key(&s).ok_or(format!("{name} has no key"))?;
            let shard: usize = key.parse().map_err(|e| format!("{name}: {e}"))?;
            *per_shard
                .get_mut(shard)
                .ok_or(format!("{name} on {shard}"))? += APPS;
        }
        if per_shard.iter().all(|&a| a == balanced) {
            Ok(())
        } else {
            Err(format!("apps per shard {per_shard:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cut.report()));
    cut.stop(Duration::from_secs(10)).await.unwrap();
    // Every cluster it moved says so, and none of its apps was refreshed.
    let moved: Vec<String> = secrets(&api)
        .await
        .into_iter()
        .filter(|(_, s)| shard_key(s).as_deref() != Some("0"))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(moved.len() as u64, CLUSTERS * 2 / 3);
    assert_eq!(pending(&api).await, moved);
    let items = apps_api.list(&Default::default()).await.unwrap().items;
    assert!(items.iter().all(|a| !annotated(&a.metadata, REFRESH)));

    // Two releases' balancers, both answered 500 on 10 % of their requests, while a client
    // rewrites every cluster Secret every 50 ms: their marks cannot be removed (409) and their
    // passes fail now and then.
    let scopes = RELEASES.map(FaultScope::identity);
    for scope in &scopes {
        cp.faults()
            .set_errors(scope.clone(), ErrorFault::new(0.1, [500]))
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let rewriter = {
        let (api, stop) = (api.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..CLUSTERS {
                    n += 1;
                    let touch =
                        serde_json::json!({"metadata": {"labels": {"touched": n.to_string()}}});
                    let _ = api
                        .patch(
                            &format!("c{i:02}"),
                            &PatchParams::default(),
                            &Patch::Merge(&touch),
                        )
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let ports = [free_port().unwrap(), free_port().unwrap()];
    let mut releases: Vec<_> = RELEASES
        .iter()
        .zip(ports)
        .map(|(name, port)| balancer(&env, &cp.kubeconfig_path(name).unwrap(), name, port))
        .collect();
    let conflicts = || {
        cp.writes()
            .into_iter()
            .filter(|w| w.code == 409 && RELEASES.contains(&w.identity.as_str()))
            .filter(|w| w.path.starts_with("/api/v1/namespaces/argocd/secrets/"))
            .count()
    };
    wait_for(
        "passes failed, refreshes sent, marks refused",
        SETTLE,
        || async {
            let conflicts = conflicts();
            let failed = passes(&ports, "error").await;
            let refreshed = apps_api
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .filter(|a| annotated(&a.metadata, REFRESH))
                .count();
            if failed >= 2.0 && refreshed > 0 && conflicts > 0 {
                Ok(())
            } else {
                Err(format!(
                    "{failed} failed passes, {refreshed} apps refreshed, {conflicts} conflicts"
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", releases[0].report(), releases[1].report()));

    // The faults end: within two passes (and the one under way), every mark is gone and every
    // app of a moved cluster was asked to refresh.
    stop.store(true, Ordering::Relaxed);
    rewriter.await.unwrap();
    for scope in &scopes {
        cp.faults().clear(scope);
    }
    let ended = Instant::now();
    let before = passes(&ports, "success").await;
    wait_for("every moved cluster refreshed", SETTLE, || async {
        let still = pending(&api).await;
        let items = apps_api
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        let waiting: Vec<String> = items
            .iter()
            .filter(|a| !annotated(&a.metadata, REFRESH))
            .filter_map(|a| a.metadata.name.clone())
            .filter(|n| moved.iter().any(|c| n.starts_with(&format!("{c}-"))))
            .collect();
        if still.is_empty() && waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("pending {still:?}; apps not refreshed {waiting:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", releases[0].report(), releases[1].report()));
    let took = passes(&ports, "success").await - before;
    assert!(
        took <= 3.0,
        "the refreshes took {took} passes ({:?}) after the faults ended",
        ended.elapsed()
    );
    for release in &mut releases {
        release.stop(Duration::from_secs(10)).await.unwrap();
    }

    // What the server saw: 500s answered to the releases, and their writes of Secrets and
    // Applications from one writer at a time. A writer changes only once the other's lease
    // ran out (15 s after its last renewal, 10 s after which it had stopped writing), or after
    // the cut-off balancer released its Lease on SIGTERM.
    let counters = cp.faults().counters();
    assert!(counters.injected_500 > 0, "{counters:?}");
    let writes: Vec<_> = cp
        .writes()
        .into_iter()
        .filter(|w| {
            w.path.starts_with("/api/v1/namespaces/argocd/secrets/")
                || w.path.starts_with("/apis/argoproj.io/")
        })
        .filter(|w| w.identity != "admin")
        .collect();
    let mut by_writer: BTreeMap<&str, usize> = BTreeMap::new();
    for pair in writes.windows(2) {
        *by_writer.entry(pair[0].identity.as_str()).or_default() += 1;
        if pair[0].identity != pair[1].identity {
            let gap = pair[1]
                .at
                .duration_since(pair[0].at)
                .unwrap_or(Duration::ZERO);
            let handed = pair[0].identity == CUT;
            assert!(
                handed || gap >= Duration::from_secs(4),
                "{} wrote {gap:?} after {}: two writers\n{:?}\n{:?}",
                pair[1].identity,
                pair[0].identity,
                pair[0],
                pair[1]
            );
        }
    }
    assert!(by_writer.contains_key(CUT), "{by_writer:?}");
}
