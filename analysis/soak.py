"""Soak: does a long run drift? p99 TTFT and p99 TPOT, server RSS and queue depth per window,
each with an ordinary least squares trend over time, its 95% confidence interval and a verdict.

Windows: --window-s of the run after its warm-up (the last window stretches to the run's end,
so no data is left out). A window's p99 comes from its interval histograms added together
(exact HDR add; never averaged percentiles); one with fewer than --min-samples requests is
skipped and counted. RSS and queue depth are the mean of the GetStats samples in the window.
Where the server's /metrics was scraped (server_metrics.jsonl, any target), its KV-cache usage,
its preemptions per minute and, where GetStats gives none, its RSS are followed the same way.

A fault rehearsal (the server's --fault-window, seen open in the GetStats samples) is left out
of the latency series: the windows it touched and the one after, where the server recovers.
The load generator's RSS (server_stats.jsonl's generator_rss_bytes) is followed from the
window after requests.jsonl's row cap filled: until then it grows with the rows kept, by design.
With summary.json, the run's accounting is checked: sent = ok + failed + cancelled.

Verdict per series: "drift" when the slope's 95% CI (Student t, n - 2 degrees of freedom)
excludes 0 AND the fitted change over the run exceeds --min-change of the fitted starting
level (of the series mean where that start is not above 0), or when the slope continued over
the deployment horizon (--horizon-h) rises past the series' budget even at the CI's slow end
(--budget-mb for RSS, --budget-ms for p99 latency, --budget-requests for queue depth: a soak
of minutes cannot otherwise call a leak that matters after days); otherwise "no drift". Each
verdict says what the slope and its CI amount to over the horizon, beside the starting level
and the budget. A fitted
level below 0 (a fall steep enough to cross 0 by the run's end) is held at 0 and said. A series
with fewer than 3 usable windows is "too short". A run shorter than 3 windows exits 2, as does a
--window-s shorter than the run's logging interval (its config interval_s, 1 s when absent).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.arguments import number
from analysis.readers.files import RunDirError
from analysis.readers.intervals import Interval, load_intervals, merged
from analysis.readers.latency import US_PER_MS
from analysis.readers.rundir import Run, load_run, read_rows, read_samples, read_summary
from analysis.readers.server_metrics import source_series
from analysis.rules.faults import open_windows
from analysis.slo_claims import runs_lines
from analysis.tables import fmt_ms, markdown_table, text_table
from records.hdr import percentile_us
from records.jsonform import dumps
from records.rundir import SAMPLES, SERVER_METRICS, SUMMARY
from records.server_metrics import NVML
from records.server_stats import ServerSample

SOAK_MD, SOAK_PNG = "soak.md", "soak.png"
MIN_WINDOWS = 3
S_PER_H = 3600.0
CONFIDENCE = 0.95
MB = 2**20
DEFAULT_HORIZON_H = 24.0
# the rise over the horizon that matters, by unit (--budget-mb, --budget-ms, --budget-requests)
DEFAULT_BUDGETS = {"MB": 500.0, "ms": 100.0, "requests": 10.0, "%": 20.0, "per min": 10.0}
# Gauges of server_stats.jsonl trended: key -> title, unit, reader of a sample.
SAMPLED = {"rss_mb": ("server RSS", "MB", lambda s: s.stats.process_rss_bytes / MB),
           "waiting": ("queue depth", "requests", lambda s: s.stats.waiting),
           "generator_rss_mb": ("load generator RSS", "MB", lambda s: s.generator_rss_bytes / MB)}
# the load generator's --interval-s default, for summaries that do not carry it
DEFAULT_INTERVAL_S = 1.0
# soak.png draws these from 0, where an empty queue sits. The others (RSS ~1.3 GB, latencies)
# would be flattened by a 0 baseline: their axes fit the data, but never narrower than
# --min-change of the level, so a change at the drift bar fills the axis and noise far under it
# stays flat.
FROM_ZERO = ("waiting", "scraped_waiting", "kv_usage_percent", "preemptions_per_min")
UNREPORTED_AS_ZERO = ("rss_mb", "generator_rss_mb")


@dataclass(frozen=True)
class Horizon:
    """Where the trends are projected to: hours of the same slope, and the rise each unit may
    take over them."""
    hours: float = DEFAULT_HORIZON_H
    budgets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))

    @property
    def seconds(self) -> float:
        return self.hours * S_PER_H


@dataclass(frozen=True)
class Trend:
    slope_per_s: float
    ci_per_s: tuple[float, float]  # 95%
    start: float  # fitted value at the first window
    end: float  # fitted value at the last window
    reference: float | None  # level the change is judged against; None when the series is all 0
    significant: bool  # the CI excludes 0
    run_drift: bool  # the change over the run alone exceeds --min-change
    # the fitted line fell below 0 at an end, where no latency, RSS or queue can be: start and
    # end are held at 0, and the line does not describe the series
    below_zero: bool = False
    horizon_s: float = DEFAULT_HORIZON_H * S_PER_H
    budget: float | None = None  # the rise allowed over the horizon; None: not judged
    over_budget: bool = False  # even the CI's slow end rises past the budget within the horizon

    @property
    def drift(self) -> bool:
        return self.run_drift or self.over_budget

    @property
    def projected(self) -> float:
        """The fitted slope continued over the horizon."""
        return self.slope_per_s * self.horizon_s

    @property
    def projected_ci(self) -> tuple[float, float]:
        return self.ci_per_s[0] * self.horizon_s, self.ci_per_s[1] * self.horizon_s

    @property
    def projected_share(self) -> float | None:
        return self.projected / self.reference if self.reference else None

    @property
    def hours_to_budget(self) -> float | None:
        """When the CI's slow end reaches the budget (h); None when it does not rise."""
        if self.budget is None or self.ci_per_s[0] <= 0:
            return None
        return self.budget / self.ci_per_s[0] / S_PER_H

    @property
    def change(self) -> float:
        return self.end - self.start

    @property
    def change_share(self) -> float | None:
        return self.change / self.reference if self.reference else None


