//! Request entry: authentication, the latency in force, and routing to discovery or resources.

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response, header};
use hyper::body::Incoming;

use crate::auth::Identity;
use crate::error::ApiError;
use crate::respond::{self, Body};
use crate::shared::Shared;
use crate::tls::ClientCert;
use crate::{discovery, rest};
use shardwise_e2e_testkit::WriteRecord;

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn is_health(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"].iter().any(|h| {
        path == *h
            || path
                .strip_prefix(h)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// `client_cert` is what the connection's client certificate says. As in kube-apiserver, whose
/// x509 authenticator comes before the token authenticators in its union, a trusted certificate
/// wins over any bearer token; a rejected one leaves the decision to the token.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    client_cert: Arc<ClientCert>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(answer(shared, client_cert, req).await)
}

async fn answer(
    shared: Arc<Shared>,
    client_cert: Arc<ClientCert>,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    tracing::debug!(method = %req.method(), uri = %req.uri(), "request");
    let token = bearer(req.headers());
    let identity = match &*client_cert {
        ClientCert::User { user, groups } => Some(shared.auth.for_certificate(user, groups)),
        ClientCert::Absent | ClientCert::Rejected(_) => None,
    }
    .or_else(|| token.as_deref().and_then(|t| shared.auth.authenticate(t)));
    shared
        .latency
        .wait(identity.as_ref().map(|i| i.name.as_str()))
        .await;
    if is_health(&path) {
        return respond::text(200, "ok");
    }
    let Some(identity) = identity else {
        // A credential that fails makes the request unauthorized, never anonymous.
        let anonymous = token.is_none() && !matches!(*client_cert, ClientCert::Rejected(_));
        if let ClientCert::Rejected(reason) = &*client_cert {
            tracing::debug!(%reason, "client certificate not accepted");
        }
        if anonymous && path == "/version" {
            return respond::json(200, &discovery::version());
        }
        return respond::error(&ApiError::unauthorized());
    };
    let write = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
    .then(|| {
        (
            std::time::SystemTime::now(),
            req.method().to_string(),
            req.headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            req.uri().query().unwrap_or_default().to_string(),
        )
    });
    let response = route(&shared, &identity, req).await;
    if let Some((at, method, user_agent, query)) = write {
        shared.writes.push(WriteRecord {
            at,
            identity: identity.name.clone(),
            user: identity.user.clone(),
            user_agent,
            method,
            path,
            query,
            code: response.status().as_u16(),
        });
    }
    response
}

fn decode_segment(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

async fn route(
    shared: &Arc<Shared>,
    identity: &Identity,
    req: Request<Incoming>,
) -> Response<Body> {
    let segments: Vec<String> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode_segment)
        .collect();
    let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
    let is_resource = matches!(parts.as_slice(), ["api", _, _, ..] | ["apis", _, _, _, ..]);
    if !is_resource && req.method() != Method::GET {
        return respond::error(&ApiError::method_not_allowed());
    }
    let accept = respond::accept(req.headers());
    let registry = || shared.store.read().registry.clone();
    match parts.as_slice() {
        ["version"] => respond::json(200, &discovery::version()),
        ["api"] => match discovery::aggregated_version(&accept) {
            Some(v) => respond::json_typed(
                200,
                &discovery::aggregated_content_type(v),
                &discovery::aggregated(&registry(), true, v),
            ),
            None => respond::json(200, &discovery::api_versions(&shared.addr.to_string())),
        },
        ["apis"] => match discovery::aggregated_version(&accept) {
            Some(v) => respond::json_typed(
                200,
                &discovery::aggregated_content_type(v),
                &discovery::aggregated(&registry(), false, v),
            ),
            None => respond::json(200, &discovery::group_list(&registry())),
        },
        ["apis", group] => match discovery::group(&registry(), group) {
            Some(g) => respond::json(200, &g),
            None => respond::error(&ApiError::unknown_resource()),
        },
        ["api", version] => match discovery::resource_list(&registry(), "", version) {
            Some(l) => respond::json(200, &l),
            None => respond::error(&ApiError::unknown_resource()),
        },
        ["apis", group, version] => match discovery::resource_list(&registry(), group, version) {
            Some(l) => respond::json(200, &l),
            None => respond::error(&ApiError::unknown_resource()),
        },
        ["openapi", "v3"] => respond::json(200, &discovery::openapi_index(&registry())),
        ["openapi", "v3", "api", version] => openapi(shared, "", version),
        ["openapi", "v3", "apis", group, version] => openapi(shared, group, version),
        ["api", version, rest @ ..] => rest::handle(shared, identity, req, "", version, rest).await,
        ["apis", group, version, rest @ ..] => {
            rest::handle(shared, identity, req, group, version, rest).await
        }
        _ => respond::error(&ApiError::unknown_resource()),
    }
}

fn openapi(shared: &Shared, group: &str, version: &str) -> Response<Body> {
    match discovery::openapi_doc(&shared.store.read().registry, group, version) {
        Some(doc) => respond::json(200, &doc),
        None => respond::error(&ApiError::unknown_resource()),
    }
}
