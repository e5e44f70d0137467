//! Typed and dynamic CRUD, errors, concurrency, subresources, generation, collections, pages.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::common::*;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.to_string());
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c.data = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
    c
}

fn statefulset(name: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2, "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}
        }
    }))
    .expect("valid statefulset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_crud_round_trip() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");

    let created = cms
        .create(&PostParams::default(), &cm("a", &[("app", "x")]))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();

    let got = cms.get("a").await.unwrap();
    assert_eq!(got.data, created.data);
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    let mut changed = got.clone();
    changed.data = Some(BTreeMap::from([("k".to_string(), "w".to_string())]));
    let replaced = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1);
    assert_eq!(replaced.data.as_ref().unwrap()["k"], "w");

    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"extra": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap().len(), 2);

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(cms.get("a").await.unwrap_err()).code, 404);
    assert!(cms.get_opt("a").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_kubernetes_statuses() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();

    let dup = status(
        cms.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "configmaps \"a\" already exists");

    let nowhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let missing_ns = status(
        nowhere
            .create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (missing_ns.code, missing_ns.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let bad = status(
        cms.create(&PostParams::default(), &cm("Bad_Name", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((bad.code, bad.reason.as_str()), (422, "Invalid"));
    let causes = bad.details.unwrap().causes;
    assert_eq!(causes[0].field, "metadata.name");
    let bad_label = status(
        cms.create(&PostParams::default(), &cm("ok", &[("bad key", "v")]))
            .await
            .unwrap_err(),
    );
    assert_eq!(bad_label.code, 422);

    let mut nameless = cm("x", &[]);
    nameless.metadata.name = None;
    let unnamed = status(
        cms.create(&PostParams::default(), &nameless)
            .await
            .unwrap_err(),
    );
    assert_eq!(unnamed.code, 422);
    assert!(
        unnamed.message.contains("name or generateName is required"),
        "{}",
        unnamed.message
    );
    nameless.metadata.generate_name = Some("gen-".into());
    let generated = cms.create(&PostParams::default(), &nameless).await.unwrap();
    assert!(generated.name_any().starts_with("gen-") && generated.name_any().len() == 9);

    let (code, body) = raw(
        &client,
        "GET",
        "/apis/example.com/v1/namespaces/default/gizmos",
        vec![],
        "application/json",
    )
    .await;
    assert_eq!(code, 404);
    assert!(body.contains("\"reason\":\"NotFound\""), "{body}");
    let (code, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        b"{not json".to_vec(),
        "application/json",
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let (code, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps/a",
        b"{}".to_vec(),
        "application/json",
    )
    .await;
    assert_eq!(code, 405);
    let (code, body) = raw(
        &client,
        "PUT",
        "/api/v1/namespaces/default/configmaps/a",
        br#"{"metadata":{"name":"b"}}"#.to_vec(),
        "application/json",
    )
    .await;
    assert_eq!(code, 400, "{body}");

    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.root_cert = Some(vec![pem_to_der(server.ca_pem().unwrap())]);
    config.auth_info.token = Some("not-a-token".to_string().into());
    let stranger: Api<ConfigMap> =
        Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    assert_eq!(
        status(stranger.list(&ListParams::default()).await.unwrap_err()).code,
        401
    );
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .expect("PEM is base64")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_resource_versions_conflict() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let mut winner = first.clone();
    winner.data = Some(BTreeMap::from([("k".to_string(), "winner".to_string())]));
    cms.replace("a", &PostParams::default(), &winner)
        .await
        .unwrap();
    let mut loser = first.clone();
    loser.data = Some(BTreeMap::from([("k".to_string(), "loser".to_string())]));
    let conflict = status(
        cms.replace("a", &PostParams::default(), &loser)
            .await
            .unwrap_err(),
    );
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        conflict.message,
        "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let stale_patch = status(
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": first.resource_version()}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(stale_patch.code, 409);
    // Without a resourceVersion the update is unconditional.
    loser.metadata.resource_version = None;
    cms.replace("a", &PostParams::default(), &loser)
        .await
        .unwrap();

    // Leader election by hand: only one of two racing renewals from the same version wins.
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}}),
    )
    .unwrap();
    let base = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut results = Vec::new();
    for holder in ["b", "c"] {
        let mut attempt = base.clone();
        attempt.spec.as_mut().unwrap().holder_identity = Some(holder.into());
        results.push(
            leases
                .replace("leader", &PostParams::default(), &attempt)
                .await,
        );
    }
    assert!(results[0].is_ok());
    assert_eq!(status(results.pop().unwrap().unwrap_err()).code, 409);
    assert_eq!(
        leases
            .get("leader")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("b")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_api_through_discovery() {
    let server = start().await;
    let client = admin(&server).await;
    install_widgets(&client).await;

    for discovery in [
        Discovery::new(client.clone()).run().await.unwrap(),
        Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        let (ar, caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"))
            .expect("Widget is discovered");
        assert_eq!(ar.plural, "widgets");
        assert_eq!(caps.scope, Scope::Namespaced);
        assert!(caps.subresources.iter().any(|(s, _)| s.plural == "status"));
        let (sts, _) = discovery
            .resolve_gvk(&GroupVersionKind::gvk("apps", "v1", "StatefulSet"))
            .expect("StatefulSet is discovered");
        assert_eq!(sts.plural, "statefulsets");
        let (lease, lease_caps) = discovery
            .resolve_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"))
            .unwrap();
        assert_eq!(
            (lease.plural.as_str(), lease_caps.scope),
            ("leases", Scope::Namespaced)
        );
    }

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, _) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget"))
        .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"replicas": 1, "color": "red"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    let got = api.get("w1").await.unwrap();
    assert_eq!(got.data["spec"]["color"], "red");
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"color": "blue"}})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items[0].data["spec"]["color"],
        "blue"
    );
    api.delete("w1", &DeleteParams::default()).await.unwrap();
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // The typed view of the same resource.
    let widgets: Api<Widget> = Api::namespaced(client, "default");
    widgets
        .create(&PostParams::default(), &widget("w2", 3))
        .await
        .unwrap();
    assert_eq!(widgets.get("w2").await.unwrap().spec.replicas, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_serve_every_version_and_stop_when_deleted() {
    let server = start().await;
    let client = admin(&server).await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let mut crd = widget_crd();
    let mut beta = crd.spec.versions[0].clone();
    beta.name = "v1beta1".into();
    beta.storage = false;
    crd.spec.versions.push(beta);
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let conditions = created.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    let (code, body) = raw(
        &client,
        "GET",
        "/apis/example.com/v1beta1/namespaces/default/widgets/w",
        vec![],
        "application/json",
    )
    .await;
    assert_eq!(code, 200);
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["apiVersion"], "example.com/v1beta1");
    assert_eq!(seen["spec"]["replicas"], 1);

    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let gone = status(widgets.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(gone.code, 404);
    // Re-created, it starts empty.
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .unwrap();
    assert!(
        widgets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_subresource_and_generation() {
    let server = start().await;
    let client = admin(&server).await;
    install_widgets(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let mut w = widget("w", 1);
    w.status = Some(WidgetStatus { replicas: 9 });
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.status, None, "status is dropped on create");
    assert_eq!(created.metadata.generation, Some(1));

    let mut with_status = created.clone();
    with_status.status = Some(WidgetStatus { replicas: 2 });
    with_status.spec.replicas = 5;
    let after_status = widgets
        .replace_status("w", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(after_status.status, Some(WidgetStatus { replicas: 2 }));
    assert_eq!(
        after_status.spec.replicas, 1,
        "status writes leave spec alone"
    );
    assert_eq!(
        after_status.metadata.generation,
        Some(1),
        "status does not bump generation"
    );

    let mut main = after_status.clone();
    main.status = Some(WidgetStatus { replicas: 100 });
    main.metadata.labels = Some(BTreeMap::from([("l".to_string(), "1".to_string())]));
    let after_meta = widgets
        .replace("w", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        after_meta.status,
        Some(WidgetStatus { replicas: 2 }),
        "main writes leave status alone"
    );
    assert_eq!(
        after_meta.metadata.generation,
        Some(1),
        "metadata does not bump generation"
    );

    let after_spec = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(after_spec.metadata.generation, Some(2));
    let patched_status = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(patched_status.status.as_ref().unwrap().replicas, 4);
    assert_eq!(patched_status.metadata.generation, Some(2));

    // A write that changes nothing keeps the resourceVersion.
    let again = widgets
        .replace("w", &PostParams::default(), &patched_status)
        .await
        .unwrap();
    assert_eq!(again.resource_version(), patched_status.resource_version());

    let sets: Api<StatefulSet> = Api::namespaced(client, "default");
    let sts = sets
        .create(&PostParams::default(), &statefulset("web"))
        .await
        .unwrap();
    assert_eq!(sts.metadata.generation, Some(1));
    assert_eq!(sts.status.as_ref().unwrap().replicas, 0);
    let scaled = sets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}, "status": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.metadata.generation, Some(2));
    assert_eq!(scaled.status.unwrap().replicas, 0);
    let immutable = status(
        sets.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"serviceName": "other"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(immutable.code, 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_subresources() {
    let server = start().await;
    let client = admin(&server).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    sets.create(&PostParams::default(), &statefulset("web"))
        .await
        .unwrap();
    let scale = sets.get_scale("web").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=web"));
    sets.patch_scale(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 7}})),
    )
    .await
    .unwrap();
    assert_eq!(
        sets.get("web").await.unwrap().spec.unwrap().replicas,
        Some(7)
    );

    install_widgets(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client, "default");
    widgets
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    widgets
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(widgets.get("w").await.unwrap().spec.replicas, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_delete_by_label() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for (name, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(&PostParams::default(), &cm(name, &[("tier", tier)]))
            .await
            .unwrap();
    }
    let deleted = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("tier=x"),
        )
        .await
        .unwrap();
    let names: Vec<String> = deleted
        .left()
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(left, vec!["c"]);
    let selected = cms
        .list(&ListParams::default().labels("tier in (y,z),!missing"))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    let by_field = cms
        .list(&ListParams::default().fields("metadata.name=c"))
        .await
        .unwrap();
    assert_eq!(by_field.items.len(), 1);
    let bad = status(
        cms.list(&ListParams::default().fields("spec.nope=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(bad.code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_with_limit_and_continue() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("cm-{i:02}"), &[]))
            .await
            .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(10)).await.unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.metadata.remaining_item_count, Some(15));
    let token = first.metadata.continue_.clone().unwrap();
    // Writes after the first page do not leak into the continuation.
    cms.delete("cm-15", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("cm-10a", &[]))
        .await
        .unwrap();
    let mut names: Vec<String> = first.items.iter().map(ResourceExt::name_any).collect();
    let mut token = Some(token);
    while let Some(t) = token {
        let page = cms
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(
            page.metadata.resource_version,
            first.metadata.resource_version
        );
        names.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.filter(|c| !c.is_empty());
    }
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        25
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_continue_tokens_are_gone() {
    let server =
        start_with(shardwise_test_apiserver::ServerConfig::default().watch_history(3)).await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..4 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("d{i}"), &[]))
            .await
            .unwrap();
    }
    let token = first.metadata.continue_.unwrap();
    let gone = status(
        cms.list(&ListParams::default().limit(2).continue_token(&token))
            .await
            .unwrap_err(),
    );
    assert_eq!((gone.code, gone.reason.as_str()), (410, "Expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_deletion() {
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut c = cm("held", &[]);
    c.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    cms.create(&PostParams::default(), &c).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = cms.get("held").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let refused = status(
        cms.patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/cleanup", "other/x"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(refused.code, 422);
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_take_dependents_and_namespaces_their_contents() {
    let server = start().await;
    let client = admin(&server).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    let ns = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    assert_eq!(ns.labels()["kubernetes.io/metadata.name"], "team");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let owner = cms
        .create(&PostParams::default(), &cm("owner", &[]))
        .await
        .unwrap();
    let mut dependent = cm("dependent", &[]);
    dependent.metadata.owner_references = Some(vec![owner.controller_owner_ref(&()).unwrap()]);
    cms.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("dependent").await.unwrap().is_none());

    cms.create(&PostParams::default(), &cm("inside", &[]))
        .await
        .unwrap();
    namespaces
        .delete("team", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("team").await.unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let refused = status(
        cms.create(&PostParams::default(), &cm("late", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, 403);
    eventually(
        "namespace team to be gone",
        Duration::from_secs(5),
        || async {
            match namespaces.get_opt("team").await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let (code, _) = raw(
        &cms.clone().into_client(),
        "GET",
        "/api/v1/namespaces/team/configmaps/inside",
        vec![],
        "application/json",
    )
    .await;
    assert_eq!(code, 404);
    let protected = status(
        namespaces
            .delete("default", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(protected.code, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_formats_and_dry_run() {
    let server = start().await;
    let client = admin(&server).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let mut sts = statefulset("web");
    sts.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .ports = Some(vec![
        serde_json::from_value(json!({"containerPort": 80})).unwrap(),
    ]);
    sets.create(&PostParams::default(), &sts).await.unwrap();

    let strategic = sets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i:2"}]}}}})),
        )
        .await
        .unwrap();
    let container = &strategic.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("i:2"));
    assert!(
        container.ports.is_some(),
        "strategic merge keeps the other container fields"
    );

    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "test", "path": "/data/k", "value": "v"},
                    {"op": "add", "path": "/data/n", "value": "1"}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["n"], "1");
    let failed = status(
        cms.patch(
            "a",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([{"op": "test", "path": "/data/k", "value": "nope"}]))
                    .unwrap(),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(failed.code, 422);

    let dry = cms
        .patch(
            "a",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"data": {"k": "dry"}})),
        )
        .await
        .unwrap();
    assert_eq!(dry.data.unwrap()["k"], "dry");
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["k"], "v");
    let dry_create = cms
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &cm("ghost", &[]),
        )
        .await
        .unwrap();
    assert_eq!(dry_create.name_any(), "ghost");
    assert!(cms.get_opt("ghost").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_specific_behaviour() {
    let server = start().await;
    let client = admin(&server).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    let created = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(created.data.unwrap()["password"].0, b"hunter2");
    assert!(created.string_data.is_none());
    assert_eq!(created.type_.as_deref(), Some("Opaque"));

    let services: Api<Service> = Api::namespaced(client, "default");
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let spec = svc.spec.unwrap();
    assert!(spec.cluster_ip.unwrap().starts_with("10."));
    assert_eq!(spec.ports.unwrap()[0].protocol.as_deref(), Some("TCP"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_the_kube_runtime_recorder() {
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube_runtime::events::{Event, EventType, Recorder, Reporter};
    let server = start().await;
    let client = admin(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let target = cms
        .create(&PostParams::default(), &cm("target", &[]))
        .await
        .unwrap();
    let recorder = Recorder::new(client.clone(), Reporter::from("shardwise"));
    let event = Event {
        type_: EventType::Normal,
        reason: "Assigned".into(),
        note: Some("shard 2".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].reason.as_deref(), Some("Assigned"));
    assert_eq!(list.items[0].series.as_ref().map(|s| s.count), Some(2));
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "default");
    let core_event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "ConfigMap", "name": "target"}, "reason": "Seen"
    }))
    .unwrap();
    core.create(&PostParams::default(), &core_event)
        .await
        .unwrap();
    let selected = core
        .list(&ListParams::default().fields("involvedObject.name=target"))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_version_and_openapi() {
    let server = start().await;
    let client = admin(&server).await;
    for path in ["/healthz", "/livez", "/readyz"] {
        let (code, body) = raw(&client, "GET", path, vec![], "").await;
        assert_eq!((code, body.as_str()), (200, "ok"));
    }
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let (code, body) = raw(&client, "GET", "/openapi/v3", vec![], "").await;
    assert_eq!(code, 200);
    assert!(body.contains("apis/apps/v1"));
}
