"""Diagnosis rules on throughput: the wait queue growing while the device has room
(the scheduler, policy or KV pool holds requests back), or the requests in the server growing
while it is busy (compute-saturated, the knee; in a stress run, the step it stopped on
saturation). Reads only run-directory files, through analysis/rules/spikes.py's Signals.
"""

from __future__ import annotations

import numpy as np

from analysis.readers.samples import ServerSeries
from analysis.rules.finding import Finding
from analysis.rules.spikes import Signals
from records.summary import StressResult

# Seed 5.3's own bar: a device busy less than 80% of the time has room a better schedule could use.
UTILISATION_BUSY = 0.8
# The two queue rules read different gauges. Compute-saturated judges the requests in the server,
# waiting + running: a server whose batch and KV pool are large admits every arrival at once, so
# its backlog shows as `running` (1 -> 24 while the engine was 93-113% busy, with `waiting` at 0),
# and the sum sees a backlog wherever the server keeps it. Under-utilised judges `waiting` alone:
# requests the scheduler, policy or KV pool held back while the device had room; running ones are
# being served. Either "grows" when the OLS line through it rises by this many requests over the
# schedule. A slope uses every sample (thirds would hinge on where one burst falls), and a rise of
# one request is within the jitter of a gauge read once an interval at low rates.
QUEUE_RISE_REQUESTS = 2.0
# A stress run raises its offered rate step by step, so requests in the server grow by design even
# below the knee. There the load generator's own verdict decides (the knee, and whether it stopped
# on saturation), and both rules read the step it stopped in: [i * step_s, (i + 1) * step_s] of
# run time.
MIN_SERIES_INTERVALS = 5  # fewer snapshots than this give no slope worth reading

UNDER = ("throughput_underutilised", "Throughput limited while under-utilised")
SATURATED = ("compute_saturated", "Compute-saturated (the knee)")


def queue_rules(d: Signals) -> list[Finding]:
    s = d.series
    if s is None:
        return _unjudged_pair("server_stats.jsonl is missing or holds fewer than two GetStats "
                              "snapshots", [])
    if (stress := d.run.summary.stress) is not None:
        return _stress_rules(d, stress)
    span = _schedule_span(d)
    if span.sum() < MIN_SERIES_INTERVALS:
        return _unjudged_pair(f"only {span.sum()} server_stats.jsonl intervals after the warm-up "
                              f"while requests were scheduled (need {MIN_SERIES_INTERVALS})", [])
    queue_rise, queue = _growth("wait queue", s, span, s.waiting)
    held_rise, held = _growth("requests in the server (waiting + running)", s, span,
                              s.waiting + s.running)
    util, util_name, util_line = _utilisation(s, span)
    if not np.isfinite(util):
        return _unjudged_pair("no step time or GPU utilisation in server_stats.jsonl to judge "
                              "utilisation by", [queue, held])
    kind, hold = _holding(d, span)
    evidence = [queue, held, util_line] + ([hold] if hold else [])
    under = _underutilised(queue_rise, util, util_name, kind, evidence)
    if held_rise < QUEUE_RISE_REQUESTS:
        return [under, Finding(*SATURATED, False, f"Requests in the server did not grow (fitted "
                               f"rise {held_rise:+.1f} < {QUEUE_RISE_REQUESTS:g} requests).",
                               evidence)]
    if util < UTILISATION_BUSY:
        return [under, Finding(*SATURATED, False, f"Requests in the server rose by {held_rise:.1f} "
                               f"but {util_name} was only {util:.0%} (< {UTILISATION_BUSY:.0%}): "
                               "compute was not the limit.", evidence)]
    verdict = (f"Requests in the server (waiting + running) rose by {held_rise:.1f} while "
               f"{util_name} was {util:.0%} (>= {UTILISATION_BUSY:.0%}): the server is at "
               "capacity at this load, past the knee.")
    return [under, Finding(*SATURATED, True, verdict + _policy_too(kind), evidence)]


