//! Starts one container, as a container runtime's init does (runc's `init`): reads a
//! [`Launch`] (JSON, the file named by its only argument), enters the pod's network namespace,
//! takes mount and UTS namespaces of its own, mounts the volumes at their paths over a private
//! `/run`, becomes the container's user, and executes the program in its own place. Run by the
//! node agent as root; its own session, so that the agent signals the whole container.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, execve, getppid, setgid, setgroups, sethostname, setsid, setuid};
use shardwise_e2e_node::{Launch, Mount};

/// Why the container could not start; printed to the container's log, exit code 127 as a
/// shell's for a command it cannot run.
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("usage: shardwise-container-init <launch.json>")]
    Usage,
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Parse(PathBuf, serde_json::Error),
    #[error("{step}: {source}")]
    Step {
        step: String,
        #[source]
        source: nix::Error,
    },
    #[error("{0}: {1}")]
    Path(PathBuf, std::io::Error),
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
    #[error("the node agent is gone")]
    Orphaned,
}

fn step(step: impl Into<String>) -> impl FnOnce(nix::Error) -> InitError {
    let step = step.into();
    move |source| InitError::Step { step, source }
}

fn c_string(text: impl AsRef<OsStr>) -> Result<CString, InitError> {
    let bytes = text.as_ref().as_bytes();
    CString::new(bytes).map_err(|_| InitError::Nul(String::from_utf8_lossy(bytes).into_owned()))
}

fn main() {
    let error = match run() {
        Ok(never) => match never {},
        Err(error) => error,
    };
    eprintln!("shardwise-container-init: {error}");
    std::process::exit(127);
}

fn run() -> Result<std::convert::Infallible, InitError> {
    let mut args = std::env::args_os().skip(1);
    let (Some(path), None) = (args.next(), args.next()) else {
        return Err(InitError::Usage);
    };
    let path = PathBuf::from(path);
    let text = std::fs::read(&path).map_err(|e| InitError::Read(path.clone(), e))?;
    let launch: Launch =
        serde_json::from_slice(&text).map_err(|e| InitError::Parse(path.clone(), e))?;
    let agent = getppid();

    setsid().map_err(step("setsid"))?;
    if let Some(netns) = &launch.network_namespace {
        let file = File::open(netns).map_err(|e| InitError::Path(netns.clone(), e))?;
        setns(&file, CloneFlags::CLONE_NEWNET)
            .map_err(step(format!("setns {}", netns.display())))?;
    }
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS).map_err(step("unshare"))?;
    // Nothing mounted here reaches the host's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(step("make / private"))?;
    // A `/run` of its own, where `/var/run/secrets/...` can be made without touching the host.
    mount(
        Some("tmpfs"),
        "/run",
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=755"),
    )
    .map_err(step("mount tmpfs on /run"))?;
    for m in &launch.mounts {
        bind(m)?;
    }
    if launch.read_only_root {
        remount_read_only(Path::new("/"))?;
    }
    sethostname(&launch.hostname).map_err(step("sethostname"))?;

    let groups: Vec<Gid> = launch
        .user
        .groups
        .iter()
        .map(|&g| Gid::from_raw(g))
        .collect();
    setgroups(&groups).map_err(step("setgroups"))?;
    setgid(Gid::from_raw(launch.user.gid)).map_err(step("setgid"))?;
    setuid(Uid::from_raw(launch.user.uid)).map_err(step("setuid"))?;
    // After the user change, which clears it: the container dies with the agent.
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(step("set the parent-death signal"))?;
    if getppid() != agent {
        return Err(InitError::Orphaned);
    }
    if launch.no_new_privs {
        prctl::set_no_new_privs().map_err(step("no_new_privs"))?;
    }
    std::env::set_current_dir(&launch.working_dir)
        .map_err(|e| InitError::Path(launch.working_dir.clone(), e))?;

    let program = c_string(&launch.program)?;
    let argv = launch
        .argv
        .iter()
        .map(c_string)
        .collect::<Result<Vec<_>, _>>()?;
    let env = launch
        .env
        .iter()
        .map(|(name, value)| c_string(format!("{name}={value}")))
        .collect::<Result<Vec<_>, _>>()?;
    execve(&program, &argv, &env).map_err(step(format!("execute {}", launch.program.display())))
}

/// `/run/...` (or `/var/run/...`, its link here): the mount point is made in the private
/// `/run`; any other must exist (the agent makes missing ones and removes them afterwards).
fn under_run(target: &Path) -> Option<PathBuf> {
    let rest = target
        .strip_prefix("/run")
        .or_else(|_| target.strip_prefix("/var/run"))
        .ok()?;
    rest.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| Path::new("/run").join(rest))
}

fn bind(m: &Mount) -> Result<(), InitError> {
    let target = match under_run(&m.target) {
        Some(target) => {
            if m.source.is_dir() {
                std::fs::create_dir_all(&target).map_err(|e| InitError::Path(target.clone(), e))?;
            } else {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| InitError::Path(parent.to_path_buf(), e))?;
                }
                File::create(&target).map_err(|e| InitError::Path(target.clone(), e))?;
            }
            target
        }
        None => m.target.clone(),
    };
    mount(
        Some(&m.source),
        &target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(step(format!(
        "bind {} on {}",
        m.source.display(),
        target.display()
    )))?;
    if m.read_only {
        remount_read_only(&target)?;
    }
    Ok(())
}

fn remount_read_only(target: &Path) -> Result<(), InitError> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .map_err(step(format!("remount {} read-only", target.display())))
}
