//! Latency: it observably happens to the scoped clients only, is counted, and clears.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use shardwise_test_apiserver::FaultScope;

use crate::common::*;

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
        .latency()
        .set(robot_scope(), Duration::from_millis(300));
    let (slow, result) = timed_list(&robot_cms).await;
    result.unwrap();
    assert!(
        slow >= Duration::from_millis(300),
        "robot is delayed: {slow:?}"
    );
    let (fast, _) = timed_list(&admin_cms).await;
    assert!(fast < Duration::from_millis(300), "admin is not: {fast:?}");
    assert!(server.latency().delayed_requests() >= 1);

    server.latency().set(robot_scope(), Duration::ZERO);
    let (cleared, _) = timed_list(&robot_cms).await;
    assert!(cleared < Duration::from_millis(300), "cleared: {cleared:?}");
}
