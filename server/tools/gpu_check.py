"""`python -m server.tools.gpu_check` (`make gpu-check`): the GPU path in one short run, on a
machine with a stock CUDA PyTorch and nothing else from the network; on a machine without CUDA the
parts that can run on the CPU run there, and the rest say they were skipped.

1. The build: torch, its CUDA, the device and its compute capability.
2. Host transfers per engine step (`small`, 8 sequences decoding), per kernel, counted by the
   engine (server/engine/host_transfer.py) and, on CUDA, by `torch.cuda.set_sync_debug_mode`: either
   count over the budget fails the check.
3. The MoE kernels in bfloat16: grouped_mm's probe (server/engine/kernels.py), then sorted, batched
   and grouped_mm timed side by side on the same routed tokens: a 32-sequence decode of
   Mixtral's and of Qwen-MoE's layer (where sorted is launch-bound) and a 256-token one.
4. A prefill step of new prompts (batched and padded), then one resuming a prompt after its
   cached prefix (a masked chunk), with attention held to the fused kernels (flash, memory
   efficient, cuDNN; CUDA only).
5. `mixtral-8x7b` with the default KV pool (32 sequences): build time and memory; a
   32-sequence decode step and an 8 x 4096-token prefill (CUDA only).
6. The tests marked gpu (tests/test_gpu.py), where pytest is installed.

Prints a table, then one line of JSON. Exits 1 when a part that ran failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from records.cli import Parser
from records.server_settings import MoE
from server.engine.host_transfer import cuda_waits
from server.engine.interface import SeqInput
from server.engine.kernels import BATCHED_MAX_ROWS, KERNELS, grouped_mm_unsupported, median_ms
from server.engine.local import LocalEngine, indexed
from server.engine.model_args import PRESETS
from server.settings import device_problem

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
WARM_UPS = 3  # untimed calls before each timing


def build(device: torch.device) -> dict:
    out = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
           "cuda_available": torch.cuda.is_available()}
    if device.type == "cuda":
        out |= {"device": torch.cuda.get_device_name(device),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(device)))}
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_seqs(engine: LocalEngine, batch: int, prompt: int) -> list[SeqInput]:
    """batch sequences prefilled with prompt tokens; their next decode step's inputs."""
    engine.step([SeqInput(i, [1 + i % 7] * prompt, 0) for i in range(batch)])
    return [SeqInput(i, [2], prompt) for i in range(batch)]


def host_transfers(device: torch.device, dtype: torch.dtype) -> dict:
    """Per kernel, eager (graphs off), and with decode graphs: the reads a decode step counts,
    its budget, and on CUDA the waits sync debug mode saw, with where each happened."""
    out = {}
    for kernel in ("sorted", "batched", "grouped_mm", "graphs"):
        engine = LocalEngine.from_preset(
            "small", 8, str(device), dtype, 0,
            moe=MoE(moe_kernel="auto" if kernel == "graphs" else kernel),
            graphs="auto" if kernel == "graphs" else "off")
        if kernel == "graphs" and engine.graphs is None:
            out[kernel] = {"skipped": "no decode graphs here (the log says why)"}
            continue
        if kernel != "graphs" and engine.kernel_name != kernel:
            out[kernel] = {"skipped": f"{kernel} fell back to {engine.kernel_name}"}
            continue
        seqs = decode_seqs(engine, 8, 16)
        sync(device)
        result, waits = cuda_waits(partial(engine.step, seqs)) if device.type == "cuda" \
            else (engine.step(seqs), None)
        out[kernel] = {"counted": result.host_transfers,
                       "budget": 1 + (kernel in ("sorted", "batched")) * PRESETS["small"].n_layers,
                       "cuda_syncs": None if waits is None else len(waits),
                       "waited_at": waits}
    return out


def kernels(device: torch.device, cases: list[tuple[str, int]], repeats: int) -> dict:
    """Per (preset, tokens): one layer's experts in bfloat16 on uniformly routed tokens."""
    return {f"{preset} x{tokens}": kernel_times(device, PRESETS[preset], tokens, repeats)
            for preset, tokens in cases}


def kernel_times(device: torch.device, args, tokens: int, repeats: int) -> dict:
    dtype = torch.bfloat16
    reason = grouped_mm_unsupported((args.expert_dim, args.dim), device, dtype)
    gen = torch.Generator().manual_seed(0)
    e, i, d = args.n_experts, args.expert_dim, args.dim
    w13 = (torch.randn(e, 2 * i, d, generator=gen) / d ** 0.5).to(device, dtype)
    w2 = (torch.randn(e, d, i, generator=gen) / i ** 0.5).to(device, dtype)
    pairs = tokens * args.top_k
    counts = torch.bincount(torch.randint(0, e, (pairs,), generator=gen), minlength=e).tolist()
    xs = torch.randn(pairs, d, generator=gen).to(device, dtype)
    used = sum(1 for n in counts if n)
    out = {"experts_used": used, "most_rows": max(counts),
           "batched_pads": max(counts) <= BATCHED_MAX_ROWS and 2 * used >= e,
           "grouped_mm_probe": reason or "passed"}
    for name in ("sorted", "batched"):
        out[f"{name}_ms"] = median_ms(lambda k=KERNELS[name]: k(xs, counts, range(e), w13, w2),
                                      device, repeats, WARM_UPS)
    out["batched_over_sorted"] = out["batched_ms"] / out["sorted_ms"]
    if reason is None:
        on_device = torch.tensor(counts, dtype=torch.int32, device=device)
        out["grouped_mm_ms"] = median_ms(
            lambda: KERNELS["grouped_mm"](xs, on_device, range(e), w13, w2), device, repeats,
            WARM_UPS)
        out["grouped_over_sorted"] = out["grouped_mm_ms"] / out["sorted_ms"]
    return out


