"""The bottleneck rules of analysis/diagnosis.py on run directories built here: for
each rule one run built to fire it and one built not to, with the evidence numbers checked
against values worked out by hand; rules without their data say what was missing; the text
and markdown put fired rules first; the command writes diagnosis.md and a JSON last line."""

import argparse
import json
import re
from pathlib import Path

import pytest

from analysis import diagnosis
from analysis.diagnosis import diagnose, render_markdown, render_text
from analysis.readers.intervals import read_hlog
from analysis.readers.rundir import load_run
from analysis.rules.spikes import merge_windows
from tests.rundirs import encoded, request_row, step_row, write_hlog, write_rows, write_samples
from tests.test_analysis import snapshot, write_run

EXPERTS = 4
QUIET_GENERATOR = {"late_sends": 0, "late_threshold_ms": 5.0, "cpu_percent": 3.0, "warnings": []}


def interval(waiting=0, running=2, kv_in_use=2, steps=10, step_ms=500.0, routed=(10, 10, 10, 10),
             hits=0, misses=0, copy_ms=0.0, gpu_percent=-1.0) -> dict:
    """What one --interval-s of the server did: counters as deltas, gauges as read at its end."""
    return dict(waiting=waiting, running=running, kv_in_use=kv_in_use, steps=steps, step_ms=step_ms,
                routed=list(routed), hits=hits, misses=misses, copy_ms=copy_ms,
                gpu_percent=gpu_percent)


def histogram(count: int, total: float) -> dict:
    """A GetStats Histogram with everything in one bucket (the series only reads count and sum)."""
    bounds = [1.0, 10.0, 100.0, 1000.0]
    return {"bounds": bounds, "counts": [0, 0, count, 0, 0], "count": count, "sum": total,
            "max": total / count if count else 0.0}


def getstats(intervals: list[dict], *, kv_total=8, max_batch_size=8, expert_cache=0) -> list[dict]:
    """Cumulative GetStats snapshots, one before the first interval and one after each, in the shape
    of a line of runs/demo/fcfs/server_stats.jsonl (one MoE layer of EXPERTS experts)."""
    steps = step_ms = hits = misses = copy_ms = 0.0
    routed = [0] * EXPERTS
    snaps = []
    empty = interval(running=0, kv_in_use=0, steps=0, step_ms=0.0, routed=[0] * EXPERTS)
    for i, iv in enumerate([empty] + intervals):
        steps += iv["steps"]
        step_ms += iv["step_ms"]
        hits, misses, copy_ms = hits + iv["hits"], misses + iv["misses"], copy_ms + iv["copy_ms"]
        routed = [a + b for a, b in zip(routed, iv["routed"], strict=True)]
        layer = {"expert_tokens": routed, "dropped": [0] * EXPERTS, "imbalance_max_over_mean": 1.0,
                 "imbalance_cv": 0.0, "active_experts_steps": [0, 0, 0, 0, int(steps)]}
        if expert_cache:
            layer["cache"] = {"hits": int(hits), "misses": int(misses), "evictions": int(misses),
                              "bytes_copied": 0, "copy_ms": copy_ms, "wait_ms": copy_ms}
        uptime = 10.0 + i
        snaps.append({
            "policy": "fcfs", "preset": "tiny", "device": "cpu", "dtype": "float32",
            "uptime_s": uptime, "window_s": uptime, "requests_admitted": i, "requests_finished": i,
            "requests_aborted": 0, "requests_rejected": 0, "steps": int(steps),
            "tokens_generated": int(steps) * 2, "prompt_tokens": 64 * i, "running": iv["running"],
            "waiting": iv["waiting"], "kv_slots_in_use": iv["kv_in_use"],
            "kv_slots_total": kv_total, "mean_batch_size": 2.0, "num_layers": 1,
            "num_experts": EXPERTS, "top_k": 2, "expert_tokens": [routed],
            "max_batch_size": max_batch_size, "max_seq_len": 1024,
            "step_time_mean_ms": step_ms / steps if steps else 0.0, "router": "topk",
            "routing_skew": "uniform", "capacity_factor": 0.0, "moe_kernel": "sorted",
            "expert_cache": expert_cache, "cache_policy": "lru", "layers": [layer],
            "stages": [{"stage": "expert_compute", "ms": histogram(int(steps), step_ms / 2)}],
            "step_ms": histogram(int(steps), step_ms),
            "batch_size": histogram(int(steps), 2.0 * steps),
            "tokens_per_step": histogram(int(steps), 2.0 * steps), "kv_positions_useful": 0,
            "kv_positions_computed": 0, "expert_bytes_read": 0, "expert_compute_ms": step_ms / 2,
            "expert_bandwidth_gb_s": 0.0, "process_cpu_percent": 50.0, "process_rss_bytes": 2**30,
            "gpu_utilization_percent": iv["gpu_percent"], "gpu_memory_bytes": 0,
            "prefill_tokens": 64 * i, "prefill_padded_tokens": 0,
            "policy_knobs": {"max_batch_size": float(max_batch_size)},
        })
    return snaps


