//! A throwaway certificate authority and serving certificate per server, because kubectl
//! (client-go) sends credentials only over TLS. The same CA signs client certificates: like
//! kube-apiserver with `--client-ca-file` set to the cluster CA, the server asks for a client
//! certificate and authenticates its subject (see [`ClientCert`]).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use shardwise_e2e_testkit::{CertificateAuthority, ClientCertificate, RequestClientCert};
use tokio_rustls::TlsAcceptor;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate certificates: {0}")]
    Certificate(#[from] shardwise_e2e_testkit::CertificateError),
    #[error("cannot read the generated certificate: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("cannot configure TLS: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot configure client certificate verification: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Why a client certificate cannot be issued.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// No identity has this name.
    #[error("the server has no identity {0:?}")]
    UnknownIdentity(String),
    /// The server serves plain HTTP and so has no CA.
    #[error("the server serves plain HTTP, so it has no CA to sign client certificates")]
    NoTls,
    /// The CA cannot issue it.
    #[error(transparent)]
    Issue(#[from] shardwise_e2e_testkit::CertificateError),
}

/// What a connection's client certificate says, decided as kube-apiserver's x509 authenticator
/// (`CommonNameUserConversion`) decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ClientCert {
    /// No certificate, or a trusted one without a CommonName: the bearer token decides.
    Absent,
    /// A trusted certificate: user = subject CommonName, groups = subject Organization values.
    User { user: String, groups: Vec<String> },
    /// A certificate the client CA does not vouch for (or that cannot be read). It fails
    /// authentication unless a bearer token succeeds, and the request is never anonymous.
    Rejected(String),
}

/// The acceptor, the CA certificate clients must trust, and the CA that signs client
/// certificates.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    pub ca_pem: String,
    ca: CertificateAuthority,
    client_roots: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// Generates a CA and a certificate for `localhost`, `127.0.0.1` and `::1` signed by it.
pub fn generate() -> Result<Tls, TlsError> {
    let ca = CertificateAuthority::generate("shardwise-test-apiserver-ca")?;
    let serving = ca.serving_certificate("shardwise-test-apiserver")?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    let client_roots =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()?;

    let chain = vec![
        CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?,
        ca.der().clone(),
    ];
    let key_der = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(RequestClientCert::new(provider)))
        .with_single_cert(chain, key_der)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        ca_pem: ca.pem(),
        ca,
        client_roots,
    })
}

impl Tls {
    /// A client certificate signed by the CA: CommonName `user`, one Organization per group,
    /// for client authentication only.
    pub fn issue_client_certificate(
        &self,
        identity: &str,
        user: &str,
        groups: &[String],
    ) -> Result<ClientCertificate, CertificateError> {
        Ok(self.ca.client_certificate(identity, user, groups)?)
    }

    /// Authenticates the certificate chain a client presented, as kube-apiserver's x509
    /// authenticator does: verified against the client CA for client authentication, then
    /// user = CommonName (the last, as Go's `pkix.Name` keeps it) and groups = every
    /// Organization value.
    pub(crate) fn authenticate(&self, chain: Option<&[CertificateDer<'_>]>) -> ClientCert {
        let Some((end_entity, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return ClientCert::Absent;
        };
        if let Err(e) =
            self.client_roots
                .verify_client_cert(end_entity, intermediates, UnixTime::now())
        {
            return ClientCert::Rejected(format!("verifying certificate failed: {e}"));
        }
        let cert = match x509_parser::parse_x509_certificate(end_entity) {
            Ok((_, cert)) => cert,
            Err(e) => return ClientCert::Rejected(format!("unreadable certificate: {e}")),
        };
        let subject = cert.subject();
        let strings =
            |attrs: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue>| {
                attrs
                    .filter_map(|a| a.as_str().ok().map(str::to_string))
                    .collect::<Vec<_>>()
            };
        let user = strings(&mut subject.iter_common_name())
            .pop()
            .unwrap_or_default();
        if user.is_empty() {
            return ClientCert::Absent;
        }
        ClientCert::User {
            user,
            groups: strings(&mut subject.iter_organization()),
        }
    }
}
