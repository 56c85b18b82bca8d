"""GetStats snapshots as the load generator writes them (summary.json's `server.start` and
`server.end`, each line of server_stats.jsonl): the EngineStats message of proto/moe.proto as
JSON, 64-bit counters as numbers and `expert_tokens` as [layer][expert].

The telemetry fields of each record (counters, gauges, histograms) are those the engine's
telemetry declares for its message (records/engine_telemetry.py), added by `with_metrics`; a
record's own body holds the rest: the settings the server reports, the model's shape, the parts
it is made of. Fields take protobuf's defaults when absent (a snapshot from before a field
existed), except where the declaration says otherwise (`gpu_utilization_percent`: -1, unknown).
Fields added to the message since are kept in `extra`. A snapshot the load generator could not
take holds only `error`. tests/test_records.py checks every field here against the proto.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from records.declare import cast, leaves, named, text
from records.engine_telemetry import (
    CACHE,
    ENGINE,
    EXCHANGE,
    FAULTS,
    HISTOGRAM,
    LAYER,
    PAIR,
    STAGE,
    Metric,
    metrics_of,
)
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


def _field_of(m: Metric):
    """The record field a metric gets: its type and its default (and what is written as
    nothing)."""
    if m.kind == HISTOGRAM:
        return Histogram | None, field(None, omit=None)
    if m.own_dims:
        return list[m.scalar], field(default_factory=list, **({"omit": []} if m.sparse else {}))
    default = m.scalar(m.absent)
    return m.scalar, field(default, **({"omit": default} if m.sparse else {}))


def with_metrics(message: str):
    """Adds to a record a field for every metric GetStats's `message` carries, after the
    fields the record declares itself (and before `extra`)."""
    def add(cls):
        own = dict(cls.__dict__.get("__annotations__", {}))
        extra = own.pop("extra", None)
        for m in metrics_of(message):
            own[m.name], default = _field_of(m)
            setattr(cls, m.name, default)
        if extra is not None:
            own["extra"] = extra
        cls.__annotations__ = own
        return cls
    return add


@dataclass(frozen=True, kw_only=True)
@with_metrics(STAGE)
class StageTime:
    stage: str


@dataclass(frozen=True, kw_only=True)
@with_metrics(CACHE)
class CacheStats:
    """One MoE layer's expert cache."""


@dataclass(frozen=True, kw_only=True)
@with_metrics(LAYER)
class LayerStats:
    OPEN: ClassVar[bool] = True  # fields of a newer server are kept in `extra`

    cache: CacheStats | None = field(None, omit=None)  # with --expert-cache
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
@with_metrics(FAULTS)
class FaultCounts:
    """What the server's --fault-* settings injected since it started."""

    @property
    def injected(self) -> int:
        return self.steps_failed + self.stalls + self.streams_dropped + self.requests_slowed


@dataclass(frozen=True, kw_only=True)
@with_metrics(PAIR)
class RankPair:
    source: int = 0
    destination: int = 0


@dataclass(frozen=True, kw_only=True)
@with_metrics(EXCHANGE)
class ExpertParallelStats:
    """The MoE layers' exchanges between the engine's ranks (--ep), summed over layers and
    steps; times in ms: measured, exposed (the steps waited for them), modelled (the link)."""

    pairs: list[RankPair] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
@with_metrics(ENGINE)
class ServerStats:
    OPEN: ClassVar[bool] = True  # fields of a newer server are kept in `extra`
    # A snapshot that could not be taken is written as its error alone.
    ALONE: ClassVar[str] = "error"

    error: str = field("", omit="")  # why the snapshot could not be taken; nothing else is set then
    # the settings the server runs with (all of them in `settings`; the older fields carry some)
    policy: str = ""
    preset: str = ""
    device: str = ""
    dtype: str = ""
    max_batch_size: int = 0
    router: str = ""
    routing_skew: str = ""
    capacity_factor: float = 0.0  # 0 = dropless
    moe_kernel: str = ""
    expert_cache: int = 0
    cache_policy: str = ""
    policy_knobs: dict[str, float] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict, omit={})  # absent before GetStats had it
    # the model's shape
    num_layers: int = 0
    num_experts: int = 0
    top_k: int = 0
    max_seq_len: int = 0
    hidden_size: int = field(0, omit=0)  # the model's D; 0 from a server older than the field
    # the parts: per MoE layer (and the layers' routed tokens again, [layer][expert], as older
    # readers take them), per stage, faults, the exchanges between ranks (with --ep 2 or more)
    layers: list[LayerStats] = field(default_factory=list)
    expert_tokens: list[list[int]] = field(default_factory=list)
    stages: list[StageTime] = field(default_factory=list)
    faults: FaultCounts | None = field(None, omit=None)  # absent before GetStats had it
    expert_parallel: ExpertParallelStats | None = field(None, omit=None)
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
named(ServerSettings, *OLDER_FIELDS)  # each a declared setting, or the import fails


@dataclass(frozen=True, kw_only=True)
class ServerSample:
    """A line of server_stats.jsonl: GetStats every --interval-s, on the load generator's clock."""

    t_unix_s: float
    t_run_s: float  # seconds after the run started
    stats: ServerStats
    # the load generator's resident memory at the sample (its processes); absent: not recorded
    generator_rss_bytes: int = field(0, omit=0)
