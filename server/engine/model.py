"""A decoder-only Mixture-of-Experts transformer: seeded random weights for the presets, or a
Hugging Face checkpoint's (server/engine/checkpoint.py). The shapes and the variations the supported
families need (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) are ModelArgs fields: head size, q/k/v
biases, q/k normalisation, clipping, a shared expert, tied embeddings, a sliding window.

One forward pass serves a whole engine step: the tokens of every sequence in the step are
flattened into one row, so prefill chunks and single decode tokens share every matmul and
the MoE layer (server/engine/moe.py) sees all of the step's tokens at once.

Shape letters: N tokens in the step, D model dim, H query heads, G kv heads, K head dim,
E experts, I expert hidden dim, S cached positions, B sequences, V vocabulary, L layers,
Q = H x K and C = G x K the query and key widths.
"""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import psutil
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from records.declare import flat
from records.engine_telemetry import Stage
from records.server_settings import MoE
from server.engine.expert_cache import LayerCache
from server.engine.kernels import KERNELS, log_timings, project, resolve_kernel, time_kernels
from server.engine.layouts import DecodeLayout, StepLayout
from server.engine.model_args import ModelArgs
from server.engine.moe import (
    Experts,
    MoELayer,
    MoEParts,
    SharedExpert,
    StepContext,
    random_expert,
)
from server.engine.routers import Skew, router_class, router_options
from server.parallel.exchange import ExpertSpread


class KVCache(nn.Module):
    """The preallocated pool: `slots` sequences of up to max_seq_len positions per layer, and
    with `scratch` one slot more (index `slots`) that no sequence holds: fixed-shape decode
    steps write their padding rows there."""

    def __init__(self, args: ModelArgs, slots: int, device, dtype, scratch: bool = False):
        super().__init__()
        self.scratch_slot = slots if scratch else None
        shape = (args.n_layers, slots + scratch, args.n_kv_heads, args.max_seq_len, args.head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device, dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
                * self.weight)


