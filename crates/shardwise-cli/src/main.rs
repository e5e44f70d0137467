//! `shardwise`: the command-line tool of shardwise.

mod cli;
mod commands;
mod inventory;
mod limits;
mod output;
mod plot;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::limits::Usage;

fn main() -> ExitCode {
    // clap prints its whole error (what is missing, the closest valid name, the accepted values)
    // and exits with code 2; help and the version go to stdout with success.
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Simulate(args) => commands::simulate::run(&args),
        Command::Assign(args) => commands::assign::run(&args),
        Command::Plan(args) if args.apply => commands::apply::run(&args),
        Command::Plan(args) => commands::plan::run(&args),
        Command::Crds => commands::crds::run(),
        Command::Completions { shell } => commands::completions::run(shell),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped early (`| head`) is not an error of ours.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "shardwise: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// 2 for a command line that cannot run as given, as clap's own refusals; 1 for a failure
/// while running (a file that cannot be read, an API server that cannot be reached).
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<Usage>()) {
        2
    } else {
        1
    }
}
