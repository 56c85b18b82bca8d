"""Diagnosis rules on a server's own /metrics (server_metrics.jsonl through
records/engine_maps.py), so they judge any target that serves them, not only this project's:
saturation (waiting grows while running sits at its cap), KV-cache pressure (usage near full
with preemptions), prefix-cache misses (a hit rate well below what the run's prompts shared,
summary.json's workload.prefix_share), expert imbalance (balancedness low), and a slow front
door (the client's TTFT far above the server's own). Each names the families it read; a rule
whose families the server does not expose says which. The prefix rule reads this project's
server's GetStats counters where nothing was scraped."""

from __future__ import annotations

import numpy as np

from analysis.readers.server_metrics import SourceSeries, figures
from analysis.readers.server_stats import server_view
from analysis.rules.delivery import generator_limited
from analysis.rules.finding import Finding
from analysis.rules.spikes import Signals
from records.metric_maps import BY_CONCEPT

QUEUE_RISE_REQUESTS = 2.0  # fitted rise of `waiting` over the run that counts as growing
AT_CAP_SHARE = 0.5  # ... while running sat at its highest value in this share of the scrapes
KV_FULL = 0.9  # usage this high, with preemptions, is pressure
KV_FULL_ALONE = 0.98  # where preemptions are not exposed, usage alone must reach this
BALANCE_LOW = 0.8  # mean over max expert load below this is imbalance
FRONT_DOOR_RATIO = 1.5  # the client's mean TTFT this many times the server's ...
FRONT_DOOR_MS = 10.0  # ... and at least this much more
PREFIX_SHARED = 0.1  # a workload sharing less than this of its prompt tokens is not judged on it
PREFIX_MISSED = 0.5  # a hit rate below this share of what the workload shared is a miss
MIN_SCRAPES = 5

SATURATED = ("server_saturated", "Server saturated (its own metrics)")
KV = ("kv_pressure", "KV-cache pressure (its own metrics)")
PREFIX = ("prefix_misses", "Prefix-cache misses (its own metrics)")
IMBALANCE = ("server_expert_imbalance", "Expert imbalance (its own metrics)")
FRONT_DOOR = ("front_door", "Slow front door: the client's TTFT far above the server's")


def _with(d: Signals, *concepts: str) -> tuple[SourceSeries | None, str]:
    """The first scraped source exposing every concept, or (None, why not)."""
    engines = d.scraped.engines
    if not engines:
        return None, ("no server metrics were scraped (server_metrics.jsonl missing or empty; "
                      "--server-metrics names the endpoint)")
    for series in engines:
        if all(c in series.sources() for c in concepts) and len(series.t_s) >= 2:
            return series, ""
    missing = [BY_CONCEPT[c].title for c in concepts
               if not any(c in s.sources() for s in engines)]
    if missing:
        return None, f"not exposed by the scraped server: {', '.join(missing)}"
    return None, "fewer than two scrapes were read"


def _family(series: SourceSeries, concept: str) -> str:
    source = series.sources()[concept]
    return f"`{source.family}`" + (f" / `{source.per}`" if source.per else "")


def saturated(d: Signals) -> Finding:
    series, why = _with(d, "waiting", "running")
    if series is None:
        return Finding(*SATURATED, False, why, [], judged=False)
    t = np.array(series.t_s)
    waiting, running = series.values("waiting"), series.values("running")
    # while requests were scheduled, after the warm-up: the drain empties the queue by design
    summary = d.run.summary
    scheduled = (t >= summary.config.recording.warmup_s) & (t <= summary.duration_s + 0.5)
    ok = ~np.isnan(waiting) & ~np.isnan(running) & scheduled
    if ok.sum() < MIN_SCRAPES:
        return Finding(*SATURATED, False, f"only {ok.sum()} scrapes hold both gauges while "
                       f"requests were scheduled (need {MIN_SCRAPES})", [], judged=False)
    t, waiting, running = t[ok], waiting[ok], running[ok]
    slope = np.polyfit(t, waiting, 1)[0] if np.ptp(t) > 0 else 0.0
    rise = float(slope * np.ptp(t))
    cap = float(running.max())
    at_cap = float(np.mean(running[waiting > 0] >= cap)) if (waiting > 0).any() else 0.0
    evidence = [f"waiting ({_family(series, 'waiting')}): fitted rise {rise:+.1f} requests over "
                f"{np.ptp(t):.0f} s, from {waiting[0]:.0f} to {waiting[-1]:.0f}",
                f"running ({_family(series, 'running')}): at its highest, {cap:.0f}, in "
                f"{100 * at_cap:.0f}% of the scrapes with requests waiting"]
    fired = rise >= QUEUE_RISE_REQUESTS and at_cap >= AT_CAP_SHARE
    verdict = (f"Requests queue up while the running batch is full at {cap:.0f}: the server "
               "cannot take more; the load is past what it holds." if fired else
               f"No saturation: waiting rose {rise:+.1f} (fires at {QUEUE_RISE_REQUESTS:g}) "
               f"with running at its cap {100 * at_cap:.0f}% of the time (fires at "
               f"{100 * AT_CAP_SHARE:.0f}%).")
    return Finding(*SATURATED, fired, verdict, evidence)


