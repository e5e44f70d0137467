//! End-to-end test of the elastic shard count: with the chart's `sizing.autoscale`, the elected
//! planner sets the StatefulSet's replicas from the fleet's apps (up at once, down once the need
//! stayed low for the window), and the real StatefulSet controller creates and deletes the
//! pods as `spec.replicas` says.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant, SystemTime};

use support::{Fleet, FleetOptions, NAMESPACE, STATEFULSET, raised_client_limits};

const SETTLE: Duration = Duration::from_secs(240);
const DOWN_WINDOW: Duration = Duration::from_secs(20);
/// The planner's periodic pass (it also plans on every change).
const PLAN_INTERVAL: Duration = Duration::from_secs(3);
/// "Up at once": no window holds a rise back. Once the apps are in and the planner has written
/// their labels, the next pass finds nothing left to write and sets the count; passes come on
/// every change and at least every plan interval, so a few intervals leave room for a loaded
/// machine, far below any window.
const UP_WITHIN: Duration = Duration::from_secs(4 * PLAN_INTERVAL.as_secs());

/// Each change of `spec.replicas` the test followed, with when it saw it.
#[derive(Default)]
struct Counts {
    seen: Vec<(Instant, u32)>,
}

impl Counts {
    fn note(&mut self, replicas: u32) {
        if self.seen.last().map(|&(_, n)| n) != Some(replicas) {
            eprintln!("spec.replicas {replicas}");
            self.seen.push((Instant::now(), replicas));
        }
    }

    fn since(&self, start: Instant) -> Vec<(Instant, u32)> {
        self.seen
            .iter()
            .copied()
            .filter(|&(at, _)| at >= start)
            .collect()
    }
}

/// Follows the StatefulSet (waits for its pods) until it asks for `replicas` and every app is
/// Synced on them.
async fn follow_until_settled(fleet: &mut Fleet, counts: &mut Counts, replicas: u32) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let followed = fleet.follow_statefulset().await.unwrap();
        counts.note(followed);
        let failure = if followed == replicas {
            let live: Vec<u32> = (0..replicas).collect();
            match fleet.check_settled(&live).await {
                Ok(()) => return,
                Err(e) => e,
            }
        } else {
            format!("spec.replicas is {followed}, waiting for {replicas}")
        };
        assert!(Instant::now() < deadline, "{failure}\n{}", fleet.report());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A metric of the planner's.
async fn planner_metric(fleet: &Fleet, name: &str, labels: &[(&str, &str)]) -> f64 {
    let planner = fleet.planner(SETTLE).await.unwrap();
    fleet.scrape(planner).await.unwrap().sum(name, labels)
}

