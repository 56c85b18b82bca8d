"""Queries on HDR histograms (hdrhistogram's HdrHistogram: the run directory's histograms.json
and *.hlog, and the load generator's live ones), run over the counts array in numpy with
hdrhistogram's own bucket arithmetic: a percentile reports the highest value equivalent to its
bucket, the mean weighs each bucket by its midpoint. hdrhistogram's pure-Python queries walk
every bucket up to the largest value: its mean took ~30 ms a histogram, and a report spent
most of its time in them (docs/measured.md). tests/test_loadgen_timing.py checks both agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

import numpy as np
from hdrh.histogram import HdrHistogram

# The percentiles a summary reports, named as summary.json's Stats fields.
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def percentiles_us(hist: HdrHistogram, percentiles: Iterable[float]) -> dict[float, int]:
    """percentile (0-100] -> value, as hdrhistogram's get_percentile_to_value_dict (0 when
    empty)."""
    total = hist.get_total_count()
    if not total:
        return dict.fromkeys(percentiles, 0)
    cumulative = np.cumsum(_counts(hist))
    highest = _bucket_values(*_shape(hist))[0]
    out = {}
    for p in percentiles:
        target = max(int(min(p, 100.0) * total / 100 + 0.5), 1)
        out[p] = int(highest[np.searchsorted(cumulative, target)])
    return out


def percentile_us(hist: HdrHistogram, percentile: float) -> int:
    return percentiles_us(hist, (percentile,))[percentile]


def mean_us(hist: HdrHistogram) -> float:
    """The counts weighted by their buckets' midpoints, as hdrhistogram's get_mean_value."""
    total = hist.get_total_count()
    return float(_counts(hist) @ _bucket_values(*_shape(hist))[1]) / total if total else 0.0


def recorded_us(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """Every bucket holding values: its highest equivalent value and its count, in order (as
    hdrhistogram's recorded iterator walks them)."""
    c = _counts(hist)
    held = np.flatnonzero(c)
    return _bucket_values(*_shape(hist))[0][held], c[held]


def _counts(hist: HdrHistogram) -> np.ndarray:
    return np.ctypeslib.as_array(hist.counts)[:hist.counts_len].astype(np.float64)


def _shape(hist: HdrHistogram) -> tuple[int, int, int]:
    return (hist.lowest_trackable_value, hist.highest_trackable_value,
            hist.significant_figures)


@cache
def _bucket_values(lowest: int, highest: int, digits: int) -> tuple[np.ndarray, np.ndarray]:
    """Per counts index of histograms of this shape: the value a percentile landing there
    reports (the bucket's highest equivalent value) and the midpoint the mean weighs it by;
    hdrhistogram's index arithmetic (get_value_from_index, get_highest_equivalent_value)."""
    hdr = HdrHistogram(lowest, highest, digits)
    index = np.arange(hdr.counts_len, dtype=np.int64)
    half = hdr.sub_bucket_half_count
    bucket = (index >> hdr.sub_bucket_half_count_magnitude) - 1
    sub = (index & (half - 1)) + half
    first = bucket < 0
    sub[first] -= half
    bucket[first] = 0
    lowest_value = sub << (bucket + hdr.unit_magnitude)
    size = np.left_shift(1, bucket + hdr.unit_magnitude)
    return ((lowest_value + size - 1).astype(np.float64),
            (lowest_value + (size >> 1)).astype(np.float64))
