//! The CRDs of shardwise's kinds. (That `deploy/crds.yaml` is exactly what `shardwise crds`
//! prints is checked by the CLI's tests.)

use kube::CustomResourceExt;
use shardwise_api::{FleetApp, FleetCluster, FleetPolicy};

#[test]
fn names_do_not_clash_with_argo_cd_or_cluster_api() {
    let cluster = FleetCluster::crd();
    let app = FleetApp::crd();
    for crd in [&cluster, &app] {
        assert_eq!(crd.spec.group, "shardwise.io");
        let plural = crd.spec.names.plural.as_str();
        assert!(plural != "applications" && plural != "clusters", "{plural}");
        assert!(
            crd.spec.versions[0]
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
    let columns = |crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| -> Vec<String> {
        crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect()
    };
    // A cluster shows its shard; an app its cluster, whose shard that is (apps carry none).
    let (cluster_columns, app_columns) = (columns(&cluster), columns(&app));
    assert!(
        cluster_columns.contains(&"Shard".into()) && cluster_columns.contains(&"Age".into()),
        "{cluster_columns:?}"
    );
    assert!(
        app_columns.contains(&"Cluster".into()) && !app_columns.contains(&"Shard".into()),
        "{app_columns:?}"
    );
    assert_eq!(
        cluster.spec.names.short_names,
        Some(vec!["fcl".to_string()])
    );
    assert_eq!(app.spec.names.short_names, Some(vec!["fapp".to_string()]));
}

#[test]
fn the_yaml_parses_back_into_the_same_crds() {
    let yaml = shardwise_api::crds_yaml(&shardwise_api::crds()).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&yaml).unwrap();
    let docs: Vec<&serde_json::Value> = docs.iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[0], &serde_json::to_value(FleetCluster::crd()).unwrap());
    assert_eq!(docs[1], &serde_json::to_value(FleetApp::crd()).unwrap());
    assert_eq!(docs[2], &serde_json::to_value(FleetPolicy::crd()).unwrap());
}
