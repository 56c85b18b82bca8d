"""The client's view over time, one entry per interval of the interval logs: latency
percentiles of the requests that finished in it, achieved and offered rates, output tokens.

Histograms are recorded when a request finishes, so an interval's TTFT p99 is that of the
requests finishing in it. Consecutive intervals can be merged into wider windows (exact HDR
adds) so that a sparse run's percentiles are not those of one or two requests. Offered rate
counts requests by scheduled send time (warm-up included), from requests.jsonl.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from analysis.readers.intervals import Interval, merged
from analysis.readers.latency import US_PER_MS
from analysis.readers.rows import column
from analysis.readers.rundir import Run, read_summary
from records.hdr import percentile_us
from records.requests import RequestRow


@dataclass(frozen=True)
class ClientSeries:
    start_s: np.ndarray  # interval start, seconds after the run started
    length_s: np.ndarray
    ttft_p50_ms: np.ndarray  # nan where no request finished in the interval
    ttft_p99_ms: np.ndarray
    tpot_p50_ms: np.ndarray
    tpot_p99_ms: np.ndarray
    # ok requests finished per second (warm-up's included where requests.jsonl has them)
    achieved_rps: np.ndarray
    # tokens of the measured ok requests that finished in the interval
    output_tokens_per_s: np.ndarray
    offered_rps: np.ndarray  # requests scheduled per second (nan without requests.jsonl)

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def mid_s(self) -> np.ndarray:
        return self.start_s + self.length_s / 2


# Fewest finished requests per window that the automatic window width aims for.
MIN_REQUESTS_PER_WINDOW = 5
MAX_WINDOWS_WIDENED = 10


def client_series(run: Run, window_s: float | None = None) -> ClientSeries | None:
    """None when the run has no interval logs. window_s None: as logged, widened for sparse runs
    (see auto_window_s); 0: as logged."""
    ttft = run.intervals("ttft")
    if not ttft:
        return None
    # the per-token ITL view where the run has it (one value per token after the first
    # message), else one value per message gap (older runs)
    per_token = run.intervals("itl_token") or run.intervals("itl")
    tpot, itl = _aligned(run.intervals("tpot"), ttft), _aligned(per_token, ttft)
    width = auto_window_s(ttft) if window_s is None else window_s
    groups = _groups(ttft, width)
    ttft, tpot, itl = ([_merge([intervals[i] for i in group]) for group in groups]
                       for intervals in (ttft, tpot, itl))
    start = np.asarray([i.start_s for i in ttft])
    length = np.asarray([i.length_s for i in ttft])
    safe_length = np.where(length > 0, length, np.nan)
    finished = np.asarray([i.hist.get_total_count() for i in ttft], dtype=float)
    # A request's first token is its TTFT sample and each later one an ITL sample, so the two
    # counts add up to the output tokens of the requests that finished (less any tokens beyond
    # the first in a first message).
    tokens = finished + np.asarray([i.hist.get_total_count() if i else 0 for i in itl], dtype=float)
    rows = run.rows
    if rows:
        edges = np.append(start, start[-1] + length[-1])
        offered = np.histogram(column(rows, "scheduled_ms") / 1000, bins=edges)[0] / safe_length
        # Completions as summary.json counts them: every ok request, warm-up scheduled or not, by
        # when its last token came (e2e runs from the scheduled send).
        ok: list[RequestRow] = [row for row in rows
                                if row.status == "OK" and row.e2e_ms is not None]
        finished_s = (column(ok, "scheduled_ms") + column(ok, "e2e_ms")) / 1000
        achieved = np.histogram(finished_s, bins=edges)[0] / safe_length
        summary = read_summary(run.path)
        if summary is not None and summary.requests.rows_omitted:
            # requests.jsonl stopped at its row cap: past the last row it holds, the rows say
            # nothing of what was offered, and completions come from the interval logs
            capped_s = max(finished_s.max(initial=0.0), column(rows, "scheduled_ms").max() / 1000)
            after = start >= capped_s
            offered = np.where(after, np.nan, offered)
            achieved = np.where(after, finished / safe_length, achieved)
    else:
        offered, achieved = np.full(len(ttft), np.nan), finished / safe_length
    return ClientSeries(
        start_s=start, length_s=length,
        ttft_p50_ms=_percentile(ttft, 50), ttft_p99_ms=_percentile(ttft, 99),
        tpot_p50_ms=_percentile(tpot, 50), tpot_p99_ms=_percentile(tpot, 99),
        achieved_rps=achieved, output_tokens_per_s=tokens / safe_length, offered_rps=offered,
    )


def auto_window_s(intervals: list[Interval]) -> float:
    """Wide enough for MIN_REQUESTS_PER_WINDOW finished requests at the run's mean rate, but
    never fewer than MAX_WINDOWS_WIDENED windows; 0 (as logged) when the logged ones suffice."""
    span_s = intervals[-1].end_s - intervals[0].start_s
    finished = sum(i.hist.get_total_count() for i in intervals)
    logged_s = float(np.median([i.length_s for i in intervals]))
    if not finished or span_s <= 0:
        return 0.0
    wanted_s = min(MIN_REQUESTS_PER_WINDOW * span_s / finished, span_s / MAX_WINDOWS_WIDENED)
    return float(np.ceil(wanted_s / logged_s) * logged_s) if wanted_s > logged_s else 0.0


def _groups(intervals: list[Interval], window_s: float) -> list[list[int]]:
    """Indices of the intervals in each window: floor(start / window_s) when window_s > 0, else
    one each; a last window under half the median width (the end of the drain) joins the one
    before, so that its few finishing requests are not read as a burst of throughput."""
    keys = [int(i.start_s // window_s) if window_s > 0 else n for n, i in enumerate(intervals)]
    groups = [[n for n, _ in run]
              for _, run in itertools.groupby(enumerate(keys), key=lambda item: item[1])]
    widths = [intervals[g[-1]].end_s - intervals[g[0]].start_s for g in groups]
    if len(groups) > 1 and widths[-1] < np.median(widths) / 2:
        groups[-2:] = [groups[-2] + groups[-1]]
    return groups


def _merge(intervals: list[Interval | None]) -> Interval | None:
    present = [i for i in intervals if i is not None]
    if not present:
        return None
    return Interval(present[0].start_s, present[-1].end_s - present[0].start_s, merged(present))


def _aligned(intervals: list[Interval], reference: list[Interval]) -> list[Interval | None]:
    """The metric's intervals padded to the reference's length (all logs are written together)."""
    return (intervals + [None] * len(reference))[: len(reference)]


def _percentile(intervals: list[Interval | None], percentile: float) -> np.ndarray:
    return np.asarray([percentile_us(i.hist, percentile) / US_PER_MS
                       if i and i.hist.get_total_count() else np.nan for i in intervals])
