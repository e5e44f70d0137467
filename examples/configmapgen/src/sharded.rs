//! kube-rs's `configmapgen_controller` example, in this project's words: each
//! ConfigMapGenerator gets a ConfigMap of its own name holding its content, owned by it (so that
//! Kubernetes deletes the ConfigMap with it), applied again whenever either changes and every
//! five minutes. `configmapgen` (src/main.rs) runs it as one process; `configmapgen-sharded`
//! (src/sharded.rs) runs the same controller as the replicas of a StatefulSet, each reconciling
//! the generators of its shard: `diff src/main.rs src/sharded.rs` is all sharding takes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use configmapgen::ConfigMapGenerator;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use kube_runtime::controller::{Action, Controller};
use kube_runtime::watcher;
use shardwise_runtime::kind::{KindArgs, ShardTerm};
use shardwise_runtime::{http::shutdown_on_signal, settings::WatchScope};

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("cannot apply the ConfigMap: {0}")]
    Apply(#[source] kube::Error),
    #[error("the generator has no {0}")]
    Missing(&'static str),
}

/// What every reconcile shares.
struct Data {
    client: Client,
}

/// Applies the generator's ConfigMap.
async fn reconcile(generator: Arc<ConfigMapGenerator>, data: Arc<Data>) -> Result<Action, Error> {
    let name = generator
        .metadata
        .name
        .clone()
        .ok_or(Error::Missing("name"))?;
    let namespace = generator.metadata.namespace.as_deref();
    let namespace = namespace.ok_or(Error::Missing("namespace"))?;
    let owner = generator
        .controller_owner_ref(&())
        .ok_or(Error::Missing("UID"))?;
    let content = BTreeMap::from([("content".to_string(), generator.spec.content.clone())]);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(content),
        ..ConfigMap::default()
    };
    let manager = PatchParams::apply("configmapgen.examples.shardwise.io");
    Api::<ConfigMap>::namespaced(data.client.clone(), namespace)
        .patch(&name, &manager, &Patch::Apply(&config_map))
        .await
        .map_err(Error::Apply)?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Tries a failed reconcile again a second later.
fn error_policy(_: Arc<ConfigMapGenerator>, _: &Error, _: Arc<Data>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt::init();
    let client = Client::try_default().await?;
    let replica = KindArgs::parse().replica("configmapgen", WatchScope::Cluster, client)?;
    replica.run(shutdown_on_signal()?, control).await?;
    Ok(())
}

/// Runs the controller: the generators, and the ConfigMaps they own.
async fn control(term: ShardTerm<ConfigMapGenerator>) {
    let client = term.client();
    let generators = Api::<ConfigMapGenerator>::all(client.clone());
    let config_maps = Api::<ConfigMap>::all(client.clone());
    Controller::new(generators, term.watcher_config())
        .owns(config_maps, watcher::Config::default())
        .run(
            term.reconcile(reconcile),
            error_policy,
            Arc::new(Data { client }),
        )
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::info!(%object, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
}
