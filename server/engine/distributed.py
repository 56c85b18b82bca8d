"""The engine as several ranks (docs/expert-parallelism.md). Rank 0 runs the engine thread and
this DistributedEngine, which follows the engine protocol (server/engine/interface.py): each
step it sends every rank its own sequences (each rank owns the KV slots of its sequences,
attention is data-parallel), runs its share, and gathers the others' tokens and counts into one
StepResult. The other ranks run `follow`: a loop doing what rank 0 says.

A global KV slot s lives on rank s % N as that rank's slot s // N; new sequences go to the
rank with the most free slots. With balanced placement rank 0 re-plans every
--ep-rebalance-steps steps from the routing it gathered, and every rank takes over the
experts the new placement gives it.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import time

import torch

from records.server_settings import Parallel
from server.engine.interface import SeqInput, StepResult
from server.engine.local import LocalEngine
from server.engine.slots import RankSlots
from server.errors import UnavailableError
from server.parallel.group import EpGroup
from server.parallel.placement import Placement, balanced, imbalance, rank_loads

log = logging.getLogger(__name__)
STEP, PLACE, STOP = "step", "place", "stop"
STOP_WAIT_S = 5  # for a rank to exit after stop, before it is killed (a hung one never does)
# A killed rank's sockets close, failing the collective, a moment before its exit shows: a
# failed step looks this long for a rank that exited before calling it unresponsive.
EXIT_SEEN_S = 1.0


class RankLost(UnavailableError):
    """A rank died or stopped answering: the step failed, and the server cannot go on (another
    replica may serve the request)."""


def follow(engine: LocalEngine, group: EpGroup) -> None:
    """A rank other than 0: runs each step rank 0 sends, until it says stop."""
    while True:
        kind, payload = group.command()
        if kind == STOP:
            return
        if kind == PLACE:
            group.gather(engine.place(payload))
            continue
        group.gather(compact(engine.step(payload[group.rank])))


def compact(result: StepResult) -> dict:
    """What rank 0 needs of another rank's step (its own timings and exchanges are rank 0's)."""
    return {"next_ids": result.next_ids, "routed": result.routed,
            "seq_experts": result.seq_experts, "tokens": result.tokens,
            "kv_useful": result.kv_useful, "kv_computed": result.kv_computed,
            "prefill_tokens": result.prefill_tokens, "prefill_padded": result.prefill_padded}


class DistributedEngine:
    def __init__(self, local: LocalEngine, group: EpGroup, kv_slots: int, placement: Placement,
                 parallel: Parallel, ranks: list[subprocess.Popen] | None = None):
        """local: rank 0's own engine; kv_slots: the slots of all ranks together; parallel: the
        expert-parallel settings (a balanced placement is re-planned every
        --ep-rebalance-steps, with --ep-redundant copies); ranks: the processes of ranks 1..
        when this process spawned them (torchrun owns them otherwise)."""
        balanced_every = parallel.ep_rebalance_steps if parallel.ep_placement == "balanced" else 0
        redundant = parallel.ep_redundant
        self.local, self.group, self.world = local, group, group.world
        self.args, self.tokenizer, self.device = local.args, local.tokenizer, local.device
        self.dtype, self.seed, self.kernel_name = local.dtype, local.seed, local.kernel_name
        self.caches: list = []
        self.kv_slots = kv_slots
        self.placement = placement
        self.balanced_every, self.redundant = balanced_every, redundant
        self.ranks = ranks or []
        # a slot's rank needs no word when it is freed: a sequence starting in a slot resets
        # what the slot kept
        self.slots = RankSlots(kv_slots, self.world)
        self.load = torch.zeros(self.args.n_layers, self.args.n_experts)  # since the last plan
        self.steps = 0
        self._warm_up()

    def _warm_up(self) -> None:
        token = self.step([SeqInput(0, [0] * 8, 0)]).next_ids[0]
        self.step([SeqInput(0, [token], 8)])
        self.load.zero_()
        self.steps = 0

    @property
    def expert_bytes(self) -> int:
        return self.local.expert_bytes

    def step(self, seqs: list[SeqInput]) -> StepResult:
        moved = 0
        if self.balanced_every and self.steps and self.steps % self.balanced_every == 0:
            moved = self._re_place()
        parts: list[list[SeqInput]] = [[] for _ in range(self.world)]
        where = []
        for s in seqs:
            rank = s.slot % self.world
            where.append((rank, len(parts[rank])))
            # a cached prefix is copied on its own rank (the scheduler keeps it there)
            source = None if s.prefix_from is None else s.prefix_from // self.world
            parts[rank].append(dataclasses.replace(s, slot=s.slot // self.world,
                                                   prefix_from=source))
        try:
            self.group.command((STEP, parts))
            mine = self.local.step(parts[0])
            gathered = self.group.gather(compact(mine))
        except RuntimeError as exc:  # a collective failed: a rank is gone or hung
            raise RankLost(self.lost(exc)) from None
        self.steps += 1
        return dataclasses.replace(self._merge(mine, gathered, where), moved=moved)

    def _merge(self, mine: StepResult, parts: list[dict], where: list) -> StepResult:
        routed = sum(p["routed"] for p in parts)
        self.load += routed
        return StepResult(
            next_ids=[parts[r]["next_ids"][i] for r, i in where], routed=routed, dropped=None,
            active=[int((row > 0).sum()) for row in routed],
            seq_experts=(torch.stack([parts[r]["seq_experts"][i] for r, i in where])
                         if where else mine.seq_experts),
            stage_ms=mine.stage_ms, tokens=sum(p["tokens"] for p in parts),
            **{k: sum(p[k] for p in parts) for k in ("kv_useful", "kv_computed",
                                                     "prefill_tokens", "prefill_padded")},
            comm=mine.comm, routed_by_rank=torch.stack([p["routed"] for p in parts]))

    def _re_place(self) -> int:
        """A new balanced placement from the load since the last; returns the expert slots
        that changed, over all ranks."""
        placement = balanced(self.load, self.world, self.redundant)
        before = [imbalance(rank_loads(self.placement, i, row)) for i, row
                  in enumerate(self.load.tolist())]
        after = [imbalance(rank_loads(placement, i, row)) for i, row
                 in enumerate(self.load.tolist())]
        self.group.command((PLACE, placement))
        moved = sum(self.group.gather(self.local.place(placement)))
        log.info("experts re-placed from the load of %d steps: rank imbalance (max/mean) "
                 "%.2f -> %.2f (worst layer), %d expert slots changed",
                 self.balanced_every, max(before), max(after), moved)
        self.placement = placement
        self.load.zero_()
        return moved

    def lost(self, exc: Exception) -> str:
        """Which rank failed the step, where this process can tell (the ranks it spawned)."""
        deadline = time.monotonic() + EXIT_SEEN_S
        gone = self.exited()
        while not gone and self.ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            gone = self.exited()
        what = "; ".join(gone) if gone else "a rank stopped answering (see its log)"
        return f"expert-parallel step failed: {what}: {str(exc).splitlines()[0]}"

    def exited(self) -> list[str]:
        return [f"rank {r} exited with status {p.returncode}"
                for r, p in enumerate(self.ranks, start=1) if p.poll() is not None]

    def stop(self) -> None:
        """Tells the other ranks to exit, and waits for the ones this process started."""
        try:
            self.group.command((STOP, None))
        except RuntimeError:
            pass  # a rank is gone already
        for p in self.ranks:
            try:
                p.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
        self.group.close()
