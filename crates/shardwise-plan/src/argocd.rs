//! Argo CD's fleet: cluster Secrets and `applications.argoproj.io`, mapped the way Argo CD's
//! application controller (v3.5) reads them. Argo CD records no placement, so the fleet has none.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::Value;
use shard_assign::{Cluster, ShardId};

use super::{FleetError, LiveFleet, some_names};

/// Label selector of Argo CD's cluster Secrets.
pub const CLUSTER_SECRET_SELECTOR: &str = "argocd.argoproj.io/secret-type=cluster";

/// What counts as load in an Argo CD fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgoCdLoad {
    /// One per Application.
    Apps,
    /// One per resource an Application manages (`status.resources`).
    Resources,
}
/// The API server of the cluster Argo CD runs in.
const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// Name of that cluster when no Secret describes it.
const IN_CLUSTER_NAME: &str = "in-cluster";
/// Id of that cluster when no Secret describes it: Argo CD's legacy sharding puts an empty id on
/// shard 0, and so does `legacy-modulo`.
const IN_CLUSTER_ID: &str = "";

/// Set by shardwise-balancer, with the `shard` key [`PARKED_KEY`], on a cluster Secret whose
/// cluster it hands from one controller to another: the shard the cluster goes to once the
/// controller that had it has let it go. A negative key without it is the user's own.
pub const HANDOVER_ANNOTATION: &str = "shardwise.io/handover-to";

/// The `shard` key of a cluster being handed over: negative, so that no replica of any count
/// reconciles it.
pub const PARKED_KEY: &str = "-1";

/// A cluster Secret annotated with this (true) is reconciled by no replica.
const SKIP_RECONCILE: &str = "argocd.argoproj.io/skip-reconcile";

