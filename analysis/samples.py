"""The server's counters over time, from `server_stats.jsonl`: a GetStats snapshot every
--interval-s, on the load generator's clock.

GetStats counters are cumulative since the server started or was last reset, so each
figure here is the difference between consecutive snapshots; a reset between two
snapshots (the window shrank) makes the later snapshot the whole interval's figure.
Gauges (queue depth, RSS) are read as they were at the later snapshot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.rundir import RunDirError, read_lines, worker_dirs
from analysis.server_stats import cache_total, reset_between

SAMPLES = "server_stats.jsonl"


@dataclass(frozen=True)
class ServerSeries:
    """One entry per pair of consecutive snapshots, placed at the later one's time."""

    t_s: np.ndarray  # seconds after the run started
    length_s: np.ndarray
    waiting: np.ndarray  # requests in the wait queue (gauge)
    running: np.ndarray  # requests in the running batch (gauge)
    steps: np.ndarray
    tokens: np.ndarray  # output tokens generated
    busy_share: np.ndarray  # engine step time / wall time
    cpu_util: np.ndarray  # process CPU, fraction of one core; nan where unknown
    gpu_util: np.ndarray  # GPU utilisation 0..1 (gauge); nan where the server has none
    imbalance: np.ndarray  # the most imbalanced layer's max/mean expert load; nan without routed tokens
    routed: np.ndarray  # (token, expert) pairs routed, all layers
    cache_hits: np.ndarray
    cache_misses: np.ndarray
    cache_copy_ms: np.ndarray  # time spent copying expert weights in
    step_ms: np.ndarray  # engine step time, summed over the interval's steps
    stage_ms: dict[str, np.ndarray]  # stage -> time summed over the interval's steps

    def __len__(self) -> int:
        return len(self.t_s)


def read_samples(run_dir: Path) -> list[tuple[float, dict]]:
    """(seconds after the run started, GetStats dict) per line; [] when the file does not exist."""
    path = run_dir / SAMPLES
    if not path.exists():
        # A distributed run: every worker sampled the same server; the first worker's samples serve.
        path = next(iter(worker_dirs(run_dir, SAMPLES)), path)
    samples = []
    for number, line in read_lines(path):
        try:
            record = json.loads(line)
            samples.append((float(record["t_run_s"]), dict(record["stats"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise RunDirError(f"{path}:{number}: not a GetStats sample ({e})") from None
    return samples


def server_series(samples: list[tuple[float, dict]]) -> ServerSeries | None:
    """None with fewer than two snapshots."""
    if len(samples) < 2:
        return None
    rows = [_interval(prev, cur, t - t_prev) | {"t_s": t}
            for (t_prev, prev), (t, cur) in zip(samples, samples[1:], strict=False)]
    stages = list(dict.fromkeys(name for row in rows for name in row["stage_ms"]))  # the server's pipeline order
    columns = {key: np.asarray([row[key] for row in rows], dtype=float)
               for key in rows[0] if key != "stage_ms"}
    stage_ms = {name: np.asarray([row["stage_ms"].get(name, 0.0) for row in rows]) for name in stages}
    return ServerSeries(stage_ms=stage_ms, **columns)


def _interval(prev: dict, cur: dict, length_s: float) -> dict:
    if reset_between(prev, cur):
        prev = {}
    steps = _delta(cur, prev, "steps")
    step_ms = _delta_hist_sum(cur.get("step_ms"), prev.get("step_ms"))
    cpu_s = _cpu_seconds(cur) - _cpu_seconds(prev) if "process_cpu_percent" in cur else float("nan")
    gpu = cur.get("gpu_utilization_percent", -1.0)
    routed = _layer_delta(cur, prev, "expert_tokens")
    return {
        "length_s": length_s,
        "waiting": cur.get("waiting", 0), "running": cur.get("running", 0),
        "steps": steps,
        "tokens": _delta(cur, prev, "tokens_generated"),
        "busy_share": step_ms / 1000 / length_s if length_s > 0 else float("nan"),
        "cpu_util": cpu_s / length_s if length_s > 0 else float("nan"),
        "gpu_util": gpu / 100 if gpu >= 0 else float("nan"),
        "imbalance": _max_over_mean(routed),
        "routed": float(routed.sum()),
        "cache_hits": _cache_delta(cur, prev, "hits"),
        "cache_misses": _cache_delta(cur, prev, "misses"),
        "cache_copy_ms": _cache_delta(cur, prev, "copy_ms"),
        "step_ms": step_ms,
        "stage_ms": {s["stage"]: _delta_hist_sum(s.get("ms"), _stage(prev, s["stage"])) for s in cur.get("stages", [])},
    }


def _delta(cur: dict, prev: dict, key: str) -> float:
    return cur.get(key, 0) - prev.get(key, 0)


def _delta_hist_sum(cur: dict | None, prev: dict | None) -> float:
    return (cur or {}).get("sum", 0.0) - (prev or {}).get("sum", 0.0)


def _stage(stats: dict, name: str) -> dict | None:
    return next((s.get("ms") for s in stats.get("stages", []) if s["stage"] == name), None)


def _cpu_seconds(stats: dict) -> float:
    """process_cpu_percent is the average over the window since the last reset."""
    return stats.get("process_cpu_percent", 0.0) / 100 * stats.get("window_s", 0.0)


def _layer_delta(cur: dict, prev: dict, key: str) -> np.ndarray:
    """[layer, expert] difference of a per-layer counter; empty without layer stats."""
    now = np.asarray([layer.get(key, []) for layer in cur.get("layers", [])], dtype=float)
    before = [layer.get(key, []) for layer in prev.get("layers", [])]
    return now - np.asarray(before, dtype=float) if before and now.size else now


def _max_over_mean(routed: np.ndarray) -> float:
    if routed.ndim != 2 or routed.size == 0:
        return float("nan")
    means = routed.mean(axis=1)
    loaded = means > 0
    return float((routed.max(axis=1)[loaded] / means[loaded]).max()) if loaded.any() else float("nan")


def _cache_delta(cur: dict, prev: dict, key: str) -> float:
    return cache_total(cur, key) - cache_total(prev, key)


@dataclass(frozen=True)
class ExpertInterval:
    """The routing of the steps between two consecutive snapshots, placed at the later one."""

    t_s: float  # seconds after the run started
    length_s: float
    steps: int
    routed: np.ndarray  # [layer, expert] (token, expert) pairs routed, drops included
    dropped: np.ndarray  # [layer, expert] pairs over capacity; zeros when dropless
    capacity_factor: float  # the server's at the later snapshot; 0 = dropless


def expert_intervals(samples: list[tuple[float, dict]]) -> list[ExpertInterval]:
    """Per-layer per-expert loads between consecutive snapshots; intervals without layer stats
    (an old server) are left out, as are the ones whose layer count changed."""
    intervals = []
    for (t_prev, prev), (t, cur) in zip(samples, samples[1:], strict=False):
        if reset_between(prev, cur):
            prev = {}
        if not cur.get("layers") or len(prev.get("layers", cur["layers"])) != len(cur["layers"]):
            continue
        routed, dropped = _layer_delta(cur, prev, "expert_tokens"), _layer_delta(cur, prev, "dropped")
        if routed.ndim != 2 or routed.size == 0 or dropped.shape not in (routed.shape, (routed.shape[0], 0)):
            continue
        intervals.append(ExpertInterval(t, t - t_prev, int(_delta(cur, prev, "steps")), routed,
                                        dropped if dropped.size else np.zeros_like(routed),
                                        float(cur.get("capacity_factor") or 0.0)))
    return intervals
