"""Scraping a server's /metrics: each engine's table read on an exposition written from that
engine's own metric names (tests/fixtures/expositions/), the parser and the scraper on every
bad reply, counters that go back (a restart), and the reference servers' own /metrics read
through the same tables."""

import json

import numpy as np
import pytest

from analysis.readers.server_metrics import (
    bucket_growth,
    figures,
    grown,
    quantile,
    source_series,
)
from loadgen.reference.exposition import exposition
from loadgen.reference.tally import Tally
from loadgen.scraping.endpoints import endpoints
from loadgen.scraping.exposition import ExpositionError, parse
from loadgen.scraping.http_source import scrape_url
from records.declare import SettingsError, build
from records.engine_maps import ENGINE_MAPS
from records.load_settings import LoadSettings
from records.metric_maps import Buckets, engines_of, read
from records.prefix_blocks import BLOCK
from records.server_metrics import Family, Sample, Scrape
from tests.metrics_endpoints import EXPOSITIONS, SLOW_S, metrics_endpoints, refused_port


def scrape_of(body: bytes, t_s: float = 0.0, source: str = "http://x/metrics") -> Scrape:
    families, cut = parse(body)
    return Scrape(t_unix_s=t_s, t_run_s=t_s, source=source, ok=True, families=families, cut=cut)


def readings(name: str) -> tuple[list[str], dict]:
    scrape = scrape_of((EXPOSITIONS / name).read_bytes())
    engines = engines_of(scrape, ENGINE_MAPS)
    values = {}
    for concept, (_, r) in read(scrape, engines).items():
        values[concept] = (r.value if r.value is not None
                           else (r.buckets.count, round(r.buckets.sum, 4)))
    return [e.engine for e in engines], values


# --- each engine's table --------------------------------------------------------------------

def test_vllm_v1_names_map_to_every_concept_vllm_exposes():
    engines, v = readings("vllm.prom")
    assert engines == ["vllm"]
    assert (v["waiting"], v["running"], v["kv_usage"], v["preemptions"]) == (3, 12, 0.4375, 2)
    assert (v["prefix_queries"], v["prefix_hits"]) == (918432, 402816)
    assert (v["prompt_tokens"], v["generation_tokens"]) == (515616, 131072)
    assert v["requests_finished"] == 512  # every finished_reason summed
    assert v["ttft"][0] == 512 and v["itl"][0] == 2048  # histograms: the count and the sum
    assert (v["spec_draft_tokens"], v["spec_accepted_tokens"]) == (122880, 81920)
    assert v["rss_bytes"] == 1853976576
    assert "expert_balance" not in v  # vLLM logs its EPLB balancedness, it exports none


def test_vllm_v0_names_are_read_where_v1_renamed_them():
    _, v = readings("vllm_v0.prom")
    assert v["kv_usage"] == 0.25  # vllm:gpu_cache_usage_perc
    assert v["itl"] == (40, 0.6)  # vllm:time_per_output_token_seconds
    assert v["prefix_hit_rate"] == 0.5


def test_sglang_names_and_its_balancedness_summary():
    engines, v = readings("sglang.prom")
    assert engines == ["sglang"]
    assert (v["waiting"], v["running"], v["running_tokens"], v["kv_usage"]) == (12, 64, 183472,
                                                                                0.61)
    assert v["preemptions"] == 3  # sglang:num_retracted_requests
    assert (v["prefix_queries"], v["prefix_hits"]) == (140235, 59001)  # prompt, cached tokens
    assert v["expert_balance"] == (4, 3.07)  # a Summary: its count and sum, forward modes summed
    assert v["spec_accept_length"] == 2.71


def test_triton_with_tensorrt_llm_names_and_its_gpus():
    engines, v = readings("triton_trtllm.prom")
    assert engines == ["triton"]
    assert (v["waiting"], v["running"], v["kv_usage"]) == (7, 24, 0.706299)
    assert v["requests_finished"] == 1840  # the ensemble's, not again the model's it calls
    assert v["ttft"] == (1840, 388.419)  # nv_inference_first_response_histogram_ms, in seconds
    assert v["gpu_utilization"] == 0.92 and v["gpu_energy_j"] == pytest.approx(3624996.122)


