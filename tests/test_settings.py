"""Settings declared once (records/): flags, casting of text (a web form, a GetStats map), checks
naming the flag, the flat JSON form, names unique across groups; the server's registries and the
checks that need them; and a made-up setting gets its flag, check and GetStats entry from its
declaration alone."""

import argparse
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from records.checks import at_least
from records.declare import (
    Settings,
    SettingsError,
    add_arguments,
    build,
    cast,
    flat,
    from_options,
    group,
    leaves,
    named,
    setting,
    text,
)
from records.jsonform import from_json
from records.load_settings import LoadSettings
from records.server_settings import ServerSettings
from records.server_stats import ServerStats
from server.__main__ import parse_args
from server.settings import prepare
from tests.conftest import REPO


@pytest.mark.parametrize("kind", [ServerSettings, LoadSettings])
def test_names_are_unique_across_groups_and_defaults_round_trip_as_text(kind):
    names = [leaf.name for leaf in leaves(kind)]
    assert len(names) == len(set(names))
    defaults = flat(kind())
    assert build(kind, {name: text(value) for name, value in defaults.items()}) == kind()


def test_text_is_cast_to_the_declared_type():
    settings = build(ServerSettings, {"max_batch_size": "4", "capacity_factor": "1.25",
                                      "renormalize": "false", "metrics_port": ""})
    assert settings.batching.max_batch_size == 4 and settings.moe.capacity_factor == 1.25
    assert settings.moe.renormalize is False and settings.serving.metrics_port is None
    assert cast(float | None, "") is None and cast(bool, "true") is True


@pytest.mark.parametrize("values, message", [
    ({"max_batch_size": "four"}, "--max-batch-size: expected an integer, got 'four'"),
    ({"max_batch_size": 0}, "--max-batch-size: must be at least 1, got 0"),
    ({"rate": -1}, "--rate: must be above 0 requests/s"),
    ({"mode": "soak"}, "--mode: unknown 'soak'; choose from fixed, stress, mixed, closed"),
    ({"profile": "sinusoid:10:0.5"}, "--rate-profile: is for --mode mixed"),
    ({"prompt_tokens": 8, "prompt_tokens_max": 4},
     "--prompt-tokens-max: must be 0 (fixed length) or at least"),
    ({"rate_profile": "x"}, "unknown setting(s) rate_profile"),
])
def test_bad_values_name_the_flag(values, message):
    kind = ServerSettings if "max_batch_size" in values else LoadSettings
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(kind, values)


def test_locust_web_form_text_becomes_settings():
    options = SimpleNamespace(rate="2.5", mode="mixed", rate_profile="bursts:10:2:3",
                              slo_ttft_ms="", max_steps="7")
    settings = from_options(LoadSettings, options, host="127.0.0.1:50051")
    assert (settings.traffic.rate, settings.traffic.profile,
            settings.stress.max_steps) == (2.5, "bursts:10:2:3", 7)
    assert settings.slo.slo_ttft_ms is None and settings.sender.host == "127.0.0.1:50051"


def test_command_line_flags_and_the_server_registries():
    settings = parse_args(["--preset", "tiny", "--no-renormalize", "--capacity-factor", "1.5",
                           "--kv-slots", "6"]).settings  # resolved
    assert settings.moe.renormalize is False and settings.moe.capacity_factor == 1.5
    assert settings.model.device == "cpu" and settings.model.dtype == "float32"
    # the preset's
    tiny = prepare(build(ServerSettings, {"preset": "tiny"}), ports=False)
    assert tiny.settings.moe.renormalize is True
    with pytest.raises(SettingsError, match="--policy: unknown 'lifo'; choose from fcfs, static"):
        prepare(build(ServerSettings, {"policy": "lifo"}))
    with pytest.raises(SettingsError, match="--max-step-tokens: must be at least --max-batch-size"):
        prepare(build(ServerSettings, {"policy": "latency_sensitive", "max_batch_size": 64,
                                     "max_step_tokens": 32}))


def test_settings_reported_by_an_older_server_read_as_the_map_would():
    older = {"policy": "fcfs", "preset": "small", "device": "cpu", "dtype": "float32",
             "max_batch_size": 8, "kv_slots_total": 12, "router": "topk", "routing_skew": "uniform",
             "capacity_factor": 0.0, "moe_kernel": "sorted", "expert_cache": 0,
             "cache_policy": "lru"}
    assert from_json(ServerStats, older, "test:").reported_settings() == {
        "policy": "fcfs", "preset": "small", "device": "cpu", "dtype": "float32",
        "max_batch_size": "8", "kv_slots": "12", "router": "topk", "routing_skew": "uniform",
        "capacity_factor": "", "moe_kernel": "sorted", "expert_cache": "0", "cache_policy": "lru"}
    newer = {"settings": {"seed": "3"}, "preset": "small"}
    assert from_json(ServerStats, newer, "test:").reported_settings() == {"seed": "3"}


@dataclass(frozen=True)
class Knobs(Settings):
    """Made-up knobs"""

    attention_window: int = setting(0, "attend to the last N positions only; 0 = all",
                                    check=at_least(0))


@dataclass(frozen=True)
class WithAKnob(Settings):
    knobs: Knobs = group(Knobs)


def test_a_new_setting_needs_nothing_but_its_declaration():
    parser = argparse.ArgumentParser()
    add_arguments(parser, WithAKnob)
    options = parser.parse_args(["--attention-window", "128"])
    assert from_options(WithAKnob, options).knobs.attention_window == 128
    with pytest.raises(SettingsError, match="--attention-window: must be at least 0, got -1"):
        build(WithAKnob, {"attention_window": "-1"})
    assert flat(WithAKnob()) == {"attention_window": 0}
    assert "--attention-window" in parser.format_help()


def test_python_m_loadgen_help_lists_every_load_option_by_group():
    done = subprocess.run([sys.executable, "-m", "loadgen", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: locust -f loadgen/moe.py")
    for leaf in leaves(LoadSettings):
        assert f"--{leaf.flag}" in done.stdout, leaf.flag
    assert "\nOffered load:\n" in done.stdout and "locust --help" in done.stdout
    wrong = subprocess.run([sys.executable, "-m", "loadgen", "--rate", "3"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "run a test with: locust -f loadgen/moe.py" in wrong.stderr



def test_a_setting_named_in_code_is_checked_against_the_declaration():
    assert named(ServerSettings, "max_batch_size", "kv_slots") == ("max_batch_size", "kv_slots")
    with pytest.raises(ValueError, match="not settings of ServerSettings: max_batch"):
        named(ServerSettings, "max_batch", "kv_slots")
