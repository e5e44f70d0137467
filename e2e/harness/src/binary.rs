//! Binaries of this workspace, built from the current source for the test that runs them.
//!
//! Cargo tells a test where its own package's binaries are (`CARGO_BIN_EXE_*`), and builds
//! them first, but no other package's: a suite that runs the controller from a package of its
//! own asks Cargo for it here, so it never runs a stale build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use parking_lot::Mutex;

/// The variable that names a `shardwise-controller` to run instead of the one
/// [`controller_binary`] builds (a release, a coverage or sanitizer build, a machine without
/// Cargo).
pub const CONTROLLER_BIN_VAR: &str = "SHARDWISE_CONTROLLER_BIN";

/// Cargo features the shardwise binaries [`workspace_binary`] builds are built with (not the
/// harness's own), as `--features` takes them: `shardwise-runtime/failpoints` for the defect
/// matrix; unset or empty, none.
pub const BUILD_FEATURES_VAR: &str = "SHARDWISE_BUILD_FEATURES";

/// Why a binary of the workspace could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Cargo could not be started.
    #[error("cannot run `{command}`: {reason}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it did not start.
        reason: String,
    },
    /// Cargo ran and failed.
    #[error("`{command}` failed ({status}):\n{stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How Cargo exited.
        status: String,
        /// What Cargo printed there, the compiler's errors included.
        stderr: String,
    },
    /// Cargo succeeded but named no executable for the binary.
    #[error("`{command}` reported no executable for binary {bin}")]
    NoExecutable {
        /// The command line.
        command: String,
        /// The binary asked for.
        bin: String,
    },
    /// [`CONTROLLER_BIN_VAR`] names something that is not a file.
    #[error("{CONTROLLER_BIN_VAR}={0:?} is not a file")]
    NotAFile(PathBuf),
}

/// The `shardwise-controller` the suites run: the file `$SHARDWISE_CONTROLLER_BIN` names when
/// it is set, else the workspace's, built now by [`workspace_binary`].
pub fn controller_binary() -> Result<PathBuf, BuildError> {
    match std::env::var_os(CONTROLLER_BIN_VAR) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            if path.is_file() {
                Ok(path)
            } else {
                Err(BuildError::NotAFile(path))
            }
        }
        _ => workspace_binary("shardwise-controller", "shardwise-controller"),
    }
}

/// Binary `bin` of the workspace's package `package`, built from the current source: runs
/// `$CARGO build --locked -p <package> --bin <bin>` (`cargo` when `$CARGO` is unset), with
/// `--release` when the caller was built without debug assertions (a benchmark), and returns
/// the executable Cargo reports.
///
/// Once per process and binary: later calls return the first answer, an error included, and
/// concurrent callers wait for it. Cargo chooses the target directory as for any build
/// (`CARGO_TARGET_DIR`, its configuration), and nothing is rebuilt when the test's own build
/// left the binary up to date. A test run by `cargo test` may build here: Cargo releases the
/// build directory's lock before it runs the tests.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf, BuildError> {
    // Features for the binaries that run shardwise-runtime (scripts/defects.sh builds them
    // with seeded defects), not for the others (the CLI, the node's container init), which
    // Cargo would refuse them for.
    let features = match std::env::var(BUILD_FEATURES_VAR) {
        Ok(features) if runs_the_runtime(package) => features,
        _ => String::new(),
    };
    workspace_binary_with_features(package, bin, &features)
}

/// Whether the workspace's package `package` depends on shardwise-runtime, from its manifest
/// (a member of `crates/`, `examples/` or `e2e/` whose `name` it is).
fn runs_the_runtime(package: &str) -> bool {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let named = format!("name = \"{package}\"");
    ["crates", "examples", "e2e"]
        .iter()
        .filter_map(|group| std::fs::read_dir(workspace.join(group)).ok())
        .flatten()
        .filter_map(|member| std::fs::read_to_string(member.ok()?.path().join("Cargo.toml")).ok())
        .find(|manifest| manifest.lines().any(|line| line.trim() == named))
        .is_some_and(|manifest| {
            manifest
                .lines()
                .any(|line| line.trim_start().starts_with("shardwise-runtime"))
        })
}

