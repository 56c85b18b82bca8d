"""The server's own counters over a run, from the GetStats snapshots taken at its start and end
(summary.json's `server`)."""

from dataclasses import dataclass

import numpy as np

from records.engine_telemetry import window_counters
from records.server_stats import Histogram, ServerStats
from records.summary import ServerSnapshots

# uptime_s - window_s is when the counters were last reset; it is read from two clocks a few
# microseconds apart, so only a larger move means a ResetStats happened between the snapshots.
RESET_TOLERANCE_S = 0.01
# a zero base: counters since the server started or reset (a counter's `absent` is not its zero)
EMPTY = ServerStats(**{m.name: m.scalar(0) for m in window_counters()})


@dataclass(frozen=True)
class ServerView:
    basis: str  # which snapshots the counters below come from
    policy: str | None
    preset: str | None
    device: str | None
    # every counter the engine's telemetry declares for a window (records/engine_telemetry.py),
    # its growth over the basis
    counters: dict[str, float]
    mean_batch_size: float | None
    step_time_mean_ms: float | None
    expert_tokens: np.ndarray | None  # [layer, expert] routed tokens over the basis
    # [a] = layer-steps in which a experts computed (all layers)
    active_experts_steps: np.ndarray | None
    distinct_experts_per_step: float | None  # experts a step activated, mean over steps and layers
    # padding / (prompt tokens + padding) in batched prefill attention
    prefill_padded_share: float | None
    tokens_per_step: float | None  # tokens in a forward pass (prefill + decode), mean over steps
    # decode attention: cached positions needed / computed (padding included)
    kv_efficiency: float | None
    dropped: int | None  # (token, expert) pairs over capacity, all layers
    drop_share: float | None  # dropped / routed pairs
    # expert cache hits, misses, copy_ms and hit_rate over all layers; None without a cache
    cache: dict | None
    stage_ms_per_step: dict[str, float] | None  # stage -> mean ms per step

    @property
    def steps(self) -> int:
        return int(self.counters["steps"])

    @property
    def tokens_generated(self) -> int:
        return int(self.counters["tokens_generated"])

    @property
    def requests_finished(self) -> int:
        return int(self.counters["requests_finished"])


def server_view(server: ServerSnapshots) -> ServerView | None:
    start = server.start if server.start is not None and server.start.ok else None
    end = server.end if server.end is not None and server.end.ok else None
    snap = end or start
    if snap is None:
        return None
    if start and end and not reset_between(start, end):
        base, basis = start, "end minus start snapshot"
    elif start and end:
        base, basis = EMPTY, "end snapshot (counters were reset during the run)"
    else:
        base, basis = EMPTY, "end snapshot" if end else "start snapshot only"
    dropped, routed = _layer_total(snap, base, "dropped"), _layer_total(snap, base, "expert_tokens")
    active = _active_experts(snap, base)
    return ServerView(
        basis=basis,
        policy=snap.policy or None,
        preset=snap.preset or None,
        device=snap.device or None,
        counters={m.name: getattr(snap, m.name) - getattr(base, m.name)
                  for m in window_counters()},
        mean_batch_size=_step_mean(snap, base, "mean_batch_size"),
        step_time_mean_ms=_step_mean(snap, base, "step_time_mean_ms"),
        expert_tokens=_expert_tokens(snap, base),
        active_experts_steps=active,
        distinct_experts_per_step=_mean_active(active),
        prefill_padded_share=_padded_share(snap, base),
        tokens_per_step=_hist_mean(snap.tokens_per_step, base.tokens_per_step),
        kv_efficiency=_ratio(snap.kv_positions_useful - base.kv_positions_useful,
                             snap.kv_positions_computed - base.kv_positions_computed),
        dropped=dropped,
        drop_share=_ratio(dropped, routed),
        cache=_cache(snap, base),
        stage_ms_per_step=_stages(snap, base),
    )


def expert_shares(expert_tokens: np.ndarray) -> np.ndarray:
    """[layer, expert] fraction of each layer's routed tokens that went to each expert."""
    return expert_tokens / expert_tokens.sum(axis=1, keepdims=True)


def reset_between(start: ServerStats, end: ServerStats) -> bool:
    """Were the server's counters reset (ResetStats) between these two GetStats snapshots?"""
    moved_s = (end.uptime_s - end.window_s) - (start.uptime_s - start.window_s)
    return moved_s > RESET_TOLERANCE_S or end.steps < start.steps


def _step_mean(snap: ServerStats, base: ServerStats, key: str) -> float | None:
    # GetStats means are averaged over all steps since the last reset; reweight to the window's
    # steps.
    if base is EMPTY:
        return getattr(snap, key)
    if snap.steps <= base.steps:
        return None
    return ((getattr(snap, key) * snap.steps - getattr(base, key) * base.steps)
            / (snap.steps - base.steps))


def _expert_tokens(snap: ServerStats, base: ServerStats) -> np.ndarray | None:
    if not snap.expert_tokens:
        return None
    tokens = np.asarray(snap.expert_tokens, dtype=np.int64)
    if base.expert_tokens:
        tokens = tokens - np.asarray(base.expert_tokens, dtype=np.int64)
    # Every layer routes the same tokens, so a layer without any means the window saw no decoding.
    return tokens if (tokens.sum(axis=1) > 0).all() else None


def _active_experts(snap: ServerStats, base: ServerStats) -> np.ndarray | None:
    """[a] = layer-steps in which a experts computed, summed over layers; None without any."""
    if not snap.layers:
        return None
    steps = np.asarray([layer.active_experts_steps for layer in snap.layers],
                       dtype=np.int64)  # [L, E + 1]
    if base.layers:
        steps = steps - np.asarray([layer.active_experts_steps for layer in base.layers],
                                   dtype=np.int64)
    return steps.sum(axis=0) if steps.sum() else None


def _mean_active(active: np.ndarray | None) -> float | None:
    return (float((active * np.arange(len(active))).sum() / active.sum()) if active is not None
            else None)


def _padded_share(snap: ServerStats, base: ServerStats) -> float | None:
    useful = snap.prefill_tokens - base.prefill_tokens
    padded = snap.prefill_padded_tokens - base.prefill_padded_tokens
    return padded / (useful + padded) if useful + padded else None


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _hist_mean(snap_hist: Histogram | None, base_hist: Histogram | None) -> float | None:
    """Mean of a GetStats Histogram over the basis, from its count and sum."""
    if snap_hist is None:
        return None
    base_hist = base_hist or Histogram()
    return _ratio(snap_hist.sum - base_hist.sum, snap_hist.count - base_hist.count)


def _layer_total(snap: ServerStats, base: ServerStats, key: str) -> int | None:
    if not snap.layers:
        return None
    return sum(sum(getattr(layer, key)) for layer in snap.layers) - \
        sum(sum(getattr(layer, key)) for layer in base.layers)


def _cache(snap: ServerStats, base: ServerStats) -> dict | None:
    if not snap.expert_cache or not snap.layers:
        return None
    counts = {key: snap.cache_total(key) - base.cache_total(key)
              for key in ("hits", "misses", "copy_ms")}
    return counts | {"hit_rate": _ratio(counts["hits"], counts["hits"] + counts["misses"])}


def _stages(snap: ServerStats, base: ServerStats) -> dict[str, float] | None:
    if not snap.stages:
        return None
    out = {}
    for s in snap.stages:  # per timed step: on CUDA only sampled steps are (docs/metrics.md)
        now, then = s.ms or Histogram(), base.stage(s.stage) or Histogram()
        if now.count > then.count:
            out[s.stage] = (now.sum - then.sum) / (now.count - then.count)
    return out or None
