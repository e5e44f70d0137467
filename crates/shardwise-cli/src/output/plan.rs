//! Rendering of `shardwise plan`: a summary to read at a glance (table), everything (JSON), or
//! one row per cluster and strategy (CSV).

use std::collections::BTreeMap;
use std::io::{self, Write};

use shard_assign::ShardId;

use super::Table;
use crate::cli::Format;
use shardwise_plan::FleetSource;
use shardwise_plan::argocd::ArgoCdLoad;
use shardwise_plan::measured::MeasuredSummary;
use shardwise_plan::planning::{CutCluster, PlanReport, StrategyPlan};

/// Clusters, apps and load of one shard.
type Loads = [u64; 3];

/// Writes the plan. `limit` caps the moved clusters listed per strategy in a table (0: no cap).
pub(crate) fn write_plan(
    out: &mut impl Write,
    report: &PlanReport,
    format: Format,
    limit: usize,
) -> io::Result<()> {
    match format {
        Format::Json => super::json::write(out, "plan", report),
        Format::Csv => write_csv(out, report),
        Format::Table => write_table(out, report, limit),
    }
}

/// Notes and warnings, one line each: a table shows them where they belong; CSV has no room
/// for them, so they go to stderr.
pub(crate) fn messages(report: &PlanReport) -> Vec<String> {
    let mut lines = header_messages(report);
    for s in &report.strategies {
        lines.extend(
            strategy_warnings(report, s)
                .into_iter()
                .map(|w| format!("warning: {}: {w}", s.strategy)),
        );
    }
    lines
}

/// Notes about the objects read, and pins the current placement cannot honour.
fn header_messages(report: &PlanReport) -> Vec<String> {
    let from = report.replicas.from;
    let mut lines: Vec<String> = report.notes.iter().map(|n| format!("note: {n}")).collect();
    lines.extend(report.warnings.iter().map(|w| format!("warning: {w}")));
    lines.extend(report.current.warnings.iter().map(|w| {
        format!(
            "warning: cluster {:?} is pinned to shard {}, which is not live with {from} {}; it is on shard {}",
            w.cluster,
            w.pin,
            plural(u64::from(from), "replica"),
            w.placed_on
        )
    }));
    lines
}

/// The plan's pins to shards that are not live, without a prefix.
fn strategy_warnings(report: &PlanReport, s: &StrategyPlan) -> Vec<String> {
    let to = report.replicas.to;
    s.warnings
        .iter()
        .map(|w| {
            format!(
                "cluster {:?} is pinned to shard {}, which is not live with {to} {}; placed on shard {}",
                w.cluster,
                w.pin,
                plural(u64::from(to), "replica"),
                w.placed_on
            )
        })
        .collect()
}

/// A strategy's name, marked when it cuts clusters into slices.
fn label(s: &StrategyPlan) -> String {
    if s.slicing.is_some() {
        format!("{} +slices", s.strategy)
    } else {
        s.strategy.to_string()
    }
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        word.to_string()
    } else {
        format!("{word}s")
    }
}

fn count(n: u64, word: &str) -> String {
    format!("{n} {}", plural(n, word))
}

