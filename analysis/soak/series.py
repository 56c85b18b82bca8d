"""The series a soak follows, window by window: p99 TTFT and TPOT from the interval
histograms, the server's RSS and queue depth from its GetStats samples, what its /metrics
gave, and the load generator's RSS; each with its trend."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from analysis.readers.files import RunDirError
from analysis.readers.intervals import Interval, load_intervals, merged
from analysis.readers.latency import US_PER_MS
from analysis.readers.rundir import Run, read_rows, read_samples, read_summary
from analysis.readers.server_metrics import source_series
from analysis.rules.faults import open_windows
from analysis.soak.trend import MIN_WINDOWS, Judging, Trend, fit_trend
from records.hdr import percentile_us
from records.rundir import SAMPLES, SERVER_METRICS, SUMMARY
from records.server_metrics import NVML
from records.server_stats import ServerSample

MB = 2**20


@dataclass(frozen=True)
class Label:
    key: str  # JSON name
    title: str
    unit: str


# Gauges of server_stats.jsonl trended: key -> label, reader of a sample.
SAMPLED = {"rss_mb": (Label("rss_mb", "server RSS", "MB"),
                      lambda s: s.stats.process_rss_bytes / MB),
           "waiting": (Label("waiting", "queue depth", "requests"), lambda s: s.stats.waiting),
           "generator_rss_mb": (Label("generator_rss_mb", "load generator RSS", "MB"),
                                lambda s: s.generator_rss_bytes / MB)}
# the load generator's --interval-s default, for summaries that do not carry it
DEFAULT_INTERVAL_S = 1.0
UNREPORTED_AS_ZERO = ("rss_mb", "generator_rss_mb")
NO_DATA, CANNOT_JUDGE = "no data", "cannot judge"



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
        """drift, no drift, cannot judge (too few usable windows, or an interval over the
        horizon that reaches past the budget: drift cannot be told from none), or no data
        (not measured at all)."""
        if not len(self.values) and not self.skipped and not self.excluded:
            return NO_DATA
        if self.trend is None:
            return CANNOT_JUDGE
        if self.trend.drift:
            return "drift"
        return CANNOT_JUDGE if self.trend.undecided else "no drift"


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


def soak(run_dir: Path, window_s: float, skip_s: float | None, judging: Judging
         ) -> tuple[Windows, list[Series]]:
    """The windows, and the series of TTFT p99, TPOT p99, RSS and queue depth, each judged over
    the run and projected over judging's horizon. skip_s: the seconds left out at the start
    (None: the run's warm-up)."""
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
    faulted = faulted_spans(samples, interval_s, window_s)
    series = [_latency_series(metric, latency[metric], windows, judging, faulted)
              for metric in latency]
    series += [_sample_series(key, samples, windows, judging) for key in ("rss_mb", "waiting")]
    series += scraped_series(run_dir, windows, judging, {x.key for x in series if len(x.values)})
    cap_s = row_cap_s(run_dir, summary)
    generator = _sample_series("generator_rss_mb", samples, windows, judging,
                               after_s=cap_s or 0.0)
    if summary is not None and cap_s is None and len(generator.values):
        generator = replace(generator, t_s=np.empty(0), values=np.empty(0), trend=None,
                            excluded=windows.count, note="requests.jsonl's row cap "
                            "(--max-request-rows) never filled: the load generator's memory "
                            "grew with the rows it kept all run")
    series.append(generator)
    return windows, series


def faulted_spans(samples: list[ServerSample], interval_s: float,
                  recovery_s: float) -> list[tuple[float, float]]:
    """The seconds a fault rehearsal touched: each time the server's fault window was open (one
    logging interval either side, as samples see it) and recovery_s after it, in which the
    server recovers."""
    return [(first - interval_s, last + interval_s + recovery_s)
            for first, last in open_windows(samples)]


def row_cap_s(run_dir: Path, summary) -> float | None:
    """When requests.jsonl's row cap (--max-request-rows) filled: the load generator's memory
    grows with the rows it keeps until then, by design. None when it never filled."""
    if summary is None or not summary.requests.rows_omitted:
        return None
    rows = read_rows(run_dir)
    return max((r.scheduled_ms for r in rows), default=0.0) / 1000


def _latency_series(metric: str, intervals: list[Interval], windows: Windows, judging: Judging,
                    faulted: list[tuple[float, float]]) -> Series:
    """Each window's p99 from its intervals, less those a fault rehearsal touched: a window
    keeps the rest of its seconds, and is left out only where none is left."""
    touched = [i for i in intervals
               if any(i.start_s < hi and i.start_s + i.length_s > lo for lo, hi in faulted)]
    kept = [i for i in intervals if i not in touched]
    index = windows.index(np.asarray([i.start_s + i.length_s / 2 for i in kept]))
    emptied = set(windows.index(np.asarray([i.start_s + i.length_s / 2 for i in touched])))
    t_s, values, skipped = [], [], 0
    for k, centre in enumerate(windows.centres()):
        hist = merged([i for i, w in zip(kept, index, strict=True) if w == k])
        if hist is None and k in emptied:
            continue
        if hist is None or hist.get_total_count() < judging.min_samples:
            skipped += bool(intervals)
            continue
        t_s.append(centre)
        values.append(percentile_us(hist, 99.0) / US_PER_MS)
    series = _series(Label(f"{metric}_p99_ms", f"{metric.upper()} p99", "ms"), t_s, values,
                     skipped, f"{metric}.hlog", judging)
    if not touched:
        return series
    left_out = emptied - set(index.tolist())
    note = (f"{sum(i.length_s for i in touched):.0f} s touched by the fault rehearsal or "
            "recovering from it (--fault-window), the rest of their windows kept")
    return replace(series, excluded=len(left_out), note=note)


def _sample_series(key: str, samples: list[ServerSample], windows: Windows, judging: Judging,
                   after_s: float = 0.0) -> Series:
    """A gauge's mean per window; with after_s, only the windows that start after it."""
    label, read = SAMPLED[key]
    # A process always has memory: a server reporting an RSS of 0 does not report it, and 0 would
    # read as a real, flat figure.
    kept = [(s.t_run_s, read(s)) for s in samples if s.stats.ok
            and (key not in UNREPORTED_AS_ZERO or read(s))]
    return _window_means(label, kept, SAMPLES, windows, judging, after_s)


def scraped_series(run_dir: Path, windows: Windows, judging: Judging,
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
            out.append(_window_means(Label("kv_usage_percent", "KV-cache usage", "%"), kept,
                                     SERVER_METRICS, windows, judging))
        if "preemptions" in found:
            grown_ = source.values("preemptions")
            rates = np.diff(grown_) / np.diff(t) * 60
            kept = [(ti, v) for ti, v in zip(t[1:], rates, strict=True) if not np.isnan(v)]
            out.append(_window_means(Label("preemptions_per_min", "preemptions", "per min"),
                                     kept, SERVER_METRICS, windows, judging))
        if "rss_bytes" in found and "rss_mb" not in getstats:
            rss = source.values("rss_bytes") / MB
            kept = [(ti, v) for ti, v in zip(t, rss, strict=True) if v > 0]
            out.append(_window_means(Label("scraped_rss_mb", "server RSS", "MB"), kept,
                                     SERVER_METRICS, windows, judging))
        if "waiting" in found and "waiting" not in getstats:
            waiting = source.values("waiting")
            kept = [(ti, v) for ti, v in zip(t, waiting, strict=True) if not np.isnan(v)]
            out.append(_window_means(Label("scraped_waiting", "queue depth", "requests"), kept,
                                     SERVER_METRICS, windows, judging))
        break  # the first source holding the server's figures
    return out


def _window_means(label: Label, kept: list[tuple[float, float]], source: str, windows: Windows,
                  judging: Judging, after_s: float = 0.0) -> Series:
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
    series = _series(label, t_s, means, skipped, source, judging)
    if not first:
        return series
    note = f"before the request rows' cap filled at {after_s:.0f} s (--max-request-rows)"
    return replace(series, excluded=min(first, windows.count), note=note)


def _series(label: Label, t_s: list[float], values: list[float], skipped: int, source: str,
            judging: Judging) -> Series:
    times, levels = np.asarray(t_s, dtype=float), np.asarray(values, dtype=float)
    horizon = judging.horizon
    trend = (fit_trend(times, levels, judging.min_change, horizon.seconds,
                       horizon.budgets.get(label.unit)) if len(times) >= MIN_WINDOWS else None)
    return Series(label.key, label.title, label.unit, times, levels, skipped, source, trend)

