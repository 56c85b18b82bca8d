"""End to end, as a user runs it: the server and Locust as subprocesses (locust is never
imported here), a short headless open-loop run, summary.json checked against the server's
own counts, interval logs read back by HdrHistogram's reader, the report produced; the web
UI driven over HTTP; a master with two workers merging exactly; and a graceful SIGTERM while
streams are open."""

import csv
import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import grpc
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader

from analysis.readers.intervals import load_intervals
from analysis.readers.rundir import load_run, read_samples
from analysis.readers.samples import server_series
from analysis.readers.server_metrics import figures, server_side
from proto import moe_pb2, moe_pb2_grpc
from tests.conftest import REPO, server_process, stop_process

pytestmark = pytest.mark.slow

SUMMARY_KEYS = {"schema", "run_dir", "started_at", "duration_s", "window_s", "config", "metrics",
                "server_time_ms", "throughput", "slo", "requests", "generator", "classes", "server",
                "workload"}
CLIENT_METRICS = ("ttft", "ttft_service", "tpot", "itl", "itl_token", "e2e", "e2e_service",
                  "send_lag", "delivery_lag", "loop_lag")


def locust(port: int | str, run_dir, *flags: str,
           timeout_s: float = 120) -> subprocess.CompletedProcess:
    """A headless run against 127.0.0.1:port (or port as the whole --host)."""
    host = port if isinstance(port, str) else f"127.0.0.1:{port}"
    cmd = [str(REPO / ".venv/bin/locust") if (REPO / ".venv/bin/locust").exists() else "locust",
           "-f", "loadgen/moe.py", "--host", host, "--headless", "--only-summary",
           "--run-dir", str(run_dir), *flags]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc, timeout_s=5)
        out, _ = proc.communicate()
        pytest.fail(f"locust did not stop by itself:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def _next_in_rank(run_dir, median: float, p50: float) -> bool:
    """Whether two medians of a few dozen requests differ by no more than the middle ranks' values
    do (Locust's median is a rounded value at the middle rank, HDR's the value's bucket): the
    measured requests' E2E, from requests.jsonl, around the middle, within 1 ms."""
    e2e = sorted(r["e2e_ms"] for r in map(json.loads, open(run_dir / "requests.jsonl"))
                 if not r["warmup"])
    middle = e2e[max(len(e2e) // 2 - 2, 0):len(e2e) // 2 + 2]
    return all(middle[0] - 1 <= m <= middle[-1] + 1 for m in (median, p50))


def test_fixed_rate_run_writes_a_complete_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    with server_process(tmp_path) as (_, port):
        done = locust(port, run_dir, "-t", "6s", "--mode", "fixed", "--rate", "5",
                      "--arrival", "constant", "--prompt-tokens", "16", "--max-tokens", "8",
                      "--warmup-s", "1", "--slo-ttft-ms", "5000", "--csv", str(tmp_path / "lc"),
                      "--html", str(tmp_path / "report.html"))
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS  # the schema the README documents
    # Locust's own table counts the measured requests, the warm-up's in an entry of their own,
    # its median our E2E p50 within Locust's rounding (to 2 significant digits past 100 ms)
    entries = {row["Name"]: row for row in csv.DictReader(open(tmp_path / "lc_stats.csv"))}
    req = summary["requests"]
    assert int(entries["generate"]["Request Count"]) == req["sent"] - req["warmup"]
    assert int(entries["generate (warm-up)"]["Request Count"]) == req["warmup"] > 0
    # its size column holds bytes, as it says: 8 messages of a token id and the server's times
    assert 8 * 4 <= float(entries["generate"]["Average Content Size"]) <= 8 * 64
    e2e_p50 = summary["metrics"]["e2e_ms"]["p50"]
    median = float(entries["generate"]["Median Response Time"])
    assert abs(median - e2e_p50) <= max(1.0, 0.05 * e2e_p50) or _next_in_rank(
        run_dir, median, e2e_p50)
    # Locust's --csv gains the HDR figures its own files lack
    latency = (tmp_path / "lc_latency.csv").read_text().splitlines()
    ttft = next(line for line in latency if line.startswith('"TTFT"')).split(",")
    assert int(ttft[1]) == summary["metrics"]["ttft_ms"]["count"]
    # ... and its --html report opens with them, and their chart over time
    html = (tmp_path / "report.html").read_text()
    section = html[html.index("<section id='moe-loadlab'"):html.index('<div id="root">')]
    count = summary["metrics"]["ttft_ms"]["count"]
    assert re.search(rf"<td[^>]*>TTFT</td><td[^>]*>{count}</td>", section)
    assert str(run_dir) in section and section.count("<polyline") >= 6  # p50, p99 x 3 metrics
    assert set(summary["metrics"]) == {f"{m}_ms" for m in CLIENT_METRICS}
    assert set(summary["requests"]) == {"sent", "ok", "failed", "not_sent", "failed_by_code",
                                        "warmup", "rows_omitted"}
    assert set(summary["throughput"]) == {"window_s", "output_tokens_per_s", "requests_per_s",
                                          "goodput_requests_per_s"}
    assert set(summary["generator"]) == {"late_sends", "late_threshold_ms", "cpu_percent",
                                         "warnings", "client", "cpu_wait_percent"}
    assert 0 <= summary["generator"]["cpu_wait_percent"] < 100  # the kernel's run-queue time
    assert summary["generator"]["client"] == "aio"  # the default's sender in an open-loop run
    assert set(summary["config"]) >= {"mode", "rate", "arrival", "prompt_tokens", "max_tokens",
                                      "warmup_s", "seed"}
    req = summary["requests"]
    assert req["sent"] == req["ok"] + req["failed"] and req["failed"] == 0
    assert req["not_sent"] <= 1  # one due just as the run stopped may miss its send, and is counted
    # -t is kept whatever the start-up cost: Locust's timer is armed from a fresh clock
    assert summary["duration_s"] >= 5.8  # (loadgen/moe.py; it stopped 0.9 s early on a busy host)
    assert 29 <= req["sent"] <= 31  # 5/s for 6 s, constant arrivals
    assert req["warmup"] == 5
    measured = req["sent"] - req["warmup"]
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        s = summary["metrics"][name]
        assert s["count"] == measured
        assert 0 < s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
    assert summary["metrics"]["itl_ms"]["count"] >= measured * 7 // 2  # tokens may share a message
    assert summary["metrics"]["ttft_ms"]["p50"] >= summary["metrics"]["ttft_service_ms"]["p50"]
    assert summary["throughput"]["output_tokens_per_s"] > 0
    assert summary["slo"] == {"objectives_ms": {"ttft": 5000.0}, "requests": measured,
                              "met_share": {"ttft": 1.0, "all": 1.0}}
    assert "SLO: TTFT <= 5000 ms met by 100.0%" in done.stdout
    start, end = summary["server"]["start"], summary["server"]["end"]
    assert end["requests_finished"] - start["requests_finished"] == req["ok"]
    assert end["tokens_generated"] - start["tokens_generated"] == req["ok"] * 8
    rows = (run_dir / "requests.jsonl").read_text().splitlines()
    assert len(rows) == req["sent"] and all(json.loads(r)["output_tokens"] == 8 for r in rows)
    histograms = json.loads((run_dir / "histograms.json").read_text())
    assert set(histograms) >= {"ttft", "tpot", "itl", "e2e"}
    # Locust's own statistics: one entry per request, named for its class
    assert "moe      generate" in done.stdout and "moe      TTFT" not in done.stdout

    # Interval logs: HdrHistogram's own reader gets back every value, interval by interval.
    for name in ("ttft", "tpot", "itl", "e2e", "send_lag"):
        reader = HistogramLogReader(str(run_dir / f"{name}.hlog"),
                                    HdrHistogram(1, 3_600_000_000, 3))
        total, intervals = 0, 0
        while (interval := reader.get_next_interval_histogram()) is not None:
            total += interval.get_total_count()
            intervals += 1
        assert total == HdrHistogram.decode(histograms[name]).get_total_count()
        assert 5 <= intervals <= 9  # 1 s intervals over a 6 s run, plus the last partial one
    samples = [json.loads(line)
               for line in (run_dir / "server_stats.jsonl").read_text().splitlines()]
    assert len(samples) >= 5 and all("steps" in s["stats"] and s["t_run_s"] > 0 for s in samples)

    report = subprocess.run([sys.executable, "-m", "analysis", "report", str(run_dir)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert (run_dir / "report.md").exists() and (run_dir / "latency_cdf.png").stat().st_size > 0


def test_full_queue_is_counted_by_status_code(tmp_path):
    run_dir = tmp_path / "run"
    with server_process(tmp_path, "--max-batch-size", "1", "--max-queue", "1") as (_, port):
        done = locust(port, run_dir, "-t", "3s", "--rate", "40", "--prompt-tokens", "8",
                      "--max-tokens", "40")
    summary = json.loads((run_dir / "summary.json").read_text())
    req = summary["requests"]
    assert done.returncode == 1  # Locust's exit code when requests failed
    assert req["sent"] >= 80  # ~120 due in 3 s: open loop keeps sending into a saturated server
    assert req["failed_by_code"].get("RESOURCE_EXHAUSTED", 0) > 0
    assert req["sent"] == req["ok"] + sum(req["failed_by_code"].values())
    assert (summary["server"]["end"]["requests_rejected"]
            == req["failed_by_code"]["RESOURCE_EXHAUSTED"])


def test_sigterm_finishes_open_streams_and_refuses_new_ones(tmp_path):
    with server_process(tmp_path, "--grace-s", "10") as (proc, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = moe_pb2_grpc.MoEInferenceStub(channel)
            stream = stub.Generate(moe_pb2.GenerateRequest(prompt="drain", max_tokens=200,
                                                           ignore_eos=True))
            first = next(stream)
            proc.send_signal(15)
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(moe_pb2.GenerateRequest(prompt="late", max_tokens=2), timeout=5))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            rest = list(stream)
        assert len(first.token_ids) + sum(len(m.token_ids) for m in rest) == 200
        assert rest[-1].finish_reason == moe_pb2.GenerateResponse.LENGTH
        assert proc.wait(timeout=20) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_web_ui_refuses_a_bad_rate_then_runs_with_rate_alone(tmp_path):
    web = free_port()
    with server_process(tmp_path) as (_, port):
        ui = subprocess.Popen([str(REPO / ".venv/bin/locust"), "-f", "loadgen/moe.py",
                               "--host", f"127.0.0.1:{port}", "--web-host", "127.0.0.1",
                               "--web-port", str(web)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{web}"
            assert wait_for(lambda: urllib.request.urlopen(base, timeout=1).status == 200)

            def post(path, **form):
                data = urllib.parse.urlencode(form).encode()
                return json.loads(urllib.request.urlopen(base + path, data=data, timeout=60).read())

            def state():
                body = urllib.request.urlopen(base + "/stats/requests", timeout=5).read()
                return json.loads(body)["state"]

            post("/swarm", user_count=1, spawn_rate=1, host=f"127.0.0.1:{port}", rate=0)
            assert wait_for(lambda: state() == "stopped")
            run_dir = tmp_path / "web"
            post("/swarm", user_count=1, spawn_rate=1, host=f"127.0.0.1:{port}", rate=8,
                 max_tokens=4, prompt_tokens=8, run_dir=str(run_dir))
            time.sleep(5)
            live = json.loads(urllib.request.urlopen(base + "/stats/requests", timeout=5).read())
            chart = urllib.request.urlopen(base + "/moe/timeline.svg", timeout=5).read().decode()
            post("/stop")
            assert wait_for(lambda: (run_dir / "summary.json").exists())
            page = urllib.request.urlopen(base, timeout=5).read().decode()
            script = urllib.request.urlopen(base + "/moe/web_ui.js", timeout=5).read().decode()
            report = urllib.request.urlopen(base + "/stats/report", timeout=5).read().decode()
            ended = json.loads(urllib.request.urlopen(base + "/stats/requests",
                                                      timeout=5).read())["extended_stats"]
            csv = urllib.request.urlopen(base + "/moe/latency.csv", timeout=5).read().decode()
        finally:
            stop_process(ui)
            out = ui.stdout.read()
    assert "--rate: must be above 0" in out and "Traceback" not in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["requests"]["ok"] == summary["requests"]["sent"] >= 8
    # Locust's own table: one entry per request, so its rate is the offered one
    assert [e["name"] for e in live["stats"] if e["name"] != "Aggregated"] == ["generate"]
    assert 5 <= live["total_rps"] <= 11, live["total_rps"]
    # the Latency (HDR) tab: the run's own histograms, live
    tab = {row["metric"]: row for row in live["extended_stats"][0]["data"]}
    assert live["extended_stats"][0]["key"] == "moe-latency"
    assert tab["TTFT"]["count"] >= 20 and 0 < tab["TTFT"]["p50"] <= tab["TTFT"]["p99"]
    assert tab["TPOT"]["count"] >= 20
    assert "Latency (HDR)" in page and "Last run" in page  # the tabs are declared to the page
    # the page loads the form's arrangement and our script before Locust's app
    spec = json.loads(re.search(r"window\.moeWebUi = (\{.*?\});</script>", page).group(1))
    assert spec["form"]["order"][:2] == ["mode", "rate"] and "window.moeWebUi" in script
    assert page.index("window.moeWebUi") > page.index("window.templateArgs")
    assert chart.startswith("<svg") and chart.count("<polyline") >= 2  # TTFT p50 and p99 so far
    # the UI's report download opens with the run's own figures
    assert "<section id='moe-loadlab'" in report and str(run_dir) in report
    assert csv.startswith('"Metric",') and '"TTFT",' in csv
    last = {row["item"]: row["value"] for row in ended[1]["data"]}
    assert last["run directory"] == str(run_dir)
    assert last["requests"].startswith(f"sent {summary['requests']['sent']} = ok ")
    assert last["report"] == f"python -m analysis report {run_dir}"


def wait_for(predicate, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def test_distributed_master_merges_two_workers_exactly(tmp_path):
    run_dir, master_port, metrics_port = tmp_path / "run", free_port(), free_port()
    locust_bin = str(REPO / ".venv/bin/locust")
    with server_process(tmp_path, "--metrics-port", str(metrics_port)) as (_, port):
        workers = [subprocess.Popen([locust_bin, "-f", "loadgen/moe.py", "--worker",
                                     "--master-host", "127.0.0.1",
                                     "--master-port", str(master_port)], cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for _ in range(2)]
        try:
            done = locust(port, run_dir, "--master", "--master-bind-host", "127.0.0.1",
                          "--master-bind-port", str(master_port), "--web-host", "127.0.0.1",
                          "--expect-workers", "2", "-u", "2", "-r", "2", "-t", "6s", "--rate", "8",
                          "--arrival", "constant", "--prompt-tokens", "8", "--max-tokens", "4",
                          "--server-metrics", f"http://127.0.0.1:{metrics_port}/metrics")
        finally:
            for w in workers:
                stop_process(w)
            logs = "".join(w.stdout.read() for w in workers)
    assert done.returncode == 0, done.stdout
    # each worker logs its share of the rate, not the total
    assert logs.count("open loop: 4 of 8 requests/s (constant)") == 2, logs
    summary = json.loads((run_dir / "summary.json").read_text())
    parts = json.loads((run_dir / "workers.json").read_text())
    assert sorted(p["worker"] for p in parts) == [0, 1]
    req = summary["requests"]
    assert req["sent"] == sum(sum(p["statuses"].values()) for p in parts) == req["ok"]
    assert req["sent"] <= 52  # the total rate, 8/s for at most 6 s, split over the workers
    # each worker's share, 4/s constant, over its own schedule: -t is the master's, and a
    # worker's schedule starts once its sender is ready (docs/design.md, "The default client")
    for w in summary["workers"]:
        assert w["window_s"] > 3 and abs(w["sent"] - 4 * w["window_s"]) <= 2
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert len({r["request_id"] for r in rows}) == len(rows) == req["sent"]
    merged = json.loads((run_dir / "histograms.json").read_text())
    for name in ("ttft", "tpot", "itl", "e2e"):
        everything = HdrHistogram(1, 3_600_000_000, 3)
        for p in parts:
            everything.add(HdrHistogram.decode(p["client"][name][0]))
        m = HdrHistogram.decode(merged[name])
        assert m.get_total_count() == everything.get_total_count() > 0
        for q in (50, 90, 99, 99.9, 100):
            assert m.get_value_at_percentile(q) == everything.get_value_at_percentile(q)
    for name in ("ttft", "e2e"):  # and as one histogram fed every request's value directly
        one = HdrHistogram(1, 3_600_000_000, 3)
        for r in rows:
            one.record_value(round(r[f"{name}_ms"] * 1000))
        m = HdrHistogram.decode(merged[name])
        assert [m.get_value_at_percentile(q) for q in (50, 99, 100)] == \
            [one.get_value_at_percentile(q) for q in (50, 99, 100)]
    # The analysis reads the workers' interval logs and GetStats samples from worker-<i>/.
    intervals = load_intervals(run_dir, "ttft")
    assert (sum(i.hist.get_total_count() for i in intervals)
            == HdrHistogram.decode(merged["ttft"]).get_total_count())
    assert server_series(read_samples(run_dir)) is not None
    # The master scraped the server's /metrics, once for all; the workers did not.
    assert not list(run_dir.glob("worker-*/server_metrics.jsonl"))
    [scraped] = server_side(load_run(run_dir)).engines
    assert figures(scraped)["requests_finished"].total == req["sent"]


def test_the_web_ui_listens_on_this_machine_only_by_default():
    ui = subprocess.Popen([str(REPO / ".venv/bin/locust"), "-f", "loadgen/moe.py", "--host",
                           "127.0.0.1:1", "--web-port", str(free_port())], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = next(line for line in ui.stdout if "Starting web interface" in line)
    finally:
        stop_process(ui)
    assert "at http://127.0.0.1:" in line
