"""Rule-based bottleneck diagnosis of one run (seed 5.3): each rule says whether it fired and
the numbers, with their times, that made it fire, did not, or could not be judged.

Throughput: the wait queue grows while the device is under-utilised (the scheduler, policy or
KV pool holds requests back) or while it is busy (compute-saturated, the knee); one layer's
expert load is far above its mean; copying expert weights in takes a large share of step
time. Latency: windows whose TTFT or TPOT p99 jumps, lined up with a hot expert, a cache-miss
burst, queue growth or the load generator's own lateness (analysis/spikes.py); and the
generator's lateness over the whole run. Reads only run-directory files.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from analysis.latency import stats_ms
from analysis.rundir import Run, RunDirError, load_run
from analysis.samples import ServerSeries
from analysis.server_stats import expert_shares, server_view
from analysis.spikes import (
    CAUSES,
    MIN_WINDOW_SAMPLES,
    SPIKE_FACTOR,
    MetricSpikes,
    Signals,
    causes,
    find_spikes,
    read_signals,
    when,
)
from analysis.tables import fmt_ms

# Seed 5.3's own bar: a device busy less than 80% of the time has room a better schedule could use.
UTILISATION_BUSY = 0.8
# The queue "grows" when the OLS line through the waiting gauge rises by this many requests over
# the schedule. A slope uses every sample (thirds would hinge on where one burst falls), and a rise
# of one request is within the jitter of a gauge read once an interval at low rates.
QUEUE_RISE_REQUESTS = 2.0
MIN_SERIES_INTERVALS = 5  # fewer snapshots than this give no slope worth reading
# Expert load max/mean: with expert parallelism every step waits for the hottest expert, so at
# 1.5 a third of the expert compute capacity idles (1 - 1/1.5).
IMBALANCE_MAX_OVER_MEAN = 1.5
# Expert-weight copy time / step time: above a fifth, moving weights costs more than a typical
# MoE layer's routing and combine together, and a bigger cache is the cheaper fix.
DATA_MOVEMENT_SHARE = 0.2
# The generator's lag matters once it is a tenth of the finest latency it measures (TPOT p50, or
# TTFT p50 without one): a tenth is where a policy comparison's differences start to blur.
MATERIAL_LAG_SHARE = 0.1
SPIKES_LISTED = 5  # spike windows given in full; the rest are counted
TOP_INTERVALS = 3  # most imbalanced intervals listed beside the run-wide figure
DIAGNOSIS_MD = "diagnosis.md"


@dataclass(frozen=True)
class Finding:
    """One rule's outcome: fired, did not, or could not be judged (judged False), and why."""

    rule: str  # short id, e.g. "expert_imbalance"
    title: str
    fired: bool
    verdict: str  # one sentence, or what was missing when the rule could not be judged
    evidence: list[str]  # the numbers (and interval times) behind the verdict
    judged: bool = True  # False when the run lacks the data the rule needs


def diagnose(run: Run) -> list[Finding]:
    signals = read_signals(run)
    return [*_queue_rules(signals), _imbalance(signals), _data_movement(signals), _spikes(signals),
            _generator(signals)]


# --- throughput: queue growth against utilisation -------------------------------------------

UNDER = ("throughput_underutilised", "Throughput limited while under-utilised")
SATURATED = ("compute_saturated", "Compute-saturated (the knee)")


