//! `shardwise-demo`: see the crate docs. `make demo` builds the controller and runs this.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
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
    /// Run on a real cluster of local processes (kube-apiserver, etcd, kube-controller-manager,
    /// kube-scheduler, built by `make control-plane`, and a node agent that runs pods as
    /// processes), with the chart installed by Helm, instead of the embedded test server, which
    /// starts in a second.
    #[arg(long)]
    real: bool,
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
    /// The Prometheus that scrapes the replicas (default: `prometheus` on PATH, or
    /// $PROMETHEUS; without one, no dashboard picture).
    #[arg(long)]
    prometheus: Option<PathBuf>,
    /// Where to draw the dashboard picture from Prometheus's data (default:
    /// target/demo-dashboard.png in the repository).
    #[arg(long)]
    picture: Option<PathBuf>,
}

/// `target/demo-dashboard.png` of the repository this demo was built in.
fn default_picture() -> PathBuf {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    target
        .canonicalize()
        .unwrap_or(target)
        .join("demo-dashboard.png")
}

/// `$PROMETHEUS`, or the first `prometheus` on `PATH`.
fn find_prometheus() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMETHEUS") {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("prometheus"))
        .find(|path| path.is_file())
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
        prometheus: args.prometheus.or_else(find_prometheus),
        picture: Some(args.picture.unwrap_or_else(default_picture)),
        real: args.real,
        ..Options::new(controller)
    };
    if options.prometheus.is_none() {
        eprintln!("no Prometheus on PATH: no dashboard picture (apt-get install prometheus)");
    }
    eprintln!(
        "starting {}, 2 destination clusters, {} clusters, {} apps and 3 replicas...",
        if options.real {
            "a cluster of local processes with the chart installed by Helm"
        } else {
            "an embedded control plane"
        },
        options.clusters,
        options.apps
    );
    // Ctrl-C while the fleet starts drops what has started: its processes stop and its
    // folder goes with them.
    let mut demo = tokio::select! {
        demo = Demo::start(options) => demo?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted while starting: stopping what started and removing its folder");
            return Ok(false);
        }
    };
    // Ctrl-C mid-play stops the fleet and removes its folder too.
    let summary = tokio::select! {
        summary = demo.play(&mut stdout) => summary?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: stopping the replicas and removing {}", demo.dir().display());
            demo.shutdown().await?;
            return Ok(false);
        }
    };
    if args.keep {
        let dir = demo.dir().to_path_buf();
        let kubeconfig = demo.kubeconfig()?;
        let note = format!(
            "\nThe fleet keeps running. In another terminal:\n\n  export KUBECONFIG={}\n  kubectl get fleetclusters,unitslices -n shardwise\n  kubectl get fleetapps -n shardwise\n  kubectl get leases -n shardwise -o custom-columns=NAME:.metadata.name,HOLDER:.spec.holderIdentity\n{}\nReplica logs: {}\nCtrl-C stops everything and removes that folder.\n",
            kubeconfig.display(),
            demo.prometheus()
                .map_or_else(String::new, |address| format!(
                    "\nPrometheus: http://{address}/graph?g0.expr=shardwise_owned_items\n"
                )),
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
