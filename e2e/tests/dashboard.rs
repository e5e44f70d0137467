//! The Grafana dashboard (`charts/shardwise/dashboards/shardwise.json`) against real data: a
//! fleet of 4 replicas, scraped by a real Prometheus (Debian's `prometheus` package, or the
//! binary named by `$PROMETHEUS`) with the `namespace` and `pod` labels a PodMonitor gives, over
//! https with a token bound to the metrics-reader role, as the chart sets secure metrics up.
//! The fleet goes through what the dashboard is for: a scale-up (handoffs), a partitioned
//! replica (a fence) and invalid apps (errors). Then every panel's query runs against
//! Prometheus's HTTP API, with the template variables substituted as Grafana would, and must be
//! valid and return series; panels titled "per shard" must return exactly one series per shard
//! and panels titled "per replica" one per replica, for every shard and for a single one; panels
//! titled "/ mean" must return ratios to the mean (they average to 1 over all shards).
//! With `SHARDWISE_DASHBOARD_DATA=FILE`, it also writes every panel's series to FILE, for
//! `scripts/dashboard_picture.py` (`make dashboard-picture`).

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use shardwise_e2e::{FaultScope, Poll, Process, ProcessSpec, free_port, wait_for, wait_with};
use support::{Fleet, FleetOptions, NAMESPACE, STATEFULSET, shard_label};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SETTLE: Duration = Duration::from_secs(120);
/// Short leases, so that a partition fences a replica within seconds.
const LEASE_FLAGS: [&str; 3] = [
    "--lease-duration=6s",
    "--renew-deadline=4s",
    "--retry-period=1s",
];
/// Prometheus scrapes every second; Grafana's `$__rate_interval` is at least four scrapes.
const SCRAPE_INTERVAL: &str = "1s";
const RATE_INTERVAL: &str = "15s";

