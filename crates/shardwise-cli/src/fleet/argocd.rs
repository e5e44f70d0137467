//! Argo CD's fleet: cluster Secrets and `applications.argoproj.io`, mapped the way Argo CD's
//! application controller shards them. Argo CD records no placement, so the fleet has none.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::Value;
use shard_assign::{Cluster, ShardId};

use super::{FleetError, LiveFleet, some_names};

/// Label selector of Argo CD's cluster Secrets.
pub(crate) const CLUSTER_SECRET_SELECTOR: &str = "argocd.argoproj.io/secret-type=cluster";
/// The API server of the cluster Argo CD runs in.
const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// Name of that cluster when no Secret describes it.
const IN_CLUSTER_NAME: &str = "in-cluster";
/// Id of that cluster when no Secret describes it: Argo CD's legacy sharding puts an empty id on
/// shard 0, and so does `legacy-modulo`.
const IN_CLUSTER_ID: &str = "";

/// Builds the fleet from cluster Secrets and Applications. `in_cluster_enabled` is Argo CD's
/// `cluster.inClusterEnabled` (default true): when set, the cluster Argo CD runs in exists even
/// without a Secret; when not, it does not exist even with one.
pub(crate) fn fleet(
    secrets: &[Secret],
    apps: &[DynamicObject],
    in_cluster_enabled: bool,
) -> Result<LiveFleet, FleetError> {
    let mut ordered: Vec<&Secret> = secrets.iter().collect();
    ordered.sort_by_key(|s| s.name_any());

    let mut fleet = LiveFleet::default();
    // Index into fleet.clusters by server and by name; the first Secret (in name order) wins.
    let mut by_server: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_name: BTreeMap<String, usize> = BTreeMap::new();
    for secret in ordered {
        let secret_name = secret.name_any();
        let server = normalise_server(&data(secret, "server").unwrap_or_default());
        if server == IN_CLUSTER_SERVER && !in_cluster_enabled {
            fleet.notes.push(format!(
                "Secret {secret_name:?} describes the in-cluster cluster, which argocd-cm disables; left out"
            ));
            continue;
        }
        let id = secret.uid().ok_or_else(|| FleetError::MissingUid {
            kind: "Secret",
            name: secret_name.clone(),
        })?;
        let name = data(secret, "name")
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| secret_name.clone());
        let index = fleet.clusters.len();
        for (kind, key, map) in [
            ("server", &server, &mut by_server),
            ("name", &name, &mut by_name),
        ] {
            if key.is_empty() {
                continue;
            }
            if let Some(&first) = map.get(key.as_str()) {
                fleet.notes.push(format!(
                    "Secrets of clusters {:?} and {name:?} have the same {kind} {key:?}; apps naming it count toward {:?}",
                    fleet.clusters[first].name, fleet.clusters[first].name
                ));
            } else {
                map.insert(key.clone(), index);
            }
        }
        fleet.clusters.push(Cluster {
            id,
            name,
            apps: 0,
            pin: pin(secret, &secret_name, &mut fleet.notes),
            weight: None,
        });
    }
    if in_cluster_enabled && !by_server.contains_key(IN_CLUSTER_SERVER) {
        by_server.insert(IN_CLUSTER_SERVER.into(), fleet.clusters.len());
        fleet.clusters.push(Cluster {
            id: IN_CLUSTER_ID.into(),
            name: IN_CLUSTER_NAME.into(),
            apps: 0,
            pin: None,
            weight: None,
        });
    }

    count_apps(&mut fleet, apps, &by_server, &by_name);
    fleet
        .clusters
        .sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    Ok(fleet)
}

