"""`python -m analysis soak` on run directories built here: a stable run says "no drift" for every
series; a leaking one (RSS +10 MB per minute, TTFT p99 rising linearly) says drift at the slope
computed by hand; a real but tiny slope under --min-change is "no drift" over an hour's horizon
and drift over a day's; a slow leak in a 20-minute soak is judged against the horizon and the
budget; windows with too few requests are skipped and counted; a missing file is "no data"; a
run under 3 windows, or a --window-s under the run's logging interval, exits 2; soak.png is a
real PNG of the figure's size whose RSS axis fits a 1 GB level closely enough to show a leak; and
the OLS fit and its t quantiles match hand-computed values."""

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.soak.render import sentence, soak_figure
from analysis.soak.series import Series, soak
from analysis.soak.trend import Judging, fit_trend
from tests.cli import Done, analysis
from tests.rundirs import (
    png_size,
    request_row,
    write_hlog,
    write_rows,
    write_samples,
    write_summary,
)

MB = 2**20


def write_soak_run(run_dir: Path, seconds: int, ttft_ms, tpot_ms, rss_mb,
                   waiting=lambda t: 0) -> None:
    """`seconds` intervals of 1 s: ttft_ms(i) and tpot_ms(i) give interval i's values, rss_mb(t) and
    waiting(t) the GetStats sample taken t s into the run (t = 1 .. seconds)."""
    run_dir.mkdir()
    write_hlog(run_dir / "ttft.hlog", [ttft_ms(i) for i in range(seconds)])
    write_hlog(run_dir / "tpot.hlog", [tpot_ms(i) for i in range(seconds)])
    write_samples(run_dir / "server_stats.jsonl",
                  [{"process_rss_bytes": int(rss_mb(t) * MB), "waiting": waiting(t)}
                   for t in range(1, seconds + 1)])


def run_soak(run_dir: Path, *flags: str) -> Done:
    return analysis("soak", run_dir, *flags)


def figures(done: Done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_stable_run(run_dir: Path) -> Path:
    """Five minutes, flat but for noise: TTFT 100 +- 5 ms, TPOT 30 +- 2 ms, RSS 1000 +- 2 MB."""
    rng = np.random.default_rng(7)
    write_soak_run(run_dir, 300, ttft_ms=lambda i: rng.normal(100, 5, 10).clip(1),
                   tpot_ms=lambda i: rng.normal(30, 2, 10).clip(1),
                   rss_mb=lambda t: 1000 + rng.normal(0, 2))
    return run_dir


def test_stable_run_has_no_drift(tmp_path):
    run_dir = write_stable_run(tmp_path / "stable")
    # judged over an hour ahead: five minutes can speak for that
    result = figures(run_soak(run_dir, "--window-s", "30", "--horizon-h", "1"))
    assert result["windows"] == 10 and result["drift"] == [] and result["cannot_judge"] == []
    assert {key: s["verdict"] for key, s in result["series"].items()} == {
        "ttft_p99_ms": "no drift", "tpot_p99_ms": "no drift", "rss_mb": "no drift",
        "waiting": "no drift", "generator_rss_mb": "no data"}
    # 300 requests per window, over --min-samples 50
    assert result["series"]["ttft_p99_ms"]["windows"] == 10
    # a constant series fits a slope of exactly 0
    assert result["series"]["waiting"]["slope_per_h"] == 0
    assert (run_dir / "soak.md").read_text().count("no drift") >= 4


def test_leaking_run_drifts_at_the_hand_computed_rate(tmp_path):
    run_dir = tmp_path / "leak"
    # Interval i: ten requests of TTFT 100 + 0.5 i ms. A 30 s window k holds intervals
    # 30k .. 30k + 29, and its p99 (rank 297 of 300) is the last one's: 100 + 0.5 (30k + 29) at
    # the window centre 30k + 15, so 0.5 ms per s = 1800 ms/h. RSS 200 MB + 10 MB per minute =
    # 600 MB/h (+22% over the run); queue depth t // 60.
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100 + 0.5 * i] * 10,
                   tpot_ms=lambda i: [30] * 10, rss_mb=lambda t: 200 + 10 * t / 60,
                   waiting=lambda t: t // 60)
    done = run_soak(run_dir, "--window-s", "30")
    result = figures(done)
    ttft, rss = result["series"]["ttft_p99_ms"], result["series"]["rss_mb"]
    assert ttft["verdict"] == "drift" and rss["verdict"] == "drift"
    assert ttft["slope_per_h"] == pytest.approx(1800, rel=0.005)  # HDR keeps 3 significant digits
    assert ttft["start"] == pytest.approx(100 + 0.5 * 29, rel=0.005)
    assert ttft["end"] == pytest.approx(100 + 0.5 * (270 + 29), rel=0.005)
    assert ttft["change_pct"] == pytest.approx(100 * 0.5 * 270 / 114.5, rel=0.01)
    # Window means of a linear RSS sit on the line at their samples' mean times: 15 s (t = 1..29)
    # to 285 s.
    assert rss["slope_per_h"] == pytest.approx(600)
    assert (rss["start"] == pytest.approx(200 + 10 * 15 / 60)
            and rss["end"] == pytest.approx(200 + 10 * 285 / 60))
    assert rss["change_pct"] == pytest.approx(100 * 45 / 202.5)
    assert rss["ci_per_h"] == pytest.approx([600, 600])  # no residuals: the interval is the point
    assert result["series"]["tpot_p99_ms"]["verdict"] == "no drift"
    assert set(result["drift"]) == {"ttft_p99_ms", "rss_mb", "waiting"}
    assert "server RSS: drift, rising +600.0 MB/h" in done.stdout
    assert ("TTFT p99: drift, rising +18" in done.stdout
            and "+117.9% over the run" in done.stdout)


