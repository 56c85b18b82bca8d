"""TTFT, TPOT and ITL over time while a test runs: p50 and p99 of each --interval-s period,
from the same interval histograms the .hlog files hold, for the last MAX_POINTS periods, and
under them the server's queue and KV-cache usage where its metrics are scraped
(loadgen/server_metrics.py); that as an SVG chart (the web UI's Latency (HDR) tab shows it
live; Locust's --html report carries it). The whole run over time is `analysis report`'s
over_time.png.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from html import escape

from loadgen.recording.histograms import Histogram

METRICS = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "itl": "ITL (ms)"}
MAX_POINTS = 900  # 15 minutes at the default 1 s interval
WIDTH, PANEL_H, LEFT, TOP, BOTTOM = 720, 150, 64, 26, 22  # px
COLORS = {"p50": "#1f77b4", "p99": "#d62728"}
# the server's panels: title -> {gauge (records/engine_maps.py LIVE): (label, colour, scale)}
SERVER_PANELS = {
    "server: requests waiting (red) and running (blue)": {"waiting": ("waiting", "#d62728", 1.0),
                                             "running": ("running", "#1f77b4", 1.0)},
    "server: KV-cache usage (%)": {"kv_usage": ("KV usage", "#2ca02c", 100.0)},
}


@dataclass(frozen=True)
class Figures:
    count: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class Point:
    t_s: float  # end of the period, seconds since the run began
    figures: dict[str, Figures]  # by METRICS key
    server: dict[str, float]  # the server's latest gauges, by concept ({} where none)


class Timeline:
    def __init__(self, interval_s: float, max_points: int = MAX_POINTS):
        self.interval_s = interval_s
        self.points: deque[Point] = deque(maxlen=max_points)

    def add(self, t_s: float, interval: dict[str, Histogram],
            server: dict[str, float] | None = None) -> None:
        """One period's histograms (the recorder's, as taken for the .hlog files) and the
        server's gauges at its end."""
        figures = {}
        for name in METRICS:
            h = interval[name]
            values = h.percentiles_us([50.0, 99.0]) if h.count else {}
            figures[name] = Figures(h.count, *(values[p] / 1000 if values else None
                                               for p in (50.0, 99.0)))
        self.points.append(Point(t_s, figures, server or {}))

    def svg(self) -> str:
        """A panel per metric, p50 and p99 per period over the run's time; then the server's
        panels that have a value."""
        points = list(self.points)
        panels = [(title, {key: (COLORS[key], [getattr(p.figures[name], f"{key}_ms")
                                               for p in points]) for key in COLORS})
                  for name, title in METRICS.items()]
        for title, gauges in SERVER_PANELS.items():
            lines = {label: (color, [p.server[g] * scale if g in p.server else None
                                     for p in points])
                     for g, (label, color, scale) in gauges.items()}
            if any(v is not None for _, values in lines.values() for v in values):
                panels.append((title, lines))
        height = TOP + len(panels) * (PANEL_H + BOTTOM)
        last = f", the last {len(points)}" if len(points) == self.points.maxlen else ""
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
                 f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
                 f'<text x="{LEFT}" y="14" font-size="12">each {self.interval_s:g} s period'
                 f'{last}: <tspan fill="{COLORS["p50"]}">p50</tspan> '
                 f'<tspan fill="{COLORS["p99"]}">p99</tspan></text>']
        for i, (title, lines) in enumerate(panels):
            parts.append(_panel([p.t_s for p in points], lines, title,
                                TOP + i * (PANEL_H + BOTTOM)))
        parts.append("</svg>")
        return "".join(parts)


def _panel(times: list[float], lines: dict[str, tuple[str, list[float | None]]], title: str,
           top: float) -> str:
    """One panel: axes from 0 to the highest value shown, each line (label -> its colour and a
    value per period) broken where a period had none."""
    plot_w, plot_h = WIDTH - LEFT - 10, PANEL_H - 18
    y0 = top + 16
    highs = [v for _, values in lines.values() for v in values if v is not None]
    out = [f'<text x="{LEFT}" y="{top + 10}" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{plot_h}" fill="none" '
           'stroke="#bbb"/>']
    if not highs:
        out.append(f'<text x="{LEFT + 8}" y="{y0 + plot_h / 2}" fill="#777">no samples yet</text>')
        return "".join(out)
    y_max = _nice(max(highs))
    t_first, t_last = times[0], times[-1]
    span = max(t_last - t_first, 1e-9)

    def x(t: float) -> float:
        return LEFT + (t - t_first) / span * plot_w

    def y(v: float) -> float:
        return y0 + plot_h - v / y_max * plot_h

    for color, values in lines.values():
        runs, run = [], []
        for t, value in zip(times, values, strict=True):
            if value is None:
                runs.append(run)
                run = []
            else:
                run.append(f"{x(t):.1f},{y(value):.1f}")
        runs.append(run)
        for r in runs:
            if len(r) == 1:
                cx, cy = r[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{color}"/>')
            elif r:
                out.append(f'<polyline points="{" ".join(r)}" fill="none" '
                           f'stroke="{color}" stroke-width="1.5"/>')
    out += [f'<text x="{LEFT - 6}" y="{y0 + 4}" text-anchor="end">{y_max:g}</text>',
            f'<text x="{LEFT - 6}" y="{y0 + plot_h}" text-anchor="end">0</text>',
            f'<text x="{LEFT}" y="{y0 + plot_h + 14}">{t_first:.0f} s</text>',
            f'<text x="{LEFT + plot_w}" y="{y0 + plot_h + 14}" text-anchor="end">'
            f'{t_last:.0f} s</text>']
    return "".join(out)


def _nice(value: float) -> float:
    """The axis top: value rounded up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    step = 10.0 ** int(f"{value:e}".split("e")[1])
    for m in (1, 2, 5, 10):
        if value <= m * step:
            return m * step
    return 10 * step
