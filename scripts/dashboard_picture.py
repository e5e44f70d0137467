#!/usr/bin/env python3
"""Draws a picture of the Grafana dashboard (charts/shardwise/dashboards/shardwise.json) from real
data: the series that the dashboard test (e2e/tests/dashboard.rs, with SHARDWISE_DASHBOARD_DATA)
or `make demo` queried from Prometheus while a fleet of replicas ran on the test API server. Everything shown
comes from the dashboard itself: grid, titles, panel types, units, decimals, thresholds and their
colors, legends (tables with their calculations and sort order). The drawing imitates Grafana's
dark theme with matplotlib; it is not a screenshot. `make dashboard-picture` runs the test and
this script; the demo runs it when Prometheus and matplotlib are installed.

Usage: dashboard_picture.py DATA.json OUTPUT.png
"""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch, Rectangle  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

DASHBOARD = Path(__file__).resolve().parent.parent / "charts" / "shardwise" / "dashboards" / "shardwise.json"
# Grafana's dark theme: canvas, panel, border, primary and secondary text, grid lines.
BACKGROUND, PANEL, BORDER, TEXT, MUTED, GRID = "#111217", "#181b1f", "#2a2d33", "#ccccdc", "#8e8ea0", "#24272c"
UNFILLED = "#22252b"  # the empty part of a bar gauge
# Grafana's classic palette, in its order, and the named colors of thresholds.
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d"]
NAMED = {"green": "#73bf69", "yellow": "#fade2a", "orange": "#ff9830", "red": "#f2495c", "blue": "#5794f2"}
# Column headers of legend calculations, as Grafana names them.
CALCS = {"lastNotNull": "Last *", "last": "Last", "max": "Max", "min": "Min", "mean": "Mean"}
UNIT_HEIGHT = 0.32  # inches per grid row (Grafana: 30 px)
WIDTH = 20.0  # inches for the 24 grid columns
HEADER = 0.6  # inches: the dashboard's title and variables


def natural(text: str) -> list[Any]:
    """Sort key that puts "shard 10" after "shard 9"."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or "value"


def color(name: str) -> str:
    return NAMED.get(name, name)


def formatter(defaults: dict[str, Any]):
    """Grafana's display of a value in the field's unit, with its decimals if set."""
    unit, decimals = defaults.get("unit", "short"), defaults.get("decimals")

    def number(v: float) -> str:
        if math.isnan(v):
            return "NaN"
        if decimals is not None:
            return f"{v:.{decimals}f}"
        if v != 0 and abs(v) < 0.01:
            return f"{v:.2g}"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"

    def short(v: float) -> str:
        for scale, suffix in ((1e9, " Bil"), (1e6, " Mil"), (1e3, " K")):
            if abs(v) >= scale:
                return f"{v / scale:.3g}{suffix}"
        return number(v)

    def seconds(v: float) -> str:
        return f"{number(v * 1e3)} ms" if 0 < abs(v) < 1 else f"{number(v)} s"

    def mebibytes(v: float) -> str:
        return f"{v / 2**20:.3g} MiB" if abs(v) < 2**30 else f"{v / 2**30:.3g} GiB"

    if unit.startswith("suffix:"):
        return lambda v: number(v) + unit.removeprefix("suffix:")
    units = {
        "bytes": mebibytes,
        "s": seconds,
        "percentunit": lambda v: f"{number(v * 100)}%",
        "ops": lambda v: f"{short(v)} ops/s",
        "reqps": lambda v: f"{short(v)} req/s",
        "none": number,
    }
    return units.get(unit, short)


def threshold_color(defaults: dict[str, Any], value: float, highest: float) -> str:
    """The color of the last threshold step at or below `value`; percentage steps are relative to
    the field's min and max (Grafana computes an unset max from every value of the panel)."""
    thresholds = defaults["thresholds"]
    if thresholds["mode"] == "percentage":
        low, high = defaults.get("min", 0), defaults.get("max", highest)
        value = (value - low) / (high - low) * 100 if high > low else 100
    chosen = thresholds["steps"][0]["color"]
    for step in thresholds["steps"][1:]:
        if not math.isnan(value) and value >= step["value"]:
            chosen = step["color"]
    return color(chosen)


