"""Routers and routing skew: which k experts each token goes to, and with what weight.

A router is an nn.Module built once per MoE layer as `Router(args, layer, seed, device,
dtype, **options)`, the options being the router settings its constructor names
(`noise_scale`, `renormalize`; args.renormalize is already the setting where it is given); its
forward takes the layer's input [N, D], a logit bias ([E] or [N, E], from the skew) and the
index of each token's sequence in the step [N], and returns (weights [N, k] fp32, experts
[N, k] long) with k distinct experts per token. Custom routers load by dotted path
(`--router mypkg.mod:MyRouter`) against that interface.

Ties between equal scores go to the lower expert id: selection uses a stable descending
sort, not topk, whose tie order is unspecified.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import importlib
import inspect
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from server.engine.model_args import ModelArgs

AFFINITY_FLOOR = 1e-6  # smallest preference an affinity bias expresses (log: about -14)


def top_k_distinct(scores: Tensor, k: int) -> Tensor:
    """Expert ids [N, k] of the k highest scores per row, ties to the lower id."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


class TopKRouter(nn.Module):
    """Softmax over a linear gate in fp32, top-k, renormalised over the chosen k or not
    (args.renormalize: Mixtral does, Qwen1.5-MoE does not; the preset decides unless
    --[no-]renormalize, which the model resolves into the args its routers get)."""

    def __init__(self, args: ModelArgs, layer: int, seed: int, device, dtype):
        super().__init__()
        self.top_k = args.top_k
        self.renormalize = args.renormalize
        self.gate = nn.Linear(args.dim, args.n_experts, bias=False, device=device, dtype=dtype)

    def scores(self, x: Tensor) -> Tensor:
        return self.gate(x).float()

    def forward(self, x: Tensor, bias: Tensor | None, groups: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.scores(x)
        if bias is not None:
            logits = logits + bias
        probs = torch.softmax(logits, dim=-1)  # [N, E]
        experts = top_k_distinct(probs, self.top_k)
        weights = probs.gather(1, experts)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts


class NoisyTopKRouter(TopKRouter):
    """Shazeer et al. 2017: gate logits plus Gaussian noise whose per-expert scale is a
    learned softplus(x W_noise), times --noise-scale. Seeded per layer."""

    def __init__(self, args: ModelArgs, layer: int, seed: int, device, dtype,
                 noise_scale: float = 1.0):
        super().__init__(args, layer, seed, device, dtype)
        self.noise_scale = noise_scale
        self.w_noise = nn.Linear(args.dim, args.n_experts, bias=False, device=device, dtype=dtype)
        self.generator = torch.Generator(device=device).manual_seed(seed * 1_000 + layer)

    def scores(self, x: Tensor) -> Tensor:
        logits = self.gate(x).float()
        noise = torch.randn(logits.shape, generator=self.generator, device=logits.device)
        return logits + noise * F.softplus(self.w_noise(x).float()) * self.noise_scale


class BalancedRouter(TopKRouter):
    """The seed's least-loaded dispatcher (3.2). Each sequence's tokens in a step form a
    group; groups in step order go to the k experts with the least load, taken from a heap,
    and the group's size is added to each chosen expert's load. Load counts the tokens
    dispatched to an expert in this layer in the current step: it starts at zero every step,
    so each step is balanced on its own. Among equally loaded experts the group's mean gate
    score decides, then the lower id. Weights are the softmax over the chosen experts."""

    def forward(self, x: Tensor, bias: Tensor | None, groups: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.scores(x)
        if bias is not None:
            logits = logits + bias
        # Per group, its size and summed scores, read in one host transfer. Groups are 0..B-1
        # and B <= N, so N rows hold them all without reading B first; rows past B stay empty
        # and are dropped on the host before becoming Python numbers (a prefill's N is large).
        n = logits.shape[0]
        ones = torch.ones(n, 1, device=logits.device)
        sums = torch.zeros(n, 1 + logits.shape[1], device=logits.device).index_add_(
            0, groups, torch.cat([ones, logits], dim=1)).cpu()
        rows = sums[sums[:, 0] > 0].tolist()
        loads = [0] * logits.shape[1]
        chosen = []
        # per sequence, not per token
        for size, *total in rows:
            score = [t / size for t in total]
            candidates = [(load, -s, e)
                          for e, (load, s) in enumerate(zip(loads, score, strict=True))]
            picks = [e for _, _, e in heapq.nsmallest(self.top_k, candidates)]
            for e in picks:
                loads[e] += int(size)
            chosen.append(picks)
        experts = torch.tensor(chosen, dtype=torch.long,
                               device=logits.device).reshape(-1, self.top_k)[groups]
        weights = torch.softmax(logits.gather(1, experts), dim=-1)
        return weights, experts


ROUTERS = {"topk": TopKRouter, "noisy_topk": NoisyTopKRouter, "balanced": BalancedRouter}


def router_options(router: type[nn.Module], offered: dict) -> dict:
    """The offered settings (None = not set) that the router's constructor takes by name: a
    router sees only the settings it declares, or all of them with **kwargs. So a new router
    setting is a declaration in records/server_settings/ and a parameter of its router."""
    params = inspect.signature(router).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in offered.items() if v is not None and (takes_any or k in params)}


def router_class(name: str) -> type[nn.Module]:
    """A built-in router by name, or a custom one as 'package.module:ClassName'."""
    if name in ROUTERS:
        return ROUTERS[name]
    module_name, _, class_name = name.partition(":")
    if not class_name:
        raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTERS)} "
                         "or give module:Class")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load router {name!r}: {exc}") from None


