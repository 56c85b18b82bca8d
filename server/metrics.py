"""Prometheus metrics (--metrics-port): the GetStats telemetry, read from a snapshot at
scrape time so the engine step does no extra work. Counters restart from zero after
ResetStats, which Prometheus treats as a counter reset."""

from __future__ import annotations

from itertools import accumulate

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from server.telemetry import Histogram, gpu_stats, imbalance


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


class EngineCollector:
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        snap = self.scheduler.snapshot()
        t = snap.telemetry
        requests = CounterMetricFamily("moe_requests", "Requests by outcome", labels=["outcome"])
        for outcome in ("admitted", "finished", "aborted", "rejected"):
            requests.add_metric([outcome], getattr(t, f"requests_{outcome}"))
        yield requests
        for name, doc in (("steps", "Engine steps"), ("tokens_generated", "Output tokens"),
                          ("prompt_tokens", "Prompt tokens prefilled"),
                          ("kv_positions_useful", "Decode attention: cached positions needed"),
                          ("kv_positions_computed",
                           "Decode attention: positions computed, padding included"),
                          ("prefill_tokens", "Prompt tokens prefilled"),
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
                                value=self.scheduler.engine.kv_slots)
        faults = self.scheduler.faults.snapshot()
        injected = CounterMetricFamily("moe_faults_injected", "Faults injected (--fault-*)",
                                       labels=["kind"])
        for kind in ("steps_failed", "stalls", "streams_dropped", "requests_slowed"):
            injected.add_metric([kind], getattr(faults, kind))
        yield injected
        yield GaugeMetricFamily("moe_faults_active", "1 while the fault window is open",
                                value=int(faults.active))

        routed = CounterMetricFamily("moe_expert_tokens", "(token, expert) pairs routed",
                                     labels=["layer", "expert"])
        dropped = CounterMetricFamily("moe_dropped", "Pairs over expert capacity",
                                      labels=["layer", "expert"])
        active = CounterMetricFamily("moe_active_experts_steps",
                                     "Steps in which n experts computed",
                                     labels=["layer", "experts"])
        max_mean = GaugeMetricFamily("moe_expert_imbalance_max_over_mean",
                                     "Routed tokens, max/mean", labels=["layer"])
        cv = GaugeMetricFamily("moe_expert_imbalance_cv", "Routed tokens, coefficient of variation",
                               labels=["layer"])
        for layer, row in enumerate(t.expert_tokens.tolist()):
            for expert, n in enumerate(row):
                routed.add_metric([str(layer), str(expert)], n)
                dropped.add_metric([str(layer), str(expert)], int(t.dropped[layer, expert]))
            for n_active, steps in enumerate(t.active_steps[layer].tolist()):
                active.add_metric([str(layer), str(n_active)], steps)
            ratio, variation = imbalance(row)
            max_mean.add_metric([str(layer)], ratio)
            cv.add_metric([str(layer)], variation)
        yield from (routed, dropped, active, max_mean, cv)

        if snap.cache:
            families = {k: CounterMetricFamily(f"moe_cache_{k}",
                                               f"Expert cache {k.replace('_', ' ')}",
                                               labels=["layer"])
                        for k in ("hits", "misses", "evictions", "bytes_copied", "copy_seconds")}
            for layer, c in enumerate(snap.cache):
                for k in ("hits", "misses", "evictions", "bytes_copied"):
                    families[k].add_metric([str(layer)], getattr(c, k))
                families["copy_seconds"].add_metric([str(layer)], c.copy_ms / 1e3)
            yield from families.values()

        stages = HistogramMetricFamily("moe_stage_seconds", "Engine step time by stage",
                                       labels=["stage"])
        for stage, h in t.stage_ms.items():
            histogram_family("", "", h, 1e-3, {"stage": stage}, stages)
        yield stages
        yield histogram_family("moe_step_seconds", "Engine step wall time", t.step_ms, 1e-3)
        yield histogram_family("moe_batch_size", "Requests per step", t.batch_size)
        yield histogram_family("moe_tokens_per_step", "Tokens per forward pass", t.tokens_per_step)
        utilization, memory = gpu_stats(self.scheduler.engine.device)
        if utilization >= 0:
            yield GaugeMetricFamily("moe_gpu_utilization_percent", "GPU utilisation",
                                    value=utilization)
        if memory:
            yield GaugeMetricFamily("moe_gpu_memory_bytes", "GPU memory allocated by torch",
                                    value=memory)


def serve_metrics(scheduler, host: str, port: int):
    """Starts the /metrics HTTP server; returns it (call .shutdown() to stop) and its port."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(scheduler))
    ProcessCollector(registry=registry)  # process CPU seconds and resident memory
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