fn write_csv(out: &mut impl Write, report: &PlanReport) -> io::Result<()> {
    let any_cut = report
        .strategies
        .iter()
        .filter_map(|s| s.slicing.as_ref())
        .any(|c| !c.cut.is_empty());
    let mut header = vec![
        "strategy",
        "cluster",
        "id",
        "apps",
        "load",
        "current_shard",
        "planned_shard",
        "change",
    ];
    if any_cut {
        header.insert(2, "slice");
    }
    let mut table = Table::new(&header);
    for s in &report.strategies {
        let moved: BTreeMap<&str, (ShardId, bool)> = s
            .moved
            .iter()
            .map(|m| (m.id.as_str(), (m.to, m.forced)))
            .collect();
        let placed: BTreeMap<&str, ShardId> =
            s.placed.iter().map(|p| (p.id.as_str(), p.to)).collect();
        let cut: BTreeMap<&str, &CutCluster> = s
            .slicing
            .iter()
            .flat_map(|c| &c.cut)
            .map(|c| (c.id.as_str(), c))
            .collect();
        for c in &report.clusters {
            // One row per slice of a cut cluster (with the shard its apps are on now), one for a
            // whole one.
            let rows: Vec<(&str, Option<&str>, u64, Option<ShardId>)> = match cut.get(c.id.as_str())
            {
                Some(cluster) => cluster
                    .slices
                    .iter()
                    .map(|r| (r.id.as_str(), Some(r.range.as_str()), r.apps, r.now))
                    .collect(),
                None => vec![(c.id.as_str(), None, c.apps, c.shard)],
            };
            for (unit, range, apps, current) in rows {
                let (planned, change) = match (moved.get(unit), current) {
                    (Some(&(to, true)), _) => (Some(to), "forced"),
                    (Some(&(to, false)), _) => (Some(to), "voluntary"),
                    (None, Some(shard)) => (Some(shard), "stay"),
                    (None, None) => (placed.get(unit).copied(), "new"),
                };
                let shard = |s: Option<ShardId>| s.map(|s| s.to_string()).unwrap_or_default();
                let mut row = vec![
                    s.strategy.to_string(),
                    c.name.clone(),
                    c.id.clone(),
                    apps.to_string(),
                    (apps * u64::from(c.weight)).to_string(),
                    shard(current),
                    shard(planned),
                    change.to_string(),
                ];
                if any_cut {
                    row.insert(2, range.unwrap_or("whole").to_string());
                }
                table.push(row);
            }
        }
    }
    table.write_csv(out)
}

fn write_table(out: &mut impl Write, report: &PlanReport, limit: usize) -> io::Result<()> {
    let (from, to) = (report.replicas.from, report.replicas.to);
    let weighted = report.fleet.weighted;
    let objects = match report.source {
        FleetSource::Argocd => "Argo CD cluster Secrets and Applications",
        FleetSource::Shardwise => "FleetClusters and FleetApps",
    };
    writeln!(
        out,
        "fleet: {}, {} ({objects} in namespace {} at {})",
        count(report.fleet.clusters as u64, "cluster"),
        count(report.fleet.apps, "app"),
        report.namespace,
        report.server
    )?;
    writeln!(
        out,
        "replicas: {from} -> {to} ({from} from {})",
        report.replicas.origin
    )?;
    let current = &report.current;
    let unplaced = if current.unplaced.clusters > 0 {
        format!(
            "; {} ({}) unplaced",
            count(current.unplaced.clusters, "cluster"),
            count(current.unplaced.apps, "app")
        )
    } else {
        String::new()
    };
    match (current.strategy, &report.argocd) {
        (Some(strategy), Some(argocd)) => {
            writeln!(
                out,
                "current placement: computed with {strategy} on {from} {}, as Argo CD's {} algorithm places clusters (algorithm from {}){unplaced}",
                plural(u64::from(from), "replica"),
                argocd.algorithm,
                argocd.algorithm_origin
            )?;
            writeln!(
                out,
                "application namespaces: {} (from {})",
                argocd.app_namespaces.join(", "),
                argocd.app_namespaces_origin
            )?;
            let load = match argocd.load {
                ArgoCdLoad::Apps => "one per Application",
                ArgoCdLoad::Resources => "one per managed resource (status.resources)",
            };
            writeln!(out, "load: {load}")?;
        }
        (Some(strategy), None) => writeln!(
            out,
            "current placement: computed with {strategy} on {from} {}{unplaced}",
            plural(u64::from(from), "replica")
        )?,
        (None, _) => writeln!(out, "current placement: shard labels{unplaced}")?,
    }
    if let Some(measured) = &report.measured {
        write_measured(out, measured)?;
    }
    for line in header_messages(report) {
        writeln!(out, "{line}")?;
    }

    writeln!(
        out,
        "\nnow, on {from} {} (max/mean {:.3}):",
        plural(u64::from(from), "replica"),
        current.balance.max_over_mean
    )?;
    let mut header = vec!["shard", "clusters", "apps"];
    if weighted {
        header.push("load");
    }
    let mut shards = Table::new(&header);
    for s in &current.shards {
        let mut row = vec![
            if s.live {
                s.shard.to_string()
            } else {
                format!("{} (not live)", s.shard)
            },
            s.clusters.to_string(),
            s.apps.to_string(),
        ];
        if weighted {
            row.push(s.load.to_string());
        }
        shards.push(row);
    }
    shards.write_text(out)?;

    writeln!(
        out,
        "\nplans for {from} -> {to} replicas; moves are counted from the current placement:"
    )?;
    write_summary(out, report)?;
    for s in &report.strategies {
        writeln!(out)?;
        write_strategy(out, report, s, limit)?;
    }
    Ok(())
}

