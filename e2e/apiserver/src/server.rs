//! Server configuration, startup and shutdown, and kubeconfig generation.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use shardwise_e2e_testkit::{ClientCertificate, Credential, kubeconfig_yaml};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::apply::{Scope, Writer};
use crate::auth::{Authenticator, Identity};
use crate::latency::Latency;
use crate::lifecycle::{self, WriteCtx};
use crate::registry::GroupResource;
use crate::shared::Shared;
use crate::store::Store;
use crate::tls::{self, CertificateError, ClientCert, TlsError};
use crate::writes::WriteLog;
use crate::{object, service};

/// How to run a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Cluster name in generated kubeconfigs.
    pub name: String,
    /// Listen address; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Identities and their tokens; the first admin is the kubeconfig's current context.
    pub identities: Vec<Identity>,
    /// Enforce RBAC for identities outside `system:masters`.
    pub enforce_rbac: bool,
    /// Events kept per resource for watch resumption; older versions get 410 Gone.
    pub watch_history: usize,
    /// Interval between BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Events queued per watcher before it counts as too slow and is closed.
    pub watch_queue: usize,
    /// Watch duration when the client sets no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// How long a deleted namespace stays Terminating before its contents and itself go.
    pub namespace_deletion_delay: Duration,
    /// Serve HTTPS with a generated CA (in the kubeconfig). kubectl sends tokens only over
    /// TLS, so plain HTTP is for clients that do not need to authenticate that way.
    pub tls: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            name: "shardwise-test".into(),
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            identities: vec![Identity::admin("admin")],
            enforce_rbac: false,
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(5),
            watch_queue: 4096,
            default_watch_timeout: Duration::from_secs(1800),
            tls: true,
            namespace_deletion_delay: Duration::from_millis(100),
        }
    }
}

impl ServerConfig {
    /// The defaults, with this cluster name.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Listens on this port; 0 picks a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.bind.set_port(port);
        self
    }

    /// Adds an identity (replacing one with the same name).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identities.retain(|i| i.name != identity.name);
        self.identities.push(identity);
        self
    }

    /// Whether RBAC is enforced for identities outside `system:masters`.
    pub fn rbac(mut self, enforce: bool) -> Self {
        self.enforce_rbac = enforce;
        self
    }

    /// Events kept per resource for watch resumption.
    pub fn watch_history(mut self, events: usize) -> Self {
        self.watch_history = events;
        self
    }

    /// Interval between BOOKMARK events.
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    /// Serve HTTPS (the default) or plain HTTP.
    pub fn tls(mut self, enabled: bool) -> Self {
        self.tls = enabled;
        self
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The server cannot listen on the address.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: std::io::Error,
    },
    /// The thread or runtime of a detached server could not be created.
    #[error("cannot start the server runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A detached server's thread ended without reporting whether the server started.
    #[error("the server thread stopped before the server started")]
    ThreadGone,
    /// The certificates or the TLS configuration could not be made.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// A running server. Dropping it stops the server.
