"""Prometheus metrics (--metrics-port): every family the engine's telemetry declares
(records/engine_telemetry.py), from its readings since the server started, taken at scrape time
so the engine step does no extra work. Counters and histograms only ever grow: ResetStats
starts a new GetStats window and leaves them alone (Prometheus counters must not go back).
Gauges are now. Imbalance is left to the query (max over mean of
rate(moe_expert_tokens_total[1m]) per layer: deploy/grafana-dashboard.json), so it describes
the recent past, not the average since start. moe_server_info carries the settings that tell
runs apart as labels."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from records.declare import flat, named, text
from records.engine_telemetry import COUNTER, GAUGE, HISTOGRAM, Metric, families
from records.server_settings import ServerSettings
from server.scheduling.engine_thread import EngineThread
from server.telemetry.histogram import BucketHistogram

FAMILY = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily,
          HISTOGRAM: HistogramMetricFamily}
INFO_LABELS = named(ServerSettings, "preset", "checkpoint", "policy", "device", "dtype",
                    "moe_kernel", "router", "routing_skew", "expert_cache", "max_batch_size",
                    "kv_slots")


def buckets(h: BucketHistogram, scale: float) -> list[tuple[str, int]]:
    """Our per-bucket counts as Prometheus cumulative buckets, bounds times scale."""
    cumulative = list(accumulate(h.counts))
    return ([(repr(b * scale), c) for b, c in zip(h.bounds, cumulative, strict=False)]
            + [("+Inf", cumulative[-1])])


def samples(value, depth: int, index: tuple[str, ...] = ()) -> Iterator[tuple[tuple, object]]:
    """(label values, value) of each value a reading holds `depth` dims deep (list positions
    and dict keys become label values); None is no sample."""
    if value is None:
        return
    if depth == 0:
        yield index, value
        return
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, inner in items:
        yield from samples(inner, depth - 1, (*index, str(key)))


def family_of(name: str, kind: str, help: str, metrics: list[Metric], values: dict):
    """The family with a sample for each value its metrics' readings hold; None without any."""
    first = metrics[0]
    family = FAMILY[kind](name, help, labels=[*first.dims, *(k for k, _ in first.labels)])
    empty = True
    for m in metrics:
        fixed = [v for _, v in m.labels]
        for index, value in samples(values[m.name], len(m.dims)):
            empty = False
            if kind == HISTOGRAM:
                family.add_metric([*index, *fixed], buckets(value, m.scale), value.sum * m.scale)
            else:
                family.add_metric([*index, *fixed], value * m.scale)
    return None if empty else family


class EngineCollector:
    def __init__(self, engine_thread: EngineThread, settings: ServerSettings):
        self.engine_thread = engine_thread
        self.info = {name: text(value) for name, value in flat(settings).items()
                     if name in INFO_LABELS}

    def collect(self):
        info = InfoMetricFamily("moe_server", "The server's model and batching settings")
        info.add_metric([], self.info)
        yield info
        values = self.engine_thread.lifetime_readings()
        for name, kind, help, metrics in families():
            if (family := family_of(name, kind, help, metrics, values)) is not None:
                yield family


def metrics_registry(engine_thread: EngineThread, settings: ServerSettings) -> CollectorRegistry:
    """The families /metrics serves: the engine's, and the process's CPU seconds and resident
    memory. Served on --metrics-port and beside the HTTP API (server/frontends/http_api.py)."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine_thread, settings))
    ProcessCollector(registry=registry)
    return registry


def serve_metrics(registry: CollectorRegistry, host: str, port: int):
    """Starts the /metrics HTTP server; returns it (call .shutdown() to stop) and its port."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
