"""Prometheus metrics (--metrics-port): the engine's telemetry since the server started, read
at scrape time so the engine step does no extra work. Counters and histograms only ever grow:
ResetStats starts a new GetStats window and leaves them alone (Prometheus counters must not go
back). Gauges are now. Imbalance is left to the query (max over mean of
rate(moe_expert_tokens_total[1m]) per layer: deploy/grafana-dashboard.json), so it describes
the recent past, not the average since start. moe_server_info carries the settings that tell
runs apart as labels."""

from __future__ import annotations

from itertools import accumulate

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from records.declare import flat, text
from records.server_settings import ServerSettings
from server.telemetry.window import Histogram, gpu_stats


def histogram_family(name: str, doc: str, h: Histogram, scale: float = 1.0,
                     labels: dict | None = None,
                     family: HistogramMetricFamily | None = None) -> HistogramMetricFamily:
    """Our per-bucket counts as Prometheus cumulative buckets; values times scale."""
    family = family or HistogramMetricFamily(name, doc, labels=list(labels or {}))
    cumulative = list(accumulate(h.counts))
    buckets = ([(repr(b * scale), c) for b, c in zip(h.bounds, cumulative, strict=False)]
               + [("+Inf", cumulative[-1])])
    family.add_metric(list((labels or {}).values()), buckets, h.sum * scale)
    return family


INFO_LABELS = ("preset", "checkpoint", "policy", "device", "dtype", "moe_kernel", "router",
               "routing_skew", "expert_cache", "max_batch_size", "kv_slots")


class EngineCollector:
    def __init__(self, engine_thread, settings: ServerSettings):
        self.engine_thread = engine_thread
        self.info = {name: text(value) for name, value in flat(settings).items()
                     if name in INFO_LABELS}

    def collect(self):
        snap = self.engine_thread.snapshot()
        t = self.engine_thread.lifetime()
        info = InfoMetricFamily("moe_server", "The server's model and batching settings")
        info.add_metric([], self.info)
        yield info
        requests = CounterMetricFamily("moe_requests", "Requests by outcome", labels=["outcome"])
        for outcome in ("admitted", "finished", "aborted", "rejected"):
            requests.add_metric([outcome], getattr(t, f"requests_{outcome}"))
        yield requests
        for name, doc in (("steps", "Engine steps"), ("tokens_generated", "Output tokens"),
                          ("prompt_tokens", "Prompt tokens of the requests admitted"),
                          ("kv_positions_useful", "Decode attention: cached positions needed"),
                          ("kv_positions_computed",
                           "Decode attention: positions computed, padding included"),
                          ("prefill_tokens", "Prompt tokens prefilled, chunk by chunk"),
                          ("prefill_padded_tokens", "Padding added by batched prefill attention"),
                          ("expert_bytes_read", "Weight bytes of the experts that computed")):
            yield CounterMetricFamily(f"moe_{name}", doc, value=getattr(t, name))
        yield CounterMetricFamily("moe_expert_compute_seconds", "Time in expert compute",
                                  value=t.expert_compute_ms / 1e3)
        for name, doc in (("running", "Requests in the running batch"),
                          ("waiting", "Requests waiting"),
                          ("kv_slots_in_use", "KV cache pool slots held")):
            yield GaugeMetricFamily(f"moe_{name}", doc, value=getattr(snap, name))
        yield GaugeMetricFamily("moe_kv_slots", "KV cache pool slots",
                                value=self.engine_thread.engine.kv_slots)
        faults = self.engine_thread.faults.snapshot()
        injected = CounterMetricFamily("moe_faults_injected", "Faults injected (--fault-*)",
                                       labels=["kind"])
        for kind in ("steps_failed", "stalls", "streams_dropped", "requests_slowed"):
            injected.add_metric([kind], getattr(faults, kind))
        yield injected
        yield GaugeMetricFamily("moe_faults_active", "1 while the fault window is open",
                                value=int(faults.active))
        heap = self.engine_thread.heap
        yield CounterMetricFamily("moe_heap_trims", "Freed heap memory handed back to the "
                                  "system between steps (--heap-trim-s)", value=heap.trims)
        yield CounterMetricFamily("moe_heap_trim_seconds", "Engine time spent handing freed "
                                  "heap memory back", value=heap.trim_ms / 1e3)

        routed = CounterMetricFamily("moe_expert_tokens", "(token, expert) pairs routed",
                                     labels=["layer", "expert"])
        dropped = CounterMetricFamily("moe_dropped", "Pairs over expert capacity",
                                      labels=["layer", "expert"])
        active = CounterMetricFamily("moe_active_experts_steps",
                                     "Steps in which n experts computed",
                                     labels=["layer", "experts"])
        for layer, row in enumerate(t.expert_tokens.tolist()):
            for expert, n in enumerate(row):
                routed.add_metric([str(layer), str(expert)], n)
                dropped.add_metric([str(layer), str(expert)], int(t.dropped[layer, expert]))
            for n_active, steps in enumerate(t.active_steps[layer].tolist()):
                active.add_metric([str(layer), str(n_active)], steps)
        yield from (routed, dropped, active)

        cache = self.engine_thread.batching.cache_counters()  # since start: the caches' own
        if cache:
            families = {k: CounterMetricFamily(f"moe_cache_{k}",
                                               f"Expert cache {k.replace('_', ' ')}",
                                               labels=["layer"])
                        for k in ("hits", "misses", "evictions", "bytes_copied", "copy_seconds")}
            for layer, c in enumerate(cache):
                for k in ("hits", "misses", "evictions", "bytes_copied"):
                    families[k].add_metric([str(layer)], getattr(c, k))
                families["copy_seconds"].add_metric([str(layer)], c.copy_ms / 1e3)
            yield from families.values()

        if t.exchange is not None:
            yield from exchange_families(t.exchange)

        stages = HistogramMetricFamily("moe_stage_seconds", "Engine step time by stage",
                                       labels=["stage"])
        for stage, h in t.stage_ms.items():
            histogram_family("", "", h, 1e-3, {"stage": stage}, stages)
        yield stages
        yield histogram_family("moe_step_seconds", "Engine step wall time", t.step_ms, 1e-3)
        yield histogram_family("moe_write_seconds", "Streamed messages: stamped -> the transport "
                               "accepted it (the server's part of the delivery lag)",
                               t.write_ms, 1e-3)
        yield histogram_family("moe_batch_size", "Requests per step", t.batch_size)
        yield histogram_family("moe_tokens_per_step", "Tokens per forward pass", t.tokens_per_step)
        phases = HistogramMetricFamily(
            "moe_request_seconds", "Finished requests, the server's own times: queue (received "
            "-> admitted), prefill, ttft (received -> first token), tpot (per token after the "
            "first)", labels=["phase"])
        for phase, h in t.request_ms.items():
            histogram_family("", "", h, 1e-3, {"phase": phase}, phases)
        yield phases
        gpu = gpu_stats(self.engine_thread.engine.device)
        if gpu.utilization_percent >= 0:
            yield GaugeMetricFamily("moe_gpu_utilization_percent", "GPU utilisation",
                                    value=gpu.utilization_percent)
        if gpu.reserved_bytes:
            yield GaugeMetricFamily("moe_gpu_memory_bytes", "GPU memory allocated by torch's "
                                    "tensors", value=gpu.allocated_bytes)
            yield GaugeMetricFamily("moe_gpu_memory_reserved_bytes", "GPU memory held by torch's "
                                    "caching allocator, allocated or not",
                                    value=gpu.reserved_bytes)


