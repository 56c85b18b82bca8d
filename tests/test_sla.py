"""--mode sla against the known-delay oracle, whose capacity is known: 20 slots, each stream
35 ms in its slot (first token after 20 ms, then 3 more 5 ms apart), first come first served,
Poisson arrivals: an M/D/20 queue. The rate at which E2E p99 crosses the objective is found
here from that queueing model (by simulation); the search must bracket it within its
resolution (in each of three seeds, with make bench-sla: a benchmark, as how close it comes
hangs on how fast the machine sends), every probe's verdict supported by MLPerf's rule. A
distributed search is run here end to end at rates whose verdicts do not hang on the machine."""

import heapq
import json
import os

import numpy as np
import pytest

from tests.cli import analysis
from tests.conftest import delay_server_process
from tests.test_end_to_end import locust

SLOTS, SERVICE_S = 20, 0.035
SLO_E2E_MS = 80.0
RESOLUTION = 0.05
# a benchmark: how close the search comes hangs on how fast this machine sends, so make
# bench-sla runs it, with three seeds (MOE_SLA_SEEDS=1,2,3), and make test does not
SEEDS = [int(s) for s in os.environ.get("MOE_SLA_SEEDS", "").split(",") if s]


def p99_wait_s(rate: float, n: int = 200_000) -> float:
    """The M/D/c queue's p99 wait for a slot, by simulation (the oracle's pacer: a FIFO
    semaphore of SLOTS, each stream holding its slot SERVICE_S)."""
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / rate, n))
    free = [0.0] * SLOTS
    waits = np.empty(n)
    for i, t in enumerate(arrivals):
        start = max(t, heapq.heappop(free))
        waits[i] = start - t
        heapq.heappush(free, start + SERVICE_S)
    return float(np.percentile(waits[n // 10:], 99))


def true_rate(budget_s: float) -> float:
    """The rate whose p99 wait is the budget, by bisection."""
    low, high = 100.0, SLOTS / SERVICE_S
    while high - low > 1.0:
        mid = (low + high) / 2
        low, high = (mid, high) if p99_wait_s(mid) <= budget_s else (low, mid)
    return (low + high) / 2


@pytest.mark.slow
@pytest.mark.skipif(not SEEDS, reason="a benchmark: make bench-sla")
@pytest.mark.parametrize("seed", SEEDS or [0])
def test_the_search_brackets_the_queueing_models_rate(tmp_path, seed):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "moe", "--capacity", str(SLOTS),
                              "--ttft-ms", "20", "--itl-ms", "5") as (_, port):
        done = locust(port, run_dir, "--mode", "sla", "--rate", "400", "--seed", str(seed),
                      "--sla-growth", "1.5", "--sla-warmup-s", "0.5", "--sla-probe-min-s", "3",
                      "--slo-e2e-ms", str(SLO_E2E_MS), "--sla-resolution", str(RESOLUTION),
                      "--max-tokens", "4", "--prompt-tokens", "8", "-t", "200")
    assert done.returncode == 0, done.stdout
    sla = json.loads((run_dir / "summary.json").read_text())["sla"]
    # the time outside the slot (the network, both loops), from the first probe's requests (at
    # 400/s the model's median wait is nought)
    second_s = sla["probes"][1]["started_s"]
    first = [r["e2e_ms"] for r in map(json.loads, open(run_dir / "requests.jsonl"))
             if r["e2e_ms"] is not None and r["scheduled_ms"] < 1000 * second_s]
    outside_ms = float(np.median(first)) - 1000 * SERVICE_S
    truth = true_rate((SLO_E2E_MS - outside_ms - 1000 * SERVICE_S) / 1000)
    passed, failed = sla["rate_rps"], sla["failed_rps"]
    assert passed is not None and failed is not None, sla["stopped_because"]
    assert (failed - passed) / passed <= RESOLUTION
    assert passed <= truth * (1 + RESOLUTION) and failed >= truth * (1 - RESOLUTION), \
        (passed, failed, truth)
    for probe in sla["probes"]:  # every verdict as MLPerf's rule allows it
        claim, = probe["claims"]
        assert probe["verdict"] in ("PASS", "FAIL")
        assert probe["verdict"] != "PASS" or claim["requests"] >= claim["needed"] >= 459
    out = analysis("report", run_dir).stdout
    assert f"{passed:.4g} requests/s holds the objectives" in out
    assert (run_dir / "sla.png").exists()


@pytest.mark.slow
def test_a_distributed_search_decides_on_the_master_and_confirms_its_rate(tmp_path):
    # two workers send, the master judges. The server: 40 slots of 160 ms, 250 requests/s at
    # most; at 100/s (40% of it) every request has 140 ms to spare under the 300 ms objective,
    # at 300/s the queue grows by 50 a second: the first two verdicts do not hang on how fast
    # a loaded machine sends (tests/test_sla_search.py has the search's decisions alone); p90
    # claims, which a few dozen requests can support, keep the probes short
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "moe", "--capacity", "40",
                              "--ttft-ms", "100", "--itl-ms", "20") as (_, port):
        done = locust(port, run_dir, "--processes", "2", "-u", "2", "--mode", "sla",
                      "--rate", "100", "--sla-growth", "3", "--sla-warmup-s", "0.5",
                      "--sla-probe-min-s", "1", "--sla-resolution", "0.99", "--sla-confirm", "1",
                      "--slo-e2e-ms", "300", "--slo-percentile", "90", "--max-tokens", "4",
                      "--prompt-tokens", "8", "-t", "120")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    sla = summary["sla"]
    # a third probe between them; should 200/s fail, a fourth at 150/s
    assert [p["rate_rps"] for p in sla["probes"]][:3] == [100, 300, 200], sla
    assert [p["verdict"] for p in sla["probes"]][:2] == ["PASS", "FAIL"]
    assert sla["rate_rps"] in (100, 150, 200) and len(sla["confirmations"]) == 1
    assert sla["confirmations"][0]["rate_rps"] == sla["rate_rps"]
    # every probe's judged requests came from both workers, which sent half each
    sent = [w["sent"] for w in summary["workers"]]
    assert len(sent) == 2 and min(sent) > 0.4 * sum(sent)
    judged = sum(p["claims"][0]["requests"] for p in sla["probes"] + sla["confirmations"])
    assert 0 < judged <= summary["requests"]["sent"]
    first = sla["probes"][0]["claims"][0]  # a pass stands on the requests MLPerf's rule needs
    assert first["requests"] >= first["needed"] > 0
    out = analysis("report", run_dir).stdout.rstrip().splitlines()
    last = next(line for line in reversed(out) if line.startswith("verdict: "))
    confirmed = sla["confirmations"][0]["verdict"] == "PASS"
    assert last.startswith("verdict: PASS at" if confirmed else "verdict: NOT CONFIRMED"), last
    assert not any(line.startswith("SLO ") for line in out)  # no claim over mixed rates


@pytest.mark.slow
def test_a_search_with_no_answer_says_so_and_exits_1(tmp_path):
    # every first token takes 300 ms against a 100 ms objective: no rate can hold it
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "moe", "--ttft-ms", "300",
                              "--itl-ms", "5") as (_, port):
        done = locust(port, run_dir, "--mode", "sla", "--rate", "20", "--sla-max-probes", "2",
                      "--sla-warmup-s", "0", "--sla-probe-min-s", "1", "--sla-probe-max-s", "2",
                      "--slo-ttft-ms", "100", "--slo-percentile", "90", "--max-tokens", "4",
                      "--prompt-tokens", "8", "-t", "60")
    assert done.returncode == 1, done.stdout
    sla = json.loads((run_dir / "summary.json").read_text())["sla"]
    assert sla["rate_rps"] is None and [p["verdict"] for p in sla["probes"]] == ["FAIL", "FAIL"]
    lines = done.stdout.splitlines()
    said = next(line for line in lines if line.startswith("SLA search: "))
    assert said == f"SLA search: NO ANSWER; {sla['stopped_because']}"
    headline = json.loads(next(line for line in lines if line.startswith('{"run_dir"')))
    assert (headline["sla_rps"], headline["sla_verdict"]) == (None, "NO ANSWER")
