"""The seed's capacity planning formula (5.1) and its link to the server's capacity factor; the
`capacity` command's drop estimates checked against hand-computed cases, from given numbers and
from a run directory's GetStats samples (the run's measured drops beside them); bad flags exit 2
naming the flag."""

import json
import math

import numpy as np
import pytest

from analysis.capacity import capacity_factor, factor_row, load_from_numbers, planned_capacity
from server.engine.moe import expert_capacity
from tests.cli import Done, analysis
from tests.rundirs import write_samples
from tests.test_analysis import write_run


def test_planned_capacity_is_average_load_over_utilisation():
    # 256 tokens, top-2, 8 experts: 64 slots per expert on average; at 50% utilisation, 128.
    assert planned_capacity(256, 2, 8, 0.5) == 128
    assert planned_capacity(256, 2, 8, 1.0) == 64


@pytest.mark.parametrize("utilisation", [0.5, 2 / 3, 0.8])
def test_capacity_factor_gives_the_servers_capacity(utilisation):
    planned = planned_capacity(100, 2, 8, utilisation)
    assert expert_capacity(100, 2, 8, capacity_factor(utilisation)) == math.ceil(planned - 1e-9)


@pytest.mark.parametrize("utilisation", [0, -0.5, 1.5])
def test_bad_utilisation_is_refused(utilisation):
    with pytest.raises(ValueError, match="utilisation"):
        planned_capacity(10, 2, 8, utilisation)


# --- `python -m analysis capacity`: drops by capacity factor, from numbers and from a run
# directory. ---

def run_capacity(*argv: str) -> Done:
    return analysis("capacity", *argv)


