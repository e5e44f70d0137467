//! kube-controller-manager and kube-scheduler beside a cluster's kube-apiserver: what turns
//! StatefulSets, Deployments and ReplicaSets into Pods, binds Pods to Nodes, collects garbage,
//! empties deleted namespaces, aggregates ClusterRoles, keeps PodDisruptionBudgets' status and
//! the Services' EndpointSlices, and mints what pods need to reach the server (ServiceAccount
//! tokens, the `kube-root-ca.crt` ConfigMap in every namespace).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::Api;

use super::supervisor::{Spawner, Supervised};
use super::{Binaries, RealApiServer, block_on, write};
use crate::HarnessError;

/// The controllers kube-controller-manager runs (their canonical names in v1.37): what the
/// suites' workloads need, and nothing that needs a cloud, volumes or a certificate signer.
/// `serviceaccount-token-controller` and `root-ca-certificate-publisher-controller` give pods
/// their credentials; `node-lifecycle-controller` removes the `not-ready` taint that every new
/// Node gets, without which nothing is ever scheduled.
const CONTROLLERS: &[&str] = &[
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "statefulset-controller",
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "clusterrole-aggregation-controller",
    "disruption-controller",
    "endpointslice-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
];

/// How long kube-controller-manager may take to publish what every namespace needs.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// kube-controller-manager and kube-scheduler of one cluster; both killed on drop.
#[derive(Debug)]
pub(crate) struct Workloads {
    manager: Mutex<Supervised>,
    scheduler: Mutex<Supervised>,
}

impl Workloads {
    /// Starts both against `server` (directly, not through a link: they are the cluster's own,
    /// not clients under test), each under its own identity as kubeadm sets them up, and waits
    /// until kube-controller-manager has published the `default` namespace's CA and
    /// ServiceAccount.
    pub(crate) fn start(
        server: &RealApiServer,
        spawner: &Spawner,
        binaries: &Binaries,
    ) -> Result<Self, HarnessError> {
        let (manager_program, scheduler_program) = binaries.workloads()?;
        let dir = server.dir();
        let file = |name: &str| dir.join(name).display().to_string();
        let kubeconfig = |user: &str| -> Result<String, HarnessError> {
            let path = dir.join(format!("{user}.kubeconfig"));
            write(&path, &server.component_kubeconfig(user)?)?;
            Ok(path.display().to_string())
        };
        let manager_kubeconfig = kubeconfig("system:kube-controller-manager")?;
        let manager_args = vec![
            format!("--kubeconfig={manager_kubeconfig}"),
            // No serving endpoint: nothing scrapes it, and no port can collide.
            "--secure-port=0".to_string(),
            "--leader-elect=false".to_string(),
            // Each controller acts as its own ServiceAccount (`system:controller:*` roles), as
            // in every real cluster; the audit log then names which controller wrote what.
            "--use-service-account-credentials=true".to_string(),
            format!(
                "--service-account-private-key-file={}",
                file("service-accounts.key")
            ),
            format!("--root-ca-file={}", file("serving-ca.crt")),
            format!("--controllers={}", CONTROLLERS.join(",")),
            // A node agent that stops is noticed after this long (the default is 50 s).
            "--node-monitor-grace-period=20s".to_string(),
            "--kube-api-qps=100".to_string(),
            "--kube-api-burst=200".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        let scheduler_kubeconfig = kubeconfig("system:kube-scheduler")?;
        let scheduler_args = vec![
            format!("--kubeconfig={scheduler_kubeconfig}"),
            "--secure-port=0".to_string(),
            "--leader-elect=false".to_string(),
            "--profiling=false".to_string(),
            "--v=1".to_string(),
        ];
        let manager = spawner.spawn(
            "kube-controller-manager",
            manager_program,
            &manager_args,
            dir,
        )?;
        let scheduler = spawner.spawn("kube-scheduler", scheduler_program, &scheduler_args, dir)?;
        let workloads = Self {
            manager: Mutex::new(manager),
            scheduler: Mutex::new(scheduler),
        };
        workloads.wait_ready(server)?;
        Ok(workloads)
    }

    /// How a process ended, with its log's tail, if one of the two has.
    fn exited(&self) -> Option<(String, String)> {
        [&self.manager, &self.scheduler].into_iter().find_map(|p| {
            let mut process = p.lock().unwrap_or_else(PoisonError::into_inner);
            process
                .exited()
                .map(|status| (status, process.log_tail(30)))
        })
    }

    fn wait_ready(&self, server: &RealApiServer) -> Result<(), HarnessError> {
        let started = Instant::now();
        block_on(async {
            let client = server.admin_client().await?;
            let (maps, accounts) = (
                Api::<ConfigMap>::namespaced(client.clone(), "default"),
                Api::<ServiceAccount>::namespaced(client, "default"),
            );
            let mut last = String::new();
            while started.elapsed() < READY_TIMEOUT {
                if let Some((status, log)) = self.exited() {
                    return Err(not_ready(
                        server,
                        started,
                        format!("exited ({status})"),
                        log,
                    ));
                }
                match (
                    maps.get_opt("kube-root-ca.crt").await,
                    accounts.get_opt("default").await,
                ) {
                    (Ok(Some(_)), Ok(Some(_))) => return Ok(()),
                    (Err(e), _) | (_, Err(e)) => last = e.to_string(),
                    _ => last = "no default/kube-root-ca.crt or default/default yet".into(),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let log = self
                .manager
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .log_tail(30);
            Err(not_ready(server, started, last, log))
        })?
    }
}

fn not_ready(server: &RealApiServer, started: Instant, last: String, log: String) -> HarnessError {
    HarnessError::NotReady {
        cluster: format!(
            "{} (kube-controller-manager and kube-scheduler)",
            server.name()
        ),
        waited: started.elapsed(),
        last,
        log,
    }
}