def fit_trend(t_s: np.ndarray, y: np.ndarray, min_change: float, horizon_s: float | None = None,
              budget: float | None = None) -> Trend:
    """OLS of y on t with at least 3 points; drift as in the module docstring (without a
    horizon and a budget, on the run's own change only)."""
    n = len(t_s)
    if n < MIN_WINDOWS:
        raise ValueError(f"a trend needs at least {MIN_WINDOWS} points, got {n}")
    from scipy import stats  # here: importing it costs every analysis command a second

    fit = stats.linregress(t_s, y - y[0])  # shifted: a constant series fits a slope of exactly 0
    half = stats.t.ppf((1 + CONFIDENCE) / 2, n - 2) * fit.stderr
    ci = (fit.slope - half, fit.slope + half)
    start, end = (y.mean() + fit.slope * (t_s[0] - t_s.mean()),
                  y.mean() + fit.slope * (t_s[-1] - t_s.mean()))
    below_zero = min(start, end) < 0  # every series trended here is a non-negative quantity
    start, end = max(start, 0.0), max(end, 0.0)
    reference = start if start > 0 else (float(y.mean()) if y.mean() > 0 else None)
    significant = ci[0] > 0 or ci[1] < 0
    run_drift = bool(significant and reference is not None
                     and abs(end - start) > min_change * reference)
    horizon_s = DEFAULT_HORIZON_H * S_PER_H if horizon_s is None else horizon_s
    over_budget = bool(budget is not None and ci[0] * horizon_s > budget)
    return Trend(float(fit.slope), (float(ci[0]), float(ci[1])), float(start), float(end),
                 reference, bool(significant), run_drift, below_zero, horizon_s, budget,
                 over_budget)


@dataclass(frozen=True)
class Series:
    key: str  # JSON name
    title: str
    unit: str
    # usable windows: centre (latency) or samples' mean time (gauges), s after the start
    t_s: np.ndarray
    values: np.ndarray
    skipped: int  # windows left out (too few requests, or no samples)
    source: str  # the file it came from
    trend: Trend | None  # None: fewer than 3 usable windows, or no data
    excluded: int = 0  # windows left out on purpose: a fault rehearsal's, or the row cap's
    note: str = ""  # why they were left out

    @property
    def verdict(self) -> str:
        if not len(self.values) and not self.skipped:
            return "no data"
        if self.trend is None:
            return "too short"
        return "drift" if self.trend.drift else "no drift"


