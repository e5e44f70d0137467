//! The control plane's processes: spawned from one thread that lives as long as they may, so
//! that the kernel kills them (a parent-death signal, set by util-linux's `setpriv` before it
//! executes the program) if the test process dies without unwinding, and killed on drop when
//! it does unwind (a test that panics leaves nothing running).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use crate::HarnessError;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns processes from its own thread; the thread ends when the last handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct Spawner {
    requests: mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    pub(crate) fn start() -> Result<Self, HarnessError> {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(|source| HarnessError::Io {
                path: "control-plane-spawner thread".into(),
                source,
            })?;
        Ok(Self { requests })
    }

    /// Starts `program` with `args`, its output appended to `<log_dir>/<name>.log`.
    pub(crate) fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<Supervised, HarnessError> {
        let log = log_dir.join(format!("{name}.log"));
        let io = |source| HarnessError::Io {
            path: log.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io)?;
        writeln!(file, "==== {} {args:?} ====", program.display()).map_err(io)?;
        // The death signal follows the thread that spawned the process, hence the spawner's
        // own thread; setpriv sets it and then executes the program in its place.
        let mut command = Command::new("setpriv");
        command
            .arg("--pdeathsig=KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone().map_err(io)?))
            .stderr(Stdio::from(file));
        let (reply, answer) = mpsc::channel();
        let spawn_error = |reason: String| HarnessError::Io {
            path: program.to_path_buf(),
            source: std::io::Error::other(reason),
        };
        self.requests
            .send((command, reply))
            .map_err(|_| spawn_error("the spawner thread has ended".into()))?;
        let child = answer
            .recv()
            .map_err(|_| spawn_error("the spawner thread has ended".into()))?
            .map_err(|source| HarnessError::Io {
                path: program.to_path_buf(),
                source,
            })?;
        tracing::info!(name, pid = child.id(), "control-plane process started");
        Ok(Supervised {
            name: name.to_string(),
            child,
            log,
        })
    }
}

/// A running control-plane process; killed (and reaped) on drop.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `None` while it runs, else how it ended.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(status.to_string()),
            Err(e) => Some(format!("cannot be waited for: {e}")),
        }
    }

    /// The last `lines` lines of its log, for failure messages.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        format!(
            "--- {} ({}) ---\n{}",
            self.name,
            self.log.display(),
            all[all.len().saturating_sub(lines)..].join("\n")
        )
    }

    /// Kills it and waits until it is gone.
    pub(crate) fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}
