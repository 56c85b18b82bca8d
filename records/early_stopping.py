"""Whether a percentile claim is supported by the sample it came from: MLPerf Inference's early
stopping rule (LoadGen, loadgen/early_stopping.cc and results.cc, the server scenario), and the
exact order-statistic confidence interval of a percentile (docs/metrics.md, "Is the p99
valid?").

The rule. A run claims "the p-th percentile is at most L" from n requests of which t took
longer than L. If the true share over L were 1 - p, seeing t or fewer over it among n requests
would happen with probability P(Binomial(n, 1 - p + d) <= t) = I_{p-d}(n - t, t + 1) (the
regularized incomplete beta; d, the tolerance, is 0 in the server scenario). The claim holds at
confidence c (0.99) when that probability is below 1 - c: with h = n - t requests under L,
the smallest such h is `min_passing(t)`, and a run with fewer needs that many more, all of them
under L. With no request over L that is 459 requests for p99; every request over L adds about
a hundred more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

CONFIDENCE = 0.99  # MLPerf's
TOLERANCE = 0.0  # MLPerf's server scenario


def passes(h: int, t: int, p: float, d: float = TOLERANCE, c: float = CONFIDENCE) -> bool:
    """Whether h requests under the bound beside t over it support the p-th percentile claim."""
    return h > 0 and binomial_cdf(t, h + t, 1 - p + d) < 1 - c


def binomial_cdf(k: int, n: int, q: float) -> float:
    """P(Binomial(n, q) <= k), exact to float precision. By hand, not scipy's: this module runs in
    the Locust process, where importing scipy costs half a second a start (docs/measured.md).
    The terms are summed from the side of k away from the mode, where they fall geometrically,
    until they stop adding: a few hundred terms for a tail of a million requests."""
    if k < 0:
        return 0.0
    if k >= n or q <= 0.0:
        return 1.0
    if q >= 1.0:
        return 0.0
    if k < n * q:  # below the mean: the lower tail, k down to 0
        return _tail(k, n, q, -1)
    return 1.0 - _tail(k + 1, n, q, 1)


def _tail(start: int, n: int, q: float, step: int) -> float:
    """Sum of the binomial's terms from `start` outwards (step -1: down to 0; +1: up to n)."""
    log_term = (math.lgamma(n + 1) - math.lgamma(start + 1) - math.lgamma(n - start + 1)
                + start * math.log(q) + (n - start) * math.log1p(-q))
    term, total, k = math.exp(log_term), 0.0, start
    odds = q / (1 - q)
    while 0 <= k <= n and term > 0.0:
        total += term
        if term < total * 1e-17:
            break
        term *= ((k / (n - k + 1)) / odds) if step < 0 else ((n - k) / (k + 1)) * odds
        k += step
    return total


def binomial_ppf(alpha: float, n: int, q: float) -> int:
    """The smallest k with P(Binomial(n, q) <= k) >= alpha."""
    low, high = 0, n
    while low < high:
        mid = (low + high) // 2
        if binomial_cdf(mid, n, q) >= alpha:
            high = mid
        else:
            low = mid + 1
    return low


def min_passing(t: int, p: float, d: float = TOLERANCE, c: float = CONFIDENCE) -> int:
    """The fewest requests under the bound that, beside t over it, support the claim: the
    probability falls as h grows, so a doubling then a bisection finds it exactly."""
    if not 0 < p - d < 1 or not 0 < c < 1:
        raise ValueError(f"percentile {p} with tolerance {d} and confidence {c}: need "
                         "0 < p - d < 1 and 0 < c < 1")
    low = max(1, math.ceil(math.log(1 - c) / math.log(p - d)))  # t = 0's answer: a lower bound
    high = low
    while not passes(high, t, p, d, c):
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if passes(mid, t, p, d, c):
            high = mid
        else:
            low = mid + 1
    return low


@dataclass(frozen=True)
class Validity:
    requests: int  # n
    over: int  # t: requests over the bound
    needed: int  # h + t: the fewest requests that would support the claim with t over it

    @property
    def valid(self) -> bool:
        return self.requests >= self.needed

    @property
    def more(self) -> int:
        """Requests still to run, every one of them under the bound, for the claim to hold."""
        return max(0, self.needed - self.requests)


def validity(requests: int, over: int, percentile: float) -> Validity:
    """percentile: 99 for p99."""
    return Validity(requests, over, min_passing(over, percentile / 100) + over)


class Verdict(StrEnum):
    """A percentile claim's verdict, as MLPerf's early-stopping rule gives it."""

    PASS = "PASS"  # met, and supported by enough requests
    FAIL = "FAIL"  # not met
    NOT_VALID = "NOT VALID"  # met, but too few requests to support it


@dataclass(frozen=True, kw_only=True)
class Judged:
    """An objective as a percentile claim over a sample: "metric p<percentile> <= limit_ms"."""

    metric: str  # TTFT, TPOT, E2E
    percentile: float
    limit_ms: float
    value_ms: float | None  # the sample's percentile (nearest rank); None: no sample
    requests: int
    over: int  # requests over the limit
    needed: int  # requests that would support the claim with `over` of them over the limit

    @property
    def met(self) -> bool:
        return self.value_ms is not None and self.value_ms <= self.limit_ms

    @property
    def supported(self) -> bool:
        return self.requests >= self.needed

    @property
    def verdict(self) -> Verdict:
        if not self.met:
            return Verdict.FAIL
        return Verdict.PASS if self.supported else Verdict.NOT_VALID


def judge(metric: str, values: list[float], limit_ms: float, percentile: float,
          over_anyway: int = 0) -> Judged:
    """values: the sample in ms; over_anyway: requests known to be over the limit without a
    value (a failed one, one still waiting past it)."""
    ordered = sorted(values)
    n = len(ordered) + over_anyway
    over = sum(1 for v in ordered if v > limit_ms) + over_anyway
    rank = max(1, math.ceil(percentile / 100 * n))  # nearest rank, as LoadGen's
    value = (None if not n else ordered[rank - 1] if rank <= len(ordered) else math.inf)
    return Judged(metric=metric, percentile=percentile, limit_ms=limit_ms, value_ms=value,
                  requests=n, over=over, needed=validity(n, over, percentile).needed)


def rank_interval(n: int, percentile: float, confidence: float = 0.95) -> tuple[int, int | None]:
    """1-based ranks (l, u) of the sorted sample whose values bound the percentile with at
    least `confidence`, from the binomial alone (no assumption on the distribution); u None:
    the sample is too small for an upper bound (the interval runs past its largest value)."""
    if n < 1:
        raise ValueError("no sample")
    p, alpha = percentile / 100, 1 - confidence
    low = binomial_ppf(alpha / 2, n, p)  # P(B <= low - 1) <= alpha / 2: x_(low) is below
    high = binomial_ppf(1 - alpha / 2, n, p) + 1
    return max(low, 1), (high if high <= n else None)