/// Where measured load came from, and what a unit of load is then.
fn write_measured(out: &mut impl Write, m: &MeasuredSummary) -> io::Result<()> {
    let overridden = if m.overridden > 0 {
        format!(
            " ({} more measured but weighed by spec.weight)",
            m.overridden
        )
    } else {
        String::new()
    };
    writeln!(
        out,
        "load: measured, from the load reports of {} of {} shard {}: {} of {} measured{overridden}, {:.3} busy seconds per second in total",
        m.reports,
        m.leases,
        plural(m.leases as u64, "Lease"),
        m.measured,
        count(m.clusters as u64, "cluster"),
        m.busy
    )?;
    match m.busy_per_app {
        Some(busy) => writeln!(
            out,
            "load unit: apps x weight, where weight 1000 is an app of the fleet's average measured cost ({busy:.4} busy s/s); unmeasured clusters weigh 1000 x spec.weight (or 1), that many average apps"
        ),
        None => writeln!(
            out,
            "load unit: apps x weight; nothing measured is busy, so every cluster weighs 1000 x spec.weight (or 1), that many average apps"
        ),
    }
}

fn write_summary(out: &mut impl Write, report: &PlanReport) -> io::Result<()> {
    let (from, to) = (report.replicas.from, report.replicas.to);
    let at_from = format!("max/mean @{from}");
    let at_to = format!("max/mean @{to}");
    let any_placed = report.current.unplaced.clusters > 0;
    let mut header = vec!["strategy"];
    if from != to {
        header.push(&at_from);
    }
    header.extend([
        at_to.as_str(),
        "clusters moved",
        "forced",
        "voluntary",
        "apps moved",
        "apps forced",
        "apps voluntary",
    ]);
    if any_placed {
        header.push("new");
    }
    let any_sliced = report.strategies.iter().any(|s| s.slicing.is_some());
    if any_sliced {
        header.push("cache copies");
    }
    header.push("warnings");
    let mut table = Table::new(&header);
    for s in &report.strategies {
        let mut row = vec![label(s)];
        if from != to {
            row.push(format!("{:.3}", s.at_from.balance.max_over_mean));
        }
        let m = &s.moves;
        row.extend([
            format!("{:.3}", s.at_to.balance.max_over_mean),
            m.clusters.to_string(),
            m.forced.clusters.to_string(),
            m.voluntary.clusters.to_string(),
            m.apps.to_string(),
            m.forced.apps.to_string(),
            m.voluntary.apps.to_string(),
        ]);
        if any_placed {
            row.push(m.placed.clusters.to_string());
        }
        if any_sliced {
            row.push(
                s.slicing
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |c| c.cache_copies.to_string()),
            );
        }
        row.push(s.warnings.len().to_string());
        table.push(row);
    }
    table.write_text(out)
}

