"""Run-to-run intervals (`analysis compare --runs A1,A2,A3 --runs B1,B2,B3 ...`): a configuration
run N times gives each figure's mean over its runs and a Student-t interval (as AIPerf's
multi-run confidence does), which says how much the figure moves from one run to the next, where
the bootstrap within one run cannot (docs/compare.md).

Configurations run interleaved in rounds (A B C A B C ...; run i of each is round i, on the same
workload seed) are judged against the first, the baseline, round by round: the change b_i / a_i,
its geometric mean over rounds and t interval on the log scale (where a figure can be 0, the
relative difference (b_i - a_i) / mean(a) instead). Each configuration's deciding figures are one
family (Bonferroni: each interval at 1 - (1 - confidence) / 5), so the chance that a
configuration no different from the baseline is told apart on any of them stays within
1 - confidence; an A/A pair (the baseline's configuration again) checks it on the machine at
hand. A change under 5% is not told apart however narrow its interval: too small to choose a
policy by."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student

from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run

BETTER, WORSE, SAME = "better", "worse", "indistinguishable"
MATERIAL = 0.05  # the least change a verdict is drawn on


@dataclass(frozen=True)
class RunFigure:
    label: str
    metric: str  # the histogram ("" for a throughput figure)
    key: str  # its percentile, or the throughput field
    lower_is_better: bool
    decides: bool  # whether verdicts are drawn on it (the rest are shown)


FIGURES = (RunFigure("goodput requests/s", "", "goodput_requests_per_s", False, True),
           RunFigure("TTFT p50 (ms)", "ttft", "p50", True, True),
           RunFigure("TTFT p99 (ms)", "ttft", "p99", True, True),
           RunFigure("TPOT p50 (ms)", "tpot", "p50", True, True),
           RunFigure("TPOT p99 (ms)", "tpot", "p99", True, True),
           RunFigure("E2E p99 (ms)", "e2e", "p99", True, False),
           RunFigure("output tokens/s", "", "output_tokens_per_s", False, False))
DECIDING = tuple(f for f in FIGURES if f.decides)


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


def figure(run: Run, f: RunFigure) -> float | None:
    if not f.metric:
        return getattr(run.summary.throughput, f.key)
    stats = stats_ms(run.histograms.get(f.metric))
    return None if stats is None or not stats.count else getattr(stats, f.key)


@dataclass(frozen=True)
class Paired:
    """One configuration against the baseline, round by round: the change's estimate and
    interval as fractions (0.12: 12% higher), the verdict and the runs it stands on."""

    change: TInterval  # on the scale below
    log_scale: bool  # change: log(b / a); else (b - a) / mean(a)
    verdict: str  # BETTER, WORSE or SAME
    runs: list[list[str]]  # [baseline run, this configuration's run] per round

    @property
    def fractions(self) -> tuple[float, float, float]:
        """(estimate, low, high) as fractions of the baseline's figure."""
        c = self.change
        if self.log_scale:
            return math.expm1(c.mean), math.expm1(c.low), math.expm1(c.high)
        return c.mean, c.low, c.high

    def as_json(self) -> dict:
        change, low, high = self.fractions
        return {"change": change, "ci": [low, high], "verdict": self.verdict,
                "n_runs": self.change.n, "runs": self.runs}


def paired(base: list[Run], other: list[Run], f: RunFigure, confidence: float) -> Paired | None:
    """None where fewer than two rounds have the figure in both, or the baseline's mean is 0."""
    rounds = [(a, b, va, vb) for a, b in zip(base, other, strict=False)
              if (va := figure(a, f)) is not None and (vb := figure(b, f)) is not None]
    log_scale = all(va > 0 and vb > 0 for *_, va, vb in rounds)
    scale = float(np.mean([va for *_, va, _ in rounds])) if rounds else 0.0
    changes = ([math.log(vb / va) for *_, va, vb in rounds] if log_scale
               else [(vb - va) / scale for *_, va, vb in rounds] if scale > 0 else [])
    change = t_interval(changes, confidence)
    if change is None:
        return None
    result = Paired(change, log_scale, SAME, [[str(a.path), str(b.path)] for a, b, *_ in rounds])
    estimate, low, high = result.fractions
    if not change.excludes_zero or abs(estimate) < MATERIAL:
        return result
    higher = low > 0
    return dataclasses.replace(result, verdict=BETTER if higher != f.lower_is_better else WORSE)


@dataclass(frozen=True)
class Repeats:
    names: list[str]  # one per configuration: its first run's directory name
    groups: list[list[Run]]  # each configuration's runs, round by round
    baseline: int
    per_config: list[dict[str, TInterval | None]]  # each figure's mean over runs, t interval
    against: list[dict[str, Paired | None]]  # each configuration against the baseline
    confidence: float  # each configuration's family's
    each: float  # each interval's: Bonferroni over the family

    @property
    def family(self) -> int:
        return len(DECIDING)


def repeats(groups: list[list[Run]], confidence: float, baseline: int = 0) -> Repeats:
    each = 1 - (1 - confidence) / len(DECIDING)
    per_config = [{f.label: t_interval([v for r in g if (v := figure(r, f)) is not None],
                                       confidence) for f in FIGURES} for g in groups]
    against = [{} if i == baseline else
               {f.label: paired(groups[baseline], g, f, each) for f in FIGURES}
               for i, g in enumerate(groups)]
    return Repeats([g[0].path.name for g in groups], groups, baseline, per_config, against,
                   confidence, each)


def change_text(p: Paired | None) -> str:
    """+12.0% [+3.1%, +20.9%]"""
    if p is None:
        return "-"
    estimate, low, high = p.fractions
    return f"{100 * estimate:+.1f}% [{100 * low:+.1f}%, {100 * high:+.1f}%]"


def significant(r: Repeats) -> dict[str, str]:
    """'config figure' -> verdict, for every deciding figure told apart over runs."""
    return {f"{r.names[i]} {f.label}": p.verdict for i, a in enumerate(r.against)
            for f in DECIDING if (p := a.get(f.label)) is not None and p.verdict != SAME}


# --- tables ---

def _mean_cell(i: TInterval | None) -> str:
    return "-" if i is None else f"{i.mean:.4g} [{i.low:.4g}, {i.high:.4g}]"


def _runs(r: Repeats, i: int) -> int:
    return len(r.groups[i])


def means_table(r: Repeats) -> tuple[list[str], list[list[str]]]:
    header = ["configuration", "runs", *(f.label for f in FIGURES)]
    return header, [[name, str(_runs(r, i)), *(_mean_cell(r.per_config[i][f.label])
                                              for f in FIGURES)]
                    for i, name in enumerate(r.names)]


def against_table(r: Repeats) -> tuple[list[str], list[list[str]]]:
    header = ["configuration", *(f"{f.label}: change, verdict" for f in DECIDING)]
    rows = []
    for i, name in enumerate(r.names):
        if i == r.baseline:
            continue
        cells = [change_text(p) + ("" if p is None else f" {p.verdict}")
                 for f in DECIDING for p in [r.against[i][f.label]]]
        rows.append([name, *cells])
    return header, rows


def how(r: Repeats) -> str:
    return (f"over runs: each figure's mean over a configuration's runs with its "
            f"{r.confidence:.0%} Student-t interval; against {r.names[r.baseline]}: the change "
            f"round by round (run i of each, the same workload), its geometric mean and t "
            f"interval at {r.each:.0%} each, so that a configuration's {r.family} intervals "
            f"together hold at {r.confidence:.0%} (Bonferroni); told apart where the interval "
            f"leaves out no change and the change is at least {MATERIAL:.0%}")
