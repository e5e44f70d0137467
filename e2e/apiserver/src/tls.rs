//! A throwaway certificate authority and serving certificate per server, because kubectl
//! (client-go) sends credentials only over TLS. The same CA signs client certificates: like
//! kube-apiserver with `--client-ca-file` set to the cluster CA, the server asks for a client
//! certificate and authenticates its subject (see [`ClientCert`]).

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::TlsAcceptor;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate certificates: {0}")]
    Certificate(#[from] rcgen::Error),
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
    /// rcgen keeps one value per subject attribute type; the second Organization goes in under
    /// the same OID as a custom type, so two groups are what it can encode.
    #[error("identity {identity:?} has {groups} groups; a client certificate carries at most 2")]
    TooManyGroups {
        /// The identity's name.
        identity: String,
        /// How many groups it has.
        groups: usize,
    },
    /// Key or certificate generation failed.
    #[error("cannot generate the client certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A client certificate and its private key, both PEM. `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCertificate")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
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

/// Asks for a client certificate without requiring or verifying it during the handshake, like
/// Go's `tls.RequestClientCert`, which kube-apiserver uses when it has a client CA: the chain is
/// verified by the authenticator ([`Tls::authenticate`]), so an untrusted certificate yields a
/// 401 (or the token's identity) rather than a failed handshake. Possession of the key is still
/// proven: the handshake signature is checked.
#[derive(Debug)]
struct RequestClientCert {
    roots: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.roots.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.roots.supported_verify_schemes()
    }
}

/// A throwaway certificate authority: it signs serving certificates for loopback and client
/// certificates in kube-apiserver's x509 convention. The test server uses one as both its
/// serving CA and its client CA; the harness gives a real kube-apiserver one of each.
#[derive(Clone)]
pub struct CertificateAuthority {
    issuer: Arc<CertifiedIssuer<'static, KeyPair>>,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Self, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Self {
            issuer: Arc::new(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> &CertificateDer<'static> {
        self.issuer.der()
    }

    /// A serving certificate for `localhost`, `127.0.0.1` and `::1` named `common_name`.
    pub fn serving_certificate(
        &self,
        common_name: &str,
    ) -> Result<ClientCertificate, rcgen::Error> {
        let (cert, key) = self.serving(common_name)?;
        Ok(ClientCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn serving(&self, common_name: &str) -> Result<(rcgen::Certificate, KeyPair), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ])?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert, key))
    }

    /// A client certificate: CommonName `user`, one Organization per group, for client
    /// authentication only (`identity` names it in errors).
    pub fn client_certificate(
        &self,
        identity: &str,
        user: &str,
        groups: &[String],
    ) -> Result<ClientCertificate, CertificateError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        // The OID of Organization (2.5.4.10), spelled as a custom type so that rcgen, which
        // keeps one value per type, writes a second Organization attribute.
        let organization = [
            DnType::OrganizationName,
            DnType::CustomDnType(vec![2, 5, 4, 10]),
        ];
        if groups.len() > organization.len() {
            return Err(CertificateError::TooManyGroups {
                identity: identity.to_string(),
                groups: groups.len(),
            });
        }
        for (ty, group) in organization.into_iter().zip(groups) {
            params.distinguished_name.push(ty, group.as_str());
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ClientCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Generates a CA and a certificate for `localhost`, `127.0.0.1` and `::1` signed by it.
pub fn generate() -> Result<Tls, TlsError> {
    let ca = CertificateAuthority::generate("shardwise-test-apiserver-ca")?;
    let (cert, key) = ca.serving("shardwise-test-apiserver")?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone())?;
    let client_roots =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()?;

    let chain = vec![cert.der().clone(), ca.der().clone()];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(Arc::new(RequestClientCert {
            roots: Arc::clone(&client_roots),
        }))
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
        self.ca.client_certificate(identity, user, groups)
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