@dataclass(frozen=True)
class Windows:
    start_s: float  # warm-up end
    window_s: float
    count: int
    end_s: float  # the last window stretches to here

    def index(self, t_s: np.ndarray) -> np.ndarray:
        """Window of each time; -1 before the first window."""
        k = np.floor((t_s - self.start_s) / self.window_s).astype(int)
        return np.where(t_s < self.start_s, -1, np.minimum(k, self.count - 1))

    def centres(self) -> np.ndarray:
        lo = self.start_s + self.window_s * np.arange(self.count)
        hi = np.append(lo[1:], self.end_s)
        return (lo + hi) / 2


def soak(run_dir: Path, window_s: float, min_change: float, min_samples: int,
         skip_s: float | None, horizon: Horizon | None = None) -> tuple[Windows, list[Series]]:
    """The windows, and the series of TTFT p99, TPOT p99, RSS and queue depth, each judged over
    the run and projected over the horizon (24 h and the default budgets unless given)."""
    horizon = horizon or Horizon()
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a directory")
    summary = read_summary(run_dir)  # None while the run is still going
    interval_s = summary.config.recording.interval_s if summary else DEFAULT_INTERVAL_S
    # windows narrower than the logs' intervals are mostly empty, and countless
    if window_s < interval_s:
        raise RunDirError(f"{run_dir}: --window-s {window_s:g} is shorter than the run's "
                          f"{interval_s:g} s logging interval (interval_s in {SUMMARY}, "
                          f"{DEFAULT_INTERVAL_S:g} s when absent); use --window-s {interval_s:g} "
                          f"or more")
    if skip_s is None:
        skip_s = summary.config.recording.warmup_s if summary else 0.0
    latency = {metric: load_intervals(run_dir, metric) for metric in ("ttft", "tpot")}
    samples = read_samples(run_dir)
    ends = ([i.end_s for intervals in latency.values() for i in intervals]
            + [s.t_run_s for s in samples])
    if not ends:
        raise RunDirError(f"{run_dir}: no ttft.hlog, tpot.hlog or {SAMPLES} to follow over time")
    span_s = max(ends) - skip_s
    # a last part under half a window joins the one before
    count = int(math.floor(span_s / window_s + 0.5))
    if count < MIN_WINDOWS:
        raise RunDirError(f"{run_dir}: too short for a soak verdict: {max(span_s, 0):.0f} s after "
                          f"the {skip_s:g} s warm-up is fewer than {MIN_WINDOWS} windows of "
                          f"{window_s:g} s; use a smaller --window-s")
    windows = Windows(skip_s, window_s, count, max(ends))
    faulted = faulted_windows(samples, windows, interval_s)
    series = [_latency_series(metric, latency[metric], windows, min_samples, min_change, faulted,
                              horizon) for metric in latency]
    series += [_sample_series(key, samples, windows, min_change, horizon)
               for key in ("rss_mb", "waiting")]
    series += scraped_series(run_dir, windows, min_change, horizon,
                             {x.key for x in series if len(x.values)})
    cap_s = row_cap_s(run_dir, summary)
    series.append(_sample_series("generator_rss_mb", samples, windows, min_change, horizon,
                                 after_s=cap_s or 0.0))
    return windows, series


def faulted_windows(samples: list[ServerSample], windows: Windows,
                    interval_s: float) -> set[int]:
    """The windows a fault rehearsal touched: those overlapping the time the server's fault
    window was open (one logging interval either side, as samples see it) and the window right
    after each, in which the server recovers."""
    hit: set[int] = set()
    for first, last in open_windows(samples):
        lo, hi = windows.index(np.asarray([first - interval_s, last + interval_s]))
        hit.update(range(max(lo, 0), min(hi + 1, windows.count - 1) + 1))
    return hit


def row_cap_s(run_dir: Path, summary) -> float | None:
    """When requests.jsonl's row cap (--max-request-rows) filled: the load generator's memory
    grows with the rows it keeps until then, by design. None when it never filled."""
    if summary is None or not summary.requests.rows_omitted:
        return None
    rows = read_rows(run_dir)
    return max((r.scheduled_ms for r in rows), default=0.0) / 1000


