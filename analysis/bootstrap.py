"""Bootstrap confidence intervals, pure numpy: a percentile of one sample, a rate over time
bins, and the ratio of two runs' figures with a verdict on it.

Percentile definition: HdrHistogram's, so that a point estimate read from histograms.json
and its interval speak of the same statistic. The q-th percentile of n values is the k-th
smallest, k = max(1, int(q n / 100 + 0.5)); HDR reports the highest value of that value's
bucket, at most 0.1% above it at 3 significant digits.

The bootstrap distribution of that order statistic needs no resampling: with
x_(1) <= ... <= x_(n), the k-th smallest of n draws with replacement is at most x_(j) exactly
when at least k draws are among the j smallest, which has probability
P(Binomial(n, j/n) >= k) = P(Beta(k, n + 1 - k) <= j/n). So one resample's k-th smallest is
x_(ceil(n U)) with U ~ Beta(k, n + 1 - k): one beta draw per resample instead of n values and
a sort. tests/test_compare_confidence.py checks it against a brute-force resampling bootstrap.

A rate (tokens/s, requests/s) is a ratio estimator over the measured window's time bins:
sum of counts / sum of bin lengths, bins resampled with replacement. That treats bins as
independent; a request's tokens spread over neighbouring bins, so for bins much shorter than
a request the interval is somewhat too narrow.
"""

from __future__ import annotations

import math

import numpy as np

SAME = "no significant difference"


def rank(n: int, q: float) -> int:
    """1-based rank of the q-th percentile among n values, as HdrHistogram counts it."""
    return max(int(q * n / 100 + 0.5), 1)


def percentile(values: np.ndarray, q: float) -> float:
    """The q-th percentile by the rank above (no interpolation)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    return float(ordered[rank(len(ordered), q) - 1])


def percentile_draws(values: np.ndarray, q: float, resamples: int,
                     rng: np.random.Generator) -> np.ndarray:
    """The q-th percentile of each of `resamples` bootstrap resamples of `values`
    (exact, via Beta)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    k = min(rank(n, q), n)
    u = rng.beta(k, n + 1 - k, size=resamples)
    index = np.clip(np.ceil(n * u).astype(np.int64), 1, n) - 1
    return ordered[index]


def rate_draws(counts: np.ndarray, lengths_s: np.ndarray, resamples: int,
               rng: np.random.Generator) -> np.ndarray:
    """sum(counts) / sum(lengths_s) over bins resampled with replacement."""
    counts, lengths_s = np.asarray(counts, dtype=float), np.asarray(lengths_s, dtype=float)
    index = rng.integers(0, len(counts), size=(resamples, len(counts)))
    return counts[index].sum(axis=1) / lengths_s[index].sum(axis=1)


def interval(draws: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval: the central `confidence` share of the draws (nearest draws,
    no interpolation, which would turn two infinite ratio draws into nan)."""
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(draws, [tail, 100 - tail], method="nearest")
    return float(low), float(high)


def ratio(numerator: float | np.ndarray, denominator: float | np.ndarray) -> np.ndarray:
    """numerator / denominator where 0 / 0 is 1 (both ran none: equal) and x / 0 is inf."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    return np.where((num == 0) & (den == 0), 1.0, out)


def verdict(low: float, high: float, lower_is_better: bool) -> str:
    """'better', 'worse' (the numerator run against the denominator run) or no significant
    difference."""
    if low <= 1 <= high:
        return SAME
    return "better" if (high < 1) == lower_is_better else "worse"


def fmt_ratio(value: float) -> str:
    """x1.72, x0.0512, x12.3, xinf: three significant digits."""
    return "xinf" if math.isinf(value) else f"x{value:#.3g}".rstrip(".")
