//! `shardwise-controller`: one replica of the sharded controller (see the library's docs).

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use shardwise_controller::config::Config;
use tracing::error;

fn main() -> ExitCode {
    let config = match Config::try_parse() {
        Ok(config) => config,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.to_string();
            let line = text.lines().next().unwrap_or(&text);
            eprintln!(
                "shardwise-controller: {}",
                line.strip_prefix("error: ").unwrap_or(line)
            );
            return ExitCode::from(2);
        }
    };
    config.replica.init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(shardwise_controller::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