def kv_pressure(d: Signals) -> Finding:
    series, why = _with(d, "kv_usage")
    if series is None:
        return Finding(*KV, False, why, [], judged=False)
    figs = figures(series)
    usage = figs["kv_usage"]
    evidence = [f"KV-cache usage ({_family(series, 'kv_usage')}): mean "
                f"{100 * usage.mean:.1f}%, max {100 * usage.max:.1f}%"]
    preempted = figs.get("preemptions")
    if preempted is not None:
        evidence.append(f"preemptions ({_family(series, 'preemptions')}): "
                        f"{preempted.total:.0f} over the run")
        fired = usage.max >= KV_FULL and (preempted.total or 0) > 0
        verdict = ("The KV cache fills and the server preempts requests (recomputing or "
                   "swapping them): more KV memory, a smaller batch or shorter contexts." if fired
                   else f"No KV pressure: usage peaked at {100 * usage.max:.1f}% (fires at "
                   f"{100 * KV_FULL:.0f}% with preemptions), {preempted.total:.0f} preemptions.")
    else:
        evidence.append("preemptions: not exposed by this server, judged on usage alone")
        fired = usage.max >= KV_FULL_ALONE
        verdict = (f"The KV cache reached {100 * usage.max:.1f}% full." if fired else
                   f"No KV pressure: usage peaked at {100 * usage.max:.1f}% (fires at "
                   f"{100 * KV_FULL_ALONE:.0f}% where preemptions are not exposed).")
    return Finding(*KV, fired, verdict, evidence)


def _getstats_prefix(d: Signals) -> tuple[float, str] | None:
    """This project's server without /metrics: its prefix-cache counters over the run, from
    its GetStats snapshots (hit rate, what was read); None where it counted none."""
    view = server_view(d.run.summary.server)
    queries = view.counters.get("prefix_cache_queries", 0) if view is not None else 0
    if not queries:
        return None
    return (view.counters.get("prefix_cache_hits", 0) / queries,
            f"GetStats prefix_cache_hits / prefix_cache_queries, {view.basis}")


