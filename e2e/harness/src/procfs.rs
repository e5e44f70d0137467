//! What `/proc` says about a process the harness started: CPU time and memory, for
//! benchmarks that measure processes rather than code. Read with the procfs crate, which
//! parses the fields and takes the kernel's own tick rate.

use procfs::process::{ProcState, Process};

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// CPU seconds (user and system) process `pid` has used; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Some(stat) = process(pid).and_then(|p| p.stat().ok()) else {
        return 0.0;
    };
    (stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64
}

/// Nanoseconds the threads of process `pid` have run on a CPU, from the scheduler's own
/// accounting (`/proc/<pid>/task/*/schedstat`: exact, where the CPU time above is sampled at
/// each clock tick); `None` once it is gone.
pub fn runtime_nanos(pid: u32) -> Option<u64> {
    let tasks = process(pid)?.tasks().ok()?;
    Some(
        tasks
            .flatten()
            .filter_map(|task| task.schedstat().ok())
            .map(|stat| stat.sum_exec_runtime)
            .sum(),
    )
}

/// Resident memory of process `pid` now (`VmRSS`), in bytes; `None` once it is gone.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    process(pid)?.status().ok()?.vmrss.map(|kib| kib * 1024)
}

/// Peak resident memory of process `pid` (`VmHWM`), in bytes; `None` once it is gone.
pub fn peak_resident_bytes(pid: u32) -> Option<u64> {
    process(pid)?.status().ok()?.vmhwm.map(|kib| kib * 1024)
}

/// Whether every thread of process `pid` is stopped (SIGSTOP delivered to each); false once it
/// is gone. A signal reaches a busy process's threads one by one, and a thread may run on for
/// a moment after `kill` returned.
pub fn stopped(pid: u32) -> bool {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        match task.stat().ok().and_then(|stat| stat.state().ok()) {
            Some(ProcState::Stopped | ProcState::Tracing) => any = true,
            _ => return false,
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        // Work enough to be counted in ticks.
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        assert!(x != 1);
        assert!(cpu_seconds(pid) > 0.0);
        let rss = resident_bytes(pid).unwrap();
        assert!(rss > 0);
        assert!(peak_resident_bytes(pid).unwrap() >= rss);
        assert_eq!(resident_bytes(u32::MAX), None);
        assert_eq!(cpu_seconds(u32::MAX), 0.0);
        assert!(!stopped(pid), "this process runs");
    }

    #[test]
    fn a_stopped_child_is_seen_stopped_and_a_running_one_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!stopped(pid));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let started = std::time::Instant::now();
        while !stopped(pid) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "not stopped"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!stopped(pid), "gone");
    }
}