def exchange_families(x):
    """The exchanges between the engine's ranks (--ep), since the server started."""
    sent = CounterMetricFamily("moe_ep_bytes", "Payload bytes the MoE layers' exchanges sent "
                               "between ranks", labels=["source", "destination", "phase"])
    for p, phase in enumerate(("dispatch", "combine")):
        for s in range(x.ranks):
            for d in range(x.ranks):
                if s != d:
                    sent.add_metric([str(s), str(d), phase], int(x.bytes[p, s, d]))
    times = CounterMetricFamily("moe_ep_exchange_seconds", "The exchanges' time: measured, "
                                "exposed (steps waited for it) or modelled (--link-gbps)",
                                labels=["phase", "kind"])
    for key, ms in x.ms.items():
        phase, kind = key.split("_")
        times.add_metric([phase, kind], ms / 1e3)
    computed = CounterMetricFamily("moe_ep_rank_pairs", "(token, expert) pairs each rank's "
                                   "experts computed", labels=["layer", "rank"])
    for layer, row in enumerate(x.computed.tolist()):
        for rank, n in enumerate(row):
            computed.add_metric([str(layer), str(rank)], n)
    yield from (sent, times, computed)
    yield CounterMetricFamily("moe_ep_experts_moved", "Expert slots a re-placement changed",
                              value=x.experts_moved)


def serve_metrics(engine_thread, settings: ServerSettings, host: str, port: int):
    """Starts the /metrics HTTP server; returns it (call .shutdown() to stop) and its port."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine_thread, settings))
    ProcessCollector(registry=registry)  # process CPU seconds and resident memory
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
