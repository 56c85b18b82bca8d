"""The engine's telemetry over one GetStats window, cumulative since the server started or the
last ResetStats: the counters and histograms records/engine_telemetry.py declares for it, and
the per-layer expert counts.

The batching loop records each step under the engine thread's lock; readers take a copy.
Expert-cache counters live in the cache (the engine thread owns them); a reset stores their
values as a baseline instead of writing across threads.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from records.engine_telemetry import (
    BY_NAME,
    ENGINE,
    HISTOGRAM,
    STAGE,
    Count,
    metrics_of,
    window_counters,
    zeros,
)
from server.engine.expert_cache import CacheCounters
from server.engine.interface import StepResult
from server.engine.stages import STAGES
from server.telemetry.exchange import ExchangeTotals
from server.telemetry.histogram import BucketHistogram
from server.telemetry.process import process_cpu_s

REQUEST_PHASES = ("queue", "prefill", "ttft", "tpot")
STAGE_BOUNDS = BY_NAME[STAGE, "ms"].bounds
# per finished request, the server's own times: received -> admitted, its prefill steps,
# received -> first token, and time per output token after the first (/metrics only)
REQUEST_BOUNDS = BY_NAME["", "request_ms"].bounds


@dataclass
class Telemetry:
    n_layers: int
    n_experts: int
    # a histogram's buckets other than its declared ones (batch_size: up to --max-batch-size)
    bounds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    counts: dict[str, float] = field(  # by declared name
        default_factory=lambda: zeros(window_counters()))
    histograms: dict[str, BucketHistogram] = field(default_factory=dict)  # by declared name
    stage_ms: dict[str, BucketHistogram] = field(default_factory=lambda: {
        s: BucketHistogram(STAGE_BOUNDS) for s in STAGES})
    request_ms: dict[str, BucketHistogram] = field(default_factory=lambda: {
        phase: BucketHistogram(REQUEST_BOUNDS) for phase in REQUEST_PHASES})
    expert_tokens: torch.Tensor = None  # [L, E] (token, expert) pairs routed
    dropped: torch.Tensor = None  # [L, E] pairs over capacity
    active_steps: torch.Tensor = None  # [L, E + 1] steps in which that many experts computed
    cache_baseline: list[CacheCounters] = field(default_factory=list)
    ranks: int = 1  # the engine's ranks (expert parallelism)
    exchange: ExchangeTotals | None = None  # with 2 ranks or more
    window_start_ns: int = field(default_factory=time.monotonic_ns)
    cpu_start_s: float = 0.0
    # expert weight bytes of the steps whose stages were timed: over expert_compute_ms, the
    # experts' bandwidth (on CUDA only sampled steps are timed)
    timed_expert_bytes: int = 0

    def __post_init__(self):
        self.histograms = self.histograms or {
            m.name: BucketHistogram(self.bounds.get(m.name, m.bounds)) for m in metrics_of(ENGINE)
            if m.kind == HISTOGRAM}
        shape = (self.n_layers, self.n_experts)
        self.expert_tokens = torch.zeros(shape, dtype=torch.long)
        self.dropped = torch.zeros(shape, dtype=torch.long)
        self.active_steps = torch.zeros(self.n_layers, self.n_experts + 1, dtype=torch.long)
        if self.ranks > 1 and self.exchange is None:
            self.exchange = ExchangeTotals(self.n_layers, self.ranks)
        self.cpu_start_s = process_cpu_s()

    def record_admitted(self, prompt_lengths: list[int]) -> None:
        self.counts[Count.REQUESTS_ADMITTED] += len(prompt_lengths)
        self.counts[Count.PROMPT_TOKENS] += sum(prompt_lengths)

    def record_step(self, result: StepResult, batch: int, generated: int, step_ms: float,
                    expert_bytes: int) -> None:
        """batch: sequences in the step; generated: tokens it produced (a prompt chunk that
        does not end its prompt produces none)."""
        counts, hists = self.counts, self.histograms
        counts[Count.STEPS] += 1
        counts[Count.TOKENS_GENERATED] += generated
        hists["batch_size"].record(batch)
        hists["tokens_per_step"].record(result.tokens)
        hists["step_ms"].record(step_ms)
        if result.stage_ms is not None:  # on CUDA, a sampled step (server/engine/stages.py)
            for stage, ms in result.stage_ms.items():
                self.stage_ms[stage].record(ms)
            counts[Count.EXPERT_COMPUTE_MS] += result.stage_ms.get("expert_compute", 0.0)
            self.timed_expert_bytes += sum(result.active) * expert_bytes
        if result.gpu_timed_ms:
            counts[Count.GPU_BUSY_MS] += result.gpu_busy_ms
            counts[Count.GPU_TIMED_MS] += result.gpu_timed_ms
            counts[Count.GPU_TIMED_STEPS] += 1
        counts[Count.KV_POSITIONS_USEFUL] += result.kv_useful
        counts[Count.KV_POSITIONS_COMPUTED] += result.kv_computed
        counts[Count.PREFILL_TOKENS] += result.prefill_tokens
        counts[Count.PREFILL_PADDED_TOKENS] += result.prefill_padded
        self.expert_tokens += result.routed
        if result.dropped is not None:
            self.dropped += result.dropped
        self.active_steps[torch.arange(self.n_layers), torch.tensor(result.active)] += 1
        counts[Count.EXPERT_BYTES_READ] += sum(result.active) * expert_bytes
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
        total.counts = {k: v + other.counts[k] for k, v in self.counts.items()}
        total.timed_expert_bytes = self.timed_expert_bytes + other.timed_expert_bytes
        for hists in ("histograms", "stage_ms", "request_ms"):
            setattr(total, hists, {k: h.plus(getattr(other, hists)[k])
                                   for k, h in getattr(self, hists).items()})
        for name in ("expert_tokens", "dropped", "active_steps"):
            setattr(total, name, getattr(self, name) + getattr(other, name))
        if self.exchange is not None:
            total.exchange = self.exchange.plus(other.exchange)
        return total

    def snapshot(self) -> Telemetry:
        """A copy the engine thread's next step does not change. Field by field, not deepcopy:
        it is taken under the engine thread's lock on every GetStats, and deepcopy of the
        tensors and histograms held the event loop and the engine for milliseconds."""
        copied = copy.copy(self)
        copied.counts = dict(self.counts)
        for hists in ("histograms", "stage_ms", "request_ms"):
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
