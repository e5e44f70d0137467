//! End-to-end tests of the sharded controller: charts/shardwise installed with Helm on a real
//! control plane (its RBAC enforced) that runs pods, the real StatefulSet controller creating
//! one pod per replica, and two destination clusters.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use shardwise_api::{ClusterPhase, FleetApp, FleetCluster, SyncPhase};
use shardwise_e2e::{scrape, wait_for};
use shardwise_handoff::keys::{LOAD_ANNOTATION, UNIT_LABEL, unit_token};
use shardwise_wire::load::{LoadReport, record_text};
use support::{Fleet, FleetOptions, NAMESPACE, STATEFULSET, app_manifests, shard_label};

const SETTLE: Duration = Duration::from_secs(120);

/// 3 replicas, 20 clusters, 500 apps: everything Synced, each object in its destination, every
/// cluster and app owned by exactly one shard, and each replica's metrics show what it owns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_reconcile_the_whole_fleet_each_its_own_share() {
    let fleet = Fleet::start(FleetOptions::default()).await.unwrap();
    if let Err(e) = fleet.wait_settled(&[0, 1, 2], SETTLE).await {
        panic!("{e}\n{}", fleet.report());
    }
    for index in [0, 17, 250, 499] {
        let cm = fleet.destination_config_map(index).await.unwrap();
        let cm = cm.unwrap_or_else(|| panic!("app-{index} not applied in its destination"));
        assert_eq!(cm.data.unwrap()["generation"], "1");
        let labels = cm.metadata.labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "shardwise");
    }

    // The planner may still move a cluster by its measured load after the fleet settled, so
    // every check below compares a replica's figures with the labels as they are at that
    // attempt, not with one early listing.
    for shard in 0..3u32 {
        let label = shard.to_string();
        let metrics_url = &fleet.replicas[&shard].metrics_url;
        // Each replica's gauges show exactly its own share, and it counted a successful
        // reconcile of each of its apps.
        wait_for(
            "owned gauges to match the labels",
            Duration::from_secs(30),
            || async {
                let (owned_clusters, owned_apps) = labelled_to(&fleet, shard).await?;
                if owned_clusters.is_empty() {
                    return Err(format!("shard {shard} owns no cluster"));
                }
                let m = scrape(metrics_url).await.map_err(|e| e.to_string())?;
                let c = m.get("shardwise_owned_units", &[("shard", &label)]);
                let a = m.get("shardwise_owned_items", &[("shard", &label)]);
                let ok = m.sum(
                    "shardwise_reconciles_total",
                    &[("kind", "app"), ("result", "success")],
                );
                if c == Some(owned_clusters.len() as f64)
                    && a == Some(owned_apps as f64)
                    && ok >= owned_apps as f64
                {
                    Ok(())
                } else {
                    Err(format!(
                        "clusters {c:?} apps {a:?} successes {ok}, labels say {} and {owned_apps}",
                        owned_clusters.len()
                    ))
                }
            },
        )
        .await
        .unwrap();
    }
    // Each replica measures what its clusters cost it and publishes it on its shard lease: a
    // record per cluster it owns (none is cut here), with its 25 apps, a busy time that is
    // plausible (some, and less than its 12 workers all busy all the time), and the bytes of
    // its cache of the cluster: 25 ConfigMaps of a few hundred bytes each.
    let leases: Api<Lease> = Api::namespaced(fleet.admin.clone(), NAMESPACE);
    for shard in 0..3u32 {
        let lease = format!("{STATEFULSET}-shard-{shard}");
        let label = shard.to_string();
        let metrics_url = &fleet.replicas[&shard].metrics_url;
        wait_for(
            "each shard lease to report the load of its clusters",
            Duration::from_secs(60),
            || async {
                let (owned, _) = labelled_to(&fleet, shard).await?;
                let lease = leases.get(&lease).await.map_err(|e| e.to_string())?;
                let text = lease.annotations().get(LOAD_ANNOTATION).cloned();
                let report =
                    LoadReport::decode(&text.unwrap_or_default()).map_err(|e| e.to_string())?;
                let reported: BTreeSet<String> = report.records.keys().map(record_text).collect();
                if reported != owned {
                    return Err(format!(
                        "shard {shard} reports {reported:?}, owns {owned:?}"
                    ));
                }
                if let Some((key, load)) = report.records.iter().find(|(_, l)| {
                    let cached = l.bytes.is_some_and(|b| (25 * 200..25 * 5_000).contains(&b));
                    l.items != 25 || !(l.busy > 0.0 && l.busy < 12.0) || !cached
                }) {
                    return Err(format!("{}: {load:?}", record_text(key)));
                }
                let m = scrape(metrics_url).await.map_err(|e| e.to_string())?;
                let measured = m.get("shardwise_measured_records", &[("shard", &label)]);
                if measured != Some(owned.len() as f64) {
                    return Err(format!("shard {shard} measures {measured:?} records"));
                }
                Ok(())
            },
        )
        .await
        .unwrap();
    }
    let clusters_api = fleet.clusters_api();
    wait_for(
        "every cluster Connected, with its owner and app count",
        Duration::from_secs(30),
        || async {
            let list = clusters_api
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            for c in &list.items {
                let status = c.status.clone().unwrap_or_default();
                if status.phase != Some(ClusterPhase::Connected)
                    || status.shard != shard_label(c)
                    || status.app_count != Some(25)
                {
                    return Err(format!(
                        "{}: {:?} shard {:?} apps {:?} {:?}",
                        c.name_any(),
                        status.phase,
                        status.shard,
                        status.app_count,
                        status.message
                    ));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap();
    // One planner, and no request refused by RBAC anywhere.
    assert_eq!(
        fleet
            .metric_sum("shardwise_planner_leader", &[])
            .await
            .unwrap(),
        1.0
    );
    // It balances the measured load (the default model), and shows it: the plan's load on each
    // shard, and the busiest over the mean, which its trigger is judged on.
    let planner = fleet.planner(Duration::from_secs(5)).await.unwrap();
    let m = fleet.scrape(planner).await.unwrap();
    let balance = m.get("shardwise_load_balance", &[]);
    assert!(
        balance.is_some_and(|b| b >= 1.0),
        "load balance {balance:?}"
    );
    for shard in ["0", "1", "2"] {
        let load = m.get("shardwise_assigned_load", &[("shard", shard)]);
        assert!(
            load.is_some_and(|l| l > 0.0),
            "shard {shard}: load {load:?}"
        );
    }
    assert_eq!(
        fleet
            .metric_sum(
                "shardwise_api_requests_total",
                &[("target", "control-plane"), ("code", "403")]
            )
            .await
            .unwrap(),
        0.0,
        "{}",
        fleet.report()
    );
}

/// Editing an app's manifests updates the destination; removing a manifest prunes it; editing
/// or deleting an object in a destination is repaired within seconds, by the watch of its
/// cluster's cache, with the resync an hour away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_follow_their_manifests_prune_and_repair_drift() {
    let fleet = Fleet::start(FleetOptions {
        replicas: 2,
        clusters: 4,
        apps: 20,
        args: vec!["--resync-interval=1h".into()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1], SETTLE).await.unwrap();
    let apps = fleet.apps_api();

    // Edit: new data and a second object.
    let second = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-3-extra\ndata:\n  k: v\n";
    let manifests = format!("{}---\n{second}", app_manifests(3, 2));
    apps.patch(
        "app-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"source": {"manifests": manifests}}})),
    )
    .await
    .unwrap();
    let dest = fleet.env.destinations()[3 % 2]
        .client("admin")
        .await
        .unwrap();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(dest, "team-3");
    wait_for("the edit to reach the destination", SETTLE, || async {
        let main = cms.get_opt("app-3").await.map_err(|e| e.to_string())?;
        let extra = cms
            .get_opt("app-3-extra")
            .await
            .map_err(|e| e.to_string())?;
        match (
            main.and_then(|c| c.data).map(|d| d["generation"].clone()),
            extra,
        ) {
            (Some(g), Some(_)) if g == "2" => Ok(()),
            (g, extra) => Err(format!(
                "generation {g:?}, extra present {}",
                extra.is_some()
            )),
        }
    })
    .await
    .unwrap();
    // The status (with the inventory used for pruning) is written after the objects are applied.
    wait_for("the inventory to list both objects", SETTLE, || async {
        let app = apps.get("app-3").await.map_err(|e| e.to_string())?;
        let inventory = app.status.unwrap_or_default().applied_resources;
        if inventory.len() == 2 {
            Ok(())
        } else {
            Err(format!("{inventory:?}"))
        }
    })
    .await
    .unwrap();

    // Remove the second manifest: it is pruned.
    apps.patch(
        "app-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"source": {"manifests": app_manifests(3, 3)}}})),
    )
    .await
    .unwrap();
    wait_for("the removed manifest to be pruned", SETTLE, || async {
        match cms
            .get_opt("app-3-extra")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("app-3-extra still exists".into()),
        }
    })
    .await
    .unwrap();

    // Drift: edit the object in the destination, then delete it; each is put back at once.
    let repaired = |what: &'static str| {
        let cms = cms.clone();
        async move {
            wait_for(what, Duration::from_secs(10), || async {
                match cms.get_opt("app-3").await.map_err(|e| e.to_string())? {
                    Some(cm) if cm.data.as_ref().is_some_and(|d| d["generation"] == "3") => Ok(()),
                    other => Err(format!("{:?}", other.map(|c| c.data))),
                }
            })
            .await
            .unwrap();
        }
    };
    cms.patch(
        "app-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"generation": "edited by hand"}})),
    )
    .await
    .unwrap();
    repaired("the edited object to be repaired").await;
    cms.delete("app-3", &DeleteParams::default()).await.unwrap();
    repaired("the deleted object to be re-applied").await;

    // Sent to another cluster: the planner reads only metadata, so the owner that finds the old
    // token removes it; the planner writes the new one, and the new cluster's owner applies it.
    apps.patch(
        "app-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"destination": {"cluster": "cluster-2"}}})),
    )
    .await
    .unwrap();
    let other = fleet.env.destinations()[2 % 2]
        .client("admin")
        .await
        .unwrap();
    let moved: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(other, "team-3");
    let token = unit_token(NAMESPACE, "cluster-2");
    wait_for(
        "app-3 applied to cluster-2, with its token",
        SETTLE,
        || async {
            let app = apps.get("app-3").await.map_err(|e| e.to_string())?;
            let labelled = app.labels().get(UNIT_LABEL) == Some(&token);
            let applied = moved.get_opt("app-3").await.map_err(|e| e.to_string())?;
            let synced = app.status.as_ref().and_then(|s| s.sync_phase) == Some(SyncPhase::Synced);
            if labelled && applied.is_some() && synced {
                Ok(())
            } else {
                Err(format!(
                    "token {:?}, applied {}, synced {synced}",
                    app.labels().get(UNIT_LABEL),
                    applied.is_some()
                ))
            }
        },
    )
    .await
    .unwrap();
}

/// Scale the StatefulSet from 3 to 2 (stopping replica 2): its clusters and apps are owned and
/// Synced again by the others. Scale to 4: the new replica takes a share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_moves_work_to_the_shards_that_exist() {
    let mut fleet = Fleet::start(FleetOptions {
        clusters: 12,
        apps: 120,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();

    fleet.scale(2).await.unwrap();
    fleet.stop_replica(2).await.unwrap();
    if let Err(e) = fleet.wait_settled(&[0, 1], SETTLE).await {
        panic!("{e}\n{}", fleet.report());
    }

    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(2).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    let clusters = fleet.clusters_api();
    wait_for("the new shards to own clusters", SETTLE, || async {
        let list = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let on = |s: u32| {
            list.items
                .iter()
                .filter(|c| shard_label(*c) == Some(s))
                .count()
        };
        if on(2) > 0 && on(3) > 0 {
            Ok(())
        } else {
            Err(format!(
                "per shard: {:?}",
                (0..4).map(on).collect::<Vec<_>>()
            ))
        }
    })
    .await
    .unwrap();
    if let Err(e) = fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await {
        panic!("{e}\n{}", fleet.report());
    }
    // sticky-balanced keeps converging, a few moves per pass, to an even spread (12 equal
    // clusters on 4 shards: 3 each).
    wait_for("an even spread", SETTLE, || async {
        let list = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let per_shard: Vec<usize> = (0..4)
            .map(|s| {
                list.items
                    .iter()
                    .filter(|c| shard_label(*c) == Some(s))
                    .count()
            })
            .collect();
        if per_shard == [3, 3, 3, 3] {
            Ok(())
        } else {
            Err(format!("{per_shard:?}"))
        }
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await.unwrap();

    // Every app changes, and is synced by whichever term owns it now, many by a term other
    // than the one that wrote its first status: each status still has one field manager, the
    // controller, not one per term that last set some of its fields (each one more
    // managedFields entry that every read, write and watch event of the app carries).
    fleet.update_apps(0..120, 2).await.unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await.unwrap();
    let apps = fleet.apps_api().list(&ListParams::default()).await.unwrap();
    let managers: BTreeSet<Vec<String>> = apps
        .items
        .iter()
        .map(|app| {
            app.metadata
                .managed_fields
                .iter()
                .flatten()
                .filter(|entry| entry.subresource.as_deref() == Some("status"))
                .map(|entry| entry.manager.clone().unwrap_or_default())
                .collect()
        })
        .collect();
    assert_eq!(
        managers,
        [vec!["shardwise-controller".to_string()]].into(),
        "the apps' status managers, as sets of entries"
    );
}

/// Bad input gets a clear status and disturbs nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_status_and_disturbs_nothing_else() {
    let fleet = Fleet::start(FleetOptions {
        replicas: 2,
        clusters: 3,
        apps: 12,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let clusters = fleet.clusters_api();
    let apps = fleet.apps_api();
    let bad_clusters = [
        (
            "bad-url",
            json!({"server": "not a url", "credentials": {"secretRef": {"name": "dest-0-credentials"}}}),
        ),
        (
            "no-secret",
            json!({"server": fleet.env.destinations()[0].url(), "credentials": {"secretRef": {"name": "missing"}}}),
        ),
    ];
    for (name, spec) in &bad_clusters {
        let object: FleetCluster = serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetCluster",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec,
        }))
        .unwrap();
        clusters.create(&Default::default(), &object).await.unwrap();
    }
    let bad_apps = [
        (
            "malformed",
            "cluster-0",
            "apiVersion: v1\nkind: [unclosed\n",
        ),
        (
            "no-kind",
            "cluster-1",
            "apiVersion: v1\nmetadata:\n  name: x\n",
        ),
        (
            "orphan",
            "no-such-cluster",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        ),
        (
            "on-bad-cluster",
            "bad-url",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
        ),
    ];
    for (name, cluster, manifests) in &bad_apps {
        let object: FleetApp = serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"destination": {"cluster": cluster, "namespace": "bad"}, "source": {"manifests": manifests}},
        }))
        .unwrap();
        apps.create(&Default::default(), &object).await.unwrap();
    }

    let expect_cluster = |name: &'static str, phase: ClusterPhase, text: &'static str| {
        let clusters = clusters.clone();
        async move {
            wait_for(
                &format!("cluster {name} to be {phase:?}"),
                SETTLE,
                || async {
                    let s = clusters
                        .get(name)
                        .await
                        .map_err(|e| e.to_string())?
                        .status
                        .unwrap_or_default();
                    match (&s.phase, &s.message) {
                        (Some(p), Some(m)) if *p == phase && m.contains(text) => Ok(()),
                        _ => Err(format!("{:?}: {:?}", s.phase, s.message)),
                    }
                },
            )
            .await
            .unwrap();
        }
    };
    expect_cluster(
        "bad-url",
        ClusterPhase::Invalid,
        "is not a valid http(s) URL",
    )
    .await;
    expect_cluster(
        "no-secret",
        ClusterPhase::Invalid,
        "Secret \"missing\" not found",
    )
    .await;
    let expect_app = |name: &'static str, text: &'static str| {
        let apps = apps.clone();
        async move {
            wait_for(&format!("app {name} to fail clearly"), SETTLE, || async {
                let s = apps
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .status
                    .unwrap_or_default();
                match (&s.sync_phase, &s.message) {
                    (Some(SyncPhase::Failed), Some(m)) if m.contains(text) => Ok(()),
                    _ => Err(format!("{:?}: {:?}", s.sync_phase, s.message)),
                }
            })
            .await
            .unwrap();
        }
    };
    expect_app("malformed", "not valid YAML").await;
    expect_app(
        "no-kind",
        "document 1 is not a Kubernetes object: kind is missing",
    )
    .await;
    expect_app("orphan", "FleetCluster \"no-such-cluster\" does not exist").await;
    expect_app("on-bad-cluster", "FleetCluster \"bad-url\" is invalid").await;

    // Everything else is Synced, and no status carries a credential.
    let good: Vec<String> = (0..12).map(|i| format!("app-{i}")).collect();
    wait_for("the good apps to be Synced", SETTLE, || async {
        let mut pending = Vec::new();
        for name in &good {
            let app = apps.get(name).await.map_err(|e| e.to_string())?;
            if app.status.and_then(|s| s.sync_phase) != Some(SyncPhase::Synced) {
                pending.push(name.clone());
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!("not synced: {pending:?}"))
        }
    })
    .await
    .unwrap();
    let token = fleet.env.destinations()[0]
        .token(support::DESTINATION_IDENTITY)
        .unwrap();
    for c in clusters.list(&ListParams::default()).await.unwrap().items {
        let text = serde_json::to_string(&c.status).unwrap();
        assert!(
            !text.contains(&token),
            "{} status leaks the token",
            c.name_any()
        );
    }
    for replica in fleet.replicas.values() {
        assert!(
            !replica.logs().contains(&token),
            "a log line leaks the token"
        );
    }
}

