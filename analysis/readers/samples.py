"""The server's counters over time, from `server_stats.jsonl`: a GetStats snapshot every
--interval-s, on the load generator's clock.

GetStats counters are cumulative since the server started or was last reset, so each
figure here is the difference between consecutive snapshots; a reset between two
snapshots (the window shrank) makes the later snapshot the whole interval's figure.
Gauges (queue depth, RSS) are read as they were at the later snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.readers.server_stats import EMPTY, reset_between
from records.engine_telemetry import window_counters
from records.server_stats import Histogram, ServerSample, ServerStats


@dataclass(frozen=True)
class ServerSeries:
    """One entry per pair of consecutive snapshots, placed at the later one's time."""

    t_s: np.ndarray  # seconds after the run started
    length_s: np.ndarray
    waiting: np.ndarray  # requests in the wait queue (gauge)
    running: np.ndarray  # requests in the running batch (gauge)
    # every counter the engine's telemetry declares for a window (records/engine_telemetry.py),
    # its growth over each interval
    counters: dict[str, np.ndarray]
    busy_share: np.ndarray  # engine step time / wall time
    cpu_util: np.ndarray  # process CPU, fraction of one core; nan where unknown
    gpu_util: np.ndarray  # GPU utilisation 0..1 (gauge); nan where the server has none
    # the most imbalanced layer's max/mean expert load; nan without routed tokens
    imbalance: np.ndarray
    routed: np.ndarray  # (token, expert) pairs routed, all layers
    cache_hits: np.ndarray
    cache_misses: np.ndarray
    cache_copy_ms: np.ndarray  # time spent copying expert weights in
    step_ms: np.ndarray  # engine step time, summed over the interval's steps
    # with --ep: bytes between ranks (both directions), exchange time measured and exposed
    ep_bytes: np.ndarray
    ep_measured_ms: np.ndarray
    ep_exposed_ms: np.ndarray
    stage_steps: np.ndarray  # steps whose stages were timed (sampled ones only, on CUDA)
    stage_ms: dict[str, np.ndarray]  # stage -> time summed over those steps

    def __len__(self) -> int:
        return len(self.t_s)

    @property
    def steps(self) -> np.ndarray:
        return self.counters["steps"]

    @property
    def tokens(self) -> np.ndarray:
        """Output tokens generated."""
        return self.counters["tokens_generated"]


def server_series(samples: list[ServerSample]) -> ServerSeries | None:
    """None with fewer than two snapshots."""
    if len(samples) < 2:
        return None
    rows = [_interval(prev.stats, cur.stats, cur.t_run_s - prev.t_run_s) | {"t_s": cur.t_run_s}
            for prev, cur in zip(samples, samples[1:], strict=False)]
    # the server's pipeline order
    stages = list(dict.fromkeys(name for row in rows for name in row["stage_ms"]))
    columns = {key: np.asarray([row[key] for row in rows], dtype=float)
               for key in rows[0] if key not in ("stage_ms", "counters")}
    stage_ms = {name: np.asarray([row["stage_ms"].get(name, 0.0) for row in rows])
                for name in stages}
    counters = {m.name: np.asarray([row["counters"][m.name] for row in rows], dtype=float)
                for m in window_counters()}
    return ServerSeries(stage_ms=stage_ms, counters=counters, **columns)


def _interval(prev: ServerStats, cur: ServerStats, length_s: float) -> dict:
    if reset_between(prev, cur):
        prev = EMPTY
    step_ms = _hist_sum(cur.step_ms) - _hist_sum(prev.step_ms)
    cpu_s = _cpu_seconds(cur) - _cpu_seconds(prev)
    routed = _layer_delta(cur, prev, "expert_tokens")
    return {
        "length_s": length_s,
        "waiting": cur.waiting, "running": cur.running,
        "counters": {m.name: getattr(cur, m.name) - getattr(prev, m.name)
                     for m in window_counters()},
        "busy_share": step_ms / 1000 / length_s if length_s > 0 else float("nan"),
        "cpu_util": cpu_s / length_s if length_s > 0 else float("nan"),
        "gpu_util": (cur.gpu_utilization_percent / 100 if cur.gpu_utilization_percent >= 0
                     else float("nan")),
        "imbalance": _max_over_mean(routed),
        "routed": float(routed.sum()),
        "cache_hits": cur.cache_total("hits") - prev.cache_total("hits"),
        "cache_misses": cur.cache_total("misses") - prev.cache_total("misses"),
        "cache_copy_ms": cur.cache_total("copy_ms") - prev.cache_total("copy_ms"),
        "step_ms": step_ms,
        **_exchanges(cur, prev),
        "stage_ms": {s.stage: _hist_sum(s.ms) - _hist_sum(prev.stage(s.stage)) for s in cur.stages},
        # steps whose stages were timed (every step on a CPU, sampled ones on CUDA)
        "stage_steps": max((_hist_count(s.ms) - _hist_count(prev.stage(s.stage))
                            for s in cur.stages), default=0.0),
    }


