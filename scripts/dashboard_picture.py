#!/usr/bin/env python3
"""Draws a picture of the Grafana dashboard (charts/shardwise/dashboards/shardwise.json) from real
data: the series that the dashboard test (e2e/tests/dashboard.rs, with SHARDWISE_DASHBOARD_DATA)
queried from Prometheus while a fleet of replicas ran on the test API server. Panels, layout,
titles, legends and units come from the dashboard itself; the drawing is matplotlib's, not
Grafana's. `make dashboard-picture` runs the test and this script.

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
from matplotlib.ticker import FuncFormatter  # noqa: E402

DASHBOARD = Path(__file__).resolve().parent.parent / "charts" / "shardwise" / "dashboards" / "shardwise.json"
BACKGROUND, PANEL, TEXT, MUTED, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9e", "#2c3235"
# Grafana's classic palette, in its order.
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d"]
UNIT_HEIGHT = 0.32  # inches per grid row (Grafana: 30 px)
WIDTH = 20.0  # inches for the 24 grid columns


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or "value"


def formatter(unit: str):
    def short(v: float) -> str:
        if abs(v) >= 1e6:
            return f"{v / 1e6:.3g}M"
        if abs(v) >= 1e3:
            return f"{v / 1e3:.3g}k"
        return f"{v:.3g}"

    units = {
        "bytes": lambda v: f"{v / 2**20:.3g} MiB",
        "s": lambda v: f"{v * 1e3:.3g} ms" if abs(v) < 1 else f"{v:.3g} s",
        "percentunit": lambda v: f"{v * 100:.3g}%",
        "ops": lambda v: f"{short(v)}/s",
        "reqps": lambda v: f"{short(v)} req/s",
    }
    return units.get(unit, short)


def series(result: list[dict[str, Any]], template: str) -> list[tuple[str, list[datetime], list[float]]]:
    out = []
    for s in result:
        times = [datetime.fromtimestamp(float(t), tz=timezone.utc) for t, _ in s["values"]]
        values = [float(v) for _, v in s["values"]]
        out.append((legend(template, s["metric"]), times, values))
    return sorted(out, key=lambda item: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", item[0])])


class Layout:
    """Grafana's grid (24 columns, rows of UNIT_HEIGHT) in figure coordinates."""

    def __init__(self, fig: plt.Figure, top: float) -> None:
        self.fig, self.top = fig, top

    def rect(self, left: float, top: float, width: float, height: float) -> tuple[float, float, float, float]:
        """Inches from the top-left corner to a figure fraction rectangle."""
        fw, fh = self.fig.get_figwidth(), self.fig.get_figheight()
        return (left / fw, 1 - (top + height) / fh, width / fw, height / fh)

    def panel(self, grid: dict[str, int], title: str) -> tuple[float, float, float, float]:
        """Draws the panel's frame and title; returns its area in inches (left, top, width, height)."""
        gap = 0.04
        left, width = grid["x"] / 24 * WIDTH + gap, grid["w"] / 24 * WIDTH - 2 * gap
        top, height = self.top + grid["y"] * UNIT_HEIGHT + gap, grid["h"] * UNIT_HEIGHT - 2 * gap
        frame = self.fig.add_axes(self.rect(left, top, width, height))
        frame.set_facecolor(PANEL)
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color(GRID)
        frame.text(
            0.08 / width,
            1 - 0.17 / height,
            title,
            color=TEXT,
            fontsize=9,
            fontweight="bold",
            va="center",
            transform=frame.transAxes,
        )
        return left, top, width, height


def draw_stat(
    layout: Layout, area: tuple[float, float, float, float], panel: dict[str, Any], data: dict[str, Any]
) -> None:
    left, top, width, height = area
    ax = layout.fig.add_axes(layout.rect(left, top + 0.3, width, height - 0.3))
    ax.set_axis_off()
    fmt = formatter(panel["fieldConfig"]["defaults"].get("unit", "short"))
    decimals = panel["fieldConfig"]["defaults"].get("decimals")
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    shown = []
    for target in data["targets"]:
        for name, _, values in series(target["result"], target["legendFormat"]):
            last = next((v for v in reversed(values) if not math.isnan(v)), math.nan)
            color = steps[0]["color"]
            for step in steps[1:]:
                if last >= step["value"]:
                    color = step["color"]
            text = f"{last:.{decimals}f}" if decimals is not None else fmt(last)
            shown.append(
                (name, text, {"green": COLORS[0], "yellow": COLORS[1], "red": COLORS[4]}.get(color, color))
            )
    name_only = panel["options"].get("textMode") == "name"
    for i, (name, text, color) in enumerate(shown):
        x = (i + 0.5) / len(shown)
        if name_only:
            ax.text(x, 0.45, name, color=color, fontsize=20, fontweight="bold", ha="center", va="center")
        else:
            ax.text(x, 0.75, name, color=MUTED, fontsize=9, ha="center", va="center")
            ax.text(x, 0.35, text, color=color, fontsize=20, fontweight="bold", ha="center", va="center")


