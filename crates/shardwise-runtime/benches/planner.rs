//! The planner at 200,000 apps, with nothing else running: the index of a fleet of 2,000
//! clusters (a few busy, a long tail) over 12 shards as the planner keeps it (apps' metadata
//! only), and one pass (its views and its decision, writes not made) on a settled fleet and on a
//! cold one (no cluster placed, no app with a token). Targets: a pass under 1 s, memory under
//! 1 GiB. Memory is this process's resident size (VmRSS, VmHWM for the peak) before and after
//! the index is built, and after the passes.
//!
//! `cargo bench -p shardwise-runtime --features bench --bench planner` (`make bench-planner`).
//! Prints Markdown for docs/benchmarks.md; exits 1 when a target is missed.

use std::process::ExitCode;
use std::time::Duration;

use shardwise_runtime::planner_bench::{Fleet, Pass};

const APPS: u32 = 200_000;
const CLUSTERS: u32 = 2_000;
const SHARDS: u32 = 12;
/// Passes timed of each fleet; the slowest is reported.
const PASSES: usize = 5;

/// A field of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// The slowest of `PASSES` passes, and the last one's figures.
fn timed(fleet: &Fleet) -> (Duration, Pass) {
    let passes: Vec<Pass> = (0..PASSES).map(|_| fleet.pass()).collect();
    let slowest = passes.iter().map(|p| p.took).max().unwrap_or_default();
    (slowest, passes[passes.len() - 1])
}

fn main() -> ExitCode {
    let before = status_bytes("VmRSS");
    let settled = Fleet::new(CLUSTERS, APPS, SHARDS, true);
    let indexed = status_bytes("VmRSS");
    let (settled_took, settled_pass) = timed(&settled);
    let items = settled.items();
    drop(settled);
    let cold = Fleet::new(CLUSTERS, APPS, SHARDS, false);
    let (cold_took, cold_pass) = timed(&cold);
    let peak = status_bytes("VmHWM");
    let index_bytes = indexed.saturating_sub(before);

    println!(
        "\n### The planner at {items} apps ({CLUSTERS} clusters, {SHARDS} shards; index and pass only)\n"
    );
    println!("| measure | figure | target |");
    println!("|---|---:|---:|");
    println!(
        "| a pass, settled fleet (slowest of {PASSES}): records / apps to write | **{:.3} s**: {} / {} | < 1 s |",
        settled_took.as_secs_f64(),
        settled_pass.record_writes,
        settled_pass.item_writes
    );
    println!(
        "| a pass, cold start (slowest of {PASSES}): records / apps to write, max/mean after, clusters cut | **{:.3} s**: {} / {}, {:.3}, {} | < 1 s |",
        cold_took.as_secs_f64(),
        cold_pass.record_writes,
        cold_pass.item_writes,
        cold_pass.balance,
        cold_pass.cut_units
    );
    println!(
        "| the index (resident size it added) | {:.1} MiB, {:.0} bytes per app | |",
        mib(index_bytes),
        index_bytes as f64 / f64::from(APPS)
    );
    println!(
        "| peak resident size of the process | **{:.1} MiB** | < 1,024 MiB |",
        mib(peak)
    );

    let mut failures = Vec::new();
    for (what, took) in [("settled", settled_took), ("cold", cold_took)] {
        if took >= Duration::from_secs(1) {
            failures.push(format!(
                "a {what} pass took {:.3} s >= 1 s",
                took.as_secs_f64()
            ));
        }
    }
    if peak >= 1 << 30 {
        failures.push(format!("peak resident size {:.1} MiB >= 1 GiB", mib(peak)));
    }
    if settled_pass.record_writes != 0 || settled_pass.item_writes != 0 {
        failures.push(format!(
            "a settled fleet's pass writes {} records and {} apps",
            settled_pass.record_writes, settled_pass.item_writes
        ));
    }
    if cold_pass.item_writes != items {
        failures.push(format!(
            "a cold pass labels {} apps of {items}",
            cold_pass.item_writes
        ));
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("target missed: {f}");
        }
        ExitCode::FAILURE
    }
}
