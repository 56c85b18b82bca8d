"""`python -m server.tools.bench_engine` (`make bench-engine`): a preset's MoE layer and decode
step, measured side by side.

1. Our expert kernels against transformers' own MoE block on the same weights (its eager and
   grouped_mm experts implementations), outputs compared; our time over its fastest.
2. A roofline that is a bound: each call's weights are cold (the layers are called in turn,
   more of them than the last-level cache holds), and bound = max(the active experts' bytes at
   the read bandwidth of a buffer 4x that cache, the FLOPs at the peak matmul rate: one
   expert's SwiGLU on PEAK_ROWS rows, its weights warm). A time under 1.0x of it means the
   bound is wrong; the bench says so.
3. The whole decode step at batch 1 (the real engine, every layer) against its memory bound:
   every weight byte the step reads, once, at the same read bandwidth.
4. bfloat16 against float32 on this machine: the layer's time and error (the server runs
   float32 on a CPU unless --dtype says otherwise).
5. Distinct experts a decode step activates under routing skew; LRU expert-cache hit rates.

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
from pathlib import Path

import torch

from records.cli import Parser
from server.engine.interface import SeqInput
from server.engine.kernels import KERNELS, grouped_mm_unsupported, swiglu
from server.engine.local import LocalEngine
from server.engine.model import Transformer
from server.engine.model_args import PRESETS
from server.engine.moe import MoELayer
from server.tools.bench_reference import IMPLEMENTATIONS, reference_block, reference_forward
from server.tools.bench_skew import (
    CACHE_REQUESTS,
    CACHE_STEPS,
    ROUTING_SAMPLES,
    bench_activated,
    bench_cache,
    step_context,
    variant,
)

TOKENS = (1, 16, 64, 256)
LLC_FALLBACK_BYTES = 32 * 2**20
TARGET_VS_REFERENCE = 1.0  # ours at most this multiple of transformers' fastest
TARGET_DECODE = 1.3  # the decode step within this multiple of its memory bound
PEAK_ROWS = 256  # rows of the matmul whose rate is the compute bound
DECODE_PROMPT = 16


def last_level_cache_bytes() -> int:
    """The CPU's largest cache, from sysfs; 32 MiB where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        unit = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * unit)
    return max(sizes, default=LLC_FALLBACK_BYTES)


