"""TTFT, TPOT and ITL over time while a test runs: p50 and p99 of each --interval-s period,
from the same interval histograms the .hlog files hold, for the last MAX_POINTS periods, and
under them the server's queue and KV-cache usage where its metrics are scraped
(loadgen/server_metrics.py); that as an SVG chart (the web UI's Latency (HDR) tab shows it
live; Locust's --html report carries it). The whole run over time is `analysis report`'s
over_time.png.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from html import escape

from loadgen.recording.histograms import Histogram

METRICS = {"ttft": "TTFT (ms)", "tpot": "TPOT (ms)", "itl": "ITL (ms)"}
MAX_POINTS = 900  # 15 minutes at the default 1 s interval
WIDTH, MIN_WIDTH, MAX_WIDTH = 720, 480, 2400  # px: the default, and what a page may ask for
PANEL_H, LEFT, RIGHT, TOP, BOTTOM = 170, 56, 12, 28, 26  # px
COLORS = {"p50": "#1f77b4", "p99": "#d62728"}
GAP_FILL = "#eee"  # a period in which the metric had no sample
GRID = "#e4e4e4"
# the server's panels: title -> {gauge (records/engine_maps.py LIVE): (label, colour, scale)}
SERVER_PANELS = {
    "server: requests waiting (red) and running (blue)": {"waiting": ("waiting", "#d62728", 1.0),
                                             "running": ("running", "#1f77b4", 1.0)},
    "server: KV-cache usage (%)": {"kv_usage": ("KV usage", "#2ca02c", 100.0)},
}
TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
Y_TICKS = 4  # at most this many steps up the value axis


@dataclass(frozen=True)
class PeriodFigures:
    count: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class Point:
    t_s: float  # end of the period, seconds since the run began
    figures: dict[str, PeriodFigures]  # by METRICS key
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
            figures[name] = PeriodFigures(h.count, *(values[p] / 1000 if values else None
                                               for p in (50.0, 99.0)))
        self.points.append(Point(t_s, figures, server or {}))

    def svg(self, width: int = WIDTH) -> str:
        """A panel per metric, p50 and p99 per period over the run's time, the periods without a
        sample shaded; then the server's panels that have a value. width: in px, as the page
        has room (clamped to MIN_WIDTH..MAX_WIDTH)."""
        width = min(max(int(width), MIN_WIDTH), MAX_WIDTH)
        points = list(self.points)
        panels = [(title, {key: (COLORS[key], [getattr(p.figures[name], f"{key}_ms")
                                               for p in points]) for key in COLORS},
                   [p.figures[name].count == 0 for p in points])
                  for name, title in METRICS.items()]
        for title, gauges in SERVER_PANELS.items():
            lines = {label: (color, [p.server[g] * scale if g in p.server else None
                                     for p in points])
                     for g, (label, color, scale) in gauges.items()}
            if any(v is not None for _, values in lines.values() for v in values):
                panels.append((title, lines, [False] * len(points)))
        height = TOP + len(panels) * (PANEL_H + BOTTOM)
        last = f", the last {len(points)}" if len(points) == self.points.maxlen else ""
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
                 f'<text x="{LEFT}" y="16" font-size="13">each {self.interval_s:g} s period'
                 f'{last}: <tspan fill="{COLORS["p50"]}">p50</tspan> '
                 f'<tspan fill="{COLORS["p99"]}">p99</tspan>; '
                 f'<tspan fill="#888">shaded: no sample in the period</tspan></text>']
        axis = _TimeAxis([p.t_s for p in points], self.interval_s, LEFT, width - RIGHT)
        for i, (title, lines, empty) in enumerate(panels):
            parts.append(_panel(axis, lines, empty, title, TOP + i * (PANEL_H + BOTTOM)))
        parts.append("</svg>")
        return "".join(parts)


@dataclass(frozen=True)
class _TimeAxis:
    """The x axis: each period drawn at its middle, from the start of the first period kept to
    the end of the last."""

    ends_s: list[float]  # each period's end, seconds since the run began
    interval_s: float
    left: float
    right: float

    @property
    def start_s(self) -> float:
        return self.ends_s[0] - self.interval_s if self.ends_s else 0.0

    @property
    def end_s(self) -> float:
        return self.ends_s[-1] if self.ends_s else self.interval_s

    def x(self, t_s: float) -> float:
        span = max(self.end_s - self.start_s, 1e-9)
        return self.left + (t_s - self.start_s) / span * (self.right - self.left)

    def middles(self) -> list[float]:
        return [self.x(t - self.interval_s / 2) for t in self.ends_s]

    def ticks(self) -> list[float]:
        """Whole multiples of a step from TIME_STEPS_S, about one per 100 px."""
        span = self.end_s - self.start_s
        wanted = max((self.right - self.left) / 100, 1)
        step = next((s for s in TIME_STEPS_S if span / s <= wanted), TIME_STEPS_S[-1])
        first = -(-self.start_s // step) * step
        return [first + i * step for i in range(int((self.end_s - first) // step) + 1)]


def _panel(axis: _TimeAxis, lines: dict[str, tuple[str, list[float | None]]], empty: list[bool],
           title: str, top: float) -> str:
    """One panel: a value axis from 0 up to the highest value shown, gridded; the periods in
    `empty` shaded; each line (label -> its colour and a value per period) broken there."""
    plot_h = PANEL_H - 20
    y0 = top + 18
    plot_w = axis.right - axis.left
    highs = [v for _, values in lines.values() for v in values if v is not None]
    out = [f'<text x="{axis.left}" y="{top + 12}" font-weight="bold">{escape(title)}</text>']
    if not highs:
        out += [f'<rect x="{axis.left}" y="{y0}" width="{plot_w}" height="{plot_h}" '
                'fill="none" stroke="#bbb"/>',
                f'<text x="{axis.left + 8}" y="{y0 + plot_h / 2}" fill="#777">'
                'no samples yet</text>']
        return "".join(out)
    y_max, y_step = _value_axis(max(highs))

    def y(v: float) -> float:
        return y0 + plot_h - v / y_max * plot_h

    for t, is_empty in zip(axis.ends_s, empty, strict=True):
        if is_empty:
            x_from = axis.x(t - axis.interval_s)
            out.append(f'<rect x="{x_from:.1f}" y="{y0}" width="{axis.x(t) - x_from:.1f}" '
                       f'height="{plot_h}" fill="{GAP_FILL}"/>')
    for i in range(round(y_max / y_step) + 1):
        v = i * y_step
        out += [f'<line x1="{axis.left}" x2="{axis.right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                f'stroke="{GRID}"/>',
                f'<text x="{axis.left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                f'{_number(v)}</text>']
    for t in axis.ticks():
        out += [f'<line x1="{axis.x(t):.1f}" x2="{axis.x(t):.1f}" y1="{y0}" '
                f'y2="{y0 + plot_h + 4}" stroke="{GRID}"/>',
                f'<text x="{axis.x(t):.1f}" y="{y0 + plot_h + 16}" text-anchor="middle">'
                f'{_clock(t)}</text>']
    out.append(f'<rect x="{axis.left}" y="{y0}" width="{plot_w}" height="{plot_h}" fill="none" '
               'stroke="#bbb"/>')
    middles = axis.middles()
    for color, values in lines.values():
        out += _line([None if v is None else (x, y(v))
                      for x, v in zip(middles, values, strict=True)], color)
    return "".join(out)


def _line(points: list[tuple[float, float] | None], color: str) -> list[str]:
    """A line through the points, in pieces broken at each None; a piece of one point is a
    dot."""
    runs, run = [], []
    for point in points:
        if point is None:
            runs.append(run)
            run = []
        else:
            run.append(f"{point[0]:.1f},{point[1]:.1f}")
    runs.append(run)
    out = []
    for r in runs:
        if len(r) == 1:
            cx, cy = r[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
        elif r:
            out.append(f'<polyline points="{" ".join(r)}" fill="none" '
                       f'stroke="{color}" stroke-width="1.5"/>')
    return out


def _value_axis(high: float) -> tuple[float, float]:
    """The axis top and its step: a 1, 2 or 5 times a power of ten step, at most Y_TICKS of
    them up to the first multiple at or above high."""
    if high <= 0:
        return 1.0, 0.25
    raw = high / Y_TICKS
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    return math.ceil(high / step - 1e-9) * step, step


def _number(v: float) -> str:
    return f"{v:.4g}"


def _clock(t_s: float) -> str:
    """Seconds as the axis writes them: 45 s, 1:30, 1:00:00."""
    whole = int(round(t_s))
    if whole < 60:
        return f"{whole} s"
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