def build_run(tmp_path: Path, *, server=None, ttft=None, tpot=None, send_lag=None, rows=None,
              generator=None, duration_s=30.2, expert_end=None, summary_send_lag=None,
              config=None, stress=None, **getstats_kw):
    """A run directory: write_run's summary and histograms, plus the time series given.
    server: interval() dicts -> server_stats.jsonl (snapshot i at i + 1 s, so series entry j covers
    j + 1 .. j + 2 s); ttft, tpot, send_lag: values (ms) per 1 s interval -> .hlog files.
    config: keys laid over write_run's config, whose warm-up is set to 0 here; stress: the stress
    section."""
    run_dir = tmp_path / "run"
    write_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["generator"] = QUIET_GENERATOR if generator is None else generator
    summary["duration_s"] = duration_s
    summary["window_s"] = min(summary["window_s"], duration_s)  # the window is part of the run
    summary["config"] |= {"warmup_s": 0.0} | (config or {})
    if stress is not None:
        summary["stress"] = stress
    if expert_end is not None:  # write_run's start snapshot routed [10, 10, 10, 10]
        end = snapshot(130.0, 300, [expert_end], 3.0)
        summary["server"]["end"] = end | {"router": "topk", "routing_skew": "hot:0.4"}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if summary_send_lag is not None:
        histograms = json.loads((run_dir / "histograms.json").read_text())
        histograms["send_lag"] = encoded(summary_send_lag)
        (run_dir / "histograms.json").write_text(json.dumps(histograms))
    if server is not None:
        write_samples(run_dir / "server_stats.jsonl", getstats(server, **getstats_kw))
    for name, values in (("ttft", ttft), ("tpot", tpot), ("send_lag", send_lag)):
        if values is not None:
            write_hlog(run_dir / f"{name}.hlog", values)
    if rows is not None:
        write_rows(run_dir / "requests.jsonl", rows)
    return load_run(run_dir)


def finding(findings, rule):
    return next(f for f in findings if f.rule == rule)


def mkdir(path: Path) -> Path:
    """A second run directory's parent inside one test's tmp_path."""
    path.mkdir()
    return path


def numbers(text: str, pattern: str) -> list[float]:
    """The numbers a regex's groups catch in text (evidence strings)."""
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return [float(group) for group in match.groups()]


# --- rules 1 and 2: the wait queue, and requests in the server, against utilisation ---------------

def growing_queue(step_ms: float, *, gpu_percent=-1.0, kv_in_use=8, running=6) -> list[dict]:
    """Waiting 0, 1, .., 9 at t = 2 .. 11 s: OLS slope exactly 1 request/s, a fitted rise of 9."""
    return [interval(waiting=w, running=running, kv_in_use=kv_in_use, step_ms=step_ms,
                     gpu_percent=gpu_percent)
            for w in range(10)]


def test_queue_growing_while_under_utilised_with_a_full_kv_pool(tmp_path):
    # 400 ms of steps a second: 40% busy
    findings = diagnose(build_run(tmp_path, server=growing_queue(400.0)))
    under = finding(findings, "throughput_underutilised")
    saturated = finding(findings, "compute_saturated")
    assert under.fired and not saturated.fired and saturated.judged
    queue, held, util, hold = under.evidence
    # t = 2..11, waiting = t - 2: slope 1, rise 1 x (11 - 2) = 9; thirds [0..3] mean 1.5 and
    # [7, 8, 9] mean 8.0.
    assert queue == ("wait queue 1.0-11.0 s: OLS slope +1.000 requests/s, a fitted rise of +9.0 "
                     "requests (mean 1.5 in the first third, 8.0 in the last)")
    # With 6 running throughout, requests in the server are waiting + 6.
    assert held == ("requests in the server (waiting + running) 1.0-11.0 s: OLS slope +1.000 "
                    "requests/s, a fitted rise of +9.0 requests (mean 7.5 in the first third, "
                    "14.0 in the last)")
    assert saturated.verdict == ("Requests in the server rose by 9.0 but the engine's busy share "
                                 "was only 40% (< 80%): compute was not the limit.")
    assert util.startswith("engine busy 40% of wall time (4.0 s of steps in 10.0 s;")
    # Waiting > 0 from t = 3 s on, with 8 of 8 KV slots held throughout.
    assert hold == ("requests waiting in 9 of 10 intervals: KV pool full (8 slots) in 9 (at 3.0, "
                    "4.0, 5.0, 6.0 and 5 more s), batch full (8) in 0, room in both in 0")
    assert "KV cache pool was full" in under.verdict and "only 40%" in under.verdict


def test_the_busy_share_is_judged_before_nvml_s_point_sample(tmp_path):
    # The engine steps all the time (busy 100%) while NVML's samples say the GPU is half used
    # (launch gaps, host syncs): the engine is the limit, and NVML's figure is evidence.
    findings = diagnose(build_run(tmp_path, server=growing_queue(1000.0, gpu_percent=50.0,
                                                                 running=8)))
    saturated = finding(findings, "compute_saturated")
    assert saturated.fired and not finding(findings, "throughput_underutilised").fired
    assert any(line.startswith("engine busy 100% of wall time") and
               line.endswith("NVML's GPU utilisation 50%, mean of 10 readings)")
               for line in saturated.evidence)


def test_queue_growing_with_room_everywhere_blames_the_policy(tmp_path):
    findings = diagnose(build_run(tmp_path, server=growing_queue(400.0, kv_in_use=2, running=2)))
    under = finding(findings, "throughput_underutilised")
    assert under.fired and "batching policy kept requests waiting" in under.verdict
    assert under.evidence[3].endswith("KV pool full (8 slots) in 0, batch full (8) in 0, "
                                      "room in both in 9")


def test_flat_queue_fires_neither_throughput_rule(tmp_path):
    findings = diagnose(build_run(tmp_path, server=[interval(step_ms=400.0) for _ in range(10)]))
    under = finding(findings, "throughput_underutilised")
    saturated = finding(findings, "compute_saturated")
    assert under.judged and not under.fired and saturated.judged and not saturated.fired
    assert under.verdict == "The wait queue did not grow (fitted rise +0.0 < 2 requests)."
    assert (saturated.verdict
            == "Requests in the server did not grow (fitted rise +0.0 < 2 requests).")


