"""Engine telemetry, cumulative since start or the last reset, for GetStats and Prometheus;
and the optional per-step log.

The batching loop records each step under the engine thread's lock; readers take a copy.
Expert-cache counters live in the cache (the engine thread owns them); a reset stores their
values as a baseline instead of writing across threads.
"""

from __future__ import annotations

import bisect
import copy
import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import psutil
import torch

from server.engine.expert_cache import CacheCounters
from server.engine.stages import STAGES

log = logging.getLogger(__name__)

MS_BOUNDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
WRITE_BOUNDS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 25, 100)  # ms
COUNT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
REQUEST_PHASES = ("queue", "prefill", "ttft", "tpot")
# Telemetry's single histograms (its dicts of them: stage_ms, request_ms)
HISTOGRAMS = ("step_ms", "batch_size", "tokens_per_step", "write_ms")
COUNTERS = ("requests_admitted", "requests_finished", "requests_aborted", "requests_rejected",
            "tokens_generated", "prompt_tokens", "kv_positions_useful", "kv_positions_computed",
            "prefill_tokens", "prefill_padded_tokens", "expert_bytes_read", "expert_tokens",
            "dropped", "active_steps")


@dataclass
class Histogram:
    """Fixed-bucket histogram: counts[i] holds values <= bounds[i] (and above the previous
    bound); the last count holds values above every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    max: float = 0.0

    def __post_init__(self):
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def record(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        self.max = max(self.max, value)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.count, self.sum, self.max)

    def plus(self, other: Histogram) -> Histogram:
        return Histogram(self.bounds, [a + b for a, b in zip(self.counts, other.counts,
                                                             strict=True)],
                         self.count + other.count, self.sum + other.sum, max(self.max, other.max))


def count_bounds(limit: int) -> tuple[int, ...]:
    """Powers of two up to limit, and limit: buckets that fit a count that cannot exceed it."""
    return tuple(sorted({*(b for b in COUNT_BOUNDS if b < limit), limit}))


def imbalance(tokens: list[int]) -> tuple[float, float]:
    """(max / mean, coefficient of variation) of one layer's per-expert token counts. Plain
    Python: GetStats asks for it per layer on the event loop, where a tensor per call cost more
    than the arithmetic."""
    mean = sum(tokens) / len(tokens)
    if mean == 0:
        return 0.0, 0.0
    variance = sum((t - mean) ** 2 for t in tokens) / len(tokens)
    return max(tokens) / mean, math.sqrt(variance) / mean


PHASES = ("dispatch", "combine")
TIMES = ("measured", "exposed", "modelled")


@dataclass
class ExchangeTotals:
    """What the MoE layers' exchanges between ranks moved and took, summed over layers and
    steps: payload bytes per rank pair (dispatch and combine), their measured, exposed (the
    steps waited) and modelled (the link model) times, the (token, expert) pairs each rank's
    experts computed per layer, and the placements made."""

    n_layers: int
    ranks: int
    bytes: torch.Tensor = None  # [phase, source, destination]
    ms: dict[str, float] = field(default_factory=lambda: {f"{p}_{t}": 0.0 for p in PHASES
                                                          for t in TIMES})
    computed: torch.Tensor = None  # [L, W]
    exchanges: int = 0  # layer exchanges (MoE layers x steps)
    placements: int = 0
    experts_moved: int = 0

    def __post_init__(self):
        if self.bytes is None:
            self.bytes = torch.zeros(len(PHASES), self.ranks, self.ranks, dtype=torch.long)
        if self.computed is None:
            self.computed = torch.zeros(self.n_layers, self.ranks, dtype=torch.long)

    def record(self, comm: list, moved: int) -> None:
        for layer, x in enumerate(comm):
            self.bytes[0] += torch.tensor(x.dispatch_bytes)
            self.bytes[1] += torch.tensor(x.combine_bytes)
            self.computed[layer] += torch.tensor(x.computed)
            for phase in PHASES:
                for kind, times in (("measured", x.measured_ms), ("exposed", x.exposed_ms),
                                    ("modelled", x.modelled_ms)):
                    self.ms[f"{phase}_{kind}"] += times[phase]
        self.exchanges += len(comm)
        self.placements += moved > 0
        self.experts_moved += moved

    def copy(self) -> ExchangeTotals:
        return replace(self, bytes=self.bytes.clone(), ms=dict(self.ms),
                       computed=self.computed.clone())

    def plus(self, other: ExchangeTotals) -> ExchangeTotals:
        return ExchangeTotals(self.n_layers, self.ranks, self.bytes + other.bytes,
                              {k: v + other.ms[k] for k, v in self.ms.items()},
                              self.computed + other.computed, self.exchanges + other.exchanges,
                              self.placements + other.placements,
                              self.experts_moved + other.experts_moved)


@dataclass
class Telemetry:
    n_layers: int
    n_experts: int
    batch_bounds: tuple[int, ...] = COUNT_BOUNDS  # of batch_size: up to --max-batch-size
    requests_admitted: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    kv_positions_useful: int = 0  # decode attention: cached positions the tokens needed
    kv_positions_computed: int = 0  # ... and computed: padding to the longest, idle pool rows
    prefill_tokens: int = 0  # prompt tokens prefilled (chunks included)
    prefill_padded_tokens: int = 0  # padding the batched prefill attention added to them
    expert_bytes_read: int = 0  # expert weights the active experts read, summed over steps
    step_ms: Histogram = field(default_factory=lambda: Histogram(MS_BOUNDS))
    stage_ms: dict[str, Histogram] = field(default_factory=lambda: {s: Histogram(MS_BOUNDS)
                                                                    for s in STAGES})
    batch_size: Histogram = None
    tokens_per_step: Histogram = field(default_factory=lambda: Histogram(COUNT_BOUNDS))
    # each streamed message: stamped (server_elapsed_us) -> the transport accepted it
    write_ms: Histogram = field(default_factory=lambda: Histogram(WRITE_BOUNDS))
    # per finished request, the server's own times: received -> admitted, its prefill steps,
    # received -> first token, and time per output token after the first
    request_ms: dict[str, Histogram] = field(default_factory=lambda: {
        phase: Histogram(MS_BOUNDS) for phase in REQUEST_PHASES})
    expert_tokens: torch.Tensor = None  # [L, E] (token, expert) pairs routed
    dropped: torch.Tensor = None  # [L, E] pairs over capacity
    active_steps: torch.Tensor = None  # [L, E + 1] steps in which that many experts computed
    cache_baseline: list[CacheCounters] = field(default_factory=list)
    ranks: int = 1  # the engine's ranks (expert parallelism)
    exchange: ExchangeTotals | None = None  # with 2 ranks or more
    window_start_ns: int = field(default_factory=time.monotonic_ns)
    cpu_start_s: float = 0.0

    def __post_init__(self):
        self.batch_size = self.batch_size or Histogram(self.batch_bounds)
        shape = (self.n_layers, self.n_experts)
        self.expert_tokens = torch.zeros(shape, dtype=torch.long)
        self.dropped = torch.zeros(shape, dtype=torch.long)
        self.active_steps = torch.zeros(self.n_layers, self.n_experts + 1, dtype=torch.long)
        if self.ranks > 1 and self.exchange is None:
            self.exchange = ExchangeTotals(self.n_layers, self.ranks)
        self.cpu_start_s = process_cpu_s()

    def record_admitted(self, prompt_lengths: list[int]) -> None:
        self.requests_admitted += len(prompt_lengths)
        self.prompt_tokens += sum(prompt_lengths)

    def record_step(self, result, batch: int, generated: int, step_ms: float,
                    expert_bytes: int) -> None:
        """batch: sequences in the step; generated: tokens it produced (a prompt chunk that
        does not end its prompt produces none)."""
        self.tokens_generated += generated
        self.batch_size.record(batch)
        self.tokens_per_step.record(result.tokens)
        self.step_ms.record(step_ms)
        for stage, ms in result.stage_ms.items():
            self.stage_ms[stage].record(ms)
        self.kv_positions_useful += result.kv_useful
        self.kv_positions_computed += result.kv_computed
        self.prefill_tokens += result.prefill_tokens
        self.prefill_padded_tokens += result.prefill_padded
        self.expert_tokens += result.routed
        if result.dropped is not None:
            self.dropped += result.dropped
        self.active_steps[torch.arange(self.n_layers), torch.tensor(result.active)] += 1
        self.expert_bytes_read += sum(result.active) * expert_bytes
        if self.exchange is not None:
            self.exchange.record(result.comm, result.moved)

    def record_request(self, queue_ms: float, prefill_ms: float, ttft_ms: float,
                       tpot_ms: float | None) -> None:
        for phase, ms in zip(REQUEST_PHASES, (queue_ms, prefill_ms, ttft_ms, tpot_ms),
                             strict=True):
            if ms is not None:
                self.request_ms[phase].record(ms)

    def plus(self, other: Telemetry) -> Telemetry:
        """Every counter and histogram of both windows added: the lifetime figures /metrics
        reports (a ResetStats ends a window, never a Prometheus counter)."""
        total = copy.deepcopy(other)
        for name in COUNTERS:
            setattr(total, name, getattr(self, name) + getattr(other, name))
        for name in HISTOGRAMS:
            setattr(total, name, getattr(self, name).plus(getattr(other, name)))
        for hists in ("stage_ms", "request_ms"):
            setattr(total, hists, {k: h.plus(getattr(other, hists)[k])
                                   for k, h in getattr(self, hists).items()})
        if self.exchange is not None:
            total.exchange = self.exchange.plus(other.exchange)
        return total

    @property
    def steps(self) -> int:
        return self.step_ms.count

    @property
    def expert_compute_ms(self) -> float:
        return self.stage_ms["expert_compute"].sum

    def snapshot(self) -> Telemetry:
        """A copy the engine thread's next step does not change. Field by field, not deepcopy:
        it is taken under the engine thread's lock on every GetStats, and deepcopy of the tensors
        and histograms held the event loop and the engine for milliseconds."""
        copied = copy.copy(self)
        for name in HISTOGRAMS:
            setattr(copied, name, getattr(self, name).copy())
        for hists in ("stage_ms", "request_ms"):
            setattr(copied, hists, {k: h.copy() for k, h in getattr(self, hists).items()})
        for name in ("expert_tokens", "dropped", "active_steps"):
            setattr(copied, name, getattr(self, name).clone())
        copied.cache_baseline = [copy.copy(c) for c in self.cache_baseline]
        copied.exchange = self.exchange and self.exchange.copy()
        return copied

    @property
    def window_s(self) -> float:
        return (time.monotonic_ns() - self.window_start_ns) / 1e9

    @property
    def cpu_percent(self) -> float:
        """Process CPU over the window, in % of one core."""
        return 100 * (process_cpu_s() - self.cpu_start_s) / max(self.window_s, 1e-9)

    def cache_counters(self, live: list[CacheCounters]) -> list[CacheCounters]:
        """The cache's counters since the window started."""
        base = self.cache_baseline or [CacheCounters() for _ in live]
        return [since(now, before) for now, before in zip(live, base, strict=True)]