def test_a_significant_but_tiny_slope_is_no_drift(tmp_path):
    rng = np.random.default_rng(3)
    run_dir = tmp_path / "creep"
    # RSS creeps up 0.01 MB per s (36 MB/h) under +-0.05 MB of noise: about 2.7 MB over the run,
    # 0.27% of 1000 MB.
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100] * 10, tpot_ms=lambda i: [30] * 10,
                   rss_mb=lambda t: 1000 + 0.01 * t + rng.uniform(-0.05, 0.05))
    rss = figures(run_soak(run_dir, "--window-s", "30", "--horizon-h", "1"))["series"]["rss_mb"]
    assert rss["ci_per_h"][0] > 0  # the slope is real ...
    assert rss["slope_per_h"] == pytest.approx(36, rel=0.05)
    assert rss["verdict"] == "no drift"  # ... but under 10% of the start, and 36 MB in an hour
    strict = figures(run_soak(run_dir, "--window-s", "30", "--horizon-h", "1",
                              "--min-change", "0.001"))["series"]["rss_mb"]
    assert strict["verdict"] == "drift"  # the threshold, not the noise, decided
    # over the default day the same slope is 864 MB, past the 500 MB budget
    day = figures(run_soak(run_dir, "--window-s", "30"))["series"]["rss_mb"]
    assert day["verdict"] == "drift" and day["over_budget"]


def test_five_minutes_cannot_judge_a_day_and_fail_on_drift_fails_on_it(tmp_path):
    # the stable run above, judged over the default 24 h: TTFT p99's 5 ms of noise leaves the
    # slope's interval, continued for a day, wider than the 100 ms budget
    run_dir = write_stable_run(tmp_path / "stable")
    done = run_soak(run_dir, "--window-s", "30")
    ttft = figures(done)["series"]["ttft_p99_ms"]
    assert ttft["verdict"] == "cannot judge" and ttft["projected_ci"][1] > ttft["budget"] == 100
    assert "ttft_p99_ms" in figures(done)["cannot_judge"]
    said = next(line for line in done.stdout.splitlines() if line.startswith("TTFT p99: "))
    assert "the interval cannot tell drift from none against the budget" in said
    assert "a longer soak would tell" in said  # its fitted slope alone is past the budget
    assert run_soak(run_dir, "--window-s", "30", "--fail-on-drift").returncode == 1


