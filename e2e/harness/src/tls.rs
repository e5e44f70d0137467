//! Throwaway certificate authorities for the test clusters: each kube-apiserver gets one that
//! signs its serving certificate (for loopback) and one whose client certificates it accepts, in
//! kube-apiserver's x509 convention (CommonName the user, Organizations the groups).

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

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

/// A certificate and its private key, both PEM. `Debug` leaves the key out.
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

    /// A serving certificate for `localhost`, `127.0.0.1` and `::1` named `common_name`.
    pub fn serving_certificate(
        &self,
        common_name: &str,
    ) -> Result<ClientCertificate, CertificateError> {
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

/// Every client certificate the harness issued in an environment, with its key, by the
/// certificate's DER: a link that sees a client present one presents it again upstream, even to
/// a server whose CA never signed it (which then refuses it, as it would the client).
#[derive(Clone, Debug, Default)]
pub(crate) struct IssuedCertificates {
    issued: Arc<parking_lot::Mutex<std::collections::BTreeMap<Vec<u8>, ClientCertificate>>>,
}

impl IssuedCertificates {
    pub(crate) fn insert(&self, der: Vec<u8>, certificate: ClientCertificate) {
        self.issued.lock().insert(der, certificate);
    }

    pub(crate) fn get(&self, der: &[u8]) -> Option<ClientCertificate> {
        self.issued.lock().get(der).cloned()
    }
}
