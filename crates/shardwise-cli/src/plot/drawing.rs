//! Drawing the simulation's report with plotters (the CLI's `plot` feature).

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use shard_assign::StrategyKind;
use shardwise_sim::{Report, Scenario, SeedRun, StrategyReport};

use super::PlotFormat;
use crate::output::strategy_label as label;

const WIDTH: u32 = 1500;
/// The trade-off chart with its title, then the title of the load panels.
const TRADE_OFF_HEIGHT: u32 = 495;
const LOADS_TITLE_HEIGHT: u32 = 40;
/// One row of load panels, three to a row.
const PANEL_HEIGHT: u32 = 210;
const PANEL_COLUMNS: usize = 3;
/// The slicing panel: its caption and axis, and one bar per strategy.
const SLICING_FRAME_HEIGHT: u32 = 90;
const SLICING_BAR_HEIGHT: u32 = 26;

/// One color per strategy kind, in the order of `StrategyKind::ALL`: a strategy with and
/// without slices shares its color, and is told apart by its marker.
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// The kind of picture a `--plot` path asks for.
/// Draws the report to `path`.
pub(crate) fn draw(report: &Report, path: &Path, format: PlotFormat) -> Result<()> {
    // The font is embedded so that a plot looks the same on a machine without fonts.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("the embedded font could not be loaded"))?;
    plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
        .map_err(|_| anyhow!("the embedded font could not be loaded"))?;
    match format {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, (WIDTH, height(report))).into_drawing_area();
            render(&root, report)?;
            root.present().context("cannot write the PNG file")
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, (WIDTH, height(report))).into_drawing_area();
            render(&root, report)?;
            root.present().context("cannot write the SVG file")
        }
    }
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e}")
}

/// What the x axis of the trade-off chart counts for this scenario.
struct ChurnAxis {
    label: &'static str,
    of_seed: fn(&SeedRun) -> f64,
    of_strategy: fn(&StrategyReport) -> f64,
}

fn churn_axis(report: &Report) -> ChurnAxis {
    match report.scenario {
        Scenario::Churn { .. } => ChurnAxis {
            label: "apps moved, all steps (fewer is better)",
            of_seed: |r| r.total_moves().apps as f64,
            of_strategy: |s| s.moves.apps.median,
        },
        Scenario::Scale { .. } => ChurnAxis {
            label: "clusters moved, not counting the removed shard's (fewer is better)",
            of_seed: |r| r.total_moves().clusters_excluding_removed as f64,
            of_strategy: |s| s.moves.clusters_excluding_removed.median,
        },
        Scenario::AddClusters { .. } | Scenario::RemoveClusters { .. } => ChurnAxis {
            label: "clusters moved (fewer is better)",
            of_seed: |r| r.total_moves().clusters as f64,
            of_strategy: |s| s.moves.clusters.median,
        },
    }
}

/// A seed's balance: the median over its steps.
fn seed_balance(run: &SeedRun) -> f64 {
    let mut values: Vec<f64> = run.after.iter().map(|b| b.max_over_mean).collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(1.0)
}

/// Rows of load panels, one panel per strategy.
fn panel_rows(report: &Report) -> u32 {
    report.strategies.len().max(1).div_ceil(PANEL_COLUMNS) as u32
}

/// Height of the slicing panel: none unless a strategy slices.
fn slicing_height(report: &Report) -> u32 {
    if report.strategies.iter().any(|s| s.sliced) {
        SLICING_FRAME_HEIGHT + SLICING_BAR_HEIGHT * report.strategies.len() as u32
    } else {
        0
    }
}

/// The picture grows with the strategies compared, so that no panel is squeezed.
fn height(report: &Report) -> u32 {
    TRADE_OFF_HEIGHT
        + LOADS_TITLE_HEIGHT
        + PANEL_HEIGHT * panel_rows(report)
        + slicing_height(report)
}

/// A strategy's color: its kind's.
fn color(s: &StrategyReport) -> RGBColor {
    let kind = StrategyKind::ALL
        .iter()
        .position(|&k| k == s.strategy)
        .unwrap_or(0);
    PALETTE[kind % PALETTE.len()]
}

/// A dot for whole clusters, a triangle with slices.
fn marker<DB: DrawingBackend, C: Clone + 'static>(
    s: &StrategyReport,
    at: C,
    size: i32,
    style: ShapeStyle,
) -> DynElement<'static, DB, C> {
    if s.sliced {
        TriangleMarker::new(at, size + size / 3, style).into_dyn()
    } else {
        Circle::new(at, size, style).into_dyn()
    }
}

fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_error)?;
    let (top, rest) = root.split_vertically(TRADE_OFF_HEIGHT);
    draw_trade_off(&top, report)?;
    let (loads, slicing) =
        rest.split_vertically(LOADS_TITLE_HEIGHT + PANEL_HEIGHT * panel_rows(report));
    draw_loads(&loads, report)?;
    if slicing_height(report) > 0 {
        draw_slicing(&slicing, report)?;
    }
    Ok(())
}

