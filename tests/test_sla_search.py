"""The SLA search's decisions (loadgen/sla/search.py, loadgen/sla/watch.py) against a fake
`Probes`: a server of a known capacity that answers each probe at once, so what is tested is
where the search goes and when it stops (the ramp, not-yet-valid, a queue not settling, a
generator that falls behind), not how fast this machine sends (tests/test_sla.py runs it end
to end)."""

from __future__ import annotations

import logging

import pytest

from loadgen.sla.part import Done, ProbeSample, Waiting
from loadgen.sla.probes import Sending
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

    def rate(self) -> float:
        return self.started[-1][1]

    def collect(self) -> ProbeSample:
        ttft_ms = 20.0 if self.rate() <= self.capacity_rps else 5 * LIMIT_MS
        return sample([done(ttft_ms) for _ in range(BATCH)])

    def cut(self) -> None:
        self.cuts += 1

    def drained(self) -> bool:
        return True

    def end(self) -> None:
        self.ended = True


class Stalled(KnownCapacity):
    """Nothing ever answers: every request is still waiting, older than the limit."""

    def collect(self) -> ProbeSample:
        return sample([], [Waiting(1.0, 2 * LIMIT_MS, False, 0.0) for _ in range(BATCH)])


def done(ttft_ms: float, lag_ms: float = 0.0) -> Done:
    return Done(1.0, True, lag_ms, ttft_ms, 5.0, ttft_ms + 50)


def sample(done: list[Done], waiting: list[Waiting] = (), unsent: int = 0) -> ProbeSample:
    return ProbeSample(0, done, list(waiting), cut=False, inflight=len(waiting), unsent=unsent)


def settings(rate: float, **sla) -> LoadSettings:
    sla = {"sla_warmup_s": 0.0, "sla_probe_min_s": 0.001, "sla_growth": 2.0,
           "sla_resolution": 0.1, "sla_start_rps": rate, **sla}
    return LoadSettings(traffic=TrafficSettings(mode="sla"),
                        slo=SloSettings(slo_ttft_ms=LIMIT_MS), sla=SlaSettings(**sla))