def _latency_series(metric: str, intervals: list[Interval], windows: Windows, min_samples: int,
                    min_change: float, faulted: set[int], horizon: Horizon) -> Series:
    index = windows.index(np.asarray([i.start_s + i.length_s / 2 for i in intervals]))
    t_s, values, skipped = [], [], 0
    for k, centre in enumerate(windows.centres()):
        if k in faulted:
            continue
        hist = merged([i for i, w in zip(intervals, index, strict=True) if w == k])
        if hist is None or hist.get_total_count() < min_samples:
            skipped += bool(intervals)
            continue
        t_s.append(centre)
        values.append(percentile_us(hist, 99.0) / US_PER_MS)
    series = _series(f"{metric}_p99_ms", f"{metric.upper()} p99", "ms", t_s, values, skipped,
                     f"{metric}.hlog", min_change, horizon)
    note = "touched by the fault rehearsal or recovering from it (--fault-window)"
    return replace(series, excluded=len(faulted), note=note) if faulted else series


def _sample_series(key: str, samples: list[ServerSample], windows: Windows,
                   min_change: float, horizon: Horizon, after_s: float = 0.0) -> Series:
    """A gauge's mean per window; with after_s, only the windows that start after it."""
    title, unit, read = SAMPLED[key]
    # A process always has memory: a server reporting an RSS of 0 does not report it, and 0 would
    # read as a real, flat figure.
    kept = [(s.t_run_s, read(s)) for s in samples if s.stats.ok
            and (key not in UNREPORTED_AS_ZERO or read(s))]
    return _window_means(key, title, unit, kept, SAMPLES, windows, min_change, horizon, after_s)


def scraped_series(run_dir: Path, windows: Windows, min_change: float, horizon: Horizon,
                   getstats: set[str]) -> list[Series]:
    """From the server's own /metrics (server_metrics.jsonl), for any target: KV-cache usage,
    preemptions per minute, and the server's RSS and queue depth where GetStats did not give
    them (getstats: the keys it gave)."""
    out = []
    for source in source_series(Run(run_dir).scrapes):
        if source.source == NVML or len(source.t_s) < 2:
            continue
        t = np.asarray(source.t_s)
        found = source.sources()
        if "kv_usage" in found:
            kv = source.values("kv_usage") * 100
            kept = [(ti, v) for ti, v in zip(t, kv, strict=True) if not np.isnan(v)]
            out.append(_window_means("kv_usage_percent", "KV-cache usage", "%", kept,
                                     SERVER_METRICS, windows, min_change, horizon))
        if "preemptions" in found:
            grown_ = source.values("preemptions")
            rates = np.diff(grown_) / np.diff(t) * 60
            kept = [(ti, v) for ti, v in zip(t[1:], rates, strict=True) if not np.isnan(v)]
            out.append(_window_means("preemptions_per_min", "preemptions", "per min", kept,
                                     SERVER_METRICS, windows, min_change, horizon))
        if "rss_bytes" in found and "rss_mb" not in getstats:
            rss = source.values("rss_bytes") / MB
            kept = [(ti, v) for ti, v in zip(t, rss, strict=True) if v > 0]
            out.append(_window_means("scraped_rss_mb", "server RSS", "MB", kept, SERVER_METRICS,
                                     windows, min_change, horizon))
        if "waiting" in found and "waiting" not in getstats:
            waiting = source.values("waiting")
            kept = [(ti, v) for ti, v in zip(t, waiting, strict=True) if not np.isnan(v)]
            out.append(_window_means("scraped_waiting", "queue depth", "requests", kept,
                                     SERVER_METRICS, windows, min_change, horizon))
        break  # the first source holding the server's figures
    return out


