//! charts/shardwise installed with the real `helm`, as a user installs it, on a control plane
//! that runs pods: the StatefulSet controller creates the replicas, node agents run them under
//! the chart's ServiceAccount and RBAC with kube-rs's in-cluster configuration, and the fleet
//! syncs. Needs root and the binaries of scripts/control-plane.sh.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;
use shardwise_api::{FleetApp, FleetCluster, SyncPhase};
use shardwise_e2e::{Environment, FaultScope, pod_link, pod_ready, wait_for};
use support::chart::{
    NAMESPACE, Pods, RELEASE, Sampler, VALUES, add_fleet, environment, helm, install, kubectl,
    longest_handoff,
};
use support::pods;
use support::prometheus::Prometheus;
use support::{DESTINATION_IDENTITY, repo_file};

/// The suite's FleetClusters, all on the one destination.
const CLUSTERS: u32 = 4;
/// Longer than any graceful handoff (drain, acknowledgement, relabel: about a second here) and
/// shorter than the chart's renew deadline (10 s), which a handoff waiting for an expired lease
/// would take at least.
const HANDOFF_BOUND: Duration = Duration::from_secs(5);
/// No two replica processes ever reconciled one cluster at once, in the merged audit of every
/// replica pod that ran; `deaths` says when killed processes died.
fn no_overlaps(env: &Environment, deaths: &std::collections::BTreeMap<u32, u64>) {
    let audits = pods::audit_files(env, NAMESPACE, RELEASE);
    let intervals = shardwise_runtime::audit::read(&audits, "cluster").unwrap();
    assert!(
        intervals.len() >= 40,
        "{} reconciles audited",
        intervals.len()
    );
    eprintln!(
        "{} reconciles audited in {} replica pods",
        intervals.len(),
        audits.len()
    );
    let overlaps = shardwise_runtime::audit::overlaps(&intervals, deaths);
    assert!(
        overlaps.is_empty(),
        "{} overlaps, e.g. {}; the replicas' log lines on its unit:\n{}",
        overlaps.len(),
        overlaps[0],
        replica_logs(env)
            .iter()
            .flat_map(|log| std::fs::read_to_string(log)
                .unwrap_or_default()
                .lines()
                .map(|l| format!("{}: {l}", log.display()))
                .collect::<Vec<_>>())
            .filter(|line| line.contains(&overlaps[0].first.unit))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_the_chart_and_its_pods_sync_the_fleet() {
    let env = environment();
    let admin = env.control_plane().client("admin").await.unwrap();
    let chart = repo_file("charts/shardwise");
    let installed = install(&env, &[]).await;
    eprintln!("{installed}");
    // Every renewal of every shard lease, for the destinations' fencing check.
    let leases = support::fencing::LeaseHistory::record(admin.clone(), NAMESPACE);
    add_fleet(&env, CLUSTERS, 0..40).await;
    // The StatefulSet controller's 3 replicas Ready, owning every cluster, every app Synced.
    settled(&env, 3, 40).await;
    helm(
        &env,
        &["test", RELEASE, "--namespace", NAMESPACE, "--timeout", "2m"],
    );
    scrape_as_the_service_monitor(&env, &chart).await;

    // The real StatefulSet controller creates and deletes the pods as the count changes.
    for replicas in [5u32, 2] {
        kubectl(
            &env,
            &[
                "scale",
                "statefulset",
                RELEASE,
                &format!("--replicas={replicas}"),
            ],
        );
        settled(&env, replicas, 40).await;
    }

    // A container killed outright (as by the OOM killer) is restarted by its node.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let victim = format!("{RELEASE}-1");
    let pid = pods::container_pid(&victim, None, "shardwise-controller")
        .unwrap_or_else(|| panic!("no process of {victim}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Its reconcile in flight, if any, ends here: the audit's open interval lasts until now.
    let deaths = std::collections::BTreeMap::from([(pid, shardwise_runtime::audit::now_nanos())]);
    wait_for(
        &format!("{victim} restarted after its SIGKILL"),
        Duration::from_secs(60),
        || async {
            let pod = pods.get(&victim).await.map_err(|e| e.to_string())?;
            let status = pod
                .status
                .unwrap_or_default()
                .container_statuses
                .unwrap_or_default();
            let Some(c) = status.first() else {
                return Err("no container status".into());
            };
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code);
            if c.restart_count == 1 && last == Some(137) && c.ready {
                Ok(())
            } else {
                Err(format!(
                    "restarts {}, last exit {last:?}, ready {}",
                    c.restart_count, c.ready
                ))
            }
        },
    )
    .await
    .unwrap();
    settled(&env, 2, 40).await;

    // The chart's PodDisruptionBudget (maxUnavailable 1): one eviction goes through; a second
    // one while the first pod is away is refused; once its replacement is Ready, the next one
    // goes through.
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), NAMESPACE);
    let one_disruption_allowed = || async {
        let budget = budgets.get(RELEASE).await.map_err(|e| e.to_string())?;
        let status = budget.status.unwrap_or_default();
        if status.observed_generation == budget.metadata.generation
            && status.current_healthy == 2
            && status.disruptions_allowed == 1
        {
            Ok(())
        } else {
            Err(format!("{status:?}"))
        }
    };
    wait_for(
        "the budget to allow one disruption",
        Duration::from_secs(60),
        one_disruption_allowed,
    )
    .await
    .unwrap();
    // Through kubectl: kube-rs's client retries a 429 for minutes, kubectl (client-go) does not
    // when the answer names no Retry-After, as the eviction's refusal does not.
    let evict = |pod: &str| {
        let body = env.dir().join(format!("eviction-{pod}.json"));
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod, "namespace": NAMESPACE}});
        std::fs::write(&body, eviction.to_string()).unwrap();
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(env.control_plane().kubeconfig_path_all())
            .args(["create", "--raw"])
            .arg(format!(
                "/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction"
            ))
            .arg("-f")
            .arg(&body)
            .output()
            .unwrap();
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    };
    // The node cordoned, the evicted pod's replacement cannot start: the budget stays spent
    // however fast the StatefulSet would bring it back.
    kubectl(&env, &["cordon", "node-0"]);
    let evicted = uid(&pods, "shardwise-1").await;
    evict("shardwise-1").unwrap();
    let refused = evict("shardwise-0").unwrap_err();
    assert!(
        refused.contains("TooManyRequests") && refused.contains("disruption budget"),
        "{refused}"
    );
    kubectl(&env, &["uncordon", "node-0"]);
    replaced(&pods, "shardwise-1", &evicted).await;
    settled(&env, 2, 40).await;
    wait_for(
        "the budget to allow one disruption again",
        Duration::from_secs(60),
        one_disruption_allowed,
    )
    .await
    .unwrap();
    let evicted = uid(&pods, "shardwise-0").await;
    evict("shardwise-0").unwrap();
    replaced(&pods, "shardwise-0", &evicted).await;
    settled(&env, 2, 40).await;

    // helm upgrade with a changed pod template: the RollingUpdate replaces one pod at a time,
    // highest ordinal first, and every cluster changes hands gracefully.
    kubectl(&env, &["scale", "statefulset", RELEASE, "--replicas=3"]);
    settled(&env, 3, 40).await;
    let sampler = Sampler::start(admin.clone(), NAMESPACE, RELEASE);
    let mut upgrade = vec![
        "upgrade",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--reuse-values",
        "--set-string",
        "podAnnotations.example\\.com/rollout=2",
    ];
    upgrade.extend(VALUES);
    helm(&env, &upgrade);
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), NAMESPACE);
    wait_for(
        "the rolling update to finish",
        Duration::from_secs(300),
        || async {
            let status = sets
                .get(RELEASE)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            if status.update_revision.is_some()
                && status.current_revision == status.update_revision
                && status.updated_replicas == Some(3)
                && status.ready_replicas == Some(3)
            {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await
    .unwrap();
    settled(&env, 3, 40).await;
    let samples = sampler.stop().await;
    let revision = sets
        .get(RELEASE)
        .await
        .unwrap()
        .status
        .and_then(|s| s.update_revision)
        .unwrap();
    rolled_one_at_a_time_from_the_top(&samples.pods, &revision, 3);
    let longest = longest_handoff(&samples.clusters);
    eprintln!(
        "rolling update: the longest a cluster was not owned by a live holder: {longest:.1?}"
    );
    assert!(
        longest < HANDOFF_BOUND,
        "a cluster went {longest:?} without a live owner (a graceful handoff takes less than {HANDOFF_BOUND:?})"
    );

    // Split brain: shardwise-2's node loses the API server (its agent stops managing the pod
    // and its link is cut) while its process runs on, and the Pod is force-deleted, so the
    // StatefulSet controller starts a second process of that name. The first fences itself
    // when it can no longer renew its lease; the second takes the shard only once that lease
    // has expired.
    let uid = uid(&pods, "shardwise-2").await;
    assert!(env.node(0).unwrap().detach("shardwise-2"));
    env.control_plane()
        .faults()
        .partition(FaultScope::identity(pod_link(&uid)));
    kubectl(
        &env,
        &[
            "delete",
            "pod",
            "shardwise-2",
            "--grace-period=0",
            "--force",
        ],
    );
    replaced(&pods, "shardwise-2", &uid).await;
    settled(&env, 3, 40).await;
    let cut_off: String = replica_logs(&env)
        .iter()
        .filter(|log| log.to_string_lossy().contains(&uid))
        .map(|log| std::fs::read_to_string(log).unwrap())
        .collect();
    assert!(
        cut_off.contains("lease lost: stopping all work now"),
        "the cut-off process did not fence itself:\n{cut_off}"
    );
    no_overlaps(&env, &deaths);
    let writes: Vec<_> = env
        .destinations()
        .iter()
        .flat_map(|d| d.writes())
        .filter(|w| w.identity == DESTINATION_IDENTITY)
        .collect();
    let checked = support::fencing::assert_no_late_writes(
        &writes,
        &leases.renewals(),
        RELEASE,
        "destination",
    );
    assert!(checked >= 40, "{checked} destination writes checked");

    // The pods wrote as the chart's ServiceAccount, from kube-rs's in-cluster configuration
    // (nothing else reaches them: no kubeconfig, no environment of the agent), and nothing
    // they asked was forbidden.
    let account = format!("system:serviceaccount:{NAMESPACE}:{RELEASE}");
    let requests = env.control_plane().server().requests();
    let app_status = format!("/apis/shardwise.io/v1alpha1/namespaces/{NAMESPACE}/fleetapps/");
    let status_writes: Vec<_> = requests
        .iter()
        .filter(|r| r.path.starts_with(&app_status) && r.path.ends_with("/status"))
        .collect();
    assert!(!status_writes.is_empty());
    assert!(
        status_writes.iter().all(|r| r.user == account),
        "{status_writes:?}"
    );
    let forbidden: Vec<_> = requests
        .iter()
        .filter(|r| r.user == account && r.code == 403)
        .collect();
    assert!(forbidden.is_empty(), "{forbidden:?}");
    for log in replica_logs(&env) {
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            !text.contains("Forbidden") && !text.contains(" 403 "),
            "{}:\n{text}",
            log.display()
        );
    }

    // Uninstalled, garbage collection and the namespace's own controllers leave nothing of the
    // release but the CRDs, which Helm keeps by policy.
    helm(
        &env,
        &[
            "uninstall",
            RELEASE,
            "--namespace",
            NAMESPACE,
            "--wait",
            "--timeout",
            "2m",
        ],
    );
    let instance = format!("app.kubernetes.io/instance={RELEASE}");
    let release_kinds = "all,serviceaccounts,roles,rolebindings,clusterroles,\
        clusterrolebindings,poddisruptionbudgets,leases,configmaps,secrets";
    wait_for(
        "nothing of the release left",
        Duration::from_secs(120),
        || async {
            let labelled = kubectl(
                &env,
                &[
                    "get",
                    release_kinds,
                    "--all-namespaces",
                    "-l",
                    &instance,
                    "-o",
                    "name",
                ],
            );
            // The replicas' Leases are the runtime's, not Helm's: their owner reference to the
            // StatefulSet is what deletes them.
            let leases = kubectl(&env, &["get", "leases", "-o", "name"]);
            let pods = kubectl(&env, &["get", "pods", "-o", "name"]);
            let left = format!("{labelled}{leases}{pods}");
            if left.trim().is_empty() {
                Ok(())
            } else {
                Err(left)
            }
        },
    )
    .await
    .unwrap();
    let crds = kubectl(&env, &["get", "crds", "-o", "name"]);
    assert!(
        crds.contains("fleetapps.shardwise.io") && crds.contains("fleetclusters.shardwise.io"),
        "{crds}"
    );
}

/// Waits until `replicas` pods are Ready, every cluster is owned by one of them and every one
/// of `apps` apps is Synced.
async fn settled(env: &Environment, replicas: u32, apps: usize) {
    let admin = env.control_plane().client("admin").await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), NAMESPACE);
    let clusters: Api<FleetCluster> = Api::namespaced(admin.clone(), NAMESPACE);
    let app_api: Api<FleetApp> = Api::namespaced(admin, NAMESPACE);
    let what = format!("{replicas} replicas Ready, owning every cluster, and {apps} apps Synced");
    wait_for(&what, Duration::from_secs(300), || async {
        let set = sets.get(RELEASE).await.map_err(|e| e.to_string())?;
        let status = set.status.unwrap_or_default();
        let ready = status.ready_replicas.unwrap_or(0);
        if ready != i32::try_from(replicas).unwrap_or(0) || status.replicas != ready {
            return Err(format!("{ready} Ready of {} pods", status.replicas));
        }
        let list = clusters
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let owners: Vec<Option<u32>> = list.items.iter().map(support::shard_label).collect();
        if !owners.iter().all(|o| o.is_some_and(|o| o < replicas)) {
            return Err(format!("cluster owners {owners:?}"));
        }
        let list = app_api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let synced = list
            .items
            .iter()
            .filter(|a| {
                a.status
                    .as_ref()
                    .is_some_and(|s| s.sync_phase == Some(SyncPhase::Synced))
            })
            .count();
        if synced == apps {
            Ok(())
        } else {
            Err(format!("{synced} of {apps} Synced"))
        }
    })
    .await
    .unwrap();
}

