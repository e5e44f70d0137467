//! Throwaway certificate authorities for the test clusters: one signs a server's serving
//! certificate (for loopback), one the client certificates it accepts, in kube-apiserver's x509
//! convention (CommonName the user, Organizations the groups). The harness gives each
//! kube-apiserver one of each; the test server uses one for both.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

/// Why a certificate cannot be issued.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
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
    #[error("cannot generate the certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A certificate and its private key, both PEM (a client's, or a server's serving one). `Debug`
/// leaves the key out.
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

/// A throwaway certificate authority.
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
    pub fn generate(common_name: &str) -> Result<Self, CertificateError> {
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

    /// The CA certificate, DER.
    pub fn der(&self) -> &CertificateDer<'static> {
        self.issuer.der()
    }

    /// A serving certificate for `localhost`, `127.0.0.1` and `::1` named `common_name`.
    pub fn serving_certificate(
        &self,
        common_name: &str,
    ) -> Result<ClientCertificate, CertificateError> {
        self.serving_certificate_for(common_name, &[])
    }

    /// A serving certificate for `localhost`, `127.0.0.1`, `::1` and `more` (names or
    /// addresses) named `common_name`.
    pub fn serving_certificate_for(
        &self,
        common_name: &str,
        more: &[String],
    ) -> Result<ClientCertificate, CertificateError> {
        let key = KeyPair::generate()?;
        let mut names = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        names.extend(more.iter().cloned());
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ClientCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
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

/// Asks for a client certificate without requiring or judging it during the handshake, as
/// kube-apiserver does with a client CA (Go's `tls.RequestClientCert`): whether the certificate
/// is trusted is the authenticator's to say afterwards, so an untrusted one gets a 401 (or the
/// token's identity) rather than a failed handshake. Possession of its key is still proven by
/// the handshake's signature.
#[derive(Debug)]
pub struct RequestClientCert {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl RequestClientCert {
    /// Checks handshake signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        Self { provider }
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
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
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
