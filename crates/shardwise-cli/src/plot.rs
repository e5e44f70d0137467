//! `simulate --plot`: balance against churn for every strategy, each strategy's per-shard
//! load before and after the change and, when clusters are cut, what slicing bought (balance)
//! and what it cost (cache copies).

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use shardwise_sim::{Report, Scenario, SeedRun, StrategyReport};

use crate::limits::Usage;

const WIDTH: u32 = 1500;
const HEIGHT: u32 = 1100;

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

/// The kind of picture a `--plot` path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlotFormat {
    Png,
    Svg,
}

impl PlotFormat {
    /// The format of `path` by its extension, once its folder is known to exist: a plot that
    /// could not be written is refused before the simulation, not after.
    pub(crate) fn check(path: &Path) -> Result<Self, Usage> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let format = match extension.as_deref() {
            Some("png") => PlotFormat::Png,
            Some("svg") => PlotFormat::Svg,
            _ => {
                return Err(Usage(format!(
                    "--plot {}: the plot file must end in .png or .svg",
                    path.display()
                )));
            }
        };
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if !folder.is_dir() {
            return Err(Usage(format!(
                "--plot {}: there is no folder {}",
                path.display(),
                folder.display()
            )));
        }
        Ok(format)
    }
}

/// Draws the report to `path`.
pub(crate) fn draw(report: &Report, path: &Path, format: PlotFormat) -> Result<()> {
    // The font is embedded so that a plot looks the same on a machine without fonts.
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| anyhow!("the embedded font could not be loaded"))?;
    plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold())
        .map_err(|_| anyhow!("the embedded font could not be loaded"))?;
    match format {
        PlotFormat::Png => {
            let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
            render(&root, report)?;
            root.present().context("cannot write the PNG file")
        }
        PlotFormat::Svg => {
            let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
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

/// A strategy's name in legends and captions, marked when its clusters were cut.
fn label(s: &StrategyReport) -> String {
    if s.sliced {
        format!("{} +slices", s.strategy)
    } else {
        s.strategy.to_string()
    }
}

/// A seed's balance: the median over its steps.
fn seed_balance(run: &SeedRun) -> f64 {
    let mut values: Vec<f64> = run.after.iter().map(|b| b.max_over_mean).collect();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(1.0)
}

fn render<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(plot_error)?;
    let (top, bottom) = root.split_vertically(HEIGHT * 9 / 20);
    draw_trade_off(&top, report)?;
    draw_loads(&bottom, report)
}

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
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 24).into_font().style(FontStyle::Bold))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            -x_max * 0.02..x_max * 1.05,
            1.0f64..y_max + (y_max - 1.0) * 0.05,
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
        .draw()
        .map_err(plot_error)?;
    for (i, s) in report.strategies.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(
                s.runs
                    .iter()
                    .map(|r| Circle::new((seed_x(r), seed_balance(r)), 3, color.mix(0.3).filled())),
            )
            .map_err(plot_error)?;
        let median = (median_x(s), s.balance.max_over_mean.median);
        chart
            .draw_series([Circle::new(median, 9, color.filled())])
            .map_err(plot_error)?
            .label(format!(
                "{}: max/mean {:.3}, moves {}",
                label(s),
                median.1,
                median.0.round()
            ))
            .legend(move |(x, y)| Circle::new((x, y), 6, color.filled()));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)
}

fn draw_loads<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let sliced = report.strategies.iter().any(|s| s.sliced);
    // With slicing, one more panel: balance and cache copies of every strategy.
    let count = (report.strategies.len() + usize::from(sliced)).max(1);
    let columns = count.min(3);
    let rows = count.div_ceil(columns);
    let (title_area, panels_area) = area.split_vertically(40);
    title_area
        .titled(
            &format!(
                "Load per shard, seed {}: before (light) and after (solid) the change; line: mean after",
                report.first_seed
            ),
            ("sans-serif", 20).into_font().style(FontStyle::Bold),
        )
        .map_err(plot_error)?;
    let panels = panels_area.split_evenly((rows, columns));
    let y_max = report
        .strategies
        .iter()
        .filter_map(|s| s.runs.first())
        .flat_map(|r| r.loads_before.iter().chain(&r.loads_after))
        .copied()
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    for (i, (s, panel)) in report.strategies.iter().zip(&panels).enumerate() {
        let Some(run) = s.runs.first() else {
            continue;
        };
        let color = PALETTE[i % PALETTE.len()];
        let shards = run.loads_before.len().max(run.loads_after.len()).max(1);
        let mut chart = ChartBuilder::on(panel)
            .caption(label(s), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..shards as f64, 0f64..y_max.max(1.0))
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(shards.min(20))
            .x_label_formatter(&|x| format!("{}", x.floor() as i64))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 13))
            .x_desc("shard")
            .draw()
            .map_err(plot_error)?;
        let bars = |loads: &[u64], offset: f64, style: ShapeStyle| {
            loads
                .iter()
                .enumerate()
                .map(move |(shard, &load)| {
                    let x = shard as f64 + offset;
                    Rectangle::new([(x, 0.0), (x + 0.38, load as f64)], style)
                })
                .collect::<Vec<_>>()
        };
        chart
            .draw_series(bars(&run.loads_before, 0.08, color.mix(0.35).filled()))
            .map_err(plot_error)?;
        chart
            .draw_series(bars(&run.loads_after, 0.5, color.filled()))
            .map_err(plot_error)?;
        let mean = run.loads_after.iter().sum::<u64>() as f64 / run.loads_after.len().max(1) as f64;
        chart
            .draw_series(LineSeries::new(
                [(0.0, mean), (shards as f64, mean)],
                BLACK.stroke_width(1),
            ))
            .map_err(plot_error)?;
    }
    if sliced && let Some(panel) = panels.get(report.strategies.len()) {
        draw_slicing(panel, report)?;
    }
    Ok(())
}

/// One bar per strategy: the median max/mean after the change, labelled with the median cache
/// copies it cost, so that slicing off and on read side by side.
fn draw_slicing<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let count = report.strategies.len().max(1);
    let y_max = report
        .strategies
        .iter()
        .map(|s| s.balance.max_over_mean.median)
        .fold(1.1f64, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Slicing: median max/mean (bar), cache copies (label)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..count as f64, 0f64..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 13))
        .y_desc("max / mean")
        .draw()
        .map_err(plot_error)?;
    for (i, s) in report.strategies.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let balance = s.balance.max_over_mean.median;
        let x = i as f64;
        let style = if s.sliced {
            color.filled()
        } else {
            color.mix(0.35).filled()
        };
        chart
            .draw_series([Rectangle::new([(x + 0.1, 0.0), (x + 0.9, balance)], style)])
            .map_err(plot_error)?;
        let text = if s.sliced {
            format!("{balance:.2} / {}", s.cache_copies.median.round())
        } else {
            format!("{balance:.2}")
        };
        chart
            .draw_series([Text::new(
                text,
                (x + 0.1, balance + y_max * 0.02),
                ("sans-serif", 12),
            )])
            .map_err(plot_error)?;
    }
    Ok(())
}