@dataclass(frozen=True)
class Skew:
    """Routing skew applied as a logit bias on top of any router, so routing stays
    input-dependent: 'uniform', 'zipf:S', 'hot:F' or 'affinity:ALPHA'."""

    kind: str = "uniform"
    value: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> Skew:
        kind, _, value = spec.partition(":")
        if kind == "uniform" and not value:
            return cls()
        if kind not in ("zipf", "hot", "affinity") or not value:
            raise ValueError(f"unknown skew {spec!r}; use uniform, zipf:S, hot:F or affinity:ALPHA")
        try:
            v = float(value)
        except ValueError:
            raise ValueError(f"skew {spec!r}: {value!r} is not a number") from None
        if kind == "zipf" and not v >= 0:
            raise ValueError(f"skew {spec!r}: zipf exponent must be >= 0")
        if kind == "hot" and not 0 < v < 1:
            raise ValueError(f"skew {spec!r}: the hot fraction must be in (0, 1)")
        if kind == "affinity" and not v > 0:
            raise ValueError(f"skew {spec!r}: affinity alpha must be > 0")
        return cls(kind, v)

    def layer_bias(self, n_experts: int, top_k: int, layer: int, seed: int) -> Tensor | None:
        """Bias [E] shared by all tokens of a layer (zipf, hot), or None."""
        perm = layer_permutation(n_experts, layer, seed)
        if self.kind == "zipf":
            popularity = torch.arange(1, n_experts + 1, dtype=torch.float64) ** -self.value
            return torch.log(popularity / popularity.sum())[perm.argsort()].float()
        if self.kind == "hot":
            if self.value > 1 / top_k:
                raise ValueError(f"skew hot:{self.value:g}: one expert can hold at most "
                                 f"1/k = {1 / top_k:.3g} of the slots "
                                 "(it is chosen at most once per token)")
            bias = torch.zeros(n_experts)
            bias[perm[0]] = hot_bias(self.value, n_experts, top_k)
            return bias
        return None

    def request_bias(self, n_layers: int, n_experts: int, key: int, seed: int) -> Tensor | None:
        """Bias [L, E] of one request (affinity): the log of one Dirichlet(alpha) preference
        drawn from the request's key, laid out in each layer through that layer's expert
        permutation (the model's, shared by all requests). So a request keeps its experts from
        step to step, and requests that share a favourite in one layer share it in every layer,
        as tokens of one domain do in trained MoE models."""
        if self.kind != "affinity":
            return None
        rng = np.random.default_rng(key)
        preference = torch.from_numpy(rng.dirichlet([self.value] * n_experts))
        bias = torch.log(preference.clamp(min=AFFINITY_FLOOR)).float()
        return bias[inverse_permutations(n_layers, n_experts, seed)]


@functools.lru_cache(maxsize=16)
def inverse_permutations(n_layers: int, n_experts: int, seed: int) -> Tensor:
    """[L, E]: row l is the inverse of layer l's permutation; the same for every request, so
    it is built once rather than for each request's affinity bias."""
    return torch.stack([layer_permutation(n_experts, layer, seed).argsort()
                        for layer in range(n_layers)])


def layer_permutation(n_experts: int, layer: int, seed: int) -> Tensor:
    """Which expert of a layer plays popularity rank (or preference) i: seeded per layer."""
    return torch.randperm(n_experts, generator=torch.Generator().manual_seed(seed * 1_000 + layer))


@functools.lru_cache(maxsize=64)
def hot_bias(fraction: float, n_experts: int, top_k: int, samples: int = 8192) -> float:
    """The logit bias that gives one expert `fraction` of the routed slots when router
    logits have unit variance (as this model's gates do), found by bisection on a seeded
    simulation. The share actually measured is in GetStats."""
    z = torch.randn(samples, n_experts, generator=torch.Generator().manual_seed(0))
    lo, hi = -20.0, 20.0
    for _ in range(40):
        mid = (lo + hi) / 2
        shifted = z.clone()
        shifted[:, 0] += mid
        share = (top_k_distinct(shifted, top_k) == 0).sum().item() / (samples * top_k)
        lo, hi = (mid, hi) if share < fraction else (lo, mid)
    return (lo + hi) / 2


def request_key(request_id: str, seed: int) -> int:
    """A stable, well-mixed 63-bit key for a request's affinity draw."""
    digest = hashlib.blake2b(f"{request_id}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1

