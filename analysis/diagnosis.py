"""Rule-based bottleneck diagnosis of one run (seed 5.3): each rule says whether it fired and
the numbers, with their times, that made it fire, did not, or could not be judged.

Throughput: the wait queue grows while the device is under-utilised (the scheduler, policy or
KV pool holds requests back), or the requests in the server grow while it is busy
(compute-saturated, the knee; in a stress run, the step it stopped on saturation; both in
analysis/rules/saturation.py); one layer's
expert load is far above its mean; copying expert weights in takes a large share of step
time; the exchanges between expert-parallel ranks wait long or fill the link
(analysis/rules/expert_parallel.py). Latency: windows whose TTFT or TPOT p99 jumps, lined up with a
hot expert, a cache-miss burst, queue growth or the load generator's own lateness
(analysis/rules/spikes.py); and the
generator's lateness, or its closed loop, over the whole run. Failures: which codes, when, and
when the server could not be reached (analysis/rules/failures.py); faults the server injected on
purpose, and when (analysis/rules/faults.py). Reads only run-directory files.
"""

from __future__ import annotations

import argparse

import numpy as np

from analysis.readers.files import RunDirError
from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run, load_run
from analysis.readers.server_stats import expert_shares, server_view
from analysis.rules.delivery import delivery_split
from analysis.rules.delivery import lines as delivery_lines
from analysis.rules.expert_parallel import communication
from analysis.rules.failures import failures
from analysis.rules.faults import faults
from analysis.rules.finding import Finding
from analysis.rules.saturation import queue_rules
from analysis.rules.spikes import (
    CAUSES,
    MIN_WINDOW_SAMPLES,
    SPIKE_FACTOR,
    MetricSpikes,
    Signals,
    causes,
    find_spikes,
    signals_of,
    when,
)
from analysis.tables import fmt_ms
from records.jsonform import dumps

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


def diagnose(run: Run) -> list[Finding]:
    return rules(signals_of(run))


def rules(signals: Signals) -> list[Finding]:
    """Every rule on a run's signals (analysis/rules/spikes.py signals_of)."""
    return [failures(signals.run), faults(signals.run), *queue_rules(signals), _imbalance(signals),
            _data_movement(signals), communication(signals.run.summary.server), _spikes(signals),
            _generator(signals), _write_delay(signals)]


def _imbalance(d: Signals) -> Finding:
    rule = ("expert_imbalance", "Expert load imbalance")
    view = server_view(d.run.summary.server)
    if view is None or view.expert_tokens is None:
        return Finding(*rule, False, "summary.json has no server expert_tokens over the run "
                       "(no start/end GetStats, or no token was routed in the window)", [],
                       judged=False)
    tokens = view.expert_tokens.astype(float)
    ratio = tokens.max(axis=1) / tokens.mean(axis=1)  # [L]
    shares = expert_shares(tokens)
    over = np.flatnonzero(ratio > IMBALANCE_MAX_OVER_MEAN)
    worst = int(ratio.argmax())
    hot = int(tokens[worst].argmax())
    evidence = [f"layer {worst}: expert {hot} took {shares[worst, hot]:.1%} of its routed "
                f"(token, expert) pairs (mean {1 / tokens.shape[1]:.1%}), "
                f"max/mean {ratio[worst]:.2f}",
                f"{len(over)} of {len(ratio)} layers above {IMBALANCE_MAX_OVER_MEAN:g} "
                f"({view.basis})"]
    if d.series is not None and np.isfinite(d.imbalance).any():
        imb = np.nan_to_num(d.imbalance, nan=-1.0)
        top = np.argsort(-imb, kind="stable")[:TOP_INTERVALS]
        sparse = int((np.isfinite(d.series.imbalance) & ~np.isfinite(d.imbalance)).sum())
        evidence.append("highest interval max/mean (most imbalanced layer): "
                        + ", ".join(f"{imb[i]:.2f} at {when(d.series, i)}"
                                    for i in top if imb[i] >= 0)
                        + (f"; {sparse} interval(s) under {d.min_routed_per_layer:.0f} "
                           "(token, expert) pairs per layer left out" if sparse else ""))
    settings = d.run.summary.server.latest.reported_settings()
    if settings.get("routing_skew"):
        factor = settings.get("capacity_factor")
        evidence.append(f"router {settings.get('router', '?')}, "
                        f"routing skew {settings['routing_skew']}"
                        + (f", capacity factor {factor}" if factor else ""))
    if not len(over):
        return Finding(*rule, False, f"Every layer's max/mean expert load is at most "
                       f"{ratio[worst]:.2f} (threshold {IMBALANCE_MAX_OVER_MEAN:g}).", evidence)
    return Finding(*rule, True, f"Expert load is imbalanced: layer {worst}'s expert {hot} carried "
                   f"{ratio[worst]:.2f}x the mean load (above {IMBALANCE_MAX_OVER_MEAN:g}); under "
                   "expert parallelism its device would set every step's pace, and a balancing "
                   "router or capacity factor would spread it.", evidence)