/// Width of the legend beside the trade-off chart: outside the plot, so that it hides no point.
const LEGEND_WIDTH: u32 = 300;

fn draw_trade_off<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let ChurnAxis {
        label: x_label,
        of_seed: seed_x,
        of_strategy: median_x,
    } = churn_axis(report);
    let points = report
        .strategies
        .iter()
        .flat_map(|s| s.runs.iter().map(|r| (seed_x(r), seed_balance(r))));
    let (x_max, y_max) = points.fold((1.0f64, 1.01f64), |(x, y), (px, py)| (x.max(px), y.max(py)));
    let title = format!(
        "Balance against churn: {} seeds (dots), medians (large), lower left is better",
        report.seeds
    );
    let (title_area, body) = area.split_vertically(40);
    title_area
        .titled(
            &title,
            ("sans-serif", 24).into_font().style(FontStyle::Bold),
        )
        .map_err(plot_error)?;
    let (plot_area, legend_area) = body.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(20)
        .margin_top(5)
        .x_label_area_size(50)
        .y_label_area_size(70)
        // A margin below 1 too: the best strategies sit there, and their markers would be cut.
        .build_cartesian_2d(
            -x_max * 0.02..x_max * 1.05,
            1.0 - (y_max - 1.0) * 0.04..y_max + (y_max - 1.0) * 0.05,
        )
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("max / mean load per shard")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    for s in &report.strategies {
        let style = color(s).mix(0.3).filled();
        chart
            .draw_series(
                s.runs
                    .iter()
                    .map(|r| marker(s, (seed_x(r), seed_balance(r)), 3, style)),
            )
            .map_err(plot_error)?;
    }
    // Medians last, over every seed's dot, each ringed so that one on another stays visible.
    for s in &report.strategies {
        let median = (median_x(s), s.balance.max_over_mean.median);
        chart
            .draw_series([
                marker(s, median, 9, color(s).filled()),
                marker(s, median, 9, WHITE.stroke_width(2)),
            ])
            .map_err(plot_error)?;
    }
    draw_legend(&legend_area, report, |s| {
        format!(
            "max/mean {:.3}, moved {}",
            s.balance.max_over_mean.median,
            median_x(s).round()
        )
    })
}

/// One entry per strategy: its dot, its name, and its medians below.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    report: &Report,
    medians: impl Fn(&StrategyReport) -> String,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let name_font = ("sans-serif", 16).into_font();
    let detail_font = ("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80));
    area.draw(&Text::new(
        "median per strategy",
        (10, 10),
        ("sans-serif", 16).into_font().style(FontStyle::Bold),
    ))
    .map_err(plot_error)?;
    // Entries share the height of the chart, 44 pixels each at most.
    let height = area.dim_in_pixel().1 as i32;
    let step = ((height - 50) / report.strategies.len().max(1) as i32).min(44);
    for (i, s) in report.strategies.iter().enumerate() {
        let y = 45 + step * i as i32;
        area.draw(&marker(s, (18, y + 9), 7, color(s).filled()))
            .map_err(plot_error)?;
        area.draw(&Text::new(label(s), (34, y), name_font.clone()))
            .map_err(plot_error)?;
        area.draw(&Text::new(medians(s), (34, y + 19), detail_font.clone()))
            .map_err(plot_error)?;
    }
    Ok(())
}

