"""GetStats snapshots as the load generator writes them (summary.json's `server.start` and
`server.end`, each line of server_stats.jsonl): the EngineStats message of proto/moe.proto as
JSON, 64-bit counters as numbers and `expert_tokens` as [layer][expert].

Fields take protobuf's defaults when absent (a snapshot from before a field existed), except
`gpu_utilization_percent`, whose absence means unknown (-1). Fields added to the message since
are kept in `extra`. A snapshot the load generator could not take holds only `error`.
tests/test_records.py checks every field here against the proto.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from records.declare import cast, leaves, text
from records.jsonform import field
from records.server_settings import ServerSettings


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """Fixed buckets: counts[i] holds values <= bounds[i] (and above bounds[i - 1]); the last
    count, values above every bound."""

    bounds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    max: float = 0.0


@dataclass(frozen=True)
class BucketStats:
    """What a Histogram gained between two snapshots, for its readers (not a file's record)."""

    count: int
    mean: float
    p50: float  # the bound of the bucket the percentile falls in (ms)
    p99: float


def bucket_stats(now: Histogram | None, before: Histogram | None) -> BucketStats | None:
    """The histogram's growth from before to now; None without any value."""
    if now is None:
        return None
    before = before or Histogram(bounds=now.bounds, counts=[0] * len(now.counts))
    counts = [a - b for a, b in zip(now.counts, before.counts or [0] * len(now.counts),
                                    strict=True)]
    n = sum(counts)
    if n <= 0:
        return None
    bounds = [*now.bounds, now.max]

    def at(q: float) -> float:
        seen = 0
        for bound, c in zip(bounds, counts, strict=True):
            seen += c
            if seen >= q * n:
                return bound
        return bounds[-1]

    return BucketStats(n, (now.sum - before.sum) / n, at(0.5), at(0.99))


@dataclass(frozen=True, kw_only=True)
class StageTime:
    stage: str
    ms: Histogram | None = None


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_copied: int = 0
    copy_ms: float = 0.0
    wait_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class LayerStats:
    OPEN: ClassVar[bool] = True  # fields of a newer server are kept in `extra`

    # (token, expert) pairs routed, per expert
    expert_tokens: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # pairs over capacity, per expert
    imbalance_max_over_mean: float = 0.0
    imbalance_cv: float = 0.0
    # [a] = steps in which a experts computed
    active_experts_steps: list[int] = field(default_factory=list)
    cache: CacheStats | None = field(None, omit=None)
    # with --ep: (token, expert) pairs each rank's experts computed
    rank_pairs: list[int] = field(default_factory=list, omit=[])
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FaultCounts:
    """What the server's --fault-* settings injected since it started."""

    steps_failed: int = 0
    stalls: int = 0
    stall_s: float = 0.0
    streams_dropped: int = 0
    requests_slowed: int = 0
    active: bool = False  # the fault window was open at the snapshot

    @property
    def injected(self) -> int:
        return self.steps_failed + self.stalls + self.streams_dropped + self.requests_slowed


@dataclass(frozen=True, kw_only=True)
class RankPair:
    source: int = 0
    destination: int = 0
    dispatch_bytes: int = 0  # hidden states sent to the destination's experts
    combine_bytes: int = 0  # their outputs sent back


@dataclass(frozen=True, kw_only=True)
class ExpertParallelStats:
    """The MoE layers' exchanges between the engine's ranks (--ep), summed over layers and
    steps; times in ms: measured, exposed (the steps waited for them), modelled (the link)."""

    ranks: int = 0
    pairs: list[RankPair] = field(default_factory=list)
    dispatch_ms: float = 0.0
    combine_ms: float = 0.0
    dispatch_exposed_ms: float = 0.0
    combine_exposed_ms: float = 0.0
    dispatch_modelled_ms: float = 0.0
    combine_modelled_ms: float = 0.0
    exchanges: int = 0  # MoE layers x steps
    placements: int = 0
    experts_moved: int = 0


@dataclass(frozen=True, kw_only=True)
class ServerStats:
    OPEN: ClassVar[bool] = True  # fields of a newer server are kept in `extra`
    # A snapshot that could not be taken is written as its error alone.
    ALONE: ClassVar[str] = "error"

    error: str = field("", omit="")  # why the snapshot could not be taken; nothing else is set then
    policy: str = ""
    preset: str = ""
    device: str = ""
    dtype: str = ""
    uptime_s: float = 0.0
    window_s: float = 0.0  # since start or the last ResetStats
    requests_admitted: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    steps: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_slots_in_use: int = 0
    kv_slots_total: int = 0
    mean_batch_size: float = 0.0
    num_layers: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_tokens: list[list[int]] = field(default_factory=list)  # [layer][expert]
    max_batch_size: int = 0
    max_seq_len: int = 0
    step_time_mean_ms: float = 0.0
    router: str = ""
    routing_skew: str = ""
    capacity_factor: float = 0.0  # 0 = dropless
    moe_kernel: str = ""
    expert_cache: int = 0
    cache_policy: str = ""
    layers: list[LayerStats] = field(default_factory=list)
    stages: list[StageTime] = field(default_factory=list)
    step_ms: Histogram | None = field(None, omit=None)
    batch_size: Histogram | None = field(None, omit=None)
    tokens_per_step: Histogram | None = field(None, omit=None)
    kv_positions_useful: int = 0
    kv_positions_computed: int = 0
    expert_bytes_read: int = 0
    expert_compute_ms: float = 0.0
    expert_bandwidth_gb_s: float = 0.0
    process_cpu_percent: float = 0.0
    process_rss_bytes: int = 0
    gpu_utilization_percent: float = -1.0  # -1: unknown
    gpu_memory_bytes: int = 0
    gpu_memory_reserved_bytes: int = field(0, omit=0)  # absent before GetStats had it
    prefill_tokens: int = 0
    prefill_padded_tokens: int = 0
    policy_knobs: dict[str, float] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict, omit={})  # absent before GetStats had it
    faults: FaultCounts | None = field(None, omit=None)  # absent before GetStats had it
    expert_parallel: ExpertParallelStats | None = field(None, omit=None)  # with --ep 2 or more
    hidden_size: int = field(0, omit=0)  # the model's D; 0 from a server older than the field
    # each streamed message: stamped -> the transport took it (absent from older servers)
    write_ms: Histogram | None = field(None, omit=None)
    # freed heap handed back between steps since the server started (absent from older servers)
    heap_trims: int = field(0, omit=0)
    heap_trim_ms: float = field(0.0, omit=0.0)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.error

    def stage(self, name: str) -> Histogram | None:
        return next((s.ms for s in self.stages if s.stage == name), None)

    def cache_total(self, counter: str) -> float:
        """One expert-cache counter summed over the layers; 0 without a cache."""
        return sum(getattr(layer.cache, counter) for layer in self.layers
                   if layer.cache is not None)

    def reported_settings(self) -> dict[str, str]:
        """Every setting the server reported, name -> text: its `settings` map, or for a server
        older than the map, the fields that carried settings (capacity_factor 0 = unset)."""
        if self.settings:
            return dict(self.settings)
        kinds = {leaf.name: leaf.kind for leaf in leaves(ServerSettings)}
        values = {name: getattr(self, key) for name, key in OLDER_FIELDS.items()
                  if getattr(self, key) != ""}
        values["capacity_factor"] = self.capacity_factor or None
        return {name: text(cast(kinds[name], value)) for name, value in values.items()}


# The EngineStats fields that carried a setting before GetStats had its `settings` map.
OLDER_FIELDS = {"policy": "policy", "preset": "preset", "device": "device", "dtype": "dtype",
                "max_batch_size": "max_batch_size", "kv_slots": "kv_slots_total",
                "router": "router", "routing_skew": "routing_skew", "moe_kernel": "moe_kernel",
                "expert_cache": "expert_cache", "cache_policy": "cache_policy"}


@dataclass(frozen=True, kw_only=True)
class ServerSample:
    """A line of server_stats.jsonl: GetStats every --interval-s, on the load generator's clock."""

    t_unix_s: float
    t_run_s: float  # seconds after the run started
    stats: ServerStats
    # the load generator's resident memory at the sample (its processes); absent: not recorded
    generator_rss_bytes: int = field(0, omit=0)
