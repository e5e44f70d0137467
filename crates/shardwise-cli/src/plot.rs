//! `simulate --plot`: balance against churn for every strategy, each strategy's per-shard
//! load before and after the change and, when clusters are cut, what slicing bought (balance)
//! and what it cost (cache copies).

use std::path::Path;

use crate::limits::Usage;

#[cfg(feature = "plot")]
mod drawing;
#[cfg(feature = "plot")]
pub(crate) use drawing::draw;

/// The kind of picture a `--plot` path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlotFormat {
    Png,
    Svg,
}

impl PlotFormat {
    /// The format of `path` by its extension, once its folder is known to exist: a plot that
    /// could not be written is refused before the simulation, not after.
    pub(crate) fn check(path: &Path) -> Result<Self, Usage> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let format = match extension.as_deref() {
            Some("png") => PlotFormat::Png,
            Some("svg") => PlotFormat::Svg,
            _ => {
                return Err(Usage(format!(
                    "--plot {}: the plot file must end in .png or .svg",
                    path.display()
                )));
            }
        };
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if !folder.is_dir() {
            return Err(Usage(format!(
                "--plot {}: there is no folder {}",
                path.display(),
                folder.display()
            )));
        }
        if path.is_dir() {
            return Err(Usage(format!(
                "--plot {}: that is a folder, not a file",
                path.display()
            )));
        }
        if cfg!(feature = "plot") {
            Ok(format)
        } else {
            Err(Usage(format!(
                "--plot {}: this shardwise was built without plots (the `plot` feature)",
                path.display()
            )))
        }
    }
}
