"""Latency statistics and CDFs read from HDR histograms of integer microseconds."""

import numpy as np
from hdrh.histogram import HdrHistogram

from records.summary import Stats

US_PER_MS = 1000.0
# Named as summary.json's Stats, so the server's own times render through the same tables.
PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def stats_ms(hist: HdrHistogram | None) -> Stats | None:
    """count, mean, p50 .. p999 and max in ms; None when there are no samples."""
    if hist is None or hist.get_total_count() == 0:
        return None
    # One scan for all percentiles: get_value_at_percentile scans the buckets on every call.
    by_percentile = hist.get_percentile_to_value_dict(list(PERCENTILES.values()))
    return Stats(count=hist.get_total_count(), mean=hist.get_mean_value() / US_PER_MS,
                 **{key: by_percentile[p] / US_PER_MS for key, p in PERCENTILES.items()},
                 max=hist.get_max_value() / US_PER_MS)


def cdf_ms(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """Upper edge of every recorded bucket in ms, and the fraction of samples at or below it."""
    edges_us, counts = [], []
    # The iterator yields one item object updated in place: read its fields at each step.
    for item in hist.get_recorded_iterator():
        edges_us.append(item.value_iterated_to)
        counts.append(item.count_added_in_this_iter_step)
    return np.asarray(edges_us) / US_PER_MS, np.cumsum(counts) / hist.get_total_count()
