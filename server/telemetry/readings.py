"""Every declared metric's value at one reading (records/engine_telemetry.py), by name, for the
GetStats reply (a window's figures) and for /metrics (the figures since the server started):
the window's counters and histograms pass through by name; gauges, per-layer figures, the
expert cache, faults, heap trims and the exchanges between ranks are read here.

A value is a number, a Histogram, or for a metric with dims nested lists (dicts by name for
stages and phases) outermost dim first; None where the server has none (no expert cache, one
rank, no GPU, a rank's exchange with itself). tests/test_engine_telemetry.py checks that every
declared metric has a reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from records.engine_telemetry import CACHE, EXCHANGE, FAULTS, PAIR, Count, metrics_of
from records.server_stats import FaultCounts
from server.engine.expert_cache import CacheCounters
from server.telemetry.process import GpuStats, process_rss_bytes
from server.telemetry.window import Telemetry


@dataclass(frozen=True)
class Now:
    """The engine's gauges and since-start figures when the reading is taken."""

    running: int  # resident: holding a KV slot
    waiting: int
    kv_slots_in_use: int
    kv_slots_total: int
    prefix_cache_blocks: int  # distinct blocks the prefix cache can serve (0 without one)
    uptime_s: float
    gpu: GpuStats
    heap_trims: int  # since the server started (server/scheduling/heap.py)
    heap_trim_ms: float
    faults: FaultCounts  # since the server started (server/scheduling/faults.py)


def imbalance(tokens: list[int]) -> tuple[float, float]:
    """(max / mean, coefficient of variation) of one layer's per-expert token counts. Plain
    Python: GetStats asks for it per layer on the event loop, where a tensor per call cost more
    than the arithmetic."""
    mean = sum(tokens) / len(tokens)
    if mean == 0:
        return 0.0, 0.0
    variance = sum((t - mean) ** 2 for t in tokens) / len(tokens)
    return max(tokens) / mean, math.sqrt(variance) / mean


def readings(t: Telemetry, cache: list[CacheCounters], now: Now) -> dict[str, object]:
    """t: the window's telemetry (or the lifetime's); cache: each layer's expert-cache counters
    over the same span, empty without a cache."""
    counts, hists, gpu = t.counts, t.histograms, now.gpu
    tokens = t.expert_tokens.tolist()
    balance = [imbalance(row) for row in tokens]
    compute_ms = counts[Count.EXPERT_COMPUTE_MS]
    return {
        **counts, **hists,
        "uptime_s": now.uptime_s, "window_s": t.window_s,
        "running": now.running, "waiting": now.waiting, "kv_slots_in_use": now.kv_slots_in_use,
        "kv_slots_total": now.kv_slots_total, "prefix_cache_blocks": now.prefix_cache_blocks,
        "mean_batch_size": hists["batch_size"].mean, "step_time_mean_ms": hists["step_ms"].mean,
        "expert_bandwidth_gb_s": (t.timed_expert_bytes / compute_ms / 1e6 if compute_ms
                                  else 0.0),
        "process_cpu_percent": t.cpu_percent, "process_rss_bytes": process_rss_bytes(),
        "gpu_utilization_percent": (gpu.utilization_percent if gpu.utilization_percent >= 0
                                    else None),
        "gpu_memory_bytes": gpu.allocated_bytes if gpu.reserved_bytes else None,
        "gpu_memory_reserved_bytes": gpu.reserved_bytes or None,
        "heap_trims": now.heap_trims, "heap_trim_ms": now.heap_trim_ms,
        "ms": t.stage_ms, "request_ms": t.request_ms,
        "expert_tokens": tokens, "dropped": t.dropped.tolist(),
        "imbalance_max_over_mean": [b[0] for b in balance],
        "imbalance_cv": [b[1] for b in balance],
        "active_experts_steps": t.active_steps.tolist(),
        **{m.name: [getattr(c, m.name) for c in cache] if cache else None
           for m in metrics_of(CACHE)},
        **{m.name: getattr(now.faults, m.name) for m in metrics_of(FAULTS)},
        **exchange_readings(t),
    }


def exchange_readings(t: Telemetry) -> dict[str, object]:
    """The exchanges between ranks: their counts, the pairs each rank's experts computed per
    layer and the bytes per ordered pair of ranks; None for all with one rank."""
    x = t.exchange
    if x is None:
        return {m.name: None for m in (*metrics_of(EXCHANGE), *metrics_of(PAIR))} | {
            "rank_pairs": None}

    def between(phase: int) -> list[list[int | None]]:
        sent = x.bytes[phase].tolist()
        return [[None if s == d else n for d, n in enumerate(row)] for s, row in enumerate(sent)]

    return {**x.counts, "ranks": x.ranks, "rank_pairs": x.computed.tolist(),
            "dispatch_bytes": between(0), "combine_bytes": between(1)}
