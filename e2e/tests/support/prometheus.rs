//! A real Prometheus (Debian's `prometheus` package, or the binary named by `$PROMETHEUS`)
//! scraping a fleet's replicas as a PodMonitor would, and the Grafana dashboard's queries run
//! against it: the dashboard test checks every panel with it, the demo draws the dashboard
//! picture from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use shardwise_e2e::{Environment, Process, ProcessSpec, free_port, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Fleet, NAMESPACE, STATEFULSET, repo_file};

/// Prometheus scrapes every second; Grafana's `$__rate_interval` is at least four scrapes.
pub const SCRAPE_INTERVAL: &str = "1s";
pub const RATE_INTERVAL: &str = "15s";

pub fn dashboard() -> Result<Value, String> {
    let path = repo_file("charts/shardwise/dashboards/shardwise.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every panel with queries, including those nested in collapsed rows.
pub fn panels(dashboard: &Value) -> Vec<Value> {
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
    walk(
        dashboard["panels"]
            .as_array()
            .map_or(&[][..], Vec::as_slice),
        &mut out,
    );
    out
}

/// A query with the dashboard's variables replaced as Grafana does: `$shard` by the regex of the
/// selection (`.*` for All), `$__rate_interval` by four scrape intervals or more.
pub fn substitute(expr: &str, shard: &str) -> String {
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

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A Prometheus server, scraping the targets of a file it watches or those it discovers.
pub struct Prometheus {
    pub process: Process,
    address: String,
    targets: PathBuf,
}

impl Prometheus {
    /// Starts `program` (`prometheus` if `None`) with its data in the fleet's folder, scraping
    /// nothing until [`Self::scrape_replicas`]: secure metrics as the chart's ServiceMonitor has
    /// Prometheus scrape them (https, the serving certificate's CA, a token bound to the
    /// metrics-reader role), plain ones over http.
    pub async fn start(fleet: &Fleet, program: Option<&Path>) -> Result<Self, String> {
        let dir = fleet.env.dir().join("prometheus");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let targets = dir.join("targets.json");
        write(&targets, "[]")?;
        let access = match &fleet.metrics_access {
            Some(access) => format!(
                "    scheme: https\n    tls_config:\n      ca_file: {}\n    authorization:\n      credentials: {}\n",
                access.certificates.join("ca.crt").display(),
                access.token,
            ),
            None => "    scheme: http\n".to_string(),
        };
        let job = format!(
            "  - job_name: shardwise\n{access}    file_sd_configs:\n      - files: [{}]\n        refresh_interval: 1s\n",
            targets.display()
        );
        // (`run` keeps the file's path: the same folder.)
        Self::run(&fleet.env, &job, program).await
    }

    /// Starts `program` (`prometheus` if `None`) with its data in the environment's folder,
    /// scraping every second with the jobs of `scrape_configs` (YAML list items).
    pub async fn run(
        env: &Environment,
        scrape_configs: &str,
        program: Option<&Path>,
    ) -> Result<Self, String> {
        let dir = env.dir().join("prometheus");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n\
             scrape_configs:\n{scrape_configs}"
        );
        let config_path = dir.join("prometheus.yml");
        write(&config_path, &config)?;
        let program = program.map_or_else(
            || std::env::var_os("PROMETHEUS").map_or_else(|| "prometheus".into(), PathBuf::from),
            Path::to_path_buf,
        );
        // A free port may be taken by someone else before Prometheus binds it: then Prometheus
        // exits and a new port is tried.
        let mut failures = Vec::new();
        for _ in 0..3 {
            let address = format!("127.0.0.1:{}", free_port().map_err(|e| e.to_string())?);
            let spec = ProcessSpec::new("prometheus", &program)
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={address}"))
                .arg("--log.level=warn");
            let process = env.spawn(&spec).map_err(|e| {
                format!("{e}: install Prometheus (apt-get install prometheus) or set $PROMETHEUS")
            })?;
            let mut prometheus = Self {
                process,
                address,
                targets: dir.join("targets.json"),
            };
            let ready = wait_for("Prometheus to answer", Duration::from_secs(30), || {
                prometheus.get("/api/v1/status/buildinfo")
            })
            .await;
            match ready {
                Ok(_) => return Ok(prometheus),
                Err(e) => {
                    failures.push(format!("{e}\n{}", prometheus.process.report()));
                    let _ = prometheus.process.kill();
                }
            }
        }
        Err(failures.join("\n"))
    }

    /// Its HTTP address, `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Scrapes every replica of `fleet` as a PodMonitor would: `namespace` and `pod` labels.
    /// Written by rename, so that Prometheus never reads half a file.
    pub fn scrape_replicas(&self, fleet: &Fleet) -> Result<(), String> {
        let groups: Vec<Value> = fleet
            .replicas
            .iter()
            .map(|(ordinal, replica)| {
                let target = replica
                    .metrics_url
                    .trim_start_matches("https://")
                    .trim_start_matches("http://")
                    .trim_end_matches("/metrics");
                json!({
                    "targets": [target],
                    "labels": {"namespace": NAMESPACE, "pod": format!("{STATEFULSET}-{ordinal}")},
                })
            })
            .collect();
        let partial = self.targets.with_extension("json.tmp");
        std::fs::write(&partial, Value::from(groups).to_string())
            .and_then(|()| std::fs::rename(&partial, &self.targets))
            .map_err(|e| format!("{}: {e}", self.targets.display()))
    }

    /// GET `path` of the HTTP API, as JSON. HTTP/1.0, so that the answer is the plain body up
    /// to the end of the connection.
    pub async fn get(&self, path: &str) -> Result<Value, String> {
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
    pub async fn all_up(&self, targets: usize) -> Result<(), String> {
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
    pub async fn query(&self, expr: &str) -> Result<Vec<(BTreeMap<String, String>, f64)>, String> {
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
    pub async fn query_range(&self, expr: &str, start: f64) -> Result<Value, String> {
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
    pub async fn label_values(
        &self,
        selector: &str,
        label: &str,
    ) -> Result<BTreeSet<String>, String> {
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

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Writes every panel's series since `start` (all shards selected) to `path`, for
/// `scripts/dashboard_picture.py` to draw; `source` says what ran (the picture's caption).
pub async fn export(
    prometheus: &Prometheus,
    dashboard: &Value,
    start: f64,
    source: &str,
    path: &Path,
) -> Result<(), String> {
    let mut exported = Vec::new();
    for panel in panels(dashboard) {
        let mut targets = Vec::new();
        for target in panel["targets"].as_array().map_or(&[][..], Vec::as_slice) {
            let expr = substitute(target["expr"].as_str().unwrap_or_default(), ".*");
            let result = prometheus.query_range(&expr, start).await?;
            targets.push(json!({"legendFormat": target["legendFormat"], "result": result}));
        }
        exported.push(json!({"id": panel["id"], "targets": targets}));
    }
    let data = json!({"source": source, "start": start, "end": unix_now(), "panels": exported});
    std::fs::write(path, data.to_string()).map_err(|e| format!("{}: {e}", path.display()))
}