fn dashboard() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/shardwise/dashboards/shardwise.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every panel with queries, including those nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<Value> {
    fn walk(list: &[Value], out: &mut Vec<Value>) {
        for panel in list {
            if panel["targets"].as_array().is_some_and(|t| !t.is_empty()) {
                out.push(panel.clone());
            }
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// A query with the dashboard's variables replaced as Grafana does: `$shard` by the regex of the
/// selection (`.*` for All), `$__rate_interval` by four scrape intervals or more.
fn substitute(expr: &str, shard: &str) -> String {
    expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$namespace", NAMESPACE)
        .replace("$shard", shard)
}

/// `%`-encoding of a query parameter (everything but RFC 3986's unreserved characters).
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A Prometheus server started by the test, scraping the targets of a file it watches.
struct Prometheus {
    process: Process,
    address: String,
    targets: PathBuf,
}

impl Prometheus {
    async fn start(fleet: &Fleet) -> Self {
        let dir = fleet.env.dir().join("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let targets = dir.join("targets.json");
        std::fs::write(&targets, "[]").unwrap();
        // Secure metrics, scraped as the chart's ServiceMonitor has Prometheus do it: https,
        // the serving certificate's CA, and a token bound to the metrics-reader role.
        let access = fleet
            .metrics_access
            .as_ref()
            .expect("the dashboard fleet serves secure metrics");
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n\
             scrape_configs:\n  - job_name: shardwise\n    scheme: https\n    tls_config:\n      ca_file: {}\n    \
             authorization:\n      credentials: {}\n    file_sd_configs:\n      - files: [{}]\n        refresh_interval: 1s\n",
            access.certificates.join("ca.crt").display(),
            access.token,
            targets.display()
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let address = format!("127.0.0.1:{}", free_port().unwrap());
        let program = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let spec = ProcessSpec::new("prometheus", program)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn");
        let process = fleet.env.spawn(&spec).unwrap_or_else(|e| {
            panic!("{e}: install Prometheus (apt-get install prometheus) or set $PROMETHEUS")
        });
        let prometheus = Self {
            process,
            address,
            targets,
        };
        let ready = wait_for("Prometheus to answer", Duration::from_secs(30), || {
            prometheus.get("/api/v1/status/buildinfo")
        })
        .await;
        if let Err(e) = ready {
            panic!("{e}\n{}", prometheus.process.report());
        }
        prometheus
    }

    /// Scrapes every replica of `fleet` as a PodMonitor would: `namespace` and `pod` labels.
    /// Written by rename, so that Prometheus never reads half a file.
    fn scrape_replicas(&self, fleet: &Fleet) {
        let groups: Vec<Value> = fleet
            .replicas
            .iter()
            .map(|(ordinal, replica)| {
                let target = replica
                    .metrics_url
                    .trim_start_matches("https://")
                    .trim_end_matches("/metrics");
                json!({
                    "targets": [target],
                    "labels": {"namespace": NAMESPACE, "pod": format!("{STATEFULSET}-{ordinal}")},
                })
            })
            .collect();
        let partial = self.targets.with_extension("json.tmp");
        std::fs::write(&partial, serde_json::to_string(&groups).unwrap()).unwrap();
        std::fs::rename(&partial, &self.targets).unwrap();
    }

    /// GET `path` of the HTTP API, as JSON. HTTP/1.0, so that the answer is the plain body up
    /// to the end of the connection.
    async fn get(&self, path: &str) -> Result<Value, String> {
        let mut stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| format!("cannot reach Prometheus at {}: {e}", self.address))?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.address);
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&response);
        let (_, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
        let value: Value =
            serde_json::from_str(body).map_err(|e| format!("{e} in answer {body:?}"))?;
        if value["status"] == "success" {
            Ok(value["data"].clone())
        } else {
            Err(format!("{}: {}", value["errorType"], value["error"]))
        }
    }

    /// Ok once every target's last scrape succeeded; else the targets' errors.
    async fn all_up(&self, targets: usize) -> Result<(), String> {
        let data = self.get("/api/v1/targets").await?;
        let active = data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let down: Vec<String> = active
            .iter()
            .filter(|t| t["health"] != "up")
            .map(|t| format!("{} {}: {}", t["scrapeUrl"], t["health"], t["lastError"]))
            .collect();
        if active.len() == targets && down.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} of {targets} targets, down: {down:?}",
                active.len()
            ))
        }
    }

    /// The result of an instant query: the label set and value of each series.
    async fn query(&self, expr: &str) -> Result<Vec<(BTreeMap<String, String>, f64)>, String> {
        let data = self
            .get(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        let series = data["result"]
            .as_array()
            .ok_or_else(|| format!("no result in {data}"))?;
        series
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                // Prometheus writes sample values as strings ("NaN" and "+Inf" included).
                let value = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .ok_or_else(|| format!("no value in {s}"))?;
                Ok((labels, value))
            })
            .collect()
    }

    /// The series of a range query from `start` to now (Unix seconds), one point per second.
    async fn query_range(&self, expr: &str, start: f64) -> Result<Value, String> {
        let end = unix_now();
        let data = self
            .get(&format!(
                "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
                encode(expr)
            ))
            .await?;
        Ok(data["result"].clone())
    }

    /// The values of `label` over the series matching `selector` (Grafana's `label_values`).
    async fn label_values(&self, selector: &str, label: &str) -> Result<BTreeSet<String>, String> {
        let data = self
            .get(&format!(
                "/api/v1/label/{label}/values?match[]={}",
                encode(selector)
            ))
            .await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect())
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Writes every panel's series since `start` (all shards selected) to `path`, for
/// `scripts/dashboard_picture.py` to draw (`make dashboard-picture`).
async fn export(prometheus: &Prometheus, dashboard: &Value, start: f64, path: &std::ffi::OsStr) {
    let mut exported = Vec::new();
    for panel in panels(dashboard) {
        let mut targets = Vec::new();
        for target in panel["targets"].as_array().unwrap() {
            let expr = substitute(target["expr"].as_str().unwrap_or_default(), ".*");
            let result = prometheus.query_range(&expr, start).await.unwrap();
            targets.push(json!({"legendFormat": target["legendFormat"], "result": result}));
        }
        exported.push(json!({"id": panel["id"], "targets": targets}));
    }
    let data = json!({"start": start, "end": unix_now(), "panels": exported});
    std::fs::write(path, serde_json::to_string(&data).unwrap()).unwrap();
}

/// What the series of one query must look like.
enum Expect {
    /// At least one series.
    Some,
    /// Exactly one series per value of `label`, and those values exactly.
    OnePer {
        label: &'static str,
        values: BTreeSet<String>,
    },
}

