//! An in-memory Kubernetes API server: `make demo`'s default control plane and the one the
//! fleet benchmark's `scale` section runs on.
//!
//! This is a test fixture, not a product: it speaks enough of the Kubernetes REST API for
//! unmodified kube-rs clients and `kubectl`, keeps everything in memory, and can add latency to
//! an identity's requests. See the README for every deliberate difference from the real
//! kube-apiserver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use shardwise_test_apiserver::{ApiServer, FaultScope, Identity, ServerConfig};
//!
//! let server = ApiServer::start(
//!     ServerConfig::default().identity(Identity::service_account("shardwise-0", "shardwise", "shardwise")),
//! )
//! .await?;
//! std::fs::write("/tmp/kubeconfig", server.kubeconfig())?;
//! server
//!     .latency()
//!     .set(FaultScope::identity("shardwise-0"), Duration::from_millis(10));
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod apply;
mod auth;
mod crd;
mod discovery;
mod error;
mod fieldset;
mod kinds;
mod latency;
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

pub use latency::Latency;
pub use server::{ApiServer, ServerConfig, StartError};
pub use shardwise_e2e_testkit::{
    CertificateAuthority, ClientCertificate, Credential, FaultScope, Identity, WriteRecord,
    kubeconfig_yaml,
};
pub use tls::CertificateError;
pub use writes::WriteLog;