def figures(done: Done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hot_expert_drops_by_hand():
    # 64 tokens x top-2 = 128 pairs a step over 8 experts: 16 on average. Expert 0 takes 0.4 of
    # them, 51.2; the other seven 0.6 / 7 x 128 = 10.97 each, under every capacity below. Slots
    # ceil(16 CF): CF 1 -> 16 slots, 35.2 pairs dropped, 0.275 of 128; CF 1.25 -> 20, 31.2
    # (0.24375); CF 1.5 -> 24, 27.2 (0.2125); CF 2 -> 32, 19.2 (0.15).
    load = load_from_numbers(64, 2, 8, np.asarray([0.4] + [0.6 / 7] * 7))
    rows = [factor_row(load, cf) for cf in (1, 1.25, 1.5, 2)]
    assert [r.slots for r in rows] == [16, 20, 24, 32]
    assert [r.drop_share for r in rows] == pytest.approx([0.275, 0.24375, 0.2125, 0.15])
    assert all(r.worst_expert == 0 for r in rows)
    assert factor_row(load, 3.2).drop_share == 0  # 3.2 x 16 = 51.2 slots: the hot expert fits


def test_capacity_from_numbers():
    # Shares 28:6:...:6 normalise to 0.4 and 0.6 / 7, the case above.
    result = figures(run_capacity("--tokens", "64", "--top-k", "2", "--experts", "8",
                                  "--target-utilisation", "0.8", "--loads", "28,6,6,6,6,6,6,6"))
    assert result["capacity_md"] is None
    assert (result["average_load"] == 16
            and result["planned_capacity"] == pytest.approx(20))  # 16 / 0.8
    assert result["burst_slots"] == {"1.5x": 24, "2x": 32}
    assert result["hottest"]["over_mean"] == pytest.approx(3.2)
    shares = {f["capacity_factor"]: f["drop_share"] for f in result["factors"]}
    assert shares == pytest.approx({1.0: 0.275, 1.25: 0.24375, 1.5: 0.2125, 2.0: 0.15})
    uniform = figures(run_capacity("--tokens", "4096", "--top-k", "2", "--experts", "8"))
    assert [f["drop_share"] for f in uniform["factors"]] == [0, 0, 0, 0]
    assert uniform["planned_capacity"] == pytest.approx(4096 * 2 / 8 / 0.8)


def layer_stats(routed: list[list[int]], dropped: list[list[int]]) -> list[dict]:
    return [{"expert_tokens": r, "dropped": d} for r, d in zip(routed, dropped, strict=True)]


def test_capacity_from_a_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)  # summary.json without layer stats: the samples alone give the loads
    common = {"top_k": 2, "num_experts": 4, "capacity_factor": 1.5}
    # Two layers, four experts, top-2. Interval 1: 10 steps, 50 tokens (5 a step, 100 pairs a
    # layer); interval 2: 10 steps, 40 tokens (4 a step, 80 pairs a layer).
    write_samples(run_dir / "server_stats.jsonl", [
        common | {"steps": 0, "layers": layer_stats([[0] * 4, [0] * 4], [[0] * 4, [0] * 4])},
        common | {"steps": 10, "layers": layer_stats([[50, 30, 10, 10], [25, 25, 25, 25]],
                                                     [[6, 0, 0, 0], [0] * 4])},
        common | {"steps": 20, "layers": layer_stats([[70, 50, 30, 30], [65, 55, 30, 30]],
                                                     [[6, 0, 0, 0], [8, 0, 0, 0]])},
    ])
    # CF 1: interval 1 has ceil(5 x 2 / 4) = 3 slots a step, 30 in all: layer 0 expert 0 drops
    # 50 - 30 = 20. Interval 2 has ceil(4 x 2 / 4) = 2, 20 in all: layer 1 drops 40 - 20 = 20
    # (expert 0) and 30 - 20 = 10. 50 of 360 pairs; layer 1 is the worst, 30 of 180, expert 0
    # most. Lower bound (x + 1 slots a step: 35 and 30 in all): 15 + 10 = 25 of 360.
    # CF 1.5 (the run's): ceil(3.75) = 4 and ceil(3) = 3 slots, 40 and 30 in all: 10 + 10 = 20 of
    # 360; the server measured 6 + 8 = 14. CF 2: 5 and 4 slots, 50 and 40 in all: nothing
    # dropped.
    done = run_capacity(str(run_dir), "--capacity-factors", "1,2", "--target-utilisation", "0.75")
    result = figures(done)
    assert result["tokens_per_step"] == pytest.approx(4.5)  # 90 tokens in 20 steps
    assert (result["average_load"] == pytest.approx(2.25)
            and result["planned_capacity"] == pytest.approx(3))
    assert result["run_capacity_factor"] == 1.5
    rows = {f["capacity_factor"]: f for f in result["factors"]}
    assert sorted(rows) == [1.0, 1.5, 2.0]  # the run's own factor joins the list
    assert rows[1.0]["slots"] == 3 and rows[2.0]["slots"] == 5  # ceil(2.25 CF) at the mean step
    assert rows[1.0]["drop_share"] == pytest.approx(50 / 360)
    assert rows[1.0]["drop_share_lower_bound"] == pytest.approx(25 / 360)
    assert (rows[1.0]["worst_layer"], rows[1.0]["worst_expert"]) == (1, 0)
    assert rows[1.0]["worst_layer_drop_share"] == pytest.approx(30 / 180)
    assert rows[1.5]["drop_share"] == pytest.approx(20 / 360)
    assert (rows[1.5]["measured_drop_share"] == pytest.approx(14 / 360)
            and rows[1.0]["measured_drop_share"] is None)
    assert rows[2.0]["drop_share"] == 0
    assert "lower bound" in done.stdout and "assumes:" in done.stdout
    md = (run_dir / "capacity.md").read_text()
    assert (md.startswith("# Expert capacity: run")
            and "| 1 | 3 | 13.89 | 6.94 | 16.67 (layer 1) |" in md)


def test_a_run_without_layer_stats_exits_2_naming_the_file(tmp_path):
    run_dir = tmp_path / "old"
    write_run(run_dir)  # no server_stats.jsonl, and summary.json's snapshots lack layer stats
    done = run_capacity(str(run_dir))
    assert done.returncode == 2
    assert str(run_dir / "summary.json") in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, flag", [
    (["--tokens", "64", "--top-k", "2", "--experts", "8", "--target-utilisation", "0"],
     "--target-utilisation"),
    (["--tokens", "64", "--top-k", "2", "--experts", "8", "--target-utilisation", "1.5"],
     "--target-utilisation"),
    (["--tokens", "-5", "--top-k", "2", "--experts", "8"], "--tokens"),
    (["--tokens", "64", "--top-k", "2", "--experts", "8", "--capacity-factors", "1,-2"],
     "--capacity-factors"),
    (["--tokens", "64", "--top-k", "2", "--experts", "3", "--loads", "1,1"], "--loads"),
    (["--tokens", "64", "--top-k", "2", "--experts", "4", "--loads", "3,1,0,0"],
     "--loads"),  # 0.75 > 1/k
    (["--tokens", "64", "--experts", "8"], "--top-k"),
    (["runs/x", "--tokens", "64"], "--tokens"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag):
    done = run_capacity(*argv)
    assert done.returncode == 2
    assert flag in done.stderr and "Traceback" not in done.stderr