/// [`workspace_binary`] built with `features` (as `--features` takes them; empty: none), e.g.
/// a controller with `shardwise-runtime/failpoints` that a benchmark runs with and without a
/// seeded defect. Built with features, the executable is copied beside Cargo's under a name of
/// its own (`<bin>+<features>`): the next build without them replaces Cargo's.
pub fn workspace_binary_with_features(
    package: &str,
    bin: &str,
    features: &str,
) -> Result<PathBuf, BuildError> {
    type Built = BTreeMap<(String, String, String), Result<PathBuf, BuildError>>;
    static BUILT: Mutex<Built> = Mutex::new(BTreeMap::new());

    // Held through the build: a second caller waits for the first build instead of starting
    // its own.
    let mut built = BUILT.lock();
    built
        .entry((package.to_owned(), bin.to_owned(), features.to_owned()))
        .or_insert_with(|| {
            let executable = build(package, bin, features)?;
            if features.is_empty() {
                return Ok(executable);
            }
            let named: String = features
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let copy = executable.with_file_name(format!("{bin}+{named}"));
            std::fs::copy(&executable, &copy).map_err(|e| BuildError::Spawn {
                command: format!("cp {} {}", executable.display(), copy.display()),
                reason: e.to_string(),
            })?;
            Ok(copy)
        })
        .clone()
}

fn build(package: &str, bin: &str, features: &str) -> Result<PathBuf, BuildError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Rendered diagnostics: a compile error then reaches stderr, which the error carries,
    // instead of being one more JSON message.
    let mut args = vec![
        "build",
        "--locked",
        "--message-format=json-render-diagnostics",
        "-p",
        package,
        "--bin",
        bin,
    ];
    // The test's profile: its own dependencies are then shared with the binary, and a
    // benchmark measures an optimized build.
    if !cfg!(debug_assertions) {
        args.push("--release");
    }
    if !features.is_empty() {
        args.extend(["--features", features]);
    }
    let command = format!("{} {}", cargo.to_string_lossy(), args.join(" "));
    // The harness is e2e/harness of the workspace; Cargo reads the workspace's configuration
    // from where it runs, as it did for the test.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut command_line = Command::new(&cargo);
    command_line.args(&args).current_dir(&workspace);
    // What Cargo sets for the running test (its package's manifest, name and version) must
    // not reach the build: ring's build script reruns when CARGO_MANIFEST_DIR changes, which
    // rebuilt ring, rustls, kube and the binary once per package whose tests start it, and
    // again at the next `cargo build` from a shell.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_the_test) {
            command_line.env_remove(&name);
        }
    }
    let output = command_line.output().map_err(|e| BuildError::Spawn {
        command: command.clone(),
        reason: e.to_string(),
    })?;
    if !output.status.success() {
        return Err(BuildError::Failed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == bin
                && message["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "bin"))
        })
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| BuildError::NoExecutable {
            command,
            bin: bin.to_owned(),
        })
}

/// Variables Cargo sets for a test or benchmark process it runs, and for no build.
fn set_by_cargo_for_the_test(name: &str) -> bool {
    matches!(
        name,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
            | "CARGO_TARGET_TMPDIR"
            | "OUT_DIR"
    ) || name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_EXE_")
}

#[cfg(test)]
mod tests {
    use super::{runs_the_runtime, set_by_cargo_for_the_test};

    /// A seeded defect's feature goes to the runtime's users only: Cargo refuses it for a
    /// package without the dependency (the CLI since it reads UnitSlices from shardwise-wire).
    #[test]
    fn only_the_runtimes_users_get_its_features() {
        for user in [
            "shardwise-controller",
            "shardwise-balancer",
            "namespace-labeller",
            "configmapgen",
        ] {
            assert!(runs_the_runtime(user), "{user}");
        }
        for other in ["shardwise-cli", "shardwise-e2e-node", "no-such-package"] {
            assert!(!runs_the_runtime(other), "{other}");
        }
    }

    #[test]
    fn the_tests_package_variables_are_dropped_and_the_builds_settings_kept() {
        for dropped in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION",
            "CARGO_BIN_EXE_shardwise",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ] {
            assert!(set_by_cargo_for_the_test(dropped), "{dropped} kept");
        }
        for kept in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_BUILD_JOBS",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!set_by_cargo_for_the_test(kept), "{kept} dropped");
        }
    }
}
