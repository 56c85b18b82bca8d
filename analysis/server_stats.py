"""The server's own counters for a run, from the GetStats snapshots taken at its start and end."""

from dataclasses import dataclass

import numpy as np

# uptime_s - window_s is when the counters were last reset; it is read from two clocks a few
# microseconds apart, so only a larger move means a ResetStats happened between the snapshots.
RESET_TOLERANCE_S = 0.01


@dataclass(frozen=True)
class ServerView:
    basis: str  # which snapshots the counters below come from
    policy: str | None
    preset: str | None
    device: str | None
    steps: int | None
    tokens_generated: int | None
    requests_finished: int | None
    mean_batch_size: float | None
    step_time_mean_ms: float | None
    expert_tokens: np.ndarray | None  # [layer, expert] routed tokens over the basis
    active_experts_steps: np.ndarray | None  # [a] = layer-steps in which a experts computed (all layers)
    distinct_experts_per_step: float | None  # experts a step activated, mean over steps and layers
    prefill_padded_share: float | None  # padding / (prompt tokens + padding) in batched prefill attention
    tokens_per_step: float | None  # tokens in a forward pass (prefill + decode), mean over steps
    kv_efficiency: float | None  # decode attention: cached positions needed / computed (padding included)
    dropped: int | None  # (token, expert) pairs over capacity, all layers
    drop_share: float | None  # dropped / routed pairs
    cache: dict | None  # expert cache hits, misses, copy_ms and hit_rate over all layers; None without a cache
    stage_ms_per_step: dict[str, float] | None  # stage -> mean ms per step


def server_settings(server: dict) -> dict:
    """The server's settings from summary.json's `server` section: its GetStats snapshot at the
    run's end (at its start without one); {} when the run has neither."""
    return server.get("end") or server.get("start") or {}


def server_view(server: dict) -> ServerView | None:
    start, end = server.get("start") or {}, server.get("end") or {}
    snap = end or start
    if not snap:
        return None
    if start and end and not reset_between(start, end):
        base, basis = start, "end minus start snapshot"
    elif start and end:
        base, basis = {}, "end snapshot (counters were reset during the run)"
    else:
        base, basis = {}, "end snapshot" if end else "start snapshot only"
    dropped, routed = _layer_total(snap, base, "dropped"), _layer_total(snap, base, "expert_tokens")
    active = _active_experts(snap, base)
    return ServerView(
        basis=basis,
        policy=snap.get("policy"),
        preset=snap.get("preset"),
        device=snap.get("device"),
        steps=_delta(snap, base, "steps"),
        tokens_generated=_delta(snap, base, "tokens_generated"),
        requests_finished=_delta(snap, base, "requests_finished"),
        mean_batch_size=_step_mean(snap, base, "mean_batch_size"),
        step_time_mean_ms=_step_mean(snap, base, "step_time_mean_ms"),
        expert_tokens=_expert_tokens(snap, base),
        active_experts_steps=active,
        distinct_experts_per_step=_mean_active(active),
        prefill_padded_share=_padded_share(snap, base),
        tokens_per_step=_hist_mean(snap.get("tokens_per_step"), base.get("tokens_per_step")),
        kv_efficiency=_ratio(_delta(snap, base, "kv_positions_useful"), _delta(snap, base, "kv_positions_computed")),
        dropped=dropped,
        drop_share=_ratio(dropped, routed),
        cache=_cache(snap, base),
        stage_ms_per_step=_stages(snap, base),
    )


def expert_shares(expert_tokens: np.ndarray) -> np.ndarray:
    """[layer, expert] fraction of each layer's routed tokens that went to each expert."""
    return expert_tokens / expert_tokens.sum(axis=1, keepdims=True)


def reset_between(start: dict, end: dict) -> bool:
    """Were the server's counters reset (ResetStats) between these two GetStats snapshots?"""
    if all(key in snap for snap in (start, end) for key in ("uptime_s", "window_s")):
        moved_s = (end["uptime_s"] - end["window_s"]) - (start["uptime_s"] - start["window_s"])
        if moved_s > RESET_TOLERANCE_S:
            return True
    return end.get("steps", 0) < start.get("steps", 0)


