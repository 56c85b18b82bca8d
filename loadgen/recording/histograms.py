"""HDR latency histograms: integer microseconds, 3 significant digits, nothing dropped.

hdrhistogram silently drops values outside its range; here they are clamped into range
and counted, so a summary can say how many there were. Queries run in numpy (records/hdr.py):
hdrhistogram's own took ~30 ms a histogram from the event loop that timestamps the streams, on
every poll of the web UI's live tab. A stream's values are recorded at once (`add`):
hdrhistogram's counts indices computed once for the run's histogram and the interval's
(`Binned`), in numpy for a long stream and in Python's ints for a short one (numpy's calls cost
~14 us however few the values, Python's ~0.2 us a value); its record_value, five Python calls a
value, was a fifth of the Locust process's CPU behind the aio sender (docs/design.md, "The
default client").
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

from records import hdr
from records.summary import Stats

LOWEST_US = 1  # resolution; 0 is recordable too
HIGHEST_US = 3_600_000_000  # one hour
DIGITS = 3
FEW = 64  # values below which a stream's are binned in Python, not numpy
_SHAPE = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)  # hdrhistogram's index arithmetic, below
_MASK, _UNIT = _SHAPE.sub_bucket_mask, _SHAPE.unit_magnitude
_HALF_MAG, _HALF = _SHAPE.sub_bucket_half_count_magnitude, _SHAPE.sub_bucket_half_count
_BUCKET_BASE = _UNIT + _HALF_MAG + 1


@dataclass(frozen=True)
class Binned:
    """Values (us) in hdrhistogram's counts indices, ready to add to any of these histograms:
    each value as record() takes it (truncated, clamped into range and counted)."""

    index: np.ndarray | list[int]
    clamped: int
    low: int
    high: int

    @classmethod
    def of(cls, values_us: Sequence[float]) -> Binned:
        if len(values_us) < FEW:
            return cls.of_few(values_us)
        v = np.asarray(values_us)
        if v.dtype.kind == "f":  # int() of each, past the range kept past it
            v = np.clip(v, -1, HIGHEST_US + 1).astype(np.int64)
        out = (v < 0) | (v > HIGHEST_US)
        clamped = int(np.count_nonzero(out))
        if clamped:
            v = np.clip(v, 0, HIGHEST_US)
        # hdrhistogram's _counts_index_for: the bucket from the value's bit length (frexp's
        # exponent, exact below 2**53), then the sub-bucket
        bucket = np.frexp((v | _MASK).astype(np.float64))[1] - _BUCKET_BASE
        index = ((bucket + 1) << _HALF_MAG) + (v >> (bucket + _UNIT)) - _HALF
        return cls(index, clamped, int(v.min()), int(v.max()))

    @classmethod
    def of_few(cls, values_us: Sequence[float]) -> Binned:
        v = [int(value) for value in values_us]
        clamped = sum(not 0 <= x <= HIGHEST_US for x in v) if (
            min(v) < 0 or max(v) > HIGHEST_US) else 0
        if clamped:
            v = [min(max(x, 0), HIGHEST_US) for x in v]
        index = [((b := (x | _MASK).bit_length() - _BUCKET_BASE) + 1 << _HALF_MAG)
                 + (x >> (b + _UNIT)) - _HALF for x in v]
        return cls(index, clamped, min(v), max(v))


class Histogram:
    def __init__(self):
        self.hdr = HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)
        self.counts = np.ctypeslib.as_array(self.hdr.counts)  # the same memory, in numpy
        self.clamped = 0

    def record(self, value_us: float) -> None:
        v = int(value_us)
        if not 0 <= v <= HIGHEST_US:
            self.clamped += 1
            v = min(max(v, 0), HIGHEST_US)
        self.hdr.record_value(v)

    def add(self, binned: Binned) -> None:
        """record() of each value binned holds."""
        hdr = self.hdr
        if isinstance(binned.index, list):
            counts = hdr.counts  # ctypes' items are cheaper to add to than numpy's
            for i in binned.index:
                counts[i] += 1
        else:
            np.add.at(self.counts, binned.index, 1)
        hdr.total_count += len(binned.index)
        hdr.min_value, hdr.max_value = min(hdr.min_value, binned.low), max(hdr.max_value,
                                                                           binned.high)
        self.clamped += binned.clamped

    def clear(self) -> None:
        """Empty again, in the memory it has: a histogram is ~180 KB, and each hdrhistogram
        one is a reference cycle (its encoder points back at it) that only Python's full
        collection frees, so one made a second grew the load generator's memory by steps
        (docs/measured.md). hdrhistogram's own reset() zeroes its counts one Python call a
        bucket: 1.1 ms (0.003 here) of the event loop that timestamps the streams."""
        hdr = self.hdr
        ctypes.memset(hdr.counts, 0, ctypes.sizeof(hdr.counts))
        hdr.total_count, hdr.min_value, hdr.max_value = 0, sys.maxsize, 0
        hdr.start_time_stamp_msec, hdr.end_time_stamp_msec = sys.maxsize, 0
        self.clamped = 0

    @property
    def count(self) -> int:
        return self.hdr.get_total_count()

    def stats(self) -> Stats:
        """count, mean, p50..p999, max in milliseconds (the count alone when empty)."""
        if not self.count:
            return Stats(count=0)
        values = self.percentiles_us(hdr.PERCENTILES.values())
        return Stats(count=self.count, mean=self.mean_us() / 1000,
                     **{k: values[p] / 1000 for k, p in hdr.PERCENTILES.items()},
                     max=self.hdr.get_max_value() / 1000, clamped=self.clamped)

    def percentiles_us(self, percentiles) -> dict[float, int]:
        """percentile -> value, as hdrhistogram's get_percentile_to_value_dict (0 when empty)."""
        return hdr.percentiles_us(self.hdr, percentiles)

    def mean_us(self) -> float:
        return hdr.mean_us(self.hdr)

    def encode(self) -> str:
        return self.hdr.encode().decode("ascii")

    def merge(self, encoded: str, clamped: int) -> None:
        """Adds an encoded histogram of the same settings: exact, unlike averaging percentiles."""
        self.hdr.add(HdrHistogram.decode(encoded))
        self.clamped += clamped

