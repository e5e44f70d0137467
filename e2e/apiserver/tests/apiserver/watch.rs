//! Watches: kube-runtime watcher and reflector, label transitions, 410 recovery, bookmarks,
//! streaming lists and timeouts.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use shardwise_test_apiserver::ServerConfig;
use tokio::sync::mpsc;

use crate::common::*;

const WAIT: Duration = Duration::from_secs(10);

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"holderIdentity": holder}}))
        .expect("valid lease")
}

fn labelled(name: &str, app: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"app": app}}, "data": {"k": "v"}}),
    )
    .expect("valid configmap")
}

async fn next<K: Clone + serde::de::DeserializeOwned>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> WatchEvent<K> {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event arrives in time")
        .expect("the stream is open")
        .expect("the event decodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_over_a_crd() {
    let server = start().await;
    let client = admin(&server).await;
    install_widgets(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    widgets
        .create(&PostParams::default(), &widget("before", 1))
        .await
        .unwrap();

    let (reader, writer) = reflector::store::<Widget>();
    let stream = reflector(writer, watcher(widgets.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(WAIT, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 1);

    widgets
        .create(&PostParams::default(), &widget("after", 2))
        .await
        .unwrap();
    widgets
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": "green"}})),
        )
        .await
        .unwrap();
    widgets
        .delete("after", &DeleteParams::default())
        .await
        .unwrap();
    widgets
        .create(&PostParams::default(), &widget("last", 3))
        .await
        .unwrap();
    eventually("the reflector to catch up", WAIT, || async {
        let mut names: Vec<String> = reader.state().iter().map(|w| w.name_any()).collect();
        names.sort();
        let color = reader
            .state()
            .iter()
            .find(|w| w.name_any() == "before")
            .and_then(|w| w.spec.color.clone());
        if names == ["before", "last"] && color.as_deref() == Some("green") {
            Ok(())
        } else {
            Err(format!("{names:?} color={color:?}"))
        }
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_reflector_over_leases() {
    let server = start().await;
    let client = admin(&server).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    for i in 0..3 {
        leases
            .create(&PostParams::default(), &lease(&format!("shard-{i}"), "r0"))
            .await
            .unwrap();
    }
    for config in [
        watcher::Config::default().page_size(2),
        watcher::Config::default().streaming_lists(),
    ] {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stream = watcher(leases.clone(), config);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let summary = match event {
                    Ok(watcher::Event::Init) => "init".to_string(),
                    Ok(watcher::Event::InitApply(l)) => format!("init-apply {}", l.name_any()),
                    Ok(watcher::Event::InitDone) => "init-done".to_string(),
                    Ok(watcher::Event::Apply(l)) => format!("apply {}", l.name_any()),
                    Ok(watcher::Event::Delete(l)) => format!("delete {}", l.name_any()),
                    Err(e) => format!("error {e}"),
                };
                if tx.send(summary).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        while seen.last().map(String::as_str) != Some("init-done") {
            seen.push(
                tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(
            seen,
            [
                "init",
                "init-apply shard-0",
                "init-apply shard-1",
                "init-apply shard-2",
                "init-done"
            ]
        );
        leases
            .create(&PostParams::default(), &lease("late", "r1"))
            .await
            .unwrap();
        assert_eq!(
            tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap(),
            "apply late"
        );
        leases
            .delete("late", &DeleteParams::default())
            .await
            .unwrap();
        assert_eq!(
            tokio::time::timeout(WAIT, rx.recv())
                .await
                .unwrap()
                .unwrap(),
            "delete late"
        );
        task.abort();
    }

    let (reader, writer) = reflector::store::<Lease>();
    let task = tokio::spawn(
        reflector(writer, watcher(leases.clone(), watcher::Config::default()))
            .default_backoff()
            .for_each(|_| async {}),
    );
    tokio::time::timeout(WAIT, reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    let mut renewed = leases.get("shard-1").await.unwrap();
    renewed.spec.as_mut().unwrap().holder_identity = Some("r2".into());
    leases
        .replace("shard-1", &PostParams::default(), &renewed)
        .await
        .unwrap();
    leases
        .delete("shard-2", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the lease reflector to catch up", WAIT, || async {
        let mut seen: Vec<(String, Option<String>)> = reader
            .state()
            .iter()
            .map(|l| {
                (
                    l.name_any(),
                    l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
                )
            })
            .collect();
        seen.sort();
        let want = vec![
            ("shard-0".to_string(), Some("r0".to_string())),
            ("shard-1".to_string(), Some("r2".to_string())),
        ];
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selected_watch_follows_relabels() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().labels("app=web"), &rv)
        .await
        .unwrap()
        .boxed();

    cms.create(&PostParams::default(), &labelled("a", "db"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &labelled("marker", "web"))
        .await
        .unwrap();
    match next(&mut stream).await {
        WatchEvent::Added(c) => {
            assert_eq!(c.name_any(), "marker", "non-matching objects are not sent")
        }
        other => panic!("expected ADDED marker, got {other:?}"),
    }
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    cms.patch("a", &PatchParams::default(), &relabel("web"))
        .await
        .unwrap();
    match next(&mut stream).await {
        WatchEvent::Added(c) => assert_eq!(c.name_any(), "a"),
        other => panic!("expected ADDED when labels start matching, got {other:?}"),
    }
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    assert!(matches!(next(&mut stream).await, WatchEvent::Modified(_)));
    let moved = cms
        .patch("a", &PatchParams::default(), &relabel("db"))
        .await
        .unwrap();
    match next(&mut stream).await {
        WatchEvent::Deleted(c) => {
            assert_eq!(c.name_any(), "a");
            assert_eq!(
                c.resource_version(),
                moved.resource_version(),
                "carries the new resourceVersion"
            );
            assert_eq!(
                c.labels()["app"],
                "web",
                "carries the last matching content"
            );
        }
        other => panic!("expected DELETED when labels stop matching, got {other:?}"),
    }
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    cms.delete("marker", &DeleteParams::default())
        .await
        .unwrap();
    match next(&mut stream).await {
        WatchEvent::Deleted(c) => assert_eq!(
            c.name_any(),
            "marker",
            "deleting a non-matching object sends nothing"
        ),
        other => panic!("expected DELETED marker, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_old_versions_are_gone() {
    let server = start_with(with_robot().watch_history(5)).await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &labelled("c", "x"))
        .await
        .unwrap();
    for i in 0..10 {
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await
        .unwrap();
    }
    let mut stream = cms
        .watch(
            &WatchParams::default(),
            first.resource_version().as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match next(&mut stream).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_initial_events_and_timeouts() {
    let server =
        start_with(ServerConfig::default().bookmark_interval(Duration::from_millis(100))).await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &labelled("existing", "x"))
        .await
        .unwrap();

    let mut initial = cms
        .watch(&WatchParams::default().initial_events(), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next(&mut initial).await, WatchEvent::Added(c) if c.name_any() == "existing"));
    match next(&mut initial).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            );
        }
        other => panic!("expected the initial-events-end bookmark, got {other:?}"),
    }

    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let started = Instant::now();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    let mut last_rv = String::new();
    while let Some(event) = tokio::time::timeout(WAIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        if let WatchEvent::Bookmark(b) = event {
            bookmarks += 1;
            last_rv = b.metadata.resource_version;
        }
    }
    let elapsed = started.elapsed();
    assert!(
        bookmarks >= 3,
        "bookmarks arrive periodically ({bookmarks})"
    );
    assert!(last_rv.parse::<u64>().unwrap() >= rv.parse::<u64>().unwrap());
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
        "timeoutSeconds ends the stream: {elapsed:?}"
    );

    let mut plain = cms
        .watch(&WatchParams::default().disable_bookmarks().timeout(1), &rv)
        .await
        .unwrap()
        .boxed();
    let mut events = Vec::new();
    while let Some(e) = tokio::time::timeout(WAIT, plain.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        events.push(format!("{e:?}"));
    }
    assert!(events.is_empty(), "no bookmarks unless allowed: {events:?}");
}