def _delta(snap: dict, base: dict, key: str) -> int | None:
    return snap[key] - base.get(key, 0) if key in snap else None


def _step_mean(snap: dict, base: dict, key: str) -> float | None:
    # GetStats means are averaged over all steps since the last reset; reweight to the window's steps.
    if key not in snap or not base:
        return snap.get(key)
    steps_end, steps_start = snap.get("steps", 0), base.get("steps", 0)
    if steps_end <= steps_start:
        return None
    return (snap[key] * steps_end - base.get(key, 0.0) * steps_start) / (steps_end - steps_start)


def _expert_tokens(snap: dict, base: dict) -> np.ndarray | None:
    if not snap.get("expert_tokens"):
        return None
    tokens = np.asarray(snap["expert_tokens"], dtype=np.int64)
    if base.get("expert_tokens"):
        tokens = tokens - np.asarray(base["expert_tokens"], dtype=np.int64)
    # Every layer routes the same tokens, so a layer without any means the window saw no decoding.
    return tokens if (tokens.sum(axis=1) > 0).all() else None


def _active_experts(snap: dict, base: dict) -> np.ndarray | None:
    """[a] = layer-steps in which a experts computed, summed over layers; None without any."""
    layers = snap.get("layers")
    if not layers:
        return None
    steps = np.asarray([layer["active_experts_steps"] for layer in layers], dtype=np.int64)  # [L, E + 1]
    if base.get("layers"):
        steps = steps - np.asarray([layer["active_experts_steps"] for layer in base["layers"]], dtype=np.int64)
    return steps.sum(axis=0) if steps.sum() else None


def _mean_active(active: np.ndarray | None) -> float | None:
    return float((active * np.arange(len(active))).sum() / active.sum()) if active is not None else None


def _padded_share(snap: dict, base: dict) -> float | None:
    useful, padded = _delta(snap, base, "prefill_tokens"), _delta(snap, base, "prefill_padded_tokens")
    if useful is None or padded is None or useful + padded == 0:
        return None
    return padded / (useful + padded)


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _hist_mean(snap_hist: dict | None, base_hist: dict | None) -> float | None:
    """Mean of a GetStats Histogram over the basis, from its count and sum."""
    if not snap_hist:
        return None
    base_hist = base_hist or {}
    return _ratio(snap_hist.get("sum", 0.0) - base_hist.get("sum", 0.0),
                  snap_hist.get("count", 0) - base_hist.get("count", 0))


def _layer_total(snap: dict, base: dict, key: str) -> int | None:
    if not snap.get("layers"):
        return None
    return sum(sum(layer.get(key, [])) for layer in snap["layers"]) - \
        sum(sum(layer.get(key, [])) for layer in base.get("layers", []))


def _cache(snap: dict, base: dict) -> dict | None:
    if not snap.get("expert_cache") or not snap.get("layers"):
        return None

    counts = {key: cache_total(snap, key) - cache_total(base, key) for key in ("hits", "misses", "copy_ms")}
    return counts | {"hit_rate": _ratio(counts["hits"], counts["hits"] + counts["misses"])}


def cache_total(stats: dict, key: str) -> float:
    """One expert-cache counter of a GetStats snapshot, summed over its layers."""
    return sum((layer.get("cache") or {}).get(key, 0) for layer in stats.get("layers", []))


def _stages(snap: dict, base: dict) -> dict[str, float] | None:
    stages = snap.get("stages")
    if not stages:
        return None
    before = {s["stage"]: s.get("ms") for s in base.get("stages", [])}
    steps = (snap.get("step_ms") or {}).get("count", 0) - (base.get("step_ms") or {}).get("count", 0)
    if steps <= 0:
        return None
    return {s["stage"]: (s["ms"].get("sum", 0.0) - (before.get(s["stage"]) or {}).get("sum", 0.0)) / steps
            for s in stages}
