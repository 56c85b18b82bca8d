"""The report's views over time and of the server, on run directories built here from known
values: interval logs merged into windows, offered vs achieved rates, server counters turned
into per-interval figures (a reset included), the TTFT split per request, the MoE figures of
the run window, and `python -m analysis report` writing every figure as a real PNG of the
expected size, referenced from report.md."""

import json

import numpy as np
import pytest

from analysis.readers.intervals import load_intervals
from analysis.readers.rundir import Run, read_samples
from analysis.readers.samples import server_series
from analysis.readers.server_stats import server_view
from analysis.readers.timeseries import client_series
from analysis.ttft_split import ttft_split
from tests.cli import analysis
from tests.rundirs import (
    histogram,
    png_size,
    request_row,
    rows_of,
    samples,
    snapshots,
    step_row,
    write_hlog,
    write_rows,
    write_samples,
    write_summary,
)
from tests.test_analysis import write_run

STAGES = ("attention", "expert_compute")


def stats_snapshot(window_s: float, steps: int, step_ms_sum: float, expert_tokens: list[list[int]],
                   waiting: int = 0, misses: int = 0, hits: int = 0, copy_ms: float = 0.0,
                   dropped: int = 0, cpu_percent: float = 50.0, rss_mb: float = 1000.0) -> dict:
    """A GetStats dict as the server sends it, with the fields the analysis reads."""
    n_experts = len(expert_tokens[0])
    layers = [{"expert_tokens": row, "dropped": [dropped] + [0] * (n_experts - 1),
               "active_experts_steps": [0] * (n_experts + 1),
               "cache": {"hits": hits, "misses": misses, "copy_ms": copy_ms}}
              for row in expert_tokens]
    # The stages split each step 25% / 75%.
    stages = [{"stage": name, "ms": {"count": steps, "sum": step_ms_sum * share}}
              for name, share in zip(STAGES, (0.25, 0.75), strict=True)]
    return {"policy": "fcfs", "preset": "tiny", "device": "cpu", "uptime_s": 100 + window_s,
            "window_s": window_s, "steps": steps, "tokens_generated": steps,
            "requests_finished": 0, "mean_batch_size": 1.0,
            "step_time_mean_ms": step_ms_sum / steps if steps else 0.0,
            "expert_tokens": expert_tokens, "waiting": waiting, "running": 2,
            "process_cpu_percent": cpu_percent, "process_rss_bytes": int(rss_mb * 2**20),
            "gpu_utilization_percent": -1.0, "expert_cache": 2,
            "layers": layers, "stages": stages, "step_ms": {"count": steps, "sum": step_ms_sum},
            "tokens_per_step": {"count": steps, "sum": 4.0 * steps},
            "kv_positions_useful": 3 * steps, "kv_positions_computed": 4 * steps}


def test_sparse_intervals_merge_into_windows_with_exact_percentiles(tmp_path):
    # 20 one-second intervals, one request finishing in each, TTFT 100 ms + 10 ms x i.
    write_hlog(tmp_path / "ttft.hlog", [[100 + 10 * i] for i in range(20)])
    write_hlog(tmp_path / "itl.hlog", [[20] * 31 for _ in range(20)])  # 32-token answers
    write_rows(tmp_path / "requests.jsonl",
               [request_row(i, 100, 20, 700) | {"scheduled_ms": 100.0 + 1000 * i}
                for i in range(20)])
    series = client_series(Run(tmp_path))
    # 20 requests over 20 s: 5 per window would need 5 s, capped so that there are 10 windows: 2 s.
    assert series.length_s.tolist() == [2.0] * 10
    assert series.ttft_p99_ms[3] == pytest.approx(170, rel=1e-3)  # max of 160 and 170 ms
    assert series.ttft_p50_ms[3] == pytest.approx(160, rel=1e-3)
    # scheduled at i + 0.1 s, finished 0.7 s later
    assert series.achieved_rps.tolist() == [1.0] * 10
    assert series.output_tokens_per_s.tolist() == [32.0] * 10
    assert series.offered_rps.tolist() == [1.0] * 10
    assert client_series(Run(tmp_path), window_s=0).length_s.tolist() == [1.0] * 20


def test_a_short_last_interval_joins_the_one_before(tmp_path):
    # Ten 1 s intervals of 10 requests, then the drain's 0.2 s with 4: not a burst of 20 requests/s.
    write_hlog(tmp_path / "ttft.hlog", [[100] * 10] * 10)
    with open(tmp_path / "ttft.hlog", "a") as f:
        f.write(f"10.000,0.200,0.000,{histogram([300] * 4).encode().decode()}\n")
    series = client_series(Run(tmp_path), window_s=0)
    assert len(series) == 10 and series.length_s[-1] == pytest.approx(1.2)
    assert series.achieved_rps[-1] == pytest.approx(14 / 1.2)
    assert series.ttft_p99_ms[-1] == pytest.approx(300, rel=1e-3)


