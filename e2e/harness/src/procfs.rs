//! What `/proc` says about a process the harness started: CPU time and memory, for
//! benchmarks that measure processes rather than code.

/// CPU seconds (user and system) process `pid` has used; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may hold spaces, in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; Linux counts
    // them in USER_HZ, 100 a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident memory of process `pid` now (`VmRSS`), in bytes; `None` once it is gone.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:").map(|kib| kib * 1024)
}

/// Peak resident memory of process `pid` (`VmHWM`), in bytes; `None` once it is gone.
pub fn peak_resident_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:").map(|kib| kib * 1024)
}

/// Whether every thread of process `pid` is stopped (SIGSTOP delivered to each); false once it
/// is gone. A signal reaches a busy process's threads one by one, and a thread may run on for
/// a moment after `kill` returned.
pub fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state is the first field after the command name, which is in parentheses.
        match stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
        {
            Some("T" | "t") => any = true,
            _ => return false,
        }
    }
    any
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