def test_tgi_names_with_token_totals_from_its_size_histograms():
    engines, v = readings("tgi.prom")
    assert engines == ["tgi"]
    assert (v["waiting"], v["running"], v["generation_tokens"]) == (4, 28, 419261)
    assert "ttft" not in v and "kv_usage" not in v  # TGI exposes neither


def test_a_concept_the_server_lacks_is_named_not_exposed():
    scrape = scrape_of((EXPOSITIONS / "tgi.prom").read_bytes())
    [series] = source_series([scrape])
    assert {"ttft", "kv_usage", "prefix_hits", "expert_balance"} <= set(series.missing())
    assert "waiting" not in series.missing()


def test_our_own_server_table_reads_the_kv_pool_as_a_share_and_the_expert_balance():
    def moe_scrape(t_s: float, experts: list[float]) -> Scrape:
        body = ("# TYPE moe_kv_slots_in_use gauge\nmoe_kv_slots_in_use 3\n"
                "# TYPE moe_kv_slots gauge\nmoe_kv_slots 12\n"
                "# TYPE moe_expert_tokens_total counter\n"
                + "".join(f'moe_expert_tokens_total{{layer="0",expert="{e}"}} {n}\n'
                          for e, n in enumerate(experts)))
        return scrape_of(body.encode(), t_s)

    [series] = source_series([moe_scrape(0, [5, 5, 5, 5]), moe_scrape(1, [15, 10, 10, 5])])
    figs = figures(series)
    assert figs["kv_usage"].mean == 0.25
    assert figs["expert_balance"].mean == pytest.approx(5 / 10)  # grew 10, 5, 5, 0: mean over max


# --- the parser -----------------------------------------------------------------------------

@pytest.mark.parametrize("body, kind, says", [
    (b"<!doctype html><html>login</html>", "text/plain", "HTML"),
    (b"{}", "application/json", "application/json"),
    (b"this is { not prometheus\n", "text/plain", "not Prometheus text"),
    (b"\xff\xfe\x00garbage", "text/plain", "not UTF-8"),
    (b"# only a comment\n", "text/plain", "no metric family"),
])
def test_what_is_not_an_exposition_is_refused_saying_why(body, kind, says):
    with pytest.raises(ExpositionError, match=says):
        parse(body, kind)


def test_openmetrics_is_parsed_by_its_own_parser():
    body = b"# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 4.0\n# EOF\n"
    families, _ = parse(body, "application/openmetrics-text; version=1.0.0")
    assert families[0].name == "vllm:num_preemptions"
    assert families[0].samples[0].value == 4.0


def test_the_caps_keep_the_first_families_and_say_what_they_cut():
    body = "".join(f"# TYPE f{i} gauge\nf{i} {i}\n" for i in range(10)).encode()
    families, cut = parse(body, max_families=4)
    assert [f.name for f in families] == ["f0", "f1", "f2", "f3"]
    assert cut == "6 of 10 families over the cap of 4"
    families, cut = parse(body, max_samples=3)
    assert sum(len(f.samples) for f in families) == 3 and "7 samples over the cap" in cut


def test_an_untyped_metric_is_one_family_of_all_its_lines():
    families, _ = parse(b'x_total{a="1"} 1\nx_total{a="2"} 2\n')
    assert [(f.name, len(f.samples)) for f in families] == [("x_total", 2)]


def test_nan_and_infinities_are_kept_as_unknown():
    families, _ = parse(b"# TYPE g gauge\ng NaN\n# TYPE h gauge\nh +Inf\n")
    assert [f.samples[0].value for f in families] == [None, None]


# --- the scraper against endpoints that go wrong ---------------------------------------------

