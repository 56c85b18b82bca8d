"""The diagnosis rules on the experts: one layer's expert load far above its mean, and
copying expert weights in on cache misses taking a large share of step time."""

from __future__ import annotations

import numpy as np

from analysis.readers.routed_experts import read_routing
from analysis.readers.server_stats import expert_shares, server_view
from analysis.rules.finding import Finding
from analysis.rules.spikes import Signals, when
from analysis.tables import fmt_ms

# Expert load max/mean: with expert parallelism every step waits for the hottest expert, so at
# 1.5 a third of the expert compute capacity idles (1 - 1/1.5).
IMBALANCE_MAX_OVER_MEAN = 1.5
# Expert-weight copy time / step time: above a fifth, moving weights costs more than a typical
# MoE layer's routing and combine together, and a bigger cache is the cheaper fix.
DATA_MOVEMENT_SHARE = 0.2
TOP_INTERVALS = 3  # most imbalanced intervals listed beside the run-wide figure


def expert_load(d: Signals) -> tuple[np.ndarray, str] | None:
    """[layers, experts] tokens routed over the run and where they were read: the server's
    GetStats, else the routed experts its replies carried (routed_experts.jsonl: vLLM's,
    SGLang's); None where neither holds any."""
    view = server_view(d.run.summary.server)
    if view is not None and view.expert_tokens is not None:
        return view.expert_tokens.astype(float), view.basis
    routing = read_routing(d.run.path)
    measured = routing.measured() if routing is not None else []
    if routing is None or not len(measured):
        return None
    return (routing.load(measured).astype(float),
            f"the routed experts of {len(measured)} replies, routed_experts.jsonl")


def expert_imbalance(d: Signals) -> Finding:
    rule = ("expert_imbalance", "Expert load imbalance")
    load = expert_load(d)
    if load is None:
        return Finding(*rule, False, "no expert load over the run: summary.json has no server "
                       "expert_tokens (no start/end GetStats, or no token routed in the window) "
                       "and no reply carried routed experts (--routed-experts)", [],
                       judged=False)
    tokens, basis = load
    ratio = tokens.max(axis=1) / tokens.mean(axis=1)  # [L]
    shares = expert_shares(tokens)
    over = np.flatnonzero(ratio > IMBALANCE_MAX_OVER_MEAN)
    worst = int(ratio.argmax())
    hot = int(tokens[worst].argmax())
    evidence = [f"layer {worst}: expert {hot} took {shares[worst, hot]:.1%} of its routed "
                f"(token, expert) pairs (mean {1 / tokens.shape[1]:.1%}), "
                f"max/mean {ratio[worst]:.2f}",
                f"{len(over)} of {len(ratio)} layers above {IMBALANCE_MAX_OVER_MEAN:g} "
                f"({basis})"]
    if d.series is not None and np.isfinite(d.imbalance).any():
        imb = np.nan_to_num(d.imbalance, nan=-1.0)
        top = np.argsort(-imb, kind="stable")[:TOP_INTERVALS]
        sparse = int((np.isfinite(d.series.imbalance) & ~np.isfinite(d.imbalance)).sum())
        evidence.append("highest interval max/mean (most imbalanced layer): "
                        + ", ".join(f"{imb[i]:.2f} at {when(d.series, i)}"
                                    for i in top if imb[i] >= 0)
                        + (f"; {sparse} interval(s) under {d.min_routed_per_layer:.0f} "
                           "(token, expert) pairs per layer left out" if sparse else ""))
    latest = d.run.summary.server.latest
    settings = latest.reported_settings() if latest is not None else {}
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


def data_movement(d: Signals) -> Finding:
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
