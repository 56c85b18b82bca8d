"""The mode seam (loadgen/modes/): every --mode is a class registered under its `Mode`, the run
knows the protocol only, and a new mode is one class: a toy one registers and runs a real run
against a real server, its arrivals sent, its results observed, its part of the summary added."""

from __future__ import annotations

import dataclasses
import json

import pytest

from loadgen.modes import mode_class, mode_of
from loadgen.modes.base import REGISTRY, RunMode
from loadgen.modes.open_loop import TraceReplay
from records.load_settings import LoadSettings, TrafficSettings
from records.load_settings.choices import MODES, Mode
from tests.conftest import delay_server_process
from tests.test_who_is_late import locust_file


def test_every_mode_has_its_class_and_the_choices_are_the_enum():
    assert set(REGISTRY) == set(Mode) and MODES == tuple(m.value for m in Mode)
    for mode in Mode:
        base = LoadSettings()
        settings = LoadSettings(traffic=TrafficSettings(mode=mode.value),
                                stress=dataclasses.replace(base.stress, rate_step=1.0),
                                slo=dataclasses.replace(base.slo, slo_ttft_ms=100))
        run_mode = mode_of(settings)
        assert run_mode.name is mode and isinstance(run_mode, RunMode)
        assert mode_class(settings).describe(settings, 2)  # each says what it offers


def test_a_trace_is_replayed_by_its_own_class(tmp_path):
    settings = LoadSettings(traffic=TrafficSettings(trace=str(tmp_path / "t.jsonl")))
    assert mode_class(settings) is TraceReplay


TOY = '''
import dataclasses

from loadgen.modes.base import RunMode, registered
from loadgen.moe import *  # noqa: F403 (the users and their listeners)
from records.load_settings.choices import Mode


@registered(Mode.FIXED)
class Toy(RunMode):
    """Three requests 50 ms apart; the summary says how many it saw end."""

    seen = 0

    def arrivals(self):
        return iter([(0, 0.0), (1, 0.05), (2, 0.1)])

    def observe(self, result):
        Toy.seen += 1

    def summary(self, summary):
        said = [*summary.generator.warnings, f"toy saw {Toy.seen}"]
        return dataclasses.replace(summary,
                                   generator=dataclasses.replace(summary.generator, warnings=said))
'''


@pytest.mark.slow
def test_a_toy_mode_registers_and_runs(tmp_path):
    locustfile = tmp_path / "toy.py"
    locustfile.write_text(TOY)
    with delay_server_process(tmp_path, "--ttft-ms", "5", "--itl-ms", "2") as (_, port):
        done = locust_file(port, tmp_path / "run", locustfile,
                           ["-t", "2s", "--client", "gevent", "--max-tokens", "4"])
    assert done.returncode == 0, done.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"]["sent"] == summary["requests"]["ok"] == 3
    assert "toy saw 3" in summary["generator"]["warnings"]
