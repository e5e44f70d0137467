//! Links between one identity's clients and a real kube-apiserver: an HTTPS proxy on a loopback
//! port of its own per identity, through which [`Faults`] reach the identity's requests.
//!
//! A link ends TLS with the server's own serving certificate (it names 127.0.0.1, and the node
//! network's address where pods run, whatever the port, so the identity's kubeconfig trusts it as it trusts the server) and forwards each
//! request over a TLS connection of its own to kube-apiserver, with the identity's own
//! credentials: a bearer token travels in the request's headers untouched, and a client
//! certificate the client presents is presented again upstream, from the copy the harness keeps
//! of every certificate it issued. One upstream connection serves one client connection, so a
//! partition drops both and a watch is one stream end to end.
//!
//! Per request, the link waits out a pause and the latency in force, then drops the connection
//! (a partition), answers an injected error with a Kubernetes Status (and `Retry-After`), or
//! forwards. Answers stream back as they come; every frame waits out a pause, and a watch's
//! stream ends cleanly when its scope's watches are closed. HTTP/1.1 only, and no upgrades
//! (`kubectl exec` and `port-forward` go through `admin`, which has no link).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::HarnessError;
use crate::faults::{Faults, Signal, Verdict};
use crate::tls::IssuedCertificates;
use shardwise_e2e_testkit::{ClientCertificate, RequestClientCert};

type Body = BoxBody<Bytes, hyper::Error>;

/// The certificates a server's links work with, PEM.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinkCertificates<'a> {
    /// The server's serving certificate and key, which the links serve too.
    pub serving_cert: &'a str,
    pub serving_key: &'a str,
    /// The CA that signed it: what links trust upstream.
    pub serving_ca: &'a str,
}

fn tls_error(what: &str) -> impl FnOnce(String) -> HarnessError + '_ {
    move |reason| HarnessError::Io {
        path: what.into(),
        source: std::io::Error::other(reason),
    }
}

fn certificate(pem: &str) -> Result<CertificateDer<'static>, HarnessError> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| tls_error("certificate")(e.to_string()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What every link of one server shares.
struct Shared {
    upstream: SocketAddr,
    faults: Arc<Faults>,
    acceptor: TlsAcceptor,
    /// Upstream TLS without a client certificate (a token's requests).
    anonymous: Arc<rustls::ClientConfig>,
    /// Upstream TLS per client certificate presented so far, by the certificate's DER.
    certified: Mutex<BTreeMap<Vec<u8>, Arc<rustls::ClientConfig>>>,
    issued: IssuedCertificates,
    roots: Arc<rustls::RootCertStore>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn client_config(
        roots: &Arc<rustls::RootCertStore>,
        certificate: Option<&ClientCertificate>,
    ) -> Result<rustls::ClientConfig, HarnessError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("link client TLS")(e.to_string()))?
            .with_root_certificates(roots.clone());
        let mut config = match certificate {
            None => builder.with_no_client_auth(),
            Some(c) => {
                let key = PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes())
                    .map_err(|e| tls_error("client key")(e.to_string()))?;
                builder
                    .with_client_auth_cert(vec![self::certificate(&c.cert_pem)?], key)
                    .map_err(|e| tls_error("link client TLS")(e.to_string()))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The upstream TLS for a client that presented `presented` (if anything): with the same
    /// certificate when the harness issued it, else with none (the server then sees an
    /// anonymous request, as it would if the client's certificate said nothing).
    fn upstream_tls(&self, presented: Option<&CertificateDer<'_>>) -> Arc<rustls::ClientConfig> {
        let Some(der) = presented else {
            return self.anonymous.clone();
        };
        let mut certified = self.certified.lock();
        if let Some(config) = certified.get(der.as_ref()) {
            return config.clone();
        }
        let built = self
            .issued
            .get(der.as_ref())
            .and_then(|issued| Self::client_config(&self.roots, Some(&issued)).ok());
        match built {
            Some(config) => certified
                .entry(der.as_ref().to_vec())
                .or_insert(Arc::new(config))
                .clone(),
            None => self.anonymous.clone(),
        }
    }
}