/// A cluster pinned to a shard that is not live is placed by the strategy, with a status
/// condition and an event saying why; when the shard appears it moves back through a drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_to_a_missing_shard_wait_for_it_and_move_back() {
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 2,
        clusters: 4,
        apps: 20,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1], SETTLE).await.unwrap();
    let clusters = fleet.clusters_api();
    clusters
        .patch(
            "cluster-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"shard": 2}})),
        )
        .await
        .unwrap();
    wait_for("the unhonoured pin to be reported", SETTLE, || async {
        let c = clusters.get("cluster-1").await.map_err(|e| e.to_string())?;
        let conditions = c.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.type_ == "PinHonoured") {
            Some(p) if p.status == "False" && p.reason == "PinnedShardNotLive" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(fleet.admin.clone(), NAMESPACE);
    wait_for("a PinnedShardNotLive event", SETTLE, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some("PinnedShardNotLive")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("cluster-1")
        });
        if found {
            Ok(())
        } else {
            Err(format!("{} events, none about the pin", list.items.len()))
        }
    })
    .await
    .unwrap();

    fleet.scale(3).await.unwrap();
    fleet.spawn_replica(2).await.unwrap();
    wait_for(
        "the pinned cluster to move to its shard",
        SETTLE,
        || async {
            let c = clusters.get("cluster-1").await.map_err(|e| e.to_string())?;
            let status = c.status.clone().unwrap_or_default();
            let honoured = status
                .conditions
                .iter()
                .any(|p| p.type_ == "PinHonoured" && p.status == "True");
            if shard_label(&c) == Some(2) && status.shard == Some(2) && honoured {
                Ok(())
            } else {
                Err(format!(
                    "label {:?} status shard {:?} honoured {honoured}",
                    shard_label(&c),
                    status.shard
                ))
            }
        },
    )
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
}