/// Counts each Application toward the cluster its destination names (by server, else by
/// name), as Argo CD resolves it; the others are noted as unmatched.
fn count_apps(
    fleet: &mut LiveFleet,
    apps: &[DynamicObject],
    by_server: &BTreeMap<String, usize>,
    by_name: &BTreeMap<String, usize>,
) {
    let mut unmatched = Vec::new();
    for app in apps {
        let destination = |field: &str| {
            app.data
                .pointer(&format!("/spec/destination/{field}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        // Argo CD refuses a destination with both; when both are there, the server decides.
        let target = match (destination("server"), destination("name")) {
            (Some(server), _) => by_server.get(&normalise_server(server)),
            (None, Some(name)) => by_name.get(name).or_else(|| {
                (name == IN_CLUSTER_NAME)
                    .then(|| by_server.get(IN_CLUSTER_SERVER))
                    .flatten()
            }),
            (None, None) => None,
        };
        match target {
            Some(&index) => {
                fleet.clusters[index].apps += 1;
                let id = fleet.clusters[index].id.clone();
                fleet.add_app_key(&id, app.metadata.uid.as_deref());
            }
            None => unmatched.push(format!(
                "{}/{}",
                app.namespace().unwrap_or_default(),
                app.name_any()
            )),
        }
    }
    fleet.finish_keys();
    unmatched.sort();
    if !unmatched.is_empty() {
        fleet.unmatched_apps = unmatched.len() as u64;
        fleet.notes.push(format!(
            "{} Application(s) target no known cluster and are not counted: {}",
            unmatched.len(),
            some_names(&unmatched)
        ));
    }
}

/// A data key of a Secret as text.
fn data(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    Some(String::from_utf8_lossy(&bytes.0).into_owned())
}

/// Argo CD trims trailing slashes from a Secret's server; a destination's are trimmed alike.
fn normalise_server(server: &str) -> String {
    server.trim_end_matches('/').to_string()
}

/// The optional `shard` key. Argo CD parses it with Go's `strconv.Atoi` and ignores the key
/// when that fails, so surrounding whitespace (a trailing newline from `echo`) unpins.
fn pin(secret: &Secret, secret_name: &str, notes: &mut Vec<String>) -> Option<ShardId> {
    let text = data(secret, "shard")?;
    match text.parse::<i64>() {
        Ok(n) => match ShardId::try_from(n) {
            Ok(shard) => Some(shard),
            Err(_) => {
                notes.push(format!(
                    "Secret {secret_name:?} has shard {n}, which is not a shard ordinal; treated as unpinned"
                ));
                None
            }
        },
        Err(_) => {
            notes.push(format!(
                "Secret {secret_name:?} has shard {text:?}, which Argo CD cannot parse and ignores; treated as unpinned"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use kube::api::ApiResource;
    use serde_json::json;

    use super::*;

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

    fn application(name: &str, destination: Value) -> DynamicObject {
        let resource = ApiResource {
            group: "argoproj.io".into(),
            version: "v1alpha1".into(),
            api_version: "argoproj.io/v1alpha1".into(),
            kind: "Application".into(),
            plural: "applications".into(),
        };
        let mut app = DynamicObject::new(name, &resource)
            .within("argocd")
            .data(json!({"spec": {"destination": destination}}));
        app.metadata.uid = Some(format!("uid-app-{name}"));
        app
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
        let fleet = fleet(&secrets, &apps, true).unwrap();
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
            fleet.notes,
            [
                r#"2 Application(s) target no known cluster and are not counted: "argocd/e", "argocd/f""#
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
        let fleet = fleet(&[], &apps, true).unwrap();
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
        let fleet = fleet(&secrets, &apps, true).unwrap();
        assert_eq!(apps_by_cluster(&fleet), [("home", "uid-local", 3, None)]);
    }

    #[test]
    fn a_disabled_in_cluster_cluster_does_not_exist() {
        let secrets = [secret("local", &[("server", IN_CLUSTER_SERVER)])];
        let apps = [application("a", json!({"name": "in-cluster"}))];
        let fleet = fleet(&secrets, &apps, false).unwrap();
        assert!(fleet.clusters.is_empty());
        assert_eq!(fleet.unmatched_apps, 1);
        assert!(fleet.notes[0].contains("argocd-cm disables"));
    }

    #[test]
    fn the_server_decides_when_a_destination_has_both() {
        let secrets = [
            secret("one", &[("name", "one"), ("server", "https://one")]),
            secret("two", &[("name", "two"), ("server", "https://two")]),
        ];
        let apps = [application(
            "a",
            json!({"server": "https://two", "name": "one"}),
        )];
        let fleet = fleet(&secrets, &apps, false).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("one", "uid-one", 0, None), ("two", "uid-two", 1, None)]
        );
    }

    #[test]
    fn shard_keys_argo_cd_cannot_parse_are_ignored_with_a_note() {
        let secrets = [
            secret("a", &[("server", "https://a"), ("shard", "1\n")]),
            secret("b", &[("server", "https://b"), ("shard", "-1")]),
            secret("c", &[("server", "https://c"), ("shard", "+2")]),
        ];
        let fleet = fleet(&secrets, &[], false).unwrap();
        // Without a name key, the Secret's name names the cluster.
        assert_eq!(
            apps_by_cluster(&fleet),
            [
                ("a", "uid-a", 0, None),
                ("b", "uid-b", 0, None),
                ("c", "uid-c", 0, Some(2))
            ]
        );
        assert_eq!(fleet.notes.len(), 2);
        assert!(fleet.notes[0].contains(r#"shard "1\n", which Argo CD cannot parse"#));
        assert!(fleet.notes[1].contains("shard -1, which is not a shard ordinal"));
    }

    #[test]
    fn duplicate_servers_count_toward_the_first_secret() {
        let secrets = [
            secret("b", &[("name", "b"), ("server", "https://same")]),
            secret("a", &[("name", "a"), ("server", "https://same")]),
        ];
        let apps = [application("x", json!({"server": "https://same"}))];
        let fleet = fleet(&secrets, &apps, false).unwrap();
        assert_eq!(
            apps_by_cluster(&fleet),
            [("a", "uid-a", 1, None), ("b", "uid-b", 0, None)]
        );
        assert_eq!(
            fleet.notes,
            [
                r#"Secrets of clusters "a" and "b" have the same server "https://same"; apps naming it count toward "a""#
            ]
        );
    }

    #[test]
    fn secrets_without_uid_are_refused() {
        let mut s = secret("a", &[("server", "https://a")]);
        s.metadata.uid = None;
        assert_eq!(
            fleet(&[s], &[], true).unwrap_err(),
            FleetError::MissingUid {
                kind: "Secret",
                name: "a".into()
            }
        );
    }
}