async fn uid(pods: &Api<Pod>, name: &str) -> String {
    pods.get(name).await.unwrap().metadata.uid.unwrap()
}

/// Waits until pod `name` is another pod than `uid`, and Ready.
async fn replaced(pods: &Api<Pod>, name: &str, uid: &str) {
    wait_for(
        &format!("{name} replaced and Ready"),
        Duration::from_secs(120),
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            let ready = pod_ready(&pod);
            if pod.metadata.uid.as_deref() != Some(uid) && ready {
                Ok(())
            } else {
                Err(format!("uid {:?}, ready {ready}", pod.metadata.uid))
            }
        },
    )
    .await
    .unwrap();
}

/// The logs of every run of every replica's controller container.
fn replica_logs(env: &Environment) -> Vec<PathBuf> {
    let logs: Vec<PathBuf> = pods::pod_dirs(env.dir(), NAMESPACE, &format!("{RELEASE}-"))
        .iter()
        .flat_map(|pod| pods::container_logs(pod, "controller"))
        .collect();
    assert!(!logs.is_empty(), "no replica logs");
    logs
}

/// Scrapes the replicas as the Prometheus operator would from the chart's ServiceMonitor (as
/// `helm template` renders it with the suite's values): endpoints of the chart's Service found
/// through its EndpointSlices, its port, path, scheme and TLS settings, and the bearer token of
/// Prometheus' own ServiceAccount, which only metrics.readers lets in. Every replica answers,
/// and their metrics add up to the fleet.
async fn scrape_as_the_service_monitor(env: &Environment, chart: &std::path::Path) {
    let mut template = vec![
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--show-only",
        "templates/servicemonitor.yaml",
    ];
    template.extend(VALUES);
    let monitor: serde_json::Value = serde_saphyr::from_str(&helm(env, &template)).unwrap();
    let spec = &monitor["spec"];
    let endpoint = &spec["endpoints"][0];
    let text = |v: &serde_json::Value| v.as_str().unwrap().to_string();
    // What the operator does with bearerTokenFile: send Prometheus' own token.
    assert!(endpoint["bearerTokenFile"].is_string(), "{endpoint}");
    let token = kubectl(
        env,
        &["create", "token", "prometheus", "--namespace", "monitoring"],
    );
    let token_file = env.dir().join("prometheus-token");
    std::fs::write(&token_file, token.trim()).unwrap();
    // The operator's discovery (Debian's Prometheus is built without Kubernetes discovery):
    // the Services its selector picks in its namespaces, their EndpointSlices' addresses on
    // the endpoint's port, labelled with the pod behind each.
    let admin = env.control_plane().client("admin").await.unwrap();
    let selector = spec["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", text(v)))
        .collect::<Vec<_>>()
        .join(",");
    let port_name = text(&endpoint["port"]);
    let mut groups = Vec::new();
    for namespace in spec["namespaceSelector"]["matchNames"].as_array().unwrap() {
        let namespace = text(namespace);
        let services: Api<Service> = Api::namespaced(admin.clone(), &namespace);
        let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), &namespace);
        for service in services
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
        {
            let name = service.metadata.name.unwrap();
            let of_service = format!("kubernetes.io/service-name={name}");
            for slice in slices
                .list(&ListParams::default().labels(&of_service))
                .await
                .unwrap()
            {
                let Some(port) = slice
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(port_name.as_str()))
                    .and_then(|p| p.port)
                else {
                    continue;
                };
                for endpoint in slice.endpoints {
                    let pod = endpoint.target_ref.and_then(|r| r.name).unwrap_or_default();
                    for address in endpoint.addresses {
                        groups.push(json!({
                            "targets": [format!("{address}:{port}")],
                            "labels": {"namespace": namespace, "pod": pod, "service": name},
                        }));
                    }
                }
            }
        }
    }
    let targets = env.dir().join("service-monitor-targets.json");
    std::fs::write(&targets, serde_json::Value::from(groups).to_string()).unwrap();
    let job = format!(
        "  - job_name: serviceMonitor/{NAMESPACE}/{RELEASE}/0\n\
         \x20   scheme: {}\n\
         \x20   metrics_path: {}\n\
         \x20   authorization: {{credentials_file: {}}}\n\
         \x20   tls_config: {{insecure_skip_verify: {}}}\n\
         \x20   file_sd_configs: [{{files: [{}]}}]\n",
        text(&endpoint["scheme"]),
        text(&endpoint["path"]),
        token_file.display(),
        endpoint["tlsConfig"]["insecureSkipVerify"]
            .as_bool()
            .unwrap_or(false),
        targets.display(),
    );
    let prometheus = Prometheus::run(env, &job, None).await.unwrap();
    wait_for(
        "Prometheus to scrape every replica",
        Duration::from_secs(60),
        || prometheus.all_up(3),
    )
    .await
    .unwrap();
    let leases = prometheus
        .query(&format!(
            "shardwise_lease_held{{namespace=\"{NAMESPACE}\"}}"
        ))
        .await
        .unwrap();
    let pods: std::collections::BTreeSet<&str> = leases
        .iter()
        .map(|(labels, _)| labels["pod"].as_str())
        .collect();
    assert_eq!(
        pods,
        (0..3)
            .map(|i| format!("{RELEASE}-{i}"))
            .collect::<std::collections::BTreeSet<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
        "{leases:?}"
    );
    let apps = prometheus
        .query(&format!(
            "sum(shardwise_owned_items{{namespace=\"{NAMESPACE}\"}})"
        ))
        .await
        .unwrap();
    assert_eq!(apps.first().map(|(_, v)| *v), Some(40.0), "{apps:?}");
}