def _window_means(key: str, title: str, unit: str, kept: list[tuple[float, float]], source: str,
                  windows: Windows, min_change: float, horizon: Horizon,
                  after_s: float = 0.0) -> Series:
    """Values at times, as their mean per window; with after_s, only the windows that start
    after it."""
    first = int(windows.index(np.asarray([after_s]))[0]) + 1 if after_s else 0
    index = windows.index(np.asarray([t for t, _ in kept], dtype=float))
    values = np.asarray([v for _, v in kept], dtype=float)
    times = np.asarray([t for t, _ in kept], dtype=float)
    usable = [k for k in range(first, windows.count) if (index == k).any()]
    skipped = windows.count - first - len(usable) if kept else 0
    # Each window's mean sits at its samples' mean time: a linear series stays exactly on its line.
    t_s = [float(times[index == k].mean()) for k in usable]
    means = [float(values[index == k].mean()) for k in usable]
    series = _series(key, title, unit, t_s, means, skipped, source, min_change, horizon)
    if not first:
        return series
    note = f"before the request rows' cap filled at {after_s:.0f} s (--max-request-rows)"
    return replace(series, excluded=min(first, windows.count), note=note)


def _series(key, title, unit, t_s, values, skipped, source, min_change, horizon) -> Series:
    t_s, values = np.asarray(t_s, dtype=float), np.asarray(values, dtype=float)
    trend = (fit_trend(t_s, values, min_change, horizon.seconds, horizon.budgets.get(unit))
             if len(t_s) >= MIN_WINDOWS else None)
    return Series(key, title, unit, t_s, values, skipped, source, trend)


def header(horizon: Horizon) -> list[str]:
    return ["series", "windows", "start", "end", "change", "slope /h", "95% CI /h",
            f"over {horizon.hours:g} h [95% CI]", "budget", "verdict"]


def _cells(s: Series, windows: Windows) -> list[str]:
    used = f"{len(s.values)}/{windows.count}"
    if s.trend is None:
        return [f"{s.title} ({s.unit})", used, "-", "-", "-", "-", "-", "-", "-", s.verdict]
    tr = s.trend
    share = "" if tr.change_share is None else f" ({100 * tr.change_share:+.1f}%)"
    lo, hi = (S_PER_H * v for v in tr.ci_per_s)
    return [f"{s.title} ({s.unit})", used, fmt_ms(tr.start), fmt_ms(tr.end),
            f"{fmt_ms(tr.change, '+')}{share}", fmt_ms(S_PER_H * tr.slope_per_s, "+"),
            f"[{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]", _projection(tr),
            "-" if tr.budget is None else f"{tr.budget:g}", s.verdict]


def _projection(tr: Trend) -> str:
    lo, hi = tr.projected_ci
    return f"{fmt_ms(tr.projected, '+')} [{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]"


def _horizon_words(s: Series) -> str:
    """What the slope amounts to over the horizon, beside the start and the budget."""
    tr = s.trend
    hours = f"{tr.horizon_s / S_PER_H:g} h"
    share = ("" if tr.projected_share is None
             else f", {100 * tr.projected_share:+.0f}% of the start")
    words = f"over {hours}: {_projection(tr)} {s.unit}{share}"
    if tr.budget is None:
        return words
    budget = f"the {tr.budget:g} {s.unit} budget"
    if tr.over_budget:
        return (f"{words}: past {budget} within {hours} even at the CI's slow end (after "
                f"{fmt_ms(tr.hours_to_budget)} h)")
    if tr.projected_ci[1] > tr.budget:
        return f"{words}: within {budget} at the CI's slow end, not at its fast end"
    return f"{words}: within {budget}"


def sentence(s: Series, min_change: float) -> str:
    """The verdict in words people use: how fast, per hour and over the run."""
    if s.trend is None:
        reason = (f"{s.source} missing or without it" if s.verdict == "no data"
                  else f"fewer than {MIN_WINDOWS} usable windows"
                  + (f"; {s.skipped} had too few requests: use a larger --window-s or a smaller "
                     "--min-samples" if s.skipped else ""))
        return f"{s.title}: {s.verdict} ({reason})"
    tr = s.trend
    lo, hi = (S_PER_H * v for v in tr.ci_per_s)
    rate = (f"{fmt_ms(S_PER_H * tr.slope_per_s, '+')} {s.unit}/h "
            f"[{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]")
    minutes = (s.t_s[-1] - s.t_s[0]) / 60
    over = ("" if tr.change_share is None
            else f", {100 * tr.change_share:+.1f}% over the run ({minutes:.0f} min measured)")
    if tr.below_zero:
        over += ("; the fitted line falls below 0, held at 0: a straight line does not describe "
                 "this series (see soak.png)")
    ahead = _horizon_words(s)
    if tr.drift:
        return (f"{s.title}: drift, {'rising' if tr.slope_per_s > 0 else 'falling'} {rate}"
                f"{over}; {ahead}")
    if not tr.significant:
        return f"{s.title}: no drift ({rate}{over}; the slope's 95% CI includes 0; {ahead})"
    return (f"{s.title}: no drift ({rate}{over}; a real slope, but under "
            f"{100 * min_change:g}% of the starting level over the run; {ahead})")


