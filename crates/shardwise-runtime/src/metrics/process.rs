//! The process's CPU time and memory as metrics (the `server` feature: a program that serves
//! its own metrics has its own process metrics).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// CPU time and resident memory of this process, read from `/proc` at scrape time.
#[derive(Debug)]
pub(super) struct ProcessCollector;

/// (CPU seconds, resident bytes) of this process, on Linux, in the kernel's own tick rate and
/// page size.
fn process_usage() -> Option<(f64, u64)> {
    use procfs::WithCurrentSystemInfo;
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second() as f64;
    Some((
        (stat.utime + stat.stime) as f64 / ticks,
        stat.rss_bytes().get(),
    ))
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((cpu, resident)) = process_usage() else {
            return Ok(());
        };
        let counter = ConstCounter::new(cpu);
        let metric = encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time of the process",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)?;
        let gauge = ConstGauge::new(resident as i64);
        let metric = encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory of the process",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}