def _stress_rules(d: Signals, stress: StressResult) -> list[Finding]:
    """The step the stress run stopped in, judged against the load generator's own verdict."""
    s, steps = d.series, stress.steps
    knee = stress.knee_rps
    stopped = stress.stopped_because or "?"
    evidence = [f"stress run: knee "
                f"{'none (the first step saturated)' if knee is None else f'{knee:g} requests/s'}; "
                f"stopped: {stopped}"]
    step_s = d.run.summary.config.stress.step_s
    if not steps:
        return _unjudged_pair("summary.json's stress section has no steps", evidence)
    last = steps[-1]
    i = last.step
    lo_s, hi_s = i * step_s, (i + 1) * step_s
    middle = s.t_s - s.length_s / 2
    span = (middle >= lo_s) & (middle <= hi_s)
    if span.sum() < MIN_SERIES_INTERVALS:
        return _unjudged_pair(f"only {span.sum()} server_stats.jsonl intervals in the last step, "
                              f"{lo_s:g}-{hi_s:g} s (need {MIN_SERIES_INTERVALS})", evidence)
    util, util_name, util_line = _utilisation(s, span)
    saturated = last.saturated
    evidence.append(f"last step {i}, {lo_s:g}-{hi_s:g} s at {last.offered_rps:g} requests/s "
                    f"offered: " + (f"saturated ({saturated})" if saturated else "held"))
    evidence.append(util_line)
    queue_rise, queue = _growth("wait queue", s, span, s.waiting)
    _, held = _growth("requests in the server (waiting + running)", s, span, s.waiting + s.running)
    kind, hold = _holding(d, span)
    evidence += [held, queue] + ([hold] if hold else [])
    if not np.isfinite(util):
        return _unjudged_pair("no step time or GPU utilisation in server_stats.jsonl to judge "
                              "utilisation by", evidence)
    under = _underutilised(queue_rise, util, util_name, kind, evidence)
    if not saturated:
        return [under, Finding(*SATURATED, False, f"The stress run did not stop on saturation "
                               f"({stopped}): its last step held, so no knee was reached.",
                               evidence)]
    if util < UTILISATION_BUSY:
        return [under, Finding(*SATURATED, False, f"The stress run stopped on saturation in step "
                               f"{i}, but {util_name} was only {util:.0%} there "
                               f"(< {UTILISATION_BUSY:.0%}): something other than compute set the "
                               "limit.", evidence)]
    verdict = (f"The stress run stopped on saturation in step {i} ({saturated}) while "
               f"{util_name} was {util:.0%} there (>= {UTILISATION_BUSY:.0%}): the server is "
               f"compute-saturated past the knee"
               + (f" at {knee:g} requests/s." if knee is not None
                  else "; its first step already saturated."))
    return [under, Finding(*SATURATED, True, verdict + _policy_too(kind), evidence)]


def _underutilised(rise: float, util: float, util_name: str, kind: str | None,
                   evidence: list[str]) -> Finding:
    if rise < QUEUE_RISE_REQUESTS:
        return Finding(*UNDER, False, f"The wait queue did not grow (fitted rise {rise:+.1f} < "
                       f"{QUEUE_RISE_REQUESTS:g} requests).", evidence)
    if util >= UTILISATION_BUSY:
        return Finding(*UNDER, False, f"The wait queue grew but {util_name} was {util:.0%} (>= "
                       f"{UTILISATION_BUSY:.0%}): the device had no room to spare; see "
                       "compute-saturated.", evidence)
    limit = {"kv": "the KV cache pool was full (more --kv-slots would admit them)",
             "batch": "the running batch was at --max-batch-size"}.get(
        kind, "the batching policy kept requests waiting while batch places and KV slots were free")
    return Finding(*UNDER, True, f"The wait queue rose by {rise:.1f} requests while {util_name} "
                   f"was only {util:.0%} (< {UTILISATION_BUSY:.0%}): {limit}; the scheduler held "
                   "throughput down, not compute.", evidence)


def _policy_too(kind: str | None) -> str:
    return (" Yet in most intervals with requests waiting the batch and KV pool had room: the "
            "batching policy, not compute alone, kept them waiting.") if kind == "policy" else ""


