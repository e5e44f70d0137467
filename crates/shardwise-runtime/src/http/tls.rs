//! HTTPS for the metrics endpoint: a certificate from a directory (`tls.crt` and `tls.key`, as a
//! mounted `kubernetes.io/tls` Secret lays them out), re-read when the files change so that a
//! rotated certificate is served without a restart; or, without one, a self-signed certificate
//! made at startup.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, info, warn};

/// The files read from a certificate directory.
pub(crate) const CERT_FILE: &str = "tls.crt";
pub(crate) const KEY_FILE: &str = "tls.key";

/// How often the files are looked at for a change, at most.
const RELOAD_CHECK: Duration = Duration::from_secs(5);
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way at once; more connections wait to be accepted.
const CONCURRENT_HANDSHAKES: usize = 64;

/// Why the metrics endpoint cannot serve HTTPS.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file of the certificate directory cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        source: io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{path} holds no PEM certificate")]
    NoCertificate {
        /// The certificate file.
        path: PathBuf,
    },
    /// The key file holds no key, or one that does not belong to the certificate.
    #[error("{path} holds no usable PEM private key: {why}")]
    Key {
        /// The key file (`(generated)` for a self-signed key).
        path: PathBuf,
        /// What is wrong with the key.
        why: String,
    },
    /// No self-signed certificate could be made.
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("cannot configure TLS: {0}")]
    Config(#[from] rustls::Error),
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CertSource {
    /// `tls.crt` (the chain) and `tls.key` in this directory.
    Directory(PathBuf),
    /// Self-signed, for these DNS names and addresses.
    SelfSigned(Vec<String>),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<CertifiedKey, String> {
    let signing = rustls::crypto::ring::sign::any_supported_type(key).map_err(|e| e.to_string())?;
    Ok(CertifiedKey::new(chain, signing))
}

/// The certificate and key of a directory, checked to belong together.
fn load(dir: &Path) -> Result<CertifiedKey, TlsError> {
    let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    let chain: Vec<_> = CertificateDer::pem_slice_iter(&read(&cert_path)?)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: cert_path });
    }
    let key_error = |why: String| TlsError::Key {
        path: key_path.clone(),
        why,
    };
    let key =
        PrivateKeyDer::from_pem_slice(&read(&key_path)?).map_err(|e| key_error(e.to_string()))?;
    let certified = certified_key(chain, &key).map_err(key_error)?;
    certified
        .keys_match()
        .map_err(|e| key_error(format!("it does not belong to the certificate ({e})")))?;
    Ok(certified)
}

/// What identifies a version of the files: their modification times and sizes.
fn stamp(dir: &Path) -> Option<[(SystemTime, u64); 2]> {
    let one = |name: &str| {
        let m = std::fs::metadata(dir.join(name)).ok()?;
        Some((m.modified().ok()?, m.len()))
    };
    Some([one(CERT_FILE)?, one(KEY_FILE)?])
}

#[derive(Debug)]
struct Loaded {
    checked: Instant,
    stamp: Option<[(SystemTime, u64); 2]>,
    key: Arc<CertifiedKey>,
}

/// Serves the directory's certificate, and a new one once the files change and load.
#[derive(Debug)]
struct Reloading {
    dir: PathBuf,
    every: Duration,
    loaded: Mutex<Loaded>,
}

impl Reloading {
    fn new(dir: PathBuf, every: Duration) -> Result<Self, TlsError> {
        let stamp = stamp(&dir);
        let key = Arc::new(load(&dir)?);
        Ok(Self {
            dir,
            every,
            loaded: Mutex::new(Loaded {
                checked: Instant::now(),
                stamp,
                key,
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if loaded.checked.elapsed() >= self.every {
            loaded.checked = Instant::now();
            let now = stamp(&self.dir);
            if now.is_some() && now != loaded.stamp {
                match load(&self.dir) {
                    Ok(key) => {
                        info!(dir = %self.dir.display(), "serving the renewed metrics certificate");
                        loaded.key = Arc::new(key);
                        loaded.stamp = now;
                    }
                    // Half-written during a rotation, most likely: keep serving the old one
                    // and look again at the next check.
                    Err(e) => warn!(error = %e, "keeping the previous metrics certificate"),
                }
            }
        }
        loaded.key.clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Always the same certificate.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn self_signed(names: &[String]) -> Result<CertifiedKey, TlsError> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "shardwise-controller metrics");
    let cert = params.self_signed(&key)?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    certified_key(vec![cert.der().clone()], &der).map_err(|why| TlsError::Key {
        path: PathBuf::from("(generated)"),
        why,
    })
}

/// The TLS configuration of the metrics server.
pub(crate) fn acceptor(source: &CertSource) -> Result<TlsAcceptor, TlsError> {
    let resolver: Arc<dyn ResolvesServerCert> = match source {
        CertSource::Directory(dir) => Arc::new(Reloading::new(dir.clone(), RELOAD_CHECK)?),
        CertSource::SelfSigned(names) => Arc::new(Fixed(Arc::new(self_signed(names)?))),
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener of TLS connections for `axum::serve`. Handshakes run beside the accept loop,
/// each with a timeout, so that a slow or silent client holds up no one else.
#[derive(Debug)]
pub(crate) struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(CONCURRENT_HANDSHAKES);
        let permits = Arc::new(Semaphore::new(CONCURRENT_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, most likely: back off as axum does.
                        debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (dropped with the listener): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for `name` and its key, as PEM.
    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, (cert, key): &(String, String)) {
        std::fs::write(dir.join(CERT_FILE), cert).unwrap();
        std::fs::write(dir.join(KEY_FILE), key).unwrap();
    }

    fn served(r: &Reloading) -> CertificateDer<'static> {
        r.current().cert[0].clone()
    }

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    #[test]
    fn a_rotated_certificate_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let first = pair("first");
        write(dir.path(), &first);
        let r = Reloading::new(dir.path().to_path_buf(), Duration::ZERO).unwrap();
        assert_eq!(served(&r), der(&first.0));

        let second = pair("second.example");
        write(dir.path(), &second);
        assert_eq!(
            served(&r),
            der(&second.0),
            "the renewed certificate is not served"
        );

        // Half a rotation: the new certificate with the old key. The last good pair stays.
        let third = pair("third");
        std::fs::write(dir.path().join(CERT_FILE), format!("{}\n", third.0)).unwrap();
        assert_eq!(served(&r), der(&second.0));
        std::fs::write(dir.path().join(KEY_FILE), &third.1).unwrap();
        assert_eq!(served(&r), der(&third.0));
    }

    #[test]
    fn bad_files_are_refused_at_startup_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Reloading::new(dir.path().to_path_buf(), RELOAD_CHECK).unwrap_err();
        assert!(missing.to_string().contains("tls.crt"), "{missing}");

        let (cert, _) = pair("a");
        let (_, other_key) = pair("b");
        write(dir.path(), &(cert, other_key));
        let mismatch = Reloading::new(dir.path().to_path_buf(), RELOAD_CHECK).unwrap_err();
        assert!(
            mismatch.to_string().contains("does not belong"),
            "{mismatch}"
        );

        write(dir.path(), &("not pem".into(), "not pem".into()));
        let garbage = Reloading::new(dir.path().to_path_buf(), RELOAD_CHECK).unwrap_err();
        assert!(
            garbage.to_string().contains("no PEM certificate"),
            "{garbage}"
        );
    }
}
