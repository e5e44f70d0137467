//! `shardwise-balancer`: keeps the `shard` keys of a live Argo CD's cluster Secrets balanced.
//! While it holds its Lease, every `--interval` it reads Argo CD (the installation, cluster
//! Secrets and Applications), decides a pass (`pass::decide`) and writes
//! the keys that change, each on condition of the resourceVersion read and behind the Lease's
//! fence. It reports with the metrics of shardwise's planner, so that the same dashboard rows
//! show it, and says which Argo CD clusters no live controller reconciles.

mod args;
mod balancer;
mod changes;
mod controllers;
mod handover;
mod measured;
mod metrics;
mod pass;
mod replicas;
mod scrape;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // clap prints its whole error and exits with code 2; help and the version go to stdout.
    let args = args::BalanceArgs::parse();
    match balancer::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "shardwise-balancer: {e:#}");
            // 2 for settings that cannot work together, as clap's own refusals.
            if e.chain().any(|cause| cause.is::<balancer::Refused>()) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
