"""Latency spikes: windows of the TTFT and TPOT interval logs whose p99 jumps above the run's
typical window, and the server and load-generator signals that lined up with each.

Interval histograms are recorded when a request finishes, so a spike shows where its slow
requests *ended*; their queueing happened earlier. When requests.jsonl has them, causes are
looked for over the slow requests' own lifetimes (scheduled -> first token for TTFT, first
token -> last for TPOT); without it, in the spike's window and the interval before it.
Server series entries (ServerSeries.t_s is the end of each entry's interval) count when they
overlap that span. Reads only run-directory files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from analysis.readers.intervals import Interval, merged
from analysis.readers.latency import US_PER_MS
from analysis.readers.rows import measured_ok
from analysis.readers.rundir import Run
from analysis.readers.samples import ServerSeries, server_series
from analysis.readers.server_metrics import ServerSide, server_side
from analysis.rules.finding import Finding
from analysis.tables import fmt_ms
from records.hdr import percentile_us
from records.requests import RequestRow
from records.server_stats import ServerStats

# Latency spike: a window's p99 above twice the median window p99 ...
SPIKE_FACTOR = 2.0
# ... and at least this far above it, so tiny latencies do not fire: 50 ms of TTFT is half the
# ~100 ms a person notices; 10 ms of TPOT slows a 20-50 ms/token stream by a fifth or more.
SPIKE_MIN_JUMP_MS = {"ttft": 50.0, "tpot": 10.0}
# Consecutive intervals are merged (HDR add) until a window holds this many requests: below it a
# window's p99 is one request's latency, an outlier rather than a spike. At low rates a window
# spans several intervals; the evidence gives its times.
MIN_WINDOW_SAMPLES = 5
# the median of three is the middle one, so one spiking window cannot set its own bar
MIN_WINDOWS = 3
SPIKES_LISTED = 5  # spike windows a finding gives in full; the rest are counted
HOT_EXPERT_FACTOR = 1.5  # an interval's imbalance this many times the run's median is a hot expert
# An interval's max/mean expert load counts only when each layer routed at least this many (token,
# expert) pairs per expert on average. Below it a request or two set the ratio: an interval that
# routed 38 tokens (76 pairs a layer over 8 experts, top-2) read 4.00, the most top-2 of 8 can
# give. At 10 per expert a uniform router alone still reads about 1.4 for 8 experts, so intervals
# are ranked against each other and the run's median, not against a fixed bar.
MIN_ROUTED_PER_EXPERT = 10
CACHE_BURST_FACTOR = 2.0  # an interval's cache misses this many times the run's median is a burst
QUEUE_SHARE_OF_TTFT = 0.5  # slow requests spending half their TTFT in the server queue: queueing
FINISH_TOLERANCE_S = 0.25  # a request finishing this close to a window's edge is recorded in either
# The generator's lag explains a spike only when it is late and at least this share of the jump:
# a 6 ms delivery lag does not explain a TTFT three seconds over its median.
LAG_SHARE_OF_JUMP = 0.25

LAGS = ("send_lag", "delivery_lag")  # the load generator's own lateness, per interval
CAUSES = ("hot expert", "cache-miss burst", "queue growth", "generator lateness")


@dataclass(frozen=True)
class Signals:
    """What a run recorded over time, in the shape the rules read it."""

    run: Run
    series: ServerSeries | None
    kv_in_use: np.ndarray  # KV pool slots held, at each series entry's later snapshot (gauge)
    kv_total: np.ndarray
    # The series' imbalance where each layer routed at least MIN_ROUTED_PER_EXPERT pairs per
    # expert, else nan.
    imbalance: np.ndarray
    # that minimum in pairs per layer; 0 when the server gives no layer sizes
    min_routed_per_layer: float
    max_batch_size: float | None
    expert_cache: int
    late_ms: float
    scraped: ServerSide  # the target's /metrics and the host's GPUs (server_metrics.jsonl)


@dataclass(frozen=True)
class MergedWindow:
    """Consecutive intervals of one metric's .hlog, merged."""

    start_s: float  # start of its first interval holding samples (seconds after the run started)
    end_s: float  # end of its last interval holding samples
    before_s: float  # start of the interval before that first one
    hist: HdrHistogram  # the intervals added (exact), integer microseconds
    count: int


