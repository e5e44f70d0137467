//! Server-side apply: ownership, removal, conflicts, force, dry run, subresources.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common::*;

fn cm(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "labels": {"team": "x"}}, "data": data})
}

fn owners(obj: &ConfigMap) -> Vec<(String, String)> {
    obj.managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn owns(obj: &ConfigMap, manager: &str, field: &str) -> bool {
    obj.managed_fields()
        .iter()
        .filter(|m| m.manager.as_deref() == Some(manager))
        .any(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer(&format!("/f:data/f:{field}")).is_some())
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_owns_removes_and_conflicts() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let alpha = PatchParams::apply("alpha");
    let beta = PatchParams::apply("beta");

    let created = cms
        .patch("a", &alpha, &Patch::Apply(cm(json!({"x": "1", "y": "2"}))))
        .await
        .unwrap();
    assert_eq!(
        owners(&created),
        [("alpha".to_string(), "Apply".to_string())]
    );
    assert!(owns(&created, "alpha", "x") && owns(&created, "alpha", "y"));

    let same = cms
        .patch("a", &alpha, &Patch::Apply(cm(json!({"x": "1", "y": "2"}))))
        .await
        .unwrap();
    assert_eq!(
        same.resource_version(),
        created.resource_version(),
        "re-applying the same config is a no-op"
    );

    let shrunk = cms
        .patch("a", &alpha, &Patch::Apply(cm(json!({"x": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        shrunk.data.as_ref().unwrap().len(),
        1,
        "a field the manager stopped applying is removed"
    );

    let conflict = status(
        cms.patch("a", &beta, &Patch::Apply(cm(json!({"x": "2"}))))
            .await
            .unwrap_err(),
    );
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert!(
        conflict.message.contains("conflict with \"alpha\""),
        "{}",
        conflict.message
    );
    let causes = conflict.details.unwrap().causes;
    assert_eq!(causes[0].field, ".data.x");
    assert_eq!(causes[0].reason, "FieldManagerConflict");

    let shared = cms
        .patch("a", &beta, &Patch::Apply(cm(json!({"x": "1"}))))
        .await
        .unwrap();
    assert!(
        owns(&shared, "alpha", "x") && owns(&shared, "beta", "x"),
        "same value: shared ownership"
    );

    let forced = cms
        .patch(
            "a",
            &beta.clone().force(),
            &Patch::Apply(cm(json!({"x": "3"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["x"], "3");
    assert!(
        owns(&forced, "beta", "x") && !owns(&forced, "alpha", "x"),
        "force takes ownership"
    );
    let back = status(
        cms.patch("a", &alpha, &Patch::Apply(cm(json!({"x": "1"}))))
            .await
            .unwrap_err(),
    );
    assert!(back.message.contains("\"beta\""), "{}", back.message);

    // Updates (non-apply writes) take ownership too, and apply conflicts with them.
    let edited = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"z": "edited"}})),
        )
        .await
        .unwrap();
    assert!(
        edited
            .managed_fields()
            .iter()
            .any(|m| m.operation.as_deref() == Some("Update"))
    );
    let with_update = status(
        cms.patch("a", &alpha, &Patch::Apply(cm(json!({"z": "mine"}))))
            .await
            .unwrap_err(),
    );
    assert_eq!(with_update.code, 409);

    let dry = cms
        .patch(
            "a",
            &beta.clone().dry_run(),
            &Patch::Apply(cm(json!({"x": "3", "new": "1"}))),
        )
        .await
        .unwrap();
    assert_eq!(dry.data.as_ref().unwrap()["new"], "1");
    assert!(
        !cms.get("a")
            .await
            .unwrap()
            .data
            .unwrap()
            .contains_key("new")
    );

    let (code, body) = raw(
        &cms.clone().into_client(),
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        cm(json!({})).to_string().into_bytes(),
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(code, 422, "fieldManager is required: {body}");
    let (code, _) = raw(
        &cms.clone().into_client(),
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a?fieldManager=yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  fromyaml: \"1\"\n"
            .to_vec(),
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["fromyaml"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_merges_keyed_lists_and_status() {
    let server = start().await;
    let client = admin(&server).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let base = |containers: Value| {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "serviceName": "web",
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}}})
    };
    sets.patch(
        "web",
        &PatchParams::apply("main"),
        &Patch::Apply(base(json!([{"name": "app", "image": "app:1"}]))),
    )
    .await
    .unwrap();
    let sidecar = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]}}}});
    let merged = sets
        .patch(
            "web",
            &PatchParams::apply("injector"),
            &Patch::Apply(sidecar),
        )
        .await
        .unwrap();
    let names: Vec<String> = merged
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["app", "proxy"], "containers merge by name");
    let updated = sets
        .patch(
            "web",
            &PatchParams::apply("main"),
            &Patch::Apply(base(json!([{"name": "app", "image": "app:2"}]))),
        )
        .await
        .unwrap();
    let containers = updated.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(
        containers.len(),
        2,
        "one manager's apply keeps the other's container"
    );
    assert_eq!(containers[0].image.as_deref(), Some("app:2"));

    install_widgets(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client, "default");
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"replicas": 1, "unknown": true}});
    let created = widgets
        .patch("w", &PatchParams::apply("ctl"), &Patch::Apply(w))
        .await
        .unwrap();
    assert_eq!(created.spec.replicas, 1);
    let status_cfg = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "status": {"replicas": 1}});
    let with_status = widgets
        .patch_status(
            "w",
            &PatchParams::apply("ctl-status"),
            &Patch::Apply(status_cfg),
        )
        .await
        .unwrap();
    assert_eq!(with_status.status.as_ref().unwrap().replicas, 1);
    let entry = with_status
        .managed_fields()
        .iter()
        .find(|m| m.manager.as_deref() == Some("ctl-status"))
        .cloned()
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    let (code, body) = raw(
        &widgets.into_client(),
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets/w",
        vec![],
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert!(
        !body.contains("unknown"),
        "unknown fields are pruned by the schema: {body}"
    );
}
