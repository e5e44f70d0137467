//! RBAC: 403 for what is not granted, access through Role/ClusterRole bindings of
//! ServiceAccount, Group and User subjects, resourceNames, subresources, access and token
//! reviews.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_runtime::watcher;
use serde_json::json;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_forbids_until_granted() {
    let server = start_with(with_robot().rbac(true)).await;
    let admin = admin(&server).await;
    let robot = client_as(&server, "robot").await;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "team"}})),
        )
        .await
        .unwrap();
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "team");
    for name in ["allowed", "hidden"] {
        admin_cms
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": name}})),
            )
            .await
            .unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(robot.clone(), "team");

    let denied = status(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((denied.code, denied.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        denied.message,
        "configmaps is forbidden: User \"system:serviceaccount:team:robot\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team\""
    );

    Api::<Role>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["allowed"]}]})))
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "team")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "robot-reads"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}]})),
        )
        .await
        .unwrap();
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    cms.get("allowed").await.unwrap();
    let named = status(cms.get("hidden").await.unwrap_err());
    assert_eq!(
        named.message,
        "configmaps \"hidden\" is forbidden: User \"system:serviceaccount:team:robot\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"team\""
    );
    let create = status(
        cms.create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "n"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(create.code, 403);
    let elsewhere = status(
        Api::<ConfigMap>::namespaced(robot.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap_err(),
    );
    assert!(
        elsewhere.message.ends_with("in the namespace \"default\""),
        "{}",
        elsewhere.message
    );

    // A watcher needs list and watch; it works with the role.
    let mut events = std::pin::pin!(watcher(cms.clone(), watcher::Config::default()));
    let first = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_ok(), "{first:?}");

    // Cluster-wide grant to the service accounts' group.
    let leases: Api<Lease> = Api::namespaced(robot.clone(), "default");
    let lease: Lease =
        from(json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "robot"}}));
    let lease_denied = status(
        leases
            .create(&PostParams::default(), &lease)
            .await
            .unwrap_err(),
    );
    assert!(
        lease_denied
            .message
            .contains("in API group \"coordination.k8s.io\""),
        "{}",
        lease_denied.message
    );
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "lease-writer"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]})))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "team-leases"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lease-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}]})))
        .await
        .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();

    // Group subjects: every service account of the namespace.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(robot.clone(), "default");
    let event: k8s_openapi::api::core::v1::Event =
        from(json!({"metadata": {"name": "e"}, "involvedObject": {"name": "x"}}));
    assert_eq!(
        status(
            events
                .create(&PostParams::default(), &event)
                .await
                .unwrap_err()
        )
        .code,
        403
    );
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "team-events"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "event-writer"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team"}]})))
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "event-writer"},
            "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]})),
        )
        .await
        .unwrap();
    events.create(&PostParams::default(), &event).await.unwrap();

    // Subresources are granted separately.
    Api::<StatefulSet>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "web"}}, "serviceName": "web",
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})))
        .await
        .unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(robot.clone(), "team");
    let scale_patch = Patch::Merge(json!({"spec": {"replicas": 3}}));
    let scale_denied = status(
        sets.patch_scale("web", &PatchParams::default(), &scale_patch)
            .await
            .unwrap_err(),
    );
    assert!(
        scale_denied
            .message
            .contains("cannot patch resource \"statefulsets/scale\" in API group \"apps\""),
        "{}",
        scale_denied.message
    );
    Api::<Role>::namespaced(admin.clone(), "team")
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "scaler"},
            "rules": [{"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["get", "patch"]}]})))
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "team")
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "robot-scales"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "scaler"},
            "subjects": [{"kind": "User", "name": "system:serviceaccount:team:robot"}]})),
        )
        .await
        .unwrap();
    sets.patch_scale("web", &PatchParams::default(), &scale_patch)
        .await
        .unwrap();
    assert_eq!(
        status(sets.get("web").await.unwrap_err()).code,
        403,
        "scale does not grant the object"
    );

    let review = |verb: &str, resource: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": "team", "verb": verb, "resource": resource}}})
        .to_string()
        .into_bytes()
    };
    let path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let (code, body) = raw(
        &robot,
        "POST",
        path,
        review("list", "configmaps"),
        "application/json",
    )
    .await;
    assert_eq!(code, 201);
    assert!(body.contains("\"allowed\":true"), "{body}");
    let (_, body) = raw(
        &robot,
        "POST",
        path,
        review("delete", "configmaps"),
        "application/json",
    )
    .await;
    assert!(body.contains("\"allowed\":false"), "{body}");

    // Admins bypass RBAC; turning it off opens everything.
    admin_cms
        .delete("hidden", &Default::default())
        .await
        .unwrap();
    server.set_rbac(false);
    cms.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": "n"}})),
    )
    .await
    .unwrap();
}