def _queue_rules(d: Signals) -> list[Finding]:
    s = d.series
    if s is None:
        return _unjudged_pair("server_stats.jsonl is missing or holds fewer than two GetStats snapshots", [])
    span = _schedule_span(d)
    if span.sum() < MIN_SERIES_INTERVALS:
        return _unjudged_pair(f"only {span.sum()} server_stats.jsonl intervals while requests were scheduled "
                              f"(need {MIN_SERIES_INTERVALS})", [])
    t, waiting = s.t_s[span], s.waiting[span]
    slope = float(np.polyfit(t, waiting, 1)[0])
    rise = slope * float(t[-1] - t[0])
    thirds = np.array_split(waiting, 3)
    queue = (f"wait queue {t[0] - s.length_s[span][0]:.1f}-{t[-1]:.1f} s: OLS slope {slope:+.3f} requests/s, a "
             f"fitted rise of {rise:+.1f} requests (mean {thirds[0].mean():.1f} in the first third, "
             f"{thirds[-1].mean():.1f} in the last)")
    util, util_name, util_line = _utilisation(s, span)
    if not np.isfinite(util):
        return _unjudged_pair("no step time or GPU utilisation in server_stats.jsonl to judge utilisation by", [queue])
    kind, hold = _holding(d, span)
    evidence = [queue, util_line] + ([hold] if hold else [])
    if rise < QUEUE_RISE_REQUESTS:
        flat = f"The wait queue did not grow (fitted rise {rise:+.1f} < {QUEUE_RISE_REQUESTS:g} requests)."
        return [Finding(*UNDER, False, flat, evidence), Finding(*SATURATED, False, flat, evidence)]
    if util >= UTILISATION_BUSY:
        verdict = (f"The wait queue rose by {rise:.1f} requests while {util_name} was {util:.0%} "
                   f"(>= {UTILISATION_BUSY:.0%}): the server is at capacity at this load, past the knee.")
        if kind == "policy":
            verdict += (" Yet in most intervals with requests waiting the batch and KV pool had room: the batching "
                        "policy, not compute alone, kept them waiting.")
        return [Finding(*UNDER, False, f"The queue grew but {util_name} was {util:.0%} (>= {UTILISATION_BUSY:.0%}): "
                        "see compute-saturated.", evidence), Finding(*SATURATED, True, verdict, evidence)]
    limit = {"kv": "the KV cache pool was full (more --kv-slots would admit them)",
             "batch": "the running batch was at --max-batch-size",
             "policy": "the batching policy kept requests waiting while batch places and KV slots were free"}[kind]
    verdict = (f"The wait queue rose by {rise:.1f} requests while {util_name} was only {util:.0%} "
               f"(< {UTILISATION_BUSY:.0%}): {limit}; the scheduler held throughput down, not compute.")
    return [Finding(*UNDER, True, verdict, evidence),
            Finding(*SATURATED, False, f"The queue grew but {util_name} was only {util:.0%} (< {UTILISATION_BUSY:.0%}):"
                    " see throughput limited while under-utilised.", evidence)]


def _unjudged_pair(why: str, evidence: list[str]) -> list[Finding]:
    return [Finding(*rule, False, why, evidence, judged=False) for rule in (UNDER, SATURATED)]


def _schedule_span(d: Signals) -> np.ndarray:
    """Series entries while requests were being scheduled: after it the queue only drains."""
    s = d.series
    duration_s = d.run.summary.get("duration_s")
    if not isinstance(duration_s, int | float):
        return np.ones(len(s), dtype=bool)
    return s.t_s - s.length_s / 2 <= duration_s


def _utilisation(s: ServerSeries, span: np.ndarray) -> tuple[float, str, str]:
    """GPU utilisation where the server reports it, else the engine's busy share."""
    gpu = s.gpu_util[span]
    if np.isfinite(gpu).any():
        util = float(np.nanmean(gpu))
        return util, "GPU utilisation", f"GPU utilisation {util:.0%} (mean of {np.isfinite(gpu).sum()} NVML readings)"
    wall_ms = float(s.length_s[span].sum()) * 1000
    util = float(s.step_ms[span].sum()) / wall_ms if wall_ms > 0 else float("nan")
    steps_s = s.step_ms[span].sum() / 1000
    return util, "the engine's busy share", (f"engine busy {util:.0%} of wall time ({steps_s:.1f} s of steps in "
                                             f"{wall_ms / 1000:.1f} s; the server reports no GPU utilisation)")


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
    line = (f"requests waiting in {n} of {int(span.sum())} intervals: KV pool full ({total} slots) in "
            f"{int(kv_full.sum())}" + (f" ({_times(s, kv_full)})" if kv_full.any() else "")
            + f", batch full ({d.max_batch_size}) in {int(batch_full.sum())}, room in both in {room}")
    return kind, line


# --- expert load and data movement ------------------------------------------------------------

