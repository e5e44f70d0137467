//! Every command the README shows, run as written: each line of its `sh` blocks and each inline
//! span that starts with `shardwise `. `shardwise` (and `cargo run … --bin shardwise --`) is this
//! test's binary, run in a folder laid out like a clone (the sample inventory at its path) with
//! `KUBECONFIG` naming a kube-apiserver that holds a shardwise fleet and an Argo CD
//! installation, as a reader's cluster would. A `make` target must exist; `make simulate` runs
//! its recipe here and prints the README's table, `make demo` is e2e/tests/demo.rs and
//! `make test` is CI itself.

// Test code: a step that fails fails the test.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shardwise_e2e::Environment;

mod common;
use common::{shard_lease, statefulset};
use shardwise_e2e::argocd::{APPLICATION_CRD, application, cluster_secret};

const README: &str = include_str!("../../../README.md");
const MAKEFILE: &str = include_str!("../../../Makefile");
const CARGO_RUN: &str = "cargo run --release -p shardwise-cli --bin shardwise --";
/// The Argo CD balancer's binary, a package of its own.
const BALANCER: &str = "shardwise-balancer";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The README's commands: the lines of its `sh` blocks (comments cut) and its inline code spans
/// that start with `shardwise ` or name the balancer (a span may wrap across lines).
fn commands(readme: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut prose = String::new();
    for line in readme.lines() {
        if let Some(fence) = line.strip_prefix("```") {
            in_sh = !in_sh && fence == "sh";
            prose.push('\n');
            continue;
        }
        if in_sh {
            let command = line.split(" #").next().unwrap_or_default().trim();
            if !command.is_empty() {
                commands.push(command.to_string());
            }
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Odd pieces between backticks are code spans; a code block was left out above.
    for span in prose.split('`').skip(1).step_by(2) {
        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
        if span.starts_with("shardwise ") || span.starts_with(BALANCER) {
            commands.push(span);
        }
    }
    commands
}

/// The README's table of `make simulate`.
fn simulate_table(readme: &str) -> String {
    let after = readme
        .split("`make simulate` prints")
        .nth(1)
        .expect("the README shows what `make simulate` prints");
    let block = after
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a text block after it");
    block.to_string()
}

/// The arguments after `--` of a make target's recipe that runs the binary.
fn recipe_args(target: &str) -> Vec<String> {
    let recipe = MAKEFILE
        .split(&format!("\n{target}:\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no target {target} in the Makefile"));
    let line = recipe.lines().next().unwrap_or_default();
    let args = line
        .split(" --bin shardwise -- ")
        .nth(1)
        .unwrap_or_else(|| panic!("{target} does not run the shardwise binary: {line}"));
    args.split_whitespace().map(String::from).collect()
}

/// A fleet of each kind on one kube-apiserver, and a folder laid out like a clone.
struct Reader {
    _env: Environment,
    kubeconfig: PathBuf,
    clone: tempfile::TempDir,
}

impl Reader {
    async fn start() -> Self {
        let env = Environment::builder().start().unwrap();
        let cp = env.control_plane();
        cp.apply_file("admin", &repo_file("deploy/crds.yaml"))
            .await
            .unwrap();
        // shardwise's: 3 replicas, 6 clusters with 4 apps each, and the shard Leases with the
        // replicas' load reports.
        let mut yaml =
            String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: shardwise}\n---\n");
        yaml.push_str(&statefulset("shardwise", "shardwise", 3, ""));
        for c in 0..6u32 {
            yaml.push_str(&format!(
                "---\napiVersion: shardwise.io/v1alpha1\nkind: FleetCluster\nmetadata: {{name: c{c}, namespace: shardwise, labels: {{shardwise.io/shard: \"{}\"}}}}\nspec: {{server: \"https://c{c}.example:6443\"}}\n",
                c % 3
            ));
            for a in 0..4 {
                yaml.push_str(&format!(
                    "---\napiVersion: shardwise.io/v1alpha1\nkind: FleetApp\nmetadata: {{name: c{c}-{a}, namespace: shardwise}}\nspec: {{destination: {{cluster: c{c}, namespace: default}}, source: {{manifests: \"{{}}\"}}}}\n"
                ));
            }
        }
        for shard in 0..3u32 {
            let records: Vec<String> = [shard, shard + 3]
                .iter()
                .map(|c| format!(r#""shardwise/c{c}":{{"busy":{}.0,"items":4}}"#, c + 1))
                .collect();
            yaml.push_str(&shard_lease(
                "shardwise",
                shard,
                &format!(r#"{{"v":1,"records":{{{}}}}}"#, records.join(",")),
            ));
        }
        // Argo CD's: 2 controller replicas, 4 clusters with 1 to 4 Applications.
        yaml.push_str("---\napiVersion: v1\nkind: Namespace\nmetadata: {name: argocd}\n---\n");
        yaml.push_str(&statefulset(
            "argocd",
            "argocd-application-controller",
            2,
            "{name: ARGOCD_CONTROLLER_REPLICAS, value: \"2\"}",
        ));
        yaml.push_str(&format!("---\n{APPLICATION_CRD}"));
        for (i, name) in ["alpha", "bravo", "charlie", "delta"].iter().enumerate() {
            yaml.push_str(&cluster_secret(
                &format!("cluster-{name}"),
                &format!("name: {name}, server: \"https://{name}.example:6443\""),
            ));
            for j in 0..=i {
                yaml.push_str(&application(&format!("{name}-{j}"), name));
            }
        }
        cp.apply_yaml("admin", &yaml).await.unwrap();
        let kubeconfig = cp.kubeconfig_path("admin").unwrap();
        let clone = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(clone.path().join("docs/examples")).unwrap();
        std::fs::copy(
            repo_file("docs/examples/fleet.yaml"),
            clone.path().join("docs/examples/fleet.yaml"),
        )
        .unwrap();
        Self {
            _env: env,
            kubeconfig,
            clone,
        }
    }

    fn command(&self, args: &[String]) -> Command {
        self.command_of(Path::new(env!("CARGO_BIN_EXE_shardwise")), args)
    }

    fn command_of(&self, binary: &Path, args: &[String]) -> Command {
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(self.clone.path())
            .env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// Runs a pipeline of shardwise commands, each stage's output the next one's input.
    fn pipeline(&self, stages: &[Vec<String>]) -> Output {
        let mut input = Vec::new();
        let mut last = None;
        for stage in stages {
            let mut child = self
                .command(stage)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            std::io::Write::write_all(&mut stdin, &input).unwrap();
            drop(stdin);
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{stage:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            input.clone_from(&output.stdout);
            last = Some(output);
        }
        last.unwrap()
    }

    /// `shardwise-balancer` runs until stopped: as written, it must plan at least once (its
    /// metrics on the default address say so) and stop cleanly on SIGTERM.
    async fn balance(&self, args: &[String]) {
        let binary = shardwise_e2e::workspace_binary(BALANCER, BALANCER).unwrap();
        let mut child = self
            .command_of(&binary, args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let planned = loop {
            let runs = shardwise_e2e::scrape("http://127.0.0.1:8080/metrics")
                .await
                .map(|m| m.sum("shardwise_planner_runs_total", &[("result", "success")]))
                .unwrap_or(0.0);
            if runs >= 1.0 || Instant::now() > deadline {
                break runs;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{args:?} exited with {status}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let pid = child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            planned >= 1.0,
            "{args:?} made no planning pass in 60 s: {stderr}"
        );
        assert!(output.status.success(), "{args:?}: {stderr}");
    }
}

/// `a|b|c` in a word stands for each of its alternatives.
fn expand(stage: &str) -> Vec<Vec<String>> {
    let words: Vec<&str> = stage.split_whitespace().collect();
    match words.iter().position(|w| w.contains('|')) {
        Some(at) => words[at]
            .split('|')
            .map(|choice| {
                let mut each: Vec<String> = words.iter().map(|w| w.to_string()).collect();
                each[at] = choice.to_string();
                each
            })
            .collect(),
        None => vec![words.into_iter().map(String::from).collect()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_the_readme_runs_as_written() {
    let commands = commands(README);
    let reader = Reader::start().await;
    let mut ran = Vec::new();
    // What each shardwise command printed, by the command as run.
    let mut printed = std::collections::BTreeMap::new();
    for command in &commands {
        if let Some(target) = command.strip_prefix("make ") {
            assert!(
                MAKEFILE.contains(&format!("\n{target}:")),
                "{command}: no such target"
            );
            if target == "simulate" {
                let output = reader.pipeline(&[recipe_args(target)]);
                let text = String::from_utf8(output.stdout).unwrap();
                let table = simulate_table(README);
                assert!(
                    text.contains(&table),
                    "make simulate printed\n{text}\nthe README shows\n{table}"
                );
                ran.push(command.clone());
            }
            continue;
        }
        if let Some(args) = command.strip_prefix(BALANCER) {
            let args: Vec<String> = args.split_whitespace().map(String::from).collect();
            reader.balance(&args).await;
            ran.push(command.clone());
            continue;
        }
        let shardwise = command
            .strip_prefix(CARGO_RUN)
            .map(|args| format!("shardwise{args}"))
            .unwrap_or_else(|| command.clone());
        let stages: Vec<&str> = shardwise.split(" | ").collect();
        let args = |stage: &str| -> Vec<Vec<String>> {
            let stage = stage
                .strip_prefix("shardwise ")
                .unwrap_or_else(|| panic!("{command}: not a shardwise command"));
            expand(stage)
        };
        if stages.len() == 1 {
            for each in args(stages[0]) {
                let output = reader.pipeline(std::slice::from_ref(&each));
                let text = String::from_utf8(output.stdout).unwrap();
                assert!(!text.is_empty(), "{each:?} printed nothing");
                let run = format!("shardwise {}", each.join(" "));
                printed.insert(run.clone(), text);
                ran.push(run);
            }
        } else {
            let stages: Vec<Vec<String>> = stages
                .iter()
                .map(|s| args(s).into_iter().next().unwrap())
                .collect();
            let output = reader.pipeline(&stages);
            assert!(!output.stdout.is_empty(), "{command} printed nothing");
            ran.push(command.clone());
        }
    }
    // What the README says of some of them holds too.
    let plot = reader.clone.path().join("tradeoff.png");
    let png = std::fs::read(&plot).unwrap();
    assert_eq!(&png[1..4], b"PNG", "{}", plot.display());
    let claim = "max/mean 3.730 without slices and 1.027 with them";
    assert!(
        README
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .contains(claim),
        "the README no longer says {claim:?}"
    );
    let zipf = &printed["shardwise simulate --distribution zipf:1.5 --clusters 100 --apps 10000 --slicing both"];
    for figure in ["3.730", "1.027"] {
        assert!(zipf.contains(figure), "{figure} not in\n{zipf}");
    }
    eprintln!(
        "ran {} commands of the README:\n  {}",
        ran.len(),
        ran.join("\n  ")
    );
    // Every kind of command the README shows was found and run.
    for expected in [
        "make simulate",
        "shardwise simulate --plot tradeoff.png",
        "shardwise assign --strategy sticky-balanced --shards 3 --inventory docs/examples/fleet.yaml",
        "shardwise completions fish",
        "shardwise plan --source argocd",
        "shardwise plan --load measured",
        BALANCER,
    ] {
        assert!(
            ran.iter().any(|r| r == expected),
            "{expected} not run: {ran:?}"
        );
    }
}

/// The README's paragraphs outside code blocks and tables, as (first line, line count): a list
/// item starts a paragraph of its own.
fn paragraphs(readme: &str) -> Vec<(usize, usize)> {
    let (mut found, mut in_code, mut current) = (Vec::new(), false, None::<(usize, usize)>);
    for (number, line) in readme.lines().enumerate().map(|(i, l)| (i + 1, l)) {
        let item = line.starts_with("- ")
            || line
                .split_once(". ")
                .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
        let breaks = line.starts_with("```")
            || in_code
            || line.trim().is_empty()
            || line.starts_with('|')
            || line.starts_with('#')
            || item;
        if breaks {
            found.extend(current.take());
        }
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code
            && !line.trim().is_empty()
            && !line.starts_with('|')
            && !line.starts_with('#')
        {
            current = Some(current.map_or((number, 1), |(first, n)| (first, n + 1)));
        }
    }
    found.extend(current);
    found
}

#[test]
fn the_readme_reads_in_minutes_and_each_kind_of_user_finds_a_command_at_once() {
    let long: Vec<_> = paragraphs(README)
        .into_iter()
        .filter(|(_, lines)| *lines > 12)
        .collect();
    assert!(
        long.is_empty(),
        "paragraphs over 12 lines (first line, lines): {long:?}"
    );
    // The demo on the first screen; a fleet operator's, an Argo CD operator's and a kube-rs
    // author's first command within the first 60 lines.
    let first = |n: usize| README.lines().take(n).collect::<Vec<_>>().join("\n");
    assert!(
        first(24).contains("make demo"),
        "no `make demo` on the first screen"
    );
    for command in [
        "helm install shardwise charts/shardwise",
        "shardwise plan --load measured",
        "shardwise plan --source argocd",
        "#shard-your-own-controller",
    ] {
        assert!(
            first(60).contains(command),
            "{command} is not within the README's first 60 lines"
        );
    }
    // The checker itself: a 13-line paragraph is found, a list of short items is not.
    let sample = format!("{}\n\n- a\n- b\n", "x\n".repeat(13));
    assert_eq!(paragraphs(&sample), [(1, 13), (16, 1), (17, 1)]);
}