/// Builds the fleet from cluster Secrets and Applications. `in_cluster_enabled` is Argo CD's
/// `cluster.inClusterEnabled` (default true): when set, the cluster Argo CD runs in exists even
/// without a Secret; when not, it does not exist even with one. `load` is what each
/// Application weighs.
pub fn fleet(
    secrets: &[Secret],
    apps: &[DynamicObject],
    in_cluster_enabled: bool,
    load: ArgoCdLoad,
) -> Result<LiveFleet, FleetError> {
    let mut ordered: Vec<&Secret> = secrets.iter().collect();
    ordered.sort_by_key(|s| s.name_any());

    let mut fleet = LiveFleet::default();
    let mut index = Index::default();
    for secret in ordered {
        let secret_name = secret.name_any();
        // Argo CD turns a Secret into a cluster with `json.Unmarshal` of `config`; when that
        // fails the Secret stays a Secret, which every cluster lookup skips.
        if let Some(error) = config_error(secret) {
            fleet.warnings.push(format!(
                "Secret {secret_name:?} has a config Argo CD cannot read ({error}): Argo CD ignores this cluster, so no replica reconciles it; left out"
            ));
            continue;
        }
        let server = normalise_server(&data(secret, "server").unwrap_or_default());
        if server == IN_CLUSTER_SERVER && !in_cluster_enabled {
            fleet.notes.push(format!(
                "Secret {secret_name:?} describes the in-cluster cluster, which argocd-cm disables; left out"
            ));
            continue;
        }
        // The sharding cache keys clusters by server: of two Secrets with one server, it keeps
        // one (which one is not defined) and never ranks or places the other.
        if let Some(&kept) = index.by_server.get(&server) {
            let kept_key = secrets
                .iter()
                .find(|s| s.name_any() == index.secret_names[kept])
                .and_then(|s| data(s, "shard"));
            if data(secret, "shard") != kept_key {
                fleet
                    .shadowed
                    .entry(fleet.clusters[kept].id.clone())
                    .or_default()
                    .push(secret_name.clone());
            }
            fleet.warnings.push(format!(
                "Secrets {:?} and {secret_name:?} have the same server {server:?}: Argo CD keeps one of them (which one is not defined) and ignores the other, which shifts round-robin ranks; the plan keeps {:?} and leaves {secret_name:?} out",
                index.secret_names[kept], index.secret_names[kept]
            ));
            continue;
        }
        let id = secret.uid().ok_or_else(|| FleetError::MissingUid {
            kind: "Secret",
            name: secret_name.clone(),
        })?;
        // Argo CD's cluster name is the `name` key, empty when absent: such a cluster can be
        // targeted by server only.
        let name = data(secret, "name").unwrap_or_default();
        let shown = if name.is_empty() {
            fleet.notes.push(format!(
                "Secret {secret_name:?} has no name key: Argo CD gives its cluster no name, so Applications that name it (even as {secret_name:?}) match nothing; shown as \"(Secret {secret_name})\""
            ));
            format!("(Secret {secret_name})")
        } else {
            name.clone()
        };
        let pin = match shard(secret) {
            Shard::Unset => None,
            Shard::Unparsable(text) => {
                fleet.notes.push(format!(
                    "Secret {secret_name:?} has shard {text:?}, which Argo CD cannot parse and ignores; treated as unpinned"
                ));
                None
            }
            Shard::Negative(n) => {
                let handover = secret
                    .annotations()
                    .get(HANDOVER_ANNOTATION)
                    .and_then(|to| to.trim().parse::<ShardId>().ok());
                match handover {
                    Some(to) => {
                        fleet.notes.push(format!(
                            "Secret {secret_name:?} has shard {n}: shardwise-balancer is handing cluster {shown:?} over to shard {to}, and no Argo CD replica reconciles it until then"
                        ));
                        fleet.parked.insert(id.clone(), to);
                    }
                    None => fleet.warnings.push(format!(
                        "Secret {secret_name:?} has shard {n}: no Argo CD replica reconciles cluster {shown:?} (orphaned; shown as unplaced now, and placed by each strategy below)"
                    )),
                }
                fleet.orphaned.insert(id.clone());
                None
            }
            // Beyond u32 is beyond any replica count, which Argo CD treats like any pin at or
            // above it.
            Shard::Ordinal(n) => Some(ShardId::try_from(n).unwrap_or(ShardId::MAX)),
        };
        // The annotation is copied onto the cluster, whose every shard then declines it; it
        // still counts in the algorithm's ranks.
        if secret
            .annotations()
            .get(SKIP_RECONCILE)
            .and_then(|v| parse_go_bool(v))
            == Some(true)
        {
            fleet.warnings.push(format!(
                "Secret {secret_name:?} has {SKIP_RECONCILE}: no Argo CD replica reconciles cluster {shown:?} (shown as unplaced now, and placed by each strategy below)"
            ));
            fleet.orphaned.insert(id.clone());
            // The user's choice, whatever the balancer was doing.
            fleet.parked.remove(&id);
        }
        let position = fleet.clusters.len();
        index.by_server.insert(server.clone(), position);
        if !name.is_empty() {
            index.by_name.entry(name).or_default().push(position);
        }
        index.secret_names.push(secret_name);
        fleet.servers.insert(id.clone(), server.clone());
        index.servers.push(server);
        fleet.clusters.push(Cluster {
            id,
            name: shown,
            apps: 0,
            pin,
            weight: None,
        });
    }
    if in_cluster_enabled && !index.by_server.contains_key(IN_CLUSTER_SERVER) {
        index
            .by_server
            .insert(IN_CLUSTER_SERVER.into(), fleet.clusters.len());
        index.secret_names.push(String::new());
        index.servers.push(IN_CLUSTER_SERVER.into());
        fleet
            .servers
            .insert(IN_CLUSTER_ID.into(), IN_CLUSTER_SERVER.into());
        fleet.clusters.push(Cluster {
            id: IN_CLUSTER_ID.into(),
            name: IN_CLUSTER_NAME.into(),
            apps: 0,
            pin: None,
            weight: None,
        });
    }

    count_apps(&mut fleet, apps, &index, load);
    fleet
        .clusters
        .sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    Ok(fleet)
}

/// A cluster Secret `plan --apply` may write: one of a cluster Argo CD shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinTarget {
    /// The Secret's name.
    pub secret: String,
    /// The Secret's UID, the cluster's id.
    pub id: String,
    /// The cluster's name as the plan shows it.
    pub cluster: String,
    /// As read: the precondition of every write.
    pub resource_version: String,
    /// The `shard` key as read, if any.
    pub key: Option<String>,
}