def _imbalance(d: Signals) -> Finding:
    rule = ("expert_imbalance", "Expert load imbalance")
    view = server_view(d.run.section("server"))
    if view is None or view.expert_tokens is None:
        return Finding(*rule, False, "summary.json has no server expert_tokens over the run (no start/end "
                       "GetStats, or no token was routed in the window)", [], judged=False)
    tokens = view.expert_tokens.astype(float)
    ratio = tokens.max(axis=1) / tokens.mean(axis=1)  # [L]
    shares = expert_shares(tokens)
    over = np.flatnonzero(ratio > IMBALANCE_MAX_OVER_MEAN)
    worst = int(ratio.argmax())
    hot = int(tokens[worst].argmax())
    evidence = [f"layer {worst}: expert {hot} took {shares[worst, hot]:.1%} of its routed (token, expert) pairs "
                f"(mean {1 / tokens.shape[1]:.1%}), max/mean {ratio[worst]:.2f}",
                f"{len(over)} of {len(ratio)} layers above {IMBALANCE_MAX_OVER_MEAN:g} ({view.basis})"]
    if d.series is not None and np.isfinite(d.series.imbalance).any():
        imb = np.nan_to_num(d.series.imbalance, nan=-1.0)
        top = np.argsort(-imb, kind="stable")[:TOP_INTERVALS]
        evidence.append("highest interval max/mean (most imbalanced layer): "
                        + ", ".join(f"{imb[i]:.2f} at {when(d.series, i)}" for i in top if imb[i] >= 0))
    config = d.run.section("server").get("end") or d.run.section("server").get("start") or {}
    if config.get("routing_skew"):
        evidence.append(f"router {config.get('router', '?')}, routing skew {config['routing_skew']}"
                        + (f", capacity factor {config['capacity_factor']:g}" if config.get("capacity_factor") else ""))
    if not len(over):
        return Finding(*rule, False, f"Every layer's max/mean expert load is at most {ratio[worst]:.2f} "
                       f"(threshold {IMBALANCE_MAX_OVER_MEAN:g}).", evidence)
    return Finding(*rule, True, f"Expert load is imbalanced: layer {worst}'s expert {hot} carried {ratio[worst]:.2f}x "
                   f"the mean load (above {IMBALANCE_MAX_OVER_MEAN:g}); under expert parallelism its device would "
                   "set every step's pace, and a balancing router or capacity factor would spread it.", evidence)


def _data_movement(d: Signals) -> Finding:
    rule = ("data_movement", "Data movement (expert weight copies) share of step time")
    scope = ("This measures the only data movement the server reports, copying expert weights in on cache misses; "
             "there is no all-to-all time, as expert parallelism is not built.")
    s = d.series
    if s is None or s.step_ms.sum() <= 0:
        return Finding(*rule, False, "server_stats.jsonl has no step time (missing, under two snapshots, or no step "
                       "ran)", [], judged=False)
    step_ms, copy_ms = float(s.step_ms.sum()), float(s.cache_copy_ms.sum())
    hits, misses, steps = float(s.cache_hits.sum()), float(s.cache_misses.sum()), float(s.steps.sum())
    if not d.expert_cache:
        return Finding(*rule, False, "No --expert-cache: every expert stays resident and no weights are copied. "
                       + scope, [f"copy 0 ms of {step_ms / 1000:.1f} s of step time"])
    share = copy_ms / step_ms
    lookups = hits + misses
    evidence = [f"copy {fmt_ms(copy_ms)} ms of {fmt_ms(step_ms)} ms step time ({share:.1%}; threshold "
                f"{DATA_MOVEMENT_SHARE:.0%})",
                (f"hit rate {hits / lookups:.1%} ({hits:.0f} hits, {misses:.0f} misses)" if lookups else "no lookups")
                + f"; {d.expert_cache} resident experts per layer",
                f"{fmt_ms(copy_ms / steps if steps else None)} ms copying per step"
                + (f", {fmt_ms(copy_ms / misses)} ms per miss" if misses else "")]
    if share <= DATA_MOVEMENT_SHARE:
        return Finding(*rule, False, f"Expert weight copies took {share:.1%} of step time (at most "
                       f"{DATA_MOVEMENT_SHARE:.0%}). " + scope, evidence)
    return Finding(*rule, True, f"Copying expert weights in on cache misses took {share:.1%} of step time (above "
                   f"{DATA_MOVEMENT_SHARE:.0%}): data movement, not compute, limits steps; a larger --expert-cache "
                   "or another --cache-policy would cut it. " + scope, evidence)


