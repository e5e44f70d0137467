//! The client certificates issued in an environment, which a link presents again upstream.

use std::sync::Arc;

use shardwise_e2e_testkit::ClientCertificate;

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