def test_queue_growing_while_busy_is_compute_saturated(tmp_path):
    # busy 100%, batch full at --max-batch-size 8
    server = growing_queue(1000.0, kv_in_use=4, running=8)
    findings = diagnose(build_run(tmp_path, server=server))
    saturated = finding(findings, "compute_saturated")
    under = finding(findings, "throughput_underutilised")
    assert saturated.fired and not under.fired
    assert saturated.verdict.startswith("Requests in the server (waiting + running) rose by 9.0 "
                                        "while the engine's busy share was 100% (>= 80%)")
    assert "Yet" not in saturated.verdict  # the batch was full: nothing held back by the policy
    assert saturated.evidence[3].endswith("batch full (8) in 9, room in both in 0")


def test_a_backlog_admitted_into_the_batch_is_compute_saturated(tmp_path):
    # A large batch and KV pool admit every arrival: waiting stays 0 while running climbs 1, 2, ..,
    # 10 (slope 1, rise 9) with the engine always busy. The wait queue alone would miss it.
    server = [interval(waiting=0, running=r, kv_in_use=r, step_ms=1000.0) for r in range(1, 11)]
    findings = diagnose(build_run(tmp_path, server=server, kv_total=64, max_batch_size=64))
    saturated = finding(findings, "compute_saturated")
    under = finding(findings, "throughput_underutilised")
    assert (saturated.fired
            and "rose by 9.0 while the engine's busy share was 100%" in saturated.verdict)
    assert (not under.fired
            and under.verdict == "The wait queue did not grow (fitted rise +0.0 < 2 requests).")
    assert saturated.evidence[1].startswith(
        "requests in the server (waiting + running) 1.0-11.0 s: OLS slope +1.000 requests/s, "
        "a fitted rise of +9.0")


def test_the_warm_up_ramp_is_left_out(tmp_path):
    # The server fills from empty in the 5 s warm-up (running 0, 2, 4, 6), then holds 6: over every
    # entry that is a rise, after the warm-up (entries from 5..6 s on) it is flat.
    server = [interval(running=r, step_ms=1000.0) for r in (0, 2, 4, 6, 6, 6, 6, 6, 6, 6)]
    saturated = finding(diagnose(build_run(tmp_path, server=server, config={"warmup_s": 5.0})),
                        "compute_saturated")
    assert saturated.judged and not saturated.fired
    assert saturated.evidence[1].startswith("requests in the server (waiting + running) "
                                            "5.0-11.0 s: OLS slope +0.000")
    ramp = finding(diagnose(build_run(mkdir(tmp_path / "no_warmup"), server=server)),
                   "compute_saturated")
    assert ramp.fired  # counted from the start, the ramp reads as growth


def stress_section(last_saturated: str, stopped_because: str) -> dict:
    """Two steps of 5 s (config step_s): step 1 spans 5..10 s, series entries 4..8."""
    return {"knee_rps": 1.0 if last_saturated else 2.0, "stopped_because": stopped_because,
            "steps": [step_row(step=0),
                      step_row(step=1, offered_rps=2.0, saturated=last_saturated)]}


def stress_run(tmp_path, stress: dict, step_ms: float = 1000.0):
    # Requests in the server climb all run long, as a rising offered rate makes them; nothing waits.
    server = [interval(waiting=0, running=r, kv_in_use=r, step_ms=step_ms) for r in range(1, 11)]
    return build_run(tmp_path, server=server, kv_total=64, max_batch_size=64, stress=stress,
                     config={"mode": "stress", "step_s": 5.0, "rate_step": 1.0})


def test_a_stress_run_that_stopped_on_saturation_while_busy_is_compute_saturated(tmp_path):
    stress = stress_section("achieved 1.2/s < 0.9 x the 2/s sent",
                            "step 1 at 2 requests/s: achieved 1.2/s < 0.9 x the 2/s sent")
    saturated = finding(diagnose(stress_run(tmp_path, stress)), "compute_saturated")
    assert saturated.fired
    assert saturated.verdict == ("The stress run stopped on saturation in step 1 "
                                 "(achieved 1.2/s < 0.9 x the 2/s sent) while the engine's busy "
                                 "share was 100% there (>= 80%): the server is compute-saturated "
                                 "past the knee at 1 requests/s.")
    assert saturated.evidence[:3] == [
        "stress run: knee 1 requests/s; stopped: step 1 at 2 requests/s: "
        "achieved 1.2/s < 0.9 x the 2/s sent",
        "last step 1, 5-10 s at 2 requests/s offered: saturated "
        "(achieved 1.2/s < 0.9 x the 2/s sent)",
        "engine busy 100% of wall time (5.0 s of steps in 5.0 s; "
        "the server reports no GPU utilisation)"]
    # Entries 4..8 (5..10 s) hold running 5..9.
    assert saturated.evidence[3].startswith(
        "requests in the server (waiting + running) 5.0-10.0 s: OLS slope +1.000 requests/s, "
        "a fitted rise of +4.0")
    # The same stop with the engine 40% busy in that step is not compute.
    idle = finding(diagnose(stress_run(mkdir(tmp_path / "idle"), stress, step_ms=400.0)),
                   "compute_saturated")
    assert not idle.fired and "was only 40% there (< 80%)" in idle.verdict


