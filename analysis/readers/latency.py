"""Latency statistics and CDFs read from HDR histograms of integer microseconds."""

import numpy as np
from hdrh.histogram import HdrHistogram

from records.hdr import PERCENTILES, mean_us, percentiles_us, recorded_us
from records.summary import Stats

US_PER_MS = 1000.0


def stats_ms(hist: HdrHistogram | None) -> Stats | None:
    """count, mean, p50 .. p999 and max in ms; None when there are no samples."""
    if hist is None or hist.get_total_count() == 0:
        return None
    by_percentile = percentiles_us(hist, PERCENTILES.values())
    return Stats(count=hist.get_total_count(), mean=mean_us(hist) / US_PER_MS,
                 **{key: by_percentile[p] / US_PER_MS for key, p in PERCENTILES.items()},
                 max=hist.get_max_value() / US_PER_MS)


def cdf_ms(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """Upper edge of every recorded bucket in ms, and the fraction of samples at or below it."""
    edges_us, counts = recorded_us(hist)
    return edges_us / US_PER_MS, np.cumsum(counts) / hist.get_total_count()
