"""The load generator's numbers against a server whose delays are known
(loadgen/delay_server.py): percentiles within a stated tolerance of the truth, and a stall of
every stream in the middle of an open-loop run shows in TTFT p99, while closed-loop mode,
run against the same stall, sends almost nothing during it, hides it, and says so; stress
mode finds the knee of a known capacity; mixed mode's classes follow their weights."""

import json

import pytest

from tests.conftest import delay_server_process
from tests.test_end_to_end import locust

pytestmark = [pytest.mark.slow, pytest.mark.timing]

# Locust's gevent grpc adds delivery lag (docs/measured.md): a few ms at this light load.
TOLERANCE_MS = 8


def test_fixed_rate_percentiles_match_the_known_delays(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "20", "--itl-ms", "10") as (_, port):
        done = locust(port, run_dir, "-t", "5s", "--rate", "10", "--prompt-tokens", "4",
                      "--max-tokens", "6")
    assert done.returncode == 0, done.stdout
    m = json.loads((run_dir / "summary.json").read_text())["metrics"]
    assert 20 <= m["ttft_ms"]["p50"] <= 20 + TOLERANCE_MS
    assert 10 - 1 <= m["tpot_ms"]["p50"] <= 10 + TOLERANCE_MS / 2
    assert 70 <= m["e2e_ms"]["p50"] <= 70 + TOLERANCE_MS  # 20 + 5 x 10 ms
    # every message
    assert m["delivery_lag_ms"]["count"] == m["itl_ms"]["count"] + m["ttft_ms"]["count"]
    assert m["delivery_lag_ms"]["p50"] <= TOLERANCE_MS


def test_a_stall_of_every_stream_shows_in_ttft_p99(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "20", "--itl-ms", "10", "--stall-at-s", "1.5",
                              "--stall-s", "2") as (_, port):
        done = locust(port, run_dir, "-t", "5s", "--rate", "10", "--arrival", "constant",
                      "--prompt-tokens", "4", "--max-tokens", "3")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    stalled = [r for r in rows if r["ttft_ms"] > 500]
    # Sent on schedule throughout (open loop): ~20 requests fell due during the 2 s stall, and
    # each went out when due, not once the stall ended (a closed loop would send them 2 s late).
    assert len(stalled) >= 15
    assert max(r["sent_ms"] - r["scheduled_ms"] for r in stalled) < 50
    assert summary["metrics"]["ttft_ms"]["p99"] >= 1500
    assert summary["metrics"]["ttft_ms"]["max"] <= 2000 + 20 + 3 * TOLERANCE_MS


def test_closed_loop_hides_the_same_stall_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "20", "--itl-ms", "10", "--stall-at-s", "1.5",
                              "--stall-s", "2") as (_, port):
        done = locust(port, run_dir, "-t", "5s", "--mode", "closed", "-u", "2", "-r", "2",
                      "--prompt-tokens", "4", "--max-tokens", "3")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    # two users, ~40 ms a request
    assert summary["requests"]["sent"] == summary["requests"]["ok"] > 50
    # one stalled request per user, the rest never sent
    assert len([r for r in rows if r["ttft_ms"] > 500]) <= 2
    assert summary["metrics"]["ttft_ms"]["p95"] < 1500  # the stall is out of sight
    assert any("closed loop" in w for w in summary["generator"]["warnings"])


def test_stress_stops_by_itself_at_the_knee_of_a_known_capacity(tmp_path):
    # 3 streams at once, each 20 ms + 9 x 10 ms: about 25 requests/s at most (27 without overheads).
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "20", "--itl-ms", "10",
                              "--capacity", "3") as (_, port):
        done = locust(port, run_dir, "--mode", "stress", "--rate-start", "8", "--rate-step", "8",
                      "--step-s", "2", "--max-steps", "8", "--prompt-tokens", "4",
                      "--max-tokens", "10", "--arrival", "constant")
    assert done.returncode == 0, done.stdout
    stress = json.loads((run_dir / "summary.json").read_text())["stress"]
    assert stress["knee_rps"] in (16, 24)  # within one step of the capacity
    assert len(stress["steps"]) < 8 and stress["steps"][-1]["saturated"]  # it stopped by itself
    rows = (run_dir / "steps.csv").read_text().splitlines()
    assert (rows[0].startswith("step,offered_rps,sent_rps,achieved_rps")
            and len(rows) == len(stress["steps"]) + 1)
    assert "knee" in done.stdout


def test_mixed_mode_reports_each_class_and_follows_the_weights(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "5", "--itl-ms", "2") as (_, port):
        done = locust(port, run_dir, "-t", "5s", "--mode", "mixed", "--rate", "40", "--classes",
                      "chat:3:8:4,long:1:32:8", "--rate-profile", "bursts:2:1:2")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    classes = summary["classes"]
    assert set(classes) == {"chat", "long"}
    assert classes["chat"]["sent"] + classes["long"]["sent"] == summary["requests"]["sent"] > 100
    assert classes["chat"]["sent"] / summary["requests"]["sent"] == pytest.approx(0.75, abs=0.1)
    assert classes["long"]["ttft_ms"]["count"] == classes["long"]["ok"]
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert {r["class"] for r in rows} == {"chat", "long"}
    assert all(r["output_tokens"] == (4 if r["class"] == "chat" else 8) for r in rows)
    assert "class chat" in done.stdout


def test_aio_client_sends_and_times_the_same_schedule(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--ttft-ms", "20", "--itl-ms", "10") as (_, port):
        done = locust(port, run_dir, "-t", "5s", "--rate", "10", "--arrival", "constant",
                      "--prompt-tokens", "4", "--max-tokens", "6", "--client", "aio")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    req, m = summary["requests"], summary["metrics"]
    # 10/s from the moment the aio process was ready, sent by it
    assert req["sent"] == req["ok"] and abs(req["sent"] - 10 * summary["duration_s"]) <= 3
    assert summary["duration_s"] >= 3.5
    assert 20 <= m["ttft_ms"]["p50"] <= 20 + TOLERANCE_MS
    assert m["delivery_lag_ms"]["count"] == req["sent"] * 6
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len({r["request_id"] for r in rows}) == len(rows)