@dataclass(frozen=True)
class Spike:
    metric: str  # ttft or tpot
    window: MergedWindow
    p99_ms: float
    typical_ms: float  # the median window p99
    limit_ms: float

    def describe(self) -> str:
        return (f"{self.metric.upper()} p99 {fmt_ms(self.p99_ms)} ms at {self.window.start_s:.1f}-"
                f"{self.window.end_s:.1f} s ({self.window.count} requests; "
                f"{self.p99_ms / self.typical_ms:.1f}x the median {fmt_ms(self.typical_ms)} ms)")


def signals_of(run: Run) -> Signals:
    samples = run.samples
    last = samples[-1].stats if samples else ServerStats()
    later = [sample.stats for sample in samples[1:]]  # each series entry's later snapshot
    series = server_series(samples)
    num_layers = last.num_layers or len(last.layers) or 1
    num_experts = last.num_experts or (len(last.layers[0].expert_tokens) if last.layers else 0)
    min_routed = float(MIN_ROUTED_PER_EXPERT * num_experts)
    imbalance = np.empty(0) if series is None else \
        np.where(series.routed / num_layers >= min_routed, series.imbalance, np.nan)
    return Signals(
        run=run,
        series=series,
        kv_in_use=np.asarray([s.kv_slots_in_use for s in later], dtype=float),
        kv_total=np.asarray([s.kv_slots_total for s in later], dtype=float),
        imbalance=imbalance,
        min_routed_per_layer=min_routed,
        max_batch_size=last.max_batch_size or None,
        expert_cache=last.expert_cache,
        late_ms=run.summary.generator.late_threshold_ms,
        scraped=server_side(run),
    )


@dataclass(frozen=True)
class MetricSpikes:
    metric: str
    windows: int
    typical_ms: float  # the median window p99
    limit_ms: float  # above it a window is a spike
    spikes: list[Spike]


def find_spikes(run: Run, metric: str) -> MetricSpikes | str:
    """The metric's spike windows, or what was missing to judge them."""
    intervals = run.intervals(metric)
    if not intervals:
        return f"{metric}.hlog is missing or empty"
    windows = merge_windows(intervals)
    if len(windows) < MIN_WINDOWS:
        return (f"{metric}.hlog gives {len(windows)} window(s) of >= {MIN_WINDOW_SAMPLES} "
                f"requests (need {MIN_WINDOWS})")
    p99 = [percentile_us(w.hist, 99) / US_PER_MS for w in windows]
    typical = float(np.median(p99))
    limit = max(SPIKE_FACTOR * typical, typical + SPIKE_MIN_JUMP_MS[metric])
    spikes = [Spike(metric, w, p, typical, limit) for w, p in zip(windows, p99, strict=True)
              if p > limit]
    return MetricSpikes(metric, len(windows), typical, limit, spikes)


def merge_windows(intervals: list[Interval]) -> list[MergedWindow]:
    """Consecutive intervals merged until each window holds MIN_WINDOW_SAMPLES; a short tail joins
    the last."""
    groups, group = [], []
    for index in range(len(intervals)):
        group.append(index)
        if sum(intervals[i].hist.get_total_count() for i in group) >= MIN_WINDOW_SAMPLES:
            groups.append(group)
            group = []
    if group and groups:
        groups[-1] += group
    windows = []
    for group in groups:
        # the window's times skip empty intervals
        full = [i for i in group if intervals[i].hist.get_total_count()]
        hist = merged([intervals[i] for i in group])
        windows.append(MergedWindow(intervals[full[0]].start_s, intervals[full[-1]].end_s,
                                    intervals[max(full[0] - 1, 0)].start_s, hist,
                                    hist.get_total_count()))
    return windows


def causes(d: Signals, spike: Spike) -> tuple[list[tuple[str, str]], str]:
    """Which causes lined up with one spike, and where they were looked for."""
    metric, window = spike.metric, spike.window
    timed = [row for row in measured_ok(d.run.rows)
             if row.ttft_ms is not None and row.e2e_ms is not None]
    slow = [row for row in timed if (getattr(row, f"{metric}_ms") or 0) > spike.limit_ms
            and (window.start_s - FINISH_TOLERANCE_S <= _finish_s(row)
                 <= window.end_s + FINISH_TOLERANCE_S)]
    if slow:
        first_token = [(row.scheduled_ms + row.ttft_ms) / 1000 for row in slow]
        if metric == "ttft":
            start, end = min(row.scheduled_ms for row in slow) / 1000, max(first_token)
        else:
            start, end = min(first_token), max(_finish_s(row) for row in slow)
        looked = (f"{start:.1f}-{end:.1f} s (the lifetimes of its {len(slow)} slow requests in "
                  "requests.jsonl)")
    else:
        start, end = window.before_s, window.end_s
        looked = f"{start:.1f}-{end:.1f} s (the window and the interval before it)"
    s, found = d.series, {}
    if s is not None:
        near = _overlapping(s, start, end)
        found["hot expert"] = _hot_expert(d, near)
        found["cache-miss burst"] = _miss_burst(s, near)
        found["queue growth"] = _queue_growth(d, near, start)
    else:
        found["queue growth"], gauge = _scraped_queue_growth(d, start, end)
        looked += ("; no server_stats.jsonl, so hot expert and cache misses unchecked"
                   + (f", the queue read from the scraped {gauge}" if gauge
                      else " and the queue unchecked (no scraped waiting gauge)"))
    if metric == "ttft" and (queued := _queue_share(slow)):
        found["queue growth"] = "; ".join(filter(None, [found.get("queue growth"), queued]))
    found["generator lateness"] = _generator_late(d, spike, slow)
    return [(name, found[name]) for name in CAUSES if found.get(name)], looked