/// 500 apps on 1 replica; 3,500 more arrive and the planner asks for more replicas within
/// [`UP_WITHIN`] of their arrival (or of its labelling them, which a change of the count waits
/// for), then 4; they leave again and it goes back to 1, only after its window. Every app ends
/// Synced at each step and no two processes ever work on one cluster at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_count_follows_the_apps_up_at_once_and_down_after_the_window() {
    let mut fleet = Fleet::start(FleetOptions {
        replicas: 1,
        clusters: 20,
        apps: 500,
        audit: true,
        values: vec![
            "sizing.autoscale=true".to_string(),
            "sizing.appsPerReplica=1000".to_string(),
            "sizing.maxReplicas=4".to_string(),
            format!("sizing.scaleDownWindow={}s", DOWN_WINDOW.as_secs()),
            // The fleet's fast setting, restated: the bound on a rise derives from it.
            format!("controller.planInterval={}s", PLAN_INTERVAL.as_secs()),
            // App counts decide here, and placement by app count keeps the check simple.
            "controller.loadModel=apps".to_string(),
        ],
        args: raised_client_limits(),
        ..FleetOptions::default()
    })
    .await
    .unwrap();
    let mut counts = Counts::default();
    follow_until_settled(&mut fleet, &mut counts, 1).await;
    assert_eq!(
        planner_metric(&fleet, "shardwise_desired_replicas", &[]).await,
        1.0
    );

    let (grown, growing) = (Instant::now(), SystemTime::now());
    fleet.create_apps(500..4000).await.unwrap();
    let arrived = SystemTime::now();
    follow_until_settled(&mut fleet, &mut counts, 4).await;
    let up = counts.since(grown);
    // From the server's audit log, as it received them: when the count first rose (the
    // planner's first write of the StatefulSet's scale since the apps began to arrive; the
    // test follows the count only between waits for pods, seconds late), and the planner's
    // writes of the fleet's objects before that (its requests name it in their User-Agent).
    // The count changes only on a settled fleet (planner/scaling.rs): once the apps are in
    // and the planner has written their labels, nothing but a window could hold it back.
    let writes = fleet.env.control_plane().writes();
    let scale = format!("/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{STATEFULSET}/scale");
    let raised = writes
        .iter()
        .find(|w| w.path == scale && w.code < 300 && w.at >= growing)
        .unwrap_or_else(|| panic!("no write of {scale} since the apps came"))
        .at;
    let mut planner_writes = std::collections::BTreeMap::<String, (usize, SystemTime)>::new();
    for w in writes.iter().filter(|w| {
        (growing..raised).contains(&w.at)
            && w.path.starts_with("/apis/shardwise.io/")
            && w.user_agent
                .as_deref()
                .is_some_and(|a| a.contains("(planner;"))
    }) {
        // By resource (and subresource): `fleetapps`, `fleetclusters/status`, ...
        let parts: Vec<&str> = w.path.split('/').collect();
        let resource = match parts.as_slice() {
            [.., "namespaces", _, resource, _, sub] => format!("{resource}/{sub}"),
            [.., "namespaces", _, resource, _] => resource.to_string(),
            _ => w.path.clone(),
        };
        let entry = planner_writes.entry(resource).or_insert((0, w.at));
        *entry = (entry.0 + 1, entry.1.max(w.at));
    }
    let settled = planner_writes
        .values()
        .map(|&(_, last)| last)
        .fold(arrived, SystemTime::max);
    let seconds = |from: SystemTime, to: SystemTime| match to.duration_since(from) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    eprintln!(
        "the apps arrived in {:.1} s; the planner's writes before the rise, by resource (count, last after the apps were in): {:?}; replicas first raised {:.1} s after the apps were in, {:.1} s after the planner's last write; 1 -> 4 replicas and 4,000 apps Synced in {:.1} s",
        seconds(growing, arrived),
        planner_writes
            .iter()
            .map(|(r, &(n, last))| (r, n, format!("{:.1} s", seconds(arrived, last))))
            .collect::<Vec<_>>(),
        seconds(arrived, raised),
        seconds(settled, raised),
        grown.elapsed().as_secs_f64()
    );
    assert!(
        seconds(settled, raised) <= UP_WITHIN.as_secs_f64(),
        "replicas first raised {:.1} s after the apps were in and the planner had written them, not within {UP_WITHIN:?} ({} plan intervals)",
        seconds(settled, raised),
        UP_WITHIN.as_secs() / PLAN_INTERVAL.as_secs()
    );
    assert!(
        up.windows(2).all(|w| w[0].1 < w[1].1),
        "the count only rose: {:?}",
        up.iter().map(|&(_, n)| n).collect::<Vec<_>>()
    );
    assert_eq!(
        planner_metric(&fleet, "shardwise_desired_replicas", &[]).await,
        4.0
    );

    let shrunk = Instant::now();
    fleet.delete_apps(500..4000).await.unwrap();
    follow_until_settled(&mut fleet, &mut counts, 1).await;
    let down = counts.since(shrunk);
    eprintln!(
        "4 -> 1 replicas in {:.1} s, steps {:?}",
        shrunk.elapsed().as_secs_f64(),
        down.iter()
            .map(|&(at, n)| (n, at.duration_since(shrunk).as_secs_f64().round()))
            .collect::<Vec<_>>()
    );
    assert!(
        down.windows(2).all(|w| w[0].1 > w[1].1),
        "the count only fell"
    );
    // The need fell once the deletions began: no step down before a whole window after that.
    let first_down = down.first().unwrap().0;
    assert!(
        first_down.duration_since(shrunk) >= DOWN_WINDOW,
        "scaled down {:.1} s after the apps began to leave, within the {DOWN_WINDOW:?} window",
        first_down.duration_since(shrunk).as_secs_f64()
    );
    assert_eq!(
        planner_metric(&fleet, "shardwise_desired_replicas", &[]).await,
        1.0
    );

    let intervals = fleet.audited_without_overlap();
    eprintln!("{} reconciles audited, no overlap", intervals.len());
}
