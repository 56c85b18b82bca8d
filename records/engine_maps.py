"""One table per engine family, from its Prometheus names to our concepts
(records/metric_maps.py), each read from the engine's own source (the file is in `cited`,
versions in `since`; docs/targets.md has the tables in words). Where a name changed, the newer
comes first and the older after it. A concept a table lacks is one the engine does not expose:
the report says so.

Names are families as prometheus_client's parser gives them: a counter without `_total`."""

from __future__ import annotations

from records.metric_maps import EngineMap, Source, engines_of, read
from records.server_metrics import Scrape

LAB = EngineMap(
    "moe-loadlab", "this project's server (--metrics-port)", ("moe_",),
    "server/frontends/prometheus.py, records/engine_telemetry.py",
    {"waiting": (Source("moe_waiting"),),
     "running": (Source("moe_running"),),
     "kv_usage": (Source("moe_kv_slots_in_use", per="moe_kv_slots"),),
     "prompt_tokens": (Source("moe_prompt_tokens"),),
     "generation_tokens": (Source("moe_tokens_generated"),),
     "prefix_queries": (Source("moe_prefix_cache_queries"),),
     "prefix_hits": (Source("moe_prefix_cache_hits"),),
     "requests_finished": (Source("moe_requests", (("outcome", "finished"),)),),
     "ttft": (Source("moe_request_seconds", (("phase", "ttft"),)),),
     "tpot": (Source("moe_request_seconds", (("phase", "tpot"),)),),
     "queue_time": (Source("moe_request_seconds", (("phase", "queue"),)),),
     "prefill_time": (Source("moe_request_seconds", (("phase", "prefill"),)),),
     "write_delay": (Source("moe_write_seconds"),),
     "expert_balance": (Source("moe_expert_tokens", balance="expert"),),
     "gpu_memory_bytes": (Source("moe_gpu_memory_bytes"),),
     "rss_bytes": (Source("process_resident_memory_bytes"),)})

VLLM = EngineMap(
    "vllm", "vLLM (the v1 engine; the v0 engine's names after them)", ("vllm:",),
    "vllm/v1/metrics/loggers.py (PrometheusStatLogger), vllm/v1/spec_decode/metrics.py; "
    "v0: vllm/engine/metrics.py",
    {"waiting": (Source("vllm:num_requests_waiting"),),
     "running": (Source("vllm:num_requests_running"),),
     "kv_usage": (Source("vllm:kv_cache_usage_perc", since="0.9.2"),
                  Source("vllm:gpu_cache_usage_perc", since="v0; v1 until 0.11")),
     "preemptions": (Source("vllm:num_preemptions"),),
     "prefix_queries": (Source("vllm:prefix_cache_queries", since="0.9.2"),
                        Source("vllm:gpu_prefix_cache_queries", since="v1 until 0.11")),
     "prefix_hits": (Source("vllm:prefix_cache_hits", since="0.9.2"),
                     Source("vllm:gpu_prefix_cache_hits", since="v1 until 0.11")),
     "prefix_hit_rate": (Source("vllm:gpu_prefix_cache_hit_rate", since="v0 until 0.9.0"),),
     "prompt_tokens": (Source("vllm:prompt_tokens"),),
     "generation_tokens": (Source("vllm:generation_tokens"),),
     "requests_finished": (Source("vllm:request_success"),),
     "ttft": (Source("vllm:time_to_first_token_seconds"),),
     "itl": (Source("vllm:inter_token_latency_seconds", since="0.10.2"),
             Source("vllm:time_per_output_token_seconds", since="v0; v1 until 0.14")),
     "tpot": (Source("vllm:request_time_per_output_token_seconds", since="0.11.0"),),
     "e2e": (Source("vllm:e2e_request_latency_seconds"),),
     "queue_time": (Source("vllm:request_queue_time_seconds", since="0.6.6"),),
     "prefill_time": (Source("vllm:request_prefill_time_seconds", since="0.6.6"),),
     "decode_time": (Source("vllm:request_decode_time_seconds", since="0.6.6"),),
     "spec_draft_tokens": (Source("vllm:spec_decode_num_draft_tokens"),),
     "spec_accepted_tokens": (Source("vllm:spec_decode_num_accepted_tokens"),),
     "rss_bytes": (Source("process_resident_memory_bytes"),)})

SGLANG = EngineMap(
    "sglang", "SGLang (--enable-metrics)", ("sglang:",),
    "python/sglang/srt/metrics/collector.py (now srt/observability/metrics_collector.py)",
    {"waiting": (Source("sglang:num_queue_reqs"),),
     "running": (Source("sglang:num_running_reqs"),),
     "running_tokens": (Source("sglang:num_used_tokens"),),
     "kv_usage": (Source("sglang:token_usage"),),
     "preemptions": (Source("sglang:num_retracted_requests"),),
     # every prompt token is looked up in the radix cache; the cached ones hit
     "prefix_queries": (Source("sglang:prompt_tokens"),),
     "prefix_hits": (Source("sglang:cached_tokens"),),
     "prefix_hit_rate": (Source("sglang:cache_hit_rate"),),
     "prompt_tokens": (Source("sglang:prompt_tokens"),),
     "generation_tokens": (Source("sglang:generation_tokens"),),
     "requests_finished": (Source("sglang:num_requests"),),
     "ttft": (Source("sglang:time_to_first_token_seconds"),),
     "itl": (Source("sglang:inter_token_latency_seconds"),),
     "tpot": (Source("sglang:time_per_output_token_seconds", since="until early 2025"),),
     "e2e": (Source("sglang:e2e_request_latency_seconds"),),
     "queue_time": (Source("sglang:queue_time_seconds"),),
     "spec_accept_length": (Source("sglang:spec_accept_length"),),
     # a Summary of each forward's mean / max expert load over the GPUs: its mean over a window
     "expert_balance": (Source("sglang:eplb_balancedness"),),
     "rss_bytes": (Source("process_resident_memory_bytes"),)})