def _growth(name: str, s: ServerSeries, span: np.ndarray, gauge: np.ndarray) -> tuple[float, str]:
    """The fitted rise of a gauge over the span's entries, and the line that gives it."""
    t, y = s.t_s[span], gauge[span]
    slope = float(np.polyfit(t, y, 1)[0])
    rise = slope * float(t[-1] - t[0])
    thirds = np.array_split(y, 3)
    return rise, (f"{name} {t[0] - s.length_s[span][0]:.1f}-{t[-1]:.1f} s: OLS slope "
                  f"{slope:+.3f} requests/s, a fitted rise of {rise:+.1f} requests "
                  f"(mean {thirds[0].mean():.1f} in the first third, "
                  f"{thirds[-1].mean():.1f} in the last)")


def _unjudged_pair(why: str, evidence: list[str]) -> list[Finding]:
    return [Finding(*rule, False, why, evidence, judged=False) for rule in (UNDER, SATURATED)]


def _schedule_span(d: Signals) -> np.ndarray:
    """Series entries whose middle falls after the warm-up and before the schedule's end: the
    warm-up starts from an empty server, so requests in it rise by construction; after the end
    they only drain."""
    s = d.series
    middle = s.t_s - s.length_s / 2
    return ((middle >= d.run.summary.config.recording.warmup_s)
            & (middle <= d.run.summary.duration_s))


def _utilisation(s: ServerSeries, span: np.ndarray) -> tuple[float, str, str]:
    """The engine's busy share (its steps' time over wall time, measured over every interval),
    judged first; NVML's GPU utilisation, a point sample of whether any kernel ran, where the
    engine reports no steps, and as evidence beside the busy share."""
    gpu = s.gpu_util[span]
    nvml = (float(np.nanmean(gpu)), int(np.isfinite(gpu).sum())) if np.isfinite(gpu).any() \
        else None
    wall_ms = float(s.length_s[span].sum()) * 1000
    steps_s = s.step_ms[span].sum() / 1000
    if wall_ms <= 0 or (steps_s <= 0 and nvml is not None):
        if nvml is None:
            return float("nan"), "the engine's busy share", "no engine steps over the run"
        return (nvml[0], "GPU utilisation",
                f"GPU utilisation {nvml[0]:.0%} (mean of {nvml[1]} NVML readings; the engine "
                "reports no steps)")
    util = float(s.step_ms[span].sum()) / wall_ms
    beside = (f"; NVML's GPU utilisation {nvml[0]:.0%}, mean of {nvml[1]} readings"
              if nvml is not None else "; the server reports no GPU utilisation")
    return (util, "the engine's busy share",
            f"engine busy {util:.0%} of wall time ({steps_s:.1f} s of steps in "
            f"{wall_ms / 1000:.1f} s{beside})")


def _holding(d: Signals, span: np.ndarray) -> tuple[str | None, str | None]:
    """What was full in the intervals with requests waiting: the KV pool, the batch, or neither."""
    s = d.series
    queued = span & (s.waiting > 0)
    n = int(queued.sum())
    if n == 0:
        return None, None
    kv_full = queued & (d.kv_total > 0) & (d.kv_in_use >= d.kv_total)
    batch_full = queued & ~kv_full & (s.running >= (d.max_batch_size or np.inf))
    room = n - int(kv_full.sum()) - int(batch_full.sum())
    kind = "kv" if 2 * kv_full.sum() >= n else "batch" if 2 * batch_full.sum() >= n else "policy"
    total = int(np.nanmax(d.kv_total[span])) if np.isfinite(d.kv_total[span]).any() else "?"
    line = (f"requests waiting in {n} of {int(span.sum())} intervals: KV pool full "
            f"({total} slots) in {int(kv_full.sum())}"
            + (f" ({_times(s, kv_full)})" if kv_full.any() else "")
            + f", batch full ({d.max_batch_size}) in {int(batch_full.sum())}, "
            f"room in both in {room}")
    return kind, line


def _times(s: ServerSeries, mask: np.ndarray, most: int = 4) -> str:
    ends = [f"{t:.1f}" for t in s.t_s[mask]]
    return ("at " + ", ".join(ends[:most])
            + (f" and {len(ends) - most} more" if len(ends) > most else "") + " s")