def test_sparse_windows_are_skipped_and_counted(tmp_path):
    run_dir = tmp_path / "sparse"
    # TPOT: the first 30 intervals hold 1 request each (30 < --min-samples 50): window 0 is skipped.
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100] * 10,
                   tpot_ms=lambda i: [30] * (1 if i < 30 else 10), rss_mb=lambda t: 1000)
    done = run_soak(run_dir, "--window-s", "30")
    tpot = figures(done)["series"]["tpot_p99_ms"]
    assert (tpot["windows"], tpot["skipped"]) == (9, 1)
    assert "TPOT p99: 1 windows skipped (fewer than 50 requests)" in done.stdout
    few = figures(run_soak(run_dir, "--window-s", "30",
                           "--min-samples", "400"))["series"]["ttft_p99_ms"]
    assert few["verdict"] == "cannot judge" and few["skipped"] == 10


def test_a_missing_file_is_no_data_and_skip_s_drops_the_start(tmp_path):
    run_dir = tmp_path / "no_samples"
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100] * 10, tpot_ms=lambda i: [30] * 10,
                   rss_mb=lambda t: 1000)
    (run_dir / "server_stats.jsonl").unlink()
    done = run_soak(run_dir, "--window-s", "30", "--skip-s", "60")
    result = figures(done)
    assert result["windows"] == 8  # 240 s after the first 60
    assert (result["series"]["rss_mb"]["verdict"] == "no data"
            and result["series"]["waiting"]["verdict"] == "no data")
    assert result["series"]["ttft_p99_ms"]["windows"] == 8
    assert "server RSS: no data (server_stats.jsonl missing or without it)" in done.stdout


def test_too_short_a_run_exits_2_naming_the_flag(tmp_path):
    run_dir = tmp_path / "short"
    write_soak_run(run_dir, 100, ttft_ms=lambda i: [100], tpot_ms=lambda i: [30],
                   rss_mb=lambda t: 1000)
    done = run_soak(run_dir)  # 100 s is under 3 windows of 60 s
    assert done.returncode == 2
    assert ("too short" in done.stderr and "--window-s" in done.stderr
            and "Traceback" not in done.stderr)
    bad = run_soak(run_dir, "--window-s", "0")
    assert bad.returncode == 2 and "--window-s" in bad.stderr


@pytest.mark.parametrize("window_s", ["0.5", "1e-9"])
def test_a_window_under_the_logging_interval_exits_2_naming_the_flag(tmp_path, window_s):
    run_dir = tmp_path / "fine"
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100], tpot_ms=lambda i: [30],
                   rss_mb=lambda t: 1000)
    # no summary.json: intervals of the default 1 s
    done = run_soak(run_dir, "--window-s", window_s)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (f"--window-s {float(window_s):g} is shorter than the run's 1 s logging interval"
            in done.stderr)


def test_the_logging_interval_comes_from_the_summary(tmp_path):
    run_dir = tmp_path / "coarse"
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100] * 10, tpot_ms=lambda i: [30] * 10,
                   rss_mb=lambda t: 1000)
    write_summary(run_dir, config={"interval_s": 5.0, "warmup_s": 0})
    (run_dir / "histograms.json").write_text("{}")
    done = run_soak(run_dir, "--window-s", "3")
    assert (done.returncode == 2
            and "--window-s 3 is shorter than the run's 5 s logging interval" in done.stderr)
    assert figures(run_soak(run_dir, "--window-s", "30"))["windows"] == 10


def test_the_rss_axis_fits_its_level_and_the_queue_starts_at_0(tmp_path):
    # RSS 1000 MB + 0.2 MB/s: 1003 to 1057 MB, a 5% rise. From 0 it would be a flat line at the top.
    run_dir = tmp_path / "axes"
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100] * 10, tpot_ms=lambda i: [30] * 10,
                   rss_mb=lambda t: 1000 + 0.2 * t, waiting=lambda t: 1 + t % 2)
    windows, series = soak(run_dir, 30.0, None, Judging(min_samples=50, min_change=0.1))
    axes = {s.key: ax for s, ax in zip(series, soak_figure(series, windows, 0.1).axes, strict=True)}
    rss = next(s for s in series if s.key == "rss_mb")
    low, high = axes["rss_mb"].get_ylim()
    # the trend spans over half the axis
    assert 900 < low <= rss.trend.start and rss.trend.end <= high < 1150
    assert (rss.trend.end - rss.trend.start) / (high - low) > 0.4
    # TTFT is flat at 100 ms: its axis spans at least 10% (--min-change) of the level, near it, not
    # from 0.
    low, high = axes["ttft_p99_ms"].get_ylim()
    assert 10 <= high - low < 12 and 90 < low < 100 < high
    assert axes["waiting"].get_ylim()[0] == 0


