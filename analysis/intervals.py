"""Interval logs (`<metric>.hlog`): each metric's HDR histogram of every --interval-s period.

Parsed here rather than with hdrh's HistogramLogReader, which returns nothing unless the
interval timestamps are absolute epoch milliseconds; ours are seconds after the BaseTime
line, as the format allows. Interval start times come back relative to the run's start.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

from hdrh.codec import HdrCookieException, HdrLengthException
from hdrh.histogram import HdrHistogram

from analysis.rundir import RunDirError, read_lines


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
    intervals = []
    for number, line in read_lines(path):
        if line.startswith(("#", '"')):
            continue
        fields = line.split(",")
        if fields[0].startswith("Tag="):
            fields = fields[1:]
        try:
            start_s, length_s = float(fields[0]), float(fields[1])
            hist = HdrHistogram.decode(fields[3])
        except (IndexError, ValueError, TypeError, zlib.error, HdrCookieException, HdrLengthException) as e:
            raise RunDirError(f"{path}:{number}: not an interval histogram line ({e})") from None
        intervals.append(Interval(max(start_s, 0.0), length_s, hist))
    return intervals


def load_intervals(run_dir: Path, metric: str) -> list[Interval]:
    return read_hlog(run_dir / f"{metric}.hlog")


def merged(intervals: list[Interval]) -> HdrHistogram | None:
    """All the intervals added into one histogram (exact: HDR add), None when there are none."""
    if not intervals:
        return None
    first = intervals[0].hist
    total = HdrHistogram(first.lowest_trackable_value, first.highest_trackable_value, first.significant_figures)
    for interval in intervals:
        total.add(interval.hist)
    return total