/// The links of one server, served by a runtime on a thread of their own (so they run whatever
/// the test's runtime does) that stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Links {
    opener: LinkOpener,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Opens the links of one server (shared with whoever must open one later, a node agent for
/// each pod it starts); the links stop with their [`Links`].
#[derive(Clone, Debug)]
pub(crate) struct LinkOpener {
    shared: Arc<Shared>,
    /// The address every link listens on: loopback, or the node network's gateway where pods
    /// must reach the server too.
    address: std::net::IpAddr,
    ports: Arc<Mutex<BTreeMap<String, u16>>>,
    runtime: tokio::runtime::Handle,
}

impl Links {
    pub(crate) fn new(
        upstream: SocketAddr,
        address: std::net::IpAddr,
        certificates: LinkCertificates<'_>,
        issued: IssuedCertificates,
    ) -> Result<Self, HarnessError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("control-plane-links")
            .enable_all()
            .build()
            .map_err(|source| HarnessError::Io {
                path: "links runtime".into(),
                source,
            })?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(certificate(certificates.serving_ca)?)
            .map_err(|e| tls_error("serving CA")(e.to_string()))?;
        let roots = Arc::new(roots);
        let verifier = Arc::new(RequestClientCert::new(provider()));
        let key = PrivateKeyDer::from_pem_slice(certificates.serving_key.as_bytes())
            .map_err(|e| tls_error("serving key")(e.to_string()))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("link server TLS")(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![certificate(certificates.serving_cert)?], key)
            .map_err(|e| tls_error("link server TLS")(e.to_string()))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let faults = Arc::new(Faults::new(runtime.handle().clone()));
        Ok(Self {
            opener: LinkOpener {
                runtime: runtime.handle().clone(),
                shared: Arc::new(Shared {
                    upstream,
                    faults,
                    acceptor: TlsAcceptor::from(Arc::new(server)),
                    anonymous: Arc::new(Shared::client_config(&roots, None)?),
                    certified: Mutex::new(BTreeMap::new()),
                    issued,
                    roots,
                }),
                address,
                ports: Arc::new(Mutex::new(BTreeMap::new())),
            },
            runtime: Some(runtime),
        })
    }

    /// The address the links listen on.
    pub(crate) fn address(&self) -> std::net::IpAddr {
        self.opener.address
    }

    /// What opens links later, from anywhere.
    pub(crate) fn opener(&self) -> LinkOpener {
        self.opener.clone()
    }

    /// The faults the links inject.
    pub(crate) fn faults(&self) -> &Faults {
        &self.opener.shared.faults
    }

    /// Lets every link of the environment present `certificate` upstream for a client that
    /// presents it to them.
    pub(crate) fn register(&self, certificate: &ClientCertificate) -> Result<(), HarnessError> {
        let der = self::certificate(&certificate.cert_pem)?;
        self.opener
            .shared
            .issued
            .insert(der.as_ref().to_vec(), certificate.clone());
        Ok(())
    }

    /// The port of `identity`'s link, opened on first use.
    pub(crate) fn port(&self, identity: &str) -> Result<u16, HarnessError> {
        self.opener.port(identity)
    }
}

impl LinkOpener {
    /// The address the links listen on.
    pub(crate) fn address(&self) -> std::net::IpAddr {
        self.address
    }

