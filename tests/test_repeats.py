"""Repeat runs (`analysis compare --runs A1,A2,A3 B1,B2,B3`): each configuration's figures over
its runs with a Student-t interval, checked against scipy's formula, holding every single run's
figure; and two configurations of the known-delay reference that differ by a known 5 ms of TTFT,
run interleaved A B A B A B, told apart by the paired difference, about 5 ms."""

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
        for i in range(3):
            for name, port in (("a", port_a), ("b", port_b)):  # interleaved: A B A B A B
                run_dir = tmp_path / f"{name}{i}"
                done = locust(port, run_dir, "--rate", "20", "-t", "2", "--max-tokens", "4",
                              "--seed", str(i))
                assert done.returncode == 0, done.stdout
                runs[name].append(run_dir)
    out = analysis("compare", "--runs", ",".join(map(str, runs["a"])), "--runs",
                   ",".join(map(str, runs["b"])), "--out", tmp_path / "cmp").stdout
    section = out.split("run to run (Student t over the runs")[1]
    line = next(row for row in section.splitlines() if row.startswith("TTFT p50 (ms)"))
    assert line.rstrip().endswith("told apart") and "not told apart" not in line
    (a_low, a_high), (b_low, b_high), (d_low, d_high) = [
        (float(low), float(high))
        for _, low, high in re.findall(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", line)]
    # the paired difference is about the known 5 ms (the two servers' own lateness differs
    # by a few tenths of a millisecond on a busy machine)
    assert 4.0 <= (d_low + d_high) / 2 <= 6.0 and d_low > 0
    for (low, high), dirs in (((a_low, a_high), runs["a"]), ((b_low, b_high), runs["b"])):
        for run_dir in dirs:  # each configuration's interval holds its runs' own figures
            p50 = json.loads((run_dir / "summary.json").read_text())["metrics"]["ttft_ms"]["p50"]
            assert low <= p50 <= high
