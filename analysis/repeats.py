"""Run-to-run intervals (`analysis compare --runs A1,A2,A3 B1,B2,B3`): a configuration run N
times gives each figure's mean over its runs and a Student-t interval (as AIPerf's multi-run
confidence does), which says how much the figure moves from one run to the next, where the
bootstrap within one run cannot (docs/sla.md). Two configurations run interleaved (A B A B ...)
give the paired difference, run i of B against run i of A: its mean and t interval, and whether
it tells them apart (the interval leaves out 0)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student

from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run
from analysis.tables import markdown_table, text_table

FIGURES = (("TTFT p50 (ms)", "ttft", "p50"), ("TTFT p99 (ms)", "ttft", "p99"),
           ("TPOT p50 (ms)", "tpot", "p50"), ("TPOT p99 (ms)", "tpot", "p99"),
           ("E2E p99 (ms)", "e2e", "p99"), ("output tokens/s", "", "output_tokens_per_s"),
           ("goodput requests/s", "", "goodput_requests_per_s"))


@dataclass(frozen=True)
class TInterval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def t_interval(values: list[float], confidence: float) -> TInterval | None:
    """The mean's Student-t interval; None with fewer than two values."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    half = float(student.ppf((1 + confidence) / 2, len(x) - 1) * x.std(ddof=1)
                 / math.sqrt(len(x)))
    return TInterval(float(x.mean()), float(x.mean()) - half, float(x.mean()) + half, len(x))


def figure(run: Run, metric: str, key: str) -> float | None:
    if not metric:
        return getattr(run.summary.throughput, key)
    stats = stats_ms(run.histograms.get(metric))
    return None if stats is None or not stats.count else getattr(stats, key)


def values_of(runs: list[Run]) -> dict[str, list[float]]:
    """Each figure over the runs (a run without it left out)."""
    return {name: [v for r in runs if (v := figure(r, metric, key)) is not None]
            for name, metric, key in FIGURES}


@dataclass(frozen=True)
class Repeats:
    names: list[str]  # one per configuration: its first run's directory name
    per_config: list[dict[str, TInterval | None]]
    single: list[dict[str, list[float]]]  # each configuration's runs' own figures
    paired: dict[str, TInterval | None]  # the second configuration minus the first, run by run


def repeats(groups: list[list[Run]], confidence: float) -> Repeats:
    values = [values_of(g) for g in groups]
    paired: dict[str, TInterval | None] = {}
    if len(groups) == 2:
        first, second = groups
        for name, metric, key in FIGURES:
            pairs = [(figure(b, metric, key), figure(a, metric, key))
                     for a, b in zip(first, second, strict=False)]
            paired[name] = t_interval([b - a for b, a in pairs
                                       if b is not None and a is not None], confidence)
    return Repeats([g[0].path.name for g in groups],
                   [{name: t_interval(v, confidence) for name, v in vs.items()}
                    for vs in values], values, paired)


def _cell(i: TInterval | None) -> str:
    return "-" if i is None else f"{i.mean:.4g} [{i.low:.4g}, {i.high:.4g}]"


def rows(r: Repeats) -> list[list[str]]:
    out = []
    for name, _, _ in FIGURES:
        row = [name, *(_cell(c[name]) for c in r.per_config)]
        if r.paired:
            diff = r.paired[name]
            row += [_cell(diff), "-" if diff is None else
                    ("told apart" if diff.excludes_zero else "not told apart")]
        out.append(row)
    return out


def header(r: Repeats, confidence: float) -> list[str]:
    sizes = [len(next(iter(v.values()), [])) for v in r.single]
    cols = [f"{n} ({k} runs): mean [{confidence:.0%} t interval]"
            for n, k in zip(r.names, sizes, strict=True)]
    if r.paired:
        cols += [f"{r.names[1]} - {r.names[0]}, paired", "verdict"]
    return ["figure", *cols]


def repeats_text(r: Repeats, confidence: float) -> str:
    return ("run to run (Student t over the runs; each run's own bootstrap is above):\n"
            + text_table(header(r, confidence), rows(r)))


def repeats_markdown(r: Repeats, confidence: float) -> list[str]:
    return ["## Run to run",
            "Each figure's mean over a configuration's runs with its Student-t interval: how "
            "much it moves from one run to the next. With two configurations run interleaved, "
            "the paired difference run by run, and whether its interval leaves out 0.",
            markdown_table(header(r, confidence), rows(r))]
