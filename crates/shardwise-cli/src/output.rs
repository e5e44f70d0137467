//! Rendering of results as aligned tables, CSV or JSON.

mod experiments;
mod json;
mod plan;

use std::io::{self, Write};

use serde::Serialize;
use shard_assign::{Balance, Cluster, ShardId, ShardLoad, SlicedAssignment, Warning};
use shardwise_sim::{Report, Scenario, StrategyReport, Summary};

use crate::cli::Format;

pub(crate) use plan::{messages as plan_messages, write_plan};

/// A table of strings, printed with aligned columns (numbers right-aligned).
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([self.header[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                if i == 0 {
                    text.push_str(&format!("{cell:<w$}", w = widths[i]));
                } else {
                    text.push_str(&format!("{cell:>w$}", w = widths[i]));
                }
            }
            writeln!(out, "{}", text.trim_end())
        };
        line(out, &self.header)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(out, &rule)?;
        for row in &self.rows {
            line(out, row)?;
        }
        Ok(())
    }

    fn write_csv(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "{}",
            self.header
                .iter()
                .map(|c| csv_field(c))
                .collect::<Vec<_>>()
                .join(",")
        )?;
        for row in &self.rows {
            writeln!(
                out,
                "{}",
                row.iter()
                    .map(|c| csv_field(c))
                    .collect::<Vec<_>>()
                    .join(",")
            )?;
        }
        Ok(())
    }
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn pair(s: Summary, decimals: usize) -> String {
    format!("{:.d$} / {:.d$}", s.median, s.p95, d = decimals)
}

/// A strategy's name in tables, legends and captions, marked when its clusters were cut: with
/// `--slicing both` a strategy appears twice.
pub(crate) fn strategy_label(s: &StrategyReport) -> String {
    if s.sliced {
        format!("{} +slices", s.strategy)
    } else {
        s.strategy.to_string()
    }
}

fn describe(report: &Report) -> String {
    let scenario = match report.scenario {
        Scenario::Scale { from, to } => format!("{from} -> {to} shards"),
        Scenario::AddClusters { shards, count } => {
            format!("{count} clusters added, {shards} shards")
        }
        Scenario::RemoveClusters { shards, count } => {
            format!("{count} clusters removed, {shards} shards")
        }
        Scenario::Churn {
            shards,
            steps,
            arrivals,
            max_lifetime,
        } => format!(
            "churn: {steps} steps, {arrivals} ephemeral clusters per step living 1-{max_lifetime} steps, {shards} shards"
        ),
    };
    format!(
        "{} clusters, {} apps ({}), {}; {} seeds from {}",
        report.fleet.clusters,
        report.fleet.apps,
        report.fleet.distribution,
        scenario,
        report.seeds,
        report.first_seed
    )
}

pub(crate) use experiments::{write_convergence, write_drift};

pub(crate) fn write_simulation(
    out: &mut impl Write,
    report: &Report,
    format: Format,
) -> io::Result<()> {
    match format {
        Format::Json => json::write(out, "simulation", report),
        Format::Table => {
            writeln!(out, "{}", describe(report))?;
            writeln!(
                out,
                "balance after the change; moves summed over the scenario; median / p95 over seeds"
            )?;
            writeln!(out)?;
            // Slices and cache copies only when something may be cut: without slicing the
            // table stays as it always was.
            let sliced = report.strategies.iter().any(|s| s.sliced);
            let mut header = vec![
                "strategy",
                "max/mean",
                "(max-min)/mean",
                "cv",
                "cluster moves",
                "excl. removed",
                "apps moved",
            ];
            if sliced {
                header.extend(["apps excl. removed", "cache copies", "extra slices"]);
            }
            let timed = report.strategies.iter().any(|s| s.assign_ms.is_some());
            if timed {
                header.push("assign ms");
            }
            let mut table = Table::new(&header);
            for s in &report.strategies {
                let mut row = vec![
                    strategy_label(s),
                    pair(s.balance.max_over_mean, 3),
                    pair(s.balance.spread_over_mean, 3),
                    pair(s.balance.cv, 3),
                    pair(s.moves.clusters, 0),
                    pair(s.moves.clusters_excluding_removed, 0),
                    pair(s.moves.apps, 0),
                ];
                if sliced {
                    row.extend([
                        pair(s.moves.apps_excluding_removed, 0),
                        pair(s.cache_copies, 0),
                        pair(s.extra_slices, 0),
                    ]);
                }
                if timed {
                    row.push(
                        s.assign_ms
                            .map(|ms| format!("{:.3}", ms.median))
                            .unwrap_or_default(),
                    );
                }
                table.push(row);
            }
            table.write_text(out)
        }
        Format::Csv => {
            let timed = report.strategies.iter().any(|s| s.assign_ms.is_some());
            let mut header = vec![
                "strategy",
                "max_over_mean_median",
                "max_over_mean_p95",
                "spread_over_mean_median",
                "spread_over_mean_p95",
                "cv_median",
                "cv_p95",
                "clusters_moved_median",
                "clusters_moved_p95",
                "clusters_moved_excluding_removed_median",
                "clusters_moved_excluding_removed_p95",
                "apps_moved_median",
                "apps_moved_p95",
            ];
            if timed {
                header.push("assign_ms_median");
            }
            let mut table = Table::new(&header);
            for s in &report.strategies {
                let values = [
                    s.balance.max_over_mean,
                    s.balance.spread_over_mean,
                    s.balance.cv,
                    s.moves.clusters,
                    s.moves.clusters_excluding_removed,
                    s.moves.apps,
                ];
                let mut row = vec![strategy_label(s)];
                for v in values {
                    row.push(format!("{}", json::round(v.median)));
                    row.push(format!("{}", json::round(v.p95)));
                }
                if timed {
                    row.push(
                        s.assign_ms
                            .map(|ms| format!("{}", json::round(ms.median)))
                            .unwrap_or_default(),
                    );
                }
                table.push(row);
            }
            table.write_csv(out)
        }
    }
}

