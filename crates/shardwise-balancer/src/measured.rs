//! What each cluster costs Argo CD, as its application controllers measure it, turned into
//! the clusters' weights. Pure: the caller scrapes every controller pod and passes the text
//! and the time.
//!
//! A controller spends its time on a cluster in two places: reconciling the cluster's
//! Applications (`argocd_app_reconcile`, by `dest_server`) and processing the resource events
//! of its cluster cache (`argocd_resource_events_processing`, by `server`). Both are
//! histograms whose `_sum` counts seconds, so their rate is the busy seconds per second the
//! cluster costs. What a cluster costs in memory is the objects its cache holds
//! (`argocd_cluster_api_resource_objects`, a gauge). Counters live per pod: a cluster that
//! moved keeps a frozen series in its old controller and a growing one in the new, so rates
//! are taken pod by pod and added up.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shardwise_plan::LiveFleet;

/// What one scrape of one controller pod says, by cluster server.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// Seconds spent reconciling the cluster's Applications and processing its resource
    /// events, since the process started (a counter).
    pub busy_seconds: BTreeMap<String, f64>,
    /// Objects in the cluster's cache now (a gauge).
    pub objects: BTreeMap<String, f64>,
    /// The Applications the controller reconciles (`argocd_app_info`), as `namespace/name`.
    pub apps: BTreeSet<String>,
}

/// The series of Argo CD's controller metrics that cost a cluster time, with the label that
/// names the cluster's server.
const BUSY_SERIES: [(&str, &str); 2] = [
    ("argocd_app_reconcile_sum", "dest_server"),
    ("argocd_resource_events_processing_sum", "server"),
];
/// The series of the objects a cluster's cache holds.
const OBJECTS_SERIES: (&str, &str) = ("argocd_cluster_api_resource_objects", "server");

/// Reads the series that cost a cluster from a controller's `/metrics` text (Prometheus text
/// format). Lines it cannot read are skipped: a metrics page is not the balancer's to judge.
pub fn parse(text: &str) -> Scrape {
    let mut scrape = Scrape::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, labels, value)) = sample(line) else {
            continue;
        };
        if let Some((_, label)) = BUSY_SERIES.iter().find(|(n, _)| *n == name) {
            if let Some(server) = labels.get(*label).filter(|s| !s.is_empty()) {
                *scrape.busy_seconds.entry(server.clone()).or_default() += value;
            }
        } else if name == OBJECTS_SERIES.0
            && let Some(server) = labels.get(OBJECTS_SERIES.1).filter(|s| !s.is_empty())
        {
            *scrape.objects.entry(server.clone()).or_default() += value;
        } else if name == "argocd_app_info"
            && let (Some(namespace), Some(app)) = (labels.get("namespace"), labels.get("name"))
        {
            scrape.apps.insert(format!("{namespace}/{app}"));
        }
    }
    scrape
}

/// One sample line: its name, labels and value; `None` if it is not one.
fn sample(line: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let (labels, rest) = if let Some(inner) = rest.strip_prefix('{') {
        let (labels, after) = label_set(inner)?;
        (labels, after)
    } else {
        (BTreeMap::new(), rest)
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, labels, value))
}

/// The labels of a sample, from just after `{`; the rest of the line after `}`.
fn label_set(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([' ', ',']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once('=')?;
        let mut chars = rest.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(name.trim().to_string(), value);
        text = &rest[end + 2..];
    }
}

/// The smoothed cost of every cluster, from the scrapes of every pass.
#[derive(Debug)]
pub struct Meter {
    window: Duration,
    /// Each pod's last scrape (by pod UID: a replaced pod's counters start from zero), and
    /// when it was taken.
    last: BTreeMap<String, (Instant, Scrape)>,
    /// Busy seconds per second, smoothed, by server.
    busy: BTreeMap<String, f64>,
    /// Objects in the cache, by server: the largest count a pod reports (the cache of a
    /// cluster that moved lingers in its old controller until that one drops it).
    objects: BTreeMap<String, f64>,
    /// When the smoothed values were last brought up to date.
    updated: Option<Instant>,
}

