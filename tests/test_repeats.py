"""Repeat runs (`analysis compare --runs A1,A2,A3 --runs B1,B2,B3`): each configuration's figures
over its runs with a Student-t interval, checked against scipy's formula; two configurations of
the known-delay reference that differ by a known 5 ms of TTFT (25% of 20 ms), run interleaved A B
A B A B, told apart round by round, about +25% (tests/test_compare_policies.py runs an A/A pair
through `make compare`'s driver)."""

import json
import re

import numpy as np
import pytest
from scipy import stats

from analysis.repeats import t_interval
from tests.cli import analysis
from tests.conftest import delay_server_process
from tests.test_end_to_end import locust


def test_the_t_interval_is_the_textbook_one():
    values = [10.0, 12.0, 11.0, 13.0]
    got = t_interval(values, 0.95)
    low, high = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    assert (got.low, got.high) == (pytest.approx(low), pytest.approx(high))
    assert t_interval([1.0], 0.95) is None


def _cells(out: str, config: str) -> list[str]:
    """The configuration's row of the 'against the baseline' table."""
    section = out.split("round by round:")[1]
    row = next(line for line in section.splitlines() if line.startswith(config + " "))
    return re.findall(r"([+-][\d.]+)% \[([+-][\d.]+)%, ([+-][\d.]+)%\] (\w+)", row)


@pytest.mark.slow
@pytest.mark.timing
def test_interleaved_runs_tell_a_known_delay_apart(tmp_path):
    runs = {"a": [], "b": []}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (delay_server_process(tmp_path / "a", "--protocol", "moe", "--ttft-ms", "20")
          as (_, port_a),
          delay_server_process(tmp_path / "b", "--protocol", "moe", "--ttft-ms", "25")
          as (_, port_b)):
        for i in range(3):  # interleaved: A B A B A B
            for name, port in (("a", port_a), ("b", port_b)):
                run_dir = tmp_path / f"round-{i}" / name
                done = locust(port, run_dir, "--rate", "20", "-t", "1", "--max-tokens", "4",
                              "--seed", str(i))
                assert done.returncode == 0, done.stdout
                runs[name].append(run_dir)

    def compare(*names: str, extra: tuple[str, ...] = ()) -> tuple[str, dict]:
        flags = [x for n in names for x in ("--runs", ",".join(map(str, runs[n])))]
        out = analysis("compare", *flags, "--out", tmp_path / "-".join(names), *extra).stdout
        return out, json.loads((tmp_path / "-".join(names) / "compare.json").read_text())

    out, full = compare("a", "b")
    ttft_p50 = _cells(out, "b")[1]
    assert ttft_p50[3] == "worse", out
    mean, low, _ = map(float, ttft_p50[:3])
    assert 18 <= mean <= 32 and low > 0  # +25%, less the share of fixed overheads
    verdict = full["recommendation"]["verdicts"][0]
    assert verdict["figures"]["TTFT p50 (ms)"]["n_runs"] == 3
    assert full["over_runs"]["significant"]["b TTFT p50 (ms)"] == "worse"
