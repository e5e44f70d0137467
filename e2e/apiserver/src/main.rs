//! `shardwise-test-apiserver`: run the test API server by hand.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use shardwise_test_apiserver::{ApiServer, Identity, ServerConfig};

/// An in-memory Kubernetes API server for tests (a test fixture, not a product).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Port to listen on (127.0.0.1); 0 picks a free port and prints it.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write the kubeconfig (one context per identity; the admin is current).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Cluster name used in the kubeconfig.
    #[arg(long, default_value = "shardwise-test")]
    name: String,
    /// Enforce RBAC for every identity outside system:masters.
    #[arg(long, env = "SHARDWISE_TEST_APISERVER_RBAC")]
    rbac: bool,
    /// Extra identity, NAME=USER (e.g. shardwise-0=system:serviceaccount:shardwise:shardwise).
    /// Service-account users get their implied groups.
    #[arg(long = "identity", value_name = "NAME=USER")]
    identities: Vec<String>,
    /// Extra groups for an identity, NAME=GROUP[,GROUP...] (system:masters makes it an admin).
    #[arg(long = "groups", value_name = "NAME=GROUPS")]
    groups: Vec<String>,
    /// A fixed token for an identity, NAME=TOKEN (random otherwise).
    #[arg(long = "token", value_name = "NAME=TOKEN")]
    tokens: Vec<String>,
    /// Name of the admin identity.
    #[arg(long, default_value = "admin")]
    admin: String,
    /// Events kept per resource for watch resumption (older versions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,
    /// Serve plain HTTP instead of HTTPS (kubectl then sends no credentials: every request
    /// it makes is answered 401).
    #[arg(long)]
    plain_http: bool,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_seconds: u64,
}

fn split_pair<'a>(flag: &str, s: &'a str) -> anyhow::Result<(&'a str, &'a str)> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k, v)),
        _ => bail!("--{flag} expects NAME=VALUE, got {s:?}"),
    }
}

fn config(args: &Args) -> anyhow::Result<ServerConfig> {
    let mut identities = vec![Identity::admin(args.admin.clone())];
    for spec in &args.identities {
        let (name, user) = split_pair("identity", spec)?;
        identities.retain(|i| i.name != name);
        identities.push(Identity::new(name, user));
    }
    for spec in &args.groups {
        let (name, groups) = split_pair("groups", spec)?;
        let Some(i) = identities.iter_mut().find(|i| i.name == name) else {
            bail!("--groups names unknown identity {name:?}");
        };
        *i = i
            .clone()
            .with_groups(groups.split(',').filter(|g| !g.is_empty()));
    }
    for spec in &args.tokens {
        let (name, token) = split_pair("token", spec)?;
        let Some(i) = identities.iter_mut().find(|i| i.name == name) else {
            bail!("--token names unknown identity {name:?}");
        };
        *i = i.clone().with_token(token);
    }
    let mut config = ServerConfig::named(args.name.clone())
        .port(args.port)
        .rbac(args.rbac)
        .watch_history(args.watch_history)
        .tls(!args.plain_http)
        .bookmark_interval(std::time::Duration::from_secs(args.bookmark_seconds.max(1)));
    config.identities = identities;
    Ok(config)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = ApiServer::start(config(&args)?).await?;
    server
        .write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("cannot write {}", args.kubeconfig.display()))?;
    println!(
        "listening on {} (port {})",
        server.url(),
        server.addr().port()
    );
    println!("kubeconfig written to {}", args.kubeconfig.display());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    server.shutdown();
    Ok(())
}