def rope_tables(args: ModelArgs, device) -> tuple[Tensor, Tensor]:
    """[S, K] each, for `apply_rope`: (cos, cos) and (-sin, sin) over the two halves of a head."""
    half = args.head_dim // 2
    freqs = 1.0 / args.rope_base ** (torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(args.max_seq_len, device=device, dtype=torch.float32), freqs)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [N, heads, K] rotated by its positions' cos, sin [N, 1, K] (`rope_tables`' rows): the
    halves (x1, x2) become (x1 c - x2 s, x2 c + x1 s), as x * cos + (x2, x1) * sin, which is
    the same float arithmetic in three kernels and a copy where the halves took seven."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([x2, x1], dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, device, dtype):
        super().__init__()
        self.args = args
        self.wqkv = nn.Linear(args.dim, args.q_dim + 2 * args.kv_dim, bias=args.qkv_bias,
                              device=device, dtype=dtype)
        self.wo = nn.Linear(args.q_dim, args.dim, bias=args.out_bias, device=device, dtype=dtype)
        widths = {"head": (args.head_dim, args.head_dim), "full": (args.q_dim, args.kv_dim)}
        if args.qk_norm:
            q_width, k_width = widths[args.qk_norm]
            self.q_norm = RMSNorm(q_width, args.norm_eps, device, dtype)
            self.k_norm = RMSNorm(k_width, args.norm_eps, device, dtype)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [N, H, K], k and v [N, G, K], normalised and clipped as the model does, before
        the rotary embedding."""
        a = self.args
        n = x.shape[0]
        q, k, v = project(self.wqkv, x).split([a.q_dim, a.kv_dim, a.kv_dim], dim=-1)
        if a.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if a.clip_qkv is not None:
            q, k, v = (t.clamp(-a.clip_qkv, a.clip_qkv) for t in (q, k, v))
        q = q.view(n, a.n_heads, a.head_dim)
        k = k.view(n, a.n_kv_heads, a.head_dim)
        if a.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v.view(n, a.n_kv_heads, a.head_dim)

    def forward(self, x: Tensor, layout: StepLayout | DecodeLayout, cos: Tensor, sin: Tensor,
                k_cache: Tensor, v_cache: Tensor) -> Tensor:
        a = self.args
        n = x.shape[0]
        q, k, v = self.qkv(x)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_cache[layout.token_slots, :, layout.positions] = k
        v_cache[layout.token_slots, :, layout.positions] = v
        if isinstance(layout, DecodeLayout):
            return project(self.wo, layout.attend(q, k_cache, v_cache).reshape(n, a.q_dim))

        out = torch.empty_like(q)
        if layout.attend is not None:
            out[layout.decode_index] = layout.attend(q[layout.decode_index], k_cache, v_cache)
        elif layout.decode_index.numel():
            s = layout.decode_max_len
            qd = q[layout.decode_index].unsqueeze(2)  # [Bd, H, 1, K]
            if layout.decode_pool:
                pool = layout.decode_pool  # the pool's slots, not its scratch slot
                keys, values = k_cache[:pool, :, :s], v_cache[:pool, :, :s]  # [R, G, S, K]
                qd = qd.new_zeros(layout.decode_pool, *qd.shape[1:]).index_copy_(
                    0, layout.decode_slots, qd)
            else:
                keys = k_cache[layout.decode_slots, :, :s]
                values = v_cache[layout.decode_slots, :, :s]
            keys_at = torch.arange(s, device=x.device)[None, :]
            mask = keys_at < layout.decode_lens[:, None]  # [R, S]
            if a.sliding_window:
                mask &= keys_at >= layout.decode_lens[:, None] - a.sliding_window
            mask = mask[:, None, None, :]
            o = masked_attention(qd, keys, values, mask,
                                 expand_heads=fused_refuses_grouped_mask(qd, keys, values, mask))
            if layout.decode_pool:
                o = o[layout.decode_slots]
            out[layout.decode_index] = o.squeeze(2)
        if layout.prefill_slots.numel():
            width = layout.prefill_index.shape[1]
            keys = k_cache[layout.prefill_slots, :, :width]  # [P, G, T, K]
            values = v_cache[layout.prefill_slots, :, :width]
            qp = q[layout.prefill_index].transpose(1, 2)  # [P, H, T, K]
            o = causal_attention(qp, keys, values, 0, a.sliding_window)
            out[layout.prefill_to] = o.transpose(1, 2).flatten(0, 1)[layout.prefill_from]
        for first, length, slot, start in layout.resumed:
            s = start + length
            qr = q[first:first + length].transpose(0, 1)[None]  # [1, H, T, K]
            o = causal_attention(qr, k_cache[slot, :, :s][None], v_cache[slot, :, :s][None],
                                 start, a.sliding_window)
            out[first:first + length] = o[0].transpose(0, 1)
        return project(self.wo, out.reshape(n, a.q_dim))


def causal_attention(q: Tensor, keys: Tensor, values: Tensor, start: int,
                     window: int) -> Tensor:
    """Prompt tokens at positions start.. (q [P, H, T, K]) over their sequences' keys up to
    and including themselves (keys [P, G, start + T, K]). New prompts (start 0) go to SDPA as
    causal attention, never as a mask, so a fused kernel (flash or memory-efficient) runs where
    the build has one and no [T, S] scores exist. A prompt resumed after a cached prefix (its
    rows at the end of the keys) or a sliding window the keys outgrow takes a [T, S] mask:
    torch's lower-right causal bias would spare it, but importing it costs 70 MB and 1.2 s
    (it loads torch._dynamo; docs/measured.md)."""
    t, s = q.shape[2], keys.shape[2]
    if start == 0 and not (window and s > window):
        return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
    rows = torch.arange(start, start + t, device=q.device)[:, None]
    at = torch.arange(s, device=q.device)[None, :]
    mask = at <= rows  # [T, S]
    if window:
        mask &= at > rows - window
    return masked_attention(q, keys, values, mask,
                            expand_heads=fused_refuses_grouped_mask(q, keys, values, mask))


def masked_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor,
                     expand_heads: bool) -> Tensor:
    """SDPA under a boolean mask, the keys' G heads shared by the H query heads. With
    expand_heads the keys and values are repeated to H heads first: on CUDA, where no fused
    kernel of this build takes grouped heads with a mask (`fused_refuses_grouped_mask`), SDPA
    would fall back to its math kernel and hold [P, H, T, S] float32 scores, and the copy,
    [P, H, S, K], is one that kernel makes as well."""
    groups = q.shape[1] // keys.shape[1]
    if expand_heads and groups > 1:
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)


def fused_refuses_grouped_mask(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> bool:
    """On CUDA: neither SDPA's memory-efficient kernel nor cuDNN's, the fused ones that take a
    mask, would run these grouped heads (many torch builds refuse them; newer ones do not, and
    repeating the heads there would only multiply the keys read)."""
    if q.device.type != "cuda" or q.shape[1] == keys.shape[1]:
        return False
    params = torch.backends.cuda.SDPAParams(q, keys, values, mask, 0.0, False, True)
    return not (torch.backends.cuda.can_use_efficient_attention(params)
                or torch.backends.cuda.can_use_cudnn_attention(params))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, moe: MoELayer, device, dtype):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, device, dtype)
        self.attention = Attention(args, device, dtype)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, device, dtype)
        self.moe = moe


class Transformer(nn.Module):
    """The model, every layer complete when built from the MoE settings: its router (with the
    options it takes), kernel (grouped_mm falls back to sorted where it cannot run: see
    `kernel_name`), capacity factor, routing skew and expert cache."""

    def __init__(self, args: ModelArgs, moe: MoE = MoE(), seed: int = 0, device="cpu",
                 dtype=torch.float32, spread: ExpertSpread | None = None):
        """spread: the experts are spread over ranks; this process holds its share."""
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, device=device, dtype=dtype)
        cached = moe.expert_cache > 0
        self.kernel_name = resolve_kernel(moe.moe_kernel, (args.expert_dim, args.dim),
                                          torch.device(device), dtype, cached)
        router = router_class(moe.router)
        options = router_options(router, flat(moe))  # the MoE settings it takes by name
        # the routers' args: --[no-]renormalize where given, else the model's own
        routed = args if moe.renormalize is None else replace(args, renormalize=moe.renormalize)
        skew = Skew.parse(moe.routing_skew)
        rng = random.Random(seed)  # the random eviction policy's draws, shared by the layers

        def moe_layer(i: int) -> MoELayer:
            experts = Experts(args, device, dtype, on_host=cached,
                              held=spread.held(i) if spread else None)
            bias = skew.layer_bias(args.n_experts, args.top_k, i, seed)
            cache = LayerCache(experts.weights, moe.expert_cache, torch.device(device),
                               moe.cache_policy, rng) if cached else None
            shared = (SharedExpert(args.dim, args.shared_expert_dim, device, dtype)
                      if args.shared_expert_dim else None)
            parts = MoEParts(router(routed, i, seed, device, dtype, **options), experts,
                             KERNELS[self.kernel_name], moe.capacity_factor,
                             None if bias is None else bias.to(device), cache, shared,
                             spread.exchange(i) if spread else None)
            return MoELayer(i, args.top_k, parts, args.n_experts)

        self.layers = nn.ModuleList(Block(args, moe_layer(i), device, dtype)
                                    for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, device, dtype)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False, device=device, dtype=dtype)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def time_kernels(self) -> None:
        """--moe-kernel auto on CUDA: the candidate kernels timed once on layer 0's experts at
        decode and prefill sizes, each layer then running the fastest for its call's size
        (server/engine/kernels.py KernelTable; the table is logged). A CPU and the expert cache
        keep their one kernel (`resolve_kernel` says why)."""
        experts = self.layers[0].moe.experts
        candidates = ["sorted", "batched"] + ["grouped_mm"] * (self.kernel_name == "grouped_mm")
        table, times = time_kernels(candidates, experts.w13, experts.w2, self.args.top_k)
        log_timings(table, times)
        for block in self.layers:
            block.moe.kernel = table
        names = {name for _, name in table.rows}
        self.kernel_name = names.pop() if len(names) == 1 else "auto"

    @torch.no_grad()
    def init_random(self, seed: int, keep: frozenset[str] = frozenset()) -> None:
        """Seeded random weights scaled so activations stay O(1) through the layers, biases
        zero; the parameters named in keep (loaded from a checkpoint) are left as they are.
        Drawn on the CPU, so a seed means the same model on any device, and each expert from
        its own generator (server/engine/moe.py random_expert), so the experts a process holds are
        the same whichever it holds. The experts, most of a model's weights, are drawn on
        torch's CPU threads at once, as many as a quarter of the free host memory holds (a CPU
        draws about 120 M numbers a second per thread: mixtral-8x7b's experts would take six
        minutes on one)."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name in keep or ".moe.experts." in name:
                continue
            if name.endswith(".bias"):
                p.zero_()
                continue
            fan_in = p.shape[-1] if p.dim() > 1 and "tok_embeddings" not in name else 1
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32)
                    .mul_(1 / math.sqrt(fan_in)))
        todo = [(i, slot, expert) for i, block in enumerate(self.layers)
                if f"layers.{i}.moe.experts.w13" not in keep
                for slot, expert in enumerate(block.moe.experts.held)]

        inference = torch.is_inference_mode_enabled()

        def draw(item: tuple[int, int, int]) -> None:
            i, slot, expert = item
            experts = self.layers[i].moe.experts
            w13, w2 = random_expert(seed, i, expert, self.args.dim, self.args.expert_dim)
            # the caller's modes are its thread's own: the pool's threads take them here
            with torch.inference_mode(inference), torch.no_grad():
                experts.w13[slot].copy_(w13)
                experts.w2[slot].copy_(w2)

        # each drawer holds an expert in float32 and its copy in the model's dtype
        drawing = 3 * self.args.dim * self.args.expert_dim * 8
        drawers = max(1, min(torch.get_num_threads(),
                             psutil.virtual_memory().available // 4 // drawing))
        with ThreadPoolExecutor(drawers) as pool:
            list(pool.map(draw, todo))

    @torch.no_grad()
    def forward(self, tokens: Tensor, layout: StepLayout | DecodeLayout, cache: KVCache,
                step: StepContext) -> Tensor:
        """Logits of each sequence's last token [B, V]; routing counts go into step."""
        cos = self.rope_cos[layout.positions][:, None]  # [N, 1, K]
        sin = self.rope_sin[layout.positions][:, None]
        x = self.tok_embeddings(tokens)  # [N, D]
        step.timer.mark(Stage.PREPROCESS)
        for i, layer in enumerate(self.layers):
            x = x + layer.attention(layer.attention_norm(x), layout, cos, sin,
                                    cache.k[i], cache.v[i])
            step.timer.mark(Stage.ATTENTION)
            x = x + layer.moe(layer.ffn_norm(x), step)  # marks routing, expert_compute, combine
        return project(self.output, self.norm(x[layout.last_index])).float()
