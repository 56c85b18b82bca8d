"""Each objective as a percentile claim ("TTFT p99 <= 2000 ms"), judged from a run's measured
requests the way MLPerf Inference's server scenario judges one: the percentile against the
bound (met or not), MLPerf's early-stopping rule for whether the sample supports the claim
(records/early_stopping.py), and the percentile's exact order-statistic interval. The verdict:
PASS (met and supported), FAIL (not met), NOT VALID (met, but too few requests to say: how many
more, all under the bound, it would take)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.readers.rundir import Run
from analysis.tables import fmt_ms, markdown_table
from records.early_stopping import Validity, rank_interval, validity
from records.requests import RequestRow

OBJECTIVES = (("TTFT", "ttft_ms", "slo_ttft_ms"), ("TPOT", "tpot_ms", "slo_tpot_ms"),
              ("E2E", "e2e_ms", "slo_e2e_ms"))
INTERVAL = 0.95  # the percentile's interval


@dataclass(frozen=True)
class Claim:
    metric: str  # TTFT, TPOT, E2E
    percentile: float
    limit_ms: float
    value_ms: float | None  # the sample's percentile (nearest rank); None: no request
    low_ms: float | None  # its INTERVAL interval; high None: past the largest value
    high_ms: float | None
    support: Validity

    @property
    def met(self) -> bool:
        return self.value_ms is not None and self.value_ms <= self.limit_ms

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.met else "PASS" if self.support.valid else "NOT VALID"

    @property
    def why(self) -> str:
        s = self.support
        name = f"{self.metric} p{self.percentile:g}"
        if self.value_ms is None:
            return f"{name}: no measured request to judge"
        over = f"{s.over} of {s.requests} requests over {self.limit_ms:g} ms"
        if not self.met:
            return f"{name} {fmt_ms(self.value_ms)} ms is over {self.limit_ms:g} ms ({over})"
        if not s.valid:
            return (f"{name} {fmt_ms(self.value_ms)} ms meets {self.limit_ms:g} ms, but {over} "
                    f"do not support it at 99% confidence: {s.more:,} more requests needed, all "
                    f"under the bound (MLPerf's early stopping: {s.needed:,} in all)")
        return (f"{name} {fmt_ms(self.value_ms)} ms meets {self.limit_ms:g} ms, supported "
                f"({over}; {s.needed:,} needed)")


def claim(metric: str, values: np.ndarray, limit_ms: float, percentile: float) -> Claim:
    """values: the measured requests' figures in ms."""
    n = len(values)
    if not n:
        return Claim(metric, percentile, limit_ms, None, None, None, validity(0, 0, percentile))
    ordered = np.sort(values)
    rank = max(1, int(np.ceil(percentile / 100 * n)))  # nearest rank, as LoadGen's
    low, high = rank_interval(n, percentile, INTERVAL)
    over = int((ordered > limit_ms).sum())
    return Claim(metric, percentile, limit_ms, float(ordered[rank - 1]), float(ordered[low - 1]),
                 None if high is None else float(ordered[high - 1]),
                 validity(n, over, percentile))


def claims(run: Run) -> list[Claim]:
    """One per objective the run set (--slo-ttft-ms, ...), at --slo-percentile."""
    slo = run.summary.config.slo
    rows = [row for row in run.rows if row.measured_ok]
    return [claim(name, column(rows, field), getattr(slo, setting), slo.slo_percentile)
            for name, field, setting in OBJECTIVES if getattr(slo, setting) is not None]


def column(rows: list[RequestRow], field: str) -> np.ndarray:
    return np.asarray([v for row in rows if (v := getattr(row, field)) is not None], dtype=float)


def verdict(found: list[Claim]) -> str:
    """The run's: FAIL if any claim fails, else NOT VALID if any lacks support, else PASS."""
    kinds = {c.verdict for c in found}
    return next(v for v in ("FAIL", "NOT VALID", "PASS") if v in kinds)


def claims_lines(found: list[Claim], rows_omitted: int = 0) -> list[str]:
    lines = [f"SLO {c.verdict}: {c.why}" for c in found]
    if rows_omitted:
        lines.append(f"requests.jsonl left out {rows_omitted:,} requests (--max-request-rows): "
                     "the claims are judged from the rest")
    return lines


def runs_lines(names: list[str], runs: list[Run]) -> list[str]:
    """Each run's verdict on its objectives and why, for compare and soak; [] when no run set
    an objective."""
    judged = [(name, claims(run)) for name, run in zip(names, runs, strict=True)]
    return [f"{name}: {verdict(found)}: " + "; ".join(c.why for c in found)
            for name, found in judged if found]


def claims_markdown(found: list[Claim]) -> str:
    rows = [[f"{c.metric} p{c.percentile:g}", f"≤ {c.limit_ms:g}", fmt_ms(c.value_ms),
             f"{fmt_ms(c.low_ms)} to {fmt_ms(c.high_ms) if c.high_ms is not None else 'above'}",
             f"{c.support.over} of {c.support.requests}", f"{c.support.needed:,}", c.verdict]
            for c in found]
    return markdown_table(["objective", "bound (ms)", "value (ms)",
                           f"{INTERVAL:.0%} interval (ms)", "over the bound", "requests needed",
                           "verdict"], rows)
