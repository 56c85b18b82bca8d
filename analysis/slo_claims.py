"""Each objective as a percentile claim ("TTFT p99 <= 2000 ms"), judged from a run's measured
requests the way MLPerf Inference's server scenario judges one, by the judgement every mode
shares (records/slo_judgement.py): the percentile against the bound (met or not; a request
that failed counts over every bound), MLPerf's early-stopping rule for whether the sample
supports the claim (records/early_stopping.py), and beside it the percentile's exact
order-statistic interval. The verdict:
PASS (met and supported), FAIL (not met), NOT VALID (met, but too few requests to say: how many
more, all under the bound, it would take)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.readers.rundir import Run
from analysis.tables import fmt_ms, markdown_table
from records.early_stopping import Judged, Verdict, rank_interval
from records.requests import CLIENT_CANCELLED, CUT_OFF, RequestRow
from records.scenarios import QUICK_S, scenario_of
from records.slo_judgement import given, judge_objectives

INTERVAL = 0.95  # the percentile's interval


@dataclass(frozen=True)
class Claim:
    judged: Judged
    low_ms: float | None  # the percentile's INTERVAL interval; high None: past the largest value
    high_ms: float | None

    @property
    def verdict(self) -> str:
        return self.judged.verdict

    @property
    def why(self) -> str:
        return why(self.judged)


def why(j: Judged) -> str:
    """The verdict in words."""
    name = f"{j.metric} p{j.percentile:g}"
    if not j.requests:
        return f"{name}: no measured request to judge"
    over = f"{j.over} of {j.requests} requests over {j.limit_ms:g} ms"
    if j.value_ms is None:  # its rank falls among requests that failed or were still waiting
        return (f"{name} is over {j.limit_ms:g} ms ({over}, counting those that failed or were "
                "still waiting past it)")
    if not j.met:
        return f"{name} {fmt_ms(j.value_ms)} ms is over {j.limit_ms:g} ms ({over})"
    if not j.supported:
        return (f"{name} {fmt_ms(j.value_ms)} ms meets {j.limit_ms:g} ms, but {over} do not "
                f"support it at 99% confidence: {j.needed - j.requests:,} more requests "
                f"needed, all under the bound (MLPerf's early stopping: {j.needed:,} in all)")
    return (f"{name} {fmt_ms(j.value_ms)} ms meets {j.limit_ms:g} ms, supported ({over}; "
            f"{j.needed:,} needed)")


def with_interval(judged: Judged, values: np.ndarray) -> Claim:
    """values: the ok requests' figures in ms, whose order statistics bound the percentile."""
    if not len(values):
        return Claim(judged, None, None)
    ordered = np.sort(values)
    low, high = rank_interval(len(values), judged.percentile, INTERVAL)
    return Claim(judged, float(ordered[low - 1]),
                 None if high is None else float(ordered[high - 1]))


def claims(run: Run) -> list[Claim]:
    """One per objective the run set (--slo-ttft-ms, ...), at --slo-percentile; none for an
    SLA search, whose probes at different rates are each judged alone (analysis/report/sla.py).
    A measured request that failed counts over every bound; one the client cancelled on
    purpose, or cut at the run's end, is not judged."""
    if run.summary.sla is not None:
        return []
    slo = run.summary.config.slo
    rows = [row for row in run.rows if row.measured_ok]
    failed = sum(1 for row in run.rows if row.streamed and not row.warmup
                 and row.status not in ("OK", CLIENT_CANCELLED, CUT_OFF))
    values = {o.field: column(rows, o.field) for o, _ in given(slo)}
    judged = judge_objectives(slo, {k: v.tolist() for k, v in values.items()}, failed)
    return [with_interval(j, values[o.field]) for j, (o, _) in zip(judged, given(slo),
                                                                    strict=True)]


def column(rows: list[RequestRow], field: str) -> np.ndarray:
    return np.asarray([v for row in rows if (v := getattr(row, field)) is not None], dtype=float)


def conditions(run: Run) -> list[tuple[bool, str]]:
    """A scenario preset's other conditions (records/scenarios.py): (met, what it asks)."""
    traffic = run.summary.config.traffic
    scenario = scenario_of(traffic.scenario)
    if scenario is None:
        return []
    need_s = QUICK_S if traffic.scenario_quick else scenario.min_duration_s
    ran_s, sent = run.summary.duration_s, run.summary.requests.sent
    return [(ran_s >= need_s, f"{traffic.scenario}: ran {ran_s:.0f} s of the {need_s:g} s "
             f"needed{' (--scenario-quick)' if traffic.scenario_quick else ''}"),
            (sent >= scenario.min_queries, f"{traffic.scenario}: {sent} queries of the "
             f"{scenario.min_queries} needed")]


def verdict(found: list[Claim], held: list[tuple[bool, str]] = ()) -> str:
    """The run's: FAIL if any claim fails, else NOT VALID if any lacks support or a condition
    is not met, else PASS."""
    kinds = {c.verdict for c in found} | {Verdict.NOT_VALID for met, _ in held if not met}
    return next((v for v in (Verdict.FAIL, Verdict.NOT_VALID) if v in kinds), Verdict.PASS)


def final_word(run: Run, found: list[Claim]) -> str:
    """The report's last line: the verdict, and for a quick scenario that it is not
    rule-conformant."""
    quick = run.summary.config.traffic.scenario_quick and run.summary.config.traffic.scenario
    return (f"verdict: {verdict(found, conditions(run))}"
            + (" (--scenario-quick: not rule-conformant)" if quick else ""))


def claims_lines(found: list[Claim], rows_omitted: int = 0,
                 held: list[tuple[bool, str]] = ()) -> list[str]:
    lines = [f"SLO {c.verdict}: {c.why}" for c in found]
    lines += [f"{'met' if met else 'NOT met'}: {what}" for met, what in held]
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
    rows = [[f"{c.judged.metric} p{c.judged.percentile:g}", f"≤ {c.judged.limit_ms:g}",
             fmt_ms(c.judged.value_ms),
             f"{fmt_ms(c.low_ms)} to {fmt_ms(c.high_ms) if c.high_ms is not None else 'above'}",
             f"{c.judged.over} of {c.judged.requests}", f"{c.judged.needed:,}", c.verdict]
            for c in found]
    return markdown_table(["objective", "bound (ms)", "value (ms)",
                           f"{INTERVAL:.0%} interval (ms)", "over the bound", "requests needed",
                           "verdict"], rows)
