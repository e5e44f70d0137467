//! `shardwise crds`: shardwise's own CRDs and the runtime's UnitSlice.

use std::io::Write;

use anyhow::{Context, Result};
use kube::CustomResourceExt;
use shardwise_wire::slice::UnitSlice;

pub(crate) fn run() -> Result<()> {
    let mut crds = shardwise_api::crds();
    crds.push(UnitSlice::crd());
    let yaml = shardwise_api::crds_yaml(&crds).context("cannot render the CRDs")?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(yaml.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