def test_a_stress_run_that_never_saturated_is_not_compute_saturated(tmp_path):
    # Requests in the server rose by 9 over the run, as the offered rate rose, but every step held.
    stress = stress_section("", "no saturation within 2 steps")
    findings = diagnose(stress_run(tmp_path, stress))
    saturated = finding(findings, "compute_saturated")
    assert saturated.judged and not saturated.fired
    assert saturated.verdict == ("The stress run did not stop on saturation (no saturation within "
                                 "2 steps): its last step held, so no knee was reached.")
    assert (saturated.evidence[0]
            == "stress run: knee 2 requests/s; stopped: no saturation within 2 steps")
    assert not finding(findings, "throughput_underutilised").fired


def test_oscillating_queue_while_busy_is_not_saturated(tmp_path):
    server = [interval(waiting=j % 2, step_ms=1000.0) for j in range(10)]
    saturated = finding(diagnose(build_run(tmp_path, server=server)), "compute_saturated")
    # Waiting 0, 1, 0, 1 ..: sum (t - 6.5)(w - 0.5) = 2.5 over sum (t - 6.5)^2 = 82.5: slope
    # 0.0303, rise 0.27. Running stays 2, so requests in the server move the same way.
    assert not saturated.fired
    for line in saturated.evidence[:2]:
        assert numbers(line, r"OLS slope \+([\d.]+) .* rise of \+([\d.]+)") == [0.030, 0.3]


def test_the_drain_after_the_schedule_is_left_out(tmp_path):
    # Requests were scheduled until 6 s; afterwards the queue drains. Over all ten entries the slope
    # is negative (-8.0 / 82.5); over t = 2..6 s, waiting 0..4 rises by 4.
    server = [interval(waiting=w, step_ms=1000.0, running=8)
              for w in (0, 1, 2, 3, 4, 3, 2, 1, 0, 0)]
    saturated = finding(diagnose(build_run(tmp_path, server=server, duration_s=6.0)),
                        "compute_saturated")
    assert saturated.fired
    assert saturated.evidence[0].startswith("wait queue 1.0-6.0 s: OLS slope +1.000 requests/s, "
                                            "a fitted rise of +4.0")
    assert saturated.evidence[1].startswith("requests in the server (waiting + running) "
                                            "1.0-6.0 s: OLS slope +1.000")


# --- rule 3: expert imbalance -------------------------------------------------------------------

def test_one_hot_expert_fires_imbalance(tmp_path):
    # Over the run: [70, 30, 10, 10] - [10, 10, 10, 10] = [60, 20, 0, 0]: mean 20, expert 0 has
    # 3.00x, 75%.
    server = [interval() for _ in range(5)]
    # series entry 3 covers 4..5 s: max/mean 40 / 10 = 4.00
    server[3] = interval(routed=(40, 0, 0, 0))
    imbalance = finding(diagnose(build_run(tmp_path, server=server, expert_end=[70, 30, 10, 10])),
                        "expert_imbalance")
    assert imbalance.fired
    assert imbalance.evidence[0] == ("layer 0: expert 0 took 75.0% of its routed (token, expert) "
                                     "pairs (mean 25.0%), max/mean 3.00")
    assert imbalance.evidence[1] == "1 of 1 layers above 1.5 (end minus start snapshot)"
    assert imbalance.evidence[2].startswith("highest interval max/mean (most imbalanced layer): "
                                            "4.00 at 4.0-5.0 s, 1.00 at 1.0-2.0 s")
    assert imbalance.evidence[3] == "router topk, routing skew hot:0.4"


def test_near_idle_intervals_are_left_out_of_the_interval_figures(tmp_path):
    # Entry 3 (4..5 s) routed 4 pairs, all to expert 0: max/mean 4.00, the most top-2 of 4 experts
    # can give, from one token or two. Under 10 pairs per expert (40 a layer) it is left out; the
    # rest read 1.00.
    server = [interval() for _ in range(5)]
    server[3] = interval(routed=(4, 0, 0, 0))
    imbalance = finding(diagnose(build_run(tmp_path, server=server, expert_end=[70, 30, 10, 10])),
                        "expert_imbalance")
    assert imbalance.evidence[2] == ("highest interval max/mean (most imbalanced layer): 1.00 at "
                                     "1.0-2.0 s, 1.00 at 2.0-3.0 s, 1.00 at 3.0-4.0 s; "
                                     "1 interval(s) under 40 (token, expert) pairs per layer "
                                     "left out")


def test_balanced_experts_do_not_fire_imbalance(tmp_path):
    # [32, 28, 30, 30] - [10, 10, 10, 10] = [22, 18, 20, 20]: max/mean 22 / 20 = 1.10.
    imbalance = finding(diagnose(build_run(tmp_path, expert_end=[32, 28, 30, 30])),
                        "expert_imbalance")
    assert imbalance.judged and not imbalance.fired
    assert (imbalance.verdict
            == "Every layer's max/mean expert load is at most 1.10 (threshold 1.5).")


# --- rule 4: data movement ------------------------------------------------------------------------

def cached(copy_ms: float) -> list[dict]:
    return [interval(steps=10, step_ms=1000.0, hits=90, misses=10, copy_ms=copy_ms)
            for _ in range(10)]


