//! The reports of the experiments that replay many passes: convergence after a change of the
//! shard count, and balance under drifting costs.

use std::io::{self, Write};

use shardwise_sim::{ConvergenceReport, DriftReport, LoadModel, Summary};

use super::{Table, json, pair};
use crate::cli::Format;

pub(crate) fn write_convergence(
    out: &mut impl Write,
    report: &ConvergenceReport,
    format: Format,
) -> io::Result<()> {
    if format == Format::Json {
        return json::write(out, "convergence", report);
    }
    let header = [
        "strategy",
        "first pass max/mean",
        "last pass max/mean",
        "passes to target",
        "seeds within target",
        "apps moved",
        "minimum",
        "moved / minimum",
    ];
    let mut table = Table::new(&header);
    for row in &report.strategies {
        table.push(vec![
            row.strategy.to_string(),
            pair(row.first_pass, 3),
            pair(row.last_pass, 3),
            if row.within_target == 0 {
                "never".into()
            } else {
                pair(row.passes, 0)
            },
            format!("{} of {}", row.within_target, report.seeds),
            pair(row.apps_moved, 0),
            pair(row.minimum_apps, 0),
            pair(row.moved_over_minimum, 2),
        ]);
    }
    if format == Format::Csv {
        return table.write_csv(out);
    }
    writeln!(
        out,
        "{} clusters, {} apps ({}), {} -> {} shards, passes until within the target balance (at most {}); {} seeds from {}",
        report.fleet.clusters,
        report.fleet.apps,
        report.fleet.distribution,
        report.from,
        report.to,
        report.max_passes,
        report.seeds,
        report.first_seed
    )?;
    writeln!(
        out,
        "each pass plans from the previous one with the loads unknown (the planner's periodic pass); apps moved are summed over the passes; minimum: the new shards' share at the mean, or the leaving shards' apps; median / p95 over seeds"
    )?;
    writeln!(out)?;
    table.write_text(out)
}

pub(crate) fn write_drift(
    out: &mut impl Write,
    report: &DriftReport,
    format: Format,
) -> io::Result<()> {
    if format == Format::Json {
        return json::write(out, "drift", report);
    }
    let percent = |s: Summary| Summary {
        median: 100.0 * s.median,
        p95: 100.0 * s.p95,
    };
    let header = [
        "strategy",
        "load model",
        "true max/mean (median over time)",
        "true max/mean (p95 over time)",
        "apps moved per hour (%)",
        "clusters moved per hour",
    ];
    let mut table = Table::new(&header);
    for row in &report.rows {
        table.push(vec![
            row.strategy.to_string(),
            match row.load_model {
                LoadModel::Apps => "apps".into(),
                LoadModel::Measured => "measured".into(),
            },
            pair(row.true_max_over_mean, 3),
            pair(row.true_max_over_mean_p95, 3),
            pair(percent(row.apps_moved_per_hour), 2),
            pair(row.clusters_moved_per_hour, 1),
        ]);
    }
    if format == Format::Csv {
        return table.write_csv(out);
    }
    writeln!(
        out,
        "{} clusters, {} apps ({}) on {} shards for {} h, a pass every {} min; cost per app drifts {} per hour, observed with noise {}, smoothed over {} min; voluntary moves from {:.2}x the mean (sticky-balanced, measured); {} seeds from {}",
        report.fleet.clusters,
        report.fleet.apps,
        report.fleet.distribution,
        report.shards,
        report.hours,
        report.plan_every,
        report.drift,
        report.noise,
        report.smoothing,
        report.trigger,
        report.seeds,
        report.first_seed
    )?;
    writeln!(out, "balance of the true load; median / p95 over seeds")?;
    writeln!(out)?;
    table.write_text(out)
}