def _finish_s(row: RequestRow) -> float:
    return row.finish_ms / 1000


def _overlapping(s: ServerSeries, start_s: float, end_s: float) -> np.ndarray:
    """Series entries that overlap [start_s, end_s] by half the shorter of the two spans."""
    overlap = np.minimum(s.t_s, end_s) - np.maximum(s.t_s - s.length_s, start_s)
    return np.flatnonzero(overlap >= 0.5 * np.minimum(s.length_s, max(end_s - start_s, 1e-9)))


def _hot_expert(d: Signals, near: np.ndarray) -> str | None:
    """Only intervals that routed enough pairs count, for the run's median and for the spike."""
    imbalance = d.imbalance
    if not np.isfinite(imbalance).any() or not len(near):
        return None
    median = float(np.nanmedian(imbalance))
    imb = np.nan_to_num(imbalance[near], nan=0.0)
    i = int(near[imb.argmax()])
    if imbalance[i] > HOT_EXPERT_FACTOR * median:
        return (f"max/mean {imbalance[i]:.2f} at {when(d.series, i)} "
                f"({imbalance[i] / median:.1f}x the run's median {median:.2f})")
    return None


def _miss_burst(s: ServerSeries, near: np.ndarray) -> str | None:
    if not len(near) or s.cache_misses.sum() <= 0:
        return None
    median = float(np.median(s.cache_misses))
    i = int(near[s.cache_misses[near].argmax()])
    if s.cache_misses[i] > max(CACHE_BURST_FACTOR * median, 0):
        return f"{s.cache_misses[i]:.0f} misses at {when(s, i)} (median {median:.0f} per interval)"
    return None


def _queue_growth(d: Signals, near: np.ndarray, start_s: float) -> str | None:
    """The wait queue gauge rose above its value before the look window; with what was full then."""
    s = d.series
    if not len(near):
        return None
    before = np.flatnonzero(s.t_s <= start_s)
    base = float(s.waiting[before[-1]]) if len(before) else 0.0
    i = int(near[s.waiting[near].argmax()])
    if s.waiting[i] - base < 1:
        return None
    full = []
    if d.kv_total[i] > 0 and d.kv_in_use[i] >= d.kv_total[i]:
        full.append(f"the KV pool full ({d.kv_total[i]:.0f} slots)")
    if d.max_batch_size and s.running[i] >= d.max_batch_size:
        full.append(f"the batch full ({s.running[i]:.0f} running)")
    return (f"waiting {base:.0f} -> {s.waiting[i]:.0f} by {s.t_s[i]:.1f} s"
            + (" with " + " and ".join(full) if full else ", with room in the batch and KV pool"))


def _scraped_queue_growth(d: Signals, start_s: float, end_s: float
                          ) -> tuple[str | None, str]:
    """The server's own waiting gauge, scraped (vLLM's num_requests_waiting and the like), where
    there is no GetStats: (its rise over [start_s, end_s] above its value before, the gauge's
    family; "" where no source exposes one)."""
    for series in d.scraped.engines if d.scraped is not None else ():
        if "waiting" not in series.sources():
            continue
        t, waiting = np.asarray(series.t_s), series.values("waiting")
        family = f"`{series.sources()['waiting'].family}`"
        before = np.flatnonzero((t <= start_s) & ~np.isnan(waiting))
        near = np.flatnonzero((t >= start_s) & (t <= end_s + 1.0) & ~np.isnan(waiting))
        base = float(waiting[before[-1]]) if len(before) else 0.0
        if not len(near) or waiting[near].max() - base < 1:
            return None, family
        i = int(near[waiting[near].argmax()])
        return f"waiting {base:.0f} -> {waiting[i]:.0f} by {t[i]:.1f} s ({family})", family
    return None, ""


