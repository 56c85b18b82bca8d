"""The MoE feed-forward layer: route -> capacity -> dispatch -> expert compute -> combine.

Dispatch sorts the step's (token, expert) pairs by expert so each expert's tokens are one
contiguous slice; combine scatters the weighted outputs back to their tokens. With expert
parallelism these two are where the all-to-all exchange goes.

Shape letters: N tokens, D model dim, E experts, I expert hidden dim, k experts per token,
M kept (token, expert) pairs.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from records.engine_telemetry import Stage
from server.engine.expert_cache import LayerCache
from server.engine.host_transfer import HostTransfers
from server.engine.kernels import Kernel, for_rows, gated, grouped_mm_experts, project, swiglu
from server.engine.model_args import ModelArgs
from server.engine.stages import StageTimer
from server.parallel.exchange import Exchange, Exchanged


def tally(ids: Tensor, n: int, weights: Tensor | None = None) -> Tensor:
    """How often each of 0..n-1 occurs in ids (int64 [n]), each occurrence counted its weight
    (int64, default 1): bincount's answer, without the host reads bincount makes on CUDA (the
    ids' least and greatest values)."""
    return torch.zeros(n, dtype=torch.long, device=ids.device).index_add_(
        0, ids, torch.ones_like(ids) if weights is None else weights)


