"""The SLA search's decisions (loadgen/sla/search.py) against a fake `Probes`: a server of a
known capacity that answers each probe at once, so what is tested is where the search goes and
when it stops, not how fast this machine sends (tests/test_sla.py runs it end to end)."""

from __future__ import annotations

import logging

import pytest

from loadgen.sla.part import Done, Waiting
from loadgen.sla.search import MIN_RATE, SlaSearch
from records.load_settings import LoadSettings, SlaSettings, SloSettings, TrafficSettings

LIMIT_MS = 200.0
BATCH = 600  # requests a probe brings each time it is judged: enough for any p99 claim


class KnownCapacity:
    """A fake Probes: below capacity_rps every request meets the limit, above it every one is
    over; each collect() brings BATCH requests of the current probe."""

    def __init__(self, capacity_rps: float, problem: str = ""):
        self.capacity_rps, self.problem = capacity_rps, problem
        self.started: list[tuple[int, float]] = []
        self.cuts = 0
        self.ended = False

    def start(self, probe: int, rate: float) -> str:
        self.started.append((probe, rate))
        return self.problem

    def collect(self) -> tuple[list[Done], list[Waiting]]:
        rate = self.started[-1][1]
        ttft_ms = 20.0 if rate <= self.capacity_rps else 5 * LIMIT_MS
        return [Done(1.0, True, ttft_ms, 5.0, ttft_ms + 50) for _ in range(BATCH)], []

    def cut(self) -> None:
        self.cuts += 1

    def drained(self) -> bool:
        return True

    def end(self) -> None:
        self.ended = True


class Stalled(KnownCapacity):
    """Nothing ever answers: every request is still waiting, older than the limit."""

    def collect(self) -> tuple[list[Done], list[Waiting]]:
        return [], [Waiting(1.0, 2 * LIMIT_MS, False) for _ in range(BATCH)]


def settings(rate: float, **sla) -> LoadSettings:
    sla = {"sla_warmup_s": 0.0, "sla_probe_min_s": 0.001, "sla_growth": 2.0,
           "sla_resolution": 0.1, **sla}
    return LoadSettings(traffic=TrafficSettings(mode="sla", rate=rate),
                        slo=SloSettings(slo_ttft_ms=LIMIT_MS), sla=SlaSettings(**sla))


def search(probes: KnownCapacity, rate: float, **sla) -> SlaSearch:
    found = SlaSearch(settings(rate, **sla), probes, judge_s=0.0)
    found.watch()
    return found


def rates(found: SlaSearch) -> list[float]:
    return [p.rate_rps for p in found.probes_run]


def test_it_brackets_upward_then_bisects_to_the_resolution():
    probes = KnownCapacity(100)
    found = search(probes, 30)
    assert rates(found) == [30, 60, 120, 90, 105, 97.5]
    assert [p.verdict for p in found.probes_run] == ["PASS", "PASS", "FAIL", "PASS", "FAIL", "PASS"]
    result = found.result()
    assert (result.rate_rps, result.failed_rps) == (97.5, 105)
    assert "within 10%" in result.stopped_because
    # each probe started, was cut, and the run was ended once
    assert [n for n, _ in probes.started] == list(range(6))
    assert probes.cuts == 6 and probes.ended


def test_it_brackets_downward_from_a_start_above_capacity():
    found = search(KnownCapacity(100), 400)
    assert rates(found)[:3] == [400, 200, 100]
    result = found.result()
    assert result.rate_rps == 100 and 100 < result.failed_rps <= 110


@pytest.mark.parametrize("confirm", [1, 3])
def test_the_rate_found_is_probed_again_as_often_as_asked(confirm):
    probes = KnownCapacity(100)
    found = search(probes, 30, sla_confirm=confirm)
    assert [p.rate_rps for p in found.confirmations] == [found.passed] * confirm
    assert all(p.verdict == "PASS" for p in found.confirmations)
    assert len(probes.started) == len(found.probes_run) + confirm


def test_a_server_that_meets_nothing_ends_at_the_lowest_rate():
    found = search(KnownCapacity(0), 1, sla_max_probes=20)
    result = found.result()
    assert result.rate_rps is None and all(p.verdict == "FAIL" for p in found.probes_run)
    assert rates(found)[-1] / 2 < MIN_RATE <= rates(found)[-1]
    assert f"no rate down to {MIN_RATE:g}" in result.stopped_because


def test_requests_that_never_answer_fail_the_probe():
    found = search(Stalled(1000), 50, sla_max_probes=2)
    first = found.probes_run[0]
    assert first.verdict == "FAIL" and first.claims[0].over == BATCH


def test_the_probe_limit_ends_a_search_that_has_not_settled():
    found = search(KnownCapacity(10_000), 1, sla_max_probes=3)
    assert rates(found) == [1, 2, 4]
    assert "no answer within 3 probes" in found.result().stopped_because
    assert found.result().rate_rps == 4  # the highest that passed


def test_a_probe_that_cannot_start_stops_the_search_and_says_why():
    probes = KnownCapacity(100, problem="the schedule did not begin within 60 s")
    found = search(probes, 30)
    assert found.probes_run == [] and probes.ended
    assert found.result().stopped_because == ("no probe could start: "
                                              "the schedule did not begin within 60 s")


def test_each_probe_is_a_console_line_as_it_is_judged(caplog):
    caplog.set_level(logging.INFO, logger="loadgen")
    found = search(KnownCapacity(100), 30, sla_confirm=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SLA ")]
    assert len(lines) == len(found.probes_run) + 1
    first = found.probes_run[0].claims[0].requests  # BATCH a judgement, until it is decided
    head, _, rest = lines[0].partition(" s: ")  # "... for T s: " then the claims and verdict
    assert head.startswith("SLA probe 1: 30 requests/s for ")
    assert rest == f"TTFT p99 20.0 ms <= 200 ms PASS ({first} requests, 0 over, 459 needed): PASS"
    assert lines[2].startswith("SLA probe 3: 120 requests/s") and lines[2].endswith(": FAIL")
    assert lines[-1].startswith(f"SLA confirming probe 1: {found.passed:.4g} requests/s")