#[derive(Debug)]
pub struct ApiServer {
    shared: Arc<Shared>,
    name: String,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Starts a server on the current tokio runtime.
    pub async fn start(config: ServerConfig) -> Result<Self, StartError> {
        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.bind,
            source,
        })?;
        let tls = if config.tls {
            Some(tls::generate()?)
        } else {
            None
        };
        let auth = Authenticator::default();
        for identity in &config.identities {
            auth.add(identity.clone());
        }
        let shared = Arc::new(Shared {
            store: Store::new(config.watch_history, config.watch_queue),
            auth,
            latency: Latency::default(),
            enforce_rbac: AtomicBool::new(config.enforce_rbac),
            bookmark_interval: config.bookmark_interval,
            default_watch_timeout: config.default_watch_timeout,
            addr,
            tls,
            namespace_deletion_delay: config.namespace_deletion_delay,
            writes: WriteLog::default(),
        });
        bootstrap(&shared);
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(accept_loop(listener, Arc::clone(&shared), stopped));
        tracing::info!(%addr, name = %config.name, "test API server listening");
        Ok(Self {
            shared,
            name: config.name,
            stop: Some(stop),
            thread: None,
        })
    }

    /// Starts a server on its own thread and runtime, so it keeps serving while the caller
    /// blocks (for example on a subprocess).
    pub fn start_detached(config: ServerConfig) -> Result<Self, StartError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("apiserver-{}", config.name))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(StartError::Runtime(e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Self::start(config).await {
                        Ok(mut server) => {
                            let inner_stop = server.stop.take();
                            let (outer_stop, outer_stopped) = oneshot::channel::<()>();
                            let _ = tx.send(Ok((
                                Arc::clone(&server.shared),
                                server.name.clone(),
                                outer_stop,
                            )));
                            let _ = outer_stopped.await;
                            drop(inner_stop);
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(StartError::Runtime)?;
        let (shared, name, stop) = rx.recv().map_err(|_| StartError::ThreadGone)??;
        Ok(Self {
            shared,
            name,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on, with the port actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The base URL clients use: `https://` or `http://` and the address.
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The PEM certificate of the CA that signed the serving certificate (TLS only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.shared.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// The latency added to requests, per identity or for every client.
    pub fn latency(&self) -> &Latency {
        &self.shared.latency
    }

    /// Every write request answered so far: by whom, when, with what result.
    pub fn writes(&self) -> &WriteLog {
        &self.shared.writes
    }

    /// The identity with this name, if there is one.
    pub fn identity(&self, name: &str) -> Option<Identity> {
        self.shared.auth.by_name(name)
    }

    /// Every identity, in the order they were added.
    pub fn identities(&self) -> Vec<Identity> {
        self.shared.auth.identities()
    }

    /// Adds (or replaces) an identity while running.
    pub fn add_identity(&self, identity: Identity) {
        self.shared.auth.add(identity);
    }

    /// Turns RBAC enforcement on or off while running.
    pub fn set_rbac(&self, enforce: bool) {
        self.shared.enforce_rbac.store(enforce, Ordering::Relaxed);
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    /// A kubeconfig with one user and context per identity; the first admin is current.
    pub fn kubeconfig(&self) -> String {
        let identities = self.identities();
        let current = identities
            .iter()
            .find(|i| i.is_admin())
            .or_else(|| identities.first())
            .map(|i| i.name.clone())
            .unwrap_or_default();
        let users: Vec<_> = identities
            .iter()
            .map(|i| (i.name.as_str(), Credential::Token(&i.token)))
            .collect();
        kubeconfig_yaml(&self.name, &self.url(), self.ca_pem(), &users, &current)
    }

    /// A kubeconfig holding only `identity`.
    pub fn kubeconfig_for(&self, identity: &str) -> Option<String> {
        let i = self.identity(identity)?;
        Some(kubeconfig_yaml(
            &self.name,
            &self.url(),
            self.ca_pem(),
            &[(identity, Credential::Token(&i.token))],
            identity,
        ))
    }

    /// A client certificate for `identity`, signed by the server's CA (which is also its client
    /// CA): CommonName = the identity's user, one Organization per group, so requests made with
    /// it are authenticated and authorized as that identity's user and groups.
    pub fn issue_client_certificate(
        &self,
        identity: &str,
    ) -> Result<ClientCertificate, CertificateError> {
        let i = self
            .identity(identity)
            .ok_or_else(|| CertificateError::UnknownIdentity(identity.to_string()))?;
        let tls = self.shared.tls.as_ref().ok_or(CertificateError::NoTls)?;
        tls.issue_client_certificate(&i.name, &i.user, &i.groups)
    }

    /// A kubeconfig holding only `identity`, authenticating with a newly issued client
    /// certificate ([`ApiServer::issue_client_certificate`]) instead of the token.
    pub fn kubeconfig_with_client_certificate(
        &self,
        identity: &str,
    ) -> Result<String, CertificateError> {
        let cert = self.issue_client_certificate(identity)?;
        Ok(kubeconfig_yaml(
            &self.name,
            &self.url(),
            self.ca_pem(),
            &[(identity, Credential::Certificate(&cert))],
            identity,
        ))
    }

    /// Writes [`ApiServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Stops serving: the listener closes and open connections are dropped.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let shared = Arc::clone(&shared);
                connections.spawn(async move {
                    let served = match shared.tls.clone() {
                        Some(tls) => match tls.acceptor.accept(stream).await {
                            Ok(conn) => {
                                // The certificate is the connection's: authenticated once, then
                                // applied to every request on it.
                                let cert = Arc::new(tls.authenticate(conn.get_ref().1.peer_certificates()));
                                let svc = service_fn(move |req| service::handle(Arc::clone(&shared), Arc::clone(&cert), req));
                                http1::Builder::new().serve_connection(TokioIo::new(conn), svc).await
                            }
                            Err(e) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                        },
                        None => {
                            let cert = Arc::new(ClientCert::Absent);
                            let svc = service_fn(move |req| service::handle(Arc::clone(&shared), Arc::clone(&cert), req));
                            http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await
                        }
                    };
                    if let Err(e) = served {
                        tracing::debug!(%peer, error = %e, "connection ended");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Dropping the set aborts every connection still open.
    connections.abort_all();
}

/// Objects every cluster starts with.
fn bootstrap(shared: &Shared) {
    let now = object::now();
    let mut st = shared.store.write();
    let mut create = |group: &str, resource: &str, obj: serde_json::Value| {
        let Some(def) = st
            .registry
            .get(&GroupResource::new(group, resource))
            .cloned()
        else {
            return;
        };
        let ctx = WriteCtx {
            def: &def,
            version: &def.storage_version,
            writer: Writer {
                manager: "shardwise-test-apiserver",
                api_version: &def.storage_api_version(),
                scope: Scope::Main {
                    status_subresource: false,
                },
                now: &now,
            },
            dry_run: false,
        };
        if let Err(e) = lifecycle::create(&mut st, &ctx, obj, None) {
            tracing::error!(error = %e, "bootstrap object rejected");
        }
    };
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        create("", "namespaces", json!({"metadata": {"name": ns}}));
    }
    create(
        "rbac.authorization.k8s.io",
        "clusterroles",
        json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
    );
    create(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_has_a_context_per_identity() {
        let cert = ClientCertificate {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        };
        let users = [
            ("admin", Credential::Token("a")),
            ("shardwise-0", Credential::Token("b")),
            ("by-cert", Credential::Certificate(&cert)),
        ];
        let y = kubeconfig_yaml("c", "https://127.0.0.1:1", Some("PEM"), &users, "admin");
        let v: serde_json::Value = serde_saphyr::from_str(&y).unwrap();
        assert_eq!(v["contexts"].as_array().unwrap().len(), 3);
        assert_eq!(v["users"][1]["user"]["token"], "b");
        assert_eq!(v["users"][2]["user"]["client-certificate-data"], "Q0VSVA==");
        assert_eq!(v["users"][2]["user"]["client-key-data"], "S0VZ");
        assert!(v["users"][2]["user"].get("token").is_none());
        assert_eq!(v["current-context"], "admin");
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority-data"],
            "UEVN"
        );
    }
}