/// Delegated authentication and authorization, as a secure metrics endpoint uses them: who a
/// token is, and whether that user may read a non-resource path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_and_subject_access_reviews_answer_for_other_users() {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let config = with_robot()
        .identity(shardwise_test_apiserver::Identity::service_account(
            "scraper",
            "monitoring",
            "prometheus",
        ))
        .rbac(true);
    let server = start_with(config).await;
    let admin = admin(&server).await;
    let robot = client_as(&server, "robot").await;
    let scraper_token = server.identity("scraper").unwrap().token;
    let token_review = |token: &str| -> TokenReview { from(json!({"spec": {"token": token}})) };
    let access = |user: &str, path: &str| -> SubjectAccessReview {
        from(
            json!({"spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
            "nonResourceAttributes": {"path": path, "verb": "get"}}}),
        )
    };

    // Asking needs RBAC, as system:auth-delegator grants it.
    let tokens: Api<TokenReview> = Api::all(robot.clone());
    let denied = status(
        tokens
            .create(&PostParams::default(), &token_review(&scraper_token))
            .await
            .unwrap_err(),
    );
    assert_eq!(denied.code, 403, "{}", denied.message);
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "delegator"},
            "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                      {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]})))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "robot-delegates"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "delegator"},
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "team"}]})))
        .await
        .unwrap();

    let known = tokens
        .create(&PostParams::default(), &token_review(&scraper_token))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(known.authenticated, Some(true));
    let user = known.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:monitoring:prometheus")
    );
    let groups = user.groups.unwrap();
    for g in [
        "system:serviceaccounts",
        "system:serviceaccounts:monitoring",
        "system:authenticated",
    ] {
        assert!(groups.iter().any(|x| x == g), "{g} missing from {groups:?}");
    }
    let unknown = tokens
        .create(&PostParams::default(), &token_review("made-up"))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        unknown.authenticated, None,
        "false is omitted, as kube-apiserver omits it"
    );
    assert!(unknown.user.and_then(|u| u.username).is_none());
    let empty = status(
        tokens
            .create(&PostParams::default(), &token_review(""))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (empty.code, empty.message.as_str()),
        (400, "token is required for TokenReview in authentication")
    );

    let reviews: Api<SubjectAccessReview> = Api::all(robot.clone());
    let prometheus = "system:serviceaccount:monitoring:prometheus";
    let allowed = |review: SubjectAccessReview| review.status.unwrap().allowed;
    let ask = |user: &'static str, path: &'static str| {
        let reviews = reviews.clone();
        async move {
            allowed(
                reviews
                    .create(&PostParams::default(), &access(user, path))
                    .await
                    .unwrap(),
            )
        }
    };
    assert!(!ask(prometheus, "/metrics").await, "nothing granted yet");
    assert!(ask(prometheus, "/version").await, "discovery is open");
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})),
        )
        .await
        .unwrap();
    // A RoleBinding cannot grant non-resource URLs; only a ClusterRoleBinding can.
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "monitoring"}})),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "monitoring")
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "scrape"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]})))
        .await
        .unwrap();
    assert!(!ask(prometheus, "/metrics").await);
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &from(json!({"metadata": {"name": "scrape"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]})))
        .await
        .unwrap();
    assert!(ask(prometheus, "/metrics").await);
    assert!(!ask(prometheus, "/metrics/extra").await);
    assert!(!ask("system:serviceaccount:team:robot", "/metrics").await);

    let invalid = status(
        reviews
            .create(
                &PostParams::default(),
                &from(
                    json!({"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(invalid.code, 422);
    assert!(
        invalid
            .message
            .contains("at least one of user or group must be specified"),
        "{}",
        invalid.message
    );
}
