"""How a comparison spends its budget: which configurations (every policy, and the first one again
as the A/A pair), in what order (interleaved rounds, every other one reversed: A B C A', A' C B A,
..., so that drift through a round hits every configuration alike over two rounds and none always
runs first; each round on its own workload seed, the same for every configuration in it), and how
long each run measures: long
enough that its percentile objectives can be judged valid with none over (MLPerf's early-stopping
floor, records/early_stopping.py: 459 requests for p99) at the chosen rate, with a margin. A plan
that does not fit the budget says so, and what would make it fit, instead of running short."""

from __future__ import annotations

import math
from dataclasses import dataclass

from records.early_stopping import min_passing

MARGIN = 1.1  # requests asked for beyond the floor: arrivals are random
WARMUP_S = 2.0
OVERHEAD_S = 3.5  # a run's server start, Locust start, drain and stop, measured here
AA_SUFFIX = "-again"


class DoesNotFit(RuntimeError):
    """The plan needs more time than the budget."""


@dataclass(frozen=True)
class PlannedRun:
    round: int  # 1-based
    config: str  # its directory name: the policy, or the A/A copy
    policy: str
    seed: int


@dataclass(frozen=True)
class ComparisonPlan:
    configs: list[tuple[str, str]]  # (name, policy), the baseline first, its A/A copy last
    rounds: int
    measure_s: int
    warmup_s: float
    floor: int  # measured requests a run needs
    estimate_s: float

    @property
    def runs(self) -> list[PlannedRun]:
        return [PlannedRun(k, name, policy, seed=k) for k in range(1, self.rounds + 1)
                for name, policy in (self.configs if k % 2 else self.configs[::-1])]

    @property
    def aa(self) -> str:
        return self.configs[-1][0]

    def text(self, rate: float) -> str:
        return (f"{len(self.runs)} runs: {len(self.configs)} configurations "
                f"({', '.join(n for n, _ in self.configs)}) x {self.rounds} rounds, interleaved; "
                f"each {self.warmup_s:g} s warm-up + {self.measure_s} s measured at {rate:g}/s "
                f"(~{round(rate * self.measure_s)} requests; {self.floor} are needed for its "
                f"percentile objectives to be judged); about {self.estimate_s / 60:.1f} min")


def floor(percentile: float) -> int:
    """Measured requests for a percentile claim to be valid with none over."""
    return min_passing(0, percentile / 100)


def plan(policies: list[str], rate: float, percentile: float, rounds: int,
         budget_s: float, spent_s: float) -> ComparisonPlan:
    """Raises DoesNotFit where the runs need more than budget_s - spent_s."""
    configs = [(p, p) for p in policies] + [(policies[0] + AA_SUFFIX, policies[0])]
    need = floor(percentile)
    measure_s = max(3, math.ceil(MARGIN * need / rate))
    warmup_s = WARMUP_S
    per_run = measure_s + warmup_s + OVERHEAD_S
    estimate = len(configs) * rounds * per_run
    left = budget_s - spent_s
    if estimate > left:
        fits = int(left // (len(configs) * per_run))
        raise DoesNotFit(
            f"{len(configs)} configurations x {rounds} rounds of {per_run:.0f} s (each run "
            f"measures {measure_s} s: {need} requests for p{percentile:g} at {rate:g}/s) need "
            f"{estimate:.0f} s; {left:.0f} s of the budget are left"
            + (f" ({fits} rounds would fit, and at least 2 are needed)" if fits < 2 else
               f" ({fits} rounds would fit: --repeats {fits})")
            + f": raise --budget-s, give fewer --policies, a higher --rate or a lower "
            f"--slo-percentile (p95 needs {floor(95)} requests, p90 {floor(90)})")
    return ComparisonPlan(configs, rounds, measure_s, warmup_s, need, estimate)


def least_rate(policies: list[str], percentile: float, rounds: int, left_s: float) -> float:
    """The lowest rate at which the plan fits left_s (inf where no rate does)."""
    runs = (len(policies) + 1) * rounds
    measure_s = math.floor(left_s / runs - WARMUP_S - OVERHEAD_S)
    return math.inf if measure_s < 3 else math.ceil(1000 * MARGIN * floor(percentile)
                                                    / measure_s) / 1000