/// Checks one query; `Err` says what is wrong. With `ratios_to_mean`, its values are each
/// shard's share over the mean of all shards, and must average to 1.
async fn check_query(
    prometheus: &Prometheus,
    names: &BTreeSet<String>,
    expr: &str,
    expect: &Expect,
    ratios_to_mean: bool,
) -> Result<(), String> {
    if let Some(left) = expr.split('$').nth(1) {
        return Err(format!("variable ${left} is not substituted"));
    }
    // `or`-filled panels return series even if a metric is misspelt: every name must exist.
    let mut unknown: Vec<&str> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("shardwise_") || word.starts_with("process_"))
        .filter(|word| !names.contains(*word))
        .collect();
    unknown.dedup();
    if !unknown.is_empty() {
        return Err(format!("no such metric in Prometheus: {unknown:?}"));
    }
    let series = prometheus.query(expr).await?;
    if series.is_empty() {
        return Err("no series".into());
    }
    if let Expect::OnePer { label, values } = expect {
        let seen: Vec<&str> = series
            .iter()
            .map(|(labels, _)| labels.get(*label).map_or("", String::as_str))
            .collect();
        let distinct: BTreeSet<String> = seen.iter().map(|s| s.to_string()).collect();
        if seen.len() != distinct.len() || &distinct != values {
            return Err(format!(
                "expected one series per {label} of {values:?}, got {label}s {seen:?}"
            ));
        }
    }
    if ratios_to_mean {
        let values: Vec<f64> = series.iter().map(|(_, value)| *value).collect();
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        if !values.iter().all(|v| v.is_finite() && *v >= 0.0) || (mean - 1.0).abs() > 1e-9 {
            return Err(format!(
                "expected shares of the mean (averaging to 1), got {values:?}"
            ));
        }
    }
    Ok(())
}