def test_server_series_differences_consecutive_snapshots_and_survives_a_reset():
    snapshots = [stats_snapshot(1.0, 10, 400.0, [[10, 10]], waiting=1, misses=2, hits=8,
                                copy_ms=5.0),
                 stats_snapshot(2.0, 30, 1200.0, [[40, 20]], waiting=3, misses=10, hits=10,
                                copy_ms=25.0, cpu_percent=100.0),
                 stats_snapshot(0.5, 5, 250.0, [[5, 5]], waiting=0)]  # reset: the window shrank
    series = server_series(samples(snapshots))
    assert series.steps.tolist() == [20, 5]
    # 800 ms of steps in 1 s, then 250 ms
    assert series.busy_share.tolist() == pytest.approx([0.8, 0.25])
    # Routed [30, 10] in the first interval: max/mean = 30 / 20.
    assert series.imbalance.tolist() == pytest.approx([1.5, 1.0])
    assert series.cache_misses.tolist() == [8, 0] and series.cache_copy_ms.tolist() == [20.0, 0.0]
    assert series.stage_ms["expert_compute"].tolist() == pytest.approx([600.0, 187.5])
    # CPU seconds: 1.0 x 2 s - 0.5 x 1 s = 1.5 s in a 1 s interval.
    assert series.cpu_util[0] == pytest.approx(1.5)
    assert series.waiting.tolist() == [3, 0]


def test_ttft_split_adds_up_to_each_band_mean_ttft():
    rows = [request_row(i, ttft_ms=100.0 + i, tpot_ms=20, e2e_ms=800, sent_ms=100.0 * i + 2,
                        server_queue_us=10_000 + 1000 * i, server_prefill_us=50_000,
                        server_ttft_us=61_000 + 1000 * i)
            for i in range(100)]
    rows.append(request_row(100, 5000, 20, 6000, status="UNAVAILABLE"))  # not measured
    rows.append(request_row(101, 5000, 20, 6000, warmup=True))  # not measured
    split = ttft_split(rows_of(rows))
    assert split.requests == 100
    n, means = split.bands["all"]
    # lag 2, queue 10 + i/1000 s..., prefill 50, other 1, network + client = ttft - lag - server
    # ttft = 37.
    assert n == 100
    assert means.tolist() == pytest.approx([2.0, 59.5, 50.0, 1.0, 37.0])
    assert means.sum() == pytest.approx(np.mean([100.0 + i for i in range(100)]))
    n, means = split.bands["slowest 10%"]
    assert n == 10 and means[1] == pytest.approx(10 + np.mean(range(90, 100)))


def test_server_view_reports_moe_figures_over_the_window():
    start = stats_snapshot(1.0, 10, 400.0, [[10, 10]], misses=2, hits=8, copy_ms=5.0, dropped=1)
    end = stats_snapshot(3.0, 30, 1400.0, [[40, 20]], misses=10, hits=30, copy_ms=25.0, dropped=4)
    # 20 steps: 5 with one expert, 15 with both
    end["layers"][0]["active_experts_steps"] = [0, 5, 15]
    view = server_view(snapshots(start, end))
    assert view.active_experts_steps.tolist() == [0, 5, 15]
    assert view.distinct_experts_per_step == pytest.approx((5 * 1 + 15 * 2) / 20)
    # 1000 ms / 20 steps
    assert view.stage_ms_per_step == pytest.approx({"attention": 12.5, "expert_compute": 37.5})
    assert view.cache == pytest.approx({"hits": 22, "misses": 8, "copy_ms": 20.0,
                                        "hit_rate": 22 / 30})
    assert view.dropped == 3 and view.drop_share == pytest.approx(3 / 40)
    assert view.tokens_per_step == pytest.approx(4.0) and view.kv_efficiency == pytest.approx(0.75)


