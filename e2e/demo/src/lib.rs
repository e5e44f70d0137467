//! `make demo`: shardwise running for real on a laptop with no Kubernetes installed.
//!
//! The in-memory test API server plays the control plane and two destination clusters, with the
//! CRDs, RBAC and a StatefulSet from `deploy/`, and the demo starts the replicas itself as
//! `shardwise-controller` processes. With `--real`, the end-to-end harness runs a real cluster
//! as local processes instead (kube-apiserver, etcd, kube-controller-manager, kube-scheduler
//! and a node agent that runs pods as processes), the chart is installed with Helm, and the real
//! StatefulSet controller creates the replicas' pods. Either way a fleet of FleetClusters and
//! FleetApps (one cluster hot enough to be cut into slices, a few apps broken on purpose) is
//! created. The demo then scales the StatefulSet
//! 3 -> 4 -> 2 and kills a replica, shows every shard live while it does, and ends with a
//! summary that checks what the project promises: every healthy app Synced, the broken ones
//! failed with their reason, no cluster or slice reconciled by two replicas at once (the
//! merged audit).
//!
//! The fleet is the end-to-end suites' own (`e2e/tests/support`), so the demo shows exactly
//! what the tests check.

#![deny(missing_docs)]

mod settle;
#[allow(clippy::unwrap_used)]
#[path = "../../tests/support/mod.rs"]
mod support;
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use shard_assign::KeyRange;
use shardwise_api::{FleetApp, SyncPhase};
use shardwise_runtime::audit;
use thiserror::Error;

use crate::support::prometheus::{Prometheus, dashboard, export, unix_now};
use crate::support::{Fleet, FleetOptions, NAMESPACE, Placement, fast_flags, repo_file};
use crate::view::{Frame, ShardFigures};

/// The steps the demo takes (`play`'s four `settle`s).
const STEPS: usize = 4;

/// Lease timings short enough that a killed replica's shard is taken over in seconds, as in
/// the chaos suite; more requests per destination than the default so the hot cluster's
/// slices do not dominate every settle.
const FLAGS: [&str; 5] = [
    "--lease-duration=6s",
    "--renew-deadline=4s",
    "--retry-period=1s",
    "--cluster-qps=100",
    "--cluster-burst=200",
];

/// Apps that cannot work, with the cluster they target and their manifests: the demo shows
/// that they fail with a clear reason and disturb nothing else.
const BROKEN: [(&str, &str, &str); 3] = [
    (
        "broken-yaml",
        "cluster-1",
        "apiVersion: v1\nkind: [unclosed\n",
    ),
    (
        "broken-no-kind",
        "cluster-2",
        "apiVersion: v1\nmetadata:\n  name: nameless\n",
    ),
    (
        "broken-orphan",
        "decommissioned",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: orphan\n",
    ),
];

/// What the demo runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `shardwise-controller` binary the replicas run.
    pub controller: PathBuf,
    /// FleetClusters in the fleet, `cluster-0` the hot one.
    pub clusters: u32,
    /// Healthy apps; the broken ones come on top.
    pub apps: u32,
    /// The share of the apps on `cluster-0`, in percent: a hot cluster that is cut into slices.
    pub hot_percent: u32,
    /// Redraw each frame in place (a terminal); otherwise print a frame every few seconds.
    pub redraw: bool,
    /// How long each step may take to settle.
    pub settle_timeout: Duration,
    /// How long no record may change owner before a step counts as settled: longer than a
    /// planning pass (`--plan-interval=3s`), so a planner still moving clusters within its
    /// budget is seen doing so.
    pub stable: Duration,
    /// A Prometheus binary: when set, Prometheus scrapes the replicas and the dashboard's
    /// series are exported at the end.
    pub prometheus: Option<PathBuf>,
    /// Where to draw the dashboard picture from those series (needs python3 with matplotlib).
    pub picture: Option<PathBuf>,
    /// Run on a real cluster of local processes, with the chart installed by Helm, instead of
    /// the in-memory test API server.
    pub real: bool,
}

impl Options {
    /// The demo's fleet: 20 clusters, 1,000 apps, 40% of them on one cluster (cut into slices
    /// while there are more than two shards).
    pub fn new(controller: PathBuf) -> Self {
        Self {
            controller,
            clusters: 20,
            apps: 1000,
            hot_percent: 40,
            redraw: false,
            settle_timeout: Duration::from_secs(180),
            stable: Duration::from_secs(7),
            prometheus: None,
            picture: None,
            real: false,
        }
    }
}