/// The cluster Secrets of `fleet`'s clusters that Argo CD shards, by Secret name, and why each
/// other cluster Secret is left as it is. A cluster no replica reconciles (negative `shard`,
/// skip-reconcile), unless the balancer parked it for a handover, or one Argo CD ignores (a
/// config it cannot read, a duplicate server, a disabled in-cluster) would change what Argo CD does with it if pinned, which no plan asks.
pub fn pin_targets(secrets: &[Secret], fleet: &LiveFleet) -> (Vec<PinTarget>, Vec<String>) {
    let names: BTreeMap<&str, &str> = fleet
        .clusters
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    let mut ordered: Vec<&Secret> = secrets.iter().collect();
    ordered.sort_by_key(|s| s.name_any());
    let (mut targets, mut left) = (Vec::new(), Vec::new());
    for secret in ordered {
        let name = secret.name_any();
        let uid = secret.uid().unwrap_or_default();
        let Some(&cluster) = names.get(uid.as_str()) else {
            left.push(format!(
                "Secret {name:?} left as it is: Argo CD does not shard its cluster (see the note or warning that names it)"
            ));
            continue;
        };
        // A cluster the balancer parked is its to place; any other orphan is the user's choice.
        if fleet.orphaned.contains(&uid) && !fleet.parked.contains_key(&uid) {
            left.push(format!(
                "Secret {name:?} left as it is: no Argo CD replica reconciles cluster {cluster:?} (negative shard or {SKIP_RECONCILE}), and pinning it would change that"
            ));
            continue;
        }
        let Some(resource_version) = secret.resource_version().filter(|v| !v.is_empty()) else {
            left.push(format!(
                "Secret {name:?} left as it is: it has no resourceVersion to write it on condition of"
            ));
            continue;
        };
        targets.push(PinTarget {
            secret: name,
            id: uid,
            cluster: cluster.to_string(),
            resource_version,
            key: data(secret, "shard"),
        });
    }
    (targets, left)
}

/// The in-cluster cluster that no Secret describes, if `fleet` has it.
pub fn implicit_in_cluster(fleet: &LiveFleet) -> Option<&Cluster> {
    fleet.clusters.iter().find(|c| c.id == IN_CLUSTER_ID)
}

/// Clusters (positions in `fleet.clusters`) by what Applications name them with.
#[derive(Default)]
struct Index {
    by_server: BTreeMap<String, usize>,
    /// Several clusters may share a name; Argo CD then resolves the name to none of them.
    by_name: BTreeMap<String, Vec<usize>>,
    /// By position: the Secret's name (empty for the implicit in-cluster cluster) and server.
    secret_names: Vec<String>,
    servers: Vec<String>,
}

/// Where an Application's destination leads, as Argo CD's `GetDestinationCluster` resolves it.
enum Destination {
    Cluster(usize),
    /// A name several clusters share.
    Ambiguous(String),
    /// No cluster, both name and server, or neither.
    Unresolved,
}