fn write_strategy(
    out: &mut impl Write,
    report: &PlanReport,
    s: &StrategyPlan,
    limit: usize,
) -> io::Result<()> {
    let to = report.replicas.to;
    writeln!(
        out,
        "{} with {to} {} (max/mean {:.3}):",
        label(s),
        plural(u64::from(to), "replica"),
        s.at_to.balance.max_over_mean
    )?;
    if let Some(slicing) = &s.slicing {
        for c in &slicing.cut {
            let shards: std::collections::BTreeSet<ShardId> =
                c.slices.iter().map(|r| r.shard).collect();
            writeln!(
                out,
                "cluster {:?} is cut into {} slices on shards {}",
                c.cluster,
                c.slices.len(),
                shards
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        if !slicing.cut.is_empty() {
            writeln!(
                out,
                "cache copies: {} (moves below are of slices, named cluster#range)",
                slicing.cache_copies
            )?;
        }
    }
    write_shards(out, report, s)?;
    write_moves(out, s, limit)?;
    for line in strategy_warnings(report, s) {
        writeln!(out, "warning: {line}")?;
    }
    Ok(())
}

/// The shards of the current placement and of the plan, side by side.
fn write_shards(out: &mut impl Write, report: &PlanReport, s: &StrategyPlan) -> io::Result<()> {
    let to = report.replicas.to;
    let weighted = report.fleet.weighted;
    let clusters_to = format!("clusters @{to}");
    let apps_to = format!("apps @{to}");
    let load_to = format!("load @{to}");
    let mut header = vec!["shard", "clusters now", "apps now", &clusters_to, &apps_to];
    if weighted {
        header.insert(3, "load now");
        header.push(&load_to);
    }
    // Every shard of the current placement or of the plan, in order: [clusters, apps, load].
    let mut rows: BTreeMap<ShardId, (Option<Loads>, Option<Loads>)> = BTreeMap::new();
    for c in &report.current.shards {
        rows.entry(c.shard).or_default().0 = Some([c.clusters, c.apps, c.load]);
    }
    for p in &s.at_to.shards {
        rows.entry(p.shard).or_default().1 = Some([p.clusters, p.apps, p.load]);
    }
    let columns = if weighted { 3 } else { 2 };
    let cells = |loads: Option<Loads>| {
        (0..columns).map(move |i| loads.map_or_else(|| "-".to_string(), |l| l[i].to_string()))
    };
    let mut table = Table::new(&header);
    for (shard, (now, planned)) in rows {
        let label = if planned.is_some() {
            shard.to_string()
        } else {
            format!("{shard} (not live)")
        };
        let mut row = vec![label];
        // A shard that only the plan has carries nothing now.
        row.extend(cells(Some(now.unwrap_or_default())));
        row.extend(cells(planned));
        table.push(row);
    }
    table.write_text(out)
}

/// The moves the plan makes, counted, then listed (up to `limit`; 0 lists all).
fn write_moves(out: &mut impl Write, s: &StrategyPlan, limit: usize) -> io::Result<()> {
    let m = &s.moves;
    if m.clusters == 0 {
        writeln!(out, "moves: none")?;
    } else {
        writeln!(
            out,
            "moves: {} ({}): forced {} ({}), voluntary {} ({})",
            count(m.clusters, "cluster"),
            count(m.apps, "app"),
            count(m.forced.clusters, "cluster"),
            count(m.forced.apps, "app"),
            count(m.voluntary.clusters, "cluster"),
            count(m.voluntary.apps, "app"),
        )?;
    }
    if m.placed.clusters > 0 {
        writeln!(
            out,
            "new: {} ({}) placed for the first time",
            count(m.placed.clusters, "cluster"),
            count(m.placed.apps, "app")
        )?;
    }
    let listed: Vec<[String; 5]> = s
        .moved
        .iter()
        .map(|c| {
            let kind = if c.forced { "forced" } else { "voluntary" };
            [
                c.cluster.clone(),
                c.apps.to_string(),
                c.from.to_string(),
                c.to.to_string(),
                kind.to_string(),
            ]
        })
        .chain(s.placed.iter().map(|c| {
            [
                c.cluster.clone(),
                c.apps.to_string(),
                "-".to_string(),
                c.to.to_string(),
                "new".to_string(),
            ]
        }))
        .collect();
    if !listed.is_empty() {
        let shown = if limit == 0 {
            listed.len()
        } else {
            limit.min(listed.len())
        };
        let mut table = Table::new(&["cluster", "apps", "from", "to", "move"]);
        for row in listed.iter().take(shown) {
            table.push(row.to_vec());
        }
        table.write_text(out)?;
        if shown < listed.len() {
            writeln!(
                out,
                "... and {} more (--limit 0 lists all)",
                listed.len() - shown
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use shard_assign::{Cluster, StrategyConfig, StrategyKind};

    use super::*;
    use shardwise_plan::LiveFleet;
    use shardwise_plan::planning::{Current, PlanRequest, build};

    /// 30 clusters labelled round-robin on 3 shards, one unplaced, one pinned to shard 9; planned
    /// 3 -> 2 with greedy-minimum (many moves) and sticky-balanced.
    fn report() -> PlanReport {
        let mut fleet = LiveFleet {
            notes: vec!["something to know".into()],
            ..LiveFleet::default()
        };
        for i in 0..30u32 {
            let mut c = Cluster::new(format!("id-{i:02}"), u64::from(i) * 3 + 1);
            c.name = format!("cluster-{i:02}");
            fleet.clusters.push(c);
            fleet.recorded.insert(format!("id-{i:02}"), i % 3);
        }
        fleet.recorded.remove("id-29");
        fleet.clusters[5].pin = Some(9);
        let request = PlanRequest {
            source: FleetSource::Shardwise,
            server: "https://example:6443".into(),
            namespace: "fleet".into(),
            replicas: 3,
            replicas_origin: "StatefulSet fleet/shardwise spec.replicas".into(),
            to: 2,
            current: Current::Recorded,
            strategies: [StrategyKind::GreedyMinimum, StrategyKind::StickyBalanced]
                .map(StrategyConfig::new)
                .to_vec(),
            // Whole clusters here; the sliced table has its own test.
            slicing: shard_assign::SliceSwitch::Off,
            argocd: None,
        };
        build(&fleet, request).unwrap()
    }

    fn render(report: &PlanReport, format: Format, limit: usize) -> String {
        let mut out = Vec::new();
        write_plan(&mut out, report, format, limit).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_table_summarises_then_lists_capped_moves_per_strategy() {
        let report = report();
        let text = render(&report, Format::Table, 5);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "fleet: 30 clusters, 1335 apps (FleetClusters and FleetApps in namespace fleet at https://example:6443)"
        );
        assert_eq!(
            lines[1],
            "replicas: 3 -> 2 (3 from StatefulSet fleet/shardwise spec.replicas)"
        );
        assert_eq!(
            lines[2],
            "current placement: shard labels; 1 cluster (88 apps) unplaced"
        );
        assert_eq!(lines[3], "note: something to know");
        assert!(text.contains("max/mean @3  max/mean @2  clusters moved  forced  voluntary"));
        assert!(text.contains("\ngreedy-minimum with 2 replicas (max/mean "));
        assert!(text.contains("\n2 (not live)  "));
        let greedy = &report.strategies[0];
        let listed = greedy.moved.len() + greedy.placed.len();
        assert!(listed > 5);
        assert!(text.contains(&format!(
            "\n... and {} more (--limit 0 lists all)\n",
            listed - 5
        )));
        assert!(text.contains(
            "warning: cluster \"cluster-05\" is pinned to shard 9, which is not live with 2 replicas; placed on shard"
        ));
        let summary = lines
            .iter()
            .find(|l| l.starts_with("sticky-balanced "))
            .unwrap();
        let m = &report.strategies[1].moves;
        let expected: Vec<String> = [
            m.clusters,
            m.forced.clusters,
            m.voluntary.clusters,
            m.apps,
            m.forced.apps,
            m.voluntary.apps,
            m.placed.clusters,
            1,
        ]
        .iter()
        .map(u64::to_string)
        .collect();
        let cells: Vec<&str> = summary.split_whitespace().skip(3).collect();
        assert_eq!(cells, expected);

        let all = render(&report, Format::Table, 0);
        assert!(!all.contains("more (--limit 0 lists all)"));
    }

    #[test]
    fn a_sliced_plan_names_its_cut_and_lists_slices_in_csv() {
        let mut fleet = LiveFleet::default();
        for (id, apps, shard) in [("hot", 600u64, 0), ("a", 50, 1), ("b", 60, 1)] {
            let mut c = Cluster::new(id, apps);
            c.name = format!("cluster-{id}");
            fleet.clusters.push(c);
            fleet.recorded.insert(id.into(), shard);
            for n in 0..apps {
                fleet.add_app_key(id, Some(&shardwise_sim::app_uid(id, n)));
            }
        }
        fleet.finish_keys();
        let request = PlanRequest {
            source: FleetSource::Shardwise,
            server: "https://example:6443".into(),
            namespace: "fleet".into(),
            replicas: 3,
            replicas_origin: "--replicas".into(),
            to: 3,
            current: Current::Recorded,
            strategies: vec![StrategyConfig::new(StrategyKind::StickyBalanced)],
            slicing: shard_assign::SliceSwitch::Auto,
            argocd: None,
        };
        let report = build(&fleet, request).unwrap();
        let table = render(&report, Format::Table, 0);
        assert!(table.contains("sticky-balanced +slices"), "{table}");
        assert!(
            table.contains("cluster \"cluster-hot\" is cut into "),
            "{table}"
        );
        assert!(table.contains("cache copies: "), "{table}");
        let csv = render(&report, Format::Csv, 0);
        let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
        assert_eq!(rows[0][2], "slice");
        let hot: Vec<&Vec<&str>> = rows.iter().filter(|r| r[1] == "cluster-hot").collect();
        assert!(hot.len() > 1 && hot.iter().all(|r| r[2] != "whole"));
        let apps: u64 = hot.iter().map(|r| r[4].parse::<u64>().unwrap()).sum();
        assert_eq!(apps, 600);
        // Slices left on shard 0 stay; the others move off it.
        for r in &hot {
            assert_eq!(r[6], "0");
            assert_eq!(
                r[8],
                if r[7] == "0" { "stay" } else { "voluntary" },
                "{r:?}"
            );
        }
    }

    #[test]
    fn csv_gives_each_recorded_slice_its_own_current_shard() {
        let (fleet, cut, _) = shardwise_plan::shardwise::fixtures::cut_fleet();
        let request = PlanRequest {
            source: FleetSource::Shardwise,
            server: "https://example:6443".into(),
            namespace: "shardwise".into(),
            replicas: 3,
            replicas_origin: "--replicas".into(),
            to: 3,
            current: Current::Recorded,
            strategies: vec![StrategyConfig::new(StrategyKind::StickyBalanced)],
            slicing: shard_assign::SliceSwitch::Auto,
            argocd: None,
        };
        let csv = render(&build(&fleet, request).unwrap(), Format::Csv, 0);
        let hot: Vec<(String, String, String, String)> = csv
            .lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|r| r[1] == "hot")
            .map(|r| (r[2].into(), r[6].into(), r[7].into(), r[8].into()))
            .collect();
        let expected: Vec<_> = cut
            .iter()
            .zip(["0", "1", "2"])
            .map(|(range, shard)| (range.to_string(), shard.into(), shard.into(), "stay".into()))
            .collect();
        assert_eq!(hot, expected);
    }

    #[test]
    fn csv_has_one_row_per_cluster_and_strategy() {
        let report = report();
        let text = render(&report, Format::Csv, 5);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "strategy,cluster,id,apps,load,current_shard,planned_shard,change"
        );
        assert_eq!(lines.len(), 1 + 2 * 30);
        assert!(lines.contains(&"sticky-balanced,cluster-29,id-29,88,88,,0,new"));
        let sticky = &report.strategies[1];
        for change in ["forced", "voluntary"] {
            let expected = sticky
                .moved
                .iter()
                .filter(|m| m.forced == (change == "forced"))
                .count();
            let rows = lines
                .iter()
                .filter(|l| l.starts_with("sticky-balanced,") && l.ends_with(change))
                .count();
            assert_eq!(rows, expected, "{change}");
        }
        // Stays keep their shard.
        assert!(
            lines
                .iter()
                .filter(|l| l.ends_with(",stay"))
                .all(|l| { l.split(',').nth(5) == l.split(',').nth(6) })
        );
        let messages = messages(&report);
        assert_eq!(messages[0], "note: something to know");
        assert!(messages.iter().any(|m| {
            m.starts_with("warning: sticky-balanced: cluster \"cluster-05\" is pinned to shard 9")
        }));
        assert!(messages.iter().any(|m| m.starts_with(
            "warning: cluster \"cluster-05\" is pinned to shard 9, which is not live with 3 replicas; it is on shard 2"
        )));
    }

    #[test]
    fn measured_load_says_where_it_came_from_and_what_its_unit_is() {
        let mut summary = MeasuredSummary {
            unit: "u",
            leases: 3,
            reports: 2,
            clusters: 5,
            measured: 3,
            overridden: 1,
            busy: 6.0,
            busy_per_app: Some(0.125),
        };
        let lines = |summary: &MeasuredSummary| {
            let mut out = Vec::new();
            write_measured(&mut out, summary).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            lines(&summary),
            "load: measured, from the load reports of 2 of 3 shard Leases: 3 of 5 clusters measured (1 more measured but weighed by spec.weight), 6.000 busy seconds per second in total\n\
             load unit: apps x weight, where weight 1000 is an app of the fleet's average measured cost (0.1250 busy s/s); unmeasured clusters weigh 1000 x spec.weight (or 1), that many average apps\n"
        );
        summary.busy_per_app = None;
        assert!(lines(&summary).ends_with(
            "load unit: apps x weight; nothing measured is busy, so every cluster weighs 1000 x spec.weight (or 1), that many average apps\n"
        ));
    }

    #[test]
    fn json_has_the_documented_shape() {
        let report = report();
        let json: serde_json::Value =
            serde_json::from_str(&render(&report, Format::Json, 5)).unwrap();
        assert_eq!(json["source"], "shardwise");
        assert_eq!(json["replicas"]["from"], 3);
        assert_eq!(json["replicas"]["to"], 2);
        assert_eq!(json["fleet"]["clusters"], 30);
        assert_eq!(json["current"]["placement"], "labels");
        assert_eq!(json["current"]["strategy"], serde_json::Value::Null);
        assert_eq!(json["current"]["unplaced"]["clusters"], 1);
        assert_eq!(json["current"]["shards"][0]["live"], true);
        assert_eq!(json["clusters"].as_array().unwrap().len(), 30);
        let greedy = &json["strategies"][0];
        assert_eq!(greedy["strategy"], "greedy-minimum");
        assert_eq!(greedy["config"]["kind"], "greedy-minimum");
        assert!(
            greedy["at_to"]["balance"]["max_over_mean"]
                .as_f64()
                .unwrap()
                >= 1.0
        );
        assert_eq!(greedy["at_from"]["shards"].as_array().unwrap().len(), 3);
        // Full lists, whatever the table's limit.
        let moved = greedy["moved"].as_array().unwrap();
        assert_eq!(
            moved.len() as u64,
            greedy["moves"]["clusters"].as_u64().unwrap()
        );
        for key in ["cluster", "id", "apps", "load", "from", "to", "forced"] {
            assert!(moved[0].get(key).is_some(), "{key}");
        }
        assert_eq!(greedy["placed"][0]["cluster"], "cluster-29");
        assert_eq!(greedy["warnings"][0]["cluster"], "cluster-05");
        assert_eq!(greedy["warnings"][0]["pin"], 9);
    }
}