    /// The port of `identity`'s link, opened on first use.
    pub(crate) fn port(&self, identity: &str) -> Result<u16, HarnessError> {
        let mut ports = self.ports.lock();
        if let Some(&port) = ports.get(identity) {
            return Ok(port);
        }
        let runtime = &self.runtime;
        let bind_error = |source| HarnessError::Io {
            path: format!("{}:0", self.address).into(),
            source,
        };
        let listener = std::net::TcpListener::bind((self.address, 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(bind_error)?;
        let port = listener.local_addr().map_err(bind_error)?.port();
        let _guard = runtime.enter();
        let listener = TcpListener::from_std(listener).map_err(bind_error)?;
        runtime.spawn(serve(listener, identity.to_string(), self.shared.clone()));
        ports.insert(identity.to_string(), port);
        Ok(port)
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Accepts `identity`'s connections; while it is partitioned, drops them unanswered.
async fn serve(listener: TcpListener, identity: String, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of file descriptors, say: give the process a moment rather than spin.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        if shared.faults.partitioned(&identity) {
            shared.faults.count_refused();
            drop(client);
            continue;
        }
        let _ = client.set_nodelay(true);
        tokio::spawn(connection(client, identity.clone(), shared.clone()));
    }
}

/// Waits for a signal of `kind` that reaches `identity`; never, once the sender is gone.
async fn signalled(
    signals: &mut broadcast::Receiver<Signal>,
    identity: &str,
    kind: fn(&Signal) -> bool,
) {
    loop {
        match signals.recv().await {
            Ok(signal) if kind(&signal) && signal.applies_to(identity) => return,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// A connection to kube-apiserver, closed when dropped.
struct Upstream {
    sender: SendRequest<Incoming>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Upstream {
    async fn open(shared: &Shared, tls: Arc<rustls::ClientConfig>) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(shared.upstream).await?;
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(tls)
            .connect(ServerName::from(shared.upstream.ip()), tcp)
            .await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(std::io::Error::other)?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, driver })
    }

    async fn send(&mut self, request: Request<Incoming>) -> Result<Response<Incoming>, Dropped> {
        self.sender.ready().await?;
        Ok(self.sender.send_request(request).await?)
    }
}

/// What one client connection's requests go upstream with.
struct Route {
    identity: String,
    shared: Arc<Shared>,
    tls: Arc<rustls::ClientConfig>,
    /// The upstream connection of requests other than watches, opened when first needed and
    /// again after it closed.
    upstream: tokio::sync::Mutex<Option<Upstream>>,
}

/// One client connection, until it ends or a partition cuts it (and with it every upstream
/// connection it opened).
async fn connection(client: TcpStream, identity: String, shared: Arc<Shared>) {
    let mut signals = shared.faults.subscribe();
    let served = async {
        let Ok(client) = shared.acceptor.accept(client).await else {
            return;
        };
        let presented = client
            .get_ref()
            .1
            .peer_certificates()
            .and_then(<[_]>::first)
            .cloned();
        let route = Arc::new(Route {
            tls: shared.upstream_tls(presented.as_ref()),
            identity: identity.clone(),
            shared: shared.clone(),
            upstream: tokio::sync::Mutex::new(None),
        });
        let service = hyper::service::service_fn(|request| forward(request, route.clone()));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(client), service)
            .await;
    };
    tokio::select! {
        () = served => {}
        () = signalled(&mut signals, &identity, |s| matches!(s, Signal::Cut(_))) => {
            shared.faults.count_refused();
        }
    }
}

/// A request the link drops with its connection.
#[derive(Debug, thiserror::Error)]
enum Dropped {
    #[error("partitioned")]
    Partitioned,
    #[error(transparent)]
    Connect(#[from] std::io::Error),
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
}

/// Applies the faults to one request, then answers it or forwards it. A watch gets an upstream
/// connection of its own, which ends with it: a watch the link closes leaves its connection
/// with an answer half read, which no other request can follow.
async fn forward(request: Request<Incoming>, route: Arc<Route>) -> Result<Response<Body>, Dropped> {
    let faults = &route.shared.faults;
    match faults.admit(&route.identity).await {
        Verdict::Forward => {}
        Verdict::Refuse => return Err(Dropped::Partitioned),
        Verdict::Fail { code, retry_after } => return Ok(injected(code, retry_after)),
    }
    let (response, watch) = if is_watch(request.uri()) {
        let mut upstream = Upstream::open(&route.shared, route.tls.clone()).await?;
        (upstream.send(request).await?, Some(upstream))
    } else {
        let mut upstream = route.upstream.lock().await;
        let reusable = match upstream.as_mut() {
            Some(open) => open.sender.ready().await.is_ok(),
            None => false,
        };
        let open = match upstream.take() {
            Some(open) if reusable => open,
            _ => Upstream::open(&route.shared, route.tls.clone()).await?,
        };
        let answer = upstream.insert(open).send(request).await?;
        (answer, None)
    };
    let (parts, body) = response.into_parts();
    Ok(Response::from_parts(
        parts,
        relay(body, route.identity.clone(), faults.clone(), watch),
    ))
}

/// Whether a request is a watch: `?watch=true` (or `1`), or the old `/watch/` paths.
fn is_watch(uri: &http::Uri) -> bool {
    uri.path().contains("/watch/")
        || form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
}

/// An answer's body, frame by frame: each waits out a pause, and a watch's (which comes with
/// its own upstream connection, kept as long as the body) ends when its scope's watches are
/// closed.
fn relay(body: Incoming, identity: String, faults: Arc<Faults>, watch: Option<Upstream>) -> Body {
    struct Relay {
        body: Incoming,
        identity: String,
        paused: tokio::sync::watch::Receiver<bool>,
        closes: Option<(broadcast::Receiver<Signal>, Upstream)>,
        faults: Arc<Faults>,
    }
    let relay = Relay {
        body,
        paused: faults.paused(),
        closes: watch.map(|upstream| (faults.subscribe(), upstream)),
        identity,
        faults,
    };
    let frames = futures::stream::unfold(relay, |mut r| async move {
        let Relay {
            body,
            identity,
            closes,
            ..
        } = &mut r;
        let closed = async {
            match closes {
                Some((closes, _)) => {
                    signalled(closes, identity, |s| matches!(s, Signal::Close(_))).await
                }
                None => std::future::pending().await,
            }
        };
        let frame = tokio::select! {
            frame = body.frame() => frame?,
            () = closed => {
                r.faults.count_watch_closed();
                return None;
            }
        };
        // Resumed, or the faults are gone with their cluster: either way, go on.
        let _ = r.paused.wait_for(|paused| !*paused).await;
        Some((frame, r))
    });
    StreamBody::new(frames).boxed()
}

/// The Status kube-apiserver answers with that code.
fn injected(code: u16, retry_after: u64) -> Response<Body> {
    let reason = match code {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    let mut status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("injected fault: {code}"), "reason": reason, "code": code,
    });
    let retry = code != 500;
    if retry {
        status["details"] = serde_json::json!({"retryAfterSeconds": retry_after});
    }
    let mut response = Response::new(
        Full::new(Bytes::from(status.to_string()))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    if retry {
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(retry_after),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::faults::ErrorFault;
    use shardwise_e2e_testkit::CertificateAuthority;
    use shardwise_e2e_testkit::FaultScope;

    /// A kube-apiserver stand-in: it answers every request with what it saw (method, URI,
    /// bearer token, client certificate), and a watch with an event every 20 ms until the
    /// client goes.
    struct Upstream {
        addr: SocketAddr,
        requests: Arc<std::sync::atomic::AtomicU32>,
    }

    struct Fixture {
        upstream: Upstream,
        links: Links,
        serving_ca: String,
        client: ClientCertificate,
    }

    fn fixture() -> Fixture {
        let serving_ca = CertificateAuthority::generate("serving-ca").unwrap();
        let serving = serving_ca.serving_certificate("upstream").unwrap();
        let client_ca = CertificateAuthority::generate("client-ca").unwrap();
        let client = client_ca
            .client_certificate("ops", "ops", &["system:masters".to_string()])
            .unwrap();
        let upstream = upstream(&serving, &client_ca.pem());
        let links = Links::new(
            upstream.addr,
            [127, 0, 0, 1].into(),
            LinkCertificates {
                serving_cert: &serving.cert_pem,
                serving_key: &serving.key_pem,
                serving_ca: &serving_ca.pem(),
            },
            IssuedCertificates::default(),
        )
        .unwrap();
        links.register(&client).unwrap();
        Fixture {
            upstream,
            links,
            serving_ca: serving_ca.pem(),
            client,
        }
    }

    fn upstream(serving: &ClientCertificate, client_ca: &str) -> Upstream {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(certificate(client_ca).unwrap()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![certificate(&serving.cert_pem).unwrap()],
                PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let presented = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(<[_]>::first)
                        .map(|c| c.as_ref().len());
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move { Ok::<_, Infallible>(echo(&request, presented)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Upstream { addr, requests }
    }

    fn echo(request: &Request<Incoming>, presented: Option<usize>) -> Response<Body> {
        let seen = serde_json::json!({
            "method": request.method().as_str(),
            "uri": request.uri().to_string(),
            "token": request.headers().get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok()),
            "certificate": presented,
        })
        .to_string();
        if !is_watch(request.uri()) {
            return Response::new(Full::new(Bytes::from(seen)).map_err(|n| match n {}).boxed());
        }
        let events = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let event = Frame::data(Bytes::from(format!("event {n}\n")));
            Some((Ok::<_, hyper::Error>(event), n + 1))
        });
        Response::new(StreamBody::new(events).boxed())
    }

    use hyper::body::Frame;

    /// A client of `identity`'s link: TLS trusting the serving CA, with a client certificate
    /// or not.
    async fn connect(
        f: &Fixture,
        identity: &str,
        certificate: Option<&ClientCertificate>,
    ) -> std::io::Result<SendRequest<Full<Bytes>>> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self::certificate(&f.serving_ca).unwrap())
            .unwrap();
        let config = Shared::client_config(&Arc::new(roots), certificate).unwrap();
        let port = f.links.port(identity).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let tls = TlsConnector::from(Arc::new(config))
            .connect(
                ServerName::from(std::net::IpAddr::from([127, 0, 0, 1])),
                tcp,
            )
            .await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(connection);
        Ok(sender)
    }

    fn get(uri: &str, token: Option<&str>) -> Request<Full<Bytes>> {
        let mut request = Request::get(uri).header(http::header::HOST, "127.0.0.1");
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        request.body(Full::new(Bytes::new())).unwrap()
    }

    async fn text(response: Response<Incoming>) -> String {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    fn requests(f: &Fixture) -> u32 {
        f.upstream
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_request_is_forwarded_with_the_identitys_own_credentials() {
        let f = fixture();
        let mut by_token = connect(&f, "replica", None).await.unwrap();
        let answer = by_token
            .send_request(get(
                "/api/v1/namespaces/a/configmaps?limit=5",
                Some("t0k3n"),
            ))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let seen: serde_json::Value = serde_json::from_str(&text(answer).await).unwrap();
        assert_eq!(seen["method"], "GET");
        assert_eq!(seen["uri"], "/api/v1/namespaces/a/configmaps?limit=5");
        assert_eq!(seen["token"], "Bearer t0k3n");
        assert_eq!(seen["certificate"], serde_json::Value::Null);

        // The certificate the client presents is the one the link presents upstream.
        let mut by_certificate = connect(&f, "ops", Some(&f.client)).await.unwrap();
        let answer = by_certificate
            .send_request(get("/api", None))
            .await
            .unwrap();
        let seen: serde_json::Value = serde_json::from_str(&text(answer).await).unwrap();
        let der = certificate(&f.client.cert_pem).unwrap();
        assert_eq!(seen["certificate"], der.as_ref().len());
        assert_eq!(seen["token"], serde_json::Value::Null);

        // A certificate the harness never issued cannot be presented again: the request goes
        // on without one.
        let stranger = CertificateAuthority::generate("elsewhere")
            .unwrap()
            .client_certificate("eve", "eve", &[])
            .unwrap();
        let mut by_stranger = connect(&f, "eve", Some(&stranger)).await.unwrap();
        let answer = by_stranger.send_request(get("/api", None)).await.unwrap();
        let seen: serde_json::Value = serde_json::from_str(&text(answer).await).unwrap();
        assert_eq!(seen["certificate"], serde_json::Value::Null);
        assert_eq!(requests(&f), 3);
    }

    #[tokio::test]
    async fn an_injected_error_is_a_status_with_retry_after_and_never_reaches_the_server() {
        let f = fixture();
        let faults = f.links.faults();
        let scope = FaultScope::identity("replica");
        faults
            .set_errors(scope.clone(), ErrorFault::new(1.0, [429]).retry_after(7))
            .unwrap();
        let mut client = connect(&f, "replica", None).await.unwrap();
        let answer = client.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[http::header::RETRY_AFTER], "7");
        let status: serde_json::Value = serde_json::from_str(&text(answer).await).unwrap();
        assert_eq!(
            (&status["kind"], &status["code"], &status["reason"]),
            (&"Status".into(), &429.into(), &"TooManyRequests".into())
        );
        assert_eq!(status["details"]["retryAfterSeconds"], 7);

        faults
            .set_errors(scope.clone(), ErrorFault::new(1.0, [500]))
            .unwrap();
        let answer = client.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(answer.headers().get(http::header::RETRY_AFTER).is_none());
        text(answer).await;
        assert_eq!(requests(&f), 0);
        // Another identity is not in scope; the same connection goes on once cleared.
        let mut other = connect(&f, "other", None).await.unwrap();
        let answer = other.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        faults.clear(&scope);
        let answer = client.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let counters = faults.counters();
        assert_eq!((counters.injected_429, counters.injected_500), (1, 1));
    }

    #[tokio::test]
    async fn a_partition_drops_open_connections_and_refuses_new_ones_until_healed() {
        let f = fixture();
        let faults = f.links.faults();
        let mut client = connect(&f, "replica", None).await.unwrap();
        let watch = client
            .send_request(get("/api/v1/configmaps?watch=true", None))
            .await
            .unwrap();
        let mut events = watch.into_body();
        assert!(events.frame().await.unwrap().unwrap().is_data());
        faults.partition(FaultScope::identity("replica"));
        let cut = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match events.frame().await {
                    Some(Ok(_)) => continue,
                    ended => return ended.map(|e| e.map(|_| ())),
                }
            }
        })
        .await
        .expect("the watch goes on through a partition");
        assert!(!matches!(cut, Some(Ok(()))), "the watch ended with {cut:?}");
        let refused = match connect(&f, "replica", None).await {
            Err(_) => true,
            Ok(mut c) => c.send_request(get("/api", None)).await.is_err(),
        };
        assert!(refused, "a new connection was served during the partition");
        faults.heal(&FaultScope::identity("replica"));
        let mut client = connect(&f, "replica", None).await.unwrap();
        let answer = client.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert!(faults.counters().refused_connections >= 2);
    }

    #[tokio::test]
    async fn a_closed_watch_ends_cleanly_and_other_answers_are_left_alone() {
        let f = fixture();
        let faults = f.links.faults();
        let mut client = connect(&f, "replica", None).await.unwrap();
        let watch = client
            .send_request(get("/api/v1/configmaps?watch=1", None))
            .await
            .unwrap();
        let mut events = watch.into_body();
        assert!(events.frame().await.unwrap().unwrap().is_data());
        faults.close_watches(FaultScope::identity("other"));
        assert!(events.frame().await.unwrap().unwrap().is_data());
        faults.close_watches(FaultScope::identity("replica"));
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(frame) = events.frame().await {
                frame.unwrap();
            }
        })
        .await;
        assert!(ended.is_ok(), "the watch was not closed");
        assert_eq!(faults.counters().watches_closed, 1);
        // The connection carries on.
        let answer = client.send_request(get("/api", None)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_pause_holds_requests_and_watch_events_until_resumed() {
        let f = fixture();
        let faults = f.links.faults();
        let mut watcher = connect(&f, "watcher", None).await.unwrap();
        let watch = watcher
            .send_request(get("/api/v1/configmaps?watch=true", None))
            .await
            .unwrap();
        let mut events = watch.into_body();
        assert!(events.frame().await.unwrap().unwrap().is_data());
        let mut client = connect(&f, "replica", None).await.unwrap();
        faults.pause();
        let request = tokio::spawn(client.send_request(get("/api", None)));
        // Whatever the upstream sent before the pause may be in flight; after it, nothing.
        let held = tokio::time::timeout(Duration::from_millis(500), async {
            while events.frame().await.is_some() {}
        })
        .await;
        assert!(held.is_err(), "the watch ended during the pause");
        let before = requests(&f);
        let quiet = tokio::time::timeout(Duration::from_millis(300), events.frame()).await;
        assert!(quiet.is_err(), "a watch event went through the pause");
        assert!(!request.is_finished(), "a request went through the pause");
        assert_eq!(requests(&f), before);
        faults.resume();
        let answer = request.await.unwrap().unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert!(events.frame().await.unwrap().unwrap().is_data());
        assert_eq!(faults.counters().paused_requests, 1);
    }
}