def fused_attention(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"skipped": "CUDA only"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    engine = LocalEngine.from_preset("small", 8, str(device), torch.bfloat16, 0)
    steps = {  # decode's [B, H, 1, S] scores are small and may take any kernel
        "new_prompts": [SeqInput(i, [1 + i] * (64 + 16 * i), 0) for i in range(4)],
        "resumed_prompt": [SeqInput(0, [7] * 48, 64)],  # prompt 0 goes on after its 64 tokens
    }
    out = {}
    for name, seqs in steps.items():
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                              SDPBackend.CUDNN_ATTENTION]):
                engine.step(seqs)
            out[name] = "ok"
        except RuntimeError as exc:
            out[name] = str(exc).splitlines()[0]
    return {"ok": all(v == "ok" for v in out.values()), **out}


def mixtral(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"skipped": "CUDA only (about 94 GB in bfloat16)"}
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        engine = LocalEngine.from_preset("mixtral-8x7b", 32, str(device), torch.bfloat16, 0)
    except RuntimeError as exc:
        return {"ok": False, "error": f"build: {str(exc).splitlines()[0]}"}
    sync(device)
    out = {"init_s": time.perf_counter() - start,
           "allocated_gb": torch.cuda.memory_allocated(device) / GB,
           "reserved_gb": torch.cuda.memory_reserved(device) / GB}
    try:
        seqs = decode_seqs(engine, 32, 128)
        out["decode_32_ms"] = median_ms(lambda: engine.step(seqs), device, 5, WARM_UPS)
    except RuntimeError as exc:
        out |= {"ok": False, "error": f"decode: {str(exc).splitlines()[0]}"}
        return out
    try:
        prompts = [SeqInput(i, [3] * 4096, 0) for i in range(8)]
        sync(device)
        start = time.perf_counter()
        engine.step(prompts)
        sync(device)
        out["prefill_8x4096_ms"] = (time.perf_counter() - start) * 1000
    except RuntimeError as exc:
        out |= {"ok": False, "error": f"prefill: {str(exc).splitlines()[0]}"}
        return out
    out |= {"ok": True, "peak_gb": torch.cuda.max_memory_allocated(device) / GB}
    return out


def gpu_tests() -> dict:
    try:
        import pytest  # noqa: F401
    except ImportError:
        return {"skipped": "pytest is not installed"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu",
                           "tests/test_gpu.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    return {"ok": done.returncode in (0, 5), "summary": done.stdout.strip().splitlines()[-1]}


def failed(results: dict) -> list[str]:
    """The parts that ran and did not do what they should."""
    bad = [name for name, part in results.items()
           if isinstance(part, dict) and part.get("ok") is False]
    for kernel, part in results["host_transfers"].items():
        if "counted" in part and max(part["counted"], part["cuda_syncs"] or 0) > part["budget"]:
            bad.append(f"host_transfers.{kernel}")
    return bad


def render(results: dict) -> str:
    """One row per value, named by its path through the nested parts."""
    rows = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, v in value.items():
                walk(f"{prefix}.{key}" if prefix else key, v)
        elif prefix.count("."):  # a part's values, not the top level's list of failures
            rows.append((prefix, f"{value:.3g}" if isinstance(value, float) else
                         json.dumps(value) if isinstance(value, list) else str(value)))

    walk("", results)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {text}" for name, text in rows)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m server.tools.gpu_check",
                                description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run (default: cuda where there is one, else cpu)")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per kernel")
    args = p.parse_args(argv)
    if problem := device_problem(args.device):
        p.error(f"--device: {problem} (torch {torch.__version__}"
                + (", a CPU build)" if torch.version.cuda is None else ")"))
    device = indexed(torch.device(args.device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cases = [("mixtral-8x7b", 32), ("qwen1.5-moe-a2.7b", 32), ("mixtral-8x7b", 256)] \
        if device.type == "cuda" else [("small", 32), ("fine", 8)]
    results = {"build": build(device), "host_transfers": host_transfers(device, dtype),
               "kernels": kernels(device, cases, args.repeats),
               "fused_attention": fused_attention(device), "mixtral": mixtral(device),
               "gpu_tests": gpu_tests() if device.type == "cuda" else {"skipped": "CUDA only"}}
    results["failed"] = failed(results)
    print(render(results))
    print(json.dumps(results))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
