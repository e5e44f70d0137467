//! What a cluster needs of its API server: kube-apiserver ([`RealApiServer`]), or with the
//! feature `test-server` the in-memory test API server that `make demo` starts by default and
//! the fleet benchmark's `scale` section runs on.

use std::time::Duration;

use shardwise_e2e_testkit::{FaultScope, Identity, WriteRecord};

use crate::HarnessError;
use crate::faults::Faults;
use crate::real::RealApiServer;

/// A cluster's API server, as [`crate::Cluster`] uses it.
pub(crate) trait ClusterServer: std::fmt::Debug + Send + Sync {
    fn url(&self) -> String;
    /// Where `identity` reaches the server.
    fn url_for(&self, identity: &Identity) -> Result<String, HarnessError>;
    fn identity(&self, name: &str) -> Option<Identity>;
    fn identities(&self) -> Vec<Identity>;
    /// A kubeconfig with every identity; the admin is current.
    fn kubeconfig(&self) -> String;
    fn kubeconfig_for(&self, identity: &str) -> Option<String>;
    fn kubeconfig_with_client_certificate(&self, identity: &str) -> Result<String, HarnessError>;
    fn add_identity(&self, identity: Identity) -> Result<(), HarnessError>;
    fn writes(&self) -> Vec<WriteRecord>;
    fn ca_pem(&self) -> String;
    /// Cuts `identity` off (`true`) or ends that (`false`).
    fn set_partitioned(&self, identity: &str, partitioned: bool) -> Result<(), HarnessError>;
    fn set_latency(&self, identity: &str, latency: Duration);
    /// The kube-apiserver, when it is one.
    fn real(&self) -> Option<&RealApiServer>;
}

impl ClusterServer for RealApiServer {
    fn url(&self) -> String {
        RealApiServer::url(self).to_string()
    }

    fn url_for(&self, identity: &Identity) -> Result<String, HarnessError> {
        RealApiServer::url_for(self, identity)
    }

    fn identity(&self, name: &str) -> Option<Identity> {
        RealApiServer::identity(self, name)
    }

    fn identities(&self) -> Vec<Identity> {
        RealApiServer::identities(self)
    }

    fn kubeconfig(&self) -> String {
        RealApiServer::kubeconfig(self)
    }

    fn kubeconfig_for(&self, identity: &str) -> Option<String> {
        RealApiServer::kubeconfig_for(self, identity)
    }

    fn kubeconfig_with_client_certificate(&self, identity: &str) -> Result<String, HarnessError> {
        RealApiServer::kubeconfig_with_client_certificate(self, identity)
    }

    fn add_identity(&self, identity: Identity) -> Result<(), HarnessError> {
        RealApiServer::add_identity(self, identity)
    }

    fn writes(&self) -> Vec<WriteRecord> {
        RealApiServer::writes(self)
    }

    fn ca_pem(&self) -> String {
        RealApiServer::ca_pem(self).to_string()
    }

    fn set_partitioned(&self, identity: &str, partitioned: bool) -> Result<(), HarnessError> {
        let faults: &Faults = self.faults();
        let scope = FaultScope::identity(identity);
        if partitioned {
            faults.partition(scope);
        } else {
            faults.heal(&scope);
        }
        Ok(())
    }

    fn set_latency(&self, identity: &str, latency: Duration) {
        self.faults()
            .set_latency(FaultScope::identity(identity), latency);
    }

    fn real(&self) -> Option<&RealApiServer> {
        Some(self)
    }
}

#[cfg(feature = "test-server")]
pub(crate) use imitation::TestServer;

/// The in-memory test API server (`e2e/apiserver`) behind a cluster: `make demo`'s default,
/// which needs no Go build on a first run (2 min 33 s on a fresh clone against 6 min 30 s with
/// kube-apiserver and etcd), and the fleet benchmark's `scale` section's, which kube-apiserver
/// bounds on 2 cores. No test runs on it; it has no links, so of the faults only latency, its
/// own.
#[cfg(feature = "test-server")]
mod imitation {
    use std::time::Duration;

    use shardwise_e2e_testkit::{FaultScope, Identity, WriteRecord};
    use shardwise_test_apiserver as test_server;

    use super::ClusterServer;
    use crate::HarnessError;
    use crate::real::RealApiServer;

    #[derive(Debug)]
    pub(crate) struct TestServer {
        name: String,
        server: test_server::ApiServer,
    }

    impl TestServer {
        /// Starts test server `name` with RBAC and `identities` (and an `admin`), on a thread
        /// of its own.
        pub(crate) fn start(name: &str, identities: &[Identity]) -> Result<Self, HarnessError> {
            let mut config = test_server::ServerConfig::default().rbac(true);
            for identity in identities {
                config = config.identity(identity.clone());
            }
            config.name = name.to_string();
            let server = test_server::ApiServer::start_detached(config).map_err(|e| {
                HarnessError::TestServer {
                    cluster: name.to_string(),
                    reason: e.to_string(),
                }
            })?;
            Ok(Self {
                name: name.to_string(),
                server,
            })
        }
    }

    impl ClusterServer for TestServer {
        fn url(&self) -> String {
            self.server.url()
        }

        fn url_for(&self, _identity: &Identity) -> Result<String, HarnessError> {
            Ok(self.server.url())
        }

        fn identity(&self, name: &str) -> Option<Identity> {
            self.server.identity(name)
        }

        fn identities(&self) -> Vec<Identity> {
            self.server.identities()
        }

        fn kubeconfig(&self) -> String {
            self.server.kubeconfig()
        }

        fn kubeconfig_for(&self, identity: &str) -> Option<String> {
            self.server.kubeconfig_for(identity)
        }

        fn kubeconfig_with_client_certificate(
            &self,
            identity: &str,
        ) -> Result<String, HarnessError> {
            self.server
                .kubeconfig_with_client_certificate(identity)
                .map_err(|e| HarnessError::TestServer {
                    cluster: self.name.clone(),
                    reason: e.to_string(),
                })
        }

        fn add_identity(&self, identity: Identity) -> Result<(), HarnessError> {
            self.server.add_identity(identity);
            Ok(())
        }

        fn writes(&self) -> Vec<WriteRecord> {
            self.server.writes().records()
        }

        fn ca_pem(&self) -> String {
            self.server.ca_pem().unwrap_or_default().to_string()
        }

        fn set_partitioned(&self, _identity: &str, _partitioned: bool) -> Result<(), HarnessError> {
            Err(HarnessError::TestServer {
                cluster: self.name.clone(),
                reason: "the test server adds latency, no other fault".into(),
            })
        }

        fn set_latency(&self, identity: &str, latency: Duration) {
            self.server
                .latency()
                .set(FaultScope::identity(identity), latency);
        }

        fn real(&self) -> Option<&RealApiServer> {
            None
        }
    }
}
