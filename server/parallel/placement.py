"""Where each layer's experts live when the engine runs as several ranks: every rank has the
same number of expert slots, and a slot holds one expert (an expert may have replicas on
several ranks).

- contiguous: rank r holds experts r E/N .. (r + 1) E/N - 1, no replicas.
- balanced, in the spirit of DeepSeek's EPLB (global policy): from the load measured per
  expert, give the hottest experts the --ep-redundant extra replicas one at a time (each to
  the expert whose load per replica is highest), then pack the replicas, heaviest first, onto
  the rank with the least load that has a free slot and no replica of that expert yet. A
  replicated expert's tokens are spread over its replicas in turn.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Placement:
    """held[layer][rank]: the expert in each of the rank's slots."""

    held: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def world(self) -> int:
        return len(self.held[0])

    def replicas(self, layer: int) -> list[list[tuple[int, int]]]:
        """Per expert: the (rank, slot) of each replica, in rank order."""
        n_experts = 1 + max(e for rank in self.held[layer] for e in rank)
        out: list[list[tuple[int, int]]] = [[] for _ in range(n_experts)]
        for rank, experts in enumerate(self.held[layer]):
            for slot, e in enumerate(experts):
                out[e].append((rank, slot))
        return out

    def tables(self, layer: int, device) -> tuple[Tensor, Tensor, Tensor]:
        """Per expert: its number of replicas [E], and each replica's rank and slot [E, R]
        (padded with the first), for routing pairs with tensor ops."""
        replicas = self.replicas(layer)
        width = max(len(r) for r in replicas)
        ranks = [[r[j % len(r)][0] for j in range(width)] for r in replicas]
        slots = [[r[j % len(r)][1] for j in range(width)] for r in replicas]
        return (torch.tensor([len(r) for r in replicas], device=device),
                torch.tensor(ranks, device=device), torch.tensor(slots, device=device))


def contiguous(n_layers: int, n_experts: int, world: int) -> Placement:
    if n_experts % world:
        raise ValueError(f"{n_experts} experts do not divide over {world} ranks")
    per = n_experts // world
    layer = tuple(tuple(range(r * per, (r + 1) * per)) for r in range(world))
    return Placement((layer,) * n_layers)


def balanced(load: Tensor, world: int, redundant: int) -> Placement:
    """load [L, E]: tokens routed to each expert since the last placement."""
    layers = []
    for row in load.double().tolist():
        layers.append(_balanced_layer(row, world, redundant))
    return Placement(tuple(layers))


def _balanced_layer(load: list[float], world: int, redundant: int) -> tuple[tuple[int, ...], ...]:
    n = len(load)
    if (n + redundant) % world:
        raise ValueError(f"{n} experts + {redundant} replicas do not divide over {world} ranks")
    if redundant > n * (world - 1):
        raise ValueError(f"{redundant} replicas of {n} experts need more than {world} ranks")
    count = [1] * n
    for _ in range(redundant):  # water-filling: the expert with the most load per replica
        e = max((e for e in range(n) if count[e] < world),
                key=lambda e: (load[e] / count[e], -e))
        count[e] += 1
    replicas = sorted(((load[e] / count[e], e) for e in range(n) for _ in range(count[e])),
                      key=lambda r: (-r[0], r[1]))
    per_rank = (n + redundant) // world
    held: list[list[int]] = [[] for _ in range(world)]
    totals = [(0.0, r) for r in range(world)]  # a heap of (load, rank)
    for weight, e in replicas:
        skipped = []
        while totals:
            total, rank = heapq.heappop(totals)
            if len(held[rank]) < per_rank and e not in held[rank]:
                break
            skipped.append((total, rank))
        else:  # every rank with room holds e already: a second replica beside the first
            total, rank = next(t for t in skipped if len(held[t[1]]) < per_rank)
            skipped.remove((total, rank))
        held[rank].append(e)
        heapq.heappush(totals, (total + weight, rank))
        for item in skipped:
            heapq.heappush(totals, item)
    return tuple(tuple(sorted(h)) for h in held)


def rank_loads(placement: Placement, layer: int, load: list[float]) -> list[float]:
    """The load each rank gets under the placement, a replicated expert's shared evenly."""
    replicas = placement.replicas(layer)
    out = [0.0] * placement.world
    for e, where in enumerate(replicas):
        for rank, _ in where:
            out[rank] += load[e] / len(where)
    return out


def imbalance(loads: list[float]) -> float:
    """max / mean of the ranks' loads (1 = even); 1 without load."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0