fn draw_loads<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let rows = report.strategies.len().max(1).div_ceil(PANEL_COLUMNS);
    let (title_area, panels_area) = area.split_vertically(LOADS_TITLE_HEIGHT);
    title_area
        .titled(
            &format!(
                "Load per shard, seed {}: before (light) and after (solid) the change; line: mean after",
                report.first_seed
            ),
            ("sans-serif", 20).into_font().style(FontStyle::Bold),
        )
        .map_err(plot_error)?;
    let panels = panels_area.split_evenly((rows, PANEL_COLUMNS));
    let y_max = report
        .strategies
        .iter()
        .filter_map(|s| s.runs.first())
        .flat_map(|r| r.loads_before.iter().chain(&r.loads_after))
        .copied()
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    for (s, panel) in report.strategies.iter().zip(&panels) {
        let Some(run) = s.runs.first() else {
            continue;
        };
        let color = color(s);
        let shards = run.loads_before.len().max(run.loads_after.len()).max(1);
        // Shard n spans n-0.5..n+0.5, so that its tick is under the middle of its pair of bars.
        let mut chart = ChartBuilder::on(panel)
            .caption(label(s), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(38)
            .y_label_area_size(62)
            .build_cartesian_2d(-0.5f64..shards as f64 - 0.5, 0f64..y_max.max(1.0))
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(shards.min(20))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(5)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(WHITE.mix(0.0))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .x_desc("shard")
            .y_desc("load (apps × weight)")
            .draw()
            .map_err(plot_error)?;
        let bars = |loads: &[u64], from: f64, to: f64, style: ShapeStyle| {
            loads
                .iter()
                .enumerate()
                .map(move |(shard, &load)| {
                    let x = shard as f64;
                    Rectangle::new([(x + from, 0.0), (x + to, load as f64)], style)
                })
                .collect::<Vec<_>>()
        };
        chart
            .draw_series(bars(
                &run.loads_before,
                -0.4,
                -0.02,
                color.mix(0.35).filled(),
            ))
            .map_err(plot_error)?;
        chart
            .draw_series(bars(&run.loads_after, 0.02, 0.4, color.filled()))
            .map_err(plot_error)?;
        let mean = run.loads_after.iter().sum::<u64>() as f64 / run.loads_after.len().max(1) as f64;
        chart
            .draw_series(LineSeries::new(
                [(-0.5, mean), (shards as f64 - 0.5, mean)],
                BLACK.stroke_width(1),
            ))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// One bar per strategy, named on the left: the median max/mean after the change (from 1, a
/// perfect balance), labelled with the median cache copies it cost, so that slicing off and on
/// read side by side.
fn draw_slicing<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let count = report.strategies.len().max(1);
    let x_max = report
        .strategies
        .iter()
        .map(|s| s.balance.max_over_mean.median)
        .fold(1.1f64, f64::max);
    // Room right of the longest bar for its label.
    let x_end = 1.0 + (x_max - 1.0) * 1.25;
    // Segments count from the bottom: the first strategy goes on top, as in the legend.
    let row = |i: usize| count - 1 - i;
    let names: Vec<String> = report.strategies.iter().rev().map(label).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Slicing: median max/mean, and cache copies",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(38)
        .y_label_area_size(175)
        .build_cartesian_2d(1f64..x_end, (0..count).into_segmented())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(WHITE.mix(0.0))
        .x_labels(5)
        .x_label_formatter(&|x| format!("{x:.2}"))
        .y_labels(count)
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .x_desc("max / mean load per shard (1 is perfect)")
        .draw()
        .map_err(plot_error)?;
    for (i, s) in report.strategies.iter().enumerate() {
        let color = color(s);
        let balance = s.balance.max_over_mean.median;
        let style = if s.sliced {
            color.filled()
        } else {
            color.mix(0.35).filled()
        };
        chart
            .draw_series([Rectangle::new(
                [
                    (1.0, SegmentValue::Exact(row(i))),
                    (balance, SegmentValue::Exact(row(i) + 1)),
                ],
                style,
            )])
            .map_err(plot_error)?;
        let text = if s.sliced {
            format!(
                "{balance:.3}, {} cache copies",
                s.cache_copies.median.round()
            )
        } else {
            format!("{balance:.3}")
        };
        chart
            .draw_series([Text::new(
                text,
                (
                    balance + (x_end - 1.0) * 0.02,
                    SegmentValue::CenterOf(row(i)),
                ),
                ("sans-serif", 12)
                    .into_font()
                    .into_text_style(area)
                    .pos(Pos::new(HPos::Left, VPos::Center)),
            )])
            .map_err(plot_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardwise_sim::{FleetSource, FleetSpec, Simulation, SliceMode};

    fn report(slicing: SliceMode) -> Report {
        Simulation {
            fleet: FleetSource::Synthetic(FleetSpec {
                clusters: 20,
                apps: 500,
                ..FleetSpec::REFERENCE
            }),
            seeds: 1,
            slicing,
            ..Simulation::reference()
        }
        .run(|| {})
        .expect("the simulation is valid")
    }

    #[test]
    fn the_picture_grows_with_the_strategies_and_a_variant_keeps_its_kinds_color() {
        let auto = report(SliceMode::default());
        let both = report(SliceMode::Both);
        // Six strategies: two rows of panels and a slicing panel of six bars; ten variants:
        // four rows and ten bars.
        let top = TRADE_OFF_HEIGHT + LOADS_TITLE_HEIGHT;
        assert_eq!(
            height(&auto),
            top + 2 * PANEL_HEIGHT + SLICING_FRAME_HEIGHT + 6 * SLICING_BAR_HEIGHT
        );
        assert_eq!(
            height(&both),
            top + 4 * PANEL_HEIGHT + SLICING_FRAME_HEIGHT + 10 * SLICING_BAR_HEIGHT
        );
        let off = report(SliceMode::Switch(shard_assign::SliceSwitch::Off));
        assert_eq!(height(&off), top + 2 * PANEL_HEIGHT);
        for pair in both.strategies.windows(2) {
            if pair[0].strategy == pair[1].strategy {
                assert!(!pair[0].sliced && pair[1].sliced);
                assert_eq!(color(&pair[0]), color(&pair[1]));
            } else {
                assert_ne!(color(&pair[0]), color(&pair[1]));
            }
        }
    }
}
