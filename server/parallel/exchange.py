"""Tokens to the ranks that hold their experts and back, for an MoE layer whose experts are
spread over ranks (docs/expert-parallelism.md). Every rank runs the same layer on its own
tokens at the same time; each exchange is a collective all of them join.

- AllToAll: each (token, expert) pair's hidden state goes to the rank holding the expert (a
  replicated expert's pairs are spread over its replicas in turn), the rank computes its
  experts' rows, and the outputs come back the same way: one all-to-all to dispatch, one to
  combine, with split sizes from the routing (every rank first learns every rank's splits).
  With two-batch overlap the tokens go in two micro-batches, so one's exchange runs while the
  other's experts compute.
- AllGatherReduceScatter (vLLM's other backend): every rank gathers every rank's tokens,
  computes its experts' share of every token's output, and a reduce-scatter sums each rank's
  rows back to it.

What crosses between ranks is counted from the actual splits: payload bytes (hidden states,
a rank's to itself excluded) per rank pair, dispatch and combine apart, per layer; with the
time each exchange took, the time the step waited on it (exposed), and its modelled time on
the link (server/parallel/link.py), which --link-emulate makes it last at least.

Shape letters: N tokens here, D model dim, k experts per token, P = N k pairs, W ranks,
S expert slots here.

The exchange moves tensors; it reaches into no object of the engine's. The layer hands it the
experts held here as `ExpertSlots` (their slots and their compute) and the step's record as
`ExchangeLog` (stage marks, experts that computed, what was exchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from records.engine_telemetry import Stage
from server.parallel.group import EpGroup, PendingExchange
from server.parallel.link import Link
from server.parallel.placement import Placement


@dataclass
class Exchanged:
    """One MoE layer's exchanges in one step, as this rank saw them."""

    dispatch_bytes: list[list[int]]  # [source rank][destination rank], payload
    combine_bytes: list[list[int]]
    computed: list[int]  # (token, expert) pairs each rank's experts computed
    measured_ms: dict[str, float] = field(default_factory=lambda: {Stage.DISPATCH: 0.0,
                                                                   Stage.COMBINE: 0.0})
    exposed_ms: dict[str, float] = field(default_factory=lambda: {Stage.DISPATCH: 0.0,
                                                                  Stage.COMBINE: 0.0})
    modelled_ms: dict[str, float] = field(default_factory=lambda: {Stage.DISPATCH: 0.0,
                                                                   Stage.COMBINE: 0.0})

    def add(self, phase: str, waited: tuple[float, float], modelled: float) -> None:
        measured, exposed = waited
        self.measured_ms[phase] += measured
        self.exposed_ms[phase] += exposed
        self.modelled_ms[phase] += modelled


class ExpertSlots(Protocol):
    """The experts held here, as the exchange uses them."""

    @property
    def slots(self) -> int:
        """S: how many expert slots this rank holds."""

    def __call__(self, rows: Tensor, counts: list[int]) -> Tensor:
        """The outputs of rows sorted by slot, counts[j] of them for slot j."""


class ExchangeLog(Protocol):
    """What a step records of a layer's exchange."""

    def mark(self, stage: str) -> None:
        """The stage that just ended (routing, dispatch, expert_compute, combine)."""

    def computed(self, experts: int) -> None:
        """How many experts here computed in the layer."""

    def exchanged(self, record: Exchanged) -> None:
        """The layer's exchange as this rank saw it."""


