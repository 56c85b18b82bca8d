"""Who is late: the delivery lag split into the generator's own loop lag (a timer on its event
loop), the server's write delay (GetStats write_ms) and the rest; percentiles of the server's
bucketed histogram; the diagnosis accusing the generator only on its own lag (or its wait for
a core) and naming the server's writes when they dominate. Then real runs: a real server at low
load leaves the generator unaccused, and a generator starved by a greenlet that does not yield
is accused."""

import json
import subprocess

import pytest

from analysis.diagnosis import diagnose
from analysis.readers.rundir import load_run
from analysis.rules.delivery import delivery_split
from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.health import generator_health
from loadgen.recording.recorder import Recorder
from records.server_stats import Histogram, bucket_stats
from tests.cli import analysis
from tests.conftest import REPO, server_process
from tests.rundirs import encoded
from tests.test_analysis import write_run
from tests.test_diagnosis import finding
from tests.test_end_to_end import locust

BOUNDS = [0.25, 0.5, 1.0, 2.5, 5.0]


def write_ms(counts: list[int], total: float) -> dict:
    return {"bounds": BOUNDS, "counts": counts, "count": sum(counts), "sum": total, "max": 9.0}


def test_bucket_percentiles_are_the_bound_they_fall_under():
    before = Histogram(bounds=BOUNDS, counts=[5, 0, 0, 0, 0, 0], count=5, sum=1.0, max=0.2)
    now = Histogram(bounds=BOUNDS, counts=[5, 50, 40, 8, 1, 1], count=105, sum=61.0, max=9.0)
    stats = bucket_stats(now, before)
    assert (stats.count, stats.mean, stats.p50, stats.p99) == (100, 0.6, 0.5, 5.0)
    assert bucket_stats(before, before) is None


def run_with(tmp_path, delivery: list[float], loop: list[float], write_counts: list[int],
             write_total: float):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["generator"] = {"late_sends": 0, "late_threshold_ms": 5.0, "cpu_percent": 5.0,
                            "warnings": []}
    summary["server"]["start"]["write_ms"] = write_ms([0] * 6, 0.0)
    summary["server"]["end"]["write_ms"] = write_ms(write_counts, write_total)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    histograms = json.loads((run_dir / "histograms.json").read_text())
    histograms |= {"delivery_lag": encoded(delivery), "loop_lag": encoded(loop),
                   "send_lag": encoded([0.1] * 100)}
    (run_dir / "histograms.json").write_text(json.dumps(histograms))
    return load_run(run_dir)


def test_the_split_and_a_server_write_delay_that_dominates(tmp_path):
    # delivery 4 ms mean; the generator's loop 0.2 ms; the server's writes 3 ms mean, p99 <= 5
    run = run_with(tmp_path, [4.0] * 100, [0.2] * 100, [0, 0, 0, 60, 39, 1], 300.0)
    split = delivery_split(run)
    assert split.write.mean == 3.0 and split.rest_mean_ms == pytest.approx(0.8, abs=0.01)
    findings = diagnose(run)
    writes = finding(findings, "server_write_delay")
    assert writes.fired and "most of the delivery lag" in writes.verdict
    assert "interpreter lock" in writes.verdict
    assert not finding(findings, "generator_limited").fired  # 4 ms delivery lag, not its own


def test_a_generator_kept_waiting_for_a_core_is_accused_and_the_headline_says_so(tmp_path):
    run = run_with(tmp_path, [4.0] * 100, [0.2] * 100, [90, 10, 0, 0, 0, 0], 20.0)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["generator"]["cpu_wait_percent"] = 33.0  # measured beside a vLLM CPU worker
    (run.path / "summary.json").write_text(json.dumps(summary))
    late = finding(diagnose(load_run(run.path)), "generator_limited")
    assert late.fired and "it waited for a core 33% of the run" in late.verdict
    headline = analysis("report", run.path).stdout.splitlines()[2]
    assert "as the load generator measured them while it was itself late" in headline
    summary["generator"]["cpu_wait_percent"] = 3.0  # the same, from the server's own session
    (run.path / "summary.json").write_text(json.dumps(summary))
    assert not finding(diagnose(load_run(run.path)), "generator_limited").fired
    warned = generator_health(Recorder(0, 0.0), GeneratorCpu(4.0, 33.0)).warnings
    assert any("waited for a core 33% of the run" in w and "same login session" in w
               for w in warned)
    assert not generator_health(Recorder(0, 0.0), GeneratorCpu(4.0, 3.0)).warnings


def test_a_busy_generator_is_warned_of_past_its_own_clients_bound():
    def warned(used: float, client: str) -> list[str]:
        return generator_health(Recorder(0, 0.0), GeneratorCpu(used), client=client).warnings

    # the aio sender times messages by the kernel's receipt: busy means its sends, later
    assert not warned(60.0, "aio") and "sends fall behind" in warned(85.0, "aio")[0]
    assert "receive timestamps lag" in warned(60.0, "gevent")[0]


def test_small_writes_leave_the_server_unaccused(tmp_path):
    run = run_with(tmp_path, [4.0] * 100, [0.2] * 100, [90, 10, 0, 0, 0, 0], 20.0)
    assert not finding(diagnose(run), "server_write_delay").fired


STARVED = '''
"""The load generator with a greenlet that computes 30 ms at a time without yielding."""
import time

import gevent
from locust import events

from loadgen.moe import *  # noqa: F403 (the users and their listeners)


def hog():
    while True:
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass
        gevent.sleep(0.02)


@events.test_start.add_listener
def start_hog(**_):
    gevent.spawn(hog)
'''


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.parametrize("starved", [False, True], ids=["quiet", "starved"])
def test_only_a_generator_that_is_late_itself_is_accused(tmp_path, starved):
    locustfile = tmp_path / "starved.py"
    locustfile.write_text(STARVED)
    # the demo's load (2 requests/s, 64 + 32 tokens) on the tiny preset, whose steps leave the
    # generator a core of a 2-core machine
    with server_process(tmp_path) as (_, port):
        flags = ["-t", "6s", "--rate", "2", "--prompt-tokens", "64", "--max-tokens", "32",
                 "--warmup-s", "2"]
        # the hog starves the Locust process's loop: the greenlets' timestamps (the default's
        # aio sender, a process of its own, is not held up by it)
        done = (locust_file(port, tmp_path / "run", locustfile, [*flags, "--client", "gevent"])
                if starved else locust(port, tmp_path / "run", *flags))
    assert done.returncode == 0, done.stdout
    run = load_run(tmp_path / "run")
    generator = finding(diagnose(run), "generator_limited")
    assert generator.fired is starved, generator.verdict
    loop = run.summary.metrics["loop_lag_ms"]
    assert (loop.p99 > 20) is starved
    # the figures it spoilt are named, in summary.json and in the run's last line
    assert bool(run.summary.generator.limited) is starved, run.summary.generator.limited
    headline = json.loads(next(line for line in reversed(done.stdout.splitlines())
                               if line.startswith('{"run_dir"')))
    assert ("generator_limited" in headline) is starved, headline
    write = delivery_split(run).write
    assert write is not None and write.count >= 100  # the server's own account, every message


def locust_file(port: int, run_dir, locustfile, flags: list[str]) -> subprocess.CompletedProcess:
    cmd = [str(REPO / ".venv/bin/locust"), "-f", str(locustfile), "--host", f"127.0.0.1:{port}",
           "--headless", "--only-summary", "--run-dir", str(run_dir), *flags]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