def test_expert_copies_above_a_fifth_of_step_time_fire(tmp_path):
    movement = finding(diagnose(build_run(tmp_path, server=cached(300.0), expert_cache=2)),
                       "data_movement")
    assert movement.fired and "judged apart (communication)" in movement.verdict
    # 10 intervals: 3000 ms copying of 10000 ms of steps; 900 hits, 100 misses; 100 steps.
    assert movement.evidence == ["copy 3000 ms of 10000 ms step time (30.0%; threshold 20%)",
                                 "hit rate 90.0% (900 hits, 100 misses); "
                                 "2 resident experts per layer",
                                 "30.0 ms copying per step, 30.0 ms per miss"]


def test_cheap_expert_copies_do_not_fire(tmp_path):
    movement = finding(diagnose(build_run(tmp_path, server=cached(50.0), expert_cache=2)),
                       "data_movement")
    assert movement.judged and not movement.fired
    assert movement.evidence[0] == "copy 500.0 ms of 10000 ms step time (5.0%; threshold 20%)"


def test_no_expert_cache_moves_no_weights(tmp_path):
    movement = finding(diagnose(build_run(tmp_path, server=cached(0.0))), "data_movement")
    assert (movement.judged and not movement.fired
            and movement.verdict.startswith("No --expert-cache"))


# --- rule 5: latency spikes -----------------------------------------------------------------------

STEADY_TPOT = [[20] * 5 for _ in range(8)]


def ttft_with(spike_ms: float, base_ms: float = 100.0, at: int = 5) -> list[list[float]]:
    """Eight 1 s intervals of five requests each; interval `at` (at..at+1 s) holds spike_ms."""
    return [[spike_ms if i == at else base_ms] * 5 for i in range(8)]


def test_a_spike_lined_up_with_queue_growth(tmp_path):
    server = [interval() for _ in range(9)]
    server[4] = interval(waiting=3)  # entry 4 covers 5..6 s, the spike's own interval
    run = build_run(tmp_path, server=server, ttft=ttft_with(400.0), tpot=STEADY_TPOT)
    spikes = finding(diagnose(run), "latency_spikes")
    assert spikes.fired
    assert (spikes.verdict
            == "Latency spiked in 1 window(s) (TTFT 1); lined up with queue growth (1).")
    ttft_line, tpot_line, spike = spikes.evidence
    # HDR keeps 3 significant digits: 100 ms reads back as 100.03, 400 ms as 400.13.
    typical, limit = numbers(ttft_line,
                             r"median window p99 ([\d.]+) ms over 8 windows .* above ([\d.]+) ms")
    assert typical == pytest.approx(100, rel=1e-3) and limit == pytest.approx(200, rel=1e-3)
    assert tpot_line.startswith("TPOT: median window p99 20.0")
    p99, ratio = numbers(spike, r"TTFT p99 ([\d.]+) ms at 5.0-6.0 s \(5 requests; ([\d.]+)x")
    assert p99 == pytest.approx(400, rel=1e-3) and ratio == 4.0
    # No requests.jsonl: causes are looked for in the window and the interval before it.
    assert ("looked at 4.0-6.0 s (the window and the interval before it): queue growth: "
            "waiting 0 -> 3 by 6.0 s") in spike


def test_a_spike_with_nothing_lined_up_says_so(tmp_path):
    run = build_run(tmp_path, server=[interval() for _ in range(9)], ttft=ttft_with(400.0),
                    tpot=STEADY_TPOT)
    spikes = finding(diagnose(run), "latency_spikes")
    assert spikes.fired and spikes.verdict.endswith("lined up with nothing; no cause found for 1.")
    assert spikes.evidence[-1].endswith(
        "no cause found among hot expert, cache-miss burst, queue growth, generator lateness")


def test_hot_expert_cache_misses_and_generator_lateness_line_up(tmp_path):
    server = [interval(misses=10) for _ in range(9)]
    server[4] = interval(routed=(40, 0, 0, 0), misses=100)  # 5..6 s: max/mean 4.00, 100 misses
    send_lag = [[1] * 5 for _ in range(8)]
    send_lag[5] = [150] * 5
    run = build_run(tmp_path, server=server, ttft=ttft_with(400.0), tpot=STEADY_TPOT,
                    send_lag=send_lag, expert_cache=2)
    spikes = finding(diagnose(run), "latency_spikes")
    assert spikes.verdict == ("Latency spiked in 1 window(s) (TTFT 1); lined up with "
                              "hot expert (1), cache-miss burst (1), generator lateness (1).")
    spike = spikes.evidence[-1]
    # Imbalance is 1.00 in every other entry: median 1.00; misses median 10.
    assert "hot expert: max/mean 4.00 at 5.0-6.0 s (4.0x the run's median 1.00)" in spike
    assert "cache-miss burst: 100 misses at 5.0-6.0 s (median 10 per interval)" in spike
    # The bar is a quarter of the 300 ms jump (75 ms), above the 5 ms late threshold.
    lag, bar = numbers(spike, r"generator lateness: send lag p99 ([\d.]+) ms at 4.0-6.0 s "
                              r"\(over ([\d.]+) ms\)")
    assert lag == pytest.approx(150, rel=1e-3) and bar == pytest.approx(75, rel=1e-2)


def test_a_near_idle_interval_is_no_hot_expert(tmp_path):
    # The spike's interval (5..6 s) routed 4 pairs, all to expert 0 (max/mean 4.00): too few to
    # count.
    server = [interval() for _ in range(9)]
    server[4] = interval(routed=(4, 0, 0, 0))
    run = build_run(tmp_path, server=server, ttft=ttft_with(400.0), tpot=STEADY_TPOT)
    assert "no cause found" in finding(diagnose(run), "latency_spikes").evidence[-1]