/// An app's health follows its objects as their controllers report them (here the test writes
/// a Deployment's status, as kube-controller-manager would), and its sync status says when
/// drift was found and is being repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_objects_and_sync_status_shows_repairs() {
    use k8s_openapi::api::apps::v1::Deployment;
    use shardwise_api::Health;

    let fleet = Fleet::start(FleetOptions {
        replicas: 1,
        clusters: 1,
        apps: 1,
        realistic_apps: true,
        args: vec!["--resync-interval=1h".into()],
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0], SETTLE).await.unwrap();
    let apps = fleet.apps_api();
    let dest = fleet.env.destinations()[0].client("admin").await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(dest, "team-0");
    // The whole message, not a part of it: a Healthy app has none (only an object that is not
    // Healthy says why), and the others name the object and the reason.
    let health_is = |expected: Health, says: Option<&'static str>| {
        let apps = apps.clone();
        async move {
            wait_for(
                &format!("health {expected:?}, {says:?}"),
                SETTLE,
                || async {
                    let app = apps.get("app-0").await.map_err(|e| e.to_string())?;
                    let health = app.status.unwrap_or_default().health;
                    match &health {
                        Some(h) if h.status == expected && h.message.as_deref() == says => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                },
            )
            .await
            .unwrap();
        }
    };
    // No controller has looked at the Deployment yet.
    health_is(
        Health::Progressing,
        Some("Deployment team-0/app-0: replicas: 0/2"),
    )
    .await;

    let set_status = |status: serde_json::Value| {
        let deployments = deployments.clone();
        async move {
            let generation = deployments.get("app-0").await.unwrap().metadata.generation;
            let mut status = status;
            status["observedGeneration"] = json!(generation);
            deployments
                .patch_status(
                    "app-0",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .unwrap();
        }
    };
    let rolled_out = json!({
        "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ],
    });
    set_status(rolled_out.clone()).await;
    health_is(Health::Healthy, None).await;
    let mut rolling = rolled_out.clone();
    rolling["updatedReplicas"] = json!(1);
    set_status(rolling).await;
    health_is(
        Health::Progressing,
        Some("Deployment team-0/app-0: updated: 1/2"),
    )
    .await;
    let mut stuck = rolled_out.clone();
    stuck["updatedReplicas"] = json!(1);
    stuck["conditions"][1] = json!({"type": "Progressing", "status": "False",
                                    "reason": "ProgressDeadlineExceeded"});
    set_status(stuck).await;
    health_is(
        Health::Degraded,
        Some("Deployment team-0/app-0: progress deadline exceeded"),
    )
    .await;

    // Drift: the replica count changed by hand. Every status the app goes through is recorded.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorder = {
        use futures::StreamExt;
        let seen = seen.clone();
        let config = kube_runtime::watcher::Config::default().fields("metadata.name=app-0");
        let events = kube_runtime::watcher(apps.clone(), config);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(Ok(event)) = events.next().await {
                if let kube_runtime::watcher::Event::Apply(app) = event {
                    let status = app.status.unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .push((status.sync_phase, status.message.unwrap_or_default()));
                }
            }
        })
    };
    deployments
        .patch(
            "app-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    wait_for(
        "the replica count to be repaired",
        Duration::from_secs(5),
        || async {
            let d = deployments.get("app-0").await.map_err(|e| e.to_string())?;
            match d.spec.and_then(|s| s.replicas) {
                Some(2) => Ok(()),
                other => Err(format!("{other:?} replicas")),
            }
        },
    )
    .await
    .unwrap();
    wait_for("the app Synced after its repair", SETTLE, || async {
        let seen = seen.lock().unwrap().clone();
        let repairing = seen.iter().position(|(phase, message)| {
            *phase == Some(SyncPhase::OutOfSync)
                && message == "drifted, repairing: Deployment team-0/app-0: .spec.replicas"
        });
        match repairing {
            Some(i) if seen[i..].iter().any(|(p, _)| *p == Some(SyncPhase::Synced)) => Ok(()),
            _ => Err(format!("{seen:?}")),
        }
    })
    .await
    .unwrap();
    recorder.abort();
}

/// The clusters labelled for `shard` (as `namespace/name`) and the number of apps of those
/// clusters (or of their slices placed there), as the control plane has them now.
async fn labelled_to(
    fleet: &Fleet,
    shard: u32,
) -> std::result::Result<(BTreeSet<String>, usize), String> {
    let clusters = fleet
        .clusters_api()
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let apps = fleet
        .apps_api()
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    let owned = clusters
        .items
        .iter()
        .filter(|c| shard_label(*c) == Some(shard))
        .map(|c| format!("{NAMESPACE}/{}", c.name_any()))
        .collect();
    let placement = fleet.placement().await.map_err(|e| e.to_string())?;
    let apps = apps
        .items
        .iter()
        .filter(|a| placement.owner_of(a) == Some(shard))
        .count();
    Ok((owned, apps))
}