def test_soak_png_is_a_real_png_of_the_figure_size(tmp_path):
    run_dir = tmp_path / "png"
    write_soak_run(run_dir, 300, ttft_ms=lambda i: [100 + i] * 10, tpot_ms=lambda i: [30] * 10,
                   rss_mb=lambda t: 1000 + t)
    figures(run_soak(run_dir, "--window-s", "30"))
    width, height = png_size(run_dir / "soak.png")
    assert (width, height) == (1100, 1125)  # 11 x 11.25 inches (3 rows of panels) at 100 dpi
    assert "![soak](soak.png)" in (run_dir / "soak.md").read_text()


def test_fit_trend_matches_the_hand_computed_ols():
    # t = 0..3, y = 1, 3, 2, 4: Sxx = 5, Sxy = 4, slope 0.8; residuals -0.3, 0.9, -0.9, 0.3 give
    # SSR 1.8, SE = sqrt(1.8 / 2 / 5) = 0.42426; t_0.975(2) = 4.30265, so the CI is 0.8 +- 1.8255
    # and holds 0.
    trend = fit_trend(np.arange(4.0), np.asarray([1.0, 3.0, 2.0, 4.0]), min_change=0.1)
    assert trend.slope_per_s == pytest.approx(0.8)
    assert trend.ci_per_s == pytest.approx((0.8 - 4.30265 * 0.424264, 0.8 + 4.30265 * 0.424264),
                                           rel=1e-5)
    assert (trend.start, trend.end) == pytest.approx((1.3, 3.7))
    assert not trend.significant and not trend.drift


def test_a_fitted_line_that_falls_below_zero_is_held_at_zero_and_said():
    # a latency that starts high and settles: the least-squares line crosses 0 before the end
    # (fitted end -1.26 ms here), where no latency can be
    t_s = np.arange(5.0)
    trend = fit_trend(t_s, np.asarray([9.0, 1.0, 0.5, 0.5, 0.4]), min_change=0.1)
    assert trend.end == 0.0 and trend.start > 0 and trend.below_zero
    assert trend.change_share >= -1.0
    series = Series("ttft_p99_ms", "TTFT p99", "ms", t_s, np.ones(5), 0, "ttft.hlog", trend)
    assert "falls below 0, held at 0" in sentence(series, 0.1)


def write_rehearsal_run(run_dir: Path, ttft_ms, generator_rss_mb, fault_s=(290, 330),
                        cap_s=120, **requests) -> None:
    """600 s: flat TPOT and server RSS; the server's fault window open over fault_s (seen in the
    samples); requests.jsonl's row cap filled at cap_s."""
    write_soak_run(run_dir, 600, ttft_ms=ttft_ms, tpot_ms=lambda i: [30.0] * 10,
                   rss_mb=lambda t: 1000.0)
    lines = []
    for line in (run_dir / "server_stats.jsonl").read_text().splitlines():
        sample = json.loads(line)
        t = sample["t_run_s"]
        sample["generator_rss_bytes"] = int(generator_rss_mb(t) * MB)
        sample["stats"]["faults"] = {"active": fault_s[0] <= t <= fault_s[1]}
        lines.append(json.dumps(sample))
    (run_dir / "server_stats.jsonl").write_text("\n".join(lines) + "\n")
    write_rows(run_dir / "requests.jsonl", [request_row(i, 100.0, 30.0, 500.0)
                                            for i in range(cap_s * 10)])  # 10 a second
    accounting = {"sent": 6000, "ok": 5400, "failed": 100, "cancelled": 500, "not_sent": 0,
                  "failed_by_code": {"INTERNAL": 100}, "warmup": 0, "rows_omitted": 4800}
    write_summary(run_dir, requests=accounting | requests)


