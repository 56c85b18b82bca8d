"""GetStats telemetry, the Prometheus endpoint and the step log, on a real server with
capacity, the expert cache and every counter switched on."""

import json
import re
import urllib.request

import pytest
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proto import moe_pb2
from records.declare import leaves
from records.server_settings import ServerSettings
from server.telemetry.process import gpu_stats
from tests.conftest import REPO, running_server

Req = moe_pb2.GenerateRequest


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    with running_server(capacity_factor=0.5, expert_cache=2, cache_policy="lru", metrics_port=0,
                        step_log=str(log_path), routing_skew="zipf:1.0") as served:
        calls = [served.stub.Generate(Req(prompt=f"request {i}" * 3, max_tokens=6, ignore_eos=True))
                 for i in range(5)]
        for call in calls:
            list(call)
        yield served, served.stub.GetStats(moe_pb2.GetStatsRequest()), log_path


def test_stats_describe_every_step(busy):
    _, s, _ = busy
    assert (s.router, s.routing_skew, s.capacity_factor, s.moe_kernel, s.expert_cache) == \
        ("topk", "zipf:1.0", 0.5, "sorted", 2)
    # Every setting, as the server resolved it: the preset's renormalisation, the device, the KV
    # slots.
    assert set(s.settings) == {leaf.name for leaf in leaves(ServerSettings)}
    assert (s.settings["capacity_factor"], s.settings["renormalize"], s.settings["device"],
            s.settings["kv_slots"], s.settings["torch_threads"],
            s.settings["metrics_port"]) == ("0.5", "true", "cpu", "32", "1", "0")
    assert s.requests_finished == 5 and s.tokens_generated == 30
    assert s.step_ms.count == s.steps and s.batch_size.count == s.steps
    assert sum(s.batch_size.counts) == s.steps and s.batch_size.sum == s.tokens_generated
    # last tokens are never fed back
    assert s.tokens_per_step.sum == s.prompt_tokens + s.tokens_generated - 5
    stages = {st.stage: st.ms for st in s.stages}
    assert set(stages) == {"preprocess", "attention", "routing", "dispatch", "expert_compute",
                           "combine", "decode"}
    assert all(h.count == s.steps for h in stages.values())
    assert sum(h.sum for h in stages.values()) <= s.step_ms.sum  # stages partition the engine call
    assert 0 < s.kv_positions_useful <= s.kv_positions_computed
    assert s.process_cpu_percent > 0 and s.process_rss_bytes > 0 and s.gpu_utilization_percent == -1


def test_layer_stats_count_routing_drops_and_cache(busy):
    _, s, _ = busy
    assert len(s.layers) == s.num_layers
    routed_pairs = (s.prompt_tokens + s.tokens_generated - 5) * s.top_k
    active_total = 0
    for layer in s.layers:
        assert sum(layer.expert_tokens) == routed_pairs
        assert sum(layer.dropped) > 0  # capacity factor 0.5 cannot hold every pair
        assert layer.imbalance_max_over_mean >= 1 and layer.imbalance_cv >= 0
        assert sum(layer.active_experts_steps) == s.steps
        active_total += sum(n * steps for n, steps in enumerate(layer.active_experts_steps))
        c = layer.cache
        assert (c.hits + c.misses
                == sum(n * steps for n, steps in enumerate(layer.active_experts_steps)))
        assert c.misses > 0 and c.bytes_copied > 0 and c.copy_ms > 0
    expert_bytes = 3 * 64 * 128 * 4  # tiny preset, fp32
    assert s.expert_bytes_read == active_total * expert_bytes
    assert s.expert_bandwidth_gb_s > 0


def test_reset_zeroes_counters_including_the_cache(busy):
    served, _, _ = busy
    served.stub.ResetStats(moe_pb2.ResetStatsRequest())
    s = served.stub.GetStats(moe_pb2.GetStatsRequest())
    assert s.steps == 0 and s.layers[0].cache.misses == 0 and sum(s.layers[0].expert_tokens) == 0
    list(served.stub.Generate(Req(prompt="again", max_tokens=3, ignore_eos=True)))
    s = served.stub.GetStats(moe_pb2.GetStatsRequest())
    assert s.steps == 3 and s.layers[0].cache.hits + s.layers[0].cache.misses > 0


