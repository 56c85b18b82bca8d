"""Expert parallelism over a run (a server started with --ep 2 or more): what its MoE layers'
exchanges moved between ranks and what they cost, from the GetStats snapshots at the run's
start and end (summary.json's `server`).

Bytes are the server's own counts from the actual routing (hidden states sent to another
rank's experts, and their outputs back). Beside them is the volume the usual formula gives,
tokens x k x hidden size x element size x (N - 1) / N per layer and direction: the share of
pairs that would cross under uniform routing over a contiguous placement. Times: measured
(each exchange, summed), exposed (what steps waited for, not hidden behind compute) and
modelled (the --link-gbps link); the link's utilisation is the busiest pair's bytes over the
window at the link's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.readers.server_stats import EMPTY, reset_between
from analysis.rules.finding import Finding
from records.server_stats import ExpertParallelStats, Histogram, ServerStats
from records.summary import ServerSnapshots

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class EpView:
    ranks: int
    comm: str
    placement: str
    overlap: str
    dispatch_bytes: np.ndarray  # [source, destination] over the window
    combine_bytes: np.ndarray
    formula_bytes: float | None  # the usual formula's volume, one direction, all layers
    ms: dict[str, float]  # {dispatch,combine}_{measured,exposed,modelled}
    step_ms: float  # the engine's step time over the window
    window_s: float
    exchanges: int
    placements: int
    experts_moved: int
    rank_pairs: np.ndarray | None  # [layer, rank] (token, expert) pairs each rank computed
    link_gbps: float | None
    link_latency_us: float | None

    @property
    def total_bytes(self) -> float:
        return float(self.dispatch_bytes.sum() + self.combine_bytes.sum())

    def share(self, kind: str) -> float | None:
        """Dispatch + combine time of this kind over the step time."""
        total = self.ms[f"dispatch_{kind}"] + self.ms[f"combine_{kind}"]
        return total / self.step_ms if self.step_ms else None

    @property
    def link_utilisation(self) -> float | None:
        """The busiest rank pair's bytes over the window at the modelled link's bandwidth."""
        if not self.link_gbps or not self.window_s:
            return None
        busiest = float((self.dispatch_bytes + self.combine_bytes).max())
        return busiest * 8 / (self.link_gbps * 1e9 * self.window_s)

    @property
    def rank_imbalance(self) -> float | None:
        """max / mean of the ranks' computed pairs, in the worst layer."""
        if self.rank_pairs is None or not self.rank_pairs.sum():
            return None
        loads = self.rank_pairs.astype(float)
        return float((loads.max(axis=1) / np.maximum(loads.mean(axis=1), 1e-12)).max())


def ep_view(server: ServerSnapshots) -> EpView | None:
    """The run's expert-parallel figures; None when the server ran as one rank."""
    start = server.start if server.start is not None and server.start.ok else None
    end = server.end if server.end is not None and server.end.ok else None
    snap = end or start
    if snap is None or snap.expert_parallel is None or snap.expert_parallel.ranks < 2:
        return None
    base = start if start and end and not reset_between(start, end) else EMPTY
    now, before = snap.expert_parallel, base.expert_parallel or ExpertParallelStats()
    ranks = now.ranks
    settings = snap.reported_settings()

    def matrix(stats: ExpertParallelStats, key: str) -> np.ndarray:
        out = np.zeros((ranks, ranks))
        for p in stats.pairs:
            out[p.source, p.destination] = getattr(p, key)
        return out

    times = {f"{phase}_{kind}": (getattr(now, name) - getattr(before, name))
             for phase in ("dispatch", "combine")
             for kind, name in (("measured", f"{phase}_ms"), ("exposed", f"{phase}_exposed_ms"),
                                ("modelled", f"{phase}_modelled_ms"))}
    step_ms = (snap.step_ms or Histogram()).sum - (base.step_ms or Histogram()).sum
    return EpView(
        ranks=ranks, comm=settings.get("ep_comm", "?"), placement=settings.get("ep_placement", "?"),
        overlap=settings.get("ep_overlap", "?"),
        dispatch_bytes=matrix(now, "dispatch_bytes") - matrix(before, "dispatch_bytes"),
        combine_bytes=matrix(now, "combine_bytes") - matrix(before, "combine_bytes"),
        formula_bytes=_formula(snap, base, ranks, settings.get("dtype", "")),
        ms=times, step_ms=step_ms, window_s=snap.window_s - (base.window_s if base is not EMPTY
                                                            else 0.0),
        exchanges=now.exchanges - before.exchanges, placements=now.placements - before.placements,
        experts_moved=now.experts_moved - before.experts_moved,
        rank_pairs=_rank_pairs(snap, base),
        link_gbps=_number(settings.get("link_gbps")),
        link_latency_us=_number(settings.get("link_latency_us")))