def _exchanges(cur: ServerStats, prev: ServerStats) -> dict[str, float]:
    """The interval's exchanges between expert-parallel ranks; zero with one rank."""
    now, before = cur.expert_parallel, prev.expert_parallel
    if now is None:
        return {"ep_bytes": 0.0, "ep_measured_ms": 0.0, "ep_exposed_ms": 0.0}

    def totals(x):
        if x is None:
            return 0.0, 0.0, 0.0
        sent = sum(p.dispatch_bytes + p.combine_bytes for p in x.pairs)
        return sent, x.dispatch_ms + x.combine_ms, x.dispatch_exposed_ms + x.combine_exposed_ms

    (b1, m1, e1), (b0, m0, e0) = totals(now), totals(before)
    return {"ep_bytes": b1 - b0, "ep_measured_ms": m1 - m0, "ep_exposed_ms": e1 - e0}


def _hist_sum(h: Histogram | None) -> float:
    return h.sum if h is not None else 0.0


def _hist_count(h: Histogram | None) -> float:
    return h.count if h is not None else 0.0


def _cpu_seconds(stats: ServerStats) -> float:
    """process_cpu_percent is the average over the window since the last reset."""
    return stats.process_cpu_percent / 100 * stats.window_s


def _layer_delta(cur: ServerStats, prev: ServerStats, key: str) -> np.ndarray:
    """[layer, expert] difference of a per-layer counter; empty without layer stats."""
    now = np.asarray([getattr(layer, key) for layer in cur.layers], dtype=float)
    before = [getattr(layer, key) for layer in prev.layers]
    return now - np.asarray(before, dtype=float) if before and now.size else now


def _max_over_mean(routed: np.ndarray) -> float:
    if routed.ndim != 2 or routed.size == 0:
        return float("nan")
    means = routed.mean(axis=1)
    loaded = means > 0
    return (float((routed.max(axis=1)[loaded] / means[loaded]).max()) if loaded.any()
            else float("nan"))


@dataclass(frozen=True)
class ExpertInterval:
    """The routing of the steps between two consecutive snapshots, placed at the later one."""

    t_s: float  # seconds after the run started
    length_s: float
    steps: int
    routed: np.ndarray  # [layer, expert] (token, expert) pairs routed, drops included
    dropped: np.ndarray  # [layer, expert] pairs over capacity; zeros when dropless
    capacity_factor: float  # the server's at the later snapshot; 0 = dropless


def expert_intervals(samples: list[ServerSample]) -> list[ExpertInterval]:
    """Per-layer per-expert loads between consecutive snapshots; intervals without layer stats
    (an old server) are left out, as are the ones whose layer count changed."""
    intervals = []
    for prev_sample, cur_sample in zip(samples, samples[1:], strict=False):
        prev, cur = prev_sample.stats, cur_sample.stats
        if reset_between(prev, cur):
            prev = EMPTY
        if not cur.layers or len(prev.layers or cur.layers) != len(cur.layers):
            continue
        routed = _layer_delta(cur, prev, "expert_tokens")
        dropped = _layer_delta(cur, prev, "dropped")
        if (routed.ndim != 2 or routed.size == 0
                or dropped.shape not in (routed.shape, (routed.shape[0], 0))):
            continue
        intervals.append(ExpertInterval(cur_sample.t_run_s,
                                        cur_sample.t_run_s - prev_sample.t_run_s,
                                        cur.steps - prev.steps, routed,
                                        dropped if dropped.size else np.zeros_like(routed),
                                        cur.capacity_factor))
    return intervals