class Exchange:
    """What both backends share: the group, this layer's placement tables, the link."""

    def __init__(self, group: EpGroup, placement: Placement, layer: int, link: Link | None,
                 emulate: bool):
        self.group, self.link, self.emulate = group, link, emulate
        self.placement(placement, layer)

    def placement(self, placement: Placement, layer: int) -> None:
        """Where this layer's experts are (a new placement after a rebalance)."""
        self.replicas, self.ranks, self.slots = placement.tables(layer, self.group.device)

    def destinations(self, flat: Tensor, token: Tensor, source: int) -> tuple[Tensor, Tensor]:
        """The rank and slot each pair goes to: a replicated expert's pairs in turn over its
        replicas, by the pair's token and source rank."""
        turn = (token + source) % self.replicas[flat]
        return self.ranks[flat, turn], self.slots[flat, turn]

    def modelled(self, bytes_matrix: list[list[int]]) -> float:
        return self.link.ms(bytes_matrix) if self.link is not None else 0.0

    def wait(self, pending: PendingExchange,
             bytes_matrix: list[list[int]]) -> tuple[tuple[float, float], float]:
        modelled = self.modelled(bytes_matrix)
        return pending.wait(modelled if self.emulate else 0.0), modelled


def compute(experts: ExpertSlots, rows: Tensor, slots: Tensor) -> Tensor:
    """This rank's experts on the rows sent to them, each row's output in its place."""
    by_slot = slots.argsort(stable=True)
    counts = torch.bincount(slots, minlength=experts.slots).tolist()
    ys = torch.empty_like(rows)
    ys[by_slot] = experts(rows[by_slot], counts)
    return ys