def test_a_fault_rehearsal_and_the_rows_cap_are_left_out_and_the_accounting_checked(tmp_path):
    run_dir = tmp_path / "rehearsal"
    # TTFT 20x in the fault window and still 5x in the minute after it
    write_rehearsal_run(run_dir, ttft_ms=lambda i: [2000.0 if 290 <= i <= 330 else
                                                    500.0 if 330 < i <= 390 else 100.0] * 10,
                        generator_rss_mb=lambda t: 100 + 0.5 * min(t, 120))
    done = run_soak(run_dir, "--window-s", "60", "--fail-on-drift")
    result = figures(done)
    assert result["drift"] == [] and result["accounted"] is True
    ttft = result["series"]["ttft_p99_ms"]
    # 289-391 s left out (the window open, a second either side, a window's 60 s recovering):
    # window 5 (300-360 s) emptied, 4 and 6 keep their other seconds
    assert ttft["excluded"] == 1 and ttft["windows"] == 9
    assert "TTFT p99: 1 windows left out (102 s touched by the fault rehearsal" in done.stdout
    assert ttft["end"] == pytest.approx(100, rel=0.01)
    generator = result["series"]["generator_rss_mb"]
    assert generator["verdict"] == "no drift" and generator["excluded"] == 2  # 0-120 s
    assert "load generator RSS: 2 windows left out (before the request rows' cap filled at " \
           "120 s" in done.stdout
    assert ("requests: every one accounted for: sent 6000 = ok 5400 + failed 100 (INTERNAL 100) "
            "+ cancelled by the client 500; not sent 0") in done.stdout


def test_a_generator_whose_row_cap_never_filled_cannot_be_judged(tmp_path):
    # its memory grows with the rows it keeps all run, by design: no window can say a leak
    run_dir = tmp_path / "uncapped"
    write_rehearsal_run(run_dir, ttft_ms=lambda i: [100.0] * 10,
                        generator_rss_mb=lambda t: 100 + 0.5 * t, rows_omitted=0)
    done = run_soak(run_dir, "--window-s", "60")
    generator = figures(done)["series"]["generator_rss_mb"]
    assert generator["verdict"] == "cannot judge" and generator["excluded"] == 10
    assert "row cap (--max-request-rows) never filled" in done.stdout
    assert figures(done)["drift"] == [] and "generator_rss_mb" in figures(done)["cannot_judge"]


@pytest.mark.slow
def test_fail_on_drift_exits_1_on_a_leak_or_a_lost_request(tmp_path):
    leaking = tmp_path / "leaking"
    write_rehearsal_run(leaking, ttft_ms=lambda i: [100.0] * 10,
                        generator_rss_mb=lambda t: 100 + 0.5 * t)
    done = run_soak(leaking, "--window-s", "60", "--fail-on-drift")
    assert done.returncode == 1
    assert json.loads(done.stdout.splitlines()[-1])["drift"] == ["generator_rss_mb"]
    lost = tmp_path / "lost"
    write_rehearsal_run(lost, ttft_ms=lambda i: [100.0] * 10, generator_rss_mb=lambda t: 100,
                        ok=5399)
    done = run_soak(lost, "--window-s", "60", "--fail-on-drift")
    assert done.returncode == 1 and "requests: NOT all accounted for" in done.stdout
    assert run_soak(lost, "--window-s", "60").returncode == 0  # without the flag: told only


def write_twenty_minutes(run_dir: Path, rss_mb, ttft_ms=lambda i: [100.0] * 10) -> None:
    write_soak_run(run_dir, 1200, ttft_ms=ttft_ms, tpot_ms=lambda i: [30.0] * 10, rss_mb=rss_mb)