def expert_capacity(tokens: int, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Slots per expert in one step: ceil(tokens x k / experts x CF)."""
    return math.ceil(tokens * top_k / n_experts * capacity_factor)


@dataclass
class StepContext:
    """What one forward pass needs beyond the tokens, and what it reports back."""

    groups: Tensor  # [N] index of each token's sequence in the step
    n_seqs: int
    timer: StageTimer
    token_bias: Tensor | None = None  # [N, L, E] per-request routing bias (affinity skew)
    # per layer [B, E]: experts each sequence used
    seq_experts: list[Tensor] = field(default_factory=list)
    # per layer [E]: (token, expert) pairs routed
    routed: list[Tensor] = field(default_factory=list)
    dropped: list[Tensor] = field(default_factory=list)  # per layer [E]: pairs over capacity
    # per layer: experts that computed (a 0-d device tensor on the grouped kernel until the
    # step's one transfer at its end)
    active: list[int | Tensor] = field(default_factory=list)
    comm: list = field(default_factory=list)  # per layer: its exchange (server/parallel/)
    host: HostTransfers = field(default_factory=HostTransfers)  # the step's device -> host reads
    # a fixed-shape decode step (server/engine/decode_graphs.py): which rows are real sequences
    # [N] bool, and which (token, expert) pairs [N x k] int64 1/0; None: every row is
    valid: Tensor | None = None
    valid_pairs: Tensor | None = None
    kernel: Kernel | None = None  # the expert kernel for this step, over each layer's own
    # per layer [N, k]: each token's experts, kept where the server returns routed experts
    # (--enable-return-routed-experts); None: not kept
    token_experts: list[Tensor] | None = None
    _pairs: tuple[Tensor, Tensor] | None = None

    # what an exchange records (server/parallel/exchange.py, ExchangeLog)
    def mark(self, stage: str) -> None:
        self.timer.mark(stage)

    def computed(self, experts: int) -> None:
        self.active.append(experts)

    def exchanged(self, record: Exchanged) -> None:
        self.comm.append(record)

    def pairs(self, k: int) -> tuple[Tensor, Tensor]:
        """Each (token, expert) pair's sequence [N x k] and a one per pair (int64) to count it,
        made once a step for every layer (k is the same in each)."""
        if self._pairs is None:
            groups = self.groups.repeat_interleave(k)
            self._pairs = (groups, torch.ones_like(groups))
        return self._pairs


def random_expert(seed: int, layer: int, expert: int, dim: int,
                  hidden: int) -> tuple[Tensor, Tensor]:
    """One expert's seeded random weights, fp32 on the CPU, w13 [2I, D] and w2 [D, I]: drawn
    from its own generator, so an expert is the same whichever process or device holds it."""
    gen = torch.Generator().manual_seed((seed * 1_000 + layer) * 1_000_000 + expert)
    return (torch.randn(2 * hidden, dim, generator=gen).div_(math.sqrt(dim)),
            torch.randn(dim, hidden, generator=gen).div_(math.sqrt(hidden)))


CUDA_HOST_REGISTER_PORTABLE = 1  # page-locked for every GPU's context, not only the current one


def pin_in_place(t: Tensor) -> None:
    """Page-locks t's own memory for asynchronous copies to the GPU, until t is freed. Not
    pin_memory=True: torch's pinned host allocator rounds each block up to a power of two (a
    48 GiB layer stack would lock 64 GiB); registering the tensor's memory locks exactly its
    bytes."""
    cudart, ptr = torch.cuda.cudart(), t.data_ptr()
    err = cudart.cudaHostRegister(ptr, t.numel() * t.element_size(), CUDA_HOST_REGISTER_PORTABLE)
    if int(err) != 0:
        raise RuntimeError(f"cannot pin {t.numel() * t.element_size()} bytes of expert weights "
                           f"in host memory (cudaHostRegister error {int(err)}); free host "
                           "memory, or serve a smaller model")
    # unregistered as t goes, before its memory does: an address the allocator hands out again
    # must not be found registered still
    weakref.finalize(t, cudart.cudaHostUnregister, ptr)


class Experts(nn.Module):
    """One layer's expert weights, stacked: w13 [S, 2I, D] (the gate projection's rows, then
    the up projection's) and w2 [S, D, I], slot j holding expert held[j] (every expert, in
    order, unless the experts are spread over ranks). With an expert cache they stay in host
    memory (pinned on CUDA) and the cache holds the resident ones."""

    def __init__(self, args: ModelArgs, device, dtype, on_host: bool = False,
                 held: list[int] | None = None):
        super().__init__()
        self.held = list(range(args.n_experts)) if held is None else held
        s, i, d = len(self.held), args.expert_dim, args.dim
        where = "cpu" if on_host else device
        self.w13 = nn.Parameter(torch.empty(s, 2 * i, d, dtype=dtype, device=where))
        self.w2 = nn.Parameter(torch.empty(s, d, i, dtype=dtype, device=where))
        if on_host and torch.device(device).type == "cuda":
            for w in self.weights:
                pin_in_place(w)

    @property
    def weights(self) -> tuple[Tensor, Tensor]:
        return self.w13, self.w2


class HeldExperts:
    """The experts held here through the layer's kernel, as an exchange calls them
    (server/parallel/exchange.py, ExpertSlots): rows sorted by slot."""

    def __init__(self, experts: Experts, kernel: Kernel):
        self.experts, self.kernel = experts, kernel

    @property
    def slots(self) -> int:
        return len(self.experts.held)

    def __call__(self, rows: Tensor, counts: list[int]) -> Tensor:
        return self.kernel(rows, counts, range(len(counts)), *self.experts.weights)


class SharedExpert(nn.Module):
    """An expert every token passes, beside the routed ones, its output scaled by
    sigmoid(x . g) (Qwen2-MoE's shared expert): w13 [2I, D] fused as the routed experts' are,
    w2 [D, I], gate [1, D]."""

    def __init__(self, dim: int, hidden: int, device, dtype):
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False, device=device, dtype=dtype)
        self.w2 = nn.Linear(hidden, dim, bias=False, device=device, dtype=dtype)
        self.gate = nn.Linear(dim, 1, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.gate(x)) * project(self.w2, gated(project(self.w13, x)))


@dataclass(frozen=True)
class MoEParts:
    """What a MoE layer is built from."""

    router: nn.Module
    experts: Experts
    kernel: Kernel
    capacity_factor: float | None = None  # None: dropless
    skew_bias: Tensor | None = None  # [E] layer-wide routing bias
    cache: LayerCache | None = None
    shared: SharedExpert | None = None
    # carries tokens to experts held by other ranks and back (server/parallel/exchange.py);
    # without one every expert is here
    exchange: Exchange | None = None


class MoELayer(nn.Module):
    """Complete when built: its parts never change afterwards."""

    def __init__(self, layer: int, top_k: int, parts: MoEParts, n_experts: int | None = None):
        """n_experts: the layer's experts, all ranks' together (default: those held here)."""
        super().__init__()
        self.layer = layer
        self.top_k = top_k
        self.n_experts = n_experts or len(parts.experts.held)
        self.router = parts.router
        self.experts = parts.experts
        self.kernel = parts.kernel
        self.capacity_factor = parts.capacity_factor
        self.register_buffer("skew_bias", parts.skew_bias, persistent=False)
        self.cache = parts.cache
        self.shared = parts.shared
        self.exchange = parts.exchange
        self.held_experts = HeldExperts(parts.experts, parts.kernel)

    def parts(self) -> MoEParts:
        """What this layer was built from, as it holds them now (its routing bias moved with
        it)."""
        return MoEParts(self.router, self.experts, self.kernel, self.capacity_factor,
                        self.skew_bias, self.cache, self.shared, self.exchange)

    def forward(self, x: Tensor, step: StepContext) -> Tensor:
        weights, experts = self.route(x, step)
        if step.valid is not None:  # padding rows take row 0's experts: they read no others
            experts = torch.where(step.valid[:, None], experts, experts[:1])
        flat = experts.flatten()  # [N*k]
        pair_groups, ones = step.pairs(self.top_k)
        used = torch.zeros(step.n_seqs, self.n_experts, dtype=torch.long, device=x.device)
        step.seq_experts.append(used.index_put_((pair_groups, flat), ones).bool())
        if step.token_experts is not None:
            step.token_experts.append(experts)
        if self.exchange is None:
            out = self.here(x, weights, flat, step)
        else:
            step.routed.append(tally(flat, self.n_experts))
            out = self.exchange.run(x, weights, flat, self.held_experts, step)
        if self.shared is not None:
            out += self.shared(x)
            step.timer.mark(Stage.EXPERT_COMPUTE)
        return out

    def here(self, x: Tensor, weights: Tensor, flat: Tensor, step: StepContext) -> Tensor:
        """Every expert in this process: sort the pairs by expert, drop what is over capacity,
        compute each expert's slice, combine."""
        order = flat.argsort(stable=True)  # by expert, then token: earlier tokens keep capacity
        counts = tally(flat, self.n_experts, step.pairs(self.top_k)[1])  # [E]
        kernel = step.kernel or for_rows(self.kernel, flat.numel())
        keep = None
        if self.capacity_factor is not None:
            cap = expert_capacity(x.shape[0], self.top_k, self.n_experts, self.capacity_factor)
            starts = counts.cumsum(0) - counts
            rank = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
            keep = rank < cap
            kept = counts.clamp(max=cap)
            step.dropped.append(counts - kept)
        else:
            kept = counts
        # what the sequences routed, padding rows left out (they computed only row 0's experts)
        routed = counts if step.valid_pairs is None else tally(flat, self.n_experts,
                                                               step.valid_pairs)
        step.routed.append(routed)
        if keep is None and self.cache is None and kernel is grouped_mm_experts:
            kept_counts = kept  # on the device: the grouped kernel's offsets come from it
            step.active.append((routed > 0).sum())
        else:
            kept_counts = step.host.to_list(kept)  # the layer's one host sync
            step.active.append(sum(1 for n in kept_counts if n))
            if keep is not None:  # the kept pairs first, in order; sized here, not by a mask
                order = order[(~keep).to(torch.uint8).argsort(stable=True)[:sum(kept_counts)]]
        step.timer.mark(Stage.ROUTING)

        token_of = order // self.top_k  # [M] source token of each kept pair, sorted by expert
        ys = self.compute(self.dispatch(x, token_of), kept_counts, kernel)
        step.timer.mark(Stage.EXPERT_COMPUTE)

        out = self.combine(ys, token_of, weights.flatten()[order], x)
        step.timer.mark(Stage.COMBINE)
        return out

    def route(self, x: Tensor, step: StepContext) -> tuple[Tensor, Tensor]:
        bias = self.skew_bias
        if step.token_bias is not None:
            layer_bias = step.token_bias[:, self.layer]
            bias = layer_bias if bias is None else bias + layer_bias
        return self.router(x, bias, step.groups)

    def compute(self, xs: Tensor, counts: list[int] | Tensor, kernel: Kernel) -> Tensor:
        if self.cache is None:
            return kernel(xs, counts, range(self.n_experts), *self.experts.weights)
        # Through the cache, expert by expert, resident ones first: visiting the same experts in
        # id order every step is a scan that makes LRU evict exactly the expert needed next.
        starts = [0]
        for n in counts:
            starts.append(starts[-1] + n)
        resident = self.cache.slot_of
        ys = torch.empty_like(xs)
        for e in sorted((e for e, n in enumerate(counts) if n), key=lambda e: e not in resident):
            a, b = starts[e], starts[e + 1]
            (slot,) = self.cache.ensure([e])
            ys[a:b] = kernel(xs[a:b], [counts[e]], [slot], *self.cache.resident)
        return ys

    @staticmethod
    def dispatch(x: Tensor, token_of: Tensor) -> Tensor:
        """Each kept (token, expert) pair's input, grouped by expert [M, D]."""
        return x[token_of]

    @staticmethod
    def combine(ys: Tensor, token_of: Tensor, weights: Tensor, x: Tensor) -> Tensor:
        """Weighted sum of each token's expert outputs; dropped pairs add nothing."""
        return torch.zeros_like(x).index_add_(0, token_of, ys * weights[:, None].to(ys.dtype))

    def reference(self, x: Tensor, step: StepContext) -> Tensor:
        """The same layer token by token, dropless: slow, for tests."""
        weights, experts = self.route(x, step)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(self.top_k):
                e = int(experts[t, j])
                y = swiglu(x[t:t + 1], *(w[e] for w in self.experts.weights))
                out[t] += weights[t, j].to(x.dtype) * y[0]
        return out if self.shared is None else out + self.shared(x)