# --- latency spikes ---------------------------------------------------------------------------

def _spikes(d: Signals) -> Finding:
    rule = ("latency_spikes", "Latency spikes")
    found = [find_spikes(d.run, metric) for metric in ("ttft", "tpot")]
    judged = [f for f in found if isinstance(f, MetricSpikes)]
    missing = [f for f in found if isinstance(f, str)]
    if not judged:
        return Finding(*rule, False, "Not enough requests per interval: " + "; ".join(missing), [], judged=False)
    evidence = [f"{f.metric.upper()}: median window p99 {fmt_ms(f.typical_ms)} ms over {f.windows} windows of >= "
                f"{MIN_WINDOW_SAMPLES} requests; a spike is above {fmt_ms(f.limit_ms)} ms" for f in judged]
    evidence += [f"not judged: {m}" for m in missing]
    spikes = sorted((spike for f in judged for spike in f.spikes), key=lambda spike: spike.window.start_s)
    if not spikes:
        return Finding(*rule, False, f"No window's p99 rose above {SPIKE_FACTOR:g}x the run's median window p99 "
                       "(by the minimum jump).", evidence)
    tally, unexplained, lines = dict.fromkeys(CAUSES, 0), 0, []
    for spike in spikes:
        lined, looked = causes(d, spike)
        for name, _ in lined:
            tally[name] += 1
        unexplained += not lined
        said = "; ".join(f"{name}: {detail}" for name, detail in lined) if lined else \
            "no cause found among " + ", ".join(CAUSES)
        lines.append((spike.p99_ms / spike.typical_ms, f"{spike.describe()}; looked at {looked}: {said}"))
    # The largest jumps when there are many, kept in time order.
    kept = sorted(sorted(lines, key=lambda line: -line[0])[:SPIKES_LISTED], key=lines.index)
    evidence += [text for _, text in kept]
    evidence += [f"and {len(lines) - len(kept)} smaller spike windows"] if len(lines) > len(kept) else []
    what = ", ".join(f"{f.metric.upper()} {len(f.spikes)}" for f in judged if f.spikes)
    lined_up = ", ".join(f"{name} ({n})" for name, n in tally.items() if n) or "nothing"
    verdict = f"Latency spiked in {len(spikes)} window(s) ({what}); lined up with {lined_up}"
    verdict += f"; no cause found for {unexplained}." if unexplained else "."
    return Finding(*rule, True, verdict, evidence)


# --- the load generator -----------------------------------------------------------------------