def last(values: list[float]) -> float:
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def series(panel: dict[str, Any], data: dict[str, Any]) -> list[tuple[str, list[datetime], list[float]]]:
    """Every series of the panel's queries, in query order, each query's sorted by name."""
    out = []
    for target in data["targets"]:
        of_target = []
        for s in target["result"]:
            times = [datetime.fromtimestamp(float(t), tz=timezone.utc) for t, _ in s["values"]]
            values = [float(v) for _, v in s["values"]]
            of_target.append((legend(target["legendFormat"], s["metric"]), times, values))
        out.extend(sorted(of_target, key=lambda item: natural(item[0])))
    return out


class Layout:
    """Grafana's grid (24 columns, rows of UNIT_HEIGHT) in inches from the top-left corner."""

    def __init__(self, fig: plt.Figure) -> None:
        self.fig = fig

    def rect(self, left: float, top: float, width: float, height: float) -> tuple[float, float, float, float]:
        """Inches from the top-left corner to a figure fraction rectangle."""
        fw, fh = self.fig.get_figwidth(), self.fig.get_figheight()
        return (left / fw, 1 - (top + height) / fh, width / fw, height / fh)

    def axes(self, left: float, top: float, width: float, height: float) -> plt.Axes:
        """Axes over an area in inches, with coordinates in inches from its top-left corner."""
        ax = self.fig.add_axes(self.rect(left, top, width, height))
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
        ax.set_axis_off()
        return ax

    def panel(self, grid: dict[str, int], title: str) -> tuple[float, float, float, float]:
        """Draws the panel's frame and title; returns its body in inches (left, top, width, height)."""
        gap = 0.05
        left, width = grid["x"] / 24 * WIDTH + gap, grid["w"] / 24 * WIDTH - 2 * gap
        top, height = HEADER + grid["y"] * UNIT_HEIGHT + gap, grid["h"] * UNIT_HEIGHT - 2 * gap
        frame = self.axes(left, top, width, height)
        frame.add_patch(
            FancyBboxPatch(
                (0.01, 0.01),
                width - 0.02,
                height - 0.02,
                boxstyle="round,pad=0,rounding_size=0.03",
                facecolor=PANEL,
                edgecolor=BORDER,
                linewidth=0.8,
            )
        )
        frame.text(0.1, 0.17, title, color=TEXT, fontsize=9.5, va="center")
        return left + 0.08, top + 0.34, width - 0.16, height - 0.42


def draw_stat(layout: Layout, area: tuple[float, ...], panel: dict[str, Any], data: dict[str, Any]) -> None:
    left, top, width, height = area
    ax = layout.axes(left, top, width, height)
    defaults, options = panel["fieldConfig"]["defaults"], panel["options"]
    fmt = formatter(defaults)
    shown = [(name, last(values)) for name, _, values in series(panel, data)]
    highest = max((v for _, v in shown if not math.isnan(v)), default=0.0)
    mode, background = options["textMode"], options["colorMode"] == "background"
    cell = width / max(len(shown), 1)
    for i, (name, value) in enumerate(shown):
        x = (i + 0.5) * cell
        tint = threshold_color(defaults, value, highest)
        if background:
            ax.add_patch(
                FancyBboxPatch(
                    (i * cell + 0.04, 0.02),
                    cell - 0.08,
                    height - 0.06,
                    boxstyle="round,pad=0,rounding_size=0.03",
                    facecolor=tint,
                    edgecolor="none",
                )
            )
        ink = "#ffffff" if background else tint
        if mode == "name":
            ax.text(x, height / 2, name, color=ink, fontsize=22, fontweight="bold", ha="center", va="center")
        else:
            label = "#ffffff" if background else TEXT
            ax.text(x, height * 0.25, name, color=label, fontsize=10, ha="center", va="center")
            ax.text(x, height * 0.62, fmt(value), color=ink, fontsize=24, fontweight="bold", ha="center", va="center")