def render_text(run_dir: Path, windows: Windows, series: list[Series], min_samples: int,
                min_change: float, horizon: Horizon, accounted: str | None = None) -> str:
    rows = [_cells(s, windows) for s in series]
    lines = [f"soak {run_dir}: {windows.count} windows of {windows.window_s:g} s from "
             f"{windows.start_s:g} s to {windows.end_s:.0f} s; projected over {horizon.hours:g} h",
             text_table(header(horizon), rows)]
    lines += [sentence(s, min_change) for s in series]
    lines += [f"{s.title}: {s.skipped} windows skipped ({_skip_reason(s, min_samples)})"
              for s in series if s.skipped]
    lines += [f"{s.title}: {s.excluded} windows left out ({s.note})" for s in series
              if s.excluded]
    if accounted is not None:
        lines.append(accounted)
    return "\n".join(lines)


def _skip_reason(s: Series, min_samples: int) -> str:
    return f"fewer than {min_samples} requests" if s.unit == "ms" else "no samples"


def render_markdown(run_dir: Path, windows: Windows, series: list[Series], min_samples: int,
                    min_change: float, horizon: Horizon, accounted: str | None = None) -> str:
    rows = [_cells(s, windows) for s in series]
    parts = [f"# Soak: {run_dir.resolve().name}",
             f"{windows.count} windows of {windows.window_s:g} s, from {windows.start_s:g} s "
             f"(after the warm-up) to {windows.end_s:.0f} s into the run; each slope projected "
             f"over a {horizon.hours:g} h horizon.",
             markdown_table(header(horizon), rows),
             "\n".join(f"- {sentence(s, min_change)}" for s in series)]
    if skipped := [s for s in series if s.skipped]:
        parts.append("\n".join(f"- {s.title}: {s.skipped} windows skipped "
                               f"({_skip_reason(s, min_samples)})" for s in skipped))
    if excluded := [s for s in series if s.excluded]:
        parts.append("\n".join(f"- {s.title}: {s.excluded} windows left out ({s.note})"
                                for s in excluded))
    if accounted is not None:
        parts.append(accounted)
    budgets = ", ".join(f"{v:g} {unit}" for unit, v in horizon.budgets.items())
    parts += [f"Method: per window, p99 of the interval histograms added together (HDR add) for "
              f"TTFT and TPOT, the mean of the GetStats samples for RSS and queue depth. Ordinary "
              f"least squares of each series on time (window centres for latency, the samples' "
              f"mean time for RSS and queue depth); 95% CI of the slope from Student's t with "
              f"n - 2 degrees of freedom. Drift: the CI excludes 0 and the fitted change exceeds "
              f"{100 * min_change:g}% of the fitted starting level (of the series mean where that "
              f"start is not above 0), or the CI's slow end continued for {horizon.hours:g} h "
              f"rises past the budget ({budgets}). A straight line is an assumption: a leak "
              f"that levels off projects too high, one that accelerates too low. Windows are "
              f"not independent (a slow server stays slow), so treat a borderline CI with care.",
              f"![soak]({SOAK_PNG})"]
    return "\n\n".join(parts) + "\n"


def plot_soak(series: list[Series], windows: Windows, path: Path, min_change: float) -> None:
    soak_figure(series, windows, min_change).savefig(path, dpi=100)


