//! The fault admin API under `/_fault` (no authentication: this is a loopback test fixture).

use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::faults::{ErrorFault, FaultScope};
use crate::respond::{self, Body, Query};
use crate::shared::Shared;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScopeBody {
    identity: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LatencyBody {
    identity: Option<String>,
    ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ErrorsBody {
    identity: Option<String>,
    rate: f64,
    #[serde(default)]
    codes: Option<Vec<u16>>,
    #[serde(default)]
    retry_after_seconds: Option<u64>,
    #[serde(default)]
    seed: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CloseBody {
    identity: Option<String>,
    every_ms: Option<u64>,
}

fn bad(message: impl Into<String>) -> Response<Body> {
    respond::json(400, &json!({"error": message.into()}))
}

/// Parses a JSON body; an empty body counts as `{}`.
fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| format!("invalid body: {e}"))
}

fn scope(shared: &Shared, identity: Option<String>) -> Result<FaultScope, String> {
    match identity {
        None => Ok(FaultScope::Global),
        Some(name) if shared.auth.by_name(&name).is_some() => Ok(FaultScope::Identity(name)),
        Some(name) => Err(format!("unknown identity {name:?}")),
    }
}

pub(crate) async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = Query::parse(req.uri().query());
    let bytes = match respond::read_body(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return bad(e.message),
    };
    match run(shared, &method, &path, &query, &bytes) {
        Ok(()) => respond::json(
            200,
            &serde_json::to_value(shared.faults.status()).unwrap_or_default(),
        ),
        Err(Problem::Bad(m)) => bad(m),
        Err(Problem::NotFound) => respond::json(
            404,
            &json!({"error": format!("no fault endpoint {method} {path}")}),
        ),
    }
}

enum Problem {
    Bad(String),
    NotFound,
}

impl From<String> for Problem {
    fn from(m: String) -> Self {
        Self::Bad(m)
    }
}

fn run(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &Query,
    bytes: &[u8],
) -> Result<(), Problem> {
    let faults = &shared.faults;
    let query_scope = || -> Result<FaultScope, String> {
        match query.get("scope") {
            Some("global") => Ok(FaultScope::Global),
            _ => scope(shared, query.get("identity").map(String::from)),
        }
    };
    match (method.as_str(), path) {
        ("GET", "/_fault") => {}
        ("DELETE", "/_fault") => {
            if query.get("identity").is_some() || query.get("scope").is_some() {
                faults.clear(&query_scope()?);
            } else {
                faults.clear_all();
            }
        }
        ("POST", "/_fault/latency") => {
            let b: LatencyBody = parse(bytes)?;
            faults.set_latency(scope(shared, b.identity)?, Duration::from_millis(b.ms));
        }
        ("DELETE", "/_fault/latency") => faults.clear_latency(&query_scope()?),
        ("POST", "/_fault/errors") => {
            let b: ErrorsBody = parse(bytes)?;
            let mut fault = ErrorFault::new(b.rate, b.codes.unwrap_or_else(|| vec![503]));
            if let Some(s) = b.retry_after_seconds {
                fault = fault.retry_after(s);
            }
            if let Some(seed) = b.seed {
                fault = fault.seed(seed);
            }
            faults
                .set_errors(scope(shared, b.identity)?, fault)
                .map_err(|e| e.to_string())?;
        }
        ("DELETE", "/_fault/errors") => faults.clear_errors(&query_scope()?),
        ("POST", "/_fault/close-watches") => {
            let b: CloseBody = parse(bytes)?;
            let s = scope(shared, b.identity)?;
            if let Some(ms) = b.every_ms {
                faults
                    .close_watches_every(s.clone(), Duration::from_millis(ms))
                    .map_err(|e| e.to_string())?;
            }
            faults.close_watches(s);
        }
        ("DELETE", "/_fault/close-watches") => faults.clear_close_watches(&query_scope()?),
        ("POST", "/_fault/partition") => {
            let b: ScopeBody = parse(bytes)?;
            faults.partition(scope(shared, b.identity)?);
        }
        ("DELETE", "/_fault/partition") => faults.heal(&query_scope()?),
        ("POST", "/_fault/pause") => faults.pause(),
        ("DELETE", "/_fault/pause") => faults.resume(),
        ("DELETE", "/_fault/counters") => faults.reset_counters(),
        _ => return Err(Problem::NotFound),
    }
    Ok(())
}
