//! What the demo shows: one frame of the fleet as text. Pure, so it is tested by feeding it
//! figures; the sampling that fills a frame is in the crate root.

use std::fmt::Write as _;
use std::time::Duration;

/// One shard as the demo sees it: from the records (clusters, slices and apps labelled with
/// it) and from its replica's metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardFigures {
    pub shard: u32,
    /// A replica process runs for this shard.
    pub running: bool,
    /// Its replica reports that it is the planner.
    pub planner: bool,
    /// Whole clusters whose record names this shard.
    pub clusters: usize,
    /// Slices of cut clusters whose record names this shard.
    pub slices: usize,
    /// Apps labelled with this shard.
    pub apps: usize,
    /// Reconciles per second since the previous frame (`None` before two scrapes).
    pub reconciles_per_second: Option<f64>,
    /// Busy seconds per second since the previous frame: the time its reconciles took over
    /// the time that passed (`None` before two scrapes). At most its workers, whatever the
    /// planner weighs.
    pub busy: Option<f64>,
}

/// Everything one frame shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame {
    /// What the demo is doing, e.g. "scale 3 -> 4".
    pub phase: String,
    /// (this step, of steps), from 1; `None` once the steps are over (`--keep`).
    pub step: Option<(usize, usize)>,
    pub elapsed: Duration,
    /// The StatefulSet's `spec.replicas`.
    pub expected: u32,
    pub shards: Vec<ShardFigures>,
    pub apps: usize,
    pub synced: usize,
    /// Apps that failed (the broken ones, when all is well).
    pub failed: usize,
    /// Max over mean load per live shard in the planner's latest plan.
    pub load_balance: Option<f64>,
    /// Owner changes the planners wrote so far: of clusters and slices, of apps.
    pub moves: (u64, u64),
    /// Clusters and slices released by a shard after a drain or at shutdown, so far.
    pub handoffs: u64,
    /// Records with a drain in progress.
    pub draining: usize,
}

/// Width of the bar of the busiest shard.
const BAR: usize = 24;

/// The frame as lines of text, with no terminal control codes.
pub fn render(frame: &Frame) -> String {
    let mut out = String::new();
    let seconds = frame.elapsed.as_secs();
    let step = frame
        .step
        .map_or_else(String::new, |(n, of)| format!("[{n}/{of}] "));
    let _ = writeln!(
        out,
        "{:<54} {:>02}:{:>02}",
        format!("{step}{}", frame.phase),
        seconds / 60,
        seconds % 60
    );
    let running = frame.shards.iter().filter(|s| s.running).count();
    let planner = frame
        .shards
        .iter()
        .find(|s| s.planner)
        .map_or_else(|| "none yet".to_string(), |s| format!("shard {}", s.shard));
    let _ = writeln!(
        out,
        "StatefulSet replicas: {}   replicas running: {running}   planner: {planner}",
        frame.expected
    );
    let _ = writeln!(
        out,
        "{:<6} {:<9} {:>8} {:>6} {:>6} {:>12} {:>8}",
        "shard", "replica", "clusters", "slices", "apps", "reconciles/s", "busy s/s"
    );
    // The bar is the busy column, on one scale: the busiest shard's bar is full.
    let busy = |s: &ShardFigures| s.busy.unwrap_or(0.0);
    let most = frame.shards.iter().map(busy).fold(0.0, f64::max);
    for s in &frame.shards {
        let role = match (s.running, s.planner, s.shard < frame.expected) {
            (true, true, _) => "planner",
            (true, false, true) => "running",
            (true, false, false) => "leaving",
            (false, _, true) => "starting",
            (false, _, false) => "gone",
        };
        let figure = |value: Option<f64>, decimals: usize| {
            value.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
        };
        let bar = if most > 0.0 {
            (busy(s) / most * BAR as f64).ceil() as usize
        } else {
            0
        };
        let _ = writeln!(
            out,
            "{:<6} {:<9} {:>8} {:>6} {:>6} {:>12} {:>8}  {}",
            s.shard,
            role,
            s.clusters,
            s.slices,
            s.apps,
            figure(s.reconciles_per_second, 1),
            figure(s.busy, 2),
            "#".repeat(bar)
        );
    }
    let live: Vec<&ShardFigures> = frame
        .shards
        .iter()
        .filter(|s| s.running && s.shard < frame.expected)
        .collect();
    let apps: Vec<f64> = live.iter().map(|s| s.apps as f64).collect();
    if let Some(load_balance) = frame.load_balance {
        let _ = writeln!(
            out,
            "max/mean over live shards: planned load {load_balance:.2}, apps {}: the planner balances measured load (reconcile time and cache memory), so apps may differ",
            max_over_mean(&apps).map_or_else(|| "-".to_string(), |b| format!("{b:.2}"))
        );
    }
    let pending = frame.apps.saturating_sub(frame.synced + frame.failed);
    let _ = writeln!(
        out,
        "apps: {} Synced, {} failed, {pending} pending   moves: {} clusters/slices, {} apps   handoffs: {}   draining: {}",
        frame.synced, frame.failed, frame.moves.0, frame.moves.1, frame.handoffs, frame.draining
    );
    out
}