def soak_figure(series: list[Series], windows: Windows, min_change: float) -> Figure:
    """One panel per series, in order: its windows' values and the fitted trend."""
    minutes = windows.end_s >= 600
    scale, unit = (60.0, "min") if minutes else (1.0, "s")
    rows = math.ceil(len(series) / 2)
    fig = Figure(figsize=(11, 3.75 * rows), layout="constrained")
    axes = list(fig.subplots(rows, 2).flat)
    for ax in axes[len(series):]:
        ax.remove()
    for ax, s in zip(axes, series, strict=False):
        ax.set_title(f"{s.title}: {s.verdict}")
        ax.set_xlabel(f"time into the run ({unit})")
        ax.set_ylabel(f"{s.title} ({s.unit})")
        ax.grid(True, alpha=0.3)
        ax.set_xlim(windows.start_s / scale, windows.end_s / scale)
        if not len(s.values):
            ax.text(0.5, 0.5, s.verdict, ha="center", va="center", transform=ax.transAxes)
            continue
        ax.plot(s.t_s / scale, s.values, "o", label=f"per {windows.window_s:g} s window")
        if s.trend is not None:
            ends = np.asarray([s.t_s[0], s.t_s[-1]])
            rate = f"{fmt_ms(S_PER_H * s.trend.slope_per_s, '+')} {s.unit}/h"
            share = ("" if s.trend.change_share is None
                     else f", {100 * s.trend.change_share:+.1f}% over the run")
            ax.plot(ends / scale, [s.trend.start, s.trend.end], "--",
                    color="C3" if s.trend.drift else "C2", label=f"OLS trend {rate}{share}")
        if s.key in FROM_ZERO:
            ax.set_ylim(bottom=0)
        else:
            _widen(ax, s, min_change)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle("Soak: drift over the run")
    return fig


def _widen(ax, s: Series, min_change: float) -> None:
    """The autoscaled axis (points and trend), widened about its middle to min_change of the
    level."""
    low, high = ax.get_ylim()
    level = (s.trend.reference if s.trend is not None and s.trend.reference
             else float(np.abs(s.values).mean()))
    if high - low < min_change * level:
        middle, half = (low + high) / 2, min_change * level / 2
        ax.set_ylim(max(middle - half, 0.0) if low >= 0 else middle - half, middle + half)
    ax.ticklabel_format(axis="y", useOffset=False)  # 1342 MB, not +1.342e3 and offsets


def accounting(summary) -> tuple[bool, str] | None:
    """Whether every request the run scheduled ends in one place (summary.json's requests), and
    the sentence that says so; None while the run has no summary."""
    if summary is None:
        return None
    r = summary.requests
    closed = r.sent == r.ok + r.failed + r.cancelled
    codes = ", ".join(f"{code} {n}" for code, n in r.failed_by_code.items())
    told = (f"sent {r.sent} = ok {r.ok} + failed {r.failed}{f' ({codes})' if codes else ''}"
            f" + cancelled by the client {r.cancelled}; not sent {r.not_sent}")
    return closed, (f"requests: every one accounted for: {told}" if closed
                    else f"requests: NOT all accounted for: {told}")


def objectives(run_dir: Path) -> list[str]:
    """The objectives' verdict over the whole run (analysis/slo_claims.py), once it has ended
    and its files are whole; [] otherwise."""
    try:
        return [f"objectives: {line}" for line in runs_lines(["the run"], [load_run(run_dir)])]
    except RunDirError:
        return []


def headline(run_dir: Path, windows: Windows, series: list[Series], horizon: Horizon,
             accounted: bool | None = None) -> dict:
    def figures(s: Series) -> dict:
        tr = s.trend
        return {"verdict": s.verdict, "unit": s.unit, "windows": len(s.values),
                "skipped": s.skipped, "excluded": s.excluded,
                "slope_per_h": None if tr is None else S_PER_H * tr.slope_per_s,
                "ci_per_h": None if tr is None else [S_PER_H * v for v in tr.ci_per_s],
                "start": None if tr is None else tr.start, "end": None if tr is None else tr.end,
                "change_pct": (None if tr is None or tr.change_share is None
                               else 100 * tr.change_share),
                "projected": None if tr is None else tr.projected,
                "projected_ci": None if tr is None else list(tr.projected_ci),
                "projected_pct": (None if tr is None or tr.projected_share is None
                                  else 100 * tr.projected_share),
                "budget": None if tr is None else tr.budget,
                "over_budget": None if tr is None else tr.over_budget,
                "hours_to_budget": None if tr is None else tr.hours_to_budget}

    return {"soak_md": str(run_dir / SOAK_MD), "soak_png": str(run_dir / SOAK_PNG),
            "window_s": windows.window_s, "windows": windows.count, "accounted": accounted,
            "horizon_h": horizon.hours, "budgets": horizon.budgets,
            "drift": [s.key for s in series if s.verdict == "drift"],
            "series": {s.key: figures(s) for s in series}}