/// Why the demo stopped.
#[derive(Debug, Error)]
pub enum DemoError {
    /// [`Options::controller`] is not a file.
    #[error(
        "no controller binary at {0}: build it with `cargo build -p shardwise-controller`, or name one with --controller"
    )]
    NoController(PathBuf),
    /// Setting up, driving or checking the fleet failed.
    #[error("{what}: {source}")]
    Step {
        /// What the demo was doing.
        what: String,
        /// What went wrong.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A step did not settle in [`Options::settle_timeout`].
    #[error("step {step:?} did not settle within {timeout:?}: {last}\nreplica logs:\n{logs}")]
    NotSettled {
        /// The step's name.
        step: String,
        /// How long it was given.
        timeout: Duration,
        /// Why the fleet did not count as settled at the last look.
        last: String,
        /// Each replica's state and the end of its output.
        logs: String,
    },
    /// Writing to the terminal (or to the writer given instead) failed.
    #[error("cannot write to the terminal: {0}")]
    Output(#[from] std::io::Error),
}

fn step<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    what: &str,
) -> impl FnOnce(E) -> DemoError {
    let what = what.to_string();
    move |source| DemoError::Step {
        what,
        source: source.into(),
    }
}

/// How the demo ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Healthy apps.
    pub healthy: usize,
    /// How many of the healthy apps ended Synced.
    pub synced: usize,
    /// Each broken app with the message of its status (`None`: it did not fail).
    pub broken: Vec<(String, Option<String>)>,
    /// Clusters and slices seen to change owner.
    pub handoffs: u64,
    /// Owner changes the planners reported writing: of clusters and slices, of apps.
    pub moves: (u64, u64),
    /// Reconcile intervals in the merged audit of every replica.
    pub intervals: usize,
    /// The overlaps found among them, described.
    pub(crate) overlaps: Vec<String>,
    /// Each step: how long it took to settle, the handoffs it caused, the longest a record
    /// went without a live owner.
    pub steps: Vec<Step>,
    /// The dashboard's series as Prometheus recorded them (with Prometheus only).
    pub dashboard_data: Option<PathBuf>,
}

impl Summary {
    /// Everything the demo promises held.
    pub fn passed(&self) -> bool {
        self.synced == self.healthy
            && self.broken.iter().all(|(_, message)| message.is_some())
            && self.intervals > 0
            && self.overlaps.is_empty()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "summary")?;
        for step in &self.steps {
            writeln!(f, "  {step}")?;
        }
        writeln!(
            f,
            "  healthy apps Synced:        {} of {}",
            self.synced, self.healthy
        )?;
        for (name, message) in &self.broken {
            match message {
                Some(m) => writeln!(f, "  {name:<27} failed: {m}")?,
                None => writeln!(f, "  {name:<27} did NOT fail")?,
            }
        }
        writeln!(f, "  handoffs seen:              {}", self.handoffs)?;
        writeln!(
            f,
            "  planner moves:              {} of clusters and slices, {} of apps",
            self.moves.0, self.moves.1
        )?;
        writeln!(
            f,
            "  overlaps in the merged audit: {} ({} reconcile intervals checked)",
            self.overlaps.len(),
            self.intervals
        )?;
        for overlap in self.overlaps.iter().take(5) {
            writeln!(f, "    {overlap}")?;
        }
        write!(
            f,
            "  result: {}",
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// One step of the demo, as it settled.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What the step did.
    pub name: String,
    /// From its change until it settled.
    pub took: Duration,
    /// Clusters and slices seen to change owner during the step.
    pub handoffs: u64,
    /// The longest a cluster or slice went without a live owner during the step (its record
    /// naming a shard whose lease no replica holds), as the frames sampled it.
    pub longest_unowned: Duration,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<40} settled in {:>5.1} s, {} handoffs, longest without a live owner {:.1} s",
            self.name,
            self.took.as_secs_f64(),
            self.handoffs,
            self.longest_unowned.as_secs_f64()
        )
    }
}

/// Counters of one replica process, as last scraped.
#[derive(Clone, Copy, Debug)]
struct Counters {
    reconciles: f64,
    /// Seconds its reconciles took, summed.
    busy: f64,
    /// Owner changes of clusters or slices, and of apps.
    moves: (f64, f64),
    at: Instant,
}

