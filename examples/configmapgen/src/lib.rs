//! The kind both binaries of this example reconcile (kube-rs's `configmapgen_controller`):
//! a ConfigMapGenerator asks for a ConfigMap of its name holding its content.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a generator asks for: the content of its ConfigMap, under the key `content`.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "examples.shardwise.io",
    version = "v1",
    kind = "ConfigMapGenerator"
)]
#[kube(shortname = "cmg", namespaced)]
pub struct ConfigMapGeneratorSpec {
    /// What the ConfigMap holds.
    pub content: String,
}
