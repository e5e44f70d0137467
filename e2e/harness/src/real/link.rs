//! Network links between one identity's clients and a real kube-apiserver: a TCP forwarder on
//! a loopback port of its own, which a test can cut (a partition) and restore. Cut, it drops
//! every open connection (watches included) and every new one without an answer, as a
//! partition fault of the test server does. TLS passes through untouched: the serving
//! certificate names 127.0.0.1, whatever the port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::HarnessError;

#[derive(Debug)]
struct Link {
    port: u16,
    cut: watch::Sender<bool>,
    latency: watch::Sender<Duration>,
}

/// The links of one server, served by a runtime on a thread of their own (so they run whatever
/// the test's runtime does) that stops when this is dropped.
#[derive(Debug)]
pub(crate) struct Links {
    upstream: SocketAddr,
    links: Mutex<BTreeMap<String, Link>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Links {
    pub(crate) fn new(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("control-plane-links")
            .enable_all()
            .build()
            .map_err(|source| HarnessError::Io {
                path: "links runtime".into(),
                source,
            })?;
        Ok(Self {
            upstream,
            links: Mutex::new(BTreeMap::new()),
            runtime: Some(runtime),
        })
    }

    /// The port of `identity`'s link, opened on first use.
    pub(crate) fn port(&self, identity: &str) -> Result<u16, HarnessError> {
        let mut links = self.links.lock();
        if let Some(link) = links.get(identity) {
            return Ok(link.port);
        }
        let runtime = self.runtime.as_ref().ok_or_else(|| HarnessError::Io {
            path: "links runtime".into(),
            source: std::io::Error::other("stopped"),
        })?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|source| HarnessError::Io {
                path: "127.0.0.1:0".into(),
                source,
            })?;
        let port = listener
            .local_addr()
            .map_err(|source| HarnessError::Io {
                path: "127.0.0.1:0".into(),
                source,
            })?
            .port();
        let (cut, cut_seen) = watch::channel(false);
        let (latency, latency_seen) = watch::channel(Duration::ZERO);
        let upstream = self.upstream;
        let _guard = runtime.enter();
        let listener = TcpListener::from_std(listener).map_err(|source| HarnessError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?;
        runtime.spawn(forward(listener, upstream, cut_seen, latency_seen));
        links.insert(identity.to_string(), Link { port, cut, latency });
        Ok(port)
    }

    fn with_link(&self, identity: &str, f: impl FnOnce(&Link)) -> Result<(), HarnessError> {
        match self.links.lock().get(identity) {
            Some(link) => {
                f(link);
                Ok(())
            }
            None => Err(HarnessError::UnknownIdentity {
                cluster: self.upstream.to_string(),
                identity: identity.to_string(),
            }),
        }
    }

    /// Cuts (`true`) or restores (`false`) `identity`'s link.
    pub(crate) fn set_cut(&self, identity: &str, cut: bool) -> Result<(), HarnessError> {
        self.with_link(identity, |link| {
            link.cut.send_replace(cut);
        })
    }

    /// Delays everything `identity` sends by `latency` (zero: none), so each request arrives
    /// that much later.
    pub(crate) fn set_latency(
        &self,
        identity: &str,
        latency: Duration,
    ) -> Result<(), HarnessError> {
        self.with_link(identity, |link| {
            link.latency.send_replace(latency);
        })
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn forward(
    listener: TcpListener,
    upstream: SocketAddr,
    cut: watch::Receiver<bool>,
    latency: watch::Receiver<Duration>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let mut cut = cut.clone();
        let latency = latency.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, mut client_write) = client.into_split();
            let (mut server_read, server_write) = server.into_split();
            let requests = delayed_copy(client_read, server_write, latency);
            let answers = tokio::io::copy(&mut server_read, &mut client_write);
            tokio::select! {
                _ = requests => {}
                _ = answers => {}
                _ = cut.wait_for(|cut| *cut) => {}
            }
        });
    }
}

/// Copies `from` to `to`, holding each chunk for the link's latency first.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: watch::Receiver<Duration>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let delay = *latency.borrow();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