fn resolve(app: &DynamicObject, index: &Index) -> Destination {
    let field = |name: &str| {
        app.data
            .pointer(&format!("/spec/destination/{name}"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    match (field("server"), field("name")) {
        // Argo CD refuses a destination with both.
        (Some(_), Some(_)) | (None, None) => Destination::Unresolved,
        (Some(server), None) => index
            .by_server
            .get(&normalise_server(server))
            .map_or(Destination::Unresolved, |&i| Destination::Cluster(i)),
        (None, Some(name)) => match index.by_name.get(name).map(Vec::as_slice) {
            Some([only]) => Destination::Cluster(*only),
            Some([_, _, ..]) => Destination::Ambiguous(name.to_string()),
            // No cluster of that name: `in-cluster` still names the local server.
            _ => (name == IN_CLUSTER_NAME)
                .then(|| index.by_server.get(IN_CLUSTER_SERVER))
                .flatten()
                .map_or(Destination::Unresolved, |&i| Destination::Cluster(i)),
        },
    }
}

/// When the sync operation running on `app` started: phase Running (or Terminating, which
/// still runs hooks) with a readable `startedAt`. Argo CD writes both in one update.
fn running_since(app: &DynamicObject) -> Option<jiff::Timestamp> {
    let state = app.data.pointer("/status/operationState")?;
    let phase = state.get("phase").and_then(Value::as_str)?;
    if !matches!(phase, "Running" | "Terminating") {
        return None;
    }
    state.get("startedAt")?.as_str()?.parse().ok()
}

/// Counts each Application toward the cluster its destination resolves to. Argo CD's
/// controller lets every replica process an Application whose destination does not resolve
/// (it reports the error), so those are noted and counted toward no cluster.
fn count_apps(fleet: &mut LiveFleet, apps: &[DynamicObject], index: &Index, load: ArgoCdLoad) {
    let mut unmatched = Vec::new();
    let mut ambiguous: BTreeMap<String, u64> = BTreeMap::new();
    let mut server_apps = vec![0u64; index.servers.len()];
    for app in apps {
        // Argo CD's consistent-hashing weighs a cluster by the Applications whose
        // destination.server is, byte for byte, the cluster's (trimmed) server.
        if let Some(server) = app
            .data
            .pointer("/spec/destination/server")
            .and_then(Value::as_str)
            && let Some(&i) = index.by_server.get(server)
            && index.servers[i] == server
        {
            server_apps[i] += 1;
        }
        match resolve(app, index) {
            Destination::Cluster(i) => {
                let weight = match load {
                    ArgoCdLoad::Apps => 1,
                    ArgoCdLoad::Resources => app
                        .data
                        .pointer("/status/resources")
                        .and_then(Value::as_array)
                        .map_or(0, |r| r.len() as u64),
                };
                let cluster = &mut fleet.clusters[i];
                cluster.apps += weight;
                let id = cluster.id.clone();
                // Slicing cuts a cluster by its apps' keys, one per app: they count apps, so
                // they stand for no other load.
                if load == ArgoCdLoad::Apps {
                    fleet.add_app_key(&id, app.metadata.uid.as_deref());
                }
                if let Some(started) = running_since(app) {
                    let oldest = fleet.syncing.entry(id.clone()).or_insert(started);
                    *oldest = (*oldest).min(started);
                }
                fleet.cluster_apps.entry(id).or_default().push((
                    app.metadata.namespace.clone().unwrap_or_default(),
                    app.metadata.name.clone().unwrap_or_default(),
                ));
            }
            Destination::Ambiguous(name) => {
                *ambiguous.entry(name).or_default() += 1;
                unmatched.push(app_name(app));
            }
            Destination::Unresolved => unmatched.push(app_name(app)),
        }
    }
    fleet.finish_keys();
    for (i, count) in server_apps.into_iter().enumerate() {
        fleet
            .server_apps
            .insert(fleet.clusters[i].id.clone(), count);
    }
    for (name, count) in ambiguous {
        let secrets: Vec<String> = index.by_name[&name]
            .iter()
            .map(|&i| index.secret_names[i].clone())
            .collect();
        fleet.warnings.push(format!(
            "Secrets {} all name their cluster {name:?}: Argo CD fails the destination of the {count} Application(s) that target that name, and every replica processes them",
            some_names(&secrets)
        ));
    }
    unmatched.sort();
    if !unmatched.is_empty() {
        fleet.unmatched_apps = unmatched.len() as u64;
        fleet.warnings.push(format!(
            "{} Application(s) have a destination Argo CD cannot resolve to one cluster, so every replica processes them (and reports the error); not counted: {}",
            unmatched.len(),
            some_names(&unmatched)
        ));
    }
}

fn app_name(app: &DynamicObject) -> String {
    format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any())
}

/// A data key of a Secret as text.
fn data(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&bytes.0).into_owned())
}

/// Why Argo CD cannot read the Secret's `config` key, if it cannot. Argo CD unmarshals a
/// non-empty value into a struct: it must be JSON, an object or `null`. Go replaces invalid
/// UTF-8 rather than failing, hence the lossy text.
fn config_error(secret: &Secret) -> Option<String> {
    let text = data(secret, "config").filter(|t| !t.is_empty())?;
    match serde_json::from_str::<Value>(&text) {
        Err(e) => Some(format!("not JSON: {e}")),
        Ok(Value::Object(_) | Value::Null) => None,
        Ok(_) => Some("JSON, but not an object".into()),
    }
}

/// Go's `strconv.ParseBool`; `None` when it fails.
pub fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Argo CD trims trailing slashes from a Secret's server; a destination's are trimmed alike.
fn normalise_server(server: &str) -> String {
    server.trim_end_matches('/').to_string()
}

