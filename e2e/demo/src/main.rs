//! `shardwise-demo`: see the crate docs. `make demo` builds the controller and runs this.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use shardwise_demo::{Demo, DemoError, Options};

/// A shardwise fleet on an embedded control plane: 3 controller replicas scaled to 4, then 2,
/// one of them killed, shown live; ends with a checked summary.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Leave the fleet running after the summary, with a kubeconfig to explore it; Ctrl-C ends it.
    #[arg(long)]
    keep: bool,
    /// FleetClusters in the fleet.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(4..=200))]
    clusters: u32,
    /// Healthy FleetApps (three broken ones come on top).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(10..=20_000))]
    apps: u32,
    /// The controller binary (default: `shardwise-controller` beside this program).
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Seconds each step may take to settle.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("shardwise-demo: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, DemoError> {
    let controller = match args.controller {
        Some(path) => path,
        None => std::env::current_exe()
            .map_err(DemoError::Output)?
            .with_file_name("shardwise-controller"),
    };
    let mut stdout = std::io::stdout();
    let options = Options {
        clusters: args.clusters,
        apps: args.apps,
        redraw: stdout.is_terminal(),
        settle_timeout: Duration::from_secs(args.timeout),
        ..Options::new(controller)
    };
    eprintln!(
        "starting an embedded control plane, 2 destination clusters, {} clusters, {} apps and 3 replicas...",
        options.clusters, options.apps
    );
    let mut demo = Demo::start(options).await?;
    let summary = demo.play(&mut stdout).await?;
    if args.keep {
        let dir = demo.keep().to_path_buf();
        let kubeconfig = demo.kubeconfig()?;
        let note = format!(
            "\nThe fleet keeps running. In another terminal:\n\n  export KUBECONFIG={}\n  kubectl get fleetclusters,unitslices -n shardwise\n  kubectl get fleetapps -n shardwise -l shardwise.io/shard=0\n  kubectl get leases -n shardwise\n\nReplica logs: {}\nCtrl-C stops everything.\n",
            kubeconfig.display(),
            dir.display()
        );
        demo.watch(
            &note,
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
            &mut stdout,
        )
        .await?;
    }
    demo.shutdown().await?;
    Ok(summary.passed())
}
