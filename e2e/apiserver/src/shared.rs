//! The state every connection of a server shares: its own module, so that the request handlers
//! and the server that starts them do not import each other.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::auth::Authenticator;
use crate::latency::Latency;
use crate::store::Store;
use crate::tls::Tls;
use crate::writes::WriteLog;

/// State shared by every connection.
#[derive(Debug)]
pub(crate) struct Shared {
    pub store: Store,
    pub auth: Authenticator,
    pub latency: Latency,
    pub enforce_rbac: AtomicBool,
    pub bookmark_interval: Duration,
    pub default_watch_timeout: Duration,
    pub addr: SocketAddr,
    pub tls: Option<Tls>,
    pub namespace_deletion_delay: Duration,
    pub writes: WriteLog,
}
