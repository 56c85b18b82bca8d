"""The one-process engine: a model, its KV cache pool, its MoE machinery and a sampler, one
step at a time (the protocol it follows: server/engine/interface.py).

A sampled sequence's random generator lives with its slot, seeded from the request's seed when
the sequence starts. Each step returns one new token per sequence and what the step did:
routing counts, drops, active experts, stage times.
"""

from __future__ import annotations

import torch
from torch import Tensor

from records.server_settings import MoE
from server.engine.checkpoint import Checkpoint
from server.engine.expert_cache import LayerCache
from server.engine.host_transfer import lists_to_device, to_device
from server.engine.interface import SeqInput, StepResult
from server.engine.model import PRESETS, KVCache, ModelArgs, StepLayout, Transformer
from server.engine.moe import StepContext, random_expert
from server.engine.routing import Skew
from server.engine.slots import SlotPool
from server.engine.stages import StageTimer
from server.engine.tokenizer import ByteTokenizer
from server.parallel.exchange import ExpertSpread
from server.parallel.placement import Placement


def indexed(device: torch.device) -> torch.device:
    """The device with its index: plain cuda is the current GPU (torch.cuda.set_device and
    the stage timer's events need the index)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def sample(probs: Tensor, gen: torch.Generator) -> Tensor:
    """One token drawn from probs [V], as a 0-d device tensor: the index of the largest
    probs / Exp(1) (the exponential race, which picks each token with its probability). It is
    what torch.multinomial computes for one sample, without the two host reads multinomial
    makes first to check probs."""
    return (probs / torch.empty_like(probs).exponential_(generator=gen)).argmax()


class LocalEngine:
    world = 1  # this process holds every expert, or its rank's share of them (spread)

    def __init__(self, args: ModelArgs, kv_slots: int, device: str, dtype: torch.dtype,
                 seed: int, moe: MoE = MoE(), spread: ExpertSpread | None = None,
                 warm_up: bool = True, checkpoint: Checkpoint | None = None):
        """A model of args's shapes with random weights from seed and the byte-level tokenizer,
        or, with checkpoint, that checkpoint's weights and tokenizer (from_preset and
        from_checkpoint say which). spread: this process is one of the ranks the experts are
        spread over, holding its share (the ranks warm up together, so warm_up is False then)."""
        self.args = args
        self.checkpoint = checkpoint
        self.tokenizer = checkpoint.tokenizer() if checkpoint else ByteTokenizer()
        self.device = indexed(torch.device(device))
        if self.device.type == "cuda":  # this thread's context and allocations go there
            torch.cuda.set_device(self.device)
        self.dtype = dtype
        self.seed = seed
        self.spread = spread
        self.model = Transformer(args, moe, seed, self.device, dtype, spread)
        self.model.init_random(seed, checkpoint.load_into(self.model) if checkpoint
                               else frozenset())
        self.model.eval()
        self.kernel_name = self.model.kernel_name
        self.caches: list[LayerCache] = [b.moe.cache for b in self.model.layers
                                         if b.moe.cache is not None]
        self.skew = Skew.parse(moe.routing_skew)
        self.slot_bias = torch.zeros(kv_slots, args.n_layers, args.n_experts, device=self.device) \
            if self.skew.kind == "affinity" else None
        self.kv = KVCache(args, kv_slots, self.device, dtype)
        self.kv_slots = kv_slots
        self.slots = SlotPool(range(kv_slots))
        # slot -> its sequence's sampler, made anew when a sequence starts in the slot
        self._generators: dict[int, torch.Generator] = {}
        self.timer = StageTimer(self.device)
        if warm_up:
            self._warm_up()

    @classmethod
    def from_preset(cls, preset: str, kv_slots: int, device: str, dtype: torch.dtype, seed: int,
                    moe: MoE = MoE(), **options) -> LocalEngine:
        """A preset's shapes (server/engine/model.py PRESETS) with random weights from seed."""
        return cls(PRESETS[preset], kv_slots, device, dtype, seed, moe, **options)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, kv_slots: int, device: str,
                        dtype: torch.dtype, seed: int, moe: MoE = MoE(),
                        **options) -> LocalEngine:
        """A Hugging Face checkpoint's weights and tokenizer (server/engine/checkpoint.py); seed
        fills what the checkpoint does not hold."""
        return cls(checkpoint.args, kv_slots, device, dtype, seed, moe, checkpoint=checkpoint,
                   **options)

    def _warm_up(self) -> None:
        """One prefill and one decode step, so the first request does not pay torch's
        one-time costs (about 100 ms on a CPU) in its TTFT. Slot 0 is overwritten later."""
        token = self.step([SeqInput(0, [0] * 8, 0)]).next_ids[0]
        self.step([SeqInput(0, [token], 8)])

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one expert (its gate, up and down projections)."""
        a = self.args
        return 3 * a.dim * a.expert_dim * self.dtype.itemsize

    def stop(self) -> None:
        """Nothing runs beside a one-process engine: there is nothing to end."""

    def generator(self, s: SeqInput) -> torch.Generator:
        """The sampler of the sequence in s.slot, new when the sequence starts."""
        if s.begins or s.slot not in self._generators:
            self._generators[s.slot] = torch.Generator(device=self.device).manual_seed(s.seed)
        return self._generators[s.slot]

    @torch.no_grad()
    def copy_prefixes(self, seqs: list[SeqInput]) -> None:
        """Each new sequence's cached prefix, copied into its slot from the slot holding it
        (every layer's keys and values of its first start_pos positions), before the step
        writes anything."""
        for s in seqs:
            if s.prefix_from is not None and s.prefix_from != s.slot:
                for cache in (self.kv.k, self.kv.v):
                    cache[:, s.slot, :, :s.start_pos] = cache[:, s.prefix_from, :, :s.start_pos]

    def step(self, seqs: list[SeqInput]) -> StepResult:
        """Runs one forward pass over all seqs and samples the next token of each."""
        self.timer.begin()
        self.copy_prefixes(seqs)
        (tokens,) = lists_to_device([[t for s in seqs for t in s.token_ids]], self.device)
        layout = StepLayout.build([(s.slot, s.start_pos, len(s.token_ids)) for s in seqs],
                                  self.device, self.kv_slots)
        token_bias = None
        if self.slot_bias is not None:
            for s in seqs:
                if s.begins:
                    bias = self.skew.request_bias(self.args.n_layers, self.args.n_experts,
                                                  s.routing_key, self.seed)
                    self.slot_bias[s.slot] = to_device(bias, self.device)
            token_bias = self.slot_bias[layout.token_slots]  # [N, L, E]
        ctx = StepContext(layout.groups, len(seqs), self.timer, token_bias)
        logits = self.model(tokens, layout, self.kv, ctx)  # [B, V]
        next_ids = logits.argmax(dim=-1)
        for i, s in enumerate(seqs):
            if s.temperature > 0:
                # Shifted so a tiny temperature gives a one-hot, not inf/inf = NaN.
                probs = torch.softmax((logits[i] - logits[i].max()) / s.temperature, dim=-1)
                next_ids[i] = sample(probs, self.generator(s))
        # the step's hand-off, in one transfer: every queued kernel and event has completed
        on_device = [i for i, a in enumerate(ctx.active) if isinstance(a, Tensor)]
        parts = [next_ids, torch.stack(ctx.routed), torch.stack(ctx.seq_experts, dim=1),
                 *([torch.stack(ctx.dropped)] if ctx.dropped else []),
                 *([torch.stack([ctx.active[i] for i in on_device])] if on_device else [])]
        ids, routed, seq_experts, *rest = ctx.host.fetch(parts)
        dropped = rest.pop(0) if ctx.dropped else None
        active = list(ctx.active)
        for i, n in zip(on_device, rest[0].tolist() if on_device else [], strict=True):
            active[i] = n
        self.timer.mark("decode")
        for cache in self.caches:
            cache.settle()
        return StepResult(next_ids=ids.tolist(), routed=routed, dropped=dropped, active=active,
                          seq_experts=seq_experts, stage_ms=self.timer.end(), tokens=len(tokens),
                          kv_useful=layout.kv_useful, kv_computed=layout.kv_computed,
                          prefill_tokens=layout.prefill_tokens,
                          prefill_padded=layout.prefill_padded, comm=ctx.comm,
                          host_transfers=ctx.host.count)

    @torch.no_grad()
    def place(self, placement: Placement) -> int:
        """Holds the experts a new placement gives this rank: each slot whose expert changed
        takes the new one's weights from where the model's come from (its seed, or the
        checkpoint); returns how many slots changed."""
        changed = 0
        for i, block in enumerate(self.model.layers):
            experts = block.moe.experts
            for slot, expert in enumerate(placement.held[i][self.spread.group.rank]):
                if experts.held[slot] == expert:
                    continue
                w13, w2 = (self.checkpoint.expert(i, expert) if self.checkpoint else
                           random_expert(self.seed, i, expert, self.args.dim,
                                         self.args.expert_dim))
                experts.w13[slot].copy_(w13)
                experts.w2[slot].copy_(w2)
                experts.held[slot] = expert
                changed += 1
            block.moe.exchange.placement(placement, i)
        return changed