def _formula(snap: ServerStats, base: ServerStats, ranks: int, dtype: str) -> float | None:
    """tokens x k x hidden x element bytes x (N - 1) / N, over the layers: one direction."""
    if not snap.hidden_size or dtype not in ELEMENT_BYTES or snap.tokens_per_step is None:
        return None
    tokens = snap.tokens_per_step.sum - (base.tokens_per_step or Histogram()).sum
    return (tokens * snap.top_k * snap.hidden_size * ELEMENT_BYTES[dtype] * (ranks - 1) / ranks
            * snap.num_layers)


def _rank_pairs(snap: ServerStats, base: ServerStats) -> np.ndarray | None:
    if not snap.layers or not snap.layers[0].rank_pairs:
        return None
    pairs = np.asarray([layer.rank_pairs for layer in snap.layers], dtype=np.int64)
    if base.layers and base.layers[0].rank_pairs:
        pairs = pairs - np.asarray([layer.rank_pairs for layer in base.layers], dtype=np.int64)
    return pairs


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def lines(v: EpView) -> list[tuple[str, str]]:
    """The figures as (label, value) rows, for the report."""
    mb = 1e6
    measured, exposed = v.share("measured"), v.share("exposed")
    rows = [("ranks, exchange, placement, overlap",
             f"{v.ranks}, {v.comm}, {v.placement}, {v.overlap}"),
            ("bytes between ranks (dispatch + combine)",
             f"{v.total_bytes / mb:.2f} MB over {v.exchanges} layer exchanges"),
            ("dispatch bytes: measured vs tokens x k x hidden x bytes x (N-1)/N",
             f"{v.dispatch_bytes.sum() / mb:.2f} MB vs "
             + (f"{v.formula_bytes / mb:.2f} MB ({v.dispatch_bytes.sum() / v.formula_bytes:.2f}x)"
                if v.formula_bytes else "n/a (no hidden size or dtype in GetStats)")),
            ("exchange time, measured / exposed / modelled",
             " / ".join(f"{v.ms[f'dispatch_{k}'] + v.ms[f'combine_{k}']:.1f} ms"
                        for k in ("measured", "exposed", "modelled"))),
            ("communication share of step time, measured / exposed",
             f"{measured:.1%} / {exposed:.1%}" if measured is not None else "n/a")]
    if v.link_gbps:
        rows.append(("modelled link",
                     f"{v.link_gbps:g} Gbit/s, {v.link_latency_us or 0:g} us; busiest pair at "
                     f"{v.link_utilisation:.1%} of it"))
    if v.rank_imbalance is not None:
        rows.append(("per-rank expert load (pairs computed), worst layer max/mean",
                     f"{v.rank_imbalance:.2f}; ranks "
                     + ", ".join(f"{int(n)}" for n in v.rank_pairs.sum(axis=0))))
    if v.placements:
        rows.append(("balanced placements", f"{v.placements}, {v.experts_moved} expert slots "
                                            "changed"))
    return rows


# Exposed exchange time / step time: above a fifth, the all-to-all costs the steps more than a
# typical MoE layer's routing and combine together (the data-movement rule's bar, for copies).
EXPOSED_SHARE = 0.2
LINK_SATURATED = 0.8  # the busiest pair's share of the modelled link's bandwidth


def communication(server: ServerSnapshots) -> Finding:
    """Seed 5.3's "is communication bandwidth saturated?", from the exchanges' figures."""
    rule = ("communication", "Communication between expert-parallel ranks")
    v = ep_view(server)
    if v is None:
        return Finding(*rule, False, "The engine ran as one rank (no --ep): its MoE layers "
                       "exchange nothing; expert-weight copies are judged under data movement.",
                       [], judged=False)
    exposed, measured, used = v.share("exposed"), v.share("measured"), v.link_utilisation
    evidence = [f"{label}: {value}" for label, value in lines(v)]
    if exposed is None:
        return Finding(*rule, False, "No step ran in the window.", evidence, judged=False)
    reasons = []
    if exposed > EXPOSED_SHARE:
        reasons.append(f"the steps waited {exposed:.1%} of their time for exchanges (above "
                       f"{EXPOSED_SHARE:.0%})")
    if used is not None and used > LINK_SATURATED:
        reasons.append(f"the busiest rank pair used {used:.1%} of the modelled link (above "
                       f"{LINK_SATURATED:.0%})")
    if not reasons:
        return Finding(*rule, False, f"Communication is not the bottleneck: exchanges took "
                       f"{measured:.1%} of step time, {exposed:.1%} exposed"
                       + (f", the busiest pair at {used:.1%} of the link" if used is not None
                          else "") + ".", evidence)
    advice = ("overlap it (--ep-overlap two-batch), send less (balanced placement puts hot "
              "experts where their tokens are less often remote; fewer ranks) or a faster link")
    return Finding(*rule, True, "Communication bandwidth is saturated: " + "; ".join(reasons)
                   + f". {advice}.", evidence)
