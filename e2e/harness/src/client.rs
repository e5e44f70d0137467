//! Kube clients from the kubeconfigs the harness writes, for the test server and the real one.

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::HarnessError;

/// A kube client of the current context of kubeconfig `yaml` (of cluster `cluster`).
pub(crate) async fn client_of(cluster: &str, yaml: &str) -> Result<kube::Client, HarnessError> {
    let invalid = |reason: String| HarnessError::Kubeconfig {
        cluster: cluster.to_string(),
        reason,
    };
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|e| invalid(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| invalid(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}
