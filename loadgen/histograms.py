"""HDR latency histograms: integer microseconds, 3 significant digits, nothing dropped.

hdrhistogram silently drops values outside its range; here they are clamped into range
and counted, so a summary can say how many there were.

Queries run over the counts array in numpy, with the same bucket arithmetic as hdrhistogram's
own (the value a percentile reports, the midpoint the mean weighs): its pure-Python mean walks
every bucket up to the largest value, about 30 ms a histogram, which the web UI's live tab would
take from the event loop that timestamps the streams on every poll.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from hdrh.histogram import HdrHistogram

from records.summary import Stats

LOWEST_US = 1  # resolution; 0 is recordable too
HIGHEST_US = 3_600_000_000  # one hour
DIGITS = 3
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


class Histogram:
    def __init__(self):
        self.hdr = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
        self.clamped = 0

    def record(self, value_us: float) -> None:
        v = int(value_us)
        if not 0 <= v <= HIGHEST_US:
            self.clamped += 1
            v = min(max(v, 0), HIGHEST_US)
        self.hdr.record_value(v)

    @property
    def count(self) -> int:
        return self.hdr.get_total_count()

    def stats(self) -> Stats:
        """count, mean, p50..p999, max in milliseconds (the count alone when empty)."""
        if not self.count:
            return Stats(count=0)
        values = self.percentiles_us(PERCENTILES.values())
        return Stats(count=self.count, mean=self.mean_us() / 1000,
                     **{k: values[p] / 1000 for k, p in PERCENTILES.items()},
                     max=self.hdr.get_max_value() / 1000, clamped=self.clamped)

    def percentiles_us(self, percentiles) -> dict[float, int]:
        """percentile -> value, as hdrhistogram's get_percentile_to_value_dict (0 when empty)."""
        total = self.count
        cumulative = np.cumsum(self._counts())
        out = {}
        for p in percentiles:
            if not total:
                out[p] = 0
                continue
            target = max(int(min(p, 100.0) * total / 100 + 0.5), 1)
            out[p] = int(_bucket_values()[0][np.searchsorted(cumulative, target)])
        return out

    def mean_us(self) -> float:
        """The counts weighted by their buckets' midpoints, as hdrhistogram's mean."""
        return (float(self._counts() @ _bucket_values()[1]) / self.count if self.count
                else 0.0)

    def _counts(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.hdr.counts)[:self.hdr.counts_len].astype(np.float64)

    def encode(self) -> str:
        return self.hdr.encode().decode("ascii")

    def merge(self, encoded: str, clamped: int) -> None:
        """Adds an encoded histogram of the same settings: exact, unlike averaging percentiles."""
        self.hdr.add(HdrHistogram.decode(encoded))
        self.clamped += clamped


@cache
def _bucket_values() -> tuple[np.ndarray, np.ndarray]:
    """Per counts index of our histograms: the value a percentile landing there reports (the
    bucket's highest equivalent value) and the midpoint the mean weighs it by; hdrhistogram's
    index arithmetic (get_value_from_index, get_highest_equivalent_value), over all indexes."""
    hdr = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
    index = np.arange(hdr.counts_len, dtype=np.int64)
    half = hdr.sub_bucket_half_count
    bucket = (index >> hdr.sub_bucket_half_count_magnitude) - 1
    sub = (index & (half - 1)) + half
    first = bucket < 0
    sub[first] -= half
    bucket[first] = 0
    lowest = sub << (bucket + hdr.unit_magnitude)
    size = np.left_shift(1, bucket + hdr.unit_magnitude)
    return (lowest + size - 1).astype(np.float64), (lowest + (size >> 1)).astype(np.float64)