def _data_movement(d: Signals) -> Finding:
    rule = ("data_movement", "Data movement (expert weight copies) share of step time")
    scope = ("This measures copying expert weights in on cache misses; the all-to-all exchanges "
             "of expert parallelism are judged apart (communication).")
    s = d.series
    if s is None or s.step_ms.sum() <= 0:
        return Finding(*rule, False, "server_stats.jsonl has no step time (missing, under two "
                       "snapshots, or no step ran)", [], judged=False)
    step_ms, copy_ms = float(s.step_ms.sum()), float(s.cache_copy_ms.sum())
    hits, misses, steps = (float(s.cache_hits.sum()), float(s.cache_misses.sum()),
                           float(s.steps.sum()))
    if not d.expert_cache:
        return Finding(*rule, False, "No --expert-cache: every expert stays resident and no "
                       "weights are copied. " + scope,
                       [f"copy 0 ms of {step_ms / 1000:.1f} s of step time"])
    share = copy_ms / step_ms
    lookups = hits + misses
    evidence = [f"copy {fmt_ms(copy_ms)} ms of {fmt_ms(step_ms)} ms step time ({share:.1%}; "
                f"threshold {DATA_MOVEMENT_SHARE:.0%})",
                (f"hit rate {hits / lookups:.1%} ({hits:.0f} hits, {misses:.0f} misses)"
                 if lookups else "no lookups")
                + f"; {d.expert_cache} resident experts per layer",
                f"{fmt_ms(copy_ms / steps if steps else None)} ms copying per step"
                + (f", {fmt_ms(copy_ms / misses)} ms per miss" if misses else "")]
    if share <= DATA_MOVEMENT_SHARE:
        return Finding(*rule, False, f"Expert weight copies took {share:.1%} of step time (at most "
                       f"{DATA_MOVEMENT_SHARE:.0%}). " + scope, evidence)
    return Finding(*rule, True, f"Copying expert weights in on cache misses took {share:.1%} of "
                   f"step time (above {DATA_MOVEMENT_SHARE:.0%}): data movement, not compute, "
                   "limits steps; a larger --expert-cache or another --cache-policy would cut it. "
                   + scope, evidence)


# --- latency spikes ---------------------------------------------------------------------------

def _spikes(d: Signals) -> Finding:
    rule = ("latency_spikes", "Latency spikes")
    found = [find_spikes(d.run, metric) for metric in ("ttft", "tpot")]
    judged = [f for f in found if isinstance(f, MetricSpikes)]
    missing = [f for f in found if isinstance(f, str)]
    if not judged:
        return Finding(*rule, False, "Not enough requests per interval: " + "; ".join(missing),
                       [], judged=False)
    evidence = [f"{f.metric.upper()}: median window p99 {fmt_ms(f.typical_ms)} ms over "
                f"{f.windows} windows of >= {MIN_WINDOW_SAMPLES} requests; a spike is above "
                f"{fmt_ms(f.limit_ms)} ms" for f in judged]
    evidence += [f"not judged: {m}" for m in missing]
    spikes = sorted((spike for f in judged for spike in f.spikes),
                    key=lambda spike: spike.window.start_s)
    if not spikes:
        return Finding(*rule, False, f"No window's p99 rose above {SPIKE_FACTOR:g}x the run's "
                       "median window p99 (by the minimum jump).", evidence)
    tally, unexplained, lines = dict.fromkeys(CAUSES, 0), 0, []
    for spike in spikes:
        lined, looked = causes(d, spike)
        for name, _ in lined:
            tally[name] += 1
        unexplained += not lined
        said = "; ".join(f"{name}: {detail}" for name, detail in lined) if lined else \
            "no cause found among " + ", ".join(CAUSES)
        lines.append((spike.p99_ms / spike.typical_ms,
                      f"{spike.describe()}; looked at {looked}: {said}"))
    # The largest jumps when there are many, kept in time order.
    kept = sorted(sorted(lines, key=lambda line: -line[0])[:SPIKES_LISTED], key=lines.index)
    evidence += [text for _, text in kept]
    evidence += ([f"and {len(lines) - len(kept)} smaller spike windows"]
                 if len(lines) > len(kept) else [])
    what = ", ".join(f"{f.metric.upper()} {len(f.spikes)}" for f in judged if f.spikes)
    lined_up = ", ".join(f"{name} ({n})" for name, n in tally.items() if n) or "nothing"
    verdict = f"Latency spiked in {len(spikes)} window(s) ({what}); lined up with {lined_up}"
    verdict += f"; no cause found for {unexplained}." if unexplained else "."
    return Finding(*rule, True, verdict, evidence)


