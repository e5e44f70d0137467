//! Launching and killing processes with their output captured to files.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Why starting, signalling or waiting for a process failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A log file could not be opened or written.
    #[error("cannot open log file {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be started (e.g. it does not exist).
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A signal could not be sent.
    #[error("cannot signal {name} (pid {pid}): {source}")]
    Signal {
        /// The process's name.
        name: String,
        /// Its process ID.
        pid: u32,
        /// What `kill(2)` reported.
        #[source]
        source: nix::Error,
    },
    /// The process's exit status could not be read.
    #[error("cannot wait for {name}: {source}")]
    Wait {
        /// The process's name.
        name: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The process did not exit in time.
    #[error("{name} did not exit within {timeout:?}\n{report}")]
    StillRunning {
        /// The process's name.
        name: String,
        /// How long the harness waited.
        timeout: Duration,
        /// [`Process::report`]: its state and last lines of output.
        report: String,
    },
}

/// What to run: a program with arguments and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    current_dir: Option<PathBuf>,
}

impl ProcessSpec {
    /// `name` labels log files and failure messages (e.g. `shardwise-2`).
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            current_dir: None,
        }
    }

    /// Appends an argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Sets an environment variable, on top of the ones the test process has.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Runs it in `dir` instead of the test process's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }
}

/// A running (or exited) process. Dropping it kills the process if it still runs.
#[derive(Debug)]
pub struct Process {
    name: String,
    pid: u32,
    child: tokio::process::Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

fn open_log(path: &Path, header: &str) -> Result<File, ProcessError> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| ProcessError::Log {
            path: path.to_path_buf(),
            source,
        })?;
    // Restarts of the same name append to the same files; the header separates runs.
    writeln!(f, "==== {header} ====").map_err(|source| ProcessError::Log {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(f)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Process {
    /// Starts `spec`, appending its stdout and stderr to `<log_dir>/<name>.stdout.log` and
    /// `<log_dir>/<name>.stderr.log`. Must be called within a tokio runtime.
    pub fn spawn(spec: &ProcessSpec, log_dir: &Path) -> Result<Self, ProcessError> {
        let stdout = log_dir.join(format!("{}.stdout.log", spec.name));
        let stderr = log_dir.join(format!("{}.stderr.log", spec.name));
        let header = format!("{} {:?}", spec.program.display(), spec.args);
        let mut cmd = tokio::process::Command::new(&spec.program);
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(open_log(&stdout, &header)?))
            .stderr(Stdio::from(open_log(&stderr, &header)?))
            .kill_on_drop(true);
        if let Some(dir) = &spec.current_dir {
            cmd.current_dir(dir);
        }
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            program: spec.program.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or_default();
        tracing::info!(name = %spec.name, pid, "process started");
        Ok(Self {
            name: spec.name.clone(),
            pid,
            child,
            stdout,
            stderr,
            status: None,
        })
    }

    /// Its process ID (0 if the OS did not report one).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file its stdout goes to.
    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    /// The file its stderr goes to.
    pub fn stderr_path(&self) -> &Path {
        &self.stderr
    }

    fn signal(&self, signal: Signal) -> Result<(), ProcessError> {
        let pid = i32::try_from(self.pid).unwrap_or(i32::MAX);
        match kill(Pid::from_raw(pid), signal) {
            // Already gone (and maybe reaped): nothing left to signal.
            Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
            Err(source) => Err(ProcessError::Signal {
                name: self.name.clone(),
                pid: self.pid,
                source,
            }),
        }
    }

    /// Sends SIGTERM (a graceful stop request).
    pub fn terminate(&mut self) -> Result<(), ProcessError> {
        if self.try_status()?.is_some() {
            return Ok(());
        }
        self.signal(Signal::SIGTERM)
    }

    /// Sends SIGSTOP: the process freezes where it is, as in a long GC pause, CPU throttling or
    /// a VM live migration.
    pub fn pause(&mut self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGSTOP)
    }

    /// Sends SIGCONT: a paused process carries on from where it was.
    pub fn resume(&mut self) -> Result<(), ProcessError> {
        self.signal(Signal::SIGCONT)
    }

    /// Sends SIGKILL (a crash).
    pub fn kill(&mut self) -> Result<(), ProcessError> {
        if self.try_status()?.is_some() {
            return Ok(());
        }
        self.signal(Signal::SIGKILL)
    }

    /// The exit status if the process has exited.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>, ProcessError> {
        if self.status.is_none() {
            self.status = self.child.try_wait().map_err(|source| ProcessError::Wait {
                name: self.name.clone(),
                source,
            })?;
        }
        Ok(self.status)
    }

    /// Whether it has not exited yet (false too when the status cannot be read).
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_status(), Ok(None))
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, ProcessError> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(s)) => {
                self.status = Some(s);
                Ok(s)
            }
            Ok(Err(source)) => Err(ProcessError::Wait {
                name: self.name.clone(),
                source,
            }),
            Err(_) => Err(ProcessError::StillRunning {
                name: self.name.clone(),
                timeout,
                report: self.report(),
            }),
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus, ProcessError> {
        self.terminate()?;
        match self.wait(grace).await {
            Err(ProcessError::StillRunning { .. }) => {
                self.kill()?;
                self.wait(Duration::from_secs(10)).await
            }
            other => other,
        }
    }

    /// Everything written to stdout so far (across restarts under the same name).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Everything written to stderr so far (across restarts under the same name).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// State and the last lines of output, for failure messages.
    pub fn report(&self) -> String {
        let state = match self.status {
            Some(s) => format!("exited ({s})"),
            None => "running".to_string(),
        };
        format!(
            "process {} (pid {}) {state}\n--- stdout ({}) ---\n{}\n--- stderr ({}) ---\n{}",
            self.name,
            self.pid,
            self.stdout.display(),
            tail(&self.stdout, 40),
            self.stderr.display(),
            tail(&self.stderr, 40)
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.try_status(), Ok(None)) {
            let _ = self.signal(Signal::SIGKILL);
        }
    }
}
