"""A reference server's /metrics, in the names and labels the engine it stands for writes
(vLLM's v1 PrometheusStatLogger, SGLang's metrics collector), its values the Tally's
(loadgen/reference/tally.py), rendered by prometheus_client as those servers render theirs.
Spelt here on their own, not from records/engine_maps.py, so the tests check our tables
against an independent writer."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)

from loadgen.reference.tally import ExposedHistogram, Tally

MODEL = "delay"


def _families(tally: Tally, names: dict[str, str], labels: dict[str, str]) -> Iterator:
    keys, values = list(labels), list(labels.values())

    def gauge(key: str, value: float):
        family = GaugeMetricFamily(names[key], key, labels=keys)
        family.add_metric(values, value)
        return family

    def counter(key: str, value: float):
        family = CounterMetricFamily(names[key], key, labels=keys)
        family.add_metric(values, value)
        return family

    def histogram(key: str, h: ExposedHistogram):
        family = HistogramMetricFamily(names[key], key, labels=keys)
        family.add_metric(values, h.cumulative(), h.sum)
        return family

    gauges = {"waiting": tally.waiting, "running": tally.running, "kv_usage": tally.kv_usage,
              "running_tokens": tally.kv_held}
    counters = {"preemptions": tally.preemptions, "prefix_queries": tally.prefix_queries,
                "prefix_hits": tally.prefix_hits, "prompt_tokens": tally.prompt_tokens,
                "generation_tokens": tally.generation_tokens, "finished": tally.finished}
    histograms = {"ttft": tally.ttft, "itl": tally.itl, "queue": tally.queue, "e2e": tally.e2e}
    for key, value in gauges.items():
        if key in names:
            yield gauge(key, value)
    for key, value in counters.items():
        if key in names:
            yield counter(key, value)
    for key, h in histograms.items():
        yield histogram(key, h)
    if "balancedness" in names and tally.forwards:
        family = SummaryMetricFamily(names["balancedness"], "balancedness",
                                     labels=[*keys, "forward_mode"])
        family.add_metric([*values, "decode"], tally.forwards, tally.balancedness_sum)
        yield family


VLLM = {"waiting": "vllm:num_requests_waiting", "running": "vllm:num_requests_running",
        "kv_usage": "vllm:kv_cache_usage_perc", "preemptions": "vllm:num_preemptions",
        "prefix_queries": "vllm:prefix_cache_queries", "prefix_hits": "vllm:prefix_cache_hits",
        "prompt_tokens": "vllm:prompt_tokens", "generation_tokens": "vllm:generation_tokens",
        "finished": "vllm:request_success", "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds", "queue": "vllm:request_queue_time_seconds",
        "e2e": "vllm:e2e_request_latency_seconds"}
SGLANG = {"waiting": "sglang:num_queue_reqs", "running": "sglang:num_running_reqs",
          "kv_usage": "sglang:token_usage", "running_tokens": "sglang:num_used_tokens",
          "preemptions": "sglang:num_retracted_requests", "prefix_hits": "sglang:cached_tokens",
          "prompt_tokens": "sglang:prompt_tokens", "generation_tokens": "sglang:generation_tokens",
          "finished": "sglang:num_requests", "ttft": "sglang:time_to_first_token_seconds",
          "itl": "sglang:inter_token_latency_seconds", "queue": "sglang:queue_time_seconds",
          "e2e": "sglang:e2e_request_latency_seconds", "balancedness": "sglang:eplb_balancedness"}
# the protocol a reference server speaks -> the names its /metrics uses and their labels
SPELLINGS = {
    "openai": (VLLM, {"engine": "0", "model_name": MODEL}),
    "vllm-grpc": (VLLM, {"engine": "0", "model_name": MODEL}),
    "sglang-grpc": (SGLANG, {"engine_type": "unified", "model_name": MODEL, "tp_rank": "0"}),
}


def exposition(protocol: str, tally: Tally) -> Callable[[], bytes]:
    """The protocol's /metrics body now, as a function of the tally."""
    names, labels = SPELLINGS[protocol]

    class Collector:
        def collect(self):
            return _families(tally, names, labels)

    registry = CollectorRegistry()
    registry.register(Collector())
    ProcessCollector(registry=registry)  # vLLM's page has process_resident_memory_bytes too
    return lambda: generate_latest(registry)