/// The pods of `revision` appeared from the highest ordinal down, each only once the one above
/// it was Ready, and no two ordinals were without a Ready pod at once. `history` holds every
/// state the pods went through, so a state between two polls cannot be missed.
fn rolled_one_at_a_time_from_the_top(history: &[Pods], revision: &str, replicas: u32) {
    let first_of_revision = |ordinal: u32| {
        let name = format!("{RELEASE}-{ordinal}");
        history
            .iter()
            .position(|pods| pods.get(&name).is_some_and(|(r, _)| r == revision))
            .unwrap_or_else(|| panic!("{name} never ran revision {revision}"))
    };
    for ordinal in 0..replicas - 1 {
        let this = first_of_revision(ordinal);
        let above = format!("{RELEASE}-{}", ordinal + 1);
        assert!(
            history[..this].iter().any(|pods| pods
                .get(&above)
                .is_some_and(|(r, ready)| r == revision && *ready)),
            "{RELEASE}-{ordinal} was replaced before {above} ran the new revision Ready"
        );
    }
    for pods in history {
        let away = (0..replicas)
            .filter(|o| {
                !pods
                    .get(&format!("{RELEASE}-{o}"))
                    .is_some_and(|(_, ready)| *ready)
            })
            .count();
        assert!(away <= 1, "{away} replicas not Ready at once: {pods:?}");
    }
}
