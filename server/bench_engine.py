"""`python -m server.bench_engine`: one MoE layer of a preset, measured side by side in one run.

1. Our expert kernels against a HuggingFace-Mixtral-style masked per-expert loop, same output.
2. Distinct experts a decode step activates under routing skew, against the uniform expectation.
3. LRU expert-cache hit rates for a fixed set of running requests.
4. A roofline: each variant's time as a multiple of max(weight bytes / copy rate,
   FLOPs / matmul rate).

Prints tables, then one line of JSON with every number. Timings are information, never asserted.

Shape letters: T tokens, D model dim, E experts, I expert hidden dim, k experts per token,
A experts a step activates, m tokens per activated expert, B requests in a decode step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from server.expert_cache import LayerCache
from server.kernels import KERNELS, grouped_mm_unsupported, swiglu
from server.model import PRESETS, Transformer
from server.moe import MoELayer, StepContext
from server.routing import Skew, request_key
from server.stages import StageTimer

TOKENS = (1, 16, 64, 256)
BATCHES = (1, 4, 16, 64)
SKEWS = ("uniform", "zipf:1.2", "affinity:0.1")
ROUTING_SAMPLES = 50  # random decode batches per (skew, B)
CACHE_REQUESTS = 8
CACHE_STEPS = 64
COPY_BYTES = 256 * 2**20
# Written before each timed layer call: in a real step the other layers' weights have pushed this
# layer's out of the last-level cache (32 MiB on our CPUs, 50 MB of L2 on an H100/H200), and the
# two experts of a small-preset decode token (28 MB) would otherwise be read from it.
FLUSH_BYTES = 128 * 2**20
BOUND_TARGET = 1.5  # sorted within this multiple of the roofline at T = 1 and T = 256


def variant(moe: MoELayer, **parts) -> MoELayer:
    """A layer sharing moe's router and expert weights, built with some other parts (kernel,
    skew_bias, cache): each variant is complete when built, as the engine's layers are."""
    own = {"layer": moe.layer, "top_k": moe.top_k, "router": moe.router, "experts": moe.experts,
           "kernel": moe.kernel, "capacity_factor": moe.capacity_factor, "skew_bias": moe.skew_bias,
           "cache": moe.cache}
    return MoELayer(**(own | parts))


def hf_loop_forward(moe: MoELayer, x: Tensor) -> Tensor:
    """The baseline: HuggingFace MixtralSparseMoeBlock's masked loop over every expert, on our
    weights."""
    probs = F.softmax(moe.router.gate(x), dim=1, dtype=torch.float)  # [T, E]
    weights, selected = torch.topk(probs, moe.top_k, dim=-1)  # [T, k]
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    expert_mask = F.one_hot(selected, num_classes=moe.n_experts).permute(2, 1, 0)  # [E, k, T]
    for e in range(moe.n_experts):  # empty experts included, as HF does
        idx, top_x = torch.where(expert_mask[e])
        h = x[top_x]
        w13, w2 = (w[e] for w in moe.experts.weights)
        gate, up = F.linear(h, w13).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2)
        out.index_add_(0, top_x, y * weights[top_x, idx, None])
    return out


def step_context(x: Tensor, token_bias: Tensor | None = None) -> StepContext:
    """A decode step: each of x's tokens is its own sequence."""
    n = x.shape[0]
    return StepContext(groups=torch.arange(n, device=x.device), n_seqs=n,
                       timer=StageTimer(x.device), token_bias=token_bias)