class Ticking:
    """A clock that moves `step` seconds each time it is read: a probe's sample times do not
    hang on how busy this machine is."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def search(probes: KnownCapacity, rate: float, step: float = 0.001, **sla) -> SlaSearch:
    found = SlaSearch(settings(rate, **sla), probes, Sending(probes, 0.0, Ticking(step)))
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
    assert result.verdict == "NO ANSWER"


class SlowAlone(KnownCapacity):
    """Every request takes 300 ms to its first token, 250 over the 200 ms limit, and comes a
    second after the last: each has the server to itself."""

    sent = 0

    def collect(self) -> ProbeSample:
        self.sent += BATCH
        return sample([Done(float(i), True, 0.0, 300.0, 5.0, 350.0)
                       for i in range(self.sent - BATCH, self.sent)])


def test_a_server_that_fails_its_objective_alone_ends_with_no_answer_at_once():
    found = search(SlowAlone(0), 4, sla_max_probes=20)
    result = found.result()
    assert rates(found) == [4] and result.verdict == "NO ANSWER"
    assert ("requests that had the server to themselves were over the TTFT limit: it fails "
            "without load") in result.stopped_because


class Rated(KnownCapacity):
    """Requests come as fast as the probe's rate by the search's clock, every one under the
    limit."""

    def __init__(self, capacity_rps: float, clock: Ticking):
        super().__init__(capacity_rps)
        self.clock = clock

    def start(self, probe: int, rate: float) -> str:
        self.since = self.clock.t
        return super().start(probe, rate)

    def collect(self) -> ProbeSample:
        count, self.since = int(self.rate() * (self.clock.t - self.since)), self.clock.t
        return sample([done(20.0) for _ in range(count)])


def test_too_few_requests_is_not_a_fail_the_search_moves_up_to_where_they_come():
    # p99 needs 459 requests: a 0.2 s probe brings them from 2,295 requests/s up
    clock = Ticking(0.01)
    probes = Rated(10**6, clock)
    found = SlaSearch(settings(500, sla_probe_max_s=0.2, sla_max_probes=4), probes,
                      Sending(probes, 0.0, clock))
    found.watch()
    assert [p.verdict for p in found.probes_run] == ["NOT VALID"] * 3 + ["PASS"]
    assert rates(found) == [500, 1000, 2000, 4000]
    first = found.probes_run[0]
    assert first.judged_s < 0.1  # decided as soon as its rate could not bring them in time
    assert "459" in first.why and found.failed is None and found.passed == 4000


class Building(KnownCapacity):
    """Every request meets the limit, but above capacity those in flight grow by 50 a sample
    (the server is not keeping up, though it answers fast so far)."""

    def __init__(self, capacity_rps: float):
        super().__init__(capacity_rps)
        self.backlog = 0

    def start(self, probe: int, rate: float) -> str:
        self.backlog = 0
        return super().start(probe, rate)

    def collect(self) -> ProbeSample:
        self.backlog += 50 if self.rate() > self.capacity_rps else 0
        return sample([done(20.0) for _ in range(BATCH)],
                      [Waiting(1.0, 10.0, True, 0.0) for _ in range(self.backlog)])


def test_a_queue_that_does_not_settle_never_passes():
    # sampled every 5 ms of its clock: a probe's shortest (20 ms) has the samples to tell growth
    found = search(Building(100), 30, step=0.005, sla_probe_min_s=0.02, sla_probe_max_s=0.2)
    verdicts = {p.rate_rps: p.verdict for p in found.probes_run}
    assert all(v == ("PASS" if r <= 100 else "FAIL") for r, v in verdicts.items())
    unsettled = next(p for p in found.probes_run if p.rate_rps > 100)
    assert unsettled.growth > 0 and "in flight still growing" in unsettled.why
    result = found.result()
    assert 90 <= result.rate_rps <= 100 < result.failed_rps
    assert (result.binding, result.fall) == ("throughput", "cliff")


class SlowSender(KnownCapacity):
    """The server holds 10,000 requests/s, the generator sends 150: above it, arrivals go
    unsent and the sends it makes are late."""

    def collect(self) -> ProbeSample:
        behind = self.rate() > 150
        return sample([done(20.0, lag_ms=40.0 if behind else 0.1) for _ in range(BATCH)],
                      unsent=30 if behind else 0)


def test_a_generator_that_falls_behind_is_not_the_servers_limit():
    found = search(SlowSender(10_000), 40)
    result = found.result()
    assert [p.verdict for p in found.probes_run] == ["PASS", "PASS", "SET ASIDE", "SET ASIDE"]
    assert result.verdict == "NO ANSWER" and result.generator_limited_rps == 160
    assert result.failed_rps is None and result.rate_rps == 80  # held, not a server limit
    assert "could not offer 160 requests/s" in result.stopped_because
    assert "--processes" in result.stopped_because


class Ramped(KnownCapacity):
    """For the ramp: every request of a step under the limit up to capacity, over it above."""


def test_without_a_start_rate_a_ramp_finds_the_first_probes_rate():
    probes = Ramped(100)
    found = search(probes, 0)
    ramp = found.result().ramp
    assert [s.rate_rps for s in ramp] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert [bool(s.trouble) for s in ramp] == [False] * 7 + [True]
    assert rates(found)[0] == 64  # the last step that held
    result = found.result()
    assert result.rate_rps <= 100 < result.failed_rps


def test_each_probe_is_a_console_line_as_it_is_judged(caplog):
    caplog.set_level(logging.INFO, logger="loadgen")
    found = search(KnownCapacity(100), 30, sla_confirm=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SLA ")]
    assert len(lines) == len(found.probes_run) + 1
    first = found.probes_run[0].claims[0].requests  # BATCH a judgement, until it is decided
    head, _, rest = lines[0].partition(" s: ")  # "... for T s: " then the claims and verdict
    assert head.startswith("SLA probe 1: 30 requests/s for ")
    assert rest.startswith(f"TTFT p99 20.0 ms <= 200 ms PASS ({first} requests, 0 over, 459 "
                           "needed): PASS (every claim met and supported; in flight settled)")
    assert lines[2].startswith("SLA probe 3: 120 requests/s") and ": FAIL (" in lines[2]
    assert lines[-1].startswith(f"SLA confirming probe 1: {found.passed:.4g} requests/s")
