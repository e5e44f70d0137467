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

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use shardwise_e2e::{Poll, wait_for, wait_with};
use support::prometheus::{Prometheus, dashboard, export, panels, substitute, unix_now};
use support::{Fleet, FleetOptions, NAMESPACE, STATEFULSET, shard_label};

const SETTLE: Duration = Duration::from_secs(120);
/// Short leases, so that a partition fences a replica within seconds.
const LEASE_FLAGS: [&str; 3] = [
    "--lease-duration=6s",
    "--renew-deadline=4s",
    "--retry-period=1s",
];
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
    let dashboard = dashboard().unwrap();
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
    let prometheus = Prometheus::start(&fleet, None).await.unwrap();
    let scraping_since = unix_now();
    prometheus.scrape_replicas(&fleet).unwrap();
    // For a picture, each phase runs long enough to show in the graphs.
    let export_to = std::env::var_os("SHARDWISE_DASHBOARD_DATA");
    let pace = Duration::from_secs(if export_to.is_some() { 30 } else { 0 });
    fleet.wait_settled(&[0, 1, 2], SETTLE).await.unwrap();
    tokio::time::sleep(pace).await;

    // Scale up: the new shard takes clusters through drains (handoffs).
    fleet.scale(4).await.unwrap();
    fleet.spawn_replica(3).await.unwrap();
    prometheus.scrape_replicas(&fleet).unwrap();
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
    let cp = fleet.env.control_plane();
    let identity = fleet.replicas[&1].link.clone();
    cp.partition(&identity).unwrap();
    wait_for("replica 1 to fence itself", SETTLE, || async {
        let m = fleet.scrape(1).await.map_err(|e| e.to_string())?;
        match m.sum("shardwise_fenced_total", &[]) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("fenced {n} times")),
        }
    })
    .await
    .unwrap();
    cp.heal(&identity).unwrap();
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
        let source = "e2e/tests/dashboard.rs: 3 replicas, scaled to 4, replica 1 partitioned until it fenced, then 12 invalid apps";
        export(
            &prometheus,
            &dashboard,
            scraping_since,
            source,
            path.as_ref(),
        )
        .await
        .unwrap();
    }
}