/// Max over mean, `None` for no values or a zero mean.
fn max_over_mean(values: &[f64]) -> Option<f64> {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (mean > 0.0).then(|| values.iter().copied().fold(0.0, f64::max) / mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(shard: u32, running: bool, apps: usize) -> ShardFigures {
        ShardFigures {
            shard,
            running,
            planner: false,
            clusters: apps / 50,
            slices: 0,
            apps,
            reconciles_per_second: None,
            busy: None,
        }
    }

    fn frame() -> Frame {
        let mut planner = shard(0, true, 400);
        planner.planner = true;
        planner.reconciles_per_second = Some(12.345);
        planner.busy = Some(0.9);
        Frame {
            phase: "scale 3 -> 2".into(),
            step: Some((3, 4)),
            elapsed: Duration::from_secs(75),
            expected: 2,
            shards: vec![planner, shard(1, false, 200), shard(2, true, 100)],
            apps: 1000,
            synced: 690,
            failed: 3,
            load_balance: None,
            moves: (17, 480),
            handoffs: 9,
            draining: 2,
        }
    }

    fn row<'a>(text: &'a str, shard: &str) -> &'a str {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(shard))
            .unwrap_or_else(|| panic!("no row for shard {shard} in\n{text}"))
    }

    #[test]
    fn each_shard_shows_its_role_figures_and_a_bar_scaled_to_the_busiest() {
        let mut frame = frame();
        frame.shards[1].busy = Some(0.45);
        let text = render(&frame);
        let planner: Vec<&str> = row(&text, "0").split_whitespace().collect();
        assert_eq!(
            planner[..7],
            ["0", "planner", "8", "0", "400", "12.3", "0.90"]
        );
        assert_eq!(planner[7].len(), BAR);
        let starting: Vec<&str> = row(&text, "1").split_whitespace().collect();
        assert_eq!(
            starting[..7],
            ["1", "starting", "4", "0", "200", "-", "0.45"]
        );
        assert_eq!(starting[7].len(), BAR / 2);
        // Not measured yet: no figure, no bar.
        let leaving: Vec<&str> = row(&text, "2").split_whitespace().collect();
        assert_eq!(leaving[5..], ["-", "-"]);
        // Above the StatefulSet's count but still running: on its way out.
        assert!(row(&text, "2").contains("leaving"));
    }

    #[test]
    fn the_bars_show_busy_time_in_one_unit_and_the_balance_line_says_why_apps_differ() {
        let mut frame = frame();
        frame.expected = 3;
        frame.shards[1].running = true;
        // Shard 0 holds the most apps, but its apps are cheap: shard 1 is the busiest.
        for (shard, busy) in frame.shards.iter_mut().zip([0.30, 0.60, 0.30]) {
            shard.busy = Some(busy);
        }
        frame.load_balance = Some(1.5);
        let text = render(&frame);
        let columns = |shard| -> Vec<String> {
            row(&text, shard)
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(columns("0")[6], "0.30");
        assert_eq!(columns("0")[7].len(), BAR / 2);
        assert_eq!(columns("1")[6], "0.60");
        assert_eq!(columns("1")[7].len(), BAR);
        let header = text.lines().nth(2).unwrap_or_default();
        assert_eq!(header.matches("apps").count(), 1, "{header}");
        assert!(header.ends_with("busy s/s"), "{header}");
        // Apps 400 / 200 / 100 over three live shards: max/mean 1.71.
        assert!(
            text.contains("max/mean over live shards: planned load 1.50, apps 1.71: the planner balances measured load"),
            "{text}"
        );
    }

    #[test]
    fn the_header_and_footer_say_where_the_fleet_is() {
        let text = render(&frame());
        let first = text.lines().next().unwrap_or_default();
        assert!(first.starts_with("[3/4] scale 3 -> 2"), "{first}");
        assert!(first.ends_with("01:15"), "{first}");
        assert!(
            text.contains("replicas running: 2   planner: shard 0"),
            "{text}"
        );
        assert!(
            text.contains("apps: 690 Synced, 3 failed, 307 pending   moves: 17 clusters/slices, 480 apps   handoffs: 9   draining: 2"),
            "{text}"
        );
    }

    #[test]
    fn a_fleet_with_no_apps_and_no_planner_yet_renders() {
        let text = render(&Frame {
            phase: "start".into(),
            step: Some((1, 4)),
            expected: 3,
            shards: vec![shard(0, true, 0)],
            ..Frame::default()
        });
        assert!(text.contains("planner: none yet"), "{text}");
        assert!(!row(&text, "0").contains('#'), "{text}");
    }

    #[test]
    fn after_the_steps_the_frame_has_no_step_number() {
        let text = render(&Frame {
            phase: "kept running".into(),
            step: None,
            expected: 2,
            ..Frame::default()
        });
        let first = text.lines().next().unwrap_or_default();
        assert!(first.starts_with("kept running "), "{first}");
    }
}
