"""Interval logs (`<metric>.hlog`): each metric's HDR histogram of every --interval-s period.

Parsed here rather than with hdrh's HistogramLogReader, which returns nothing unless the
interval timestamps are absolute epoch milliseconds; ours are seconds after the BaseTime
line, as the format allows. Interval start times come back relative to the run's start.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hdrh.codec import HdrCookieException, HdrLengthException
from hdrh.histogram import HdrHistogram

from analysis.readers.files import RunDirError, read_lines, worker_dirs


@dataclass(frozen=True)
class Interval:
    start_s: float  # seconds after the run started
    length_s: float
    hist: HdrHistogram  # integer microseconds

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s


def read_hlog(path: Path) -> list[Interval]:
    """The intervals of one .hlog file, in file order; [] when the file does not exist."""
    return _parse(path)[1]


def load_intervals(run_dir: Path, metric: str) -> list[Interval]:
    """The run's intervals of one metric. A distributed run keeps them per worker
    (worker-<i>/<metric>.hlog): the workers' intervals that cover the same time are added."""
    path = run_dir / f"{metric}.hlog"
    if path.exists():
        return read_hlog(path)
    logs = [_parse(log) for log in worker_dirs(run_dir, f"{metric}.hlog")]
    logs = [(base_s, intervals) for base_s, intervals in logs if intervals]
    if not logs:
        return []
    if any(base_s is None for base_s, _ in logs):
        raise RunDirError(f"{run_dir}: a worker's {metric}.hlog has no BaseTime line, so its "
                          "intervals cannot be lined up with the other workers'")
    return _align(logs)


def _parse(path: Path) -> tuple[float | None, list[Interval]]:
    """(BaseTime in epoch seconds, or None without one; the intervals)."""
    base_s, intervals = None, []
    for number, line in read_lines(path):
        if line.startswith("#[BaseTime:"):
            try:
                base_s = float(line.split()[1])
            except (IndexError, ValueError):
                raise RunDirError(f"{path}:{number}: a BaseTime line without its time in "
                                  "seconds") from None
            continue
        if line.startswith(("#", '"')):
            continue
        fields = line.split(",")
        if fields[0].startswith("Tag="):
            fields = fields[1:]
        try:
            start_s, length_s = float(fields[0]), float(fields[1])
            hist = HdrHistogram.decode(fields[3])
        except (IndexError, ValueError, TypeError, zlib.error, HdrCookieException,
                HdrLengthException) as e:
            raise RunDirError(f"{path}:{number}: not an interval histogram line ({e})") from None
        intervals.append(Interval(max(start_s, 0.0), length_s, hist))
    return base_s, intervals


def _align(logs: list[tuple[float, list[Interval]]]) -> list[Interval]:
    """Workers' intervals on the earliest worker's clock, those of the same period added: each
    worker writes every --interval-s from its own start, a fraction of a period apart."""
    first_s = min(base_s for base_s, _ in logs)
    period_s = float(np.median([i.length_s for _, intervals in logs for i in intervals]))
    periods: dict[int, list[Interval]] = {}
    for base_s, intervals in logs:
        for interval in intervals:
            start_s = base_s - first_s + interval.start_s
            shifted = Interval(start_s, interval.length_s, interval.hist)
            periods.setdefault(round(start_s / period_s), []).append(shifted)
    return [Interval(min(i.start_s for i in group),
                     max(i.end_s for i in group) - min(i.start_s for i in group), merged(group))
            for _, group in sorted(periods.items())]


def merged(intervals: list[Interval]) -> HdrHistogram | None:
    """All the intervals added into one histogram (exact: HDR add), None when there are none."""
    if not intervals:
        return None
    first = intervals[0].hist
    total = HdrHistogram(first.lowest_trackable_value, first.highest_trackable_value,
                         first.significant_figures)
    for interval in intervals:
        total.add(interval.hist)
    return total
