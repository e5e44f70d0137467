//! What a run costs the control plane: kube-apiserver's and etcd's CPU, the requests the
//! control plane's kube-apiserver answered by verb and resource (its own
//! `apiserver_request_total`) and by who sent them (its audit log), and the bytes etcd wrote to
//! its log. Read before and after the run ([`Environment::control_plane_reading`]), the
//! difference is the run's cost ([`ControlPlaneReading::cost_since`]).

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::metrics::Metrics;
use crate::{Environment, HarnessError};

/// A kind of request: the API's verb (`GET`, `LIST`, `WATCH`, `CREATE`, `UPDATE`, `PATCH`,
/// `DELETE`, as kube-apiserver's metrics spell them) and the resource with its subresource
/// (`fleetapps/status`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKind {
    /// The verb, upper case.
    pub verb: String,
    /// The resource, and `/subresource` when there is one.
    pub resource: String,
}

impl RequestKind {
    /// A kind from a verb in any case and a resource with its optional subresource.
    pub fn new(verb: &str, resource: &str, subresource: &str) -> Self {
        Self {
            verb: verb.to_ascii_uppercase(),
            resource: if subresource.is_empty() {
                resource.to_string()
            } else {
                format!("{resource}/{subresource}")
            },
        }
    }
}

/// What the control plane had served up to one moment.
#[derive(Clone, Debug)]
pub struct ControlPlaneReading {
    /// When it was read, on this machine's wall clock (the audit log's clock).
    pub at: SystemTime,
    /// CPU seconds of the control plane's kube-apiserver so far.
    pub apiserver_cpu: f64,
    /// CPU seconds of etcd so far (shared by every cluster of the environment).
    pub etcd_cpu: f64,
    /// Bytes etcd has written to its write-ahead log (`etcd_disk_wal_write_bytes_total`).
    pub etcd_wal_bytes: f64,
    /// Requests the control plane's kube-apiserver answered, by kind
    /// (`apiserver_request_total`; a WATCH counts when it ends).
    pub requests: BTreeMap<RequestKind, f64>,
}

/// What the control plane served between two readings.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneCost {
    /// Seconds between the readings.
    pub seconds: f64,
    /// CPU seconds of the control plane's kube-apiserver.
    pub apiserver_cpu: f64,
    /// CPU seconds of etcd (every cluster of the environment writes to it).
    pub etcd_cpu: f64,
    /// Bytes etcd wrote to its write-ahead log.
    pub etcd_wal_bytes: f64,
    /// Requests answered, by kind, from the server's own counters.
    pub requests: BTreeMap<RequestKind, f64>,
    /// The writes and LISTs among them by the user that sent them, from the audit log
    /// (requests received between the readings and answered by the second).
    pub by_user: BTreeMap<String, BTreeMap<RequestKind, u64>>,
}

impl ControlPlaneCost {
    /// Requests answered, of every kind.
    pub fn total_requests(&self) -> f64 {
        self.requests.values().sum()
    }

    /// Requests sent by users for which `of` holds, by kind.
    pub fn requests_of(&self, of: impl Fn(&str) -> bool) -> BTreeMap<RequestKind, u64> {
        let mut kinds = BTreeMap::new();
        for (_, requests) in self.by_user.iter().filter(|(user, _)| of(user)) {
            for (kind, n) in requests {
                *kinds.entry(kind.clone()).or_default() += n;
            }
        }
        kinds
    }
}

impl ControlPlaneReading {
    /// The cost of what the control plane served since `before`.
    pub fn cost_since(&self, before: &Self, env: &Environment) -> ControlPlaneCost {
        let mut requests = BTreeMap::new();
        for (kind, n) in &self.requests {
            let served = n - before.requests.get(kind).copied().unwrap_or_default();
            if served > 0.0 {
                requests.insert(kind.clone(), served);
            }
        }
        ControlPlaneCost {
            seconds: self
                .at
                .duration_since(before.at)
                .unwrap_or_default()
                .as_secs_f64(),
            apiserver_cpu: self.apiserver_cpu - before.apiserver_cpu,
            etcd_cpu: self.etcd_cpu - before.etcd_cpu,
            etcd_wal_bytes: self.etcd_wal_bytes - before.etcd_wal_bytes,
            requests,
            by_user: env.requests_by_user(before.at, self.at),
        }
    }
}

/// kube-apiserver's `apiserver_request_total`, summed over codes and scopes, by kind.
pub(crate) fn requests_served(metrics: &Metrics) -> BTreeMap<RequestKind, f64> {
    let mut requests = BTreeMap::new();
    for sample in metrics.matching("apiserver_request_total", &[]) {
        let label = |name: &str| sample.labels.get(name).map_or("", String::as_str);
        let kind = RequestKind::new(label("verb"), label("resource"), label("subresource"));
        *requests.entry(kind).or_default() += sample.value;
    }
    requests
}

impl Environment {
    /// What the control plane has served so far; the environment must run kube-apiserver.
    pub async fn control_plane_reading(&self) -> Result<ControlPlaneReading, HarnessError> {
        let (etcd_pid, etcd_url) = self.etcd()?;
        let client = self.control_plane().client("admin").await?;
        let text = client
            .request_text(
                http::Request::get("/metrics")
                    .body(Vec::new())
                    .map_err(kube::Error::HttpError)?,
            )
            .await?;
        let served = Metrics::parse(&text)?;
        let etcd = crate::scrape(&format!("{etcd_url}/metrics")).await?;
        Ok(ControlPlaneReading {
            at: SystemTime::now(),
            apiserver_cpu: crate::procfs::cpu_seconds(self.control_plane().server().pid()),
            etcd_cpu: crate::procfs::cpu_seconds(etcd_pid),
            etcd_wal_bytes: etcd.sum("etcd_disk_wal_write_bytes_total", &[]),
            requests: requests_served(&served),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_verb_and_resource_over_codes_and_scopes() {
        let metrics = Metrics::parse(
            r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="shardwise.io",resource="fleetapps",scope="namespace",subresource="status",verb="PATCH",version="v1alpha1"} 5
apiserver_request_total{code="409",component="apiserver",dry_run="",group="shardwise.io",resource="fleetapps",scope="namespace",subresource="status",verb="PATCH",version="v1alpha1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 3
apiserver_request_duration_seconds_count{verb="PUT",resource="leases"} 9
"#,
        )
        .unwrap();
        let served = requests_served(&metrics);
        assert_eq!(
            served.get(&RequestKind::new("patch", "fleetapps", "status")),
            Some(&7.0)
        );
        assert_eq!(
            served.get(&RequestKind::new("PUT", "leases", "")),
            Some(&3.0)
        );
        assert_eq!(served.len(), 2);
    }
}
