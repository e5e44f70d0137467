//! `shardwise crds`.

use std::io::Write;

use anyhow::{Context, Result};

pub(crate) fn run() -> Result<()> {
    let yaml = shardwise_api::crds_yaml().context("cannot render the CRDs")?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(yaml.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
