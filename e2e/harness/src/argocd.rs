//! Argo CD for the tests: its objects as the tests of `plan --apply` and of the balancer create
//! them and what they read back, and the real Argo CD ([`ArgoCd`]) built from its Go module.

mod git;
mod install;

pub use git::GitServer;
pub use install::{
    ARGOCD_IMAGE, ArgoCd, ArgoCdOptions, CONTROLLER, NAMESPACE, Owners, UNMAPPED, argocd_binary,
    owners_of,
};

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::Value;

/// Argo CD's Application CRD as released (trimmed; the file says how).
pub const APPLICATION_CRD: &str = include_str!("../fixtures/application-crd.yaml");

/// A cluster Secret of Argo CD's namespace, labelled as Argo CD's, with an unrelated annotation
/// that writes must keep; `data` is the inside of its `stringData` map.
pub fn cluster_secret(name: &str, data: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: argocd, labels: {{argocd.argoproj.io/secret-type: cluster}}, annotations: {{team: platform}}}}\nstringData: {{{data}}}\n"
    )
}

/// An Application of Argo CD's namespace whose destination names `cluster`.
pub fn application(name: &str, cluster: &str) -> String {
    format!(
        "---\napiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata: {{name: {name}, namespace: argocd}}\nspec: {{project: default, destination: {{name: {cluster}, namespace: x}}}}\n"
    )
}

/// Every Secret `api` lists, by name.
pub async fn secrets(api: &Api<Secret>) -> BTreeMap<String, Secret> {
    api.list(&ListParams::default())
        .await
        .expect("Secrets are listed")
        .items
        .into_iter()
        .map(|s| (s.name_any(), s))
        .collect()
}

/// The `shard` key of a cluster Secret, if any.
pub fn shard_key(secret: &Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get("shard")?;
    Some(String::from_utf8(bytes.0.clone()).expect("the key is text"))
}

/// The Secret with its `shard` key, resourceVersion and managedFields dropped: what shardwise
/// must leave as it is.
pub fn without_shard(secret: &Secret) -> Value {
    let mut value = serde_json::to_value(secret).expect("a Secret is JSON");
    value["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
        .retain(|k, _| !["resourceVersion", "managedFields"].contains(&k.as_str()));
    if let Some(data) = value["data"].as_object_mut() {
        data.remove("shard");
    }
    // What the balancer records beside a key: where a rescued cluster came from, a refresh due,
    // the moves of the last hour.
    if let Some(annotations) = value["metadata"]["annotations"].as_object_mut() {
        annotations.remove("shardwise.io/rescued-from");
        annotations.remove("shardwise.io/refresh-pending");
        annotations.remove("shardwise.io/moves");
    }
    value
}

/// The Role named `name` that docs/argocd.md gives, as written there.
pub fn documented_role(name: &str) -> String {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/argocd.md"))
            .expect("docs/argocd.md is read");
    let header = format!("kind: Role\nmetadata: {{name: {name}, ");
    docs.split("```yaml\n")
        .filter_map(|block| block.split("```").next())
        .find(|block| block.contains(&header))
        .unwrap_or_else(|| panic!("docs/argocd.md gives a Role {name}"))
        .to_string()
}
