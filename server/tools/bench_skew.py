"""`make bench-engine`'s routing under skew (server/tools/bench_engine.py): how many distinct
experts a decode batch of B fresh requests activates under each routing skew, against the
uniform expectation, and the LRU expert cache's hit rate over decode steps of the same
requests; and the layer variants both benches build."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import torch
from torch import Tensor

from server.engine.expert_cache import LayerCache
from server.engine.kernels import KERNELS
from server.engine.moe import MoELayer, StepContext
from server.engine.routers import Skew, request_key
from server.engine.stages import StageTimer

BATCHES = (1, 4, 16, 64)
SKEWS = ("uniform", "zipf:1.2", "affinity:0.1")
ROUTING_SAMPLES = 50  # random decode batches per (skew, B)
CACHE_REQUESTS = 8
CACHE_STEPS = 64


def step_context(x: Tensor, token_bias: Tensor | None = None) -> StepContext:
    """A decode step: each of x's tokens is its own sequence."""
    n = x.shape[0]
    return StepContext(groups=torch.arange(n, device=x.device), n_seqs=n,
                       timer=StageTimer(x.device), token_bias=token_bias)


def variant(moe: MoELayer, **parts) -> MoELayer:
    """A layer sharing moe's router and expert weights, built with some other parts (kernel,
    skew_bias, cache): each variant is complete when built, as the engine's layers are."""
    return MoELayer(moe.layer, moe.top_k, dataclasses.replace(moe.parts(), **parts), moe.n_experts)


def token_bias(skew: Skew, moe: MoELayer, n_layers: int, keys: list[int],
               seed: int) -> Tensor | None:
    """[B, L, E] affinity bias of requests with these keys, or None for layer-wide skews."""
    if skew.kind != "affinity":
        return None
    return torch.stack([skew.request_bias(n_layers, moe.n_experts, key, seed) for key in keys]).to(
        moe.experts.w2.device)


def skew_bias(skew: Skew, moe: MoELayer, seed: int) -> Tensor | None:
    bias = skew.layer_bias(moe.n_experts, moe.top_k, moe.layer, seed)
    return None if bias is None else bias.to(moe.experts.w2.device)


def bench_activated(moe: MoELayer, norm: Callable, n_layers: int, gen: torch.Generator,
                    seed: int) -> list[dict]:
    e, k, d = moe.n_experts, moe.top_k, moe.experts.w2.shape[1]
    rows = []
    for spec in SKEWS:
        skew = Skew.parse(spec)
        skewed = variant(moe, skew_bias=skew_bias(skew, moe, seed))
        for b in BATCHES:
            counts = []
            for s in range(ROUTING_SAMPLES):  # B fresh requests per batch
                keys = [request_key(f"activated-{b}-{s}-{i}", seed) for i in range(b)]
                x = norm(torch.randn(b, d, generator=gen, device=moe.experts.w2.device))
                bias = token_bias(skew, moe, n_layers, keys, seed)
                counts.append(len(torch.unique(skewed.route(x, step_context(x, bias))[1])))
            rows.append({"skew": spec, "batch": b, "mean_active": statistics.fmean(counts),
                         "uniform_expected": e * (1 - (1 - k / e) ** b)})
    return rows


def bench_cache(moe: MoELayer, norm: Callable, n_layers: int, gen: torch.Generator,
                seed: int) -> list[dict]:
    device = moe.experts.w2.device
    weights = tuple(w.detach() for w in moe.experts.weights)
    # as the engine does
    host = weights if device.type == "cpu" else tuple(w.cpu().pin_memory() for w in weights)
    # the same requests every step
    keys = [request_key(f"cache-{i}", seed) for i in range(CACHE_REQUESTS)]
    rows = []
    for spec in SKEWS:
        skew = Skew.parse(spec)
        bias = token_bias(skew, moe, n_layers, keys, seed)
        for capacity in (moe.n_experts // 4, moe.n_experts // 2):
            cache = LayerCache(host, capacity, device, "lru")
            cached = variant(moe, kernel=KERNELS["sorted"], skew_bias=skew_bias(skew, moe, seed),
                             cache=cache)
            # the real layer, so the cache sees the engine's visiting order
            for _ in range(CACHE_STEPS):
                x = norm(torch.randn(CACHE_REQUESTS, host[1].shape[1], generator=gen,
                                     device=device))
                cached(x, step_context(x, bias))
            cache.settle()
            c = cache.counters
            rows.append({"skew": spec, "resident_experts": capacity, "hits": c.hits,
                         "misses": c.misses, "hit_rate": c.hits / (c.hits + c.misses)})
    return rows
