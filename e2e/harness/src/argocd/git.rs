//! A Git repository the test writes, served read-only by `git daemon` on loopback: the source
//! Argo CD's repo server fetches, as it would fetch a remote.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Environment, HarnessError, Process, ProcessSpec, free_port};

/// The repository's name in its URL.
const REPOSITORY: &str = "fleet";

/// A repository under the environment's directory and the daemon serving it.
#[derive(Debug)]
pub struct GitServer {
    worktree: PathBuf,
    port: u16,
    daemon: Process,
}

impl GitServer {
    /// Creates an empty repository (branch `main`) and starts `git daemon` for it.
    pub fn start(env: &Environment) -> Result<Self, HarnessError> {
        let base = env.dir().join("git");
        let worktree = base.join(REPOSITORY);
        std::fs::create_dir_all(&worktree).map_err(|source| HarnessError::Io {
            path: worktree.clone(),
            source,
        })?;
        git(&worktree, &["init", "--quiet", "--initial-branch=main"])?;
        let port = free_port()?;
        let daemon = env.spawn(
            &ProcessSpec::new("git-daemon", "git")
                .arg("daemon")
                .arg("--export-all")
                .arg("--reuseaddr")
                .arg("--listen=127.0.0.1")
                .arg(format!("--port={port}"))
                .arg(format!("--base-path={}", base.display()))
                .arg(&base),
        )?;
        Ok(Self {
            worktree,
            port,
            daemon,
        })
    }

    /// The URL Argo CD's Applications give as `repoURL`.
    pub fn url(&self) -> String {
        format!("git://127.0.0.1:{}/{REPOSITORY}", self.port)
    }

    /// Writes `files` (paths relative to the repository's root, and their contents) and commits
    /// them on `main`.
    pub fn commit(&self, files: &[(String, String)], message: &str) -> Result<(), HarnessError> {
        for (path, contents) in files {
            let path = self.worktree.join(path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|source| HarnessError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            std::fs::write(&path, contents).map_err(|source| HarnessError::Io {
                path: path.clone(),
                source,
            })?;
        }
        git(&self.worktree, &["add", "--all"])?;
        git(
            &self.worktree,
            &[
                "-c",
                "user.name=shardwise-e2e",
                "-c",
                "user.email=e2e@shardwise.invalid",
                "commit",
                "--quiet",
                "--allow-empty",
                "-m",
                message,
            ],
        )
    }

    /// The daemon, for failure reports.
    pub fn daemon(&self) -> &Process {
        &self.daemon
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<(), HarnessError> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|source| HarnessError::Io {
            path: PathBuf::from("git"),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::other(format!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        })
    }
}