#[derive(Serialize)]
struct AssignmentJson<'a> {
    strategy: String,
    balance: Balance,
    /// (cluster, shard) pairs beyond one per cluster.
    cache_copies: usize,
    /// Slices beyond one per cluster.
    extra_slices: usize,
    shards: Vec<ShardJson>,
    clusters: Vec<ClusterJson<'a>>,
    warnings: Vec<&'a Warning>,
}

#[derive(Serialize)]
struct ShardJson {
    shard: ShardId,
    #[serde(flatten)]
    load: ShardLoad,
}

/// One slice of a cluster (the whole cluster when it is not cut).
#[derive(Serialize)]
struct ClusterJson<'a> {
    name: &'a str,
    id: &'a str,
    apps: u64,
    shard: ShardId,
    pinned: bool,
    /// The slice's key range, when the cluster is cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    range: Option<String>,
    /// The same range as a KEP-5866 selector on `metadata.uid`.
    #[serde(skip_serializing_if = "Option::is_none")]
    selector: Option<String>,
}

/// Writes an assignment. `redirected` are the warnings of clusters placed by Argo CD's rule for
/// a pin that is not live (see `commands::assign`): they count as not pinned.
pub(crate) fn write_assignment(
    out: &mut impl Write,
    sliced: &SlicedAssignment,
    clusters: &[Cluster],
    redirected: &[Warning],
    format: Format,
) -> io::Result<()> {
    let assignment = &sliced.assignment;
    let moved_by_argocd_rule = |id: &str| {
        redirected
            .iter()
            .any(|w| matches!(w, Warning::PinNotLive { cluster, .. } if cluster == id))
    };
    // Clusters in the inventory's order, which is the operator's; slices in range order.
    let mut rows: Vec<ClusterJson<'_>> = Vec::new();
    for c in clusters {
        let Some(units) = sliced.units.get(&c.id) else {
            continue;
        };
        let cut = units.len() > 1;
        for (range, unit) in units {
            let Some(placed) = assignment.placements().get(unit) else {
                continue;
            };
            rows.push(ClusterJson {
                name: &c.name,
                id: &c.id,
                apps: placed.apps,
                shard: placed.shard,
                pinned: placed.pinned && !moved_by_argocd_rule(&c.id),
                range: cut.then(|| range.to_string()),
                selector: cut.then(|| range.selector()),
            });
        }
    }
    let any_cut = rows.iter().any(|r| r.range.is_some());
    match format {
        Format::Json => {
            let document = AssignmentJson {
                strategy: assignment.strategy().to_string(),
                balance: assignment.balance(),
                cache_copies: sliced.cache_copies(),
                extra_slices: sliced.slicing.extra_slices(),
                shards: assignment
                    .shard_loads()
                    .iter()
                    .map(|(&shard, &load)| ShardJson { shard, load })
                    .collect(),
                clusters: rows,
                warnings: assignment.warnings().iter().chain(redirected).collect(),
            };
            json::write(out, "assignment", &document)
        }
        Format::Csv => {
            let mut header = vec!["cluster", "id", "apps", "shard", "pinned"];
            if any_cut {
                header.push("range");
            }
            let mut table = Table::new(&header);
            for r in &rows {
                let mut row = vec![
                    r.name.to_string(),
                    r.id.to_string(),
                    r.apps.to_string(),
                    r.shard.to_string(),
                    r.pinned.to_string(),
                ];
                if any_cut {
                    row.push(r.range.clone().unwrap_or_default());
                }
                table.push(row);
            }
            table.write_csv(out)
        }
        Format::Table => {
            let mut header = vec!["cluster", "apps", "shard"];
            if any_cut {
                header.insert(1, "slice");
            }
            let mut table = Table::new(&header);
            for r in &rows {
                let shard = if r.pinned {
                    format!("{} (pinned)", r.shard)
                } else {
                    r.shard.to_string()
                };
                let mut row = vec![r.name.to_string(), r.apps.to_string(), shard];
                if any_cut {
                    row.insert(1, r.range.clone().unwrap_or_else(|| "whole".into()));
                }
                table.push(row);
            }
            table.write_text(out)?;
            writeln!(out)?;
            let units = if any_cut { "slices" } else { "clusters" };
            let mut shards = Table::new(&["shard", units, "apps", "load"]);
            for (shard, load) in assignment.shard_loads() {
                shards.push(vec![
                    shard.to_string(),
                    load.clusters.to_string(),
                    load.apps.to_string(),
                    load.load.to_string(),
                ]);
            }
            shards.write_text(out)?;
            let b = assignment.balance();
            writeln!(
                out,
                "\n{}: max/mean {:.3}, (max-min)/mean {:.3}, cv {:.3}",
                assignment.strategy(),
                b.max_over_mean,
                b.spread_over_mean,
                b.cv
            )?;
            if any_cut {
                writeln!(
                    out,
                    "clusters cut: {}, slices beyond one per cluster: {}, cache copies: {}",
                    sliced.slicing.cut().count(),
                    sliced.slicing.extra_slices(),
                    sliced.cache_copies()
                )?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn tables_align_columns() {
        let mut t = Table::new(&["name", "n"]);
        t.push(vec!["long-name".into(), "1".into()]);
        t.push(vec!["x".into(), "100".into()]);
        let mut out = Vec::new();
        t.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "name         n");
        assert_eq!(lines[2], "long-name    1");
        assert_eq!(lines[3], "x          100");
    }
}