def _generator(d: Signals) -> Finding:
    rule = ("generator_limited", "Load generator limited")
    generator = d.run.section("generator")
    send = stats_ms(d.run.histograms.get("send_lag")) or d.run.section("metrics").get("send_lag_ms")
    if not generator and not send:
        return Finding(*rule, False, "summary.json has no generator section and histograms.json no send_lag",
                       [], judged=False)
    evidence, reasons, lags = [], [], {}
    if send:
        lags["send lag"] = send["p99"]
        evidence.append(f"send lag p99 {fmt_ms(send['p99'])} ms, max {fmt_ms(send.get('max'))} ms (threshold "
                        f"{d.late_ms:g} ms); {generator.get('late_sends', '?')} late sends")
        if send["p99"] > d.late_ms:
            reasons.append(f"it sent requests late (send lag p99 {fmt_ms(send['p99'])} ms > {d.late_ms:g} ms), which "
                           "counts as latency the server did not cause")
    if delivery := stats_ms(d.run.histograms.get("delivery_lag")):
        lags["delivery lag"] = delivery["p99"]
        evidence.append(f"delivery lag p99 {fmt_ms(delivery['p99'])} ms (server emit -> timestamped here)")
    if generator.get("cpu_percent") is not None:
        evidence.append(f"generator CPU {generator['cpu_percent']:.0f}% of a core")
    warnings = generator.get("warnings") or []
    evidence += [f"warning: {w}" for w in warnings]
    if lags:
        name, worst = max(lags.items(), key=lambda item: item[1])
        p50s = {metric: stats["p50"] for metric in ("ttft", "tpot")
                if (stats := stats_ms(d.run.histograms.get(metric)))}
        scale = [f"{worst / p50:.1%} of the {metric.upper()} p50 ({fmt_ms(p50)} ms)" for metric, p50 in p50s.items()]
        larger = "larger " if len(lags) > 1 else ""
        evidence += [f"the {larger}lag p99 ({name}, {fmt_ms(worst)} ms) is " + " and ".join(scale)] if scale else []
        finest = min(p50s.values(), default=None)
        if finest and worst > MATERIAL_LAG_SHARE * finest:
            reasons.append(f"its {name} p99 ({fmt_ms(worst)} ms) is over {MATERIAL_LAG_SHARE:.0%} of the finest "
                           f"latency measured ({fmt_ms(finest)} ms p50)")
    if not reasons:
        warned = f"; it warned {len(warnings)} time(s), but its lags are small beside the latencies measured" \
            if warnings else " and raised no warnings"
        return Finding(*rule, False, f"The load generator kept its schedule{warned}.", evidence)
    size = f" (lag p99 up to {fmt_ms(max(lags.values()))} ms)" if lags else ""
    return Finding(*rule, True, f"The load generator's own lateness{size} makes the latency figures suspect: "
                   + " and ".join(reasons) + "; see its warnings.", evidence)


def _times(s: ServerSeries, mask: np.ndarray, most: int = 4) -> str:
    ends = [f"{t:.1f}" for t in s.t_s[mask]]
    return "at " + ", ".join(ends[:most]) + (f" and {len(ends) - most} more" if len(ends) > most else "") + " s"


# --- rendering and the command ------------------------------------------------------------------

def render_text(findings: list[Finding]) -> str:
    fired = [f for f in findings if f.fired]
    lines = [f"diagnosis: {len(fired)} of {len(findings)} rules fired"]
    for f in fired:
        lines += [f"FIRED {f.title}: {f.verdict}"] + [f"  - {e}" for e in f.evidence]
    lines += [f"not fired  {f.title}: {f.verdict}" for f in findings if f.judged and not f.fired]
    lines += [f"not judged {f.title}: {f.verdict}" for f in findings if not f.judged]
    return "\n".join(lines)


def render_markdown(findings: list[Finding]) -> str:
    fired = [f for f in findings if f.fired]
    parts = ["## Diagnosis", f"{len(fired)} of {len(findings)} rules fired (seed 5.3; thresholds in "
             "`analysis/diagnosis.py`)."]
    for f in fired:
        parts += [f"### {f.title}", f.verdict, "\n".join(f"- {e}" for e in f.evidence)]
    if quiet := [f for f in findings if f.judged and not f.fired]:
        parts += ["### Did not fire", "\n".join(f"- **{f.title}**: {f.verdict}" for f in quiet)]
    if unjudged := [f for f in findings if not f.judged]:
        parts += ["### Could not be judged", "\n".join(f"- **{f.title}**: {f.verdict}" for f in unjudged)]
    return "\n\n".join(parts) + "\n"


def add_command(commands) -> None:
    parser = commands.add_parser("diagnose", help="bottleneck rules (seed 5.3) with their evidence: diagnosis.md")
    parser.add_argument("run_dir", help="directory holding summary.json, histograms.json and the interval files")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    findings = diagnose(run)
    print(render_text(findings))
    try:
        (run.path / DIAGNOSIS_MD).write_text(render_markdown(findings))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the diagnosis: {e}") from None
    print(f"\ndiagnosis: {run.path / DIAGNOSIS_MD}")
    print(json.dumps({"fired": [f.rule for f in findings if f.fired],
                      "not_fired": [f.rule for f in findings if f.judged and not f.fired],
                      "not_judged": [f.rule for f in findings if not f.judged]}))
