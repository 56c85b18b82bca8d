"""The decision over repeat runs (analysis/repeats.py, analysis/recommendation.py): a paired change
is judged on the log scale, told apart only where its interval leaves out no change and it is at
least 5%; each policy's verdict against the baseline (goodput first, then latency; a policy that
held nothing back is not credited); the pick, and no pick where the A/A pair is told apart or
nothing is distinguishable."""

import math
from pathlib import Path

import pytest

from analysis import repeats as repeats_module
from analysis.recommendation import AA, MIXED, NOT_ATTRIBUTED, Evidence, recommend
from analysis.repeats import (
    BETTER,
    DECIDING,
    SAME,
    WORSE,
    Paired,
    Repeats,
    TInterval,
    change_text,
    paired,
)

GOODPUT, TTFT_P50, TTFT_P99, TPOT_P50, _ = (f.label for f in DECIDING)


class FakeRun:
    def __init__(self, name: str, value: float):
        self.path = Path(name)
        self.value = value


@pytest.fixture
def values(monkeypatch):
    monkeypatch.setattr(repeats_module, "figure", lambda run, f: run.value)


def runs(name: str, *vs: float) -> list[FakeRun]:
    return [FakeRun(f"round-{i}/{name}", v) for i, v in enumerate(vs, 1)]


def test_a_consistent_change_is_told_apart_on_the_log_scale(values):
    p = paired(runs("fcfs", 7.0, 6.6, 7.3), runs("static", 35.0, 42.0, 36.0), DECIDING[1], 0.99)
    assert p.verdict == WORSE and p.log_scale and p.change.n == 3
    ratios = [35 / 7, 42 / 6.6, 36 / 7.3]
    assert p.fractions[0] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 3) - 1)
    assert p.runs[0] == ["round-1/fcfs", "round-1/static"]
    higher = paired(runs("a", 10.0, 10.0, 10.0), runs("b", 20.0, 21.0, 19.0), DECIDING[0], 0.99)
    assert higher.verdict == BETTER  # goodput: higher is better


def test_a_small_or_uncertain_change_is_not_told_apart(values):
    # 3% higher every round, with no spread: certain, but too small to choose by
    small = paired(runs("a", 10.0, 20.0, 30.0), runs("b", 10.3, 20.6, 30.9), DECIDING[1], 0.99)
    assert small.verdict == SAME and small.fractions[0] == pytest.approx(0.03)
    noisy = paired(runs("a", 10.0, 10.0, 10.0), runs("b", 20.0, 8.0, 14.0), DECIDING[1], 0.99)
    assert noisy.verdict == SAME
    assert paired(runs("a", 10.0), runs("b", 20.0), DECIDING[1], 0.99) is None


def test_a_figure_that_can_be_zero_is_judged_as_a_relative_difference(values):
    p = paired(runs("a", 10.0, 12.0, 11.0), runs("b", 0.0, 0.0, 0.0), DECIDING[0], 0.99)
    assert not p.log_scale and p.fractions[0] == pytest.approx(-1.0) and p.verdict == WORSE


def told(change: float, verdict: str) -> Paired:
    c = math.log1p(change)
    return Paired(TInterval(c, c - 0.1, c + 0.1, 3), True, verdict, [])


def comparison(*configs: tuple[str, dict[str, Paired]]) -> Repeats:
    """The baseline fcfs and the given configurations, each with its told-apart figures."""
    names = ["fcfs", *(name for name, _ in configs)]
    against = [{}] + [{f.label: figs.get(f.label, told(0.0, SAME)) for f in DECIDING}
                      for _, figs in configs]
    return Repeats(names, [[None] * 3 for _ in names], 0, [{} for _ in names], against,
                   0.95, 0.99)


def evidence(policy: str, held: int = 10) -> Evidence:
    return Evidence(policy, [held, held, held], 2.0, 3.0)


AT = "at 30 requests/s with TTFT p99 <= 500 ms"


def test_static_and_dynamic_worse_and_the_rest_alike_pick_the_baseline():
    r = comparison(("static", {TTFT_P50: told(4.0, WORSE)}),
                   ("dynamic", {TTFT_P50: told(2.0, WORSE)}), ("expert_aware", {}),
                   ("fcfs-again", {}))
    ev = [evidence("fcfs"), evidence("static"), evidence("dynamic"), evidence("expert_aware"),
          evidence("fcfs")]
    rec = recommend(r, ev, AT, aa=4)
    assert rec.policy == "fcfs" and rec.aa_ok is True
    assert rec.headline == (f"{AT}: pick fcfs; expert_aware indistinguishable from fcfs; "
                            "static and dynamic worse than fcfs")
    assert rec.would_change.startswith("intervals of figures read indistinguishable reach +-10%")
    assert [v.verdict for v in rec.verdicts] == [WORSE, WORSE, SAME, AA]


def test_a_better_policy_is_picked_with_its_figures():
    r = comparison(("expert_aware", {TTFT_P99: told(-0.3, BETTER)}),
                   ("static", {TTFT_P50: told(4.0, WORSE)}))
    rec = recommend(r, [evidence("fcfs"), evidence("expert_aware"), evidence("static")], AT)
    assert rec.policy == "expert_aware" and rec.aa_ok is None
    assert rec.headline.startswith(f"{AT}: pick expert_aware (goodput +0.0% [")
    assert "against fcfs; TTFT p99 -30.0% [" in rec.headline
    assert "static worse than fcfs" in rec.headline


def test_goodput_decides_before_latency_and_both_ways_is_a_trade_off():
    r = comparison(("a", {GOODPUT: told(0.2, BETTER), TTFT_P50: told(0.5, WORSE)}),
                   ("b", {TTFT_P50: told(-0.5, BETTER), TPOT_P50: told(0.3, WORSE)}))
    rec = recommend(r, [evidence("fcfs"), evidence("a"), evidence("b")], AT)
    assert [v.verdict for v in rec.verdicts] == [BETTER, MIXED] and rec.policy == "a"


def test_a_policy_that_held_nothing_back_is_not_credited():
    r = comparison(("expert_aware", {TTFT_P99: told(-0.7, BETTER)}), ("latency_sensitive", {}))
    ev = [evidence("fcfs"), evidence("expert_aware", held=0), evidence("latency_sensitive")]
    rec = recommend(r, ev, AT)
    assert rec.verdicts[0].verdict == NOT_ATTRIBUTED and "held no work back" in rec.verdicts[0].why
    assert rec.policy is None and rec.headline == f"{AT}: no policy is distinguishable from fcfs"
    assert rec.would_change.startswith("intervals of figures read indistinguishable")


def test_an_aa_pair_told_apart_leaves_no_recommendation():
    r = comparison(("static", {TTFT_P50: told(4.0, WORSE)}),
                   ("fcfs-again", {TPOT_P50: told(0.2, WORSE)}))
    rec = recommend(r, [evidence("fcfs"), evidence("static"), evidence("fcfs")], AT, aa=2)
    assert rec.policy is None and rec.aa_ok is False
    assert "fcfs against itself was told apart (TPOT p50 +20.0%" in rec.headline


def test_the_change_reads_as_percent():
    assert change_text(told(0.25, WORSE)).startswith("+25.0% [")
    assert change_text(None) == "-"
