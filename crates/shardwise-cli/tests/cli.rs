//! The `shardwise` binary as a user runs it: outputs, plots and refusals of bad input.

use std::path::Path;
use std::process::{Command, Output};

fn shardwise(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardwise"))
        .args(args)
        .output()
        .expect("the shardwise binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("the temporary directory is writable");
    path.to_string_lossy().into_owned()
}

#[test]
fn simulate_json_has_the_documented_shape_for_every_strategy() {
    let out = shardwise(&["simulate", "--seeds", "5", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // No progress bar when stderr is not a terminal.
    assert_eq!(stderr(&out), "");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let strategies = json["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "legacy-modulo",
            "round-robin",
            "greedy-minimum",
            "weighted-ring-hash",
            "bounded-load",
            "sticky-balanced"
        ]
    );
    for s in strategies {
        for metric in ["max_over_mean", "spread_over_mean", "cv"] {
            let m = &s["balance"][metric];
            assert!(
                m["median"].as_f64().unwrap() <= m["p95"].as_f64().unwrap(),
                "{s}"
            );
        }
        for metric in ["clusters", "clusters_excluding_removed", "apps"] {
            assert!(s["moves"][metric]["median"].is_number(), "{s}");
            assert!(s["moves"][metric]["p95"].is_number(), "{s}");
        }
        assert!(s["assign_ms"]["median"].as_f64().unwrap() > 0.0);
        let max_over_mean = s["balance"]["max_over_mean"]["median"].as_f64().unwrap();
        assert!(max_over_mean >= 1.0);
    }
    assert_eq!(json["fleet"]["clusters"], 100);
    assert_eq!(json["scenario"]["kind"], "scale");
}

#[test]
fn simulate_table_and_csv_list_the_selected_strategies() {
    let out = shardwise(&[
        "simulate",
        "--seeds",
        "3",
        "--strategies",
        "bounded-load,greedy-minimum",
        "--load-factor",
        "1.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("bounded-load") && text.contains("greedy-minimum"),
        "{text}"
    );
    assert!(!text.contains("round-robin"), "{text}");

    let out = shardwise(&[
        "simulate",
        "--seeds",
        "3",
        "--format",
        "csv",
        "--scenario",
        "churn",
        "--steps",
        "4",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 7, "{text}");
    assert!(lines[0].starts_with("strategy,max_over_mean_median,max_over_mean_p95"));
    assert_eq!(lines[0].split(',').count(), lines[6].split(',').count());
}

#[test]
fn simulate_plots_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("plot.png");
    let out = shardwise(&["simulate", "--seeds", "4", "--plot", png.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(
        bytes.len() > 20_000,
        "a {}-byte PNG is too small to hold the charts",
        bytes.len()
    );

    let svg = dir.path().join("plot.svg");
    let out = shardwise(&[
        "simulate",
        "--seeds",
        "4",
        "--scenario",
        "churn",
        "--steps",
        "3",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"));
    for name in ["sticky-balanced", "bounded-load", "apps moved"] {
        assert!(text.contains(name), "the SVG does not mention {name}");
    }
    // sticky-balanced slices by default: its label says so, and the slicing panel is drawn.
    for name in ["sticky-balanced +slices", "Slicing: median max/mean"] {
        assert!(text.contains(name), "the SVG does not mention {name}");
    }
    let whole = dir.path().join("whole.svg");
    let out = shardwise(&[
        "simulate",
        "--seeds",
        "2",
        "--slicing",
        "off",
        "--plot",
        whole.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&whole).unwrap();
    assert!(!text.contains("+slices") && !text.contains("Slicing: "));

    let out = shardwise(&[
        "simulate",
        "--seeds",
        "1",
        "--plot",
        dir.path().join("plot.gif").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(".png or .svg"), "{}", stderr(&out));
}

#[test]
fn simulate_reads_an_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = write(
        dir.path(),
        "fleet.yaml",
        "- {name: a, apps: 50}\n- {name: b, apps: 30}\n- {name: c, apps: 20}\n- {name: d, apps: 0}\n",
    );
    let out = shardwise(&[
        "simulate",
        "--inventory",
        &inventory,
        "--from",
        "3",
        "--to",
        "2",
        "--seeds",
        "2",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["fleet"]["clusters"], 4);
    assert_eq!(json["fleet"]["apps"], 100);
    assert_eq!(json["fleet"]["distribution"], "inventory");
}

#[test]
fn assign_prints_each_clusters_shard_and_the_loads() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = write(
        dir.path(),
        "fleet.json",
        r#"[{"name": "big", "apps": 70}, {"name": "mid", "apps": 50},
            {"name": "small", "apps": 30}, {"name": "pinned", "apps": 5, "shard": 2},
            {"name": "lost", "apps": 1, "shard": 9}]"#,
    );
    let out = shardwise(&[
        "assign",
        "--strategy",
        "greedy-minimum",
        "--shards",
        "3",
        "--inventory",
        &inventory,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shard_of = |name: &str| {
        json["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["shard"].as_u64().unwrap())
            .unwrap()
    };
    // Pinned 5 on shard 2; then LPT: 70 -> 0, 50 -> 1, 30 -> 2 (5 < 50), 1 -> 2 (35 < 50).
    assert_eq!(shard_of("pinned"), 2);
    assert_eq!(shard_of("big"), 0);
    assert_eq!(shard_of("mid"), 1);
    assert_eq!(shard_of("small"), 2);
    let apps: Vec<u64> = json["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["apps"].as_u64().unwrap())
        .collect();
    assert_eq!(apps, vec![70, 50, 36]);
    assert_eq!(json["warnings"][0]["kind"], "pin-not-live");
    assert!(
        stderr(&out).contains("pinned to shard 9, which is not live"),
        "{}",
        stderr(&out)
    );

    let out = shardwise(&[
        "assign",
        "--strategy",
        "round-robin",
        "--live-shards",
        "0,2,3",
        "--inventory",
        &inventory,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("(pinned)") && text.contains("max/mean"),
        "{text}"
    );
}

#[test]
fn assign_cuts_a_hot_cluster_with_sticky_balanced_unless_slicing_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = write(
        dir.path(),
        "fleet.yaml",
        "- {name: hot, apps: 600}\n- {name: a, apps: 50}\n- {name: b, apps: 60}\n- {name: c, apps: 40}\n",
    );
    let assign = |extra: &[&str]| {
        let mut args = vec![
            "assign",
            "--strategy",
            "sticky-balanced",
            "--shards",
            "3",
            "--inventory",
            &inventory,
        ];
        args.extend(extra);
        let out = shardwise(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        out
    };
    let run = |slicing: &str| {
        let out = assign(&["--format", "json", "--slicing", slicing]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let sliced = run("auto");
    let rows = sliced["clusters"].as_array().unwrap();
    let hot: Vec<&serde_json::Value> = rows.iter().filter(|r| r["name"] == "hot").collect();
    assert!(hot.len() > 1, "{hot:?}");
    // The slices of the hot cluster carry all its apps, each with its KEP-5866 selector.
    let apps: u64 = hot.iter().map(|r| r["apps"].as_u64().unwrap()).sum();
    assert_eq!(apps, 600);
    assert!(hot.iter().all(|r| {
        r["selector"]
            .as_str()
            .unwrap()
            .starts_with("shardRange(object.metadata.uid, '0x")
    }));
    let shards: std::collections::BTreeSet<u64> =
        hot.iter().map(|r| r["shard"].as_u64().unwrap()).collect();
    assert_eq!(
        sliced["cache_copies"].as_u64(),
        Some(shards.len() as u64 - 1)
    );
    assert!(sliced["balance"]["max_over_mean"].as_f64().unwrap() < 1.1);
    assert!(
        rows.iter()
            .filter(|r| r["name"] != "hot")
            .all(|r| r.get("range").is_none())
    );

    let whole = run("off");
    assert_eq!(whole["clusters"].as_array().unwrap().len(), 4);
    assert_eq!(whole["cache_copies"].as_u64(), Some(0));
    assert!(whole["balance"]["max_over_mean"].as_f64().unwrap() > 2.0);

    let text = stdout(&assign(&[]));
    assert!(
        text.contains("slice") && text.contains("cache copies: "),
        "{text}"
    );
}

#[test]
fn bad_input_gets_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let negative = write(dir.path(), "neg.yaml", "- name: a\n  apps: -4\n");
    let malformed = write(dir.path(), "bad.json", "{\"clusters\": [ {\"name\": ");
    let good = write(dir.path(), "ok.yaml", "- name: a\n  apps: 4\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["simulate", "--strategies", "consistent-hashing"],
            "unknown strategy",
        ),
        (vec!["simulate", "--from", "0"], "--from"),
        (
            vec!["simulate", "--clusters", "-5"],
            "must be a whole number from 1",
        ),
        (
            vec!["simulate", "--apps", "-5"],
            "must be 0 or more, got -5",
        ),
        (
            vec!["simulate", "--distribution", "normal"],
            "invalid app distribution",
        ),
        (vec!["simulate", "--load-factor", "0.5"], "load factor"),
        (
            vec![
                "simulate",
                "--scenario",
                "remove-clusters",
                "--count",
                "101",
            ],
            "cannot remove 101 clusters",
        ),
        (
            vec!["simulate", "--inventory", "/nonexistent/fleet.yaml"],
            "cannot read inventory",
        ),
        (
            vec![
                "assign",
                "--strategy",
                "round-robin",
                "--shards",
                "0",
                "--inventory",
                &good,
            ],
            "--shards",
        ),
        (
            vec![
                "assign",
                "--strategy",
                "round-robin",
                "--shards",
                "2",
                "--inventory",
                &negative,
            ],
            "apps must be 0 or more, got -4",
        ),
        (
            vec![
                "assign",
                "--strategy",
                "round-robin",
                "--shards",
                "2",
                "--inventory",
                &malformed,
            ],
            "not valid JSON",
        ),
        (
            vec![
                "assign",
                "--strategy",
                "nope",
                "--shards",
                "2",
                "--inventory",
                &good,
            ],
            "unknown strategy",
        ),
    ];
    for (args, expected) in cases {
        let out = shardwise(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn crds_prints_exactly_what_deploy_holds_with_the_runtimes_unit_slice() {
    let output = shardwise(&["crds"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let printed = stdout(&output);
    let kept = include_str!("../../../deploy/crds.yaml");
    assert!(
        printed == kept,
        "deploy/crds.yaml is out of date with the Rust types: run `make crds` and commit the result"
    );
    for name in [
        "fleetclusters.shardwise.io",
        "fleetapps.shardwise.io",
        "fleetpolicies.shardwise.io",
        "unitslices.shardwise.io",
    ] {
        assert!(printed.contains(&format!("name: {name}")), "{name}");
    }
}