def draw_bargauge(layout: Layout, area: tuple[float, ...], panel: dict[str, Any], data: dict[str, Any]) -> None:
    """Horizontal bars, the name on the left and the value on the right, both as Grafana places them."""
    left, top, width, height = area
    ax = layout.axes(left, top, width, height)
    defaults = panel["fieldConfig"]["defaults"]
    fmt = formatter(defaults)
    bars = [(name, last(values)) for name, _, values in series(panel, data)]
    low, high = defaults.get("min", 0), defaults.get("max", max((v for _, v in bars), default=1.0))
    pitch = min((height - 0.05) / max(len(bars), 1), 0.55)
    name_width, value_width = 1.1, 0.9
    for i, (name, value) in enumerate(bars):
        y = 0.05 + i * pitch
        bar = pitch * 0.78
        track = width - name_width - value_width
        tint = threshold_color(defaults, value, high)
        share = 0.0 if math.isnan(value) else min(max((value - low) / (high - low), 0.0), 1.0)
        ax.text(0.02, y + bar / 2, name, color=TEXT, fontsize=9.5, va="center")
        ax.add_patch(Rectangle((name_width, y), track, bar, facecolor=UNFILLED, edgecolor="none"))
        ax.add_patch(Rectangle((name_width, y), track * share, bar, facecolor=tint, edgecolor="none", alpha=0.9))
        ax.text(
            width - 0.05, y + bar / 2, fmt(value), color=tint, fontsize=13, fontweight="bold", ha="right", va="center"
        )


def draw_timeseries(
    layout: Layout, area: tuple[float, ...], panel: dict[str, Any], data: dict[str, Any]
) -> None:
    left, top, width, height = area
    defaults, options = panel["fieldConfig"]["defaults"], panel["options"]
    fmt = formatter(defaults)
    lines = series(panel, data)
    legend_options = options["legend"]
    on_right = legend_options["showLegend"] and legend_options["placement"] == "right"
    table = legend_table(lines, legend_options, fmt) if on_right else None
    legend_width = min(table_width(table), 0.5 * width) if table else 0.0
    # Room for the value axis on the left and the time axis below.
    ax = layout.fig.add_axes(layout.rect(left + 0.62, top + 0.02, width - legend_width - 0.72, height - 0.3))
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    custom = defaults["custom"]
    step = custom["lineInterpolation"] == "stepAfter"
    highest = 0.0
    for i, (name, times, values) in enumerate(lines):
        ax.plot(
            times,
            values,
            color=PALETTE[i % len(PALETTE)],
            linewidth=1.2,
            drawstyle="steps-post" if step else "default",
            clip_on=False,
        )
        highest = max([highest, *(v for v in values if not math.isnan(v))])
    bottom = defaults.get("min", 0)
    ax.set_ylim(bottom, highest * 1.15 if highest > bottom else bottom + 1)
    if custom["thresholdsStyle"]["mode"] == "dashed":
        for threshold in defaults["thresholds"]["steps"][1:]:
            ax.axhline(threshold["value"], color=color(threshold["color"]), linewidth=1, linestyle=(0, (4, 3)))
        ax.set_ylim(bottom, max(ax.get_ylim()[1], defaults["thresholds"]["steps"][-1]["value"] * 1.05))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.yaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.tick_params(colors=MUTED, labelsize=7, length=0)
    ax.grid(color=GRID, linewidth=0.6)
    if table:
        draw_legend_table(layout, (left + width - legend_width, top, legend_width, height), table)


CHAR = 0.058  # inches per character of legend text (7.5 pt)


def legend_table(lines: list[tuple[str, list[datetime], list[float]]], options: dict[str, Any], fmt) -> dict[str, Any]:
    """A legend table's cells: a color and name per series, a formatted value per calculation,
    rows in the legend's sort order."""
    calcs = options["calcs"]
    reducers = {"lastNotNull": last, "max": lambda v: max((x for x in v if not math.isnan(x)), default=math.nan)}
    rows = [
        (PALETTE[i % len(PALETTE)], name, [reducers[c](values) for c in calcs])
        for i, (name, _, values) in enumerate(lines)
    ]
    headers = [CALCS[c] for c in calcs]
    if "sortBy" in options:
        column = headers.index(options["sortBy"])
        rows.sort(key=lambda row: -math.inf if math.isnan(row[2][column]) else row[2][column])
        if options.get("sortDesc"):
            rows.reverse()
        headers[column] += " ↓"
    cells = [(swatch, name, [fmt(v) for v in values]) for swatch, name, values in rows]
    widths = [CHAR * max([len(h), *(len(c[2][j]) for c in cells)]) + 0.2 for j, h in enumerate(headers)]
    names = CHAR * max((len(name) for _, name, _ in cells), default=0) + 0.45
    return {"headers": headers, "rows": cells, "widths": widths, "names": names}


