//! End-to-end test of the elastic shard count: with the chart's `sizing.autoscale`, the elected
//! planner sets the StatefulSet's replicas from the fleet's apps (up at once, down once the need
//! stayed low for the window), and the real StatefulSet controller creates and deletes the
//! pods as `spec.replicas` says.

// Test code: a step that fails fails the test, helpers included.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use support::{Fleet, FleetOptions, raised_client_limits};

const SETTLE: Duration = Duration::from_secs(240);
const DOWN_WINDOW: Duration = Duration::from_secs(20);

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

/// 500 apps on 1 replica; 3,500 more arrive and the planner asks for 4 replicas; they leave
/// again and it goes back to 1, only after its window. Every app ends Synced at each step and
/// no two processes ever work on one cluster at once.
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

    let grown = Instant::now();
    fleet.create_apps(500..4000).await.unwrap();
    follow_until_settled(&mut fleet, &mut counts, 4).await;
    let up = counts.since(grown);
    eprintln!(
        "1 -> 4 replicas and 4,000 apps Synced in {:.1} s",
        grown.elapsed().as_secs_f64()
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