def test_a_small_generator_lag_does_not_explain_a_large_spike(tmp_path):
    send_lag = [[1] * 5 for _ in range(8)]
    send_lag[5] = [20] * 5  # late (> 5 ms) but under a quarter of the 300 ms jump
    run = build_run(tmp_path, server=[interval() for _ in range(9)], ttft=ttft_with(400.0),
                    tpot=STEADY_TPOT, send_lag=send_lag)
    assert "no cause found" in finding(diagnose(run), "latency_spikes").evidence[-1]


def test_slow_requests_lifetimes_find_queueing_before_the_spike(tmp_path):
    # Five requests scheduled at 1.5 s wait 2.5 s in the server queue, get their first token at
    # 4.5 s (TTFT 3000 ms) and finish at 5.5 s, inside interval 5..6 s. The queue stood at 4 at 3 s
    # only.
    server = [interval() for _ in range(9)]
    server[1] = interval(waiting=4)  # entry 1 covers 2..3 s
    slow = [request_row(i, 3000.0, 20.0, 4000.0, server_queue_us=2_500_000)
            | {"scheduled_ms": 1500.0, "sent_ms": 1501.0}
            for i in range(5)]
    run = build_run(tmp_path, server=server, ttft=ttft_with(3000.0), tpot=STEADY_TPOT, rows=slow)
    spike = finding(diagnose(run), "latency_spikes").evidence[-1]
    assert "looked at 1.5-4.5 s (the lifetimes of its 5 slow requests in requests.jsonl)" in spike
    assert ("queue growth: waiting 0 -> 4 by 3.0 s, with room in the batch and KV pool; the slow "
            "requests spent 83% of their TTFT in the server queue (median 2500 ms)") in spike
    # Without requests.jsonl only 4..6 s is looked at, where the queue was empty.
    (run.path / "requests.jsonl").unlink()
    assert "no cause found" in finding(diagnose(load_run(run.path)), "latency_spikes").evidence[-1]


@pytest.mark.parametrize("ttft, why", [
    (ttft_with(180.0), "1.8x the median: under 2x"),
    (ttft_with(40.0, base_ms=10.0),
     "4x the median but only 30 ms above it: under the 50 ms minimum jump"),
])
def test_no_spike(tmp_path, ttft, why):
    spikes = finding(diagnose(build_run(tmp_path, ttft=ttft, tpot=STEADY_TPOT)), "latency_spikes")
    assert spikes.judged and not spikes.fired, why


def test_too_few_requests_per_interval_cannot_be_judged(tmp_path):
    # One request a second for 8 s: one window of 5, then a tail of 3 joining it.
    one_each = [[100]] * 8
    spikes = finding(diagnose(build_run(tmp_path, ttft=one_each, tpot=one_each)), "latency_spikes")
    assert not spikes.judged
    assert spikes.verdict == ("Not enough requests per interval: "
                              "ttft.hlog gives 1 window(s) of >= 5 requests (need 3); "
                              "tpot.hlog gives 1 window(s) of >= 5 requests (need 3)")


def test_windows_merge_intervals_until_five_requests(tmp_path):
    counts = [0, 0, 2, 2, 1, 0, 3, 3, 1]
    write_hlog(tmp_path / "x.hlog", [[10.0] * n for n in counts])
    windows = merge_windows(read_hlog(tmp_path / "x.hlog"))
    # 2 + 2 + 1 = 5 closes the first window at 2..5 s (empty 0..2 s left out of its times);
    # 0 + 3 + 3 closes the second at 6..8 s; the last interval's 1 request joins it.
    assert ([(w.start_s, w.end_s, w.before_s, w.count) for w in windows]
            == [(2.0, 5.0, 1.0, 5), (6.0, 9.0, 5.0, 7)])


# --- rule 6: the load generator -------------------------------------------------------------------

def test_a_warning_with_small_lags_is_evidence_but_does_not_fire(tmp_path):
    warned = {**QUIET_GENERATOR, "warnings": ["the load generator used 93% of a core"]}
    generator = finding(diagnose(build_run(tmp_path, generator=warned)), "generator_limited")
    assert (not generator.fired
            and "it warned 1 time(s), but its lags are small" in generator.verdict)
    assert "warning: the load generator used 93% of a core" in generator.evidence


def test_a_closed_loop_fires_as_coordinated_omission(tmp_path):
    closed = {**QUIET_GENERATOR,
              "warnings": ["closed loop: each user waited for its previous response before "
                           "sending, so a slow or stalled server received fewer requests"]}
    run = build_run(tmp_path, generator=closed, config={"mode": "closed"},
                    summary_send_lag=[1.0] * 100)
    generator = finding(diagnose(run), "generator_limited")
    assert generator.fired
    assert generator.verdict.startswith("The closed loop (--mode closed) under-states latency "
                                        "under load")
    assert "coordinated omission" in generator.verdict and "use --mode fixed" in generator.verdict
    # its lags are small
    assert "kept its schedule" not in generator.verdict and "Also" not in generator.verdict
    assert generator.evidence[-2].startswith("warning: closed loop:")
    late = build_run(mkdir(tmp_path / "late"), generator=closed, config={"mode": "closed"},
                     summary_send_lag=[1.0] * 95 + [12.0] * 5)
    verdict = finding(diagnose(late), "generator_limited").verdict
    assert ("coordinated omission" in verdict
            and "Also, the load generator's own lateness" in verdict)


