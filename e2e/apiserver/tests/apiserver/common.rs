//! Shared helpers: servers, clients, a Widget CRD, polling.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shardwise_test_apiserver::{ApiServer, Identity, ServerConfig};

/// A namespaced CR with status and scale subresources.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "example.com",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    shortname = "wd",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas"
    )
)]
pub struct WidgetSpec {
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WidgetStatus {
    pub replicas: i32,
}

pub async fn start() -> ApiServer {
    start_with(ServerConfig::default()).await
}

pub async fn start_with(config: ServerConfig) -> ApiServer {
    ApiServer::start(config).await.expect("server starts")
}

/// A config with the `admin` identity plus a service account `robot` in `team`.
pub fn with_robot() -> ServerConfig {
    ServerConfig::default().identity(Identity::service_account("robot", "team", "robot"))
}

pub async fn client_as(server: &ApiServer, identity: &str) -> Client {
    let yaml = server.kubeconfig_for(identity).expect("identity exists");
    client_of(Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses")).await
}

/// A client of `kubeconfig`'s current context, without retries.
pub async fn client_of(kubeconfig: Kubeconfig) -> Client {
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig is usable");
    // Tests want to see each error the server answers, not kube's automatic retries.
    config.default_retry = false;
    Client::try_from(config).expect("client builds")
}

/// An object of type `T` from its JSON.
pub fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

pub async fn admin(server: &ApiServer) -> Client {
    client_as(server, "admin").await
}

pub fn widget_crd() -> CustomResourceDefinition {
    Widget::crd()
}

pub async fn install_widgets(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .expect("CRD is created");
}

pub fn widget(name: &str, replicas: i32) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            replicas,
            color: None,
        },
    )
}

/// Polls `check` until it returns Some, or panics after `timeout` with the last observation.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The `metav1.Status` of a failed call.
pub fn status(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A raw request through the client (kube adds the server URL and the token).
pub async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    body: Vec<u8>,
    content_type: &str,
) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(body)
        .expect("request builds");
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("request is answered");
    let code = res.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .expect("body reads")
        .to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}