# --- the load generator -----------------------------------------------------------------------

def _generator(d: Signals) -> Finding:
    rule = ("generator_limited", "Load generator limited")
    summary = d.run.summary
    generator = summary.generator
    send = stats_ms(d.run.histograms.get("send_lag"))
    if send is None and summary.metrics.get("send_lag_ms") and summary.metrics["send_lag_ms"].count:
        send = summary.metrics["send_lag_ms"]
    evidence, reasons, lags = [], [], {}
    p50s = {metric: stats.p50 for metric in ("ttft", "tpot")
            if (stats := stats_ms(d.run.histograms.get(metric)))}
    finest = min(p50s.values(), default=None)
    if send:
        lags["send lag"] = send.p99
        evidence.append(f"send lag p99 {fmt_ms(send.p99)} ms, max {fmt_ms(send.max)} ms (threshold "
                        f"{d.late_ms:g} ms); {generator.late_sends} late sends")
        # late, and by enough to matter: one send 5 ms late beside a 300 ms TTFT accuses no one
        if send.p99 > d.late_ms and not (finest and send.p99 <= MATERIAL_LAG_SHARE * finest):
            reasons.append(f"it sent requests late (send lag p99 {fmt_ms(send.p99)} ms > "
                           f"{d.late_ms:g} ms), which counts as latency the server did not cause")
    if loop := stats_ms(d.run.histograms.get("loop_lag")):
        lags["loop lag"] = loop.p99
        evidence.append(f"loop lag p99 {fmt_ms(loop.p99)} ms (how late the generator's own "
                        "event loop woke: its timestamps are as late)")
    if delivery := stats_ms(d.run.histograms.get("delivery_lag")):
        evidence.append(f"delivery lag p99 {fmt_ms(delivery.p99)} ms (server stamp -> "
                        "timestamped here; its parts: see the server write delay rule)")
    evidence.append(f"generator CPU {generator.cpu_percent:.0f}% of a core")
    warnings = generator.warnings
    evidence += [f"warning: {w}" for w in warnings]
    closed = (summary.config.traffic.mode == "closed"
              or any(w.startswith("closed loop:") for w in warnings))
    if lags:
        name, worst = max(lags.items(), key=lambda item: item[1])
        scale = [f"{worst / p50:.1%} of the {metric.upper()} p50 ({fmt_ms(p50)} ms)"
                 for metric, p50 in p50s.items()]
        larger = "larger " if len(lags) > 1 else ""
        evidence += [f"the {larger}lag p99 ({name}, {fmt_ms(worst)} ms) is "
                     + " and ".join(scale)] if scale else []
        # late by the generator's own standard (its late-send threshold) and by enough to matter
        if finest and worst > max(MATERIAL_LAG_SHARE * finest, d.late_ms) and not reasons:
            reasons.append(f"its {name} p99 ({fmt_ms(worst)} ms) is over {MATERIAL_LAG_SHARE:.0%} "
                           f"of the finest latency measured ({fmt_ms(finest)} ms p50) and over "
                           f"{d.late_ms:g} ms")
    size = f" (lag p99 up to {fmt_ms(max(lags.values()))} ms)" if lags else ""
    late = (f"load generator's own lateness{size} makes the latency figures suspect: "
            + " and ".join(reasons))
    if closed:  # no schedule to keep: the loop itself is the generator's limit
        return Finding(*rule, True, "The closed loop (--mode closed) under-states latency under "
                       "load: each user waited for its previous response before sending, so a "
                       "slow server was sent fewer requests and its queueing is missing from the "
                       "figures (coordinated omission); use --mode fixed to measure latency at a "
                       "given offered load." + (f" Also, the {late}." if reasons else ""), evidence)
    if not reasons:
        warned = (f"; it warned {len(warnings)} time(s), but its lags are small beside the "
                  "latencies measured" if warnings else " and raised no warnings")
        return Finding(*rule, False, f"The load generator kept its schedule{warned}.", evidence)
    return Finding(*rule, True, f"The {late}; see its warnings.", evidence)


