//! The sharded controller of shardwise, as a library: the binary `shardwise-controller` is a
//! thin wrapper around [`run`].
//!
//! It is a user of [`shardwise_runtime`]: FleetClusters are the units the runtime places on
//! shards, FleetApps the items that follow them. This crate holds only what is Fleet's own:
//! probing clusters, applying and pruning apps, tenancy, credentials, and their status. See
//! `docs/architecture.md`.

#![deny(missing_docs)]

pub mod config;
pub mod credentials;
mod destination;
mod drift;
mod fleet;
mod health;
mod live;
mod manifest;
mod tenancy;

use anyhow::Context;

use crate::config::Config;
use crate::fleet::{FleetController, FleetMetrics};

/// Runs one replica until SIGTERM or SIGINT, then hands its work over and returns.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let settings = config.settings()?;
    let http = config.replica.http_settings()?;
    let controller = FleetController {
        settings: config.fleet(),
        metrics: FleetMetrics::default(),
    };
    shardwise_runtime::run(controller, settings, http)
        .await
        .context("replica")
}
