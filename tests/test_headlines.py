"""The report's headline says what was offered: a replayed trace by its name and its own load,
not --rate's default; Poisson arrivals that drew notably more or fewer requests than the rate
makes on average, with the draw's usual range; the settings line without unset options."""

import json

from tests.cli import analysis
from tests.test_analysis import write_run


def headline(run_dir) -> str:
    done = analysis("report", run_dir)
    assert done.returncode == 0, done.stderr
    return next(line for line in done.stdout.splitlines() if "measured over" in line)


def test_a_poisson_draw_far_from_the_rate_is_explained(tmp_path):
    write_run(tmp_path / "run")  # 4 requests/s over a 25 s window: 1002 scheduled
    line = headline(tmp_path / "run")
    assert line.startswith("Offered 4 requests/s (fixed, poisson)")
    assert ("The Poisson arrivals scheduled 1002 requests in the window, where the rate makes "
            "100 on average (95% of draws 80-120)") in line


def test_a_replayed_trace_is_named_with_its_own_load(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"]["trace"] = "/data/mooncake_trace.jsonl"
    summary["duration_s"] = 30.0
    lengths = {"mean": 64.0, "p50": 64, "p90": 64, "p99": 64, "max": 64}
    summary["workload"] = {"requests": 6, "prompt_tokens": lengths, "max_tokens": lengths,
                           "prefix_share": 0.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    line = headline(run_dir)
    assert line.startswith("Replayed the trace mooncake_trace.jsonl (6 requests over 30 s, "
                           "0.20 requests/s offered) to the moe server")
    assert "Offered 4" not in line and "Poisson" not in line


def test_the_settings_line_leaves_unset_options_out(tmp_path):
    write_run(tmp_path / "run")
    done = analysis("report", tmp_path / "run")
    config = next(line for line in done.stdout.splitlines() if line.startswith("config: "))
    assert "rate=4" in config
    for unset in ("tls_ca=", "auth_token=", "dataset=", "trace_format=", "trace_speedup="):
        assert unset not in config
