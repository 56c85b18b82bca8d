"""The one-process engine: a model, its KV cache pool, its MoE machinery and a sampler, one
step at a time (the protocol it follows: server/engine/interface.py).

A sampled sequence's random generator lives with its slot, seeded from the request's seed when
the sequence starts. Each step returns one new token per sequence and what the step did:
routing counts, drops, active experts, stage times.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from records.server_settings import MoE
from server.engine.checkpoint import Checkpoint
from server.engine.decode_attention import (
    DecodeAttention,
    FlashDecode,
    GatheredDecode,
    flash_decode_unsupported,
)
from server.engine.decode_graphs import DecodeGraphs, fixed_shape_problem
from server.engine.expert_cache import LayerCache
from server.engine.host_transfer import HostTransfers, lists_to_device, to_device
from server.engine.interface import SeqInput, StepResult
from server.engine.kernels import grouped_mm_unsupported
from server.engine.layouts import StepLayout
from server.engine.model import KVCache, Transformer
from server.engine.model_args import PRESETS, ModelArgs
from server.engine.moe import StepContext, random_expert
from server.engine.routers import Skew
from server.engine.slots import SlotPool
from server.engine.stages import StageTimer, StepTimes
from server.engine.tokenizer import ByteTokenizer
from server.parallel.exchange import ExpertSpread
from server.parallel.placement import Placement

log = logging.getLogger(__name__)

GRAPH_MODES = ("auto", "off", "eager")


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


@dataclass(frozen=True)
class StepRouting:
    """What a step's tokens were routed to, on the device until fetched."""

    routed: Tensor  # [L, E] tokens each expert was routed
    seq_experts: Tensor  # [B, L, E] bool: the experts each sequence used
    dropped: Tensor | None  # [L, E] over capacity; None: dropless
    active: list[int | Tensor]  # per layer, the experts that computed
    token_experts: Tensor | None  # [N, L, k] each token's experts, where kept


@dataclass(frozen=True)
class EngineOptions:
    """How a LocalEngine is built, beyond its shapes, slots, device, dtype and seed."""

    moe: MoE = MoE()
    # this process is one of the ranks the experts are spread over, holding its share (the
    # ranks warm up together, so warm_up is False then)
    spread: ExpertSpread | None = None
    warm_up: bool = True  # one prefill and one decode step before the first request
    checkpoint: Checkpoint | None = None  # its weights and tokenizer, else random and bytes
    # decode steps as CUDA graphs where they can be (auto), never (off), or the graphs'
    # fixed-shape steps run eagerly, on any device (eager: tests)
    graphs: str = "auto"
    # on CUDA, every n-th step's stages are timed as GPU work (server/engine/stages.py; 0: none)
    sample_steps: int = 0
    keep_routing: bool = False  # each step's result holds each token's experts (token_experts)