/// Runs every query of the dashboard, with every shard selected and with `single` alone.
/// Returns how many queries ran, or every failure.
async fn check_dashboard(
    prometheus: &Prometheus,
    dashboard: &Value,
    shards: &[u32],
    single: u32,
) -> Result<usize, String> {
    let names: BTreeSet<String> = prometheus
        .get("/api/v1/label/__name__/values")
        .await?
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let all_shards: BTreeSet<String> = shards.iter().map(u32::to_string).collect();
    let pods = |set: &BTreeSet<String>| -> BTreeSet<String> {
        set.iter().map(|s| format!("{STATEFULSET}-{s}")).collect()
    };
    let selections = [
        (".*".to_string(), all_shards.clone()),
        (single.to_string(), BTreeSet::from([single.to_string()])),
    ];
    let mut failures = Vec::new();
    let mut queries = 0;
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap_or_default();
            for (shard, selected) in &selections {
                let expect = if title.contains("per shard") {
                    Expect::OnePer {
                        label: "shard",
                        values: selected.clone(),
                    }
                } else if title.contains("per replica") {
                    Expect::OnePer {
                        label: "pod",
                        values: pods(selected),
                    }
                } else {
                    Expect::Some
                };
                let query = substitute(expr, shard);
                // Over every shard, shares of the mean average to 1; a single shard's need not.
                let ratios_to_mean = title.ends_with("/ mean") && shard == ".*";
                queries += 1;
                if let Err(e) =
                    check_query(prometheus, &names, &query, &expect, ratios_to_mean).await
                {
                    failures.push(format!("panel {title:?}, shard {shard:?}: {e}\n  {query}"));
                }
            }
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        // Query variables: a Prometheus `label_values` query (the data source variable has none).
        let Some(definition) = variable["query"]["query"].as_str() else {
            continue;
        };
        queries += 1;
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .and_then(|d| d.rsplit_once(','));
        let Some((selector, label)) = inner else {
            failures.push(format!(
                "variable {definition:?} is not label_values(selector, label)"
            ));
            continue;
        };
        let expected = match label.trim() {
            "namespace" => BTreeSet::from([NAMESPACE.to_string()]),
            "shard" => all_shards.clone(),
            other => {
                failures.push(format!("variable {definition:?}: unexpected label {other}"));
                continue;
            }
        };
        match prometheus
            .label_values(&substitute(selector, ".*"), label.trim())
            .await
        {
            Ok(values) if values == expected => {}
            Ok(values) => failures.push(format!(
                "variable {definition:?}: {values:?}, expected {expected:?}"
            )),
            Err(e) => failures.push(format!("variable {definition:?}: {e}")),
        }
    }
    if failures.is_empty() {
        Ok(queries)
    } else {
        Err(format!(
            "{} of {queries} queries failed:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_of_the_dashboard_shows_real_data() {
    let dashboard = dashboard();
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 3,
        clusters: 12,
        apps: 120,
        args: LEASE_FLAGS.map(String::from).to_vec(),
        secure_metrics: true,
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let prometheus = Prometheus::start(&fleet).await;
    let scraping_since = unix_now();
    prometheus.scrape_replicas(&fleet);
    // For a picture, each phase runs long enough to show in the graphs.
    let export_to = std::env::var_os("SHARDWISE_DASHBOARD_DATA");
    let pace = Duration::from_secs(if export_to.is_some() { 30 } else { 0 });
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
    tokio::time::sleep(pace).await;

    // Scale up: the new shard takes clusters through drains (handoffs).
    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(3).unwrap();
    prometheus.scrape_replicas(&fleet);
    let clusters = fleet.clusters_api();
    wait_for("shard 3 to own clusters", SETTLE, || async {
        let list = clusters
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let on_3 = list
            .items
            .iter()
            .filter(|c| shard_label(*c) == Some(3))
            .count();
        if on_3 > 0 {
            Ok(())
        } else {
            Err("none yet".into())
        }
    })
    .await
    .unwrap();
    fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await.unwrap();
    // Over https, with the token of an account bound to the metrics-reader role.
    wait_for("Prometheus to scrape every replica", SETTLE, || {
        prometheus.all_up(4)
    })
    .await
    .unwrap();
    tokio::time::sleep(pace).await;

    // Partition replica 1 from the control plane until it fences itself, then heal it.
    let faults = fleet.env.control_plane().faults();
    let scope = FaultScope::identity(format!("{STATEFULSET}-1"));
    faults.partition(scope.clone());
    wait_for("replica 1 to fence itself", SETTLE, || async {
        let m = fleet.scrape(1).await.map_err(|e| e.to_string())?;
        match m.sum("shardwise_fenced_total", &[]) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("fenced {n} times")),
        }
    })
    .await
    .unwrap();
    faults.heal(&scope);
    if let Err(e) = fleet.wait_settled(&[0, 1, 2, 3], SETTLE).await {
        panic!("{e}\n{}", fleet.report());
    }
    tokio::time::sleep(pace).await;

    // One invalid app per cluster: every shard that owns a cluster reports errors.
    let apps = fleet.apps_api();
    for cluster in 0..fleet.options.clusters {
        let app: shardwise_api::FleetApp = serde_json::from_value(json!({
            "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
            "metadata": {"name": format!("invalid-{cluster}"), "namespace": NAMESPACE},
            "spec": {
                "destination": {"cluster": format!("cluster-{cluster}"), "namespace": "invalid"},
                "source": {"manifests": "apiVersion: v1\nkind: [unclosed\n"},
            },
        }))
        .unwrap();
        apps.create(&Default::default(), &app).await.unwrap();
    }

    // Rates need a few scrapes after the last change; the check runs until the data is there.
    let started = std::time::Instant::now();
    let poll = Poll::timeout(Duration::from_secs(60)).every(Duration::from_secs(2));
    let checked = wait_with(
        "every panel of the dashboard to show the fleet",
        poll,
        || check_dashboard(&prometheus, &dashboard, &[0, 1, 2, 3], 2),
    )
    .await;
    match checked {
        Ok(queries) => eprintln!(
            "dashboard: {} panels, {queries} queries checked against Prometheus (data complete after {:.1} s)",
            panels(&dashboard).len(),
            started.elapsed().as_secs_f64()
        ),
        Err(e) => {
            // The wait's last attempt may have been cut short by its deadline: check once more
            // for the full list of failures.
            let failures = check_dashboard(&prometheus, &dashboard, &[0, 1, 2, 3], 2)
                .await
                .err()
                .unwrap_or_default();
            panic!(
                "{e}\n{failures}\n{}\n{}",
                prometheus.process.report(),
                fleet.report()
            )
        }
    }
    if let Some(path) = export_to {
        tokio::time::sleep(pace).await;
        export(&prometheus, &dashboard, scraping_since, &path).await;
    }
}
