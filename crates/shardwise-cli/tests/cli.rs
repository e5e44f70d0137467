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
        // Timings only with --timings.
        assert!(s.get("assign_ms").is_none(), "{s}");
        let max_over_mean = s["balance"]["max_over_mean"]["median"].as_f64().unwrap();
        assert!(max_over_mean >= 1.0);
    }
    assert_eq!(json["fleet"]["clusters"], 100);
    assert_eq!(json["scenario"]["kind"], "scale");
    assert_eq!(json["kind"], "simulation");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
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

    // With and without slices side by side, each row says which.
    let out = shardwise(&[
        "simulate",
        "--seeds",
        "2",
        "--format",
        "csv",
        "--slicing",
        "both",
        "--strategies",
        "bounded-load",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<String> = stdout(&out)
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next().map(str::to_string))
        .collect();
    assert_eq!(names, ["bounded-load", "bounded-load +slices"]);
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
fn argo_cd_strategies_put_a_pin_that_is_not_live_on_the_lowest_shard_as_argo_cd_does() {
    let dir = tempfile::tempdir().unwrap();
    // legacy-modulo alone would not put "lost" on shard 0 (FNV-1a of its id modulo 3); its pin
    // is out of range.
    let inventory = write(
        dir.path(),
        "fleet.json",
        r#"[{"id": "lost", "name": "lost", "apps": 1, "shard": 9},
            {"id": "free", "name": "free", "apps": 1}]"#,
    );
    assert_ne!(shard_assign::fnv1a_32(b"lost") % 3, 0);
    for strategy in ["legacy-modulo", "round-robin", "argocd-consistent-hashing"] {
        let out = shardwise(&[
            "assign",
            "--strategy",
            strategy,
            "--shards",
            "3",
            "--inventory",
            &inventory,
            "--format",
            "json",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let lost = &json["clusters"][0];
        assert_eq!(lost["name"], "lost");
        assert_eq!(lost["shard"], 0, "{strategy}");
        assert_eq!(lost["pinned"], false, "{strategy}");
        assert_eq!(json["warnings"][0]["kind"], "pin-not-live", "{strategy}");
        assert_eq!(json["warnings"][0]["placed_on"], 0, "{strategy}");
        assert!(
            stderr(&out).contains("pinned to shard 9, which is not live; placed on shard 0"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn the_readmes_assign_example_runs_on_the_shipped_inventory() {
    let readme = include_str!("../../../README.md");
    let example =
        "assign --strategy sticky-balanced --shards 3 --inventory docs/examples/fleet.yaml";
    assert!(
        readme.contains(example),
        "the README no longer shows {example:?}"
    );
    let inventory = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/examples/fleet.yaml"
    );
    let out = shardwise(&[
        "assign",
        "--strategy",
        "sticky-balanced",
        "--shards",
        "3",
        "--inventory",
        inventory,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = json["clusters"].as_array().unwrap();
    // The hot cluster is cut, the pinned one stays on its shard.
    assert!(
        rows.iter().filter(|r| r["name"] == "hot").count() > 1,
        "{json}"
    );
    let pinned = rows.iter().find(|r| r["name"] == "prod-eu").unwrap();
    assert_eq!(pinned["shard"], 0);
}

#[test]
fn assign_makes_no_cut_that_buys_no_balance() {
    // 3 and 5 apps on 2 shards: "y" is above the per-shard target of 4, but a cut of it gave
    // max/mean 1.25, exactly what it gives whole, for a cache copy more.
    let dir = tempfile::tempdir().unwrap();
    let inventory = write(
        dir.path(),
        "fleet.json",
        r#"{"clusters":[{"name":"x","apps":3},{"name":"y","apps":5}]}"#,
    );
    let out = shardwise(&[
        "assign",
        "--strategy",
        "sticky-balanced",
        "--shards",
        "2",
        "--inventory",
        &inventory,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["clusters"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json["cache_copies"].as_u64(), Some(0));
    assert_eq!(json["balance"]["max_over_mean"].as_f64(), Some(1.25));
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

/// A refusal of ours: exit code 2, one line on stderr, nothing on stdout.
fn refused(args: &[&str]) -> String {
    let out = shardwise(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("shardwise: "), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: partial output");
    err
}

#[test]
fn bad_input_gets_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let negative = write(dir.path(), "neg.yaml", "- name: a\n  apps: -4\n");
    let malformed = write(dir.path(), "bad.json", "{\"clusters\": [ {\"name\": ");
    let cases: Vec<(Vec<&str>, &str)> = vec![
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
            vec!["simulate", "--first-seed", "18446744073709551610"],
            "go past the largest seed",
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
    ];
    for (args, expected) in cases {
        let err = refused(&args);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn the_load_factor_refusal_says_it_once() {
    let err = refused(&["simulate", "--load-factor", "0.5"]);
    assert_eq!(err.matches("below 1").count(), 1, "{err}");
    assert_eq!(
        err.trim_end(),
        "shardwise: invalid load factor: 0.5 is below 1; the cap would be under the mean load"
    );
}

#[test]
fn clap_refusals_are_printed_whole_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "ok.yaml", "- name: a\n  apps: 4\n");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // A missing argument is named, with the usage line.
        (
            vec!["assign", "--strategy", "round-robin", "--shards", "2"],
            vec![
                "the following required arguments were not provided",
                "--inventory <FILE>",
                "Usage: shardwise assign",
            ],
        ),
        // A typo gets the closest flag.
        (
            vec!["simulate", "--sedes", "3"],
            vec![
                "unexpected argument '--sedes'",
                "a similar argument exists: '--seeds'",
            ],
        ),
        // A value outside a list gets the list.
        (
            vec!["simulate", "--format", "xml"],
            vec!["invalid value 'xml'", "[possible values: table, json, csv]"],
        ),
        (
            vec!["simulate", "--strategies", "consistent-hashing"],
            vec!["unknown strategy", "--help"],
        ),
        // The range stated is the real one, the limit of each size.
        (
            vec!["simulate", "--from", "0"],
            vec![
                "--from <FROM>",
                "must be a whole number from 1 to 10000, got 0",
            ],
        ),
        (
            vec!["simulate", "--clusters", "-5"],
            vec!["must be a whole number from 1 to 1000000, got -5"],
        ),
        (
            vec!["assign", "--strategy", "round-robin", "--shards", "0"],
            vec!["must be a whole number from 1 to 10000, got 0"],
        ),
        (
            vec!["simulate", "--seeds", "5000000000"],
            vec!["must be a whole number from 1 to 100000, got 5000000000"],
        ),
        (
            vec!["simulate", "--distribution", "normal"],
            vec!["invalid app distribution"],
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
            vec!["unknown strategy"],
        ),
    ];
    for (args, expected) in cases {
        let out = shardwise(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        for text in expected {
            assert!(err.contains(text), "{args:?}: {text:?} not in {err}");
        }
    }
}

#[test]
fn failures_while_running_exit_with_1() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["simulate", "--inventory", "/nonexistent/fleet.yaml"],
            "cannot read inventory /nonexistent/fleet.yaml",
        ),
        // A folder is no file to read.
        (
            vec![
                "assign",
                "--strategy",
                "round-robin",
                "--shards",
                "2",
                "--inventory",
                dir.path().to_str().unwrap(),
            ],
            "cannot read inventory",
        ),
    ];
    for (args, expected) in cases {
        let out = shardwise(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }

    // `plan` against a port nothing listens on: nothing can listen on port 0, so the
    // connection is refused at once, every time (a port freed by another socket may be taken
    // again before the test connects).
    let port = 0;
    let kubeconfig = write(
        dir.path(),
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: k, cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n"
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_shardwise"))
        .args(["plan", "--replicas", "2", "--kubeconfig", &kubeconfig])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot reach the API server at https://127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn every_size_is_bounded_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let two = write(
        dir.path(),
        "two.yaml",
        "- {name: a, apps: 3}\n- {name: b, apps: 4}\n",
    );
    let huge = write(dir.path(), "huge.yaml", "- {name: a, apps: 10000001}\n");
    let assign = |extra: &[&str], inventory: &str| {
        let mut args = vec!["assign", "--strategy", "sticky-balanced", "--inventory"];
        args.push(inventory);
        args.extend(extra.iter().copied());
        refused(&args)
    };
    let cases: Vec<(String, &str)> = vec![
        (
            refused(&["simulate", "--clusters", "4000000000"]),
            "--clusters 4000000000 is over the limit of 1000000",
        ),
        (
            refused(&["simulate", "--apps", "10000001"]),
            "--apps 10000001 is over the limit of 10000000",
        ),
        (
            refused(&["simulate", "--from", "4294967295"]),
            "--from 4294967295 is over the limit of 10000",
        ),
        (
            refused(&["simulate", "--to", "10001"]),
            "--to 10001 is over the limit of 10000",
        ),
        (
            refused(&["simulate", "--seeds", "100001"]),
            "--seeds 100001 is over the limit of 100000",
        ),
        (
            refused(&["simulate", "--scenario", "churn", "--steps", "10001"]),
            "--steps 10001 is over the limit of 10000",
        ),
        (
            refused(&["simulate", "--max-lifetime", "4294967295"]),
            "--max-lifetime 4294967295 is over the limit of 10000",
        ),
        (
            refused(&["simulate", "--arrivals", "1000001"]),
            "--arrivals 1000001 is over the limit of 1000000",
        ),
        (
            refused(&["simulate", "--count", "4294967295"]),
            "--count 4294967295 is over the limit of 1000000",
        ),
        (
            refused(&[
                "simulate",
                "--scenario",
                "add-clusters",
                "--clusters",
                "1000000",
                "--count",
                "1",
            ]),
            "the scenario grows the fleet to 1000001 clusters, over the limit of 1000000",
        ),
        (
            refused(&[
                "simulate",
                "--scenario",
                "churn",
                "--clusters",
                "100000",
                "--steps",
                "10000",
            ]),
            "the scenario holds up to 1000600050 clusters over its 10001 states",
        ),
        (
            refused(&[
                "simulate",
                "--scenario",
                "churn",
                "--clusters",
                "1",
                "--apps",
                "10000000",
                "--steps",
                "2",
                "--arrivals",
                "1",
            ]),
            "the scenario may reach 50000000 apps (2 joining clusters of up to 20000000 apps each), over the limit of 20000000",
        ),
        (
            assign(&["--shards", "4294967295"], &two),
            "--shards 4294967295 is over the limit of 10000",
        ),
        (
            assign(&["--live-shards", "0,4294967295"], &two),
            "--live-shards 4294967295 is over the limit of 9999",
        ),
        (
            assign(&["--shards", "2"], &huge),
            "holds 10000001 apps, over the limit of 10000000",
        ),
    ];
    for (err, expected) in cases {
        assert!(err.contains(expected), "{expected:?} not in {err}");
    }
}

#[test]
fn plot_paths_are_checked_before_any_table() {
    let dir = tempfile::tempdir().unwrap();
    let gif = dir.path().join("plot.gif");
    let err = refused(&["simulate", "--seeds", "1", "--plot", gif.to_str().unwrap()]);
    assert!(err.contains("must end in .png or .svg"), "{err}");
    let missing = dir.path().join("no-such-folder/plot.png");
    let err = refused(&[
        "simulate",
        "--seeds",
        "1",
        "--plot",
        missing.to_str().unwrap(),
    ]);
    assert!(err.contains("there is no folder"), "{err}");
    assert!(!missing.exists());
    let folder = dir.path().join("taken.svg");
    std::fs::create_dir(&folder).unwrap();
    let err = refused(&[
        "simulate",
        "--seeds",
        "1",
        "--plot",
        folder.to_str().unwrap(),
    ]);
    assert!(err.contains("that is a folder"), "{err}");
}

#[test]
fn inventory_typos_name_the_entry_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let typo = write(
        dir.path(),
        "fleet.yaml",
        "- {name: prod, apps: 3}\n- name: staging\n  apss: 4\n",
    );
    let err = refused(&["simulate", "--inventory", &typo]);
    assert!(
        err.contains("entry 2 (\"staging\"): unknown field `apss`, expected one of"),
        "{err}"
    );
    let wrong = write(
        dir.path(),
        "wrong.json",
        r#"[{"name": "a", "apps": "many"}]"#,
    );
    let err = refused(&[
        "assign",
        "--strategy",
        "round-robin",
        "--shards",
        "2",
        "--inventory",
        &wrong,
    ]);
    assert!(
        err.contains("entry 1 (\"a\"): field `apps`: invalid type"),
        "{err}"
    );
}

/// `shardwise ARGS` with `input` on standard input.
fn with_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardwise"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the shardwise binary runs");
    let mut stdin = child.stdin.take().expect("standard input is piped");
    stdin
        .write_all(input.as_bytes())
        .expect("shardwise reads its input");
    drop(stdin);
    child.wait_with_output().expect("shardwise ends")
}

#[test]
fn an_inventory_of_dash_is_read_from_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "- {name: a, apps: 50}\n- {name: b, apps: 30, shard: 1}\n- {name: c, apps: 20}\n";
    let file = write(dir.path(), "fleet.yaml", yaml);
    let args = |inventory: &str| {
        vec![
            "assign".to_string(),
            "--strategy".into(),
            "greedy-minimum".into(),
            "--shards".into(),
            "2".into(),
            "--inventory".into(),
            inventory.into(),
        ]
    };
    let from_file = shardwise(&args(&file).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    let dash = args("-");
    let dash: Vec<&str> = dash.iter().map(String::as_str).collect();
    let from_stdin = with_stdin(&dash, yaml);
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    assert_eq!(stdout(&from_stdin), stdout(&from_file));
    assert!(stdout(&from_stdin).contains("1 (pinned)"));

    // JSON on standard input reads as well.
    let json = r#"[{"name": "a", "apps": 50}, {"name": "b", "apps": 30, "shard": 1}, {"name": "c", "apps": 20}]"#;
    assert_eq!(stdout(&with_stdin(&dash, json)), stdout(&from_file));

    let simulated = with_stdin(
        &[
            "simulate",
            "--inventory",
            "-",
            "--from",
            "3",
            "--to",
            "2",
            "--seeds",
            "2",
            "--format",
            "json",
        ],
        yaml,
    );
    assert!(simulated.status.success(), "{}", stderr(&simulated));
    let report: serde_json::Value = serde_json::from_slice(&simulated.stdout).unwrap();
    assert_eq!(report["fleet"]["apps"], 100);

    let err = stderr(&with_stdin(&dash, "- {name: a}\n"));
    assert!(
        err.contains("shardwise: invalid inventory from standard input: entry 1 (\"a\"): missing field `apps`"),
        "{err}"
    );
}

#[test]
fn completions_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = shardwise(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for command in ["simulate", "assign", "plan", "crds", "completions"] {
            assert!(script.contains(command), "{shell}: no {command}");
        }
        assert!(script.contains("inventory"), "{shell}");
    }
    let out = shardwise(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("possible values: bash"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_version_names_the_commit() {
    let out = shardwise(&["--version"]);
    assert!(out.status.success());
    let text = stdout(&out);
    let commit = text
        .trim_end()
        .strip_prefix(&format!("shardwise {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{text}"
    );
}

/// Every number of a JSON document has at most four decimals.
fn check_no_float_noise(value: &serde_json::Value, path: &str) {
    match value {
        serde_json::Value::Number(n) => {
            let text = n.to_string();
            let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 4, "{path}: {text}");
        }
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_no_float_noise(item, &format!("{path}[{i}]"));
            }
        }
        serde_json::Value::Object(fields) => {
            for (key, item) in fields {
                check_no_float_noise(item, &format!("{path}.{key}"));
            }
        }
        _ => {}
    }
}

#[test]
fn json_is_versioned_without_float_noise_and_the_same_every_run() {
    let args = [
        "simulate",
        "--seeds",
        "6",
        "--first-seed",
        "11",
        "--distribution",
        "zipf",
        "--format",
        "json",
    ];
    let first = shardwise(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    let json: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    check_no_float_noise(&json, "");
    // The raw text too: serde_json would not print noise a reader's parser hides.
    for line in stdout(&first).lines() {
        if let Some((_, number)) = line.trim_end_matches(',').rsplit_once(": ")
            && let Some((_, decimals)) = number.split_once('.')
            && decimals.chars().all(|c| c.is_ascii_digit())
        {
            assert!(decimals.len() <= 4, "{line}");
        }
    }
    assert_eq!(shardwise(&args).stdout, first.stdout);

    // Tables and CSV too, with no timings by default.
    for format in ["table", "csv"] {
        let args = [
            "simulate",
            "--seeds",
            "4",
            "--scenario",
            "churn",
            "--steps",
            "3",
            "--format",
            format,
        ];
        let one = shardwise(&args);
        assert!(one.status.success(), "{}", stderr(&one));
        assert_eq!(one.stdout, shardwise(&args).stdout, "{format}");
        assert!(
            !stdout(&one).contains("assign"),
            "{format}: {}",
            stdout(&one)
        );
    }
    let timed = shardwise(&["simulate", "--seeds", "2", "--timings"]);
    assert!(stdout(&timed).contains("assign ms"), "{}", stdout(&timed));
    let timed = shardwise(&["simulate", "--seeds", "2", "--timings", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&timed.stdout).unwrap();
    assert!(
        json["strategies"][0]["assign_ms"]["median"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    let dir = tempfile::tempdir().unwrap();
    let fleet = write(
        dir.path(),
        "fleet.yaml",
        "- {name: a, apps: 7}\n- {name: b, apps: 5}\n- {name: c, apps: 1}\n",
    );
    let assigned = shardwise(&[
        "assign",
        "--strategy",
        "round-robin",
        "--shards",
        "3",
        "--inventory",
        &fleet,
        "--format",
        "json",
    ]);
    let json: serde_json::Value = serde_json::from_slice(&assigned.stdout).unwrap();
    assert_eq!(json["kind"], "assignment");
    assert_eq!(json["version"], env!("CARGO_PKG_VERSION"));
    // 7 / (13 / 3) = 1.6153846...
    assert_eq!(json["balance"]["max_over_mean"].as_f64(), Some(1.6154));
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

#[test]
fn converge_replays_passes_until_the_target_and_counts_every_move() {
    let out = shardwise(&[
        "simulate",
        "--scenario",
        "converge",
        "--from",
        "9",
        "--to",
        "10",
        "--seeds",
        "3",
        "--strategies",
        "sticky-balanced,greedy-minimum",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["kind"], "convergence");
    let rows = report["strategies"].as_array().unwrap();
    let sticky = &rows[0];
    assert_eq!(sticky["strategy"], "sticky-balanced");
    assert_eq!(sticky["within_target"], 3);
    // Its first pass leaves the fleet above the target; later ones bring it within.
    assert!(sticky["first_pass"]["median"].as_f64().unwrap() > 1.03);
    assert!(sticky["last_pass"]["median"].as_f64().unwrap() <= 1.03);
    assert!(sticky["passes"]["median"].as_f64().unwrap() > 1.0);
    assert_eq!(sticky["minimum_apps"]["median"], 1000.0);
    let greedy = &rows[1];
    assert_eq!(greedy["passes"]["median"], 1.0);
    assert!(
        greedy["apps_moved"]["median"].as_f64().unwrap()
            > 3.0 * sticky["apps_moved"]["median"].as_f64().unwrap()
    );
    let table = stdout(&shardwise(&[
        "simulate",
        "--scenario",
        "converge",
        "--from",
        "9",
        "--to",
        "10",
        "--seeds",
        "2",
        "--strategies",
        "legacy-modulo",
    ]));
    assert!(table.contains("never"), "{table}");
    assert!(table.contains("0 of 2"), "{table}");
}

#[test]
fn drift_compares_load_models_on_the_true_load() {
    let out = shardwise(&[
        "simulate",
        "--scenario",
        "drift",
        "--seeds",
        "2",
        "--hours",
        "6",
        "--strategies",
        "sticky-balanced",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["kind"], "drift");
    assert_eq!(report["hours"], 6);
    let rows = report["rows"].as_array().unwrap();
    let models: Vec<&str> = rows
        .iter()
        .map(|r| r["load_model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["apps", "measured"]);
    assert_eq!(rows[0]["apps_moved_per_hour"]["median"], 0.0);
    assert!(
        rows[1]["true_max_over_mean"]["median"].as_f64().unwrap()
            < rows[0]["true_max_over_mean"]["median"].as_f64().unwrap()
    );
    for (args, message) in [
        (
            &["simulate", "--scenario", "drift", "--plot", "x.png"][..],
            "--scenario drift has no plot: drop --plot",
        ),
        (
            &["simulate", "--scenario", "converge", "--slicing", "on"][..],
            "--scenario converge places whole clusters: drop --slicing",
        ),
        (
            &[
                "simulate",
                "--scenario",
                "converge",
                "--from",
                "5",
                "--to",
                "5",
            ][..],
            "convergence needs a change of the shard count",
        ),
        (
            &["simulate", "--scenario", "drift", "--noise", "3"][..],
            "--noise must be from 0 to 2, got 3",
        ),
        (
            &[
                "simulate",
                "--scenario",
                "drift",
                "--hours",
                "8760",
                "--plan-every",
                "1",
            ][..],
            "over the limit of 5000000",
        ),
    ] {
        let err = refused(args);
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