def add_command(commands) -> None:
    parser = commands.add_parser(
        "soak", help="drift of p99 TTFT/TPOT, server RSS and queue depth over a long run: "
                     "soak.md, soak.png",
        description=__doc__ + "\nExit status: 0 with a verdict per series; 2 when the run "
                              "directory is unusable or spans fewer than 3 windows.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir",
                        help="run directory with ttft.hlog, tpot.hlog and server_stats.jsonl")
    parser.add_argument("--window-s", type=number(float, 0), default=60.0,
                        help="window length in seconds (default 60)")
    parser.add_argument("--min-change", type=number(float, 0, strict=False), default=0.1,
                        help="smallest fitted change over the run, as a fraction of the fitted "
                             "starting level, that counts as drift (default 0.1)")
    parser.add_argument("--min-samples", type=number(int, 1, strict=False), default=50,
                        help="requests a window needs for its p99 to count (default 50; under "
                             "100 the p99 is the window's largest value or next to it)")
    parser.add_argument("--skip-s", type=number(float, 0, strict=False), default=None,
                        help="leave out the first seconds (default: the run's warm-up from "
                             "summary.json)")
    parser.add_argument("--horizon-h", type=number(float, 0), default=DEFAULT_HORIZON_H,
                        help="deployment horizon in hours: each slope and its 95%% CI is "
                             "projected over it and judged against the budgets (default "
                             f"{DEFAULT_HORIZON_H:g})")
    for unit, flag, what in (("MB", "--budget-mb", "server and load generator RSS"),
                             ("ms", "--budget-ms", "p99 TTFT and TPOT"),
                             ("requests", "--budget-requests", "queue depth"),
                             ("%", "--budget-kv-percent", "KV-cache usage from /metrics"),
                             ("per min", "--budget-preemptions", "preemptions per minute from "
                              "/metrics")):
        parser.add_argument(flag, type=number(float, 0), default=DEFAULT_BUDGETS[unit],
                            help=f"rise of {what} ({unit}) allowed over the horizon: drift when "
                                 "the slope's CI rises past it even at its slow end (default "
                                 f"{DEFAULT_BUDGETS[unit]:g})")
    parser.add_argument("--fail-on-drift", action="store_true",
                        help="exit 1 when a series drifts or a request is unaccounted for "
                             "(make soak)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir)
    horizon = Horizon(args.horizon_h, {"MB": args.budget_mb, "ms": args.budget_ms,
                                       "requests": args.budget_requests,
                                       "%": args.budget_kv_percent,
                                       "per min": args.budget_preemptions})
    windows, series = soak(run_dir, args.window_s, args.min_change, args.min_samples, args.skip_s,
                           horizon)
    closed, accounted = accounting(read_summary(run_dir)) or (None, None)
    if closed is not None and (judged := objectives(run_dir)):
        accounted = "\n".join([accounted, *judged])
    print(render_text(run_dir, windows, series, args.min_samples, args.min_change, horizon,
                      accounted))
    try:
        plot_soak(series, windows, run_dir / SOAK_PNG, args.min_change)
        (run_dir / SOAK_MD).write_text(render_markdown(run_dir, windows, series, args.min_samples,
                                                       args.min_change, horizon, accounted))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the soak report: {e}") from None
    print(f"\nsoak: {run_dir / SOAK_MD}")
    figures = headline(run_dir, windows, series, horizon, closed)
    print(dumps(figures))
    if args.fail_on_drift and (figures["drift"] or closed is False):
        raise SystemExit(1)
