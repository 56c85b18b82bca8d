"""What the run's own routing says our batching and placement would do on that server
(`analysis what-if RUN`, and the report's routing section).

Grouping: the run's decode steps replayed, one every --step-ms (the report: the client's median
TPOT), each with the requests in flight then (sent, not yet finished), in the order they were
sent; a long run in WINDOWS stretches of consecutive steps spread over it. The server's own
policies (server/scheduling/policies.py, the same code, no model) pick --max-batch-size of them:
fcfs the oldest, expert_aware those whose expert signature adds the fewest experts, a request
not picked for --max-wait-ms first. The signature is the request's top-k most used experts per
layer over its whole output (the server reads the experts of its last step: the replay knows a
request's usual experts, not each step's, so it is on the optimistic side). A step's distinct
experts in a layer is the expectation over one token of each request picked, each token's experts
drawn from its request's routing: sum over experts of 1 - prod over requests of (1 - p), p the
share of the request's tokens that used the expert; averaged over the layers with routing. Steps
with no more requests in flight than a batch holds give both policies the same batch and are
counted apart.

Placement: on --ep-ranks ranks, the hottest rank's load over the mean with contiguous placement,
and with balanced placement and --redundant extra replicas (server/parallel/placement.py)
planned from the first half of the measured requests (by finish) and measured on the second, as
a balancer that plans from past load meets the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from analysis.readers.routed_experts import Routing
from server.parallel.placement import balanced, contiguous, rank_loads
from server.scheduling.policies import ExpertAware, Fcfs, View

MAX_STEPS = 4000  # steps replayed at most
WINDOWS = 8  # stretches of consecutive steps a longer run is replayed in
MAX_WAIT_MS = 50.0  # the lab server's default --max-wait-ms


@dataclass
class Replayed:
    """A request as the policies read it (server/scheduling/policies.py Pending)."""

    request_id: str
    received_ns: int
    signature: torch.Tensor  # [layers, experts] bool
    last_run_ns: int
    priority: int = 0
    prompt_len: int = 0
    prompt_left: int = 0


@dataclass(frozen=True)
class Grouping:
    batch: int
    step_ms: float
    steps: int  # replayed
    steps_with_choice: int  # more in flight than a batch holds
    fcfs: float  # distinct experts per layer per step, mean over the steps with a choice
    expert_aware: float
    fcfs_all: float  # ... over every step (where the batches are the same)
    batches: list[tuple[list[str], list[str]]]  # per step with a choice: (fcfs, expert_aware)
    max_in_flight: int  # the most requests in flight at any replayed step


@dataclass(frozen=True)
class Placing:
    ranks: int
    redundant: int
    contiguous: float  # hottest rank over mean, averaged over layers
    balanced: float


def signature(output: np.ndarray, top_k: int) -> torch.Tensor:
    """[layers, experts] counts -> its top_k most used experts per layer, as bool."""
    top = np.argsort(-output, axis=1, kind="stable")[:, :top_k]
    sig = np.zeros(output.shape, dtype=bool)
    np.put_along_axis(sig, top, output[np.arange(len(output))[:, None], top] > 0, axis=1)
    return torch.from_numpy(sig)


def distinct_experts(p: np.ndarray) -> float:
    """p [requests, layers, experts]: a token of each request uses each expert with
    probability p; the expected distinct experts per layer, over the layers with routing."""
    distinct = (1 - np.prod(1 - p, axis=0)).sum(-1)
    routed = p.sum(axis=(0, 2)) > 0
    return float(distinct[routed].mean()) if routed.any() else 0.0


def token_shares(routing: Routing, requests: list[int]) -> np.ndarray:
    """[len(requests), layers, experts]: the share of each request's output tokens that used
    each expert."""
    output = routing.output[requests].astype(float)
    tokens = np.maximum(output.sum(-1, keepdims=True) / max(routing.top_k, 1), 1)
    return np.clip(output / tokens, 0, 1)


def step_times(begin: float, end: float, step_ms: float) -> list[np.ndarray]:
    """The replayed steps: all of them, or WINDOWS stretches of consecutive ones."""
    times = np.arange(begin, end, step_ms)
    if len(times) <= MAX_STEPS:
        return [times]
    per = MAX_STEPS // WINDOWS
    starts = np.linspace(0, len(times) - per, WINDOWS).astype(int)
    return [times[s:s + per] for s in starts]


def grouping(routing: Routing, batch: int, step_ms: float,
             max_wait_ms: float = MAX_WAIT_MS) -> Grouping | None:
    rows = routing.rows
    order = sorted((i for i, r in enumerate(rows) if r.sent_ms is not None
                    and r.finish_ms is not None and routing.output[i].any()),
                   key=lambda i: rows[i].sent_ms)
    if not order:
        return None
    fcfs, aware = Fcfs(batch), ExpertAware(batch, max_wait_ms)
    states = {i: Replayed(rows[i].request_id, int(rows[i].sent_ms * 1e6),
                          signature(routing.output[i], routing.top_k), 0) for i in order}
    index = {id(state): i for i, state in states.items()}
    sent = np.asarray([rows[i].sent_ms for i in order])
    chosen_f, chosen_a, all_f, batches, most = [], [], [], [], 0
    begin, end = sent[0], max(rows[i].finish_ms for i in order)
    for window in step_times(begin, end, step_ms):
        flying: list[int] = []
        arrived = 0
        for t in window:
            came = int(np.searchsorted(sent, t, side="right"))
            for i in order[arrived:came]:  # a request not run yet counts from its arrival
                states[i].last_run_ns = int(rows[i].sent_ms * 1e6)
            flying = [i for i in flying + order[arrived:came] if t < rows[i].finish_ms]
            arrived = came
            if not flying:
                continue
            most = max(most, len(flying))
            now_ns = int(t * 1e6)
            if t == window[0]:  # a stretch's start: nobody is overdue yet
                for i in flying:
                    states[i].last_run_ns = max(states[i].last_run_ns, now_ns - 1)
            view = View(now_ns=now_ns, waiting=(), resident=[states[i] for i in flying],
                        free_slots=0)
            picked_f = [index[id(r)] for r in fcfs.plan(view).decode]
            picked_a = [index[id(r)] for r in aware.plan(view).decode]
            for i in picked_a:
                states[i].last_run_ns = now_ns
            f = distinct_experts(token_shares(routing, picked_f))
            all_f.append(f)
            if len(flying) > batch:
                chosen_f.append(f)
                chosen_a.append(distinct_experts(token_shares(routing, picked_a)))
                batches.append(([rows[i].request_id for i in picked_f],
                                [rows[i].request_id for i in picked_a]))
    if not all_f:
        return None
    mean = lambda values: float(np.mean(values)) if values else float("nan")  # noqa: E731
    return Grouping(batch, step_ms, len(all_f), len(chosen_f), mean(chosen_f), mean(chosen_a),
                    mean(all_f), batches, most)


def placing(routing: Routing, ranks: int, redundant: int) -> Placing | None:
    """None with fewer than two measured requests (nothing to plan from and measure on
    apart)."""
    measured = routing.measured()
    if len(measured) < 2:
        return None
    half = len(measured) // 2
    past = torch.from_numpy(routing.load(measured[:half]))
    future = routing.load(measured[half:]).astype(float)
    plans = (contiguous(routing.layers, routing.experts, ranks),
             balanced(past, ranks, redundant))
    hot = []
    for plan in plans:
        ratios = []
        for layer in range(routing.layers):
            loads = rank_loads(plan, layer, future[layer].tolist())
            mean = sum(loads) / len(loads)
            if mean:
                ratios.append(max(loads) / mean)
        hot.append(float(np.mean(ratios)) if ratios else 1.0)
    return Placing(ranks, redundant, *hot)
