"""The host-bound rule (analysis/rules/host_bound.py) on run directories built here: a GPU busy
under half of its timed steps fires it with the figures worked out by hand, one busy most of
them does not, and a CPU server, or one too few steps timed, leaves it unjudged saying why; the
report's server line gives the busy share where steps were timed."""

import json

from analysis.diagnosis import diagnose
from analysis.readers.rundir import load_run
from analysis.readers.server_stats import server_view
from analysis.report.server import server_text
from tests.test_analysis import snapshot, write_run


def gpu_run(tmp_path, busy_ms: float, timed_ms: float, steps: int, graphs: str = "true"):
    """write_run's run on cuda, its end snapshot holding the GPU busy counters given (the start
    snapshot's are zero)."""
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    settings = {"cuda_graphs": graphs, "moe_kernel": "grouped_mm", "device": "cuda"}
    summary["server"]["start"] |= {"device": "cuda", "settings": settings}
    summary["server"]["end"] = snapshot(130.0, 300, [[70, 30, 10, 10]], 3.0) | {
        "device": "cuda", "settings": settings, "gpu_busy_ms": busy_ms,
        "gpu_timed_ms": timed_ms, "gpu_timed_steps": steps}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return next(f for f in diagnose(load_run(run_dir)) if f.rule == "host_bound")


def test_a_gpu_busy_a_quarter_of_each_step_is_host_bound(tmp_path):
    found = gpu_run(tmp_path, 500.0, 2000.0, 20, graphs="false")
    assert found.fired and "host-bound" in found.verdict and "25%" in found.verdict
    assert found.evidence == [
        "GPU busy 500 ms of 2000 ms over 20 timed steps (25.0%; threshold 50%)",
        "per timed step: GPU work 25.00 ms, step 100.00 ms",
        "cuda_graphs false, moe_kernel grouped_mm (the server's log says why a step could not "
        "be captured)"]


def test_a_gpu_busy_most_of_each_step_is_not(tmp_path):
    found = gpu_run(tmp_path, 1800.0, 2000.0, 200)
    assert found.judged and not found.fired and "90%" in found.verdict


def test_without_timed_steps_the_rule_says_why(tmp_path):
    found = gpu_run(tmp_path, 10.0, 20.0, 2)
    assert not found.judged and "2 engine steps were timed" in found.verdict
    write_run(tmp_path / "cpu")  # the CPU server's snapshots carry no GPU counters
    cpu = next(f for f in diagnose(load_run(tmp_path / "cpu")) if f.rule == "host_bound")
    assert not cpu.judged and "on cpu" in cpu.verdict


def test_the_report_says_how_much_of_a_step_the_gpu_was_busy(tmp_path):
    gpu_run(tmp_path, 500.0, 2000.0, 20)
    view = server_view(load_run(tmp_path / "run").summary.server)
    (line,) = [f for f in server_text(view) if f.startswith("server (")]
    assert "GPU busy / waiting for the host 25.0% / 75.0% of a step (20 steps timed)" in line
    write_run(tmp_path / "cpu")
    cpu = server_view(load_run(tmp_path / "cpu").summary.server)
    assert "GPU busy" not in server_text(cpu)[0]
