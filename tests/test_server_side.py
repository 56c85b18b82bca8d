"""Both sides of a run against any target, end to end: Locust against the openai reference
server scrapes its vLLM-named /metrics with no flag and the report's server figures are the
ones the server's behaviour fixes; our own server's /metrics gives what its GetStats gives in
the same run; endpoints that fail in every way leave the run untouched and are each named."""

import json

import pytest

from analysis.readers.rundir import load_run
from analysis.readers.server_metrics import figures, server_side
from analysis.readers.server_stats import server_view
from records.prefix_blocks import BLOCK
from tests.cli import analysis
from tests.conftest import delay_server_process, server_process
from tests.metrics_endpoints import metrics_endpoints, refused_port
from tests.test_end_to_end import free_port, locust

pytestmark = pytest.mark.slow

WORDS = 40  # the one conversation's prompt, words (the reference server's tokens)
PREEMPT_EVERY = 3


def dataset(path) -> str:
    prompt = " ".join(f"w{i}" for i in range(WORDS))
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": prompt},
                                                   {"from": "gpt", "value": "reply " * 10}]}]))
    return str(path)


def test_an_openai_run_with_no_flag_reports_the_reference_servers_known_figures(tmp_path):
    run_dir = tmp_path / "run"
    # one stream at a time, 25 ms each, offered every 17 ms: the queue grows all run
    with delay_server_process(tmp_path, "--protocol", "openai", "--capacity", "1",
                              "--ttft-ms", "10", "--itl-ms", "5", "--kv-tokens", "100",
                              "--preempt-every", str(PREEMPT_EVERY)) as (_, port):
        done = locust(f"http://127.0.0.1:{port}", run_dir, "--target", "openai", "-t", "3s",
                      "--rate", "60", "--arrival", "constant", "--max-tokens", "4",
                      "--server-metrics-interval-s", "0.5",
                      "--dataset", dataset(tmp_path / "one.json"))
    assert done.returncode == 0, done.stdout
    assert "server metrics: scraping" in done.stdout and "(the target's own)" in done.stdout
    run = load_run(run_dir)
    sent = run.summary.requests.sent
    assert run.summary.requests.ok == sent > 60
    [series] = server_side(run).engines
    assert series.engine.startswith("vLLM") and not series.failures
    f = figures(series)
    assert f["prompt_tokens"].total == sent * WORDS
    assert f["requests_finished"].total == f["e2e"].window.count == sent
    assert f["preemptions"].total == sent // PREEMPT_EVERY
    hits = (sent - 1) * BLOCK * (WORDS // BLOCK)  # every prompt after the first hits 2 blocks
    assert (f["prefix_hits"].total, f["prefix_queries"].total) == (hits, sent * WORDS)
    assert run.summary.workload.prefix_share == hits / (sent * WORDS)  # the client's own count
    assert f["waiting"].max >= 10 and f["running"].max == 1  # the queue grew behind one slot
    assert 0 < f["kv_usage"].max <= (WORDS + 4) / 100  # one stream's prompt and output of 100
    assert f["ttft"].window.count == sent and f["ttft"].window.mean >= 0.010

    report = analysis("report", run_dir)
    assert report.returncode == 0, report.stderr
    md = (run_dir / "report.md").read_text()
    rate = f"{100 * hits / (sent * WORDS):.1f}%"
    assert f"| prefix-cache hit rate (hits / queries, tokens) | {rate}" in md
    assert f"| preemptions | {sent // PREEMPT_EVERY} requests" in md
    assert "| time to first token | " + str(sent) in md  # the server-vs-client TTFT line
    assert "Not exposed by this server: " in md and "expert balancedness" in md
    assert "Queue and KV usage over time" in md
    diagnosis = json.loads(analysis("diagnose", run_dir).stdout.splitlines()[-1])
    assert "server_saturated" in diagnosis["fired"]
    # the server hit all the prompts shared; its TTFT is the client's but for the wire, which
    # is judged only where the load generator kept time (a starved machine's is not)
    assert {"kv_pressure", "prefix_misses"} <= set(diagnosis["not_fired"])
    assert "front_door" not in diagnosis["fired"]
    assert ("front_door" in diagnosis["not_fired"]) != ("generator_limited" in diagnosis["fired"])


def test_an_sglang_grpc_run_reads_the_side_port_and_a_shared_prefix_reaches_it(tmp_path):
    run_dir, metrics_file = tmp_path / "run", tmp_path / "metrics.port"
    with delay_server_process(tmp_path, "--protocol", "sglang-grpc", "--seed", "7",
                              "--metrics-port-file", str(metrics_file)) as (_, port):
        url = f"http://127.0.0.1:{metrics_file.read_text().strip()}/metrics"
        done = locust(port, run_dir, "--target", "sglang-grpc", "-t", "2s", "--rate", "12",
                      "--prompt-tokens", "8", "--max-tokens", "6", "--server-metrics", url,
                      "--shared-prefix-tokens", "64")
    assert done.returncode == 0, done.stdout
    run = load_run(run_dir)
    [series] = server_side(run).engines
    assert series.engine.startswith("SGLang")
    f = figures(series)
    ok = run.summary.requests.ok
    assert f["requests_finished"].total == ok > 10
    # the shared prefix reached the server: every request after the first hit its 4 blocks
    assert f["prompt_tokens"].total == ok * (64 + 8)
    assert f["prefix_hits"].total == (ok - 1) * 64  # sglang:cached_tokens
    assert run.summary.workload.prefix_share == pytest.approx((ok - 1) * 64 / (ok * 72))
    # the seeded Zipf-like load over 4 ranks: well below even, never above it
    assert 0.3 < f["expert_balance"].mean < 0.9
    analysis("report", run_dir)
    md = (run_dir / "report.md").read_text()
    assert "| expert balancedness (mean / max load; 1 is even) | " in md
    assert "| run s | waiting | running | KV usage | expert balance |" in md
    diagnosis = json.loads(analysis("diagnose", run_dir).stdout.splitlines()[-1])
    assert "server_expert_imbalance" in diagnosis["fired"]


def test_our_servers_metrics_give_what_its_getstats_gives_in_the_same_run(tmp_path):
    run_dir, metrics_port = tmp_path / "run", free_port()
    with server_process(tmp_path, "--metrics-port", str(metrics_port)) as (_, port):
        done = locust(port, run_dir, "-t", "2s", "--rate", "4", "--arrival", "constant",
                      "--prompt-tokens", "8", "--max-tokens", "4", "--server-metrics",
                      f"http://127.0.0.1:{metrics_port}/metrics")
    assert done.returncode == 0, done.stdout
    run = load_run(run_dir)
    [series] = server_side(run).engines
    assert series.engine.startswith("this project's server")
    scraped, getstats = figures(series), server_view(run.summary.server)
    assert scraped["generation_tokens"].total == getstats.tokens_generated > 0
    assert scraped["requests_finished"].total == getstats.requests_finished
    assert scraped["prompt_tokens"].total == run.summary.requests.ok * 8
    tokens = getstats.expert_tokens  # the same balance, from GetStats's expert counts
    balance = float(((tokens.sum(axis=1) / tokens.shape[1]) / tokens.max(axis=1)).mean())
    assert scraped["expert_balance"].mean == pytest.approx(balance)
    assert scraped["kv_usage"].max <= 1


def test_failing_endpoints_leave_the_run_untouched_and_are_each_named(tmp_path):
    run_dir = tmp_path / "run"
    with metrics_endpoints() as bad, \
            delay_server_process(tmp_path, "--protocol", "openai", "--ttft-ms", "20",
                                 "--itl-ms", "10") as (_, port):
        urls = [f"http://127.0.0.1:{port}/metrics", *(f"{bad}/{path}" for path in (
            "500", "nothing", "html", "garbage", "huge", "huge-stream", "slow", "flaky")),
            f"http://127.0.0.1:{refused_port()}/metrics"]
        done = locust(f"http://127.0.0.1:{port}", run_dir, "--target", "openai", "-t", "3s",
                      "--rate", "10", "--arrival", "constant", "--prompt-tokens", "8",
                      "--max-tokens", "4", "--server-metrics", ",".join(urls))
    assert done.returncode == 0, done.stdout
    run = load_run(run_dir)
    # (the sends wait for every endpoint's first scrape, the slow one's 1 s timeout included)
    assert run.summary.requests.ok == run.summary.requests.sent >= 12
    # Nothing waited on a scrape: one that blocked the sends would add its 1 s timeout or its
    # 8 MiB read to some request; what is left is this 2-core machine's contention.
    ttft = run.histograms["ttft"]
    assert ttft.get_value_at_percentile(50) / 1e3 < 20 + 8
    assert ttft.get_max_value() / 1e3 < 100
    side = server_side(run)
    by_url = {s.source: s for s in side.engines}
    assert not by_url[urls[0]].failures and by_url[urls[0]].t_s
    reasons = {url: set(s.failures) for url, s in by_url.items()}
    assert reasons[f"{bad}/500"] == {"HTTP 500"} and reasons[f"{bad}/nothing"] == {"HTTP 404"}
    assert reasons[f"{bad}/html"] == {"not Prometheus text (text/html)"}
    assert reasons[f"{bad}/huge-stream"] == {"body over the 8 MiB cap, not parsed"}
    assert reasons[f"{bad}/slow"] == {"timed out after 1 s"}
    assert reasons[f"{bad}/flaky"] == {"HTTP 503"} and by_url[f"{bad}/flaky"].t_s
    assert reasons[urls[-1]] == {"connection refused"}
    analysis("report", run_dir)
    md = (run_dir / "report.md").read_text()
    assert f"### Scraped from {bad}/500" in md and "failed (HTTP 500: " in md


def test_a_metrics_url_that_is_not_http_stops_the_run_before_it_starts(tmp_path):
    done = locust("127.0.0.1:9", tmp_path / "run", "-t", "2s",
                  "--server-metrics", "ftp://127.0.0.1/metrics", timeout_s=60)
    assert done.returncode != 0
    assert "--server-metrics: must be off or http(s)://" in done.stdout
    assert not (tmp_path / "run").exists()
