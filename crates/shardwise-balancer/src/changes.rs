//! Wakes the balancer when Argo CD's controller workload changes, so that a replica change or
//! a pod going down is met at once rather than at the next `--interval`: on a scale-down the
//! pods of the new count read every key at or above it as shard 0 while the leaving pods still
//! run theirs, so those keys must move before the next pass would come.
//!
//! The StatefulSet (or, under dynamic cluster distribution, the Deployment) is watched by name
//! with kube-runtime's watcher: its status changes whenever one of its pods is created,
//! deleted or changes readiness, so watching it is watching its pods too.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::api::Api;
use kube::{Client, Resource};
use kube_runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

/// One item per change seen of the workload.
pub type Changes = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// The changes of StatefulSet and Deployment `name` in `namespace` (whichever exists). A
/// watch the Role does not allow, or that fails, is logged once a failure streak and retried
/// with kube-runtime's backoff; the passes go on at `--interval` meanwhile.
pub fn workload(client: &Client, namespace: &str, name: &str) -> Changes {
    if shardwise_runtime::failpoints::seeded(shardwise_runtime::failpoints::IGNORE_WORKLOAD_CHANGES)
    {
        return Box::pin(futures::stream::pending());
    }
    let statefulsets = of::<StatefulSet>(client, namespace, name);
    let deployments = of::<Deployment>(client, namespace, name);
    Box::pin(futures::stream::select(statefulsets, deployments))
}

fn of<K>(client: &Client, namespace: &str, name: &str) -> impl Stream<Item = ()> + Send + 'static
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let kind = K::kind(&()).to_string();
    let name = name.to_string();
    let mut failing = false;
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let change = match event {
                Ok(_) => {
                    failing = false;
                    Some(())
                }
                // A watch the server ends or cuts is taken up again: nothing to say.
                Err(watcher::Error::WatchFailed(e)) => {
                    debug!(kind = %kind, name = %name, error = %e, "the watch of Argo CD's controller workload was cut; watching again");
                    None
                }
                Err(e) => {
                    if !failing {
                        warn!(kind = %kind, name = %name, error = %e, "cannot watch Argo CD's controller workload (the Role needs list and watch on it); trying again, and meeting replica changes at the next pass meanwhile");
                    }
                    failing = true;
                    None
                }
            };
            async move { change }
        })
}
