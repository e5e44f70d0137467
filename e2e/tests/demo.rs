//! `make demo`, end to end: the demo's whole scenario (3 replicas, scaled to 4, then 2, one
//! killed and restarted) on a smaller fleet, run by the workspace's controller, with a real
//! Prometheus scraping the replicas (Debian's `prometheus`, or `$PROMETHEUS`, as the dashboard
//! test needs), on kube-apiserver and etcd as `make demo ARGS=--real` runs them (its default,
//! the in-memory test server, serves no test).

use std::time::Duration;

use shardwise_demo::{Demo, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_plays_every_step_and_its_summary_holds() {
    let options = Options {
        clusters: 10,
        apps: 300,
        stable: Duration::from_secs(4),
        prometheus: Some(
            std::env::var_os("PROMETHEUS").map_or_else(|| "prometheus".into(), Into::into),
        ),
        real: true,
        ..Options::new(shardwise_e2e::controller_binary().unwrap())
    };
    let mut demo = Demo::start(options).await.unwrap();
    let mut shown = Vec::new();
    let summary = demo.play(&mut shown).await.unwrap();
    let shown = String::from_utf8(shown).unwrap();

    assert!(summary.passed(), "{summary}\n{shown}");
    assert_eq!(summary.healthy, 300, "{summary}");
    assert_eq!(summary.synced, 300, "{summary}");
    let steps: Vec<&str> = summary.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        steps,
        [
            "3 replicas place and reconcile the fleet",
            "scale 3 -> 4",
            "scale 4 -> 2",
            "kill replica 1 (SIGKILL); it restarts"
        ]
    );
    // Scaling moved clusters between shards, and the planner said so; each scale counts the
    // handoffs it caused itself, not the next step (a step settles only once no record names
    // a gone replica and every moved one was reconciled by its new owner).
    assert!(summary.handoffs > 0, "{summary}");
    for scale in &summary.steps[1..3] {
        assert!(scale.handoffs > 0, "{scale} caused no handoff\n{summary}");
    }
    assert!(summary.moves.0 > 0 && summary.moves.1 > 0, "{summary}");
    // The terminal showed each step with a row per shard, and the summary.
    for step in &steps {
        assert!(shown.contains(&format!("settled: {step}")), "{shown}");
    }
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("3      ") && l.contains("running")),
        "no frame shows shard 3 running:\n{shown}"
    );
    // The planner's measured load reached the frames, with the line that says why apps differ.
    assert!(
        shown.contains("max/mean over live shards: planned load "),
        "no frame shows the planner's load:\n{shown}"
    );
    assert!(shown.contains("result: PASS"), "{shown}");

    // Prometheus recorded the replicas throughout: the dashboard's per-shard panels have a
    // series for every shard the demo ran (0 to 3).
    let data = summary.dashboard_data.as_ref().expect("Prometheus ran");
    let data: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data).unwrap()).unwrap();
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/shardwise/dashboards/shardwise.json"
    ))
    .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let owned_apps = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Owned apps per shard")
        .expect("the dashboard has an 'Owned apps per shard' panel")["id"]
        .clone();
    let panel = data["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == owned_apps)
        .unwrap();
    let shards: std::collections::BTreeSet<&str> = panel["targets"][0]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|series| series["metric"]["shard"].as_str())
        .collect();
    assert_eq!(shards, ["0", "1", "2", "3"].into(), "{panel}");

    // Nothing is left running.
    let pids = demo.pids();
    assert_eq!(pids.len(), 2);
    demo.shutdown().await.unwrap();
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "replica process {pid} still runs"
        );
    }
}
