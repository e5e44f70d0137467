//! Response bodies, request bodies and query strings.

use std::collections::HashMap;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::registry::ResourceDef;

/// Response body: whole, or streamed (watches) where an `Err` aborts the connection.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// Largest request body accepted, as the real server's 3 MiB limit.
const MAX_BODY: usize = 3 * 1024 * 1024;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn build(status: u16, content_type: &str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

pub fn json_bytes(status: u16, bytes: Bytes) -> Response<Body> {
    build(status, "application/json", full(bytes))
}

pub fn json_typed(status: u16, content_type: &str, value: &Value) -> Response<Body> {
    build(
        status,
        content_type,
        full(serde_json::to_vec(value).unwrap_or_default()),
    )
}

pub fn json(status: u16, value: &Value) -> Response<Body> {
    json_typed(status, "application/json", value)
}

pub fn text(status: u16, body: &'static str) -> Response<Body> {
    build(
        status,
        "text/plain; charset=utf-8",
        full(Bytes::from_static(body.as_bytes())),
    )
}

pub fn error(e: &ApiError) -> Response<Body> {
    json(e.code, &e.to_status())
}

/// A chunked JSON stream fed by `rx`; an `Err` item aborts the connection mid-stream.
pub fn streaming(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response<Body> {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item.map(Frame::data), rx))
    });
    let mut r = build(
        200,
        "application/json",
        StreamBody::new(stream).boxed_unsync(),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    r
}

pub async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::request_too_large()),
        Err(e) => Err(ApiError::bad_request(format!(
            "cannot read request body: {e}"
        ))),
    }
}

/// Parses a JSON or YAML document into a value.
pub fn parse_document(bytes: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => Ok(v),
        Err(json_err) => match std::str::from_utf8(bytes) {
            Ok(text) if !text.trim_start().starts_with('{') => {
                serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
            }
            _ => Err(json_err.to_string()),
        },
    }
}

/// Decodes a request body into an object of `def`'s kind.
pub fn decode_object(bytes: &[u8], def: &ResourceDef) -> Result<Value, ApiError> {
    let v = parse_document(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {e}",
            def.kind
        ))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): expected an object",
            def.kind
        )));
    }
    Ok(v)
}

/// The media type of the request without parameters.
pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

pub fn accept(headers: &HeaderMap) -> String {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Query parameters; the last occurrence wins, except `dryRun` which may repeat.
#[derive(Debug, Default)]
pub struct Query {
    params: HashMap<String, String>,
    dry_run: Vec<String>,
}

impl Query {
    pub fn parse(query: Option<&str>) -> Self {
        let mut q = Self::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if k.is_empty() {
                continue;
            }
            if k == "dryRun" {
                q.dry_run.push(v.to_string());
            }
            q.params.insert(k.into_owned(), v.into_owned());
        }
        q
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.params
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    /// `dryRun=All` means do not persist; any other value is rejected like the real server.
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        let mut any = false;
        for v in &self.dry_run {
            if v == "All" {
                any = true;
            } else if !v.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Unsupported value: {v:?}: supported values: \"All\""
                )));
            }
        }
        Ok(any)
    }
}