class AllToAll(Exchange):
    def __init__(self, group: EpGroup, placement: Placement, layer: int, link: Link | None,
                 emulate: bool, overlap: bool):
        super().__init__(group, placement, layer, link, emulate)
        self.overlap = overlap

    def run(self, x: Tensor, weights: Tensor, flat: Tensor, experts: ExpertSlots,
            log: ExchangeLog) -> Tensor:
        """x [N, D] and its routing, weights and flat [N, k] experts flattened: the layer's
        output [N, D] from the experts wherever they are."""
        n, d = x.shape
        k, world, me = weights.shape[1], self.group.world, self.group.rank
        token = torch.arange(flat.numel(), device=x.device) // k  # [P]
        dest, slot = self.destinations(flat, token, me)
        halves = [(0, n // 2), (n // 2, n)] if self.overlap else [(0, n)]
        orders, sends = [], []
        for lo, hi in halves:  # each micro-batch's pairs by destination, in token order within
            order = dest[lo * k:hi * k].argsort(stable=True) + lo * k
            orders.append(order)
            sends.append(torch.bincount(dest[order], minlength=world))
        counts = self.group.all_gather(torch.stack(sends)).tolist()  # [W src][batch][W dst]
        row_bytes = d * x.element_size()
        record = Exchanged([[0] * world for _ in range(world)], [[0] * world for _ in range(world)],
                           [sum(counts[s][b][r] for s in range(world) for b in range(len(halves)))
                            for r in range(world)])
        log.mark(Stage.ROUTING)
        dispatched = [self._dispatch(x[token[order]], slot[order], counts, b)
                      for b, order in enumerate(orders)]
        combined = []
        used = torch.zeros(experts.slots, dtype=torch.long, device=x.device)
        for b, (rows, ids, sent, received) in enumerate(dispatched):
            matrix = [[counts[s][b][r] * row_bytes if s != r else 0 for r in range(world)]
                      for s in range(world)]
            record.add(Stage.DISPATCH, *self.wait(rows, matrix))
            ids.work.wait()  # sent with the rows: here by now
            log.mark(Stage.DISPATCH)
            ys = compute(experts, rows.output, ids.output)
            used += torch.bincount(ids.output, minlength=len(used))
            log.mark(Stage.EXPERT_COMPUTE)
            back = x.new_empty(sum(sent), d)
            combined.append((self.group.all_to_all(back, ys, sent, received), matrix))
            for s in range(world):
                for r in range(world):
                    record.dispatch_bytes[s][r] += matrix[s][r]
                    record.combine_bytes[r][s] += matrix[s][r]
        out = torch.zeros_like(x)
        flat_weights = weights.flatten()
        for order, (back, matrix) in zip(orders, combined, strict=True):
            transposed = [[matrix[s][r] for s in range(world)] for r in range(world)]
            record.add(Stage.COMBINE, *self.wait(back, transposed))
            out.index_add_(0, token[order], back.output * flat_weights[order][:, None].to(x.dtype))
            log.mark(Stage.COMBINE)
        log.computed(int((used > 0).sum()))
        log.exchanged(record)
        return out


    def _dispatch(self, rows: Tensor, slots: Tensor, counts: list, batch: int) -> tuple:
        """Micro-batch `batch`'s rows [M, D] and their expert slots [M], sorted by destination,
        sent to their ranks (counts[src][batch][dst] rows each): (the rows coming, their slots,
        the counts sent, the counts received)."""
        world, me = self.group.world, self.group.rank
        sent = [counts[me][batch][r] for r in range(world)]
        received = [counts[s][batch][me] for s in range(world)]
        coming = rows.new_empty(sum(received), rows.shape[1])
        ids = slots.new_empty(sum(received))
        return (self.group.all_to_all(coming, rows, received, sent),
                self.group.all_to_all(ids, slots, received, sent), sent, received)


class AllGatherReduceScatter(Exchange):
    def run(self, x: Tensor, weights: Tensor, flat: Tensor, experts: ExpertSlots,
            log: ExchangeLog) -> Tensor:
        n, d = x.shape
        k, world, me = weights.shape[1], self.group.world, self.group.rank
        sizes = self.group.all_gather(torch.tensor([n], device=x.device)).flatten().tolist()
        width = max(sizes)
        padded = x.new_zeros(width, d)
        padded[:n] = x
        routing = torch.full((width, 2 * k), -1.0, device=x.device)  # experts, then weights
        routing[:n, :k] = flat.view(n, k).float()
        routing[:n, k:] = weights
        log.mark(Stage.ROUTING)
        matrix = [[width * d * x.element_size() if s != r else 0 for r in range(world)]
                  for s in range(world)]
        rows = self.group.gather_rows(padded)
        routes = self.group.gather_rows(routing)
        routes.wait()
        record = Exchanged([row[:] for row in matrix], [row[:] for row in matrix], [0] * world)
        record.add(Stage.DISPATCH, *self.wait(rows, matrix))
        log.mark(Stage.DISPATCH)
        every = routes.output.view(world, width, 2 * k)
        valid = torch.arange(width, device=x.device)[None, :] < torch.tensor(
            sizes, device=x.device)[:, None]  # [W, width]
        chosen = every[..., :k].long().clamp(min=0).flatten()  # [W width k]
        pair_token = torch.arange(world * width * k, device=x.device) // k  # in the gather
        source = pair_token // width
        dest, slot = self.destinations(chosen, pair_token % width, source)
        keep = valid.flatten().repeat_interleave(k)
        record.computed = torch.bincount(dest[keep], minlength=world).tolist()
        mine = keep & (dest == me)
        token_of = pair_token[mine]
        ys = compute(experts, rows.output[token_of], slot[mine])
        partial = torch.zeros_like(rows.output)
        partial.index_add_(0, token_of, ys * every[..., k:].flatten()[mine][:, None].to(x.dtype))
        log.computed(len(torch.unique(slot[mine])))
        log.mark(Stage.EXPERT_COMPUTE)
        summed = self.group.reduce_rows(partial)
        record.add(Stage.COMBINE, *self.wait(summed, matrix))
        log.mark(Stage.COMBINE)
        log.exchanged(record)
        return summed.output[:n]


@dataclass(frozen=True)
class ExpertSpread:
    """How a model's experts are spread over the ranks, for building its MoE layers."""

    group: EpGroup
    placement: Placement
    comm: str  # all-to-all or allgather-reducescatter
    overlap: bool  # two-batch overlap (all-to-all)
    link: Link | None
    emulate: bool

    def held(self, layer: int) -> list[int]:
        """The experts this rank's slots hold in the layer."""
        return list(self.placement.held[layer][self.group.rank])

    def exchange(self, layer: int) -> Exchange:
        if self.comm == "all-to-all":
            return AllToAll(self.group, self.placement, layer, self.link, self.emulate,
                            self.overlap)
        return AllGatherReduceScatter(self.group, self.placement, layer, self.link, self.emulate)
