"""A soak series' trend: the least-squares slope over time with its 95% interval, projected
over the deployment horizon and judged against its budget (analysis/soak/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MIN_WINDOWS = 3
S_PER_H = 3600.0
CONFIDENCE = 0.95
DEFAULT_HORIZON_H = 24.0
# the rise over the horizon that matters, by unit (--budget-mb, --budget-ms, --budget-requests)
DEFAULT_BUDGETS = {"MB": 500.0, "ms": 100.0, "requests": 10.0, "%": 20.0, "per min": 10.0}


@dataclass(frozen=True)
class Horizon:
    """Where the trends are projected to: hours of the same slope, and the rise each unit may
    take over them."""
    hours: float = DEFAULT_HORIZON_H
    budgets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))

    @property
    def seconds(self) -> float:
        return self.hours * S_PER_H


@dataclass(frozen=True)
class Judging:
    """How a soak's series are judged: the requests a window needs for its p99 to count, the
    smallest fitted change over the run, as a fraction of its starting level, that is drift,
    and the horizon the slopes are projected over."""
    min_samples: int = 50
    min_change: float = 0.1
    horizon: Horizon = field(default_factory=Horizon)


@dataclass(frozen=True)
class Trend:
    slope_per_s: float
    ci_per_s: tuple[float, float]  # 95%
    start: float  # fitted value at the first window
    end: float  # fitted value at the last window
    reference: float | None  # level the change is judged against; None when the series is all 0
    significant: bool  # the CI excludes 0
    run_drift: bool  # the change over the run alone exceeds --min-change
    # the fitted line fell below 0 at an end, where no latency, RSS or queue can be: start and
    # end are held at 0, and the line does not describe the series
    below_zero: bool = False
    horizon_s: float = DEFAULT_HORIZON_H * S_PER_H
    budget: float | None = None  # the rise allowed over the horizon; None: not judged
    over_budget: bool = False  # even the CI's slow end rises past the budget within the horizon

    @property
    def drift(self) -> bool:
        return self.run_drift or self.over_budget

    @property
    def undecided(self) -> bool:
        """Not drift, yet the interval's fast end over the horizon rises past the budget: the
        run cannot tell drift from none against it."""
        return (not self.drift and self.budget is not None
                and self.projected_ci[1] > self.budget)

    @property
    def longer_by(self) -> float | None:
        """For an undecided trend, about how many times longer a soak would bring the
        interval's fast end over the horizon within the budget, were the fitted slope to hold: a
        slope's interval narrows as the run's length to the power 1.5 (evenly spaced windows,
        one noise); None where the fitted slope itself reaches the budget, which a longer soak
        would call drift."""
        if not self.undecided or self.projected >= self.budget:
            return None
        low, high = self.projected_ci
        return ((high - low) / 2 / (self.budget - max(self.projected, 0.0))) ** (2 / 3)

    @property
    def projected(self) -> float:
        """The fitted slope continued over the horizon."""
        return self.slope_per_s * self.horizon_s

    @property
    def projected_ci(self) -> tuple[float, float]:
        return self.ci_per_s[0] * self.horizon_s, self.ci_per_s[1] * self.horizon_s

    @property
    def projected_share(self) -> float | None:
        return self.projected / self.reference if self.reference else None

    @property
    def hours_to_budget(self) -> float | None:
        """When the CI's slow end reaches the budget (h); None when it does not rise."""
        if self.budget is None or self.ci_per_s[0] <= 0:
            return None
        return self.budget / self.ci_per_s[0] / S_PER_H

    @property
    def change(self) -> float:
        return self.end - self.start

    @property
    def change_share(self) -> float | None:
        return self.change / self.reference if self.reference else None


def fit_trend(t_s: np.ndarray, y: np.ndarray, min_change: float, horizon_s: float | None = None,
              budget: float | None = None) -> Trend:
    """OLS of y on t with at least 3 points; drift as in the module docstring (without a
    horizon and a budget, on the run's own change only)."""
    n = len(t_s)
    if n < MIN_WINDOWS:
        raise ValueError(f"a trend needs at least {MIN_WINDOWS} points, got {n}")
    from scipy import stats  # here: importing it costs every analysis command a second

    fit = stats.linregress(t_s, y - y[0])  # shifted: a constant series fits a slope of exactly 0
    half = stats.t.ppf((1 + CONFIDENCE) / 2, n - 2) * fit.stderr
    ci = (fit.slope - half, fit.slope + half)
    start, end = (y.mean() + fit.slope * (t_s[0] - t_s.mean()),
                  y.mean() + fit.slope * (t_s[-1] - t_s.mean()))
    below_zero = min(start, end) < 0  # every series trended here is a non-negative quantity
    start, end = max(start, 0.0), max(end, 0.0)
    reference = start if start > 0 else (float(y.mean()) if y.mean() > 0 else None)
    significant = ci[0] > 0 or ci[1] < 0
    run_drift = bool(significant and reference is not None
                     and abs(end - start) > min_change * reference)
    horizon_s = DEFAULT_HORIZON_H * S_PER_H if horizon_s is None else horizon_s
    over_budget = bool(budget is not None and ci[0] * horizon_s > budget)
    return Trend(float(fit.slope), (float(ci[0]), float(ci[1])), float(start), float(end),
                 reference, bool(significant), run_drift, below_zero, horizon_s, budget,
                 over_budget)

