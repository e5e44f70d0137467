//! Items of slices selected by the API server (KEP-5866 sharded list and watch, alpha in
//! Kubernetes 1.36 behind the `ShardedListAndWatch` gate).
//!
//! With the gate on, a list or watch with `shardSelector` keeps only the objects whose
//! FNV-1a-64 hash of `metadata.uid` lies in the ranges asked for: the very keys slices are cut
//! by. A watch of the items of slices asks for its ranges, so the items of the rest of a hot
//! unit never reach the replica. kube-rs has no field for the selector: the watch gets a client
//! that adds it to each of its requests. A server without the gate ignores the selector and
//! sends everything; a probe tells the two apart, and without support no selector is sent.
//! Either way the watch itself keeps only the items of its ranges: the selector saves traffic
//! and decoding, it never decides what a replica works on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request, Response, Uri};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::client::Body;
use kube::{Api, Client};
use shard_assign::KeyRange;
use tower::Service;

/// `request` with `shardSelector=selector` added to its query, if it is a GET (a list or a
/// watch); other requests unchanged.
fn with_selector<B>(mut request: Request<B>, selector: &str) -> Result<Request<B>, http::Error> {
    if request.method() != Method::GET {
        return Ok(request);
    }
    let pair = form_urlencoded::Serializer::new(String::new())
        .append_pair("shardSelector", selector)
        .finish();
    let uri = request.uri();
    let path_and_query = match uri.query() {
        Some(query) => format!("{}?{query}&{pair}", uri.path()),
        None => format!("{}?{pair}", uri.path()),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse()?);
    *request.uri_mut() = Uri::from_parts(parts)?;
    Ok(request)
}

/// A client whose lists and watches carry `selector`; everything else about `client` (its
/// fence, limits and counts) still applies.
pub(crate) fn selecting(client: &Client, selector: &str) -> Client {
    let service = AddSelector {
        client: client.clone(),
        selector: Arc::from(selector),
        collection: None,
    };
    Client::new(service, client.default_namespace())
}

/// [`selecting`], but only for lists and watches of one collection: those under `prefix` (the
/// group and version's path, `/apis/<group>/<version>/` or `/api/v1/`) whose path ends with
/// `/<plural>`, in every namespace or one. Other kinds are left alone: a program's client also
/// lists what its objects own, whose UIDs are not the ones the shard owns ranges of.
pub(crate) fn selecting_collection(
    client: &Client,
    selector: &str,
    prefix: &str,
    plural: &str,
) -> Client {
    let service = AddSelector {
        client: client.clone(),
        selector: Arc::from(selector),
        collection: Some(Arc::new((prefix.to_string(), format!("/{plural}")))),
    };
    Client::new(service, client.default_namespace())
}

#[derive(Clone)]
struct AddSelector {
    client: Client,
    selector: Arc<str>,
    /// The path's prefix and end that the selector is added to; every path if none.
    collection: Option<Arc<(String, String)>>,
}

/// Whether a request of `path` gets the selector, for a client of `collection` (its path's
/// prefix and end; every path if none).
fn selects(collection: Option<&(String, String)>, path: &str) -> bool {
    collection.is_none_or(|(prefix, end)| {
        path.starts_with(prefix.as_str()) && path.ends_with(end.as_str())
    })
}

impl Service<Request<Body>> for AddSelector {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        // The inner client buffers: readiness is awaited in `send`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let request = if selects(self.collection.as_deref(), request.uri().path()) {
            with_selector(request, &self.selector)
        } else {
            Ok(request)
        };
        Box::pin(async move { client.send(request.map_err(kube::Error::HttpError)?).await })
    }
}

/// Whether the server selects by shard. The gate is the server's, for every kind it serves,
/// but only typed lists echo the selector back: a list of one Lease of `namespace` (the
/// replicas' own, which they may list) with a selector of the whole key space comes back with
/// `metadata.shardInfo` only where the gate is on. Lists of custom resources never carry it.
pub(crate) async fn server_selects(client: &Client, namespace: &str) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let request = kube::core::Request::new(leases.resource_url())
        .list(&ListParams::default().limit(1))
        .map_err(kube::Error::BuildRequest)?;
    let request =
        with_selector(request, &KeyRange::WHOLE.selector()).map_err(kube::Error::HttpError)?;
    let list: serde_json::Value = client.request(request).await?;
    Ok(list
        .pointer("/metadata/shardInfo/selector")
        .is_some_and(serde_json::Value::is_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn lists_and_watches_carry_the_selector_encoded() {
        let (low, _) = KeyRange::WHOLE.halves().unwrap();
        let selector = low.selector();
        let watch = with_selector(
            get("/apis/x/v1/namespaces/a/apps?watch=true&labelSelector=u%20in%20(t)"),
            &selector,
        )
        .unwrap();
        let query = watch.uri().query().unwrap();
        assert!(query.starts_with("watch=true&labelSelector=u%20in%20(t)&shardSelector="));
        let sent: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(
            sent.last(),
            Some(&("shardSelector".to_string(), selector.clone()))
        );
        assert_eq!(watch.uri().path(), "/apis/x/v1/namespaces/a/apps");
        let list = with_selector(get("/apis/x/v1/apps"), &selector).unwrap();
        assert_eq!(
            form_urlencoded::parse(list.uri().query().unwrap().as_bytes())
                .into_owned()
                .collect::<Vec<_>>(),
            [("shardSelector".to_string(), selector.clone())]
        );
    }

    /// A program's client selects only its own kind's collection: not one object of it, and
    /// not another kind (what its objects own).
    #[test]
    fn a_collection_client_selects_only_its_collection() {
        let collection = (
            "/apis/examples.shardwise.io/v1/".to_string(),
            "/configmapgenerators".to_string(),
        );
        let selects = |path| selects(Some(&collection), path);
        assert!(selects(
            "/apis/examples.shardwise.io/v1/configmapgenerators"
        ));
        assert!(selects(
            "/apis/examples.shardwise.io/v1/namespaces/a/configmapgenerators"
        ));
        assert!(!selects(
            "/apis/examples.shardwise.io/v1/namespaces/a/configmapgenerators/g"
        ));
        assert!(!selects("/api/v1/namespaces/a/configmaps"));
        assert!(!selects("/apis/other.io/v1/configmapgenerators"));
        assert!(super::selects(None, "/api/v1/namespaces/a/configmaps"));
    }

    #[test]
    fn writes_are_left_alone() {
        let patch = Request::patch("/apis/x/v1/namespaces/a/apps/b?fieldManager=m")
            .body(())
            .unwrap();
        let sent = with_selector(patch, "shardRange(object.metadata.uid, '0x0', '0x1')").unwrap();
        assert_eq!(sent.uri().query(), Some("fieldManager=m"));
    }
}
