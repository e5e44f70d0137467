//! An in-memory Kubernetes API server for shardwise's end-to-end tests, with fault injection.
//!
//! This is a test fixture, not a product: it speaks enough of the Kubernetes REST API for
//! unmodified kube-rs clients and `kubectl`, keeps everything in memory, and lets tests inject
//! latency, errors, watch closures, partitions and pauses. See the README for every deliberate
//! difference from the real kube-apiserver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use shardwise_test_apiserver::{ApiServer, FaultScope, Identity, ServerConfig};
//!
//! let server = ApiServer::start(
//!     ServerConfig::default().identity(Identity::service_account("shardwise-0", "shardwise", "shardwise")),
//! )
//! .await?;
//! std::fs::write("/tmp/kubeconfig", server.kubeconfig())?;
//! server.faults().partition(FaultScope::identity("shardwise-0"));
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod admin;
mod apply;
mod auth;
mod crd;
mod discovery;
mod error;
mod faults;
mod fieldset;
mod kinds;
mod lifecycle;
mod object;
mod patch;
mod protobuf;
mod rbac;
mod registry;
mod respond;
mod rest;
mod reviews;
mod selectors;
mod server;
mod service;
mod shared;
mod store;
mod table;
mod tls;
mod validation;
mod watch;
mod writes;

pub use auth::Identity;
pub use faults::{
    ActiveFaults, ErrorFault, FaultCounters, FaultError, FaultScope, Faults, ScopedErrors,
    ScopedLatency, ScopedPeriod,
};
pub use server::{ApiServer, Credential, ServerConfig, StartError, kubeconfig_yaml};
pub use tls::{CertificateAuthority, CertificateError, ClientCertificate};
pub use writes::{WriteLog, WriteRecord};