@pytest.mark.parametrize("lag, fires", [("delivery_lag", False), ("loop_lag", True)])
def test_only_the_generator_s_own_loop_lag_accuses_it(tmp_path, lag, fires):
    # p99 6 ms > 10% of write_run's TPOT p50 (30 ms) and > 5 ms: from the server's side of the
    # delivery lag it says nothing about the generator; from its own loop, it does
    run_dir = tmp_path / "run"
    build_run(tmp_path)
    histograms = json.loads((run_dir / "histograms.json").read_text())
    histograms[lag] = encoded([1.0] * 95 + [6.0] * 5)
    (run_dir / "histograms.json").write_text(json.dumps(histograms))
    generator = finding(diagnose(load_run(run_dir)), "generator_limited")
    assert generator.fired is fires
    if fires:
        assert ("its loop lag p99 (6.00 ms) is over 10% of the finest latency measured (30.0 ms "
                "p50) and over 5 ms") in generator.verdict


def test_late_sends_fire_without_warnings(tmp_path):
    # 100 sends: 95 at 1 ms and 5 at 12 ms: p99 12 ms > 5 ms.
    run = build_run(tmp_path, summary_send_lag=[1.0] * 95 + [12.0] * 5)
    generator = finding(diagnose(run), "generator_limited")
    assert generator.fired
    p99, = numbers(generator.verdict, r"send lag p99 ([\d.]+) ms > 5 ms")
    assert p99 == pytest.approx(12, rel=1e-3)


def test_a_send_late_by_little_beside_the_latencies_does_not_fire(tmp_path):
    # the demo's case: one send of 100 just over 5 ms late, beside TTFT 300 ms and TPOT 120 ms
    run_dir = tmp_path / "run"
    build_run(tmp_path, summary_send_lag=[1.0] * 99 + [5.2])
    histograms = json.loads((run_dir / "histograms.json").read_text())
    histograms |= {"ttft": encoded([300.0] * 100), "tpot": encoded([120.0] * 100),
                   "send_lag": encoded([1.0] * 99 + [5.2])}
    (run_dir / "histograms.json").write_text(json.dumps(histograms))
    generator = finding(diagnose(load_run(run_dir)), "generator_limited")
    assert not generator.fired and "kept its schedule" in generator.verdict


def test_punctual_generator_does_not_fire(tmp_path):
    generator = finding(diagnose(build_run(tmp_path, summary_send_lag=[1.0] * 100)),
                        "generator_limited")
    assert generator.judged and not generator.fired
    assert generator.verdict == "The load generator kept its schedule and raised no warnings."
    # write_run's TTFT is 1..1000 ms (p50 500) and TPOT 20..40 ms (p50 30): a 1 ms lag is 0.2% and
    # 3.3% of them.
    ttft_share, ttft_p50, tpot_share, tpot_p50 = numbers(
        generator.evidence[-1], r"^the lag p99 \(send lag, 1.00 ms\) is ([\d.]+)% of the TTFT p50 "
                                r"\(([\d.]+) ms\) and ([\d.]+)% of the TPOT p50 \(([\d.]+) ms\)$")
    assert (ttft_share, tpot_share) == (0.2, 3.3)
    assert ttft_p50 == pytest.approx(500, rel=1e-3) and tpot_p50 == pytest.approx(30, rel=1e-3)


# --- missing data, rendering, the command ---------------------------------------------------------

SCRAPED_RULES = {"server_saturated", "kv_pressure", "prefix_misses", "server_expert_imbalance",
                 "front_door"}  # judged from server_metrics.jsonl, which these runs lack

def test_missing_files_leave_rules_unjudged_naming_what_is_missing(tmp_path):
    findings = diagnose(build_run(tmp_path))  # summary.json and histograms.json only
    unjudged = {f.rule: f.verdict for f in findings if not f.judged}
    assert set(unjudged) == {"throughput_underutilised", "compute_saturated", "data_movement",
                             "latency_spikes", "faults", "communication",
                             "server_write_delay", "host_bound"} | SCRAPED_RULES
    assert "ran as one rank" in unjudged["communication"]
    assert "no server metrics were scraped" in unjudged["kv_pressure"]
    assert "server_stats.jsonl has no GetStats sample" in unjudged["faults"]
    assert "server_stats.jsonl is missing" in unjudged["compute_saturated"]
    assert "ttft.hlog is missing or empty" in unjudged["latency_spikes"]


def test_text_and_markdown_put_fired_rules_first(tmp_path):
    findings = diagnose(build_run(tmp_path, server=growing_queue(400.0),
                                  expert_end=[32, 28, 30, 30]))
    text = render_text(findings).splitlines()
    assert text[0] == "diagnosis: 2 of 16 rules fired"  # the run's 2 refused requests fire one
    assert text[1] == ("FIRED Server unreachable / errors: 2 requests failed "
                       "(RESOURCE_EXHAUSTED); the server stayed reachable")
    fired = text.index(next(line for line in text if line.startswith("FIRED Throughput")))
    assert text[fired + 1].startswith("  - wait queue 1.0-11.0 s")
    quiet = [line for line in text if line.startswith("not fired")]
    assert [line.split(":")[0] for line in quiet] == [
        "not fired  Injected faults (rehearsal)", "not fired  Compute-saturated (the knee)",
        "not fired  Expert load imbalance",
        "not fired  Data movement (expert weight copies) share of step time",
        "not fired  Load generator limited"]
    unjudged = [line for line in text if line.startswith("not judged")]
    assert unjudged[-7].startswith("not judged Latency spikes: Not enough requests per interval: "
                                   "ttft.hlog is missing")
    assert unjudged[-6].startswith("not judged Server write delay: ")

    markdown = render_markdown(findings)
    assert markdown.startswith("## Diagnosis\n\n2 of 16 rules fired")
    order = [markdown.index(s) for s in ("### Throughput limited while under-utilised",
                                         "### Did not fire", "### Could not be judged")]
    assert order == sorted(order)
    assert ("- **Expert load imbalance**: Every layer's max/mean expert load is at most 1.10"
            in markdown)