def test_every_bad_endpoint_is_a_failed_scrape_with_its_reason():
    with metrics_endpoints() as base:
        def error(path: str, timeout_s: float = 2.0) -> str:
            scrape = scrape_url(base + path, timeout_s, 0.0)
            assert not scrape.ok and not scrape.families
            return scrape.error

        assert scrape_url(base + "/metrics", 2.0, 0.0).ok
        assert error("/nothing") == "HTTP 404"
        assert error("/500") == "HTTP 500"
        assert error("/html") == "not Prometheus text (text/html)"
        assert error("/garbage").startswith("not Prometheus text")
        assert error("/huge") == f"body of {50 << 20} bytes over the 8 MiB cap, not read"
        assert error("/huge-stream") == "body over the 8 MiB cap, not parsed"
        assert error("/slow", timeout_s=SLOW_S / 6) == f"timed out after {SLOW_S / 6:g} s"
    assert scrape_url(f"http://127.0.0.1:{refused_port()}/metrics", 1.0, 0.0).error == \
        "connection refused"


def test_a_prometheus_client_server_is_asked_for_text_so_colon_names_survive():
    # vLLM and SGLang serve prometheus_client's pages, which answer OpenMetrics to an Accept
    # naming it, with the colons of their names turned to underscores in the samples
    from prometheus_client import CollectorRegistry, Histogram, start_http_server

    registry = CollectorRegistry()
    Histogram("vllm:time_to_first_token_seconds", "TTFT", registry=registry).observe(0.1)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        scrape = scrape_url(f"http://127.0.0.1:{server.server_port}/metrics", 2.0, 0.0)
    finally:
        server.shutdown()
        thread.join(5)
    ttft = scrape.family("vllm:time_to_first_token_seconds")
    assert scrape.ok and ttft.type == "histogram"
    assert {s.name for s in ttft.samples} >= {"vllm:time_to_first_token_seconds_bucket"}