def since(now: CacheCounters, before: CacheCounters) -> CacheCounters:
    """Each counter's growth from before to now."""
    return CacheCounters(**{k: getattr(now, k) - getattr(before, k) for k in vars(now)})


def process_cpu_s() -> float:
    """User and system CPU seconds of this process, every thread's (the clock, not psutil: no
    /proc read on the event loop)."""
    return time.process_time()


@functools.cache
def this_process(pid: int) -> psutil.Process:
    """psutil's handle on a process, made once: making one reads /proc several times."""
    return psutil.Process(pid)


def process_rss_bytes() -> int:
    return this_process(os.getpid()).memory_info().rss


class GpuStats(NamedTuple):
    utilization_percent: float  # -1: unknown (no GPU, no NVML, or NVML cannot say)
    allocated_bytes: int  # held by tensors
    reserved_bytes: int  # held by torch's caching allocator, allocated or not


def gpu_stats(device: torch.device) -> GpuStats:
    """The engine's GPU; (-1, 0, 0) where there is none. NVML failing (not installed, or
    NotSupported under MIG: pynvml's errors are not RuntimeErrors) leaves the utilisation
    unknown and the rest of the telemetry served."""
    if device.type != "cuda":
        return GpuStats(-1.0, 0, 0)
    try:
        utilization = float(torch.cuda.utilization(device))
    except Exception as exc:  # pynvml.NVMLError and friends, whichever package provides them
        log_once(f"GPU utilisation unknown: NVML said {type(exc).__name__}: {exc}")
        utilization = -1.0
    return GpuStats(utilization, torch.cuda.memory_allocated(device),
                    torch.cuda.memory_reserved(device))


@functools.cache
def log_once(message: str) -> None:
    log.warning("%s", message)


class StepLog:
    """One JSON line per engine step (--step-log): wall and monotonic timestamps, so steps
    line up with a load generator's records on the same host."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)

    def write(self, step: int, result, batch: int, admitted: int) -> None:
        record = {"t_unix_s": time.time(), "t_monotonic_s": time.monotonic(), "step": step,
                  "batch": batch, "admitted": admitted, "tokens": result.tokens,
                  "stage_ms": {k: round(v, 4) for k, v in result.stage_ms.items()},
                  "active_experts": result.active, "expert_tokens": result.routed.tolist()}
        if result.dropped is not None:
            record["dropped"] = int(result.dropped.sum())
        if result.comm:  # experts over ranks: each layer's exchange, and who routed where
            record["routed_by_rank"] = result.routed_by_rank.tolist()
            record["exchanges"] = [{"dispatch_bytes": x.dispatch_bytes,
                                    "combine_bytes": x.combine_bytes, "computed": x.computed,
                                    "measured_ms": x.measured_ms, "exposed_ms": x.exposed_ms,
                                    "modelled_ms": x.modelled_ms} for x in result.comm]
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.file.close()
