//! `shardwise completions SHELL`: a completion script for the shell.

use std::io::Write;

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

pub(crate) fn run(shell: Shell) -> Result<()> {
    // Generated in memory: clap_complete panics on a write error, and a reader that stops
    // early (`| head`) is no error of ours.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "shardwise", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(())
}