def layer_forward(moe: MoELayer, x: Tensor) -> tuple[Tensor, StepContext]:
    """One forward of the real layer, and the step context it reported into."""
    step = step_context(x)
    return moe(x, step), step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def side_by_side_ms(fns: dict[str, Callable], repeats: int, device: torch.device,
                    before: dict[str, Callable] | None = None) -> dict[str, float]:
    """Median ms of each fn. Every repeat runs all of them in a rotated order, so the machine's
    noise and any order effect fall on each alike; before[name] runs untimed just before
    fns[name]."""
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():
        fn()  # warm-up: first-call allocations and dispatch
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if before and name in before:
                before[name]()
            sync(device)
            start = time.perf_counter_ns()
            fns[name]()
            sync(device)
            samples[name].append((time.perf_counter_ns() - start) / 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_layer(moe: MoELayer, norm: Callable, repeats: int, gen: torch.Generator,
                kernels: list[str]) -> list[dict]:
    """Per T: the loop and each kernel on cold weights, plus the roofline's two rates, all in the
    same rounds, so the bound is measured under the same noise as what it bounds."""
    device = moe.experts.w2.device
    # HF routes without skew
    layers = {name: variant(moe, kernel=KERNELS[name], skew_bias=None) for name in kernels}
    flush = torch.empty(FLUSH_BYTES // 4, device=device)
    src = torch.ones(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    rows = []
    for t in TOKENS:
        x = norm(torch.randn(t, moe.experts.w2.shape[1], generator=gen, device=device))
        expected = hf_loop_forward(moe, x)
        fns = {"loop": lambda x=x: hf_loop_forward(moe, x)}
        for name in kernels:
            out, step = layer_forward(layers[name], x)
            if not torch.allclose(out, expected, rtol=1e-4, atol=1e-4):
                err = (out - expected).abs().max().item()
                raise RuntimeError(f"T={t}: {name} differs from the loop by up to {err:.3g}")
            fns[name] = lambda x=x, layer=layers[name]: layer_forward(layer, x)
        before = dict.fromkeys(fns, flush.zero_)
        a = step.active[0]
        h = torch.randn(math.ceil(t * moe.top_k / a), x.shape[1], generator=gen, device=device)
        # Run once untimed first, so its weights are warm: the rate of the arithmetic, not of
        # memory.
        fns["matmul"] = lambda h=h: swiglu(h, *(w[0] for w in moe.experts.weights))
        before["matmul"] = fns["matmul"]
        fns["copy"] = lambda: dst.copy_(src)
        medians = side_by_side_ms(fns, repeats, device, before)
        rows.append({"tokens": t, "active_experts": a, "rows_per_expert": h.shape[0],
                     **{f"{name}_ms": ms for name, ms in medians.items()}})
    return rows


def token_bias(skew: Skew, moe: MoELayer, n_layers: int, keys: list[int],
               seed: int) -> Tensor | None:
    """[B, L, E] affinity bias of requests with these keys, or None for layer-wide skews."""
    if skew.kind != "affinity":
        return None
    return torch.stack([skew.request_bias(n_layers, moe.n_experts, key, seed) for key in keys]).to(
        moe.experts.w2.device)


def routed_experts(moe: MoELayer, x: Tensor, bias: Tensor | None) -> list[int]:
    """The experts a step activates."""
    return torch.unique(moe.route(x, step_context(x, bias))[1]).tolist()


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
                counts.append(len(routed_experts(skewed, x, bias)))
            rows.append({"skew": spec, "batch": b, "mean_active": statistics.fmean(counts),
                         "uniform_expected": e * (1 - (1 - k / e) ** b)})
    return rows


def skew_bias(skew: Skew, moe: MoELayer, seed: int) -> Tensor | None:
    bias = skew.layer_bias(moe.n_experts, moe.top_k, moe.layer, seed)
    return None if bias is None else bias.to(moe.experts.w2.device)


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


def roofline(rows: list[dict], moe: MoELayer, expert_bytes: int, variants: list[str]) -> list[dict]:
    """Per T: the bound = max(A experts' weights at the copy rate, the step's FLOPs at the rate of
    one expert's SwiGLU on m = ceil(T k / A) rows with its weights warm), and each variant against
    it. The copy rate counts the bytes copied, not read + written."""
    _, d, i = moe.experts.w2.shape
    out = []
    for r in rows:
        copy_gb_s = COPY_BYTES / r["copy_ms"] / 1e6
        matmul_gflop_s = 2 * 3 * d * i * r["rows_per_expert"] / r["matmul_ms"] / 1e6
        memory_ms = r["active_experts"] * expert_bytes / copy_gb_s / 1e6
        compute_ms = 2 * 3 * d * i * r["tokens"] * moe.top_k / matmul_gflop_s / 1e6
        bound_ms = max(memory_ms, compute_ms)
        out.append({"tokens": r["tokens"], "copy_gb_s": copy_gb_s,
                    "matmul_gflop_s": matmul_gflop_s, "memory_bound_ms": memory_ms,
                    "compute_bound_ms": compute_ms, "bound_ms": bound_ms,
                    **{f"{v}_x_bound": r[f"{v}_ms"] / bound_ms for v in variants}})
    return out


def targets(layer_rows: list[dict], roof_rows: list[dict]) -> dict[str, bool]:
    within = {r["tokens"]: r["sorted_x_bound"] <= BOUND_TARGET for r in roof_rows
              if r["tokens"] in (1, 256)}
    return {"sorted_not_slower_than_loop": all(r["sorted_ms"] <= r["loop_ms"] for r in layer_rows),
            **{f"sorted_within_{BOUND_TARGET}x_bound_T{t}": ok for t, ok in within.items()}}


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
                        for row in rows]
    widths = [max(len(row[c]) for row in cells) for c in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m server.bench_engine",
                                description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--repeats", type=int, default=100,
                   help="timed runs per variant; medians (default %(default)s)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="torch threads (default %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # Only layer 0 is measured: one layer keeps the model's shapes without the other layers' memory.
    margs = dataclasses.replace(PRESETS[args.preset], n_layers=1)
    model = Transformer(margs, seed=args.seed, device=device, dtype=torch.float32)
    model.init_random(args.seed)
    moe, norm = model.layers[0].moe, model.layers[0].ffn_norm
    gen = torch.Generator(device).manual_seed(args.seed)

    skipped = grouped_mm_unsupported((margs.expert_dim, margs.dim), device, torch.float32)
    kernels = ["sorted"] if skipped else ["sorted", "grouped_mm"]
    variants = ["loop", *kernels]
    expert_bytes = 3 * margs.dim * margs.expert_dim * moe.experts.w2.element_size()
    machine = {"torch": torch.__version__, "threads": args.threads, "device": str(device),
               "dtype": "float32", "preset": args.preset, "dim": margs.dim,
               "experts": margs.n_experts, "top_k": margs.top_k, "expert_dim": margs.expert_dim,
               "expert_bytes": expert_bytes, "repeats": args.repeats}
    print("  ".join(f"{k} {v}" for k, v in machine.items()))

    with torch.inference_mode():
        layer = bench_layer(moe, norm, args.repeats, gen, kernels)
        activated = bench_activated(moe, norm, margs.n_layers, gen, args.seed)
        cache = bench_cache(moe, norm, margs.n_layers, gen, args.seed)
    roof = roofline(layer, moe, expert_bytes, variants)
    goals = targets(layer, roof)

    print_table("MoE layer forward, cold weights, median ms (loop = HF Mixtral masked "
                "per-expert loop; outputs equal to 1e-4)",
                ["T", "A", *(f"{v} ms" for v in variants), *(f"loop/{k}" for k in kernels)],
                [[r["tokens"], r["active_experts"], *(r[f"{v}_ms"] for v in variants),
                  *(r["loop_ms"] / r[f"{k}_ms"] for k in kernels)] for r in layer])
    if skipped:
        print(f"grouped_mm skipped: {skipped}")
    print_table("Roofline: bound = max(A x expert bytes / copy rate, "
                "T k expert FLOPs / matmul rate on m rows)",
                ["T", "A", "m", "copy GB/s", "matmul GFLOP/s", "memory ms", "compute ms",
                 "bound ms", *(f"{v} x bound" for v in variants)],
                [[r["tokens"], r["active_experts"], r["rows_per_expert"], b["copy_gb_s"],
                  b["matmul_gflop_s"], b["memory_bound_ms"], b["compute_bound_ms"], b["bound_ms"],
                  *(b[f"{v}_x_bound"] for v in variants)]
                 for r, b in zip(layer, roof, strict=True)])
    print_table("Distinct experts per decode step "
                f"(mean of {ROUTING_SAMPLES} batches of B requests)",
                ["skew", "B", "mean A", "uniform E(1-(1-k/E)^B)"],
                [[r["skew"], r["batch"], r["mean_active"], r["uniform_expected"]]
                 for r in activated])
    print_table(f"LRU expert-cache hit rate ({CACHE_REQUESTS} requests, "
                f"{CACHE_STEPS} decode steps)",
                ["skew", "resident", "hits", "misses", "hit rate"],
                [[r["skew"], r["resident_experts"], r["hits"], r["misses"], r["hit_rate"]]
                 for r in cache])
    print("\nTargets (information, not asserted):")
    for name, ok in goals.items():
        print(f"  {name}: {'pass' if ok else 'FAIL'}")
    print(json.dumps({"machine": machine, "grouped_mm_skipped": skipped, "layer": layer,
                      "roofline": roof, "activated": activated, "cache": cache, "targets": goals}))


if __name__ == "__main__":
    main()