def _queue_share(slow: list[RequestRow]) -> str | None:
    queued = [(row.server_queue_us / 1000, row.ttft_ms) for row in slow
              if row.server_queue_us is not None]
    if not queued:
        return None
    queue_ms, ttft_ms = np.asarray(queued).T
    share = queue_ms.sum() / ttft_ms.sum()
    if share >= QUEUE_SHARE_OF_TTFT:
        return (f"the slow requests spent {share:.0%} of their TTFT in the server queue (median "
                f"{fmt_ms(float(np.median(queue_ms)))} ms)")
    return None


def _generator_late(d: Signals, spike: Spike, slow: list[RequestRow]) -> str | None:
    """Lags are recorded when a request finishes, so the window's own intervals hold the spike's
    requests. A lag counts only when it is late and large enough to explain a share of the jump."""
    window, jump_ms = spike.window, spike.p99_ms - spike.typical_ms
    bar_ms = max(d.late_ms, LAG_SHARE_OF_JUMP * jump_ms)
    found = []
    for metric in LAGS:
        hist = merged([i for i in d.run.intervals(metric)
                       if window.before_s <= i.start_s < window.end_s])
        if hist is not None and hist.get_total_count():
            p99 = percentile_us(hist, 99) / US_PER_MS
            if p99 > bar_ms:
                found.append(f"{metric.replace('_', ' ')} p99 {fmt_ms(p99)} ms at "
                             f"{window.before_s:.1f}-{window.end_s:.1f} s "
                             f"(over {fmt_ms(bar_ms)} ms)")
    lags = [row.sent_ms - row.scheduled_ms for row in slow if row.sent_ms is not None]
    if lags and max(lags) > bar_ms:
        found.append(f"its slow requests were sent up to {fmt_ms(max(lags))} ms late")
    return "; ".join(found) or None


def when(s: ServerSeries, i: int) -> str:
    return f"{s.t_s[i] - s.length_s[i]:.1f}-{s.t_s[i]:.1f} s"


def latency_spikes(d: Signals) -> Finding:
    rule = ("latency_spikes", "Latency spikes")
    found = [find_spikes(d.run, metric) for metric in ("ttft", "tpot")]
    judged = [f for f in found if isinstance(f, MetricSpikes)]
    missing = [f for f in found if isinstance(f, str)]
    if not judged:
        return Finding(*rule, False, "Not enough requests per interval: " + "; ".join(missing),
                       [], judged=False)
    evidence = [f"{f.metric.upper()}: median window p99 {fmt_ms(f.typical_ms)} ms over "
                f"{f.windows} windows of >= {MIN_WINDOW_SAMPLES} requests; a spike is above "
                f"{fmt_ms(f.limit_ms)} ms" for f in judged]
    evidence += [f"not judged: {m}" for m in missing]
    spikes = sorted((spike for f in judged for spike in f.spikes),
                    key=lambda spike: spike.window.start_s)
    if not spikes:
        return Finding(*rule, False, f"No window's p99 rose above {SPIKE_FACTOR:g}x the run's "
                       "median window p99 (by the minimum jump).", evidence)
    tally, unexplained, lines = dict.fromkeys(CAUSES, 0), 0, []
    for spike in spikes:
        lined, looked = causes(d, spike)
        for name, _ in lined:
            tally[name] += 1
        unexplained += not lined
        said = "; ".join(f"{name}: {detail}" for name, detail in lined) if lined else \
            "no cause found among " + ", ".join(CAUSES)
        lines.append((spike.p99_ms / spike.typical_ms,
                      f"{spike.describe()}; looked at {looked}: {said}"))
    # The largest jumps when there are many, kept in time order.
    kept = sorted(sorted(lines, key=lambda line: -line[0])[:SPIKES_LISTED], key=lines.index)
    evidence += [text for _, text in kept]
    evidence += ([f"and {len(lines) - len(kept)} smaller spike windows"]
                 if len(lines) > len(kept) else [])
    what = ", ".join(f"{f.metric.upper()} {len(f.spikes)}" for f in judged if f.spikes)
    lined_up = ", ".join(f"{name} ({n})" for name, n in tally.items() if n) or "nothing"
    verdict = f"Latency spiked in {len(spikes)} window(s) ({what}); lined up with {lined_up}"
    verdict += f"; no cause found for {unexplained}." if unexplained else "."
    return Finding(*rule, True, verdict, evidence)