def test_report_writes_every_figure_and_links_it(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["server"] = {"start": stats_snapshot(1.0, 10, 400.0, [[10, 10]]),
                         "end": stats_snapshot(5.0, 50, 2000.0, [[70, 30]])}
    summary["stress"] = {"knee_rps": 4, "stopped_because": "step 2",
                         "steps": [step_row(step=i, offered_rps=r, sent_rps=r,
                                            achieved_rps=min(r, 5), goodput_rps=min(r, 4),
                                            ttft_p99_ms=50.0 * r, tpot_p99_ms=10.0 + r,
                                            saturated="" if r < 6 else "achieved")
                                   for i, r in enumerate((2, 4, 6))]}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    write_hlog(run_dir / "ttft.hlog", [[100, 120]] * 10)
    write_hlog(run_dir / "tpot.hlog", [[20, 25]] * 10)
    write_samples(run_dir / "server_stats.jsonl",
                  [stats_snapshot(1.0 + i, 10 * (i + 1), 400.0 * (i + 1), [[10, 10]])
                   for i in range(5)])
    write_rows(run_dir / "requests.jsonl",
               [request_row(i, 100, 20, 700, server_queue_us=1000, server_prefill_us=9000,
                            server_ttft_us=10500) for i in range(30)])
    done = analysis("report", run_dir)
    assert done.returncode == 0, done.stderr
    md = (run_dir / "report.md").read_text()
    sizes = {"latency_cdf.png": (1100, 750), "over_time.png": (1080, 900), "stages.png": (990, 450),
             "ttft_split.png": (990, 342), "stress.png": (1080, 432)}
    for name, size in sizes.items():
        assert png_size(run_dir / name) == size, name
        assert f"]({name})" in md, name
    assert png_size(run_dir / "experts.png")[0] > 300 and "](experts.png)" in md
    assert "| expert_compute | 30.0 | 75.0% |" in md  # 1600 ms x 75% over 40 steps
    assert "| all | 30 | 0.000 | 1.00 | 9.00 | 0.500 | 89.5 | 100.0 |" in md
    assert "| slowest 10% | 3 |" in md and "| slowest 1% | 1 |" in md


@pytest.mark.parametrize("name, line", [("ttft.hlog", "0.0,1.0,0.0,not-a-histogram"),
                                        ("server_stats.jsonl", '{"t_run_s": 1.0}'),
                                        ("requests.jsonl", "[1, 2]")])
def test_a_broken_line_exits_2_naming_file_and_line(tmp_path, name, line):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    (run_dir / name).write_text(line + "\n")
    done = analysis("report", run_dir)
    assert done.returncode == 2
    assert f"{run_dir / name}:1" in done.stderr and "Traceback" not in done.stderr


def test_a_distributed_runs_worker_logs_are_added_period_by_period(tmp_path):
    # Two workers, the second started 0.3 s after the first: their periods line up one to one.
    for worker, start_unix_s, values in ((0, 1.8e9, [[100]] * 5),
                                         (1, 1.8e9 + 0.3, [[200, 300]] * 5)):
        (tmp_path / f"worker-{worker}").mkdir()
        write_hlog(tmp_path / f"worker-{worker}" / "ttft.hlog", values, start_unix_s=start_unix_s)
    write_samples(tmp_path / "worker-1" / "server_stats.jsonl",
                  [stats_snapshot(1.0 + i, 10 * (i + 1), 400.0 * (i + 1), [[10, 10]])
                   for i in range(3)])
    intervals = load_intervals(tmp_path, "ttft")
    assert [i.hist.get_total_count() for i in intervals] == [3] * 5
    assert (intervals[1].start_s == pytest.approx(1.0)
            and intervals[1].length_s == pytest.approx(1.3))
    assert intervals[2].hist.get_max_value() == pytest.approx(300_000, rel=1e-3)
    assert len(read_samples(tmp_path)) == 3  # the first worker with samples
    write_run(tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["workers"] = [{"worker": 0, "sent": 5, "cpu_percent": 3.0, "window_s": 5.0},
                          {"worker": 1, "sent": 10, "cpu_percent": 4.2, "window_s": 5.0}]
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    done = analysis("report", tmp_path / "run")
    assert ("2 workers (interval logs in worker-<i>/): worker 0 sent 5, CPU 3%; "
            "worker 1 sent 10, CPU 4%") in done.stdout


def test_rates_past_the_request_rows_cap_come_from_the_interval_logs(tmp_path):
    # 20 one-second intervals, one request finishing in each; requests.jsonl kept the first 8
    write_hlog(tmp_path / "ttft.hlog", [[100] for _ in range(20)])
    write_rows(tmp_path / "requests.jsonl",
               [request_row(i, 100, 20, 700) | {"scheduled_ms": 100.0 + 1000 * i}
                for i in range(8)])
    write_summary(tmp_path, requests={"sent": 20, "ok": 20, "failed": 0, "not_sent": 0,
                                      "failed_by_code": {}, "warmup": 0, "rows_omitted": 12})
    series = client_series(Run(tmp_path), window_s=0)
    assert series.offered_rps[:8].tolist() == [1.0] * 8
    assert np.isnan(series.offered_rps[9:]).all()  # unknown past the cap, not 0
    assert series.achieved_rps.tolist() == [1.0] * 20
