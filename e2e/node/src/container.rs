//! Running containers: each started by `shardwise-container-init` from one long-lived thread
//! (the parent-death signal a container gets follows the thread that forked it, so a pool
//! thread that ends would take its containers along), watched by a thread that reaps it, and
//! stopped as the kubelet stops one: SIGTERM to the main process, SIGKILL to its whole group
//! once the grace period is over.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;

use crate::launch::Launch;

/// How a container ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The exit code as the kubelet reports it: the process's own, or 128 + the signal that
    /// killed it (137 for SIGKILL, 143 for SIGTERM).
    pub code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

impl Exit {
    fn of(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Self { code, signal: None },
            (None, Some(signal)) => Self {
                code: 128 + signal,
                signal: Some(signal),
            },
            (None, None) => Self {
                code: 255,
                signal: None,
            },
        }
    }
}

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Starts containers from its own thread, which lives as long as a handle does.
#[derive(Clone, Debug)]
pub struct Launcher {
    init: PathBuf,
    requests: mpsc::Sender<Request>,
}

impl Launcher {
    /// A launcher that runs `init` (the `shardwise-container-init` binary).
    pub fn new(init: &Path) -> std::io::Result<Self> {
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("container-launcher".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Self {
            init: init.to_path_buf(),
            requests,
        })
    }

    /// Starts `launch`, its description written to `spec` and its stdout and stderr appended
    /// to `log`.
    pub fn start(&self, launch: &Launch, spec: &Path, log: &Path) -> std::io::Result<Running> {
        let json = serde_json::to_vec(launch).map_err(std::io::Error::other)?;
        std::fs::write(spec, json)?;
        let out = File::options().create(true).append(true).open(log)?;
        let mut command = Command::new(&self.init);
        command
            .arg(spec)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let (reply, answer) = mpsc::channel();
        let gone = || std::io::Error::other("the launcher thread has ended");
        self.requests.send((command, reply)).map_err(|_| gone())?;
        let mut child = answer.recv().map_err(|_| gone())??;
        let pid = child.id();
        let (exited, exit) = watch::channel(None);
        std::thread::Builder::new()
            .name(format!("container-{pid}"))
            .spawn(move || {
                let status = child.wait().map(Exit::of).unwrap_or(Exit {
                    code: 255,
                    signal: None,
                });
                // Whatever else the container started goes with it, as with a PID namespace.
                let _ = killpg(Pid::from_raw(pid_i32(pid)), Signal::SIGKILL);
                let _ = exited.send(Some(status));
            })?;
        Ok(Running { pid, exit })
    }
}

fn pid_i32(pid: u32) -> i32 {
    i32::try_from(pid).unwrap_or(i32::MAX)
}

/// A started container.
#[derive(Debug)]
pub struct Running {
    pid: u32,
    exit: watch::Receiver<Option<Exit>>,
}

impl Running {
    /// The main process's ID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How it ended, once it has.
    pub fn exited(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Waits until it ends.
    pub async fn wait(&mut self) -> Exit {
        loop {
            if let Some(exit) = *self.exit.borrow_and_update() {
                return exit;
            }
            if self.exit.changed().await.is_err() {
                return self.exited().unwrap_or(Exit {
                    code: 255,
                    signal: None,
                });
            }
        }
    }

    /// Stops it as the kubelet does: SIGTERM, then after `grace` SIGKILL to its whole group.
    pub async fn stop(&mut self, grace: Duration) -> Exit {
        if let Some(exit) = self.exited() {
            return exit;
        }
        let pid = Pid::from_raw(pid_i32(self.pid));
        let _ = kill(pid, Signal::SIGTERM);
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(exit) => exit,
            Err(_) => {
                let _ = killpg(pid, Signal::SIGKILL);
                self.wait().await
            }
        }
    }

    /// Kills its whole group at once (SIGKILL), as when a node loses a container.
    pub async fn kill(&mut self) -> Exit {
        if self.exited().is_none() {
            let _ = killpg(Pid::from_raw(pid_i32(self.pid)), Signal::SIGKILL);
        }
        self.wait().await
    }
}
