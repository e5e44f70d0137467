//! The runtime as a library: a replica built from the builder's settings and the program's own
//! `kube::Client`, here a tower-test mock answered by a small in-memory API server, run until
//! its token is cancelled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::client::Body;
use serde_json::{Value, json};
use shardwise_handoff::lease::LeaseTiming;
use shardwise_runtime::settings::{Settings, WatchScope};
use shardwise_runtime::{Action, ContextOf, Nouns, ObjectKey, Sharded, ShardedReplica, TermOf};
use tokio_util::sync::CancellationToken;
use tower_test::mock;

struct Labeller;

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

    fn unit_of(item: &ConfigMap) -> ObjectKey {
        ObjectKey::new("", item.metadata.namespace.clone().unwrap_or_default())
    }

    fn begin_term(&self, _: &Arc<ContextOf<Self>>) -> Result<(), kube::Error> {
        Ok(())
    }

    async fn reconcile_unit(
        &self,
        _: &TermOf<Self>,
        _: Arc<Namespace>,
    ) -> Result<Action, kube::Error> {
        Ok(Action::Done(None))
    }

    async fn reconcile_item(
        &self,
        _: &TermOf<Self>,
        _: Arc<ConfigMap>,
    ) -> Result<Action, kube::Error> {
        Ok(Action::Done(None))
    }
}

/// One request as the mock saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    user_agent: String,
    body: Value,
}

/// Objects by path, with the resourceVersions an API server would give them; lists are empty
/// but for what is stored, and watches are held open until the test ends.
#[derive(Default)]
struct FakeServer {
    objects: BTreeMap<String, Value>,
    version: u64,
}

impl FakeServer {
    fn stamp(&mut self, object: &mut Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(format!("uid-{}", self.version));
        }
    }

    fn answer(&mut self, seen: &Seen) -> Option<(StatusCode, Value)> {
        let not_found = || json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404});
        if seen.query.contains("watch=true") {
            return None;
        }
        Some(match seen.method {
            Method::GET => match self.objects.get(&seen.path) {
                Some(object) => (StatusCode::OK, object.clone()),
                // A collection is a path whose last segment is a resource: an even count of
                // segments under /apis/<group>/<version> or an odd one under /api/v1.
                None if is_collection(&seen.path) => {
                    let prefix = format!("{}/", seen.path);
                    let items: Vec<Value> = self
                        .objects
                        .iter()
                        .filter(|(path, _)| {
                            path.starts_with(&prefix) && !path[prefix.len()..].contains('/')
                        })
                        .map(|(_, object)| object.clone())
                        .collect();
                    (
                        StatusCode::OK,
                        json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": self.version.to_string()}, "items": items}),
                    )
                }
                None => (StatusCode::NOT_FOUND, not_found()),
            },
            Method::POST => {
                let mut object = seen.body.clone();
                let name = object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("generated")
                    .to_string();
                self.stamp(&mut object);
                self.objects
                    .insert(format!("{}/{name}", seen.path), object.clone());
                (StatusCode::CREATED, object)
            }
            Method::PUT => {
                let mut object = seen.body.clone();
                self.stamp(&mut object);
                self.objects.insert(seen.path.clone(), object.clone());
                (StatusCode::OK, object)
            }
            Method::PATCH => match self.objects.get(&seen.path).cloned() {
                Some(mut object) => {
                    merge(&mut object, &seen.body);
                    self.stamp(&mut object);
                    self.objects.insert(seen.path.clone(), object.clone());
                    (StatusCode::OK, object)
                }
                None => (StatusCode::NOT_FOUND, not_found()),
            },
            _ => (StatusCode::NOT_FOUND, not_found()),
        })
    }
}

fn is_collection(path: &str) -> bool {
    let segments = path.trim_start_matches('/').split('/').count();
    if path.starts_with("/api/") {
        segments % 2 == 1
    } else {
        segments.is_multiple_of(2)
    }
}

/// A JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(fields) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            fields.remove(key);
        } else {
            merge(fields.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Answers the mock's requests from `server`, recording each; held watches stay open.
async fn serve(
    mut handle: mock::Handle<Request<Body>, Response<Body>>,
    server: Arc<Mutex<FakeServer>>,
    seen: Arc<Mutex<Vec<Seen>>>,
) {
    let mut held = Vec::new();
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let request = Seen {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or("").to_string(),
            user_agent: parts
                .headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        let answer = server.lock().expect("not poisoned").answer(&request);
        seen.lock().expect("not poisoned").push(request);
        match answer {
            Some((status, body)) => respond.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(body.to_string().into_bytes()))
                    .expect("a valid response"),
            ),
            None => held.push(respond),
        }
    }
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/fleet/leases";

#[tokio::test]
async fn a_replica_runs_on_the_programs_client_holds_its_shard_and_hands_it_back() {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = Arc::new(Mutex::new(FakeServer::default()));
    server.lock().unwrap().objects.insert(
        "/apis/apps/v1/namespaces/fleet/statefulsets/labeller".into(),
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": "labeller", "namespace": "fleet", "uid": "sts-uid", "resourceVersion": "1"},
               "spec": {"replicas": 1, "selector": {}, "serviceName": "labeller", "template": {}}}),
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let answering = tokio::spawn(serve(handle, server.clone(), seen.clone()));

    let settings = Settings::builder("fleet", "labeller-0")
        .controller_name("test-labeller")
        .scope(WatchScope::Cluster)
        .leases(LeaseTiming {
            duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
        })
        .build()
        .expect("valid settings");
    let client = kube::Client::new(service, "fleet");
    let replica = ShardedReplica::new(Labeller, settings, client);
    let ready = replica.readiness();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(replica.run(shutdown.clone()));

    // Ready once the shard lease is held and the owner's caches synced, on the mock alone.
    tokio::time::timeout(Duration::from_secs(60), async {
        while !ready.get() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replica becomes ready");
    let shard_lease = format!("{LEASES}/labeller-shard-0");
    let lease = server.lock().unwrap().objects[&shard_lease].clone();
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(holder.starts_with("labeller-0_"), "{lease}");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "sts-uid");
    assert_eq!(lease["metadata"]["labels"]["shardwise.io/shard"], "0");

    // The owner term's watches go through the program's client, named by the term.
    let term_watches: Vec<Seen> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.path == "/api/v1/configmaps" && s.query.contains("shardwise.io%2Fshard%3D0"))
        .cloned()
        .collect();
    assert!(!term_watches.is_empty(), "the owner lists its items");
    for watch in &term_watches {
        assert!(
            watch
                .user_agent
                .starts_with("test-labeller (shard 0; term "),
            "{watch:?}"
        );
    }

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the replica stops")
        .expect("the task ends")
        .expect("the replica ran without error");
    let lease = server.lock().unwrap().objects[&shard_lease].clone();
    assert!(
        lease["spec"]["holderIdentity"].is_null(),
        "released on shutdown: {lease}"
    );
    answering.abort();
}