def prefix_misses(d: Signals) -> Finding:
    series, why = _with(d, "prefix_queries")
    gauge = None
    if series is None:
        series, _ = _with(d, "prefix_hit_rate")
        gauge = series is not None
    if series is None and (own := _getstats_prefix(d)) is not None:
        rate, used = own
    elif series is None:
        return Finding(*PREFIX, False, why, [], judged=False)
    elif gauge:
        figs = figures(series)
        rate, used = figs["prefix_hit_rate"].mean, _family(series, "prefix_hit_rate")
    else:
        figs = figures(series)
        queries = figs["prefix_queries"].total
        # a server that makes its series on first use (SGLang) has none until its first hit
        hits = figs["prefix_hits"].total if "prefix_hits" in figs else 0.0
        rate = hits / queries if queries else None
        used = (f"{_family(series, 'prefix_hits')} / {_family(series, 'prefix_queries')}"
                if "prefix_hits" in figs else
                f"no hits series: none counted / {_family(series, 'prefix_queries')}")
    if rate is None:
        return Finding(*PREFIX, False, "the server counted no prefix-cache query", [],
                       judged=False)
    evidence = [f"hit rate {100 * rate:.1f}% ({used})"]
    workload = d.run.summary.workload
    if workload is None:
        return Finding(*PREFIX, False, "how much the workload's prompts shared is not known "
                       "(summary.json has no workload: a distributed or older run)", evidence,
                       judged=False)
    allowed = workload.prefix_share
    evidence.append(f"the workload's prompts shared {100 * allowed:.1f}% of their tokens by "
                    "16-token blocks (summary.json workload.prefix_share: what a cache of 262,144 "
                    "tokens hits)")
    if allowed < PREFIX_SHARED:
        return Finding(*PREFIX, False, f"Not fired: the workload's prompts share little "
                       f"({100 * allowed:.1f}%, judged from {100 * PREFIX_SHARED:.0f}%).",
                       evidence)
    fired = rate < PREFIX_MISSED * allowed
    verdict = (f"The server hit {100 * rate:.1f}% of prompt tokens in its prefix cache where the "
               f"workload shared {100 * allowed:.1f}%: prefix caching is off, too small, or "
               "evicts what requests share (routing across replicas without prefix affinity "
               "does the same)." if fired else
               f"The prefix cache hit {100 * rate:.1f}% of the {100 * allowed:.1f}% the workload "
               f"shared (fires below {100 * PREFIX_MISSED:.0f}% of it).")
    return Finding(*PREFIX, fired, verdict, evidence)


def expert_imbalance(d: Signals) -> Finding:
    series, why = _with(d, "expert_balance")
    if series is None:
        return Finding(*IMBALANCE, False, why, [], judged=False)
    f = figures(series)["expert_balance"]
    if f.mean is None:
        return Finding(*IMBALANCE, False, "the expert load did not grow between scrapes", [],
                       judged=False)
    evidence = [f"balancedness ({_family(series, 'expert_balance')}): {f.mean:.3f} over the "
                f"run, lowest interval {f.min:.3f}" if f.min is not None else
                f"balancedness ({_family(series, 'expert_balance')}): {f.mean:.3f} over the run"]
    fired = f.mean < BALANCE_LOW
    verdict = (f"Experts are loaded unevenly: the busiest carries {1 / f.mean:.2f}x the mean, "
               "so the step waits for it; rebalance (EPLB) or replicate the hot experts." if fired
               else f"Expert load is balanced enough: {f.mean:.3f} (fires below {BALANCE_LOW}).")
    return Finding(*IMBALANCE, fired, verdict, evidence)


def front_door(d: Signals) -> Finding:
    series, why = _with(d, "ttft")
    if series is None:
        return Finding(*FRONT_DOOR, False, why, [], judged=False)
    if (late := generator_limited(d)).fired:
        return Finding(*FRONT_DOOR, False, "The load generator was late (Load generator "
                       "limited): its own lateness, not the server's front door, may hold the "
                       "client's TTFT above the server's.", late.evidence[:2], judged=False)
    window = figures(series)["ttft"].window
    client = d.run.histograms.get("ttft")
    if window is None or window.mean is None or client is None or not client.total_count:
        return Finding(*FRONT_DOOR, False, "no TTFT on one side (the server's histogram did not "
                       "grow, or no request got a first token)", [], judged=False)
    server_ms, client_ms = window.mean * 1e3, client.get_mean_value() / 1e3
    evidence = [f"server TTFT mean {server_ms:.1f} ms ({_family(series, 'ttft')}, "
                f"{window.count:.0f} requests)",
                f"client TTFT mean {client_ms:.1f} ms ({client.total_count} requests)"]
    fired = client_ms >= FRONT_DOOR_RATIO * server_ms and client_ms - server_ms >= FRONT_DOOR_MS
    verdict = (f"The client waits {client_ms - server_ms:.1f} ms more for its first token than "
               "the engine takes: the time goes in front of the engine (the HTTP server, a "
               "proxy or gateway, the network, or the tokenizer)." if fired else
               f"The server's TTFT accounts for the client's: {server_ms:.1f} ms of "
               f"{client_ms:.1f} ms.")
    return Finding(*FRONT_DOOR, fired, verdict, evidence)


def scraped_rules(d: Signals) -> list[Finding]:
    return [saturated(d), kv_pressure(d), prefix_misses(d), expert_imbalance(d), front_door(d)]
