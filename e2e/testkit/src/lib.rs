//! What both API servers of the end-to-end tests work with: kube-apiserver as the harness
//! (`shardwise-e2e`) runs it, and the in-memory test API server (`shardwise-test-apiserver`).
//!
//! - [`Identity`]: a client a test acts as (user, groups, token), and [`kubeconfig_yaml`], the
//!   kubeconfig that carries it;
//! - [`CertificateAuthority`]: throwaway CAs that sign serving certificates for loopback and
//!   client certificates in kube-apiserver's x509 convention, and [`RequestClientCert`], the
//!   server side's way of asking for one as kube-apiserver does;
//! - [`FaultScope`]: whom a fault injected between clients and a server reaches;
//! - [`WriteRecord`]: one request a server answered, as the tests read it to prove from the
//!   server's side what a client did.

mod fault_scope;
mod identity;
mod tls;
mod write_record;

pub use fault_scope::FaultScope;
pub use identity::{Credential, Identity, kubeconfig_yaml};
pub use tls::{CertificateAuthority, CertificateError, ClientCertificate, RequestClientCert};
pub use write_record::WriteRecord;