@pytest.mark.slow
def test_a_slow_leak_in_a_short_soak_drifts_over_the_horizon(tmp_path):
    rng = np.random.default_rng(11)
    run_dir = tmp_path / "slow-leak"
    # +30 MB/h for 20 minutes: 10 MB, 0.7% of 1400 MB, far under --min-change; a day of it is
    # 720 MB, past a 500 MB budget
    write_twenty_minutes(run_dir, rss_mb=lambda t: 1400 + 30 * t / 3600 + rng.normal(0, 0.5))
    done = run_soak(run_dir, "--horizon-h", "24", "--budget-mb", "500")
    result = figures(done)
    rss = result["series"]["rss_mb"]
    assert rss["slope_per_h"] == pytest.approx(30, rel=0.1)
    assert rss["change_pct"] < 10 and rss["verdict"] == "drift" and rss["over_budget"]
    assert rss["projected"] == pytest.approx(24 * rss["slope_per_h"])
    assert rss["projected_ci"] == pytest.approx([24 * v for v in rss["ci_per_h"]])
    assert rss["projected_ci"][0] > 500
    assert rss["hours_to_budget"] == pytest.approx(500 / rss["ci_per_h"][0])
    assert result["drift"] == ["rss_mb"] and result["horizon_h"] == 24
    line = next(x for x in done.stdout.splitlines() if x.startswith("server RSS:"))
    assert "drift, rising +" in line and "over the run (19 min measured)" in line
    assert "over 24 h: +7" in line and "past the 500 MB budget within 24 h" in line
    # a week's budget of 1 GB is not crossed in a day; a 12 h horizon stays under 500 MB
    assert figures(run_soak(run_dir, "--budget-mb", "1000"))["series"]["rss_mb"]["verdict"] \
        == "no drift"
    half = run_soak(run_dir, "--horizon-h", "12")
    assert figures(half)["series"]["rss_mb"]["verdict"] == "no drift"
    assert "within the 500 MB budget" in half.stdout


@pytest.mark.slow
def test_a_flat_short_soak_has_no_drift_over_the_horizon(tmp_path):
    rng = np.random.default_rng(12)
    run_dir = tmp_path / "flat"
    write_twenty_minutes(run_dir, rss_mb=lambda t: 1400 + rng.normal(0, 0.5))
    result = figures(run_soak(run_dir, "--horizon-h", "24", "--budget-mb", "500"))
    rss = result["series"]["rss_mb"]
    assert rss["verdict"] == "no drift" and not rss["over_budget"]
    assert abs(rss["projected_ci"][0]) < 500 and result["drift"] == []


def test_latency_is_projected_against_its_own_budget(tmp_path):
    run_dir = tmp_path / "creeping-latency"
    # TTFT p99 up 0.05 ms a minute: 3 ms/h, 72 ms over a day
    write_twenty_minutes(run_dir, rss_mb=lambda t: 1400,
                         ttft_ms=lambda i: [100.0 + 0.05 * i / 60] * 10)
    ttft = figures(run_soak(run_dir))["series"]["ttft_p99_ms"]
    assert ttft["slope_per_h"] == pytest.approx(3, rel=0.1) and ttft["budget"] == 100
    assert ttft["verdict"] == "no drift"
    tight = figures(run_soak(run_dir, "--budget-ms", "50"))["series"]["ttft_p99_ms"]
    assert tight["verdict"] == "drift" and tight["over_budget"]
    assert run_soak(run_dir, "--budget-ms", "-1").returncode == 2


def test_an_undecided_trend_says_how_much_longer_a_soak_would_tell():
    # windows every 30 s, flat but for +-5 ms of noise: over 24 h the slope's interval reaches
    # past a 100 ms budget; a soak as many times longer as it says, with the same noise, brings
    # the interval's half-width within the budget
    def trend(n: int):
        t = np.arange(n) * 30.0
        return fit_trend(t, 100 + 5 * np.array([1, -1] * (n // 2)), 0.1, 24 * 3600.0, 100.0)

    short = trend(10)
    assert short.undecided and not short.drift and short.longer_by > 1
    longer = trend(2 * round(10 * short.longer_by / 2))
    low, high = longer.projected_ci
    assert 60 < (high - low) / 2 <= 100  # within it, and not by much (the t quantile falls)
