"""What scheduling needs of an engine, whichever runs it: the one-process engine
(server/engine/local.py), the engine over the ranks of expert parallelism
(server/engine/distributed.py) or a test's fake. Scheduling knows engines through this protocol
alone; tests/test_engine_protocol.py checks that each of the three satisfies it.

An engine knows sequences, not requests: each step takes every sequence's new tokens
(`SeqInput`) and returns one token per sequence with what the step did (`StepResult`).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from server.engine.expert_cache import LayerCache
from server.engine.model_args import ModelArgs
from server.engine.slots import Slots
from server.engine.tokenizer import Tokenizer
from server.parallel.exchange import Exchanged


@dataclass
class SeqInput:
    slot: int
    token_ids: list[int]  # the prompt (prefill) or the last generated token (decode)
    start_pos: int  # position of token_ids[0] in the sequence; 0 = a new sequence
    _: KW_ONLY
    temperature: float = 0.0
    seed: int = 0  # seeds the sequence's sampling when it starts (start_pos 0, temperature > 0)
    routing_key: int = 0  # seeds the request's affinity preference (affinity skew)
    # a new sequence whose first start_pos positions are a cached prefix (server/scheduling/
    # prefix_cache.py): the slot they are copied from before the step, or its own slot, where
    # they were kept in place; None: no cached prefix
    prefix_from: int | None = None

    @property
    def begins(self) -> bool:
        """A new sequence starts in the slot: its sampler and affinity are made anew."""
        return self.start_pos == 0 or self.prefix_from is not None


@dataclass(kw_only=True)
class StepResult:
    next_ids: list[int]  # one per input sequence
    routed: Tensor  # [L, E] (token, expert) pairs routed, on the CPU
    dropped: Tensor | None  # [L, E] pairs over capacity; None when dropless
    active: list[int]  # per layer: experts that computed
    seq_experts: Tensor  # [B, L, E] bool: the experts each sequence's tokens were routed to
    # [N, L, k] int16 on the CPU: each token's experts, the sequences' tokens in turn; only
    # where the engine keeps them (--enable-return-routed-experts), else None
    token_experts: Tensor | None = None
    # per stage (GPU work on CUDA), or None where this step's stages were not timed (on CUDA
    # only sampled steps are: server/engine/stages.py)
    stage_ms: dict[str, float] | None
    tokens: int  # tokens in the forward pass
    kv_useful: int  # decode attention: cached positions needed
    kv_computed: int  # decode attention: positions computed (padding included)
    prefill_tokens: int  # prompt tokens prefilled
    prefill_padded: int  # padding the batched prefill attention added to them
    # with experts spread over ranks: per MoE layer, what crossed between them; [W, L, E] the
    # pairs each rank's tokens routed; expert slots a re-placement before the step changed
    comm: list[Exchanged] = field(default_factory=list)
    routed_by_rank: Tensor | None = None
    moved: int = 0
    host_transfers: int = 0  # device -> host reads the step made (server/engine/host_transfer.py)
    # on CUDA, where measured: the GPU's work in the step against the time the step took (its
    # wall time when replayed as a graph; when sampled eagerly, the longer of the GPU's work and
    # the host's launching); 0 where not measured
    gpu_busy_ms: float = 0.0
    gpu_timed_ms: float = 0.0


@runtime_checkable
class Engine(Protocol):
    args: ModelArgs  # the model's shapes
    tokenizer: Tokenizer
    device: torch.device
    seed: int  # of the random weights; seeds the fault draws too
    kernel_name: str  # the MoE kernel running, after any fallback
    kv_slots: int  # sequences the KV pool holds at once
    slots: Slots  # those free for new sequences
    world: int  # the ranks the experts are spread over (1: this process alone)
    caches: list[LayerCache]  # per MoE layer, with an expert cache; empty without

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one expert (its gate, up and down projections)."""

    def step(self, seqs: list[SeqInput]) -> StepResult:
        """One forward pass over every sequence and the next token of each."""

    def stop(self) -> None:
        """Ends what runs beside the engine (the other ranks); the server calls it last."""
