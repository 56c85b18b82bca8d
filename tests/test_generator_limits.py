"""loadgen/recording/limits.py: which figures the load generator itself limited, and from when,
from what the recorder saw (events read together, late sends, a late loop); and how a run says
it: summary.json's generator.limited, a warning, the latency table and the last line."""

from __future__ import annotations

import json

from loadgen.console import print_summary
from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.health import generator_health
from loadgen.recording.limits import COALESCED_US, LATE_US, GeneratorLimits
from loadgen.recording.recorder import Recorder
from loadgen.recording.summary import Span, summarize
from loadgen.targets.client import StreamResult
from records.declare import build
from records.load_settings import LoadSettings

S = 1_000_000_000
MS = 1_000_000


def test_a_healthy_run_limits_nothing():
    limits = GeneratorLimits()
    for second in range(10):
        limits.gaps(second, [10_000] * 99)
        limits.send(second, 300)
        limits.wake(second, 100)
    assert limits.limited() == {}


def test_events_read_together_limit_itl_from_the_second_they_began():
    limits = GeneratorLimits()
    for second in range(10):
        together = second >= 4
        limits.gaps(second, [0] * 30 + [10_000] * 70 if together else [10_000] * 100)
    limited = limits.limited()
    assert list(limited) == ["itl"]
    assert limited["itl"].startswith("from 4 s of the run") and "30.0%" in limited["itl"]


def test_a_stray_gap_or_a_blip_at_the_end_limits_nothing():
    limits = GeneratorLimits()
    for second in range(60):
        limits.gaps(second, [COALESCED_US - 1] * (second == 7) + [10_000] * 100)
        limits.wake(second, LATE_US + 1 if second == 59 else 10)
        for _ in range(200):
            limits.wake(second, 10)
    assert limits.limited() == {}


def test_late_sends_limit_ttft_and_a_late_loop_every_timestamp():
    limits = GeneratorLimits()
    for second in range(5):
        for _ in range(50):
            limits.send(second, LATE_US + 1 if second >= 2 else 100)
    assert list(limits.limited()) == ["ttft"]
    for second in range(5):
        for _ in range(200):
            limits.wake(second, LATE_US + 1)
    assert sorted(limits.limited()) == ["itl", "ttft"]
    assert limits.limited()["ttft"].startswith("from 0 s")  # the loop was late from the start


def test_a_late_loop_spoils_no_timestamp_the_kernel_took():
    limits = GeneratorLimits()
    for second in range(5):
        for _ in range(200):
            limits.wake(second, LATE_US + 1)
    assert sorted(limits.limited()) == ["itl", "ttft"]
    assert limits.limited(kernel_timed=True) == {}  # its sends, on time, say what it spoilt


def test_a_recorder_counts_the_streams_the_kernel_timed():
    rec = Recorder(start_ns=0, warmup_s=0)
    for i, kernel in enumerate([True] * 99 + [False]):
        result = StreamResult(f"r{i}", 0, sent_ns=1, recv_ns=[2 * MS, 3 * MS], tokens=[1, 1],
                              server_elapsed_us=[0, 0], finish_reason="length")
        result.kernel_timed = kernel
        rec.add(result)
    assert rec.kernel_timed == 99 and rec.kernel_timed_share == 0.99
    for _ in range(100):  # a loop late by 20 ms: its sends could be, its timestamps are not
        rec.loop_lag(S, 20_000)
    (warning,) = [w for w in generator_health(rec, GeneratorCpu(10.0)).warnings if "loop" in w]
    assert "its sends could be that late" in warning and "timestamps are" not in warning


def test_counts_from_several_processes_add_up():
    one, other = GeneratorLimits(), GeneratorLimits()
    one.gaps(3, [0] * 40)
    other.gaps(3, [10_000] * 60)
    merged = GeneratorLimits()
    merged.absorb(json.loads(json.dumps(one.export())))
    merged.absorb(other.export())
    assert "40.0%" in merged.limited()["itl"]


def stream(start_ns: int, index: int, read_together: bool) -> StreamResult:
    """A 20-event stream sent on time; read_together: its events two to a read."""
    scheduled = start_ns + index * 10 * MS
    times = [scheduled + 50 * MS + k * 10 * MS for k in range(20)]
    if read_together:
        times = [times[k | 1] for k in range(20)]
    return StreamResult(f"r{index}", scheduled, max_tokens=20, sent_ns=scheduled + 100_000,
                        recv_ns=times, tokens=[1] * 20, server_elapsed_us=[0] * 20,
                        finish_reason="length")


def run_said(capsys, read_together: bool) -> tuple[dict, str]:
    """A run's summary and what it printed, its streams' events read one or two at a time."""
    start_ns = 10 * S
    rec = Recorder(start_ns, 0.0)
    for i in range(200):
        rec.add(stream(start_ns, i, read_together))
    rec.stop_ns = start_ns + 3 * S
    summary = summarize(build(LoadSettings, {}), rec, Span(0.0, 3.0, 3.0), GeneratorCpu(30.0))
    print_summary(summary, "run")
    return summary, capsys.readouterr().out


def test_a_run_whose_events_came_together_says_so_in_its_table_warnings_and_last_line(capsys):
    summary, out = run_said(capsys, read_together=True)
    assert list(summary.generator.limited) == ["itl"]
    lines = out.splitlines()
    itl = next(line for line in lines if line.startswith("itl "))
    assert "generator-limited" in itl and "0.0" not in itl  # no 0 ms gap read as measured
    assert any(line.startswith("WARNING: ITL is generator-limited from 0 s") for line in lines)
    assert json.loads(lines[-1])["generator_limited"] == ["itl"]


def test_a_run_timed_truly_says_nothing_of_it(capsys):
    summary, out = run_said(capsys, read_together=False)
    assert summary.generator.limited == {}
    assert "generator-limited" not in out
    assert "generator_limited" not in json.loads(out.splitlines()[-1])


def test_one_late_send_of_a_short_run_is_not_a_limit():
    limits = GeneratorLimits()
    for second in range(20):
        for k in range(4):
            limits.send(second, LATE_US + 1 if (second, k) == (3, 0) else 100)
    assert limits.limited() == {}