def test_a_port_that_does_not_speak_http_is_a_failed_scrape():
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def answer():  # an SSH server's greeting, then gone
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    scrape = scrape_url(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", 2.0, 0.0)
    listener.close()
    assert not scrape.ok and scrape.error.startswith("broken reply (BadStatusLine")


def test_the_default_scrapes_the_openai_target_own_metrics_only_when_it_answers():
    with metrics_endpoints() as base:
        assert endpoints("", "openai", base)[0] == [base + "/metrics"]
        assert endpoints("off", "openai", base)[0] is None
        assert endpoints("", "vllm-grpc", "127.0.0.1:1")[0] == []
        assert endpoints(f"{base}/a,{base}/b", "moe", "x:1")[0] == [f"{base}/a", f"{base}/b"]
    urls, note = endpoints("", "openai", f"http://127.0.0.1:{refused_port()}")
    assert urls == [] and "connection refused" in note and "client side only" in note


@pytest.mark.parametrize("value", ["ftp://host/metrics", "127.0.0.1:8000/metrics", "http://",
                                   "http://host:abc/metrics", "http://exa mple/metrics",
                                   "http://[::1/metrics"])
def test_a_metrics_url_that_is_not_http_is_refused_naming_the_flag(value):
    with pytest.raises(SettingsError, match="--server-metrics: must be off or http"):
        build(LoadSettings, {"server_metrics": value})


# --- counters that go back, histograms over a window -----------------------------------------

def test_a_counter_that_goes_back_is_a_restart_not_a_negative_rate():
    assert list(grown(np.array([10.0, 15.0, 3.0, 8.0]))) == [0, 5, 8, 13]
    assert list(grown(np.array([1.0, np.nan, 4.0]))[[0, 2]]) == [0, 3]


def test_a_histogram_that_restarts_counts_from_zero():
    b = (0.1, 1.0, float("inf"))
    before = Buckets(b, (5, 8, 10), 4.0, 10)
    after = Buckets(b, (9, 14, 16), 7.0, 16)  # grew by 4, 6, 6
    restarted = Buckets(b, (1, 2, 2), 0.5, 2)  # the server restarted: 1, 2, 2 since
    grew = bucket_growth([before, after, restarted])
    assert grew.counts == (5, 8, 8) and grew.count == 8 and grew.sum == pytest.approx(3.5)
    assert quantile(grew, 0.5) == (0.0, 0.1) and quantile(grew, 0.99) == (0.1, 1.0)


def test_counters_over_scrapes_with_a_restart_between():
    def scrape(t: float, value: float) -> Scrape:
        return Scrape(t_unix_s=t, t_run_s=t, source="u", ok=True, families=[Family(
            name="vllm:num_preemptions", type="counter",
            samples=[Sample(name="vllm:num_preemptions_total", value=value)])])

    failed = Scrape(t_unix_s=2, t_run_s=2, source="u", ok=False, error="HTTP 500")
    [series] = source_series([scrape(0, 4), scrape(1, 10), failed, scrape(3, 2), scrape(4, 5)])
    f = figures(series)["preemptions"]
    assert f.total == 6 + 2 + 3 and f.per_s == pytest.approx(11 / 4)
    assert series.failures == {"HTTP 500": 1} and series.scrapes == 5


def test_a_series_the_server_makes_on_first_use_grew_from_zero():
    # SGLang makes a labelled counter when it first counts: absent before the first request
    def scrape(t: float, families: list) -> Scrape:
        return Scrape(t_unix_s=t, t_run_s=t, source="u", ok=True,
                      families=[Family(name="sglang:num_running_reqs", type="gauge",
                                       samples=[Sample(name="sglang:num_running_reqs", value=0)]),
                                *families])

    finished = [Family(name="sglang:num_requests", type="counter",
                       samples=[Sample(name="sglang:num_requests_total", value=n)])
                for n in (64, 100)]
    [series] = source_series([scrape(0, []), scrape(1, finished[:1]), scrape(2, finished[1:])])
    assert figures(series)["requests_finished"].total == 100


def test_each_label_set_restarts_on_its_own_and_a_missing_one_holds_its_value():
    def energy(t: float, joules: dict) -> Scrape:
        return Scrape(t_unix_s=t, t_run_s=t, source="nvml", ok=True, families=[Family(
            name="nvml_gpu_energy_joules", type="counter",
            samples=[Sample(name="nvml_gpu_energy_joules_total", labels={"gpu": gpu}, value=j)
                     for gpu, j in joules.items()])])

    # two GPUs, +100 J/s each; GPU 1 unread at t=2 (an NVML error), GPU 0 restarts at t=3
    [series] = source_series([energy(0, {"0": 1e6, "1": 2e6}), energy(1, {"0": 1e6 + 100,
                                                                           "1": 2e6 + 100}),
                              energy(2, {"0": 1e6 + 200}), energy(3, {"0": 50, "1": 2e6 + 300})])
    assert figures(series)["gpu_energy_j"].total == pytest.approx(200 + 50 + 300)


def test_a_histogram_whose_bounds_change_leaves_out_what_cannot_be_added():
    a, b = (0.1, float("inf")), (0.1, 1.0, float("inf"))
    grew = bucket_growth([Buckets(a, (1, 2), 1.0, 2), Buckets(a, (3, 5), 2.0, 5),
                          Buckets(b, (3, 6, 7), 3.0, 7), Buckets(b, (4, 8, 10), 4.5, 10)])
    assert grew.bounds == b and grew.counts == (1, 2, 3) and grew.count == 3  # the last interval
    assert grew.sum == pytest.approx(1.5)


# --- the reference servers' /metrics, through the tables ---------------------------------------

@pytest.mark.parametrize("protocol, engine", [("openai", "vllm"), ("sglang-grpc", "sglang")])
def test_the_reference_exposition_reads_back_what_the_tally_counted(protocol, engine):
    tally = Tally(kv_tokens=100, preempt_every=2, seed=3)
    prompt = list(range(40))
    for _ in range(2):  # the second prompt hits the two full blocks the first left
        tally.arrived(prompt)
        stream = tally.admitted(len(prompt), 0.002)
        for index in range(4):
            tally.sent(stream, index, 1, 4, 0.02 if index == 0 else 0.01)
    scrape = scrape_of(exposition(protocol, tally)())
    engines = engines_of(scrape, ENGINE_MAPS)
    assert engines[0].engine == engine
    r = {k: v for k, (_, v) in read(scrape, engines).items()}
    assert r["running"].value == 2 and r["waiting"].value == 0
    assert r["kv_usage"].value == pytest.approx(88 / 100)  # 2 x (40 prompt + 4 generated)
    assert r["preemptions"].value == 1  # the second stream, at its middle token
    assert r["prefix_hits"].value == 2 * BLOCK and r["prefix_queries"].value == 80
    assert r["ttft"].buckets.count == 2 and r["ttft"].buckets.sum == pytest.approx(0.04)
    assert r["generation_tokens"].value == 8
    if engine == "sglang":
        assert 0 < r["expert_balance"].buckets.sum / r["expert_balance"].buckets.count <= 1


# --- the rules and the energy, on a run directory of known scrapes ---------------------------

def gauge(name: str, value: float) -> Family:
    return Family(name=name, type="gauge", samples=[Sample(name=name, value=value)])


def counter(name: str, value: float, **labels) -> Family:
    return Family(name=name, type="counter",
                  samples=[Sample(name=f"{name}_total", labels=labels, value=value)])


def ttft_histogram(count: int, total_s: float) -> Family:
    name = "vllm:time_to_first_token_seconds"
    return Family(name=name, type="histogram", samples=[
        Sample(name=f"{name}_bucket", labels={"le": "0.02"}, value=count),
        Sample(name=f"{name}_bucket", labels={"le": "+Inf"}, value=count),
        Sample(name=f"{name}_count", value=count), Sample(name=f"{name}_sum", value=total_s)])


LENGTHS = {"mean": 100.0, "p50": 100, "p90": 100, "p99": 100, "max": 100}


def write_scraped_run(run_dir, lines: list[Scrape], client_ttft_ms: list[float],
                      prefix_share: float | None = None):
    from analysis.readers.rundir import load_run
    from records.jsonform import dumps, to_json
    from tests.rundirs import encoded, write_summary

    write_summary(run_dir, throughput={"window_s": 10.0, "output_tokens_per_s": 100.0,
                                       "requests_per_s": 1.0, "goodput_requests_per_s": 1.0},
                  **({"workload": {"requests": 10, "prefix_share": prefix_share,
                                   "prompt_tokens": LENGTHS, "max_tokens": LENGTHS}}
                     if prefix_share is not None else {}))
    (run_dir / "histograms.json").write_text(json.dumps({"ttft": encoded(client_ttft_ms)}))
    (run_dir / "server_metrics.jsonl").write_text(
        "".join(dumps(to_json(s)) + "\n" for s in lines))
    return load_run(run_dir)


def vllm_scrape(t: float, waiting: float, kv: float, preemptions: float, ttft_count: int,
                generated: float) -> Scrape:
    return Scrape(t_unix_s=t, t_run_s=t, source="http://vllm/metrics", ok=True, families=[
        gauge("vllm:num_requests_waiting", waiting), gauge("vllm:num_requests_running", 8),
        gauge("vllm:kv_cache_usage_perc", kv), counter("vllm:num_preemptions", preemptions),
        counter("vllm:generation_tokens", generated),
        ttft_histogram(ttft_count, 0.010 * ttft_count)])


def test_the_rules_fire_on_a_saturated_server_with_a_full_kv_cache_and_a_slow_front_door(
        tmp_path):
    from analysis.diagnosis import diagnose
    from analysis.readers.server_metrics import server_side
    from analysis.report.scraped import headline_figures

    nvml = [Scrape(t_unix_s=t, t_run_s=t, source="nvml", ok=True, families=[
        counter("nvml_gpu_energy_joules", 1000.0 + 50 * t, gpu="0")]) for t in range(7)]
    engine = [vllm_scrape(t, waiting=3 * t, kv=0.5 + 0.08 * t, preemptions=t // 2,
                          ttft_count=10 * t, generated=100 * t) for t in range(7)]
    run = write_scraped_run(tmp_path, [*engine, *nvml], client_ttft_ms=[60.0] * 50)
    fired = {f.rule: f for f in diagnose(run) if f.fired}
    assert {"server_saturated", "kv_pressure", "front_door"} <= set(fired)
    assert "`vllm:num_requests_waiting`" in fired["server_saturated"].evidence[0]
    assert "3 over the run" in fired["kv_pressure"].evidence[1]  # preemptions 0 -> 3
    headline = headline_figures(server_side(run), run)
    assert headline["joules_per_output_token"] == pytest.approx(300 / 600)  # 300 J, 600 tokens
    assert headline["client_minus_server_ttft_ms"] == pytest.approx(50, abs=0.1)
    assert headline["kv_usage_max"] == pytest.approx(0.98)


def test_a_balanced_quiet_server_fires_nothing_and_a_missing_gpu_is_said(tmp_path):
    from analysis.diagnosis import diagnose
    from analysis.readers.server_metrics import server_side

    engine = [vllm_scrape(t, waiting=0, kv=0.2, preemptions=0, ttft_count=10 * t,
                          generated=100 * t) for t in range(7)]
    no_gpu = Scrape(t_unix_s=0, t_run_s=0, source="nvml", ok=False,
                    error="no GPU visible to NVML (NVMLError_LibraryNotFound)")
    run = write_scraped_run(tmp_path, [*engine, no_gpu], client_ttft_ms=[11.0] * 50)
    findings = {f.rule: f for f in diagnose(run)}
    for rule in ("server_saturated", "kv_pressure", "front_door"):
        assert findings[rule].judged and not findings[rule].fired, findings[rule]
    assert not findings["server_expert_imbalance"].judged
    assert "not exposed by the scraped server" in findings["server_expert_imbalance"].verdict
    side = server_side(run)
    assert side.gpus is None and side.gpu_problem.startswith("no GPU visible to NVML")


def test_a_stream_left_part_way_gives_back_what_it_held():
    import asyncio
    from types import SimpleNamespace

    from loadgen.reference.pacer import Pacer

    args = SimpleNamespace(capacity=1, ttft_ms=0.0, itl_ms=0.0, tokens_per_chunk=1,
                           stall_at_s=0.0, stall_s=0.0, faults="", kv_tokens=100,
                           preempt_every=0, seed=0, prefix_cache=True, moe_shape="4x16x2")

    async def leave_after(pacer: Pacer, messages: int) -> None:
        stream = pacer.messages(5, list(range(20)))
        async for m in stream:
            if m.index + 1 >= messages:
                break
        await stream.aclose()

    async def scenario() -> Tally:
        pacer = Pacer(args)
        await leave_after(pacer, 1)  # the client went away after the first message
        await leave_after(pacer, 5)  # a whole stream
        return pacer.tally

    tally = asyncio.run(scenario())
    assert (tally.kv_held, tally.running, tally.waiting) == (0, 0, 0)
    assert tally.generation_tokens == 1 + 5 and tally.finished == 2


def test_a_last_scrape_cut_short_is_left_out_and_any_other_broken_line_named(tmp_path):
    from analysis.readers.files import RunDirError
    from analysis.readers.rundir import Run
    from records.jsonform import dumps, to_json

    whole = dumps(to_json(scrape_of((EXPOSITIONS / "vllm.prom").read_bytes())))
    (tmp_path / "server_metrics.jsonl").write_text(f"{whole}\n{whole}\n{whole[:500]}")
    assert len(Run(tmp_path).scrapes) == 2
    (tmp_path / "server_metrics.jsonl").write_text(f"{whole[:500]}\n{whole}\n")
    with pytest.raises(RunDirError, match=r"server_metrics.jsonl:1: not JSON"):
        Run(tmp_path).scrapes  # noqa: B018


@pytest.mark.parametrize("hits, shared, fired, says", [
    (0, 0.6, True, "where the workload shared 60.0%"),
    (550, 0.6, False, "hit 55.0% of the 60.0% the workload shared"),
    (0, 0.02, False, "share little (2.0%"),
    (0, None, None, "a distributed or older run"),
])
def test_the_prefix_rule_judges_the_servers_hits_against_what_the_prompts_shared(
        tmp_path, hits, shared, fired, says):
    from analysis.diagnosis import diagnose

    def scrape(t: float, queried: float, hit: float) -> Scrape:
        return Scrape(t_unix_s=t, t_run_s=t, source="http://vllm/metrics", ok=True, families=[
            counter("vllm:prefix_cache_queries", queried), counter("vllm:prefix_cache_hits", hit)])

    run = write_scraped_run(tmp_path, [scrape(0, 0, 0), scrape(5, 1000, hits)], [10.0],
                            prefix_share=shared)
    finding = next(f for f in diagnose(run) if f.rule == "prefix_misses")
    assert finding.judged == (fired is not None) and finding.fired == bool(fired)
    assert says in finding.verdict