def _write_delay(d: Signals) -> Finding:
    """The server's own part of the delivery lag: stamped -> its transport accepted the
    message (analysis/rules/delivery.py)."""
    rule = ("server_write_delay", "Server write delay")
    split = delivery_split(d.run)
    if split is None or split.write is None:
        return Finding(*rule, False, "No server write delay over the run (an older server, or "
                       "a target that does not report one).", [], judged=False)
    evidence = delivery_lines(split)
    end = d.run.summary.server.latest
    busy = (d.series.step_ms.sum() / 1000 / d.series.length_s.sum()
            if d.series is not None and d.series.length_s.sum() > 0 else None)
    evidence.append(f"server process CPU {end.process_cpu_percent:.0f}% of a core"
                    + (f", engine steps {busy:.0%} of the time" if busy is not None else ""))
    write, delivery = split.write, split.delivery
    p50s = [s.p50 for m in ("ttft", "tpot") if (s := stats_ms(d.run.histograms.get(m)))]
    finest = min(p50s, default=None)
    material = finest is not None and write.p99 > MATERIAL_LAG_SHARE * finest
    dominant = delivery.mean > 0 and write.mean > 0.5 * delivery.mean
    if not (material and dominant):
        return Finding(*rule, False, f"The server's writes took a mean {fmt_ms(write.mean)} ms "
                       f"(p99 <= {write.p99:g} ms) of a {fmt_ms(delivery.mean)} ms mean delivery "
                       "lag" + ("" if material else ", small beside the latencies measured")
                       + ".", evidence)
    return Finding(*rule, True, f"The server's own writes are most of the delivery lag: stamped "
                   f"-> accepted by its transport in a mean {fmt_ms(write.mean)} ms of "
                   f"{fmt_ms(delivery.mean)} ms, p99 <= {write.p99:g} ms (over "
                   f"{MATERIAL_LAG_SHARE:.0%} of the finest latency, {fmt_ms(finest)} ms p50). "
                   "The likely cause is the engine sharing the server's process with the event "
                   "loop that writes: its thread's Python holds the interpreter lock and its "
                   "compute the cores the loop and gRPC's threads need; fewer torch threads, or "
                   "a machine with cores to spare, shorten it.", evidence)


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
    parts = ["## Diagnosis",
             f"{len(fired)} of {len(findings)} rules fired (seed 5.3; thresholds in "
             "`analysis/diagnosis.py` and `analysis/rules/`)."]
    for f in fired:
        parts += [f"### {f.title}", f.verdict, "\n".join(f"- {e}" for e in f.evidence)]
    if quiet := [f for f in findings if f.judged and not f.fired]:
        parts += ["### Did not fire", "\n".join(f"- **{f.title}**: {f.verdict}" for f in quiet)]
    if unjudged := [f for f in findings if not f.judged]:
        parts += ["### Could not be judged",
                  "\n".join(f"- **{f.title}**: {f.verdict}" for f in unjudged)]
    return "\n\n".join(parts) + "\n"


def add_command(commands) -> None:
    parser = commands.add_parser(
        "diagnose", help="bottleneck rules (seed 5.3) with their evidence: diagnosis.md")
    parser.add_argument("run_dir", help="directory holding summary.json, histograms.json and the "
                        "interval files")
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
    print(dumps({"fired": [f.rule for f in findings if f.fired],
                      "not_fired": [f.rule for f in findings if f.judged and not f.fired],
                      "not_judged": [f.rule for f in findings if not f.judged]}))