def test_command_writes_diagnosis_md_and_a_json_last_line(tmp_path, capsys):
    run = build_run(tmp_path, server=growing_queue(1000.0, kv_in_use=4, running=8))
    diagnosis.main(argparse.Namespace(run_dir=str(run.path)))
    lines = capsys.readouterr().out.splitlines()
    figures = json.loads(lines[-1])
    assert figures["fired"] == ["failures", "compute_saturated", "expert_imbalance"]
    # one rank; a server from before write delays; a CPU server (no GPU busy)
    assert set(figures["not_judged"]) == {"latency_spikes", "communication",
                                          "server_write_delay", "host_bound"} | SCRAPED_RULES
    assert lines[-2] == f"diagnosis: {run.path / 'diagnosis.md'}"
    assert (run.path / "diagnosis.md").read_text().startswith("## Diagnosis")


# --- failures ----------------------------------------------------------------------------------

def test_failures_say_when_the_server_could_not_be_reached_and_with_which_codes(tmp_path):
    rows = ([request_row(i, 50.0, 10.0, 400.0) for i in range(30)]  # 0.1 s apart
            + [request_row(i, None, None, None, status="UNAVAILABLE") for i in range(30, 45)]
            + [request_row(i, 50.0, 10.0, 400.0) for i in range(45, 60)]
            + [request_row(70, None, None, None, status="RESOURCE_EXHAUSTED")])
    run = build_run(tmp_path, rows=rows)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["requests"] |= {"sent": 61, "ok": 45, "failed": 16,
                            "failed_by_code": {"UNAVAILABLE": 15, "RESOURCE_EXHAUSTED": 1}}
    (run.path / "summary.json").write_text(json.dumps(summary))
    blind = {"error": "GetStats failed: UNAVAILABLE: connection refused"}
    write_samples(run.path / "server_stats.jsonl", [*getstats([interval()] * 3), blind, blind,
                                                    *getstats([interval()] * 2)])
    finding = diagnose(load_run(run.path))[0]
    assert finding.rule == "failures" and finding.fired
    assert finding.verdict.startswith("the server could not be reached (UNAVAILABLE or "
                                      "GetStats failing) at 3.0-6.0 s; 16 requests failed")
    assert "UNAVAILABLE: 15 requests scheduled 3.0-4.4 s" in finding.evidence
    assert "GetStats failed: 2 samples 5.0-6.0 s" in finding.evidence
    assert "RESOURCE_EXHAUSTED: 1 requests scheduled 7.0-7.0 s" in finding.evidence


def test_failures_stay_quiet_when_everything_succeeded(tmp_path):
    run = build_run(tmp_path)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["requests"] |= {"sent": 1000, "failed": 0, "failed_by_code": {}}
    (run.path / "summary.json").write_text(json.dumps(summary))
    finding = diagnose(load_run(run.path))[0]
    assert not finding.fired and finding.verdict.startswith("every one of 1000 requests")


# --- injected faults ---------------------------------------------------------------------------

def test_injected_faults_are_told_with_their_counts_and_window(tmp_path):
    run = build_run(tmp_path)
    snaps = getstats([interval()] * 6)
    on = {"fault_step_fail": "0.2", "fault_drop": "0.0", "fault_slow_ms": "100.0",
          "fault_window": "2:4"}
    for i, snap in enumerate(snaps):
        snap["settings"] = on
        snap["faults"] = {"steps_failed": 3 * max(0, min(i, 4) - 2), "active": 2 <= i < 4}
    write_samples(run.path / "server_stats.jsonl", snaps)
    finding = next(f for f in diagnose(load_run(run.path)) if f.rule == "faults")
    assert finding.fired
    assert finding.verdict.startswith("the server injected faults on purpose: 6 engine steps "
                                      "failed;")
    assert finding.evidence[:2] == ["settings: --fault-step-fail 0.2, --fault-window 2:4",
                                    "fault window open at 3.0-4.0 s of the run"]


def test_no_faults_is_said_plainly(tmp_path):
    run = build_run(tmp_path)
    write_samples(run.path / "server_stats.jsonl", getstats([interval()] * 2))
    finding = next(f for f in diagnose(load_run(run.path)) if f.rule == "faults")
    assert not finding.fired and finding.judged and "settings are off" in finding.verdict


def test_requests_the_client_cancelled_are_not_failures(tmp_path):
    rows = ([request_row(i, 50.0, 10.0, 400.0) for i in range(10)]
            + [request_row(i, None, None, None, status="CLIENT_CANCELLED") for i in range(10, 13)]
            + [request_row(13, None, None, None, status="INTERNAL")])
    run = build_run(tmp_path, rows=rows)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["requests"] |= {"sent": 14, "ok": 10, "failed": 1, "cancelled": 3,
                            "failed_by_code": {"INTERNAL": 1}}
    (run.path / "summary.json").write_text(json.dumps(summary))
    finding = diagnose(load_run(run.path))[0]
    assert finding.rule == "failures" and finding.fired
    assert not [line for line in finding.evidence if "CLIENT_CANCELLED" in line]
    assert "INTERNAL: 1 requests scheduled 1.3-1.3 s" in finding.evidence
