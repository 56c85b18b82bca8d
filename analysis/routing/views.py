"""The MoE views of a run's routed experts (analysis/readers/routed_experts.py), for any server that
returned them: the load per layer and expert, the hottest experts of each layer, the imbalance
over the run beside the client's TTFT and TPOT, and how much requests share experts.

Imbalance is one normalised figure, the hottest rank's load over the mean rank's (1 = even), with
the engines' own beside it: SGLang's balancedness is its inverse (mean over max), TensorRT-LLM's
imbalance ratio is it minus one ((max - mean) / mean); each is taken per layer and averaged over
the layers, as the engines do. Ranks are --ep-ranks groups of consecutive experts (contiguous
placement); one rank an expert by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.readers.routed_experts import Routing
from records.requests import RequestRow

HOT_PER_LAYER = 3
PAIRS = 20_000  # request pairs sampled for the affinity (all of them below this)
BUCKETS = 20  # time buckets over the run


@dataclass(frozen=True)
class Balance:
    hot_over_mean: float  # the hottest rank's load over the mean rank's, averaged over layers
    balancedness: float  # SGLang's: mean over max
    imbalance_ratio: float  # TensorRT-LLM's: (max - mean) / mean

    @classmethod
    def of(cls, load: np.ndarray, ranks: int) -> Balance:
        """load [layers, experts]: a rank's is its experts' (consecutive ones); layers without
        load are left out."""
        per_rank = load.reshape(load.shape[-2], ranks, -1).sum(-1).astype(float)
        mean, top = per_rank.mean(1), per_rank.max(1)
        used = top > 0
        if not used.any():
            return cls(1.0, 1.0, 0.0)
        ratio = top[used] / mean[used]
        return cls(float(ratio.mean()), float((mean[used] / top[used]).mean()),
                   float((ratio - 1).mean()))


@dataclass(frozen=True)
class Moment:
    """One time bucket: the requests that finished in it."""

    end_s: float
    requests: int
    balance: Balance
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None


@dataclass(frozen=True)
class Affinity:
    experts_per_request: float  # distinct experts a request's output used, per layer
    shared: float  # mean Jaccard of two requests' expert sets, per layer
    shared_if_random: float  # about the same for random sets of those sizes


@dataclass(frozen=True)
class RoutingView:
    routing: Routing
    ranks: int
    load: np.ndarray  # [layers, experts] tokens (prompt and output) of the measured requests
    hot: list[list[tuple[int, float]]]  # per layer with load: (expert, share of its tokens)
    balance: Balance
    moments: list[Moment]
    affinity: Affinity | None
    measured_only: bool  # False: no request came after the warm-up, every one is counted


def view_of(routing: Routing, rows: list[RequestRow], ranks: int = 0) -> RoutingView:
    """ranks: --ep-ranks, groups of consecutive experts (0: one an expert). The load, the hot
    experts, the balance and the affinity are the measured requests' (all of them where none
    came after the warm-up: `measured_only` says which); the moments cover the whole run."""
    ranks = ranks or routing.experts
    if routing.experts % ranks:
        raise ValueError(f"{routing.experts} experts do not divide over {ranks} ranks "
                         "(--ep-ranks)")
    measured = routing.measured()
    chosen = measured if len(measured) else np.arange(routing.requests)
    load = routing.load(chosen)
    shares = load / np.maximum(load.sum(1, keepdims=True), 1)
    hot = [[(int(e), float(shares[layer, e])) for e in np.argsort(-shares[layer])[:HOT_PER_LAYER]]
           for layer in range(routing.layers) if load[layer].any()]
    return RoutingView(routing, ranks, load, hot, Balance.of(load, ranks),
                       moments(routing, rows, ranks), affinity(routing.output[chosen]),
                       bool(len(measured)))


def moments(routing: Routing, rows: list[RequestRow], ranks: int) -> list[Moment]:
    finish = np.asarray([r.finish_ms if r.finish_ms is not None else np.nan
                         for r in routing.rows]) / 1e3
    if not np.isfinite(finish).any():
        return []
    span = float(np.nanmax(finish))
    width = max(1.0, span / BUCKETS)
    client = [(row.finish_ms / 1e3, row.ttft_ms, row.tpot_ms) for row in rows
              if row.measured_ok and row.finish_ms is not None]
    out = []
    for start in np.arange(0.0, span + 1e-9, width):
        inside = np.flatnonzero((finish >= start) & (finish < start + width))
        if not len(inside):
            continue
        ttft = [t for f, t, _ in client if start <= f < start + width and t is not None]
        tpot = [t for f, _, t in client if start <= f < start + width and t is not None]
        out.append(Moment(float(start + width), len(inside),
                          Balance.of(routing.load(inside), ranks),
                          float(np.median(ttft)) if ttft else None,
                          float(np.median(tpot)) if tpot else None))
    return out


def affinity(output: np.ndarray, seed: int = 0) -> Affinity | None:
    """output [requests, layers, experts]: how much two requests' expert sets overlap, over
    the layers where both have routing (a dense layer's, or a request without output, none)."""
    sets = output > 0
    n, _, experts = sets.shape
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    if n * (n - 1) // 2 <= PAIRS:
        a, b = np.triu_indices(n, 1)
    else:
        a, b = rng.integers(0, n, PAIRS), rng.integers(0, n, PAIRS)
        a, b = a[a != b], b[a != b]
    sizes = sets.sum(-1)  # [requests, layers]
    sa, sb = sizes[a], sizes[b]
    both = (sa > 0) & (sb > 0)
    if not both.any():
        return None
    inter = (sets[a] & sets[b]).sum(-1)
    union = (sets[a] | sets[b]).sum(-1)
    expect_inter = sa * sb / experts  # two random sets of these sizes, about
    random = expect_inter / np.maximum(sa + sb - expect_inter, 1)
    return Affinity(float(sizes[sizes > 0].mean()), float((inter / np.maximum(union, 1))[both]
                                                          .mean()), float(random[both].mean()))
