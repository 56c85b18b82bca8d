"""The engine's telemetry declared once: every counter, gauge and histogram the server keeps,
with its name, kind, unit and help, the GetStats message that carries it and the Prometheus
family that exports it.

From this declaration come the counters the server's telemetry window holds
(server/telemetry/window.py), the GetStats reply (server/frontends/getstats.py), the /metrics
families (server/frontends/prometheus.py), the fields of the run directory's GetStats records
(records/server_stats.py) and the analysis's counters over a run and over time
(analysis/readers/server_stats.py, samples.py). tests/test_engine_telemetry.py checks it against
proto/moe.proto, the wire contract, which declares the fields by hand. A new counter is one
entry here, a field in the proto, its increment and a test (docs/design.md, "Adding a counter").

Names are the GetStats field names, their unit last (`_ms`, `_bytes`); Prometheus families
carry their own names, in seconds where the unit is ms. A metric with `dims` holds one value
per combination of those labels (per layer and expert, say): in GetStats each message of a
repeated message holds its share (a LayerStats per layer), in Prometheus each value is a sample
labelled by its indices. Metrics sharing a family tell their samples apart by fixed `labels`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum


class Stage(StrEnum):
    """The stages of an engine step, in order (server/engine/stages.py times them)."""

    PREPROCESS = "preprocess"
    ATTENTION = "attention"
    ROUTING = "routing"
    DISPATCH = "dispatch"  # tokens to their experts' ranks (expert parallelism)
    EXPERT_COMPUTE = "expert_compute"
    COMBINE = "combine"  # ... and back
    DECODE = "decode"

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# The GetStats messages (proto/moe.proto) metrics sit in; "" = /metrics only.
ENGINE = "EngineStats"
LAYER = "LayerStats"  # one per MoE layer
CACHE = "CacheStats"  # one per MoE layer, with --expert-cache
STAGE = "StageTime"  # one per stage of the engine step
FAULTS = "FaultCounts"
EXCHANGE = "ExpertParallelStats"  # with --ep 2 or more
PAIR = "RankPair"  # one per ordered pair of distinct ranks
MESSAGES = (ENGINE, LAYER, CACHE, STAGE, FAULTS, EXCHANGE, PAIR)
# what indexes the messages that repeat, in GetStats (the rest of a metric's dims are its own)
INDEXED_BY = {LAYER: ("layer",), CACHE: ("layer",), STAGE: ("stage",),
              PAIR: ("source", "destination")}

# Units whose values are not whole numbers (floats in GetStats and in the run directory).
FRACTIONAL = {"ms", "s", "percent", "ratio", "GB/s"}
# Histogram bucket bounds (part of the contract: GetStats sends them with the counts)
MS_BOUNDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
WRITE_BOUNDS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 25, 100)  # ms
COUNT_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Metric:
    name: str  # its field in GetStats's `message`, and its key in the run directory
    kind: str  # COUNTER (only grows, until a reset), GAUGE (a value now) or HISTOGRAM
    unit: str
    help: str  # one line; Prometheus's HELP where it has a family of its own
    message: str = ENGINE
    family: str = ""  # the Prometheus family ("moe_..."); "" = not exported
    labels: tuple[tuple[str, str], ...] = ()  # fixed labels, where metrics share a family
    dims: tuple[str, ...] = ()  # labels of its many values, outermost first
    window: bool = True  # False: since the server started (ResetStats leaves it alone)
    sparse: bool = False  # left out of the run directory while zero (GetStats gained it late)
    absent: float = 0  # its value in a snapshot that lacks it
    bounds: tuple[float, ...] = ()  # a histogram's buckets

    @property
    def fractional(self) -> bool:
        return self.unit in FRACTIONAL

    @property
    def scalar(self) -> type:
        """The Python type of one of its values (a histogram's: of its counts)."""
        return bool if self.unit == "bool" else float if self.fractional else int

    @property
    def scale(self) -> float:
        """Our unit to Prometheus's base unit: ms are exported as seconds."""
        return 1e-3 if self.unit == "ms" else 1.0

    @property
    def own_dims(self) -> tuple[str, ...]:
        """The dims inside one message of its GetStats message (a LayerStats' experts)."""
        return self.dims[len(INDEXED_BY.get(self.message, ())):]


def _outcome(name: str, help: str) -> Metric:
    return Metric(f"requests_{name}", COUNTER, "requests", help, family="moe_requests",
                  labels=(("outcome", name),))


def _fault(name: str, help: str) -> Metric:
    return Metric(name, COUNTER, "faults", help, FAULTS, "moe_faults_injected",
                  (("kind", name),), window=False)


def _exchange_ms(phase: str, kind: str, name: str) -> Metric:
    return Metric(name, COUNTER, "ms", f"the {phase}es' {kind} time, summed over layers and "
                  "steps", EXCHANGE, "moe_ep_exchange_seconds", (("phase", phase), ("kind", kind)))


def _cache(name: str, unit: str, family: str) -> Metric:
    return Metric(name, COUNTER, unit, f"Expert cache {family.replace('_', ' ')}", CACHE,
                  f"moe_cache_{family}", dims=("layer",))


METRICS: tuple[Metric, ...] = (
    # --- requests and tokens, over the window ---
    _outcome("admitted", "entered the running batch"),
    _outcome("finished", "completed with LENGTH or STOP"),
    _outcome("aborted", "cancelled, deadline passed, or aborted by the server"),
    _outcome("rejected", "refused: invalid input or full queue"),
    Metric("steps", COUNTER, "steps", "Engine steps", family="moe_steps"),
    Metric("tokens_generated", COUNTER, "tokens", "Output tokens", family="moe_tokens_generated"),
    Metric("prompt_tokens", COUNTER, "tokens", "Prompt tokens of the requests admitted",
           family="moe_prompt_tokens"),
    Metric("kv_positions_useful", COUNTER, "positions",
           "Decode attention: cached positions needed", family="moe_kv_positions_useful"),
    Metric("kv_positions_computed", COUNTER, "positions",
           "Decode attention: positions computed, padding included",
           family="moe_kv_positions_computed"),
    Metric("prefill_tokens", COUNTER, "tokens", "Prompt tokens prefilled, chunk by chunk",
           family="moe_prefill_tokens"),
    Metric("prefill_padded_tokens", COUNTER, "tokens",
           "Padding added by batched prefill attention", family="moe_prefill_padded_tokens"),
    Metric("expert_bytes_read", COUNTER, "bytes", "Weight bytes of the experts that computed",
           family="moe_expert_bytes_read"),
    Metric("expert_compute_ms", COUNTER, "ms", "Time in expert compute",
           family="moe_expert_compute_seconds"),
    Metric("prefix_cache_queries", COUNTER, "tokens", "Prompt tokens of the requests admitted, "
           "looked up in the prefix cache (with it off too: none hit)",
           family="moe_prefix_cache_queries", sparse=True),
    Metric("prefix_cache_hits", COUNTER, "tokens", "Prompt tokens found in the prefix cache: "
           "the prefill they saved", family="moe_prefix_cache_hits", sparse=True),
    Metric("prefix_cache_copied", COUNTER, "tokens", "Prefix-cache hits copied from a slot in "
           "use (the rest were kept in place)", family="moe_prefix_cache_copied", sparse=True),
    Metric("prefix_cache_evictions", COUNTER, "blocks", "Prefix-cache blocks forgotten: their "
           "slot taken by a new sequence, or past --prefix-cache-tokens",
           family="moe_prefix_cache_evictions", sparse=True),
    Metric("gpu_busy_ms", COUNTER, "ms", "GPU work in the steps timed for it (on CUDA: graph "
           "replays, and eager steps sampled with their kernels queued ahead)",
           family="moe_gpu_busy_seconds", sparse=True),
    Metric("gpu_timed_ms", COUNTER, "ms", "The time those steps took (a replayed step's wall "
           "time, a sampled step's longer of GPU work and host launching): gpu_busy_ms / "
           "gpu_timed_ms is the share of a step the GPU was busy, the rest it waited for the host",
           family="moe_gpu_timed_seconds", sparse=True),
    Metric("gpu_timed_steps", COUNTER, "steps", "Steps timed for GPU busy",
           family="moe_gpu_timed_steps", sparse=True),
    Metric("plans_held_back", COUNTER, "plans", "Plans that left work out: a request kept "
           "waiting or a running one not run this step (by the policy's choice, or a full batch "
           "or KV pool); 0 means every request ran at the first step it could, so every "
           "continuous-batching policy would have planned the same steps",
           family="moe_plans_held_back", sparse=True, absent=-1),
    # --- the engine now ---
    Metric("uptime_s", GAUGE, "s", "since the server started"),
    Metric("window_s", GAUGE, "s", "since the server started or the last ResetStats"),
    Metric("running", GAUGE, "requests", "Requests in the running batch", family="moe_running"),
    Metric("waiting", GAUGE, "requests", "Requests waiting", family="moe_waiting"),
    Metric("kv_slots_in_use", GAUGE, "slots", "KV cache pool slots held",
           family="moe_kv_slots_in_use"),
    Metric("kv_slots_total", GAUGE, "slots", "KV cache pool slots", family="moe_kv_slots"),
    Metric("prefix_cache_blocks", GAUGE, "blocks", "Distinct prefix blocks the prefix cache "
           "can serve now", family="moe_prefix_cache_blocks", sparse=True),
    Metric("mean_batch_size", GAUGE, "ratio", "requests per step, averaged over the window"),
    Metric("step_time_mean_ms", GAUGE, "ms", "mean wall time of one engine step"),
    Metric("expert_bandwidth_gb_s", GAUGE, "GB/s", "expert_bytes_read / expert_compute_ms"),
    Metric("process_cpu_percent", GAUGE, "percent",
           "server process CPU over the window, % of one core"),
    Metric("process_rss_bytes", GAUGE, "bytes", "resident memory of the server process"),
    Metric("gpu_utilization_percent", GAUGE, "percent", "GPU utilisation",
           family="moe_gpu_utilization_percent", absent=-1.0),
    Metric("gpu_memory_bytes", GAUGE, "bytes", "GPU memory allocated by torch's tensors",
           family="moe_gpu_memory_bytes"),
    Metric("gpu_memory_reserved_bytes", GAUGE, "bytes",
           "GPU memory held by torch's caching allocator, allocated or not",
           family="moe_gpu_memory_reserved_bytes", sparse=True),
    Metric("heap_trims", COUNTER, "trims", "Freed heap memory handed back to the system "
           "between steps (--heap-trim-s)", family="moe_heap_trims", window=False, sparse=True),
    Metric("heap_trim_ms", COUNTER, "ms", "Engine time spent handing freed heap memory back",
           family="moe_heap_trim_seconds", window=False, sparse=True),
    # --- histograms over the window ---
    Metric("step_ms", HISTOGRAM, "ms", "Engine step wall time", family="moe_step_seconds",
           bounds=MS_BOUNDS),
    Metric("batch_size", HISTOGRAM, "requests", "Requests per step", family="moe_batch_size",
           bounds=COUNT_BOUNDS),
    Metric("tokens_per_step", HISTOGRAM, "tokens", "Tokens per forward pass",
           family="moe_tokens_per_step", bounds=COUNT_BOUNDS),
    Metric("write_ms", HISTOGRAM, "ms", "Streamed messages: stamped -> the transport accepted "
           "it (the server's part of the delivery lag)", family="moe_write_seconds",
           bounds=WRITE_BOUNDS),
    Metric("ms", HISTOGRAM, "ms", "Engine step time by stage", STAGE, "moe_stage_seconds",
           dims=("stage",), bounds=MS_BOUNDS),
    Metric("request_ms", HISTOGRAM, "ms", "Finished requests, the server's own times: queue "
           "(received -> admitted), prefill, ttft (received -> first token), tpot (per token "
           "after the first)", "", "moe_request_seconds", dims=("phase",), bounds=MS_BOUNDS),
    # --- each MoE layer ---
    Metric("expert_tokens", COUNTER, "pairs", "(token, expert) pairs routed", LAYER,
           "moe_expert_tokens", dims=("layer", "expert")),
    Metric("dropped", COUNTER, "pairs", "Pairs over expert capacity", LAYER, "moe_dropped",
           dims=("layer", "expert")),
    Metric("imbalance_max_over_mean", GAUGE, "ratio",
           "of expert_tokens: 1 = perfectly balanced", LAYER, dims=("layer",)),
    Metric("imbalance_cv", GAUGE, "ratio", "coefficient of variation of expert_tokens", LAYER,
           dims=("layer",)),
    Metric("active_experts_steps", COUNTER, "steps", "Steps in which n experts computed", LAYER,
           "moe_active_experts_steps", dims=("layer", "experts")),
    Metric("rank_pairs", COUNTER, "pairs", "(token, expert) pairs each rank's experts computed",
           LAYER, "moe_ep_rank_pairs", dims=("layer", "rank"), sparse=True),
    _cache("hits", "lookups", "hits"),
    _cache("misses", "lookups", "misses"),
    _cache("evictions", "experts", "evictions"),
    _cache("bytes_copied", "bytes", "bytes_copied"),
    _cache("copy_ms", "ms", "copy_seconds"),
    Metric("wait_ms", COUNTER, "ms", "compute waiting for copies (equals copy_ms: copies are "
           "not overlapped)", CACHE, dims=("layer",)),
    # --- faults injected (--fault-*), since the server started ---
    _fault("steps_failed", "engine steps failed on purpose"),
    _fault("stalls", "engine stalls"),
    Metric("stall_s", COUNTER, "s", "the stalls' total length", FAULTS, window=False),
    _fault("streams_dropped", "streams cut after their first message"),
    _fault("requests_slowed", "requests whose messages were held back"),
    Metric("active", GAUGE, "bool", "1 while the fault window is open", FAULTS,
           "moe_faults_active", window=False),
    # --- the exchanges between expert-parallel ranks ---
    Metric("ranks", GAUGE, "ranks", "the engine's ranks", EXCHANGE),
    _exchange_ms("dispatch", "measured", "dispatch_ms"),
    _exchange_ms("combine", "measured", "combine_ms"),
    _exchange_ms("dispatch", "exposed", "dispatch_exposed_ms"),
    _exchange_ms("combine", "exposed", "combine_exposed_ms"),
    _exchange_ms("dispatch", "modelled", "dispatch_modelled_ms"),
    _exchange_ms("combine", "modelled", "combine_modelled_ms"),
    Metric("exchanges", COUNTER, "exchanges", "layer exchanges counted (MoE layers x steps)",
           EXCHANGE),
    Metric("placements", COUNTER, "placements", "balanced placements made", EXCHANGE),
    Metric("experts_moved", COUNTER, "slots", "Expert slots a re-placement changed", EXCHANGE,
           "moe_ep_experts_moved"),
    Metric("dispatch_bytes", COUNTER, "bytes", "tokens' hidden states sent to the "
           "destination's experts", PAIR, "moe_ep_bytes", (("phase", "dispatch"),),
           ("source", "destination")),
    Metric("combine_bytes", COUNTER, "bytes", "experts' outputs sent back", PAIR,
           "moe_ep_bytes", (("phase", "combine"),), ("source", "destination")),
)

# Prometheus's HELP of the families several metrics share.
FAMILY_HELP = {
    "moe_requests": "Requests by outcome",
    "moe_faults_injected": "Faults injected (--fault-*)",
    "moe_ep_exchange_seconds": "The exchanges' time: measured, exposed (steps waited for it) or "
                               "modelled (--link-gbps)",
    "moe_ep_bytes": "Payload bytes the MoE layers' exchanges sent between ranks",
}

BY_NAME = {(m.message, m.name): m for m in METRICS}


def zeros(metrics) -> dict[str, float]:
    """Each metric at zero, by name: a fresh set of counters."""
    return {m.name: m.scalar(0) for m in metrics}


def metrics_of(message: str) -> list[Metric]:
    return [m for m in METRICS if m.message == message]


def families() -> Iterator[tuple[str, str, str, list[Metric]]]:
    """Each Prometheus family once, in declaration order: name, kind, help, its metrics."""
    seen: dict[str, list[Metric]] = {}
    for m in METRICS:
        if m.family:
            seen.setdefault(m.family, []).append(m)
    for name, metrics in seen.items():
        help = FAMILY_HELP.get(name, metrics[0].help)
        yield name, metrics[0].kind, help, metrics


def window_counters() -> list[Metric]:
    """The engine's own counters over a GetStats window: what a run's analysis reads as growth
    between two snapshots."""
    return [m for m in metrics_of(ENGINE) if m.kind == COUNTER and m.window]


class Count(StrEnum):
    """The counters the server adds to by name, as symbols: a misspelt one fails where it is
    read, and in a type check, not as a new key on its own path. Declared beside METRICS and
    checked against them when this module is imported: every window counter of the engine
    has one, and each names a declared counter."""

    REQUESTS_ADMITTED = "requests_admitted"
    REQUESTS_FINISHED = "requests_finished"
    REQUESTS_ABORTED = "requests_aborted"
    REQUESTS_REJECTED = "requests_rejected"
    STEPS = "steps"
    TOKENS_GENERATED = "tokens_generated"
    PROMPT_TOKENS = "prompt_tokens"
    KV_POSITIONS_USEFUL = "kv_positions_useful"
    KV_POSITIONS_COMPUTED = "kv_positions_computed"
    PREFILL_TOKENS = "prefill_tokens"
    PREFILL_PADDED_TOKENS = "prefill_padded_tokens"
    EXPERT_BYTES_READ = "expert_bytes_read"
    EXPERT_COMPUTE_MS = "expert_compute_ms"
    PREFIX_CACHE_QUERIES = "prefix_cache_queries"
    PREFIX_CACHE_HITS = "prefix_cache_hits"
    PREFIX_CACHE_COPIED = "prefix_cache_copied"
    PREFIX_CACHE_EVICTIONS = "prefix_cache_evictions"
    GPU_BUSY_MS = "gpu_busy_ms"
    GPU_TIMED_MS = "gpu_timed_ms"
    GPU_TIMED_STEPS = "gpu_timed_steps"
    PLANS_HELD_BACK = "plans_held_back"
    # the expert-parallel exchange's (ExpertParallelStats)
    EXCHANGES = "exchanges"
    PLACEMENTS = "placements"
    EXPERTS_MOVED = "experts_moved"


def _check_counts() -> None:
    declared = {m.name for m in METRICS if m.kind == COUNTER and m.message in (ENGINE, EXCHANGE)}
    symbols = {c.value for c in Count}
    missing = {m.name for m in window_counters()} - symbols
    unknown = symbols - declared
    if missing or unknown:
        raise ImportError(f"records/engine_telemetry.py: Count lacks {sorted(missing)} and "
                          f"names undeclared counters {sorted(unknown)}")


_check_counts()
