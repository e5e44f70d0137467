//! `namespace-labeller`: a sharded controller on `shardwise-runtime` in 130 lines: its
//! `Sharded` impl (45 lines), its reconcilers and its flags.
//!
//! It stamps every ConfigMap with a digest of its data, and every namespace with the number of
//! ConfigMaps in it. Run as a StatefulSet of N replicas, each replica does this for the
//! namespaces of its shard: namespaces are the *units* the runtime places, and the ConfigMaps in
//! a namespace are its *items*, which follow it. Everything else (leases, the elected planner,
//! drained handoffs, fencing, watches, the audit, metrics) is the runtime's.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use shardwise_runtime::args::{ReplicaArgs, duration};
use shardwise_runtime::settings::WatchScope;
use shardwise_runtime::{Action, ContextOf, Nouns, ObjectKey, Sharded, TermOf};
use twox_hash::XxHash64;

/// On each ConfigMap: a digest of its data.
const DIGEST_ANNOTATION: &str = "labeller.shardwise.io/digest";
/// On each namespace: how many ConfigMaps it holds.
const COUNT_ANNOTATION: &str = "labeller.shardwise.io/configmaps";

/// Stamps ConfigMaps with a digest of their data and namespaces with their ConfigMap count,
/// sharded by namespace across the replicas of a StatefulSet.
#[derive(Parser)]
#[command(name = "namespace-labeller", version)]
struct Args {
    #[command(flatten)]
    replica: ReplicaArgs,
    /// Check every ConfigMap again this often.
    #[arg(long, default_value = "5m", value_parser = duration)]
    resync_interval: Duration,
}

struct Labeller {
    resync_interval: Duration,
}

impl Sharded for Labeller {
    type Unit = Namespace;
    type Item = ConfigMap;
    type State = ();
    type Error = kube::Error;

    const NOUNS: Nouns = Nouns {
        unit: "namespace",
        units: "namespaces",
        item: "configmap",
        items: "configmaps",
    };

    fn unit_of(config_map: &ConfigMap) -> ObjectKey {
        // Namespaces are cluster-scoped: their key has no namespace.
        ObjectKey::new("", config_map.namespace().unwrap_or_default())
    }

    fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn reconcile_unit(
        &self,
        term: &TermOf<Self>,
        namespace: Arc<Namespace>,
    ) -> Result<Action, kube::Error> {
        let name = namespace.name_any();
        let count = term.items_of(&ObjectKey::new("", &name)).len();
        let api: Api<Namespace> = Api::all(term.client().clone());
        annotate(&api, &namespace, COUNT_ANNOTATION, count.to_string()).await?;
        Ok(Action::Done(None))
    }

    async fn reconcile_item(
        &self,
        term: &TermOf<Self>,
        config_map: Arc<ConfigMap>,
    ) -> Result<Action, kube::Error> {
        let namespace = config_map.namespace().unwrap_or_default();
        let api: Api<ConfigMap> = Api::namespaced(term.client().clone(), &namespace);
        annotate(&api, &config_map, DIGEST_ANNOTATION, digest(&config_map)).await?;
        Ok(Action::Done(Some(self.resync_interval)))
    }
}

/// Sets the annotation `key` of `object` to `value`, unless it already is.
async fn annotate<K>(api: &Api<K>, object: &K, key: &str, value: String) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if object.annotations().get(key) == Some(&value) {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    let name = object.name_any();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// A digest of the ConfigMap's data: its keys and values, in key order.
fn digest(config_map: &ConfigMap) -> String {
    let empty = BTreeMap::new();
    let mut hasher = XxHash64::with_seed(0);
    for (key, value) in config_map.data.as_ref().unwrap_or(&empty) {
        hasher.write(key.as_bytes());
        hasher.write(&[0]);
        hasher.write(value.as_bytes());
        hasher.write(&[0]);
    }
    format!("{:016x}", hasher.finish())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let labeller = Labeller {
        resync_interval: args.resync_interval,
    };
    let scope = WatchScope::Cluster;
    args.replica
        .run(labeller, "namespace-labeller", scope)
        .await?;
    Ok(())
}