# Triton counts a request once in each model it passes through (an ensemble and the models it
# calls): the client's requests are the first of these a page has.
TRITON_MODELS = ("ensemble", "tensorrt_llm_bls", "tensorrt_llm")


def _per_model(family: str, **kw) -> tuple[Source, ...]:
    return tuple(Source(family, (("model", m),), **kw) for m in TRITON_MODELS)


TRITON = EngineMap(
    "triton", "Triton Inference Server with the TensorRT-LLM backend (port 8002)",
    ("nv_trt_llm_", "nv_inference_", "nv_gpu_", "nv_energy"),
    "triton core src/metrics.cc; tensorrtllm_backend inflight_batcher_llm/src/"
    "custom_metrics_reporter/custom_metrics_reporter.cc",
    {"waiting": (Source("nv_trt_llm_request_metrics", (("request_type", "waiting"),),
                        since="backend 0.18"),
                 Source("nv_inference_pending_request_count", (("model", "tensorrt_llm"),),
                        since="Triton 23.09")),
     "running": (Source("nv_trt_llm_request_metrics", (("request_type", "active"),)),),
     "running_tokens": (Source("nv_trt_llm_inflight_batcher_metrics",
                               (("inflight_batcher_specific_metric", "total_context_tokens"),)),),
     "kv_usage": (Source("nv_trt_llm_kv_cache_block_metrics",
                         (("kv_cache_block_type", "fraction"),), since="backend 0.18"),
                  Source("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),),
                         per="nv_trt_llm_kv_cache_block_metrics",
                         per_labels=(("kv_cache_block_type", "max"),))),
     "requests_finished": _per_model("nv_inference_request_success"),
     "prompt_tokens": (Source("nv_llm_input_token_len", since="backend 0.16"),),
     "generation_tokens": (Source("nv_llm_output_token_len", since="backend 0.16"),),
     "ttft": _per_model("nv_inference_first_response_histogram_ms", scale=1e-3,
                        since="Triton 24.11, with --metrics-config histogram_latencies=true"),
     "gpu_utilization": (Source("nv_gpu_utilization"),),
     "gpu_memory_bytes": (Source("nv_gpu_memory_used_bytes"),),
     "gpu_power_w": (Source("nv_gpu_power_usage"),),
     "gpu_energy_j": (Source("nv_energy_consumption"),),
     "rss_bytes": (Source("process_resident_memory_bytes"),)})

TGI = EngineMap(
    "tgi", "Hugging Face text-generation-inference", ("tgi_",),
    "router/src/server.rs, backends/v3/src/queue.rs and backends/v3/src/backend.rs",
    {"waiting": (Source("tgi_queue_size"),),
     "running": (Source("tgi_batch_current_size"),),
     "running_tokens": (Source("tgi_batch_current_max_tokens"),),
     "requests_finished": (Source("tgi_request_success"),),
     # histograms of sizes: their sums are the totals
     "prompt_tokens": (Source("tgi_request_input_length"),),
     "generation_tokens": (Source("tgi_request_generated_tokens"),),
     "e2e": (Source("tgi_request_duration"),),
     "queue_time": (Source("tgi_request_queue_duration"),),
     # the request's inference time over its tokens, prefill included
     "tpot": (Source("tgi_request_mean_time_per_token_duration"),),
     "rss_bytes": (Source("process_resident_memory_bytes"),)})

HOST_GPUS = EngineMap(
    "nvml", "the load generator's host GPUs (NVML)", ("nvml_",), "loadgen/scraping/nvml.py",
    {"gpu_utilization": (Source("nvml_gpu_utilization_ratio"),),
     "gpu_memory_bytes": (Source("nvml_gpu_memory_used_bytes"),),
     "gpu_power_w": (Source("nvml_gpu_power_watts"),),
     "gpu_energy_j": (Source("nvml_gpu_energy_joules"),)})

ENGINE_MAPS = (LAB, VLLM, SGLANG, TRITON, TGI, HOST_GPUS)
LIVE = ("waiting", "running", "kv_usage")  # what the web UI's chart shows
# every family some table reads, as a scrape's families are named (a counter also with _total)
READ_FAMILIES = frozenset(name for e in ENGINE_MAPS for sources in e.reads.values()
                          for s in sources for family in (s.family, s.per) if family
                          for name in (family, f"{family}_total"))


def live_gauges(scrape: Scrape) -> dict[str, float]:
    """The LIVE gauges a scrape holds, by concept."""
    if not scrape.ok:
        return {}
    readings = read(scrape, engines_of(scrape, ENGINE_MAPS))
    return {name: readings[name][1].value for name in LIVE
            if name in readings and readings[name][1].value is not None}