def draw_timeseries(
    layout: Layout, area: tuple[float, float, float, float], panel: dict[str, Any], data: dict[str, Any]
) -> None:
    left, top, width, height = area
    # Room for the title above, the value axis on the left, the time axis and legend below.
    ax = layout.fig.add_axes(layout.rect(left + 0.75, top + 0.35, width - 0.9, height - 0.95))
    ax.set_facecolor(PANEL)
    for spine in ax.spines.values():
        spine.set_visible(False)
    defaults = panel["fieldConfig"]["defaults"]
    step = defaults["custom"].get("lineInterpolation") == "stepAfter"
    lines = [s for target in data["targets"] for s in series(target["result"], target["legendFormat"])]
    highest = 0.0
    for i, (name, times, values) in enumerate(lines):
        ax.plot(
            times,
            values,
            color=COLORS[i % len(COLORS)],
            linewidth=1.3,
            label=name,
            clip_on=False,
            drawstyle="steps-post" if step else "default",
        )
        highest = max([highest, *(v for v in values if not math.isnan(v))])
    bottom = defaults.get("min", 0)
    ax.set_ylim(bottom, max(highest * 1.15, bottom + 1e-9) if highest > bottom else bottom + 1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: formatter(defaults.get("unit", "short"))(v)))
    ax.yaxis.set_major_locator(plt.MaxNLocator(4))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    ax.xaxis.set_major_locator(plt.MaxNLocator(6))
    ax.tick_params(colors=MUTED, labelsize=7, length=0)
    ax.grid(color=GRID, linewidth=0.6)
    legend_at = layout.rect(left + 0.05, top + height - 0.3, width, 0.3)
    ax.legend(
        loc="center left",
        bbox_to_anchor=legend_at,
        bbox_transform=layout.fig.transFigure,
        ncol=min(len(lines), 8),
        fontsize=7.5,
        frameon=False,
        labelcolor=TEXT,
        handlelength=1.2,
        columnspacing=1.5,
    )


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(sys.argv[1]).read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    exported = {p["id"]: p for p in data["panels"]}
    total_rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    top = 0.6  # inches: the dashboard's title bar
    fig = plt.figure(figsize=(WIDTH, top + total_rows * UNIT_HEIGHT + 0.35), facecolor=BACKGROUND)
    height = fig.get_figheight()
    fig.text(
        0.005, 1 - 0.3 / height, dashboard["title"], color=TEXT, fontsize=15, fontweight="bold", va="center"
    )
    fig.text(
        0.08, 1 - 0.3 / height, "Namespace  shardwise      Shard  All", color=MUTED, fontsize=10, va="center"
    )
    layout = Layout(fig, top)
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        if panel["type"] == "row":
            y = 1 - (top + (grid["y"] + 0.5) * UNIT_HEIGHT) / height
            fig.text(0.005, y, panel["title"], color=TEXT, fontsize=11, fontweight="bold", va="center")
            continue
        area = layout.panel(grid, panel["title"])
        draw = draw_stat if panel["type"] == "stat" else draw_timeseries
        draw(layout, area, panel, exported[panel["id"]])
    start = datetime.fromtimestamp(data["start"], tz=timezone.utc)
    minutes = (data["end"] - data["start"]) / 60
    fig.text(
        0.005,
        0.12 / height,
        f"Real data, drawn by scripts/dashboard_picture.py: the dashboard's queries on Prometheus, which scraped "
        f"the replicas of e2e/tests/dashboard.rs ({minutes:.1f} minutes from {start:%Y-%m-%d %H:%M} UTC: 3 replicas, "
        f"scaled to 4, replica 1 partitioned until it fenced, then 12 invalid apps). Not a Grafana screenshot.",
        color=MUTED,
        fontsize=8,
    )
    fig.savefig(sys.argv[2], dpi=80, facecolor=BACKGROUND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