def layers_for_cold(llc_bytes: int, bytes_per_call: int) -> int:
    """Layers to call in turn so the others read more than twice the cache between two calls
    of the same one."""
    return max(2, math.ceil(2 * llc_bytes / bytes_per_call) + 1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


class Turns:
    """Calls that each take the next of n layers, so every call finds its weights cold."""

    def __init__(self, n: int):
        self.n, self.i = n, 0

    def next(self) -> int:
        self.i = (self.i + 1) % self.n
        return self.i


def bench_layer(model: Transformer, kernels: list[str], references: list, repeats: int,
                gen: torch.Generator, read_bytes: int) -> list[dict]:
    """Per T, in the same rounds: our kernels and transformers' implementations on cold weights,
    the read bandwidth and the peak matmul rate. Outputs are compared on every layer first."""
    moes = [block.moe for block in model.layers]
    norm = model.layers[0].ffn_norm
    device = moes[0].experts.w2.device
    ours = {name: [variant(m, kernel=KERNELS[name], skew_bias=None) for m in moes]
            for name in kernels}
    turns = Turns(len(moes))
    buffer = torch.ones(read_bytes // 4, device=device)
    peak = torch.randn(PEAK_ROWS, moes[0].experts.w2.shape[1], generator=gen, device=device)
    rows = []
    for t in TOKENS:
        x = norm(torch.randn(t, moes[0].experts.w2.shape[1], generator=gen, device=device))
        fns: dict[str, Callable] = {}
        for name, layers in ours.items():
            for i, layer in enumerate(layers):
                out = layer(x, step_context(x))
                for ref in references:
                    expected = reference_forward(ref[i], "eager", x)
                    if not torch.allclose(out, expected, rtol=1e-5, atol=1e-5):
                        err = (out - expected).abs().max().item()
                        raise RuntimeError(f"T={t}: {name} differs from transformers by {err:.3g}")
            fns[name] = lambda x=x, layers=layers: layers[turns.next()](x, step_context(x))
        if references:
            for impl in IMPLEMENTATIONS:
                fns[f"hf_{impl}"] = (lambda x=x, impl=impl:
                                     reference_forward(references[0][turns.next()], impl, x))
        step = step_context(x)
        ours[kernels[0]][0](x, step)
        fns["matmul"] = lambda: swiglu(peak, *(w[0] for w in moes[0].experts.weights))
        fns["read"] = buffer.sum
        medians = side_by_side_ms(fns, repeats, device, {"matmul": fns["matmul"]})
        rows.append({"tokens": t, "active_experts": step.active[0],
                     "rows_per_expert": math.ceil(t * moes[0].top_k / step.active[0]),
                     **{f"{name}_ms": ms for name, ms in medians.items()}})
    return rows


def roofline(rows: list[dict], moe: MoELayer, expert_bytes: int, read_bytes: int,
             variants: list[str]) -> list[dict]:
    """Per T: the bound = max(A experts' weights at the read rate, the step's FLOPs at the peak
    matmul rate), each variant against it; the shared expert's weights and FLOPs where the
    layer has one."""
    _, d, i = moe.experts.w2.shape
    shared_i = moe.shared.w2.weight.shape[1] if moe.shared is not None else 0
    out = []
    for r in rows:
        read_gb_s = read_bytes / r["read_ms"] / 1e6
        matmul_gflop_s = 2 * 3 * d * i * PEAK_ROWS / r["matmul_ms"] / 1e6
        weight_bytes = r["active_experts"] * expert_bytes + 3 * d * shared_i * 4
        memory_ms = weight_bytes / read_gb_s / 1e6
        flops = 2 * 3 * d * (i * r["tokens"] * moe.top_k + shared_i * r["tokens"])
        compute_ms = flops / matmul_gflop_s / 1e6
        bound_ms = max(memory_ms, compute_ms)
        out.append({"tokens": r["tokens"], "read_gb_s": read_gb_s,
                    "matmul_gflop_s": matmul_gflop_s, "memory_bound_ms": memory_ms,
                    "compute_bound_ms": compute_ms, "bound_ms": bound_ms,
                    **{f"{v}_x_bound": r[f"{v}_ms"] / bound_ms for v in variants}})
    return out


def bench_decode(preset: str, threads: int, repeats: int, read_bytes: int) -> dict:
    """The real engine's decode step at batch 1, and its memory bound: every weight it reads
    (attention, norms, router, the experts it activated, the output projection, the token's
    embedding row, its KV cache) once at the read rate, measured in the same rounds."""
    engine = LocalEngine.from_preset(preset, kv_slots=1, device="cpu", dtype=torch.float32, seed=0)
    model, args = engine.model, engine.args
    experts = {id(p) for block in model.layers for p in block.moe.experts.parameters()}
    dense = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in experts)
    dense -= model.tok_embeddings.weight.numel() * 4 - args.dim * 4  # one embedding row is read
    token = engine.step([SeqInput(0, list(range(1, DECODE_PROMPT + 1)), 0)]).next_ids[0]
    position = DECODE_PROMPT
    buffer = torch.ones(read_bytes // 4)
    step_ms, read_ms, bound_bytes = [], [], []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        result = engine.step([SeqInput(0, [token], position)])
        step_ms.append((time.perf_counter_ns() - start) / 1e6)
        token, position = result.next_ids[0], position + 1
        kv = 2 * args.n_layers * position * args.kv_dim * 4
        bound_bytes.append(dense + sum(result.active) * engine.expert_bytes + kv)
        start = time.perf_counter_ns()
        buffer.sum()
        read_ms.append((time.perf_counter_ns() - start) / 1e6)
        if position >= args.max_seq_len - 1:  # the slot's context is full: decode over again
            position = DECODE_PROMPT
    read_gb_s = read_bytes / statistics.median(read_ms) / 1e6
    bound_ms = statistics.median(bound_bytes) / read_gb_s / 1e6
    step = statistics.median(step_ms)
    return {"preset": preset, "threads": threads, "step_ms": step, "read_gb_s": read_gb_s,
            "bytes_per_step": statistics.median(bound_bytes), "memory_bound_ms": bound_ms,
            "x_bound": step / bound_ms}


def bench_bfloat16(model: Transformer, repeats: int, gen: torch.Generator) -> list[dict]:
    """The sorted kernel's layer in float32 and in bfloat16 (the same weights, cast), cold, per
    T: times and the relative error of bfloat16's output."""
    moes = [variant(block.moe, kernel=KERNELS["sorted"], skew_bias=None)
            for block in model.layers]
    halves = [variant(block.moe, kernel=KERNELS["sorted"], skew_bias=None)
              for block in bf16_copy(model).layers]
    turns = Turns(len(moes))
    rows = []
    for t in TOKENS:
        x = model.layers[0].ffn_norm(torch.randn(t, model.args.dim, generator=gen))
        xb = x.to(torch.bfloat16)
        full, half = moes[0](x, step_context(x)), halves[0](xb, step_context(xb)).float()
        medians = side_by_side_ms(
            {"float32": lambda x=x: moes[turns.next()](x, step_context(x)),
             "bfloat16": lambda xb=xb: halves[turns.next()](xb, step_context(xb))},
            repeats, x.device)
        rows.append({"tokens": t, "float32_ms": medians["float32"],
                     "bfloat16_ms": medians["bfloat16"],
                     "relative_error": float((full - half).abs().max() / full.abs().max())})
    return rows


def bf16_copy(model: Transformer) -> Transformer:
    """The same model in bfloat16: its weights cast."""
    copy = Transformer(model.args, device=model.output.weight.device, dtype=torch.bfloat16)
    copy.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    return copy.eval()


def targets(layer: list[dict], roof: list[dict], decode: dict, kernels: list[str],
            references: bool) -> dict[str, bool]:
    """Whether each target holds; the bound's own check (no variant beats it) first."""
    out = {"bound_holds": all(v >= 1.0 for r in roof for k, v in r.items()
                              if k.endswith("_x_bound"))}
    if references:
        for r in layer:
            best = min(r[f"{k}_ms"] for k in kernels)
            fastest = min(r[f"hf_{impl}_ms"] for impl in IMPLEMENTATIONS)
            out[f"ours_within_{TARGET_VS_REFERENCE}x_transformers_T{r['tokens']}"] = (
                best <= TARGET_VS_REFERENCE * fastest)
    out[f"decode_within_{TARGET_DECODE}x_memory_bound"] = decode["x_bound"] <= TARGET_DECODE
    return out


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
                        for row in rows]
    widths = [max(len(row[c]) for row in cells) for c in range(len(header))]
    print(f"\n{title}")
    for row in cells:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def report(results: dict, kernels: list[str]) -> None:
    """The tables of what measure found."""
    references = results["machine"]["transformers"]
    layer, roof, decode, goals = (results[k] for k in ("layer", "roofline", "decode", "targets"))
    hf = [f"hf_{impl}" for impl in IMPLEMENTATIONS] if references else []
    variants = [*kernels, *hf]
    print_table("MoE layer forward, cold weights, median ms (hf_* = transformers' own block on "
                "the same weights, outputs equal to 1e-5; ours/hf = our best over its fastest)",
                ["T", "A", *(f"{v} ms" for v in variants), *(["ours/hf"] if references else [])],
                [[r["tokens"], r["active_experts"], *(r[f"{v}_ms"] for v in variants),
                  *([min(r[f"{k}_ms"] for k in kernels) / min(r[f"{h}_ms"] for h in hf)]
                    if references else [])] for r in layer])
    print_table(f"Roofline: bound = max(A x expert bytes / read rate, T k expert FLOPs / peak "
                f"matmul rate ({PEAK_ROWS} rows, warm)); under 1.00 the bound is wrong; m = "
                "rows per active expert",
                ["T", "A", "m", "read GB/s", "matmul GFLOP/s", "memory ms", "compute ms",
                 "bound ms", *(f"{v} x bound" for v in variants)],
                [[r["tokens"], r["active_experts"], r["rows_per_expert"], b["read_gb_s"],
                  b["matmul_gflop_s"], b["memory_bound_ms"], b["compute_bound_ms"],
                  b["bound_ms"], *(b[f"{v}_x_bound"] for v in variants)]
                 for r, b in zip(layer, roof, strict=True)])
    if not goals["bound_holds"]:
        print("the bound is wrong: a variant ran faster than it allows")
    print_table(f"Decode step at batch 1, the whole {decode['preset']} model (real engine)",
                ["step ms", "MB read", "read GB/s", "memory bound ms", "x bound"],
                [[decode["step_ms"], decode["bytes_per_step"] / 1e6, decode["read_gb_s"],
                  decode["memory_bound_ms"], decode["x_bound"]]])
    print_table("bfloat16 vs float32, sorted kernel, cold (the relative error grows where a "
                "token's routing flips)",
                ["T", "float32 ms", "bfloat16 ms", "bf16/fp32", "relative error"],
                [[r["tokens"], r["float32_ms"], r["bfloat16_ms"],
                  r["bfloat16_ms"] / r["float32_ms"], f"{r['relative_error']:.1e}"]
                 for r in results["bfloat16"]])
    print_table("Distinct experts per decode step "
                f"(mean of {ROUTING_SAMPLES} batches of B requests)",
                ["skew", "B", "mean A", "uniform E(1-(1-k/E)^B)"],
                [[r["skew"], r["batch"], r["mean_active"], r["uniform_expected"]]
                 for r in results["activated"]])
    print_table(f"LRU expert-cache hit rate ({CACHE_REQUESTS} requests, "
                f"{CACHE_STEPS} decode steps)",
                ["skew", "resident", "hits", "misses", "hit rate"],
                [[r["skew"], r["resident_experts"], r["hits"], r["misses"], r["hit_rate"]]
                 for r in results["cache"]])
    print("\nTargets (information, not asserted):")
    for name, ok in goals.items():
        print(f"  {name}: {'pass' if ok else 'FAIL'}")


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m server.tools.bench_engine",
                                description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", choices=list(PRESETS))
    p.add_argument("--repeats", type=int, default=60,
                   help="timed runs per variant; medians (default %(default)s)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="torch threads (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results, kernels = measure(args)
    report(results, kernels)
    if results["grouped_mm_skipped"]:
        print(f"grouped_mm skipped: {results['grouped_mm_skipped']}")
    print(json.dumps(results))


def measure(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Every table's rows, as one JSON-ready record, and the kernels timed."""
    device = torch.device("cpu")
    preset = PRESETS[args.preset]
    expert_bytes = 3 * preset.dim * preset.expert_dim * 4
    llc = last_level_cache_bytes()
    n_layers = layers_for_cold(llc, preset.top_k * expert_bytes)
    model = Transformer(dataclasses.replace(preset, n_layers=n_layers), seed=args.seed)
    model.init_random(args.seed)
    model.eval()
    gen = torch.Generator(device).manual_seed(args.seed)
    read_bytes = 4 * llc
    skipped = grouped_mm_unsupported((preset.expert_dim, preset.dim), device, torch.float32)
    kernels = ["sorted", "batched"] + ([] if skipped else ["grouped_mm"])
    moes = [block.moe for block in model.layers]
    blocks = [reference_block(m, preset.renormalize) for m in moes]
    references = [blocks] if all(b is not None for b in blocks) else []
    machine = {"torch": torch.__version__, "threads": args.threads, "device": str(device),
               "preset": args.preset, "dim": preset.dim, "experts": preset.n_experts,
               "top_k": preset.top_k, "expert_dim": preset.expert_dim,
               "shared_expert_dim": preset.shared_expert_dim, "expert_bytes": expert_bytes,
               "llc_bytes": llc, "layers_rotated": n_layers, "read_buffer_bytes": read_bytes,
               "repeats": args.repeats, "transformers": bool(references)}
    print("  ".join(f"{k} {v}" for k, v in machine.items()))
    with torch.inference_mode():
        layer = bench_layer(model, kernels, references, args.repeats, gen, read_bytes)
        decode = bench_decode(args.preset, args.threads, args.repeats, read_bytes)
        bf16 = bench_bfloat16(model, args.repeats, gen)
        norm = model.layers[0].ffn_norm
        activated = bench_activated(moes[0], norm, n_layers, gen, args.seed)
        cache = bench_cache(moes[0], norm, n_layers, gen, args.seed)
    hf = [f"hf_{impl}" for impl in IMPLEMENTATIONS] if references else []
    roof = roofline(layer, moes[0], expert_bytes, read_bytes, [*kernels, *hf])
    goals = targets(layer, roof, decode, kernels, bool(references))
    return {"machine": machine, "grouped_mm_skipped": skipped, "layer": layer, "roofline": roof,
            "decode": decode, "bfloat16": bf16, "activated": activated, "cache": cache,
            "targets": goals}, kernels


if __name__ == "__main__":
    main()