class LocalEngine:
    world = 1  # this process holds every expert, or its rank's share of them (spread)

    def __init__(self, args: ModelArgs, kv_slots: int, device: str, dtype: torch.dtype,
                 seed: int, options: EngineOptions = EngineOptions()):
        """A model of args's shapes with random weights from seed and the byte-level tokenizer,
        or, with options.checkpoint, that checkpoint's weights and tokenizer (from_preset and
        from_checkpoint say which); options: the rest of how it is built (EngineOptions)."""
        moe, spread, checkpoint, graphs = (options.moe, options.spread, options.checkpoint,
                                           options.graphs)
        if graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {', '.join(GRAPH_MODES)}, got {graphs!r}")
        self.args = args
        self.keep_routing = options.keep_routing
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
        if (moe.moe_kernel == "auto" and self.device.type == "cuda" and not moe.expert_cache
                and spread is None):
            self.model.time_kernels()
        self.kernel_name = self.model.kernel_name
        self.caches: list[LayerCache] = [b.moe.cache for b in self.model.layers
                                         if b.moe.cache is not None]
        self.skew = Skew.parse(moe.routing_skew)
        self.decode_attend, fixed_attend, problem = self._decode_paths(args, moe, graphs)
        self.kv = KVCache(args, kv_slots, self.device, dtype, scratch=problem is None)
        # a row per slot of the pool, its scratch slot's included
        self.slot_bias = torch.zeros(self.kv.k.shape[1], args.n_layers, args.n_experts,
                                     device=self.device) if self.skew.kind == "affinity" else None
        self.kv_slots = kv_slots
        self.slots = SlotPool(range(kv_slots))
        # slot -> its sequence's sampler, made anew when a sequence starts in the slot
        self._generators: dict[int, torch.Generator] = {}
        self.timer = StageTimer(self.device, options.sample_steps)
        self.graphs: DecodeGraphs | None = None
        if options.warm_up:
            self._warm_up()
        if problem is None:
            self.graphs = self._fixed_shape_steps(fixed_attend, graphs)

    def _fixed_shape_steps(self, attend: DecodeAttention, graphs: str) -> DecodeGraphs:
        """The decode steps of fixed batch sizes, captured as CUDA graphs (graphs auto) or run
        eagerly, logged."""
        steps = DecodeGraphs(self.model, self.kv, self.kv_slots, attend, self.device,
                             "graphs" if graphs == "auto" else "eager")
        steps.prepare(self.slot_bias)
        log.info("decode steps %s for batches of %s", "as CUDA graphs" if graphs == "auto"
                 else "in fixed shapes, eagerly", steps.sizes)
        return steps

    def _decode_paths(self, args: ModelArgs, moe: MoE, graphs: str
                      ) -> tuple[DecodeAttention | None, DecodeAttention, str | None]:
        """Decode attention for eager steps (None: masked SDPA), the fixed-shape steps' own,
        and why decode steps take no fixed shapes here (None: they do), logged."""
        why_flash = flash_decode_unsupported(args, self.device, self.dtype)
        if self.device.type == "cuda":
            log.info("decode attention %s", "FlashAttention over each sequence's own positions"
                     if why_flash is None else f"masked SDPA ({why_flash})")
        eager_attend = FlashDecode if why_flash is None else None
        if graphs == "off":
            return eager_attend, GatheredDecode, "--no-cuda-graphs"
        capture = graphs == "auto"
        problem = (f"CUDA graphs need a CUDA device; this is {self.device.type}"
                   if capture and self.device.type != "cuda" else fixed_shape_problem(
                       grouped=grouped_mm_unsupported((args.expert_dim, args.dim), self.device,
                                                      self.dtype),
                       cached=moe.expert_cache > 0, capacity=moe.capacity_factor is not None,
                       spread=self.spread is not None, router=moe.router,
                       attention=why_flash if capture else None))
        if problem and self.device.type == "cuda":
            log.warning("decode steps run eagerly, not as CUDA graphs: %s", problem)
        return eager_attend, FlashDecode if capture else GatheredDecode, problem

    @classmethod
    def from_preset(cls, preset: str, kv_slots: int, device: str, dtype: torch.dtype, seed: int,
                    **options) -> LocalEngine:
        """A preset's shapes (server/engine/model_args.py PRESETS) with random weights from
        seed; options: EngineOptions's fields."""
        return cls(PRESETS[preset], kv_slots, device, dtype, seed, EngineOptions(**options))

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, kv_slots: int, device: str,
                        dtype: torch.dtype, seed: int, **options) -> LocalEngine:
        """A Hugging Face checkpoint's weights and tokenizer (server/engine/checkpoint.py); seed
        fills what the checkpoint does not hold; options: EngineOptions's other fields."""
        return cls(checkpoint.args, kv_slots, device, dtype, seed,
                   EngineOptions(checkpoint=checkpoint, **options))

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

    @torch.no_grad()
    def step(self, seqs: list[SeqInput]) -> StepResult:
        """Runs one forward pass over all seqs and samples the next token of each."""
        self.timer.begin()
        self.copy_prefixes(seqs)
        fixed = self.graphs is not None and self.graphs.bucket(len(seqs)) is not None and all(
            len(s.token_ids) == 1 and not s.begins for s in seqs)
        # a step sampled for its stage times on CUDA runs eagerly, each stage queued ahead
        # (server/engine/stages.py); its GPU busy time is not a graph step's, so it is left out
        sampled_instead = fixed and self.timer.cuda and self.timer.sampling
        fixed = fixed and not sampled_instead
        logits, routing, numbers, host = (self._fixed_forward if fixed else self._forward)(seqs)
        next_ids = logits.argmax(dim=-1)
        for i, s in enumerate(seqs):
            if s.temperature > 0:
                # Shifted so a tiny temperature gives a one-hot, not inf/inf = NaN.
                probs = torch.softmax((logits[i] - logits[i].max()) / s.temperature, dim=-1)
                next_ids[i] = sample(probs, self.generator(s))
        # the step's hand-off, in one transfer: every queued kernel and event has completed
        ids, routing = self._fetch(host, next_ids, routing)
        seq_experts, token_experts = routing.seq_experts, routing.token_experts
        if self.keep_routing and token_experts is None:  # a graph step: one token a sequence,
            # whose top-k distinct experts are its sequence's
            token_experts = seq_experts.nonzero()[:, 2].view(
                len(seqs), seq_experts.shape[1], -1).to(torch.int16)
        times = self.timer.end("decode")
        for cache in self.caches:
            cache.settle()
        if sampled_instead:
            times = StepTimes(times.stage_ms)
        return StepResult(next_ids=ids.tolist(), routed=routing.routed, dropped=routing.dropped,
                          active=routing.active, seq_experts=seq_experts,
                          token_experts=token_experts, stage_ms=times.stage_ms,
                          gpu_busy_ms=times.gpu_busy_ms, gpu_timed_ms=times.gpu_timed_ms,
                          host_transfers=host.count, **numbers)

    def _forward(self, seqs: list[SeqInput]) -> tuple[Tensor, StepRouting, dict, HostTransfers]:
        """The step in eager mode, any mix of prefill and decode: logits [B, V], the routing
        statistics (server/engine/moe.py StepContext), the step's numbers for its result and
        its host transfers so far."""
        (tokens,) = lists_to_device([[t for s in seqs for t in s.token_ids]], self.device)
        layout = StepLayout.build([(s.slot, s.start_pos, len(s.token_ids)) for s in seqs],
                                  self.device, self.kv_slots, self.decode_attend, self.args)
        token_bias = None
        if self.slot_bias is not None:
            for s in seqs:
                if s.begins:
                    bias = self.skew.request_bias(self.args.n_layers, self.args.n_experts,
                                                  s.routing_key, self.seed)
                    self.slot_bias[s.slot] = to_device(bias, self.device)
            token_bias = self.slot_bias[layout.token_slots]  # [N, L, E]
        ctx = StepContext(layout.groups, len(seqs), self.timer, token_bias,
                          host=HostTransfers(around=self.timer.read),
                          token_experts=[] if self.keep_routing else None)
        logits = self.model(tokens, layout, self.kv, ctx)  # [B, V]
        numbers = {"tokens": len(tokens), "kv_useful": layout.kv_useful,
                   "kv_computed": layout.kv_computed, "prefill_tokens": layout.prefill_tokens,
                   "prefill_padded": layout.prefill_padded, "comm": ctx.comm}
        routing = StepRouting(torch.stack(ctx.routed), torch.stack(ctx.seq_experts, dim=1),
                              torch.stack(ctx.dropped) if ctx.dropped else None, ctx.active,
                              torch.stack(ctx.token_experts, dim=1).to(torch.int16)
                              if ctx.token_experts else None)
        return logits, routing, numbers, ctx.host

    def _fixed_forward(self, seqs: list[SeqInput]
                       ) -> tuple[Tensor, StepRouting, dict, HostTransfers]:
        """_forward's answer for a step of decoding sequences only, through the graphs'
        fixed-shape step (server/engine/decode_graphs.py)."""
        logits, routed, seq_experts, active = self.graphs.run(
            [s.token_ids[0] for s in seqs], [s.start_pos for s in seqs], [s.slot for s in seqs],
            self.timer)
        useful = sum(s.start_pos + 1 for s in seqs)
        numbers = {"tokens": len(seqs), "kv_useful": useful,
                   "kv_computed": useful + self.graphs.bucket(len(seqs)) - len(seqs),
                   "prefill_tokens": 0, "prefill_padded": 0}
        routing = StepRouting(routed, seq_experts, None, list(active), None)
        return logits, routing, numbers, HostTransfers()

    @staticmethod
    def _fetch(host: HostTransfers, next_ids: Tensor, routing: StepRouting
               ) -> tuple[Tensor, StepRouting]:
        """The sampled tokens [B] and the step's routing on the host, in one transfer; its
        active counts as ints."""
        active, dropped, token_experts = routing.active, routing.dropped, routing.token_experts
        on_device = [i for i, a in enumerate(active) if isinstance(a, Tensor)]
        parts = [next_ids, routing.routed, routing.seq_experts,
                 *([dropped] if dropped is not None else []),
                 *([token_experts] if token_experts is not None else []),
                 *([torch.stack([active[i] for i in on_device])] if on_device else [])]
        ids, routed, seq_experts, *rest = host.fetch(parts)
        dropped = rest.pop(0) if dropped is not None else None
        token_experts = rest.pop(0) if token_experts is not None else None
        active = list(active)
        for i, n in zip(on_device, rest[0].tolist() if on_device else [], strict=True):
            active[i] = n
        return ids, StepRouting(routed, seq_experts, dropped, active, token_experts)

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
