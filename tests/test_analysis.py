"""`python -m analysis report` on a run directory built here from known values: the printed and
JSON percentiles match what was recorded into real HDR histograms, report.md and the CDF PNG are
written, bad or missing files exit 2 naming the file, server counters are reduced to the run's
window, and the package imports nothing of ours."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.__main__ import main as analysis_main
from analysis.readers.server_stats import server_view
from tests.cli import Done, analysis
from tests.rundirs import encoded, snapshots, step_row, summary_json

REPO = Path(__file__).resolve().parents[1]


def stats(count: int) -> dict:
    return {"count": count, "mean": 5.0, "p50": 4.0, "p90": 8.0, "p95": 9.0, "p99": 12.0,
            "p999": 15.0, "max": 20.0}


def snapshot(uptime_s: float, steps: int, expert_tokens: list[list[int]],
             mean_batch_size: float) -> dict:
    return {"policy": "fcfs", "preset": "tiny", "device": "cpu", "uptime_s": uptime_s,
            "window_s": uptime_s, "steps": steps, "tokens_generated": 4 * steps,
            "requests_finished": steps // 8, "mean_batch_size": mean_batch_size,
            "step_time_mean_ms": 5.0, "expert_tokens": expert_tokens}


def write_run(run_dir: Path) -> None:
    summary = summary_json(
        run_dir=str(run_dir),
        config={"mode": "fixed", "rate": 4.0, "arrival": "poisson", "prompt_tokens": 64,
                "max_tokens": 32, "warmup_s": 5.0, "seed": 0, "host": "127.0.0.1:50051",
                "slo_ttft_ms": None, "slo_tpot_ms": None},
        throughput={"window_s": 25.0, "output_tokens_per_s": 120.5, "requests_per_s": 3.9,
                    "goodput_requests_per_s": 3.9},
        requests={"sent": 1002, "ok": 1000, "failed": 2, "not_sent": 0,
                  "failed_by_code": {"RESOURCE_EXHAUSTED": 2}, "warmup": 20},
        generator={"late_sends": 1, "late_threshold_ms": 5.0, "cpu_percent": 85.0,
                   "warnings": ["generator CPU above 80%"]},
        server_time_ms={"queue": stats(1000), "prefill": stats(1000)},
        server={"start": snapshot(100.0, 100, [[10, 10, 10, 10]], 2.0),
                "end": snapshot(130.0, 300, [[70, 30, 10, 10]], 3.0)},
    )
    run_dir.mkdir()
    histograms = {
        "ttft": encoded(range(1, 1001)),  # 1..1000 ms uniformly: p50 500 ms, p99 990 ms
        "tpot": encoded(np.linspace(20, 40, 1000)),
        "itl": encoded([]),  # recorded nothing: reported as "no samples"
        "e2e": encoded(np.linspace(600, 2000, 1000)),
        "send_lag": encoded([0.1] * 999 + [7]),
    }  # no ttft_service: a missing histogram is "no samples" too
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "histograms.json").write_text(json.dumps(histograms))


def run_report(run_dir: Path) -> Done:
    return analysis("report", run_dir)


@pytest.mark.slow
def test_report_prints_recorded_percentiles_and_writes_files(tmp_path):
    run_dir = tmp_path / "first"
    write_run(run_dir)
    # The real command, once: the other tests run its main() in this process (tests/cli.py).
    result = subprocess.run([sys.executable, "-m", "analysis", "report", str(run_dir)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    columns = next(line for line in lines if line.startswith("latency (ms)")).split()[2:]
    ttft_line = next(line for line in lines if line.startswith("ttft "))
    ttft = dict(zip(columns, ttft_line.split()[1:], strict=True))
    assert float(ttft["count"]) == 1000
    assert float(ttft["p50"]) == pytest.approx(500, rel=0.01)
    assert float(ttft["p99"]) == pytest.approx(990, rel=0.01)
    assert any(line.split() == ["ttft_service", "no", "samples"] for line in lines)
    assert any(line.split() == ["itl", "no", "samples"] for line in lines)
    assert "failed 2 (RESOURCE_EXHAUSTED 2)" in result.stdout

    figures = json.loads(lines[-1])
    assert figures["ttft_p50_ms"] == pytest.approx(500, rel=0.01)
    assert figures["tpot_p50_ms"] == pytest.approx(30, rel=0.01)
    assert figures["ok"] == 1000 and figures["failed"] == 2
    assert lines[-2] == f"report: {run_dir / 'report.md'}"

    report = (run_dir / "report.md").read_text()
    assert report.startswith("# Run report: first")
    opening = report.split("\n\n")[1]  # the answer first: load, latency, outcome, diagnosis
    assert opening.startswith("Offered 4 requests/s (fixed, poisson) to the moe server at "
                              "127.0.0.1:50051, measured over 25 s: achieved 3.90 requests/s and "
                              "120.5 output tokens/s. ")
    assert "TTFT p50 500" in opening
    assert "1000 of 1002 requests ok, 2 failed (RESOURCE_EXHAUSTED 2)." in opening
    assert "Diagnosis: " in opening
    # fixed mode, poisson, the moe target: no stress, mixed, gamma or openai settings
    config = report.split("## Config")[1].split("##")[0]
    assert "| rate |" in config and "| host |" in config
    for ignored in ("rate_start", "classes", "rate-profile", "burstiness", "endpoint",
                    "triton_backend", "profile"):
        assert f"| {ignored} |" not in config, ignored
    assert "![latency CDF](latency_cdf.png)" in report
    assert "generator CPU above 80%" in report
    # Experts over the window: [70, 30, 10, 10] - [10, 10, 10, 10] -> expert 0 takes 60 of 80.
    assert "| 0 | 80 | 0 | 0.750 | 3.00x | 0.750 0.250 0.000 0.000 |" in report
    png = (run_dir / "latency_cdf.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.parametrize("broken, named", [
    ("no_summary", "summary.json"),
    ("bad_histogram", "histograms.json"),
    ("no_histograms", "histograms.json"),
])
def test_missing_or_broken_file_exits_2_naming_it(tmp_path, broken, named):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    if broken == "no_summary":
        (run_dir / "summary.json").unlink()
    elif broken == "no_histograms":
        (run_dir / "histograms.json").unlink()
    else:
        (run_dir / "histograms.json").write_text(json.dumps({"ttft": "not a histogram"}))
    result = run_report(run_dir)
    assert result.returncode == 2
    assert str(run_dir / named) in result.stderr
    assert "Traceback" not in result.stderr


def test_server_view_subtracts_start_snapshot():
    view = server_view(snapshots(snapshot(100.0, 100, [[10, 10]], 2.0),
                                 snapshot(130.0, 300, [[50, 30]], 3.0)))
    assert view.steps == 200
    assert view.mean_batch_size == pytest.approx(3.5)  # (3.0 * 300 - 2.0 * 100) / 200
    assert view.expert_tokens.tolist() == [[40, 20]]


def test_server_view_uses_end_snapshot_after_a_reset():
    # reset at uptime 120 s, after the start
    end = snapshot(130.0, 50, [[5, 15]], 3.0) | {"window_s": 10.0}
    view = server_view(snapshots(snapshot(100.0, 100, [[10, 10]], 2.0), end))
    assert "reset" in view.basis
    assert (view.steps, view.mean_batch_size, view.expert_tokens.tolist()) == (50, 3.0, [[5, 15]])



def test_compare_puts_runs_side_by_side(tmp_path):
    for name in ("fcfs", "static"):
        write_run(tmp_path / name)
    end = snapshot(130.0, 300, [[70, 30, 10, 10]], 3.0) | {
        "layers": [{"active_experts_steps": [0, 50, 150, 100, 0]}], "prefill_tokens": 900,
        "prefill_padded_tokens": 100}
    start = snapshot(100.0, 100, [[10, 10, 10, 10]], 2.0) | {
        "layers": [{"active_experts_steps": [0, 50, 50, 0, 0]}], "prefill_tokens": 0,
        "prefill_padded_tokens": 0}
    summary = json.loads((tmp_path / "static" / "summary.json").read_text())
    summary["server"] = {"start": start | {"policy": "static"}, "end": end | {"policy": "static"}}
    (tmp_path / "static" / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "cmp"
    done = analysis("compare", tmp_path / "fcfs", tmp_path / "static", "--out", out)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])  # short: the paths, significant ones
    assert set(last) == {"compare_md", "compare_png", "compare_json", "baseline", "warnings",
                         "significant"}
    assert not [v for v in last["significant"].values() if v.startswith("baseline")]
    rows = json.loads(Path(last["compare_json"]).read_text())["runs"]
    assert [r["policy"] for r in rows] == ["fcfs", "static"]
    assert rows[0]["ttft_p50_ms"] == pytest.approx(500, rel=0.01)
    # window steps only
    assert rows[1]["distinct_experts_per_step"] == pytest.approx((100 * 2 + 100 * 3) / 200)
    assert rows[1]["prefill_padded_share"] == pytest.approx(0.1)
    assert rows[0]["distinct_experts_per_step"] is None
    assert "no SLO was set" in done.stdout and (out / "compare.md").exists()


def test_report_shows_slo_shares_classes_stress_steps_and_delivery_lag(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"]["slo_ttft_ms"] = 500
    summary["slo"] = {"objectives_ms": {"ttft": 500}, "requests": 1000,
                      "met_share": {"ttft": 0.5, "all": 0.5}}
    summary["classes"] = {"chat": {"sent": 750, "ok": 750, "ttft_ms": stats(750),
                                   "tpot_ms": stats(750), "e2e_ms": stats(750)}}
    summary["stress"] = {"knee_rps": 24,
                         "stopped_because": "step 3 at 32 requests/s: achieved 25/s",
                         "steps": [step_row(step=0, offered_rps=8, sent_rps=8, achieved_rps=8,
                                            goodput_rps=8, ttft_p99_ms=25.0, tpot_p99_ms=11.0)]}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    histograms = json.loads((run_dir / "histograms.json").read_text())
    histograms["delivery_lag"] = encoded([1.5] * 99 + [9])
    (run_dir / "histograms.json").write_text(json.dumps(histograms))
    done = run_report(run_dir)
    assert done.returncode == 0, done.stderr
    assert "met: TTFT 50.0%, all 50.0%" in done.stdout and "knee: 24 requests/s" in done.stdout
    assert "delivery lag (server emit -> client timestamp) p50 1.50 ms" in done.stdout
    md = (run_dir / "report.md").read_text()
    assert ("## Request classes (ms)" in md and "| chat | 750 | 750 |" in md
            and "## Stress steps" in md)


@pytest.mark.parametrize("command", ["report", "compare", "soak", "capacity", "diagnose",
                                     "sweep", "what-if", "import-expert-stats"])
def test_every_commands_help_prints(command, capsys):
    # a help string with a bare % (soak's "(%)" budget once) breaks only --help
    with pytest.raises(SystemExit) as done:
        analysis_main([command, "--help"])
    assert done.value.code == 0 and command in capsys.readouterr().out
