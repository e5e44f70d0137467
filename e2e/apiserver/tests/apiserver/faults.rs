//! Faults: each one observably happens to the scoped clients only, is counted, and clears.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube_runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use shardwise_test_apiserver::{ErrorFault, FaultScope};

use crate::common::*;

const WAIT: Duration = Duration::from_secs(10);

fn robot_scope() -> FaultScope {
    FaultScope::identity("robot")
}

async fn timed_list(
    api: &Api<ConfigMap>,
) -> (Duration, kube::Result<kube::core::ObjectList<ConfigMap>>) {
    let started = Instant::now();
    let result = api.list(&ListParams::default()).await;
    (started.elapsed(), result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_applies_to_its_scope_and_clears() {
    let server = start_with(with_robot()).await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin(&server).await, "default");
    let robot_cms: Api<ConfigMap> = Api::namespaced(client_as(&server, "robot").await, "default");
    admin_cms.list(&ListParams::default()).await.unwrap();
    robot_cms.list(&ListParams::default()).await.unwrap();

    server
        .faults()
        .set_latency(robot_scope(), Duration::from_millis(300));
    let (slow, result) = timed_list(&robot_cms).await;
    result.unwrap();
    assert!(
        slow >= Duration::from_millis(300),
        "robot is delayed: {slow:?}"
    );
    let (fast, _) = timed_list(&admin_cms).await;
    assert!(fast < Duration::from_millis(300), "admin is not: {fast:?}");
    assert!(server.faults().counters().delayed_requests >= 1);

    server.faults().clear_latency(&robot_scope());
    let (cleared, _) = timed_list(&robot_cms).await;
    assert!(cleared < Duration::from_millis(300), "cleared: {cleared:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_answers_for_each_code() {
    let server = start_with(with_robot()).await;
    let robot = client_as(&server, "robot").await;
    let robot_cms: Api<ConfigMap> = Api::namespaced(robot.clone(), "default");
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin(&server).await, "default");
    for (code, reason) in [
        (429, "TooManyRequests"),
        (500, "InternalError"),
        (503, "ServiceUnavailable"),
    ] {
        server
            .faults()
            .set_errors(robot_scope(), ErrorFault::new(1.0, [code]))
            .unwrap();
        let err = status(robot_cms.list(&ListParams::default()).await.unwrap_err());
        assert_eq!((err.code, err.reason.as_str()), (code, reason));
        admin_cms.list(&ListParams::default()).await.unwrap();
    }
    let (_, body) = raw(&robot, "GET", "/api/v1/namespaces", vec![], "").await;
    assert!(body.contains("retryAfterSeconds"), "{body}");
    let counters = server.faults().counters();
    assert_eq!(
        (
            counters.injected_429,
            counters.injected_500,
            counters.injected_503
        ),
        (1, 1, 2),
        "{counters:?}"
    );
    server.faults().clear_errors(&robot_scope());
    robot_cms.list(&ListParams::default()).await.unwrap();

    // Seeded: the same seed gives the same answers.
    let run = |seed: u64| async move {
        let server = start_with(with_robot().fault_seed(seed)).await;
        server
            .faults()
            .set_errors(FaultScope::Global, ErrorFault::new(0.5, [500, 503]))
            .unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client_as(&server, "robot").await, "default");
        let mut codes = Vec::new();
        for _ in 0..16 {
            codes.push(match cms.list(&ListParams::default()).await {
                Ok(_) => 200,
                Err(e) => status(e).code,
            });
        }
        codes
    };
    let a = run(42).await;
    assert_eq!(a, run(42).await);
    assert!(a.contains(&200) && a.iter().any(|c| *c != 200), "{a:?}");

    // kube's default retries ride through a partial error rate.
    let server = start_with(with_robot()).await;
    server
        .faults()
        .set_errors(
            FaultScope::Global,
            ErrorFault::new(0.5, [503]).retry_after(0),
        )
        .unwrap();
    let yaml = server.kubeconfig_for("robot").unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&yaml).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let retrying: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    for _ in 0..10 {
        retrying.list(&ListParams::default()).await.unwrap();
    }
    assert!(server.faults().counters().injected_503 > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_watches_now_and_periodically() {
    let server = start_with(with_robot()).await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin(&server).await, "default");
    let robot_cms: Api<ConfigMap> = Api::namespaced(client_as(&server, "robot").await, "default");
    let rv = admin_cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut robot_watch = robot_cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut admin_watch = admin_cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    server.faults().close_watches(robot_scope());
    let ended = tokio::time::timeout(WAIT, robot_watch.next())
        .await
        .unwrap();
    assert!(ended.is_none(), "the robot's watch ends cleanly: {ended:?}");
    admin_cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap(),
        )
        .await
        .unwrap();
    let event = tokio::time::timeout(WAIT, admin_watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(event, WatchEvent::Added(_)),
        "the admin's watch stays open"
    );
    assert_eq!(server.faults().counters().watches_closed, 1);

    // Periodic closing: a reflector keeps converging through the restarts.
    server
        .faults()
        .close_watches_every(robot_scope(), Duration::from_millis(100))
        .unwrap();
    let (reader, writer) = reflector::store::<ConfigMap>();
    let task = tokio::spawn(
        reflector(
            writer,
            watcher(robot_cms.clone(), watcher::Config::default()),
        )
        .default_backoff()
        .for_each(|_| async {}),
    );
    for i in 0..5 {
        admin_cms
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("p{i}")}})).unwrap(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    eventually("the reflector to see all objects", WAIT, || async {
        let n = reader.state().len();
        let closed = server.faults().counters().watches_closed;
        if n == 6 && closed >= 3 {
            Ok(())
        } else {
            Err(format!("{n} objects, {closed} closes"))
        }
    })
    .await;
    server.faults().clear_close_watches(&robot_scope());
    assert!(server.faults().active().close_watches_every.is_empty());
    // Absence can only be observed over time: several periods pass without a close.
    let closed = server.faults().counters().watches_closed;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.faults().counters().watches_closed,
        closed,
        "cleared: no more closes"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_make_the_server_unreachable() {
    let server = start_with(with_robot()).await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin(&server).await, "default");
    let robot_cms: Api<ConfigMap> = Api::namespaced(client_as(&server, "robot").await, "default");
    let rv = robot_cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = robot_cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    server.faults().partition(robot_scope());
    let cut = tokio::time::timeout(WAIT, watch.next()).await.unwrap();
    assert!(
        !matches!(cut, Some(Ok(_))),
        "the open watch is cut: {cut:?}"
    );
    match robot_cms.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => panic!("a partition answers nothing, got {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("a partitioned client must not be served"),
    }
    admin_cms.list(&ListParams::default()).await.unwrap();
    assert!(server.faults().counters().refused_requests >= 2);

    server.faults().heal(&robot_scope());
    robot_cms.list(&ListParams::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_requests_and_events_until_resumed() {
    let server = start_with(with_robot()).await;
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin(&server).await, "default");
    let robot_cms: Api<ConfigMap> = Api::namespaced(client_as(&server, "robot").await, "default");
    let rv = admin_cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = robot_cms
        .watch(&WatchParams::default().disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();

    server.faults().pause();
    let creating = tokio::spawn({
        let cms = admin_cms.clone();
        async move {
            cms.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "held"}})).unwrap(),
            )
            .await
        }
    });
    let held = tokio::time::timeout(
        Duration::from_millis(300),
        robot_cms.list(&ListParams::default()),
    )
    .await;
    assert!(held.is_err(), "requests hang while paused");
    assert!(!creating.is_finished());
    assert!(server.faults().counters().paused_requests >= 2);

    server.faults().resume();
    creating.await.unwrap().unwrap();
    let event = tokio::time::timeout(WAIT, watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(event, WatchEvent::Added(_)));
    robot_cms.list(&ListParams::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_http_api() {
    let server = start_with(with_robot()).await;
    let client = admin(&server).await;
    let post = |path: &'static str, body: serde_json::Value| {
        let client = client.clone();
        async move {
            raw(
                &client,
                "POST",
                path,
                body.to_string().into_bytes(),
                "application/json",
            )
            .await
        }
    };
    let (code, body) = post("/_fault/latency", json!({"identity": "robot", "ms": 250})).await;
    assert_eq!(code, 200, "{body}");
    let (code, _) = post(
        "/_fault/errors",
        json!({"rate": 0.5, "codes": [429, 503], "seed": 3}),
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = post("/_fault/partition", json!({"identity": "robot"})).await;
    assert_eq!(code, 200);
    let (code, _) = post("/_fault/close-watches", json!({"everyMs": 1000})).await;
    assert_eq!(code, 200);
    let (code, _) = post("/_fault/pause", json!({})).await;
    assert_eq!(code, 200);
    let active = server.faults().active();
    assert!(active.paused);
    assert_eq!(active.latency[0].identity.as_deref(), Some("robot"));
    assert_eq!(active.latency[0].ms, 250);
    assert_eq!(active.errors[0].fault.codes, vec![429, 503]);
    assert_eq!(active.partitions, vec![Some("robot".to_string())]);
    assert_eq!(active.close_watches_every[0].every_ms, 1000);

    let (code, body) = raw(&client, "GET", "/_fault", vec![], "").await;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["active"]["paused"], true);
    assert!(status["counters"]["watchesClosed"].is_u64());

    let (code, _) = raw(&client, "DELETE", "/_fault/pause", vec![], "").await;
    assert_eq!(code, 200);
    let (code, _) = raw(
        &client,
        "DELETE",
        "/_fault/partition?identity=robot",
        vec![],
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert!(server.faults().active().partitions.is_empty());
    let (code, body) = post("/_fault/latency", json!({"identity": "nobody", "ms": 1})).await;
    assert_eq!(code, 400, "{body}");
    let (code, _) = post("/_fault/errors", json!({"rate": 2.0})).await;
    assert_eq!(code, 400);
    let (code, _) = raw(&client, "GET", "/_fault/nothing", vec![], "").await;
    assert_eq!(code, 404);
    let (code, _) = raw(&client, "DELETE", "/_fault", vec![], "").await;
    assert_eq!(code, 200);
    assert_eq!(server.faults().active(), Default::default());
}
