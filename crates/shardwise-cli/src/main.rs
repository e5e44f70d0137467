//! `shardwise`: the command-line tool of shardwise.

mod cli;
mod commands;
mod fleet;
mod output;
mod planning;
mod plot;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            // Help and version go to stdout with success, as clap does.
            let _ = e.print();
            return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
        Err(e) => return fail(&first_line(&e.to_string())),
    };
    let result = match cli.command {
        Command::Simulate(args) => commands::simulate::run(&args),
        Command::Assign(args) => commands::assign::run(&args),
        Command::Plan(args) => commands::plan::run(&args),
        Command::Crds => commands::crds::run(),
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
        Err(e) => fail(&format!("{e:#}")),
    }
}

/// Bad input gets one clear line on stderr and exit code 2.
fn fail(message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "shardwise: {message}");
    ExitCode::from(2)
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or(text);
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}