def scrape(port: int) -> dict[tuple, float]:
    """(sample name, labels) -> value of one /metrics scrape."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_prometheus_counters_only_grow_and_follow_conventions(busy):
    served, _, _ = busy
    list(served.stub.Generate(Req(prompt="count me", max_tokens=3, ignore_eos=True)))
    before = scrape(served.app.metrics_port)
    served.stub.ResetStats(moe_pb2.ResetStatsRequest())  # a new GetStats window ...
    list(served.stub.Generate(Req(prompt="and me", max_tokens=3, ignore_eos=True)))
    after = scrape(served.app.metrics_port)
    window = served.stub.GetStats(moe_pb2.GetStatsRequest())
    counters = [key for key in before if key[0].endswith(("_total", "_count", "_sum", "_bucket"))
                and not key[0].startswith("process_")]
    assert len(counters) > 50
    for key in counters:  # ... never a counter reset in Prometheus
        assert after[key] >= before[key], key
    steps = after[("moe_steps_total", ())]
    assert steps > window.steps == 3  # lifetime, beyond the window
    finished = after[("moe_requests_total", (("outcome", "finished"),))]
    assert finished == before[("moe_requests_total", (("outcome", "finished"),))] + 1
    # the server's own per-request times, and the settings as an info metric
    assert after[("moe_request_seconds_count", (("phase", "ttft"),))] == finished
    assert after[("moe_request_seconds_count", (("phase", "queue"),))] == finished
    info = next(dict(k[1]) for k in after if k[0] == "moe_server_info")
    assert info["preset"] == "tiny" and info["policy"] == "fcfs" and info["expert_cache"] == "2"
    # batch-size buckets end at --max-batch-size (32 by default), not at 8192
    bounds = sorted(float(dict(k[1])["le"]) for k in after if k[0] == "moe_batch_size_bucket")
    assert bounds == [1, 2, 4, 8, 16, 32, float("inf")]
    assert ("moe_cache_misses_total", (("layer", "0"),)) in after
    assert ("process_resident_memory_bytes", ()) in after


def test_step_log_has_one_line_per_step(busy):
    _, s, log_path = busy
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    # the engine's two warm-up steps are not logged; later steps may be
    assert len(lines) >= s.steps
    first = lines[0]
    assert {"t_unix_s", "t_monotonic_s", "batch", "tokens", "stage_ms", "active_experts",
            "expert_tokens"} <= set(first)
    assert len(first["active_experts"]) == s.num_layers and "dropped" in first


def test_every_metric_the_dashboard_queries_exists_in_a_live_scrape(busy):
    served, _, _ = busy
    dashboard = json.loads((REPO / "deploy/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {name for e in exprs for name in re.findall(r"\b(?:moe|process)_[a-z_]+\b", e)}
    live = {name for name, _ in scrape(served.app.metrics_port)}
    assert len(named) >= 15 and named <= live, named - live
    config = yaml.safe_load((REPO / "deploy/prometheus.yml").read_text())
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9100"]


class NVMLError(Exception):
    """What pynvml raises (NotSupported under MIG): not a RuntimeError."""


def test_an_nvml_error_leaves_the_utilisation_unknown_and_the_memory_reported(monkeypatch):
    # no GPU here: torch.cuda's readers stand in for a MIG slice whose NVML says NotSupported
    def not_supported(device):
        raise NVMLError("Not Supported")

    monkeypatch.setattr(torch.cuda, "utilization", not_supported)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 8 * 2**20)
    stats = gpu_stats(torch.device("cuda", 0))
    assert stats == (-1.0, 3 * 2**20, 8 * 2**20)
    assert gpu_stats(torch.device("cpu")) == (-1.0, 0, 0)
