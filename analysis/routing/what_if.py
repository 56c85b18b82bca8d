"""What the run's own routing says our batching and placement would do on that server
(`analysis what-if RUN`, and the report's routing section).

Grouping: the run's decode steps replayed, one every median time per output token, each with the
requests in flight then (sent, not yet finished), in the order they were sent. The server's own
policies (server/scheduling/policies.py, the same code, no model) pick --max-batch-size of them:
fcfs the oldest, expert_aware those whose expert signature (a request's TOP_K most used experts
per layer) adds the fewest experts, the starved first after max_wait_ms. A step's distinct experts
in a layer is the expectation over one token of each request picked, each token's experts drawn
from its request's routing: sum over experts of 1 - prod over requests of (1 - p), p the share of
the request's tokens that used the expert. Steps with no more requests in flight than a batch
holds give both policies the same batch and are counted apart.

Placement: on --ep-ranks ranks, the hottest rank's load over the mean with contiguous placement,
and with balanced placement and --redundant extra replicas (server/parallel/placement.py)
planned from the first half of the requests (by finish) and measured on the second, as a
balancer that plans from past load meets the next.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from analysis.readers.routing import Routing
from server.parallel.placement import balanced, contiguous, rank_loads
from server.scheduling.policies import ExpertAware, Fcfs, View

MAX_STEPS = 4000  # steps replayed at most, spread over the run


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
    fcfs_all: float  # ... over every step
    expert_aware_all: float
    batches: list[tuple[list[str], list[str]]]  # per step with a choice: (fcfs, expert_aware)


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
    probability p; the expected distinct experts per layer."""
    return float((1 - np.prod(1 - p, axis=0)).sum(-1).mean())


def token_shares(routing: Routing, requests: list[int]) -> np.ndarray:
    """[len(requests), layers, experts]: the share of each request's output tokens that used
    each expert."""
    output = routing.output[requests].astype(float)
    tokens = np.maximum(output.sum(-1, keepdims=True) / max(routing.top_k, 1), 1)
    return np.clip(output / tokens, 0, 1)


def grouping(routing: Routing, batch: int, max_wait_ms: float = 50.0) -> Grouping | None:
    rows = routing.rows
    timed = [i for i, r in enumerate(rows) if r.sent_ms is not None and r.finish_ms is not None
             and routing.output[i].any()]
    if not timed:
        return None
    per_token = [(rows[i].finish_ms - rows[i].sent_ms) / max(rows[i].output_tokens, 1)
                 for i in timed]
    step_ms = max(float(np.median(per_token)), 1e-3)
    begin = min(rows[i].sent_ms for i in timed)
    end = max(rows[i].finish_ms for i in timed)
    times = np.arange(begin, end, step_ms)
    if len(times) > MAX_STEPS:
        times = np.linspace(begin, end, MAX_STEPS, endpoint=False)
    order = sorted(timed, key=lambda i: rows[i].sent_ms)
    fcfs, aware = Fcfs(batch), ExpertAware(batch, max_wait_ms)
    states = {i: Replayed(rows[i].request_id, int(rows[i].sent_ms * 1e6),
                          signature(routing.output[i], routing.top_k),
                          int(rows[i].sent_ms * 1e6)) for i in order}
    index = {id(state): i for i, state in states.items()}
    chosen_f, chosen_a, all_f, all_a, batches = [], [], [], [], []
    for t in times:
        flying = [states[i] for i in order if rows[i].sent_ms <= t < rows[i].finish_ms]
        if not flying:
            continue
        view = View(now_ns=int(t * 1e6), waiting=(), resident=flying, free_slots=0)
        picked_f = [index[id(r)] for r in fcfs.plan(view).decode]
        picked_a = [index[id(r)] for r in aware.plan(view).decode]
        for i in picked_a:
            states[i].last_run_ns = int(t * 1e6)
        f = distinct_experts(token_shares(routing, picked_f))
        a = distinct_experts(token_shares(routing, picked_a))
        all_f.append(f)
        all_a.append(a)
        if len(flying) > batch:
            chosen_f.append(f)
            chosen_a.append(a)
            batches.append(([rows[i].request_id for i in picked_f],
                            [rows[i].request_id for i in picked_a]))
    if not all_f:
        return None
    mean = lambda values: float(np.mean(values)) if values else float("nan")  # noqa: E731
    return Grouping(batch, step_ms, len(all_f), len(chosen_f), mean(chosen_f), mean(chosen_a),
                    mean(all_f), mean(all_a), batches)


def placing(routing: Routing, ranks: int, redundant: int) -> Placing | None:
    """None with fewer than two requests (nothing to plan from and measure on apart)."""
    if routing.requests < 2:
        return None
    half = routing.requests // 2
    past = torch.from_numpy(routing.both[:half].sum(0))
    future = routing.both[half:].sum(0).astype(float)
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
