//! Benchmarks through a real HTTP client (kube-rs over TLS):
//! - LIST of 10,000 ConfigMaps (target: under 100 ms);
//! - writes with 10 watchers attached (target: at least 2,000 writes/s), timed until every
//!   watcher has received every event.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;
use shardwise_test_apiserver::{ApiServer, ServerConfig};

const OBJECTS: usize = 10_000;
const WATCHERS: usize = 10;
const WRITERS: u64 = 8;
const POOL: u64 = 1_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn client(server: &ApiServer) -> kube::Client {
    let yaml = server.kubeconfig_for("admin").expect("admin");
    let kubeconfig = Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn configmap(ns: &str, name: &str, i: u64) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "bench", "shard": (i % 16).to_string()},
            "annotations": {"example.com/owner": "shardwise-benchmark"}},
        "data": {"cluster": format!("cluster-{i}"), "endpoint": format!("https://10.0.{}.{}:6443", i / 256 % 256, i % 256)},
    }))
    .expect("configmap")
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
}

/// Creates `count` ConfigMaps named `cm-N` with `WRITERS` concurrent clients.
async fn populate(client: &kube::Client, ns: &str, count: u64) {
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            let ns = ns.to_string();
            tokio::spawn(async move {
                let mut i = w;
                while i < count {
                    api.create(
                        &PostParams::default(),
                        &configmap(&ns, &format!("cm-{i}"), i),
                    )
                    .await
                    .expect("create");
                    i += WRITERS;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
}

fn list(c: &mut Criterion) {
    let rt = runtime();
    let server = ApiServer::start_detached(ServerConfig::default()).expect("server");
    let client = rt.block_on(client(&server));
    rt.block_on(async {
        create_namespace(&client, "bench").await;
        populate(&client, "bench", OBJECTS as u64).await;
    });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "bench");
    let mut group = c.benchmark_group("list");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    group.bench_function("10k_configmaps_typed", |b| {
        b.iter(|| {
            let list = rt.block_on(api.list(&ListParams::default())).expect("list");
            assert_eq!(list.items.len(), OBJECTS);
        });
    });
    group.bench_function("10k_configmaps_raw_json", |b| {
        b.iter(|| {
            let req = http::Request::get("/api/v1/namespaces/bench/configmaps")
                .body(Vec::new())
                .expect("request");
            let text = rt.block_on(client.request_text(req)).expect("list");
            assert!(text.len() > OBJECTS * 100);
        });
    });
    group.bench_function("10k_configmaps_pages_of_500", |b| {
        b.iter(|| {
            let mut n = 0;
            let mut token: Option<String> = None;
            loop {
                let mut lp = ListParams::default().limit(500);
                if let Some(t) = &token {
                    lp = lp.continue_token(t);
                }
                let page = rt.block_on(api.list(&lp)).expect("page");
                n += page.items.len();
                token = page.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    break;
                }
            }
            assert_eq!(n, OBJECTS);
        });
    });
    group.finish();
}

fn writes(c: &mut Criterion) {
    let rt = runtime();
    let server =
        ApiServer::start_detached(ServerConfig::default().watch_history(1_000)).expect("server");
    let client = rt.block_on(client(&server));
    rt.block_on(async {
        create_namespace(&client, "writes").await;
        populate(&client, "writes", POOL).await;
    });
    let sequence = Arc::new(AtomicU64::new(0));
    let mut group = c.benchmark_group("writes");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(15))
        .throughput(Throughput::Elements(1));
    group.bench_function("patches_with_10_watchers", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), "writes");
                let rv = api
                    .list(&ListParams::default().limit(1))
                    .await
                    .expect("list")
                    .metadata
                    .resource_version
                    .expect("rv");
                let mut watchers = Vec::new();
                for _ in 0..WATCHERS {
                    let stream = api
                        .watch(&WatchParams::default().disable_bookmarks(), &rv)
                        .await
                        .expect("watch");
                    watchers.push(tokio::spawn(async move {
                        let mut stream = std::pin::pin!(stream);
                        let mut seen = 0;
                        while seen < iters {
                            match stream.next().await {
                                Some(Ok(WatchEvent::Modified(_))) => seen += 1,
                                Some(Ok(_)) => {}
                                other => panic!("watch ended after {seen}/{iters}: {other:?}"),
                            }
                        }
                    }));
                }
                let started = Instant::now();
                let writers: Vec<_> = (0..WRITERS)
                    .map(|w| {
                        let api = api.clone();
                        let sequence = Arc::clone(&sequence);
                        tokio::spawn(async move {
                            let mut i = w;
                            while i < iters {
                                let n = sequence.fetch_add(1, Ordering::Relaxed);
                                let patch = Patch::Merge(json!({"data": {"seq": n.to_string()}}));
                                api.patch(
                                    &format!("cm-{}", n % POOL),
                                    &PatchParams::default(),
                                    &patch,
                                )
                                .await
                                .expect("patch");
                                i += WRITERS;
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    w.await.expect("writer");
                }
                for w in watchers {
                    w.await.expect("watcher");
                }
                started.elapsed()
            })
        });
    });
    group.finish();
}

criterion_group!(benches, list, writes);
criterion_main!(benches);