impl Meter {
    /// A meter smoothing over `window` (an exponential moving average with that time
    /// constant; zero: the latest interval alone).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: BTreeMap::new(),
            busy: BTreeMap::new(),
            objects: BTreeMap::new(),
            updated: None,
        }
    }

    /// Takes in one pass's scrapes, by pod UID, taken at about `now`. A pod seen for the first
    /// time gives a baseline and no rate yet; a pod not scraped this time is forgotten, and
    /// counts again from its next scrape. A counter that went down (the container restarted)
    /// counts from zero.
    pub fn observe(&mut self, scrapes: BTreeMap<String, Scrape>, now: Instant) {
        let mut rates: BTreeMap<String, f64> = BTreeMap::new();
        for (pod, scrape) in &scrapes {
            let Some((then, before)) = self.last.get(pod) else {
                continue;
            };
            let seconds = now.saturating_duration_since(*then).as_secs_f64();
            if seconds <= 0.0 {
                continue;
            }
            for (server, &total) in &scrape.busy_seconds {
                let previous = before.busy_seconds.get(server).copied().unwrap_or(0.0);
                let spent = if total >= previous {
                    total - previous
                } else {
                    total
                };
                *rates.entry(server.clone()).or_default() += spent / seconds;
            }
        }
        let alpha = match self.updated {
            Some(then) if !self.window.is_zero() => {
                let dt = now.saturating_duration_since(then).as_secs_f64();
                1.0 - (-dt / self.window.as_secs_f64()).exp()
            }
            _ => 1.0,
        };
        for (server, rate) in rates {
            match self.busy.get_mut(&server) {
                Some(smoothed) => *smoothed += alpha * (rate - *smoothed),
                None => {
                    self.busy.insert(server, rate);
                }
            }
        }
        self.objects.clear();
        for scrape in scrapes.values() {
            for (server, &count) in &scrape.objects {
                let largest = self.objects.entry(server.clone()).or_default();
                *largest = largest.max(count);
            }
        }
        self.updated = Some(now);
        self.last = scrapes
            .into_iter()
            .map(|(pod, s)| (pod, (now, s)))
            .collect();
    }

    /// The smoothed busy seconds per second of `server`, once a rate has been measured.
    pub fn busy(&self, server: &str) -> Option<f64> {
        self.busy.get(server).copied()
    }

    /// The objects `server`'s cache holds, as last scraped.
    pub fn objects(&self, server: &str) -> Option<f64> {
        self.objects.get(server).copied()
    }
}

/// Where the weights of one pass came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Weighing {
    /// Clusters of the fleet.
    pub clusters: usize,
    /// Clusters with apps weighed by their measured cost.
    pub measured: usize,
    /// Busy seconds per second the controllers spend on the fleet's clusters.
    pub busy: f64,
    /// Objects in the clusters' caches.
    pub objects: f64,
    /// Why the clusters weigh their app counts, when they do.
    pub fallback: Option<String>,
}

/// Weight of an app of the fleet's average measured cost: a cluster's load is its apps times
/// its weight, so a cluster twice as costly per app as the average weighs 2000.
pub const AVERAGE_APP: u32 = 1_000;

/// Gives each cluster of `fleet` the weight its measured cost per app gives it, relative to
/// the fleet's average: `(1 - memory_weight)` of its share of the busy time plus
/// `memory_weight` of its share of the cached objects, over its share of the apps. A cluster
/// without a measurement (new, or its controller did not answer) weighs an average app. When
/// nothing is measured, every cluster weighs its apps alone, and the weighing says why.
/// Clusters are found in the metrics by their server (`fleet.servers`).
pub fn weigh(fleet: &mut LiveFleet, meter: &Meter, memory_weight: f64) -> Weighing {
    let memory_weight = memory_weight.clamp(0.0, 1.0);
    let mut measured: Vec<(usize, f64, f64)> = Vec::new();
    for (i, cluster) in fleet.clusters.iter().enumerate() {
        if cluster.apps == 0 {
            continue;
        }
        let Some(server) = fleet.servers.get(&cluster.id) else {
            continue;
        };
        if let Some(busy) = meter.busy(server) {
            measured.push((i, busy, meter.objects(server).unwrap_or(0.0)));
        }
    }
    let busy: f64 = measured.iter().map(|m| m.1).sum();
    let objects: f64 = measured.iter().map(|m| m.2).sum();
    let apps: u64 = measured.iter().map(|m| fleet.clusters[m.0].apps).sum();
    let (busy_part, memory_part) = match (busy > 0.0, objects > 0.0) {
        (true, true) => (1.0 - memory_weight, memory_weight),
        (true, false) => (1.0, 0.0),
        (false, true) => (0.0, 1.0),
        (false, false) => (0.0, 0.0),
    };
    let mut weighing = Weighing {
        clusters: fleet.clusters.len(),
        measured: measured.len(),
        busy,
        objects,
        fallback: None,
    };
    if busy_part + memory_part == 0.0 || apps == 0 {
        weighing.fallback = Some(if meter.updated.is_none() {
            "no controller's metrics have been read yet: clusters weigh their apps".to_string()
        } else {
            "no controller reports time or cached objects for a cluster with apps: clusters weigh their apps".to_string()
        });
        weighing.measured = 0;
        return weighing;
    }
    for cluster in &mut fleet.clusters {
        cluster.weight = Some(AVERAGE_APP);
    }
    for (i, cluster_busy, cluster_objects) in measured {
        let share =
            busy_part * ratio(cluster_busy, busy) + memory_part * ratio(cluster_objects, objects);
        let cluster = &mut fleet.clusters[i];
        let per_app = share * apps as f64 / cluster.apps as f64;
        // At least 1: a cluster with apps is never free to move.
        cluster.weight = Some(
            (per_app * f64::from(AVERAGE_APP))
                .round()
                .clamp(1.0, f64::from(u32::MAX)) as u32,
        );
    }
    weighing
}

fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shard_assign::Cluster;

    const PAGE: &str = r#"# HELP argocd_app_reconcile Application reconciliation performance in seconds.
# TYPE argocd_app_reconcile histogram
argocd_app_reconcile_bucket{dest_server="https://a:6443",namespace="argocd",le="0.25"} 3
argocd_app_reconcile_sum{dest_server="https://a:6443",namespace="argocd"} 1.5
argocd_app_reconcile_count{dest_server="https://a:6443",namespace="argocd"} 4
argocd_app_reconcile_sum{dest_server="https://a:6443",namespace="team"} 0.5
argocd_app_reconcile_sum{dest_server="",namespace="argocd"} 9
argocd_app_reconcile_sum{namespace="argocd",dest_server="https://b \"q\":6443"} 2
argocd_resource_events_processing_sum{server="https://a:6443"} 1
argocd_cluster_api_resource_objects{server="https://a:6443"} 120
argocd_cluster_api_resource_objects{server="https://b \"q\":6443"} 30
argocd_app_info{name="x",dest_server="https://a:6443"} 1
argocd_app_info{namespace="team",name="y",dest_server="https://a:6443",sync_status="Synced"} 1
argocd_app_reconcile_sum{dest_server="https://c:6443"} NaN
broken{dest_server="https://a:6443" 5
"#;

    #[test]
    fn a_page_gives_each_servers_seconds_and_objects_and_skips_the_rest() {
        let scrape = parse(PAGE);
        assert_eq!(
            scrape.busy_seconds,
            BTreeMap::from([
                ("https://a:6443".to_string(), 3.0),
                ("https://b \"q\":6443".to_string(), 2.0),
            ])
        );
        assert_eq!(
            scrape.objects,
            BTreeMap::from([
                ("https://a:6443".to_string(), 120.0),
                ("https://b \"q\":6443".to_string(), 30.0),
            ])
        );
        // The apps it reconciles; one without a namespace cannot be named.
        assert_eq!(scrape.apps, BTreeSet::from(["team/y".to_string()]));
    }

    fn scrape(busy: &[(&str, f64)]) -> Scrape {
        Scrape {
            busy_seconds: busy.iter().map(|(s, v)| (s.to_string(), *v)).collect(),
            objects: BTreeMap::new(),
            apps: BTreeSet::new(),
        }
    }

    #[test]
    fn rates_add_up_over_pods_and_a_restarted_counter_counts_from_zero() {
        let t0 = Instant::now();
        let mut meter = Meter::new(Duration::ZERO);
        meter.observe(
            BTreeMap::from([
                ("pod-a".into(), scrape(&[("x", 10.0)])),
                ("pod-b".into(), scrape(&[("x", 4.0), ("y", 1.0)])),
            ]),
            t0,
        );
        assert_eq!(meter.busy("x"), None, "a first scrape is a baseline");
        let t1 = t0 + Duration::from_secs(10);
        // x moved from pod-a (frozen at 10) to pod-b (+6 s); y's pod restarted (1 -> 0.5).
        meter.observe(
            BTreeMap::from([
                ("pod-a".into(), scrape(&[("x", 10.0)])),
                ("pod-b".into(), scrape(&[("x", 10.0), ("y", 0.5)])),
            ]),
            t1,
        );
        assert!((meter.busy("x").unwrap() - 0.6).abs() < 1e-9);
        assert!((meter.busy("y").unwrap() - 0.05).abs() < 1e-9);
        // A pod not scraped is forgotten: its next scrape is a baseline again.
        let t2 = t1 + Duration::from_secs(10);
        meter.observe(
            BTreeMap::from([("pod-a".into(), scrape(&[("x", 10.0)]))]),
            t2,
        );
        assert_eq!(
            meter.busy("x"),
            Some(0.0),
            "x idle on pod-a, pod-b not read"
        );
        meter.observe(
            BTreeMap::from([("pod-b".into(), scrape(&[("x", 100.0)]))]),
            t2 + Duration::from_secs(10),
        );
        assert_eq!(
            meter.busy("x"),
            Some(0.0),
            "pod-b's 90 s are a baseline, not a rate"
        );
    }

    #[test]
    fn smoothing_follows_a_step_with_the_windows_time_constant() {
        let window = Duration::from_secs(600);
        let mut meter = Meter::new(window);
        let t0 = Instant::now();
        let mut total = 0.0;
        meter.observe(BTreeMap::from([("p".into(), scrape(&[("x", total)]))]), t0);
        // 1 busy second per second for one window, in 30 s passes.
        let mut now = t0;
        for _ in 0..20 {
            now += Duration::from_secs(30);
            total += 30.0;
            meter.observe(BTreeMap::from([("p".into(), scrape(&[("x", total)]))]), now);
        }
        assert_eq!(
            meter.busy("x"),
            Some(1.0),
            "the first rate is taken as it is"
        );
        // It drops to 0: after one window, e^-1 of the step is left.
        for _ in 0..20 {
            now += Duration::from_secs(30);
            meter.observe(BTreeMap::from([("p".into(), scrape(&[("x", total)]))]), now);
        }
        let left = meter.busy("x").unwrap();
        assert!((left - (-1.0f64).exp()).abs() < 1e-9, "{left}");
    }

    fn fleet(apps: &[(&str, u64)]) -> LiveFleet {
        let mut fleet = LiveFleet::default();
        for (id, n) in apps {
            fleet.clusters.push(Cluster::new(*id, *n));
            fleet
                .servers
                .insert(id.to_string(), format!("https://{id}"));
        }
        fleet
    }

    fn meter_with(busy: &[(&str, f64)], objects: &[(&str, f64)]) -> Meter {
        let mut meter = Meter::new(Duration::ZERO);
        let t0 = Instant::now();
        let server = |id: &str| format!("https://{id}");
        let zero = Scrape {
            busy_seconds: busy.iter().map(|(id, _)| (server(id), 0.0)).collect(),
            ..Scrape::default()
        };
        meter.observe(BTreeMap::from([("p".into(), zero)]), t0);
        let later = Scrape {
            busy_seconds: busy.iter().map(|(id, b)| (server(id), b * 10.0)).collect(),
            objects: objects.iter().map(|(id, o)| (server(id), *o)).collect(),
            ..Scrape::default()
        };
        meter.observe(
            BTreeMap::from([("p".into(), later)]),
            t0 + Duration::from_secs(10),
        );
        meter
    }

    #[test]
    fn a_cluster_weighs_its_cost_per_app_against_the_fleets_average() {
        // a: 10 apps, 3 busy s/s; b: 10 apps, 1 s/s; c: unmeasured; d: no apps.
        let mut fleet = fleet(&[("a", 10), ("b", 10), ("c", 5), ("d", 0)]);
        let meter = meter_with(&[("a", 3.0), ("b", 1.0)], &[("a", 100.0), ("b", 300.0)]);
        let weighing = weigh(&mut fleet, &meter, 0.0);
        let weights: Vec<Option<u32>> = fleet.clusters.iter().map(|c| c.weight).collect();
        // a: 3/4 of the time for 1/2 of the apps -> 1.5 x the average app.
        assert_eq!(weights, [Some(1500), Some(500), Some(1000), Some(1000)]);
        assert_eq!((weighing.measured, weighing.fallback), (2, None));
        assert!((weighing.busy - 4.0).abs() < 1e-9);
        // Half memory: a = 0.5 x 3/4 + 0.5 x 1/4 = 1/2 of the cost for 1/2 of the apps.
        let mut fleet = self::fleet(&[("a", 10), ("b", 10)]);
        weigh(&mut fleet, &meter, 0.5);
        let weights: Vec<Option<u32>> = fleet.clusters.iter().map(|c| c.weight).collect();
        assert_eq!(weights, [Some(1000), Some(1000)]);
    }

    #[test]
    fn nothing_measured_leaves_the_counts_and_says_why() {
        let mut fleet = fleet(&[("a", 10), ("b", 3)]);
        let weighing = weigh(&mut fleet, &Meter::new(Duration::ZERO), 0.3);
        assert!(fleet.clusters.iter().all(|c| c.weight.is_none()));
        assert!(
            weighing
                .fallback
                .unwrap()
                .contains("no controller's metrics have been read")
        );
        let idle = meter_with(&[("a", 0.0), ("b", 0.0)], &[]);
        let weighing = weigh(&mut fleet, &idle, 0.3);
        assert!(fleet.clusters.iter().all(|c| c.weight.is_none()));
        assert!(weighing.fallback.unwrap().contains("no controller reports"));
    }

    #[test]
    fn an_idle_measured_cluster_still_weighs_something() {
        let mut fleet = fleet(&[("a", 10), ("b", 10)]);
        let meter = meter_with(&[("a", 2.0), ("b", 0.0)], &[]);
        weigh(&mut fleet, &meter, 0.0);
        assert_eq!(fleet.clusters[1].weight, Some(1));
        assert_eq!(fleet.clusters[0].weight, Some(2000));
    }
}