/// The optional `shard` key, as Argo CD reads it.
#[derive(Debug, PartialEq, Eq)]
enum Shard {
    Unset,
    /// Go's `strconv.Atoi` fails (surrounding whitespace, a trailing newline from `echo`):
    /// Argo CD ignores the key.
    Unparsable(String),
    /// No replica has this ordinal.
    Negative(i64),
    Ordinal(u64),
}

fn shard(secret: &Secret) -> Shard {
    let Some(text) = data(secret, "shard") else {
        return Shard::Unset;
    };
    // Rust's i64 parse takes what Atoi takes on 64-bit Go: an optional sign, then digits.
    match text.parse::<i64>() {
        Ok(n) => u64::try_from(n).map_or(Shard::Negative(n), Shard::Ordinal),
        Err(_) => Shard::Unparsable(text),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use serde_json::json;

    use std::collections::BTreeSet;

    use super::*;
    use crate::shardwise::fixtures::argocd_application as application;

    fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("argocd".into());
        s.metadata.uid = Some(format!("uid-{name}"));
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    fn apps_by_cluster(fleet: &LiveFleet) -> Vec<(&str, &str, u64, Option<u32>)> {
        fleet
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.id.as_str(), c.apps, c.pin))
            .collect()
    }

    #[test]
    fn secrets_become_clusters_identified_by_uid_and_apps_follow_server_or_name() {
        let secrets = [
            secret(
                "cluster-prod",
                &[
                    ("name", "prod"),
                    ("server", "https://prod:6443"),
                    ("shard", "1"),
                ],
            ),
            secret(
                "cluster-dev",
                &[("name", "dev"), ("server", "https://dev:6443/")],
            ),
        ];
        let apps = [
            application("a", json!({"server": "https://prod:6443"})),
            application("b", json!({"name": "prod", "namespace": "x"})),
            application("c", json!({"server": "https://dev:6443"})),
            application("d", json!({"name": "dev"})),
            application("e", json!({"name": "nowhere"})),
            application("f", json!({})),
        ];
        let fleet = fleet(&secrets, &apps, true, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [
                ("dev", "uid-cluster-dev", 2, None),
                ("in-cluster", "", 0, None),
                ("prod", "uid-cluster-prod", 2, Some(1)),
            ]
        );
        assert!(fleet.recorded.is_empty());
        assert_eq!(fleet.unmatched_apps, 2);
        // Slicing keys: the apps' UIDs, per cluster, sorted.
        let mut prod = vec![
            shard_assign::app_key("uid-app-a"),
            shard_assign::app_key("uid-app-b"),
        ];
        prod.sort_unstable();
        assert_eq!(fleet.keys.get("uid-cluster-prod"), Some(&prod));
        assert_eq!(fleet.keys.get("uid-cluster-dev").map(Vec::len), Some(2));
        assert_eq!(
            fleet.warnings,
            [
                r#"2 Application(s) have a destination Argo CD cannot resolve to one cluster, so every replica processes them (and reports the error); not counted: "argocd/e", "argocd/f""#
            ]
        );
    }

    #[test]
    fn apps_for_the_local_cluster_go_to_the_implicit_in_cluster_cluster() {
        let apps = [
            application("a", json!({"server": IN_CLUSTER_SERVER})),
            application("b", json!({"name": "in-cluster"})),
            application("c", json!({"server": "https://kubernetes.default.svc/"})),
        ];
        let fleet = fleet(&[], &apps, true, ArgoCdLoad::Apps).unwrap();
        assert_eq!(apps_by_cluster(&fleet), [("in-cluster", "", 3, None)]);
    }

    #[test]
    fn a_secret_for_the_local_cluster_replaces_the_implicit_one() {
        let secrets = [secret(
            "local",
            &[("name", "home"), ("server", IN_CLUSTER_SERVER)],
        )];
        let apps = [
            application("a", json!({"server": IN_CLUSTER_SERVER})),
            // The name "in-cluster" still resolves to the local server.
            application("b", json!({"name": "in-cluster"})),
            application("c", json!({"name": "home"})),
        ];
        let fleet = fleet(&secrets, &apps, true, ArgoCdLoad::Apps).unwrap();
        assert_eq!(apps_by_cluster(&fleet), [("home", "uid-local", 3, None)]);
    }

    #[test]
    fn a_disabled_in_cluster_cluster_does_not_exist() {
        let secrets = [secret("local", &[("server", IN_CLUSTER_SERVER)])];
        let apps = [application("a", json!({"name": "in-cluster"}))];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert!(fleet.clusters.is_empty());
        assert_eq!(fleet.unmatched_apps, 1);
        assert!(fleet.notes[0].contains("argocd-cm disables"));
    }

    #[test]
    fn a_destination_with_both_name_and_server_resolves_to_nothing() {
        let secrets = [
            secret("one", &[("name", "one"), ("server", "https://one")]),
            secret("two", &[("name", "two"), ("server", "https://two")]),
        ];
        let apps = [application(
            "a",
            json!({"server": "https://two", "name": "one"}),
        )];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("one", "uid-one", 0, None), ("two", "uid-two", 0, None)]
        );
        assert_eq!(fleet.unmatched_apps, 1);
    }

    #[test]
    fn shard_keys_are_read_as_argo_cd_reads_them() {
        let secrets = [
            secret(
                "a",
                &[("name", "a"), ("server", "https://a"), ("shard", "1\n")],
            ),
            secret(
                "b",
                &[("name", "b"), ("server", "https://b"), ("shard", "-1")],
            ),
            secret(
                "c",
                &[("name", "c"), ("server", "https://c"), ("shard", "+2")],
            ),
            secret(
                "d",
                &[
                    ("name", "d"),
                    ("server", "https://d"),
                    ("shard", "99999999999"),
                ],
            ),
        ];
        let fleet = fleet(&secrets, &[], false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [
                ("a", "uid-a", 0, None),
                ("b", "uid-b", 0, None),
                ("c", "uid-c", 0, Some(2)),
                ("d", "uid-d", 0, Some(u32::MAX)),
            ]
        );
        // A negative shard is no shard: the cluster is orphaned.
        assert_eq!(fleet.orphaned, BTreeSet::from(["uid-b".to_string()]));
        assert_eq!(fleet.notes.len(), 1);
        assert!(fleet.notes[0].contains(r#"shard "1\n", which Argo CD cannot parse"#));
        assert_eq!(fleet.warnings.len(), 1);
        assert!(
            fleet.warnings[0]
                .contains(r#"has shard -1: no Argo CD replica reconciles cluster "b""#),
            "{}",
            fleet.warnings[0]
        );
    }

    #[test]
    fn a_duplicate_server_keeps_one_secret_and_leaves_the_other_out() {
        let secrets = [
            secret("b", &[("name", "b"), ("server", "https://same")]),
            secret("a", &[("name", "a"), ("server", "https://same/")]),
        ];
        let apps = [application("x", json!({"server": "https://same"}))];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(apps_by_cluster(&fleet), [("a", "uid-a", 1, None)]);
        assert_eq!(fleet.warnings.len(), 1);
        assert!(
            fleet.warnings[0].starts_with(
                r#"Secrets "a" and "b" have the same server "https://same": Argo CD keeps one of them"#
            ),
            "{}",
            fleet.warnings[0]
        );
    }

    #[test]
    fn a_cluster_annotated_to_skip_reconcile_is_orphaned() {
        let mut skipped = secret("s", &[("name", "s"), ("server", "https://s")]);
        skipped.metadata.annotations = Some(BTreeMap::from([(
            SKIP_RECONCILE.to_string(),
            "True".to_string(),
        )]));
        let mut kept = secret("k", &[("name", "k"), ("server", "https://k")]);
        kept.metadata.annotations = Some(BTreeMap::from([(
            SKIP_RECONCILE.to_string(),
            "yes".to_string(),
        )]));
        let fleet = fleet(&[skipped, kept], &[], false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(fleet.orphaned, BTreeSet::from(["uid-s".to_string()]));
        assert_eq!(fleet.warnings.len(), 1);
        assert!(
            fleet.warnings[0].contains("argocd.argoproj.io/skip-reconcile: no Argo CD replica")
        );
    }

    #[test]
    fn a_cluster_parked_for_a_handover_is_unreconciled_but_left_to_the_balancer() {
        let annotated = |mut s: Secret, pairs: &[(&str, &str)]| {
            s.metadata.annotations = Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            s
        };
        let parked = annotated(
            secret(
                "p",
                &[("name", "p"), ("server", "https://p"), ("shard", "-1")],
            ),
            &[(HANDOVER_ANNOTATION, "2")],
        );
        // The user's own negative key, and one the balancer parked that the user then told
        // Argo CD to skip: both the user's choice.
        let own = secret(
            "o",
            &[("name", "o"), ("server", "https://o"), ("shard", "-1")],
        );
        let skipped = annotated(
            secret(
                "s",
                &[("name", "s"), ("server", "https://s"), ("shard", "-1")],
            ),
            &[(HANDOVER_ANNOTATION, "1"), (SKIP_RECONCILE, "true")],
        );
        // An annotation that names no shard is not the balancer's.
        let garbled = annotated(
            secret(
                "g",
                &[("name", "g"), ("server", "https://g"), ("shard", "-1")],
            ),
            &[(HANDOVER_ANNOTATION, "two")],
        );
        let mut secrets = [parked, own, skipped, garbled];
        for s in &mut secrets {
            s.metadata.resource_version = Some("7".into());
        }
        let fleet = fleet(&secrets, &[], false, ArgoCdLoad::Apps).unwrap();
        let ids = |names: &[&str]| -> BTreeSet<String> {
            names.iter().map(|n| format!("uid-{n}")).collect()
        };
        assert_eq!(fleet.orphaned, ids(&["g", "o", "p", "s"]));
        assert_eq!(fleet.parked, BTreeMap::from([("uid-p".to_string(), 2)]));
        assert!(
            fleet
                .notes
                .iter()
                .any(|n| n.contains("handing cluster \"p\" over to shard 2")),
            "{:?}",
            fleet.notes
        );
        assert!(!fleet.warnings.iter().any(|w| w.contains("Secret \"p\"")));
        let (targets, left) = pin_targets(&secrets, &fleet);
        let targets: Vec<&str> = targets.iter().map(|t| t.secret.as_str()).collect();
        assert_eq!(targets, ["p"]);
        assert_eq!(left.len(), 3, "{left:?}");
    }

    #[test]
    fn a_duplicate_name_resolves_to_no_cluster() {
        let secrets = [
            secret("s1", &[("name", "prod"), ("server", "https://one")]),
            secret("s2", &[("name", "prod"), ("server", "https://two")]),
        ];
        let apps = [
            application("by-name", json!({"name": "prod"})),
            application("by-server", json!({"server": "https://two"})),
        ];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("prod", "uid-s1", 0, None), ("prod", "uid-s2", 1, None)]
        );
        assert_eq!(fleet.unmatched_apps, 1);
        assert!(fleet.warnings[0].starts_with(
            r#"Secrets "s1", "s2" all name their cluster "prod": Argo CD fails the destination of the 1 Application(s)"#
        ));
    }

    #[test]
    fn a_secret_without_a_name_key_gives_a_cluster_no_name() {
        let secrets = [secret("cluster-x", &[("server", "https://x")])];
        let apps = [
            application("by-object-name", json!({"name": "cluster-x"})),
            application("by-server", json!({"server": "https://x"})),
        ];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("(Secret cluster-x)", "uid-cluster-x", 1, None)]
        );
        assert_eq!(fleet.unmatched_apps, 1);
        assert!(fleet.notes[0].contains("has no name key: Argo CD gives its cluster no name"));
    }

    #[test]
    fn a_secret_whose_config_argo_cd_cannot_read_is_no_cluster() {
        let cluster = |name: &str, config: &str| {
            let server = format!("https://{name}");
            secret(
                name,
                &[("name", name), ("server", &server), ("config", config)],
            )
        };
        let secrets = [
            cluster("bad", "{not json"),
            cluster("list", "[]"),
            cluster("good", r#"{"bearerToken": "t"}"#),
            cluster("null", "null"),
        ];
        let apps = [application("a", json!({"server": "https://bad"}))];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("good", "uid-good", 0, None), ("null", "uid-null", 0, None)]
        );
        assert_eq!(fleet.unmatched_apps, 1);
        assert!(
            fleet.warnings[0]
                .starts_with(r#"Secret "bad" has a config Argo CD cannot read (not JSON"#),
            "{}",
            fleet.warnings[0]
        );
        assert!(
            fleet.warnings[1].contains("(JSON, but not an object): Argo CD ignores this cluster")
        );
    }

    #[test]
    fn resources_load_counts_status_resources_and_consistent_hashing_counts_by_server() {
        let secrets = [secret("s", &[("name", "prod"), ("server", "https://prod")])];
        let mut by_server = application("a", json!({"server": "https://prod/"}));
        by_server.data["status"] = json!({"resources": [{}, {}, {}]});
        let mut by_name = application("b", json!({"name": "prod"}));
        by_name.data["status"] = json!({"resources": [{}]});
        let exact = application("c", json!({"server": "https://prod"}));
        let apps = [by_server, by_name, exact];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Resources).unwrap();
        assert_eq!(apps_by_cluster(&fleet), [("prod", "uid-s", 4, None)]);
        // Keys stand for apps, so a resource load leaves the cluster uncut.
        assert!(fleet.keys.is_empty());
        // Only "c" names the server byte for byte, as Argo CD's consistent-hashing counts.
        assert_eq!(fleet.server_apps.get("uid-s"), Some(&1));
    }

    #[test]
    fn the_oldest_running_sync_of_each_clusters_apps_is_kept() {
        let secrets = [
            secret("p", &[("name", "prod"), ("server", "https://prod")]),
            secret("q", &[("name", "qa"), ("server", "https://qa")]),
        ];
        let with = |name: &str, cluster: &str, phase: &str, started: &str| {
            let mut app = application(name, json!({"name": cluster}));
            app.data["status"] = json!({"operationState": {"phase": phase, "startedAt": started}});
            app
        };
        let apps = [
            with("a", "prod", "Running", "2026-12-01T10:05:00Z"),
            with("b", "prod", "Terminating", "2026-12-01T10:01:00Z"),
            with("c", "prod", "Running", "not a time"),
            with("d", "qa", "Succeeded", "2026-12-01T09:00:00Z"),
            with("e", "qa", "Failed", "2026-12-01T09:00:00Z"),
        ];
        let fleet = fleet(&secrets, &apps, false, ArgoCdLoad::Apps).unwrap();
        let started: jiff::Timestamp = "2026-12-01T10:01:00Z".parse().unwrap();
        assert_eq!(
            fleet.syncing,
            BTreeMap::from([("uid-p".to_string(), started)])
        );
    }

    #[test]
    fn pin_targets_are_the_secrets_of_clusters_argo_cd_shards() {
        let mut skipped = secret("skipped", &[("name", "s"), ("server", "https://s")]);
        skipped
            .annotations_mut()
            .insert(SKIP_RECONCILE.into(), "true".into());
        let mut secrets = vec![
            secret(
                "b",
                &[("name", "b"), ("server", "https://b"), ("shard", "1")],
            ),
            secret("a", &[("name", "a"), ("server", "https://a")]),
            secret("negative", &[("server", "https://n"), ("shard", "-1")]),
            secret("broken", &[("server", "https://x"), ("config", "{")]),
            secret("twin", &[("server", "https://a")]),
            skipped,
        ];
        for s in &mut secrets {
            s.metadata.resource_version = Some(format!("rv-{}", s.name_any()));
        }
        let fleet = fleet(&secrets, &[], true, ArgoCdLoad::Apps).unwrap();
        let (targets, left) = pin_targets(&secrets, &fleet);
        let target = |name: &str, key: Option<&str>| PinTarget {
            secret: name.into(),
            id: format!("uid-{name}"),
            cluster: name.into(),
            resource_version: format!("rv-{name}"),
            key: key.map(str::to_string),
        };
        assert_eq!(targets, [target("a", None), target("b", Some("1"))]);
        let left: Vec<&str> = left
            .iter()
            .map(|l| l.split_once(" left").unwrap().0)
            .collect();
        assert_eq!(
            left,
            [
                r#"Secret "broken""#,
                r#"Secret "negative""#,
                r#"Secret "skipped""#,
                r#"Secret "twin""#
            ]
        );
        assert_eq!(
            implicit_in_cluster(&fleet).map(|c| c.name.as_str()),
            Some("in-cluster")
        );
    }

    #[test]
    fn secrets_without_uid_are_refused() {
        let mut s = secret("a", &[("server", "https://a")]);
        s.metadata.uid = None;
        assert_eq!(
            fleet(&[s], &[], true, ArgoCdLoad::Apps).unwrap_err(),
            FleetError::MissingUid {
                kind: "Secret",
                name: "a".into()
            }
        );
    }
}
