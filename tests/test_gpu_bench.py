"""make gpu-bench's run (server/tools/gpu_bench.py) as it runs on a CPU, small: the sweep's rows
against a bound that is a bound, the profile, the batching policies end to end through a real
server and Locust, and the files it writes; and make gpu-wheels' package closure for the GPU
machine (server/tools/gpu_wheels.py)."""

import json

import pytest

from server.tools import gpu_bench, gpu_wheels


@pytest.mark.slow
def test_the_gpu_bench_runs_on_a_cpu_and_writes_its_files(tmp_path, capsys):
    assert gpu_bench.main(["--device", "cpu", "--out", str(tmp_path), "--presets", "tiny",
                           "--batches", "1,4", "--policies", "fcfs,dynamic", "--skip", "check",
                           "--copy-mb", "16", "--e2e-run-s", "2",
                           "--stress-step-s", "1", "--stress-steps", "2"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.md", "gpu_bench.json",
                                                           "gpu_bench.md"]
    results = json.loads(tmp_path.joinpath("gpu_bench.json").read_text())
    rows = results["sweep"]
    assert [(r["preset"], r["batch"]) for r in rows] == [("tiny", 1), ("tiny", 4)]
    for r in rows:  # no graphs on a CPU; a step cannot beat the bytes it reads
        assert "graphs_ms" not in r and r["eager_over_bound"] > 1 and r["touched_pairs"] > 0
    assert results["profile"]["eager"]["aten_ops_per_step"] > 0
    e2e = results["end_to_end"]
    assert e2e["stress"]["knee_rps"] > 0 and set(e2e["runs"]) == {"fcfs", "dynamic"}
    assert all(r["ok"] > 0 and r["failed"] == 0 for r in e2e["runs"].values())
    assert "## Decode sweep" in capsys.readouterr().out
    assert "fcfs" in tmp_path.joinpath("compare.md").read_text()


def test_a_wrong_preset_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        gpu_bench.main(["--device", "cpu", "--presets", "tiny,nope"])
    assert "--presets: unknown nope" in capsys.readouterr().err


def test_the_gpu_machine_gets_locust_and_grpc_but_not_what_it_has():
    wanted = gpu_wheels.closure(gpu_wheels.ROOTS, "3.12")
    assert {"locust", "gevent", "hdrhistogram", "grpcio-tools", "pyzmq", "aiohttp"} <= set(wanted)
    assert not {"torch", "numpy", "psutil"} & set(wanted)