def table_width(table: dict[str, Any]) -> float:
    return table["names"] + sum(table["widths"])


def draw_legend_table(layout: Layout, area: tuple[float, ...], table: dict[str, Any]) -> None:
    """The legend table: a color swatch and name per series, a column per calculation."""
    left, top, width, height = area
    ax = layout.axes(left, top, width, height)
    ends = [width - sum(table["widths"][j + 1 :]) - 0.04 for j in range(len(table["widths"]))]
    for end, header in zip(ends, table["headers"]):
        ax.text(end, 0.08, header, color=MUTED, fontsize=7, ha="right", va="center")
    pitch = 0.19
    fitting = int((height - 0.2) / pitch)
    rows = table["rows"]
    for i, (swatch, name, values) in enumerate(rows[:fitting]):
        y = 0.3 + i * pitch
        ax.add_patch(Rectangle((0.08, y - 0.015), 0.16, 0.03, facecolor=swatch, edgecolor="none"))
        ax.text(0.3, y, name, color=TEXT, fontsize=7.5, va="center")
        for end, value in zip(ends, values):
            ax.text(end, y, value, color=TEXT, fontsize=7.5, ha="right", va="center")
    if len(rows) > fitting:
        ax.text(0.3, 0.3 + fitting * pitch, f"+{len(rows) - fitting} more", color=MUTED, fontsize=7, va="center")


DRAW = {"stat": draw_stat, "bargauge": draw_bargauge, "timeseries": draw_timeseries}


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(sys.argv[1]).read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {p["id"]: p for p in data["panels"]}
    total_rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    fig = plt.figure(figsize=(WIDTH, HEADER + total_rows * UNIT_HEIGHT + 0.35), facecolor=BACKGROUND)
    layout = Layout(fig)
    header = layout.axes(0, 0, WIDTH, HEADER)
    header.text(0.1, 0.3, dashboard["title"], color=TEXT, fontsize=15, fontweight="bold", va="center")
    x = 1.5
    for label, value in (("Data source", "Prometheus"), ("Namespace", "shardwise"), ("Shard", "All")):
        header.add_patch(Rectangle((x, 0.15), 0.1 + 0.085 * len(label), 0.3, facecolor="#22252b", edgecolor=BORDER))
        header.text(x + 0.05, 0.3, label, color=TEXT, fontsize=9, va="center")
        x += 0.1 + 0.085 * len(label)
        header.add_patch(Rectangle((x, 0.15), 1.1, 0.3, facecolor=BACKGROUND, edgecolor=BORDER))
        header.text(x + 0.08, 0.3, value, color=TEXT, fontsize=9, va="center")
        x += 1.3
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        if panel["type"] == "row":
            row = layout.axes(0, HEADER + grid["y"] * UNIT_HEIGHT, WIDTH, grid["h"] * UNIT_HEIGHT)
            title = "⌄  " + panel["title"]
            row.text(0.08, UNIT_HEIGHT / 2, title, color=TEXT, fontsize=11, fontweight="bold", va="center")
            continue
        area = layout.panel(grid, panel["title"])
        DRAW[panel["type"]](layout, area, panel, exported[panel["id"]])
    start = datetime.fromtimestamp(data["start"], tz=timezone.utc)
    minutes = (data["end"] - data["start"]) / 60
    fig.text(
        0.005,
        0.12 / fig.get_figheight(),
        f"Real data, drawn by scripts/dashboard_picture.py: the dashboard's queries on Prometheus, which scraped "
        f"the replicas of {data['source']} ({minutes:.1f} minutes from {start:%Y-%m-%d %H:%M} UTC). "
        f"Not a Grafana screenshot.",
        color=MUTED,
        fontsize=8,
    )
    fig.savefig(sys.argv[2], dpi=80, facecolor=BACKGROUND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