/// A running demo fleet.
pub struct Demo {
    fleet: Fleet,
    options: Options,
    started: Instant,
    /// The StatefulSet's `spec.replicas`, as the demo set it.
    expected: u32,
    /// Last counters per process id (a restarted replica starts its counters anew).
    counters: BTreeMap<u32, Counters>,
    /// The records as last read whole: a read taken while a cluster is being cut or merged
    /// (its slices listed apart from it) fails, and a frame then shows the last one, so a
    /// move is never counted against an empty placement.
    placement: Placement,
    /// Owner of every record at the previous sample, to count handoffs.
    owners: settle::Owners,
    /// Since when each record has named a shard whose lease no replica holds.
    unowned_since: BTreeMap<(String, KeyRange), Instant>,
    /// The longest a record went without a live owner since the step began.
    longest_unowned: Duration,
    /// When a record last changed owner, appeared or went.
    changed: Instant,
    handoffs: u64,
    /// Killed processes: pid -> when, for the audit (a killed process's open intervals end
    /// there).
    deaths: BTreeMap<u32, u64>,
    steps: Vec<Step>,
    last_printed: Option<Instant>,
    /// Prometheus scraping the replicas, and since when (Unix seconds).
    prometheus: Option<(Prometheus, f64)>,
}

impl fmt::Debug for Demo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Demo")
            .field("dir", &self.fleet.env.dir())
            .field("replicas", &self.fleet.replicas.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Demo {
    /// Starts the API servers, creates the fleet and starts 3 replicas.
    pub async fn start(options: Options) -> Result<Self, DemoError> {
        if !options.controller.is_file() {
            return Err(DemoError::NoController(options.controller));
        }
        let mut args = fast_flags();
        args.extend(FLAGS.map(String::from));
        let fleet = Fleet::start(FleetOptions {
            replicas: 3,
            clusters: options.clusters,
            apps: options.apps,
            hot_percent: Some(options.hot_percent),
            audit: true,
            args,
            controller: Some(options.controller.clone()),
            test_server: !options.real,
            ..FleetOptions::default()
        })
        .await
        .map_err(step("start the fleet"))?;
        let apps = fleet.apps_api();
        for (name, cluster, manifests) in BROKEN {
            let app: FleetApp = serde_json::from_value(json!({
                "apiVersion": "shardwise.io/v1alpha1", "kind": "FleetApp",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"destination": {"cluster": cluster, "namespace": "broken"},
                         "source": {"manifests": manifests}},
            }))
            .map_err(step("describe a broken app"))?;
            apps.create(&PostParams::default(), &app)
                .await
                .map_err(step("create a broken app"))?;
        }
        let prometheus = match &options.prometheus {
            Some(program) => {
                let prometheus = Prometheus::start(&fleet, Some(program))
                    .await
                    .map_err(step("start Prometheus"))?;
                prometheus
                    .scrape_replicas(&fleet)
                    .map_err(step("point Prometheus at the replicas"))?;
                Some((prometheus, unix_now()))
            }
            None => None,
        };
        Ok(Self {
            prometheus,
            fleet,
            options,
            started: Instant::now(),
            expected: 3,
            counters: BTreeMap::new(),
            placement: Placement::default(),
            owners: BTreeMap::new(),
            unowned_since: BTreeMap::new(),
            longest_unowned: Duration::ZERO,
            changed: Instant::now(),
            handoffs: 0,
            deaths: BTreeMap::new(),
            steps: Vec::new(),
            last_printed: None,
        })
    }

    /// The folder of kubeconfigs and logs.
    pub fn dir(&self) -> &Path {
        self.fleet.env.dir()
    }

    /// A kubeconfig for the control plane as its administrator.
    pub fn kubeconfig(&self) -> Result<PathBuf, DemoError> {
        self.fleet
            .env
            .control_plane()
            .kubeconfig_path("admin")
            .map_err(step("write the kubeconfig"))
    }

    /// The scenario: settle on 3 replicas, scale to 4, scale to 2, kill one, check.
    pub async fn play(&mut self, out: &mut dyn Write) -> Result<Summary, DemoError> {
        self.settle(
            1,
            "3 replicas place and reconcile the fleet",
            &[0, 1, 2],
            out,
        )
        .await?;

        self.fleet.scale(4).await.map_err(step("scale to 4"))?;
        self.expected = 4;
        self.fleet
            .spawn_replica(3)
            .await
            .map_err(step("start replica 3"))?;
        self.retarget()?;
        self.settle(2, "scale 3 -> 4", &[0, 1, 2, 3], out).await?;

        self.fleet.scale(2).await.map_err(step("scale to 2"))?;
        self.expected = 2;
        // A StatefulSet stops the highest ordinals first, each gracefully.
        for ordinal in [3, 2] {
            self.fleet
                .stop_replica(ordinal)
                .await
                .map_err(step(&format!("stop replica {ordinal}")))?;
        }
        self.retarget()?;
        self.settle(3, "scale 4 -> 2", &[0, 1], out).await?;

        let pid = self
            .fleet
            .replicas
            .get(&1)
            .map(|r| r.pid())
            .unwrap_or_default();
        self.fleet.kill_replica(1).map_err(step("kill replica 1"))?;
        self.deaths.insert(pid, audit::now_nanos());
        // The StatefulSet recreates the pod a moment later; its lease must expire first.
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.fleet
            .spawn_replica(1)
            .await
            .map_err(step("restart replica 1"))?;
        self.retarget()?;
        self.settle(4, "kill replica 1 (SIGKILL); it restarts", &[0, 1], out)
            .await?;

        let mut summary = self.summarize().await?;
        summary.dashboard_data = self.export().await?;
        writeln!(out, "{summary}")?;
        if let Some(data) = &summary.dashboard_data {
            self.draw(data, out)?;
        }
        Ok(summary)
    }

    /// The address of the demo's Prometheus, if it runs one.
    pub fn prometheus(&self) -> Option<&str> {
        self.prometheus.as_ref().map(|(p, _)| p.address())
    }

    /// Points Prometheus at the replicas that run now.
    fn retarget(&self) -> Result<(), DemoError> {
        match &self.prometheus {
            Some((prometheus, _)) => prometheus
                .scrape_replicas(&self.fleet)
                .map_err(step("point Prometheus at the replicas")),
            None => Ok(()),
        }
    }

    /// Every panel's series since the start, from Prometheus, into the demo's folder.
    async fn export(&self) -> Result<Option<PathBuf>, DemoError> {
        let Some((prometheus, since)) = &self.prometheus else {
            return Ok(None);
        };
        let dashboard = dashboard().map_err(step("read the dashboard"))?;
        let path = self.fleet.env.dir().join("dashboard-data.json");
        let source =
            "make demo: 3 replicas, scaled to 4, then to 2, replica 1 killed and restarted";
        export(prometheus, &dashboard, *since, source, &path)
            .await
            .map_err(step("export the dashboard's series"))?;
        Ok(Some(path))
    }

    /// Draws the dashboard picture with `scripts/dashboard_picture.py`; a machine without
    /// python3 or matplotlib gets a hint, not a failure.
    fn draw(&self, data: &Path, out: &mut dyn Write) -> Result<(), DemoError> {
        let Some(picture) = &self.options.picture else {
            return Ok(());
        };
        if let Some(folder) = picture.parent() {
            std::fs::create_dir_all(folder)?;
        }
        let drawn = std::process::Command::new("python3")
            .arg(repo_file("scripts/dashboard_picture.py"))
            .arg(data)
            .arg(picture)
            .output();
        match drawn {
            Ok(output) if output.status.success() => {
                writeln!(out, "dashboard picture: {}", picture.display())?;
            }
            Ok(output) => writeln!(
                out,
                "no dashboard picture: scripts/dashboard_picture.py failed (it needs `pip install -r scripts/requirements-picture.txt`): {}",
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            )?,
            Err(e) => writeln!(out, "no dashboard picture: cannot run python3: {e}")?,
        }
        Ok(())
    }

    /// Shows the fleet, with `note` under it, until `stop` completes (`--keep`).
    pub async fn watch(
        &mut self,
        note: &str,
        stop: impl std::future::Future<Output = ()>,
        out: &mut dyn Write,
    ) -> Result<(), DemoError> {
        tokio::pin!(stop);
        if !self.options.redraw {
            writeln!(out, "{note}")?;
        }
        loop {
            let frame = self.sample("kept running", None).await?;
            if self.options.redraw {
                write!(out, "\x1b[H\x1b[2J{}{note}", view::render(&frame))?;
                out.flush()?;
            } else {
                self.show(&frame, out)?;
            }
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    /// Stops every replica gracefully; the API servers stop when the demo is dropped.
    pub async fn shutdown(mut self) -> Result<(), DemoError> {
        // To 0 first, or the StatefulSet controller would replace each pod stopped.
        self.fleet.scale(0).await.map_err(step("scale to 0"))?;
        let ordinals: Vec<u32> = self.fleet.replicas.keys().rev().copied().collect();
        for ordinal in ordinals {
            self.fleet
                .stop_replica(ordinal)
                .await
                .map_err(step(&format!("stop replica {ordinal}")))?;
        }
        Ok(())
    }

    /// Shows frames until the fleet is settled on `live`: the broken apps failed and every
    /// other Synced, every live shard owning something and holding its lease, no record on a
    /// shard whose replica is gone, every record that changed owner during the step
    /// reconciled by its new owner since (the replicas' audit), and no owner change for
    /// `stable`. The frame shown as settled is the read the decision was made on.
    async fn settle(
        &mut self,
        number: usize,
        phase: &str,
        live: &[u32],
        out: &mut dyn Write,
    ) -> Result<(), DemoError> {
        let began = Instant::now();
        let began_nanos = audit::now_nanos();
        let before = self.owners.clone();
        let handoffs = self.handoffs;
        self.longest_unowned = Duration::ZERO;
        let broken: Vec<&str> = BROKEN.iter().map(|(name, _, _)| *name).collect();
        self.last_printed = None;
        loop {
            let frame = self.sample(phase, Some((number, STEPS))).await?;
            self.show(&frame, out)?;
            let idle: Vec<u32> = frame
                .shards
                .iter()
                .filter(|s| live.contains(&s.shard) && s.apps == 0)
                .map(|s| s.shard)
                .collect();
            let settled = match self.fleet.check_settled_but(live, &broken).await {
                Ok(()) if !idle.is_empty() => Err(format!("shards {idle:?} own no apps yet")),
                Ok(()) if self.changed.elapsed() < self.options.stable => {
                    Err("the planner is still moving clusters".to_string())
                }
                Ok(()) => match self.leases_held(live).await {
                    Ok(()) => {
                        let reconciled = self.reconciled_since(began_nanos)?;
                        settle::unsettled(&before, &self.owners, live, &reconciled)
                            .map_or(Ok(()), Err)
                    }
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            match settled {
                Ok(()) => {
                    let step = Step {
                        name: phase.to_string(),
                        took: began.elapsed(),
                        handoffs: self.handoffs - handoffs,
                        longest_unowned: self.longest_unowned,
                    };
                    if !self.options.redraw {
                        self.last_printed = None;
                        self.show(&frame, out)?;
                    }
                    writeln!(
                        out,
                        "settled: {phase} ({:.1} s; {} handoffs, the longest without a live owner {:.1} s)\n",
                        step.took.as_secs_f64(),
                        step.handoffs,
                        step.longest_unowned.as_secs_f64()
                    )?;
                    self.steps.push(step);
                    return Ok(());
                }
                Err(last) if began.elapsed() > self.options.settle_timeout => {
                    return Err(DemoError::NotSettled {
                        step: phase.to_string(),
                        timeout: self.options.settle_timeout,
                        last,
                        logs: self.fleet.report(),
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// The shards whose Lease a replica holds now: a holder, and a renewal within its
    /// duration (a released Lease has no holder; a killed replica's holds until it expires).
    async fn held_leases(&self) -> Result<BTreeSet<u32>, DemoError> {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(self.fleet.admin.clone(), NAMESPACE);
        let now = std::time::SystemTime::now();
        let prefix = format!("{}-shard-", support::STATEFULSET);
        Ok(leases
            .list(&ListParams::default())
            .await
            .map_err(step("list the shard leases"))?
            .items
            .into_iter()
            .filter_map(|lease| {
                let shard = lease
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(&prefix)?
                    .parse()
                    .ok()?;
                let spec = lease.spec?;
                spec.holder_identity.filter(|h| !h.is_empty())?;
                let renewed = std::time::SystemTime::from(spec.renew_time?.0);
                let valid = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
                (renewed + valid > now).then_some(shard)
            })
            .collect())
    }

    /// What the replicas' audit says they reconciled since `since` (Unix nanoseconds): by
    /// cluster name, slice range and shard.
    fn reconciled_since(&self, since: u64) -> Result<settle::Reconciled, DemoError> {
        let intervals =
            audit::read(&self.fleet.audit_files(), "cluster").map_err(step("read the audit"))?;
        Ok(intervals
            .into_iter()
            .filter(|i| i.start >= since)
            .map(|i| {
                let cluster = i.unit.rsplit('/').next().unwrap_or_default().to_string();
                (cluster, i.range, i.shard)
            })
            .collect::<BTreeSet<_>>())
    }

    /// Owner changes the planners wrote so far: of clusters and slices, of apps.
    fn moves(&self) -> (u64, u64) {
        self.counters.values().fold((0, 0), |(units, items), c| {
            (units + c.moves.0 as u64, items + c.moves.1 as u64)
        })
    }

    /// The process ids of the running replicas.
    pub fn pids(&self) -> Vec<u32> {
        self.fleet.replicas.values().map(|r| r.pid()).collect()
    }

    /// Every live shard's replica holds its lease (a restarted replica has taken its shard
    /// back).
    async fn leases_held(&self, live: &[u32]) -> Result<(), String> {
        for &ordinal in live {
            let metrics = self
                .fleet
                .scrape(ordinal)
                .await
                .map_err(|e| format!("replica {ordinal}: {e}"))?;
            let shard = ordinal.to_string();
            if metrics.get("shardwise_lease_held", &[("shard", &shard)]) != Some(1.0) {
                return Err(format!("replica {ordinal} does not hold its lease yet"));
            }
        }
        Ok(())
    }

    fn show(&mut self, frame: &Frame, out: &mut dyn Write) -> Result<(), DemoError> {
        let text = view::render(frame);
        if self.options.redraw {
            // Home and clear, then the frame: the table stays in place.
            write!(out, "\x1b[H\x1b[2J{text}")?;
        } else if self
            .last_printed
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            writeln!(out, "{text}")?;
            self.last_printed = Some(Instant::now());
        }
        out.flush()?;
        Ok(())
    }

    async fn apps(&self) -> Result<Vec<FleetApp>, DemoError> {
        Ok(self
            .fleet
            .apps_api()
            .list(&ListParams::default())
            .await
            .map_err(step("list the apps"))?
            .items)
    }

    /// One frame: records and apps from the control plane, rates from each replica.
    async fn sample(
        &mut self,
        phase: &str,
        step_of: Option<(usize, usize)>,
    ) -> Result<Frame, DemoError> {
        // A read fails until the planner has written a record for every cluster, and while a
        // cluster is cut or merged (a slice not yet labelled, or old and new slices overlap).
        if let Ok(placement) = self.fleet.placement().await {
            self.placement = placement;
        }
        let placement = self.placement.clone();
        let apps = self.apps().await?;

        let mut shards: BTreeMap<u32, ShardFigures> = (0..self.expected)
            .chain(self.fleet.replicas.keys().copied())
            .map(|shard| {
                (
                    shard,
                    ShardFigures {
                        shard,
                        ..ShardFigures::default()
                    },
                )
            })
            .collect();
        let mut owners = BTreeMap::new();
        let mut draining = 0;
        for (cluster, records) in &placement.clusters {
            for &(range, shard, drain) in records {
                let figures = shards.entry(shard).or_insert_with(|| ShardFigures {
                    shard,
                    ..ShardFigures::default()
                });
                if range == KeyRange::WHOLE {
                    figures.clusters += 1;
                } else {
                    figures.slices += 1;
                }
                draining += usize::from(drain);
                owners.insert((cluster.clone(), range), shard);
            }
        }
        self.handoffs += settle::handoffs(&self.owners, &owners);
        if owners != self.owners {
            self.changed = Instant::now();
        }
        self.owners = owners;

        let (mut synced, mut failed) = (0, 0);
        for app in &apps {
            if let Some(shard) = placement.owner_of(app) {
                shards
                    .entry(shard)
                    .or_insert_with(|| ShardFigures {
                        shard,
                        ..ShardFigures::default()
                    })
                    .apps += 1;
            }
            let status = app.status.as_ref();
            match status.and_then(|s| s.sync_phase.as_ref()) {
                Some(SyncPhase::Synced)
                    if status.and_then(|s| s.observed_generation) == app.metadata.generation =>
                {
                    synced += 1
                }
                Some(SyncPhase::Failed) => failed += 1,
                _ => {}
            }
        }

        // The planner's latest plan: its max over mean.
        let mut load_balance = None;
        let holding = self.held_leases().await?;
        for (&ordinal, replica) in &self.fleet.replicas {
            let Some(figures) = shards.get_mut(&ordinal) else {
                continue;
            };
            figures.running = true;
            // A replica that is starting or stopping may not answer; it shows no rate.
            let Ok(metrics) = self.fleet.scrape(ordinal).await else {
                continue;
            };
            figures.planner = metrics.sum("shardwise_planner_leader", &[]) == 1.0;
            if figures.planner {
                load_balance = metrics.get("shardwise_load_balance", &[]);
            }

            let now = Counters {
                reconciles: metrics.sum("shardwise_reconciles_total", &[]),
                busy: metrics.sum("shardwise_reconcile_duration_seconds_sum", &[]),
                moves: (
                    metrics.sum("shardwise_planner_moves_total", &[("kind", "cluster")]),
                    metrics.sum("shardwise_planner_moves_total", &[("kind", "app")]),
                ),
                at: Instant::now(),
            };
            let pid = replica.pid();
            if let Some(before) = self.counters.get(&pid) {
                let seconds = now.at.duration_since(before.at).as_secs_f64();
                if seconds > 0.0 {
                    figures.reconciles_per_second =
                        Some((now.reconciles - before.reconciles).max(0.0) / seconds);
                    figures.busy = Some((now.busy - before.busy).max(0.0) / seconds);
                }
            }
            // The planner's counters vanish when it stops planning: keep the highest seen.
            let moves = self.counters.get(&pid).map_or(now.moves, |before| {
                (
                    before.moves.0.max(now.moves.0),
                    before.moves.1.max(now.moves.1),
                )
            });
            self.counters.insert(pid, Counters { moves, ..now });
        }
        // A record is without a live owner while no replica holds the lease of the shard it
        // names (gone, killed, or restarted and waiting for its old lease to expire).
        let now = Instant::now();
        let unowned: BTreeSet<(String, KeyRange)> = self
            .owners
            .iter()
            .filter(|(_, shard)| !holding.contains(shard))
            .map(|(key, _)| key.clone())
            .collect();
        for (key, since) in &self.unowned_since {
            if !unowned.contains(key) {
                self.longest_unowned = self.longest_unowned.max(now.duration_since(*since));
            }
        }
        self.unowned_since.retain(|key, _| unowned.contains(key));
        for key in unowned {
            let since = *self.unowned_since.entry(key).or_insert(now);
            self.longest_unowned = self.longest_unowned.max(now.duration_since(since));
        }

        Ok(Frame {
            phase: phase.to_string(),
            step: step_of,
            elapsed: self.started.elapsed(),
            expected: self.expected,
            shards: shards.into_values().collect(),
            apps: apps.len(),
            synced,
            failed,
            load_balance,
            moves: self.moves(),
            handoffs: self.handoffs,
            draining,
        })
    }

    async fn summarize(&self) -> Result<Summary, DemoError> {
        let apps = self.apps().await?;
        let is_broken = |name: &str| BROKEN.iter().any(|(b, _, _)| *b == name);
        let healthy: Vec<&FleetApp> = apps.iter().filter(|a| !is_broken(&a.name_any())).collect();
        let synced = healthy
            .iter()
            .filter(|a| {
                a.status.as_ref().is_some_and(|s| {
                    s.sync_phase == Some(SyncPhase::Synced)
                        && s.observed_generation == a.metadata.generation
                })
            })
            .count();
        let broken = BROKEN
            .iter()
            .map(|(name, _, _)| {
                let status = apps
                    .iter()
                    .find(|a| a.name_any() == *name)
                    .and_then(|a| a.status.as_ref());
                let message = status
                    .filter(|s| s.sync_phase == Some(SyncPhase::Failed))
                    .and_then(|s| s.message.clone());
                ((*name).to_string(), message)
            })
            .collect();
        // The replicas still run: an interval open now lasts until they stop, so any later
        // start by another process on the same cluster counts as an overlap.
        let files = self.fleet.audit_files();
        let intervals = audit::read(&files, "cluster").map_err(step("read the audit"))?;
        let overlaps = audit::overlaps(&intervals, &self.deaths)
            .iter()
            .map(ToString::to_string)
            .collect();
        let summary = Summary {
            healthy: healthy.len(),
            synced,
            broken,
            handoffs: self.handoffs,
            moves: self.moves(),
            intervals: intervals.len(),
            overlaps,
            steps: self.steps.clone(),
            dashboard_data: None,
        };
        Ok(summary)
    }
}
