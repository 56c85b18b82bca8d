"""Expert kernels: each expert's SwiGLU over its tokens, the tokens already sorted by expert.

Every kernel takes (xs [M, D] sorted by group, counts: tokens per group (host ints),
index: the weight row of each group, w13 [S, 2I, D] (gate then up projection, fused as
transformers keeps them, so one matmul computes both), w2 [S, D, I]) and returns ys [M, D] in
the same order. A group is one expert; S is the number of experts, or of resident slots when
the expert cache is on.

Which is fastest depends on the shapes and the GPU (on an H200 sorted beat grouped_mm on
Mixtral's layer at 32 tokens, and lost to it by 9x on Qwen-MoE's), so `auto` on CUDA times them
at start-up and keeps a `KernelTable`: the fastest per call size.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from server.engine.host_transfer import to_device

log = logging.getLogger(__name__)


Kernel = Callable[[Tensor, Sequence[int], Sequence[int], Tensor, Tensor], Tensor]


SPLIT_MAX_ROWS = 64  # up to this many rows, a CPU matmul is split over blocks of weight rows
SPLIT_MIN_BLOCK = 128  # ... of at least this many rows each


def linear(h: Tensor, w: Tensor) -> Tensor:
    """h @ w.T for h [M, K], w [N, K]. On a CPU with several threads and few rows (a decode
    step's tokens per expert), as a batched matmul over blocks of w's rows: the BLAS runs such
    a skinny product on one thread, while torch spreads a batched matmul's blocks over all of
    them (docs/measured.md: 1.7-1.9x faster at 1-4 rows on 2 threads, even at 64)."""
    blocks = _blocks(h, w)
    if blocks == 1:
        return h @ w.T
    (m, k), n = h.shape, w.shape[0]
    parts = torch.bmm(h.expand(blocks, m, k), w.view(blocks, n // blocks, k).transpose(1, 2))
    return parts.transpose(0, 1).reshape(m, n)


def _blocks(h: Tensor, w: Tensor) -> int:
    threads = torch.get_num_threads()
    if h.device.type != "cpu" or threads == 1 or h.shape[0] > SPLIT_MAX_ROWS \
            or not w.is_contiguous():
        return 1
    blocks = 2 * threads
    while blocks > 1 and (w.shape[0] % blocks or w.shape[0] // blocks < SPLIT_MIN_BLOCK):
        blocks //= 2
    return blocks


def project(layer: torch.nn.Linear, x: Tensor) -> Tensor:
    """layer(x), its matmul through `linear`."""
    y = linear(x, layer.weight)
    return y if layer.bias is None else y + layer.bias


def gated(gate_up: Tensor) -> Tensor:
    """SwiGLU's middle: silu(gate) * up, from the fused projection's output [M, 2I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu(h: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    return linear(gated(linear(h, w13)), w2)


def sorted_experts(xs: Tensor, counts: Sequence[int], index: Sequence[int], w13: Tensor,
                   w2: Tensor) -> Tensor:
    """One matmul chain per non-empty group over its contiguous slice."""
    ys = torch.empty_like(xs)
    start = 0
    for n, row in zip(counts, index, strict=True):
        if n:
            ys[start:start + n] = swiglu(xs[start:start + n], w13[row], w2[row])
        start += n
    return ys


BATCHED_MAX_ROWS = 64  # up to this many tokens per expert, a padded batched matmul (see below)


def batched_experts(xs: Tensor, counts: Sequence[int], index: Sequence[int], w13: Tensor,
                    w2: Tensor) -> Tensor:
    """Every expert at once: each group's rows copied into a zero-padded [S, most rows, D]
    batch, then one batched matmul chain over all S weight rows: eight kernel launches on a GPU
    per layer, whatever the routing, where `sorted` makes five per non-empty group (about 250
    in a layer of a 32-sequence Qwen-MoE decode step). It pays in padding rows and in reading
    every expert's weights, so it runs only where that is cheap on a GPU: at most
    BATCHED_MAX_ROWS rows in any group (a matmul that thin is bound by reading the weights,
    whatever its rows) and at least half the experts in use. Elsewhere, and where the groups
    are not every weight row in order (the expert cache's single slots), it is the sorted
    kernel. On a CPU padding rows are real work (docs/measured.md)."""
    s, (m, d) = w13.shape[0], xs.shape
    most = max(counts, default=0)
    used = sum(1 for n in counts if n)
    if not m or most > BATCHED_MAX_ROWS or 2 * used < s or list(index) != list(range(s)):
        return sorted_experts(xs, counts, index, w13, w2)
    sizes = torch.tensor(counts)
    group = torch.repeat_interleave(torch.arange(s), sizes, output_size=m)
    at = group * most + torch.arange(m) - (sizes.cumsum(0) - sizes)[group]  # row in the batch
    at = to_device(at, xs.device)
    padded = xs.new_zeros(s * most, d).index_copy_(0, at, xs).view(s, most, d)
    h = gated(torch.bmm(padded, w13.transpose(1, 2)))
    return torch.bmm(h, w2.transpose(1, 2)).view(s * most, d)[at]


def grouped_mm_experts(xs: Tensor, counts: Sequence[int] | Tensor, index: Sequence[int],
                       w13: Tensor, w2: Tensor) -> Tensor:
    """All groups in two torch._grouped_mm calls; groups must cover w's rows in order. counts
    may stay on the device (the MoE layer's own): then nothing waits for the host."""
    if list(index) != list(range(w13.shape[0])):
        raise ValueError("grouped_mm needs one group per weight row, in row order")
    if not isinstance(counts, Tensor):
        counts = to_device(torch.tensor(counts, dtype=torch.int32), xs.device)
    offs = counts.cumsum(0, dtype=torch.int32)
    h = gated(torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs))
    return torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)


def per_token_experts(xs: Tensor, counts: Sequence[int], index: Sequence[int], w13: Tensor,
                      w2: Tensor) -> Tensor:
    """Row by row: slow, the reference for tests."""
    ys = torch.empty_like(xs)
    start = 0
    for n, row in zip(counts, index, strict=True):
        for m in range(start, start + n):
            ys[m] = swiglu(xs[m:m + 1], w13[row], w2[row])[0]
        start += n
    return ys


KERNELS = {"sorted": sorted_experts, "batched": batched_experts,
           "grouped_mm": grouped_mm_experts, "reference": per_token_experts}


@dataclass(frozen=True)
class KernelTable:
    """The kernel by the size of a layer's call: rows (most (token, expert) pairs, kernel name)
    ascending, a call over the last bound taking the last row's kernel. It is a Kernel itself,
    each call going to its size's row."""

    rows: tuple[tuple[int, str], ...]

    def pick(self, pairs: int) -> Kernel:
        return KERNELS[next((name for most, name in self.rows if pairs <= most),
                            self.rows[-1][1])]

    def __call__(self, xs: Tensor, counts, index, w13: Tensor, w2: Tensor) -> Tensor:
        return self.pick(xs.shape[0])(xs, counts, index, w13, w2)

    def __str__(self) -> str:
        bounds = [f"{name} up to {most} pairs" for most, name in self.rows[:-1]]
        return ", ".join([*bounds, f"{self.rows[-1][1]} above" if bounds else self.rows[-1][1]])


def for_rows(kernel: Kernel, pairs: int) -> Kernel:
    """The kernel that runs a call of this many (token, expert) pairs."""
    return kernel.pick(pairs) if isinstance(kernel, KernelTable) else kernel


# Step sizes (tokens) the start-up timing measures: decode batches, then prefill chunks
TIMED_TOKENS = (1, 8, 32, 64, 256, 2048)
TIMED_REPEATS = 5


def time_kernels(candidates: Sequence[str], w13: Tensor, w2: Tensor, top_k: int,
                 tokens: Sequence[int] = TIMED_TOKENS, repeats: int = TIMED_REPEATS
                 ) -> tuple[KernelTable, dict[int, dict[str, float]]]:
    """The fastest candidate at each step size, timed on these weights (a layer's own) with
    uniformly routed random tokens, median of repeats after one warm-up call; between two sizes
    the bound is their geometric mean. Returns the table and the times (ms by kernel, by
    tokens)."""
    e, d = w13.shape[0], w13.shape[2]
    gen = torch.Generator().manual_seed(0)
    times: dict[int, dict[str, float]] = {}
    for n in tokens:
        experts = torch.rand(n, e, generator=gen).argsort(dim=1)[:, :top_k].flatten()
        counts = torch.bincount(experts, minlength=e).tolist()
        xs = torch.randn(n * top_k, d, generator=gen).to(w13.device, w13.dtype)
        on_device = to_device(torch.tensor(counts, dtype=torch.int32), w13.device)
        times[n] = {name: median_ms(partial(KERNELS[name], xs, on_device if name == "grouped_mm"
                                             else counts, range(e), w13, w2), w13.device, repeats)
                    for name in candidates}
    best = [(n, min(row, key=row.get)) for n, row in times.items()]
    rows = []
    for (n, name), (after, _) in zip(best, [*best[1:], (None, None)], strict=True):
        most = math.isqrt(n * after) * top_k if after else 2 ** 62
        if rows and rows[-1][1] == name:
            rows[-1] = (most, name)
        else:
            rows.append((most, name))
    return KernelTable(tuple(rows)), times


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int,
              warm_ups: int = 1) -> float:
    """fn's median wall time over repeats calls, each waited for on the device, after warm_ups
    untimed calls."""
    for _ in range(warm_ups):
        fn()
    spans = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter_ns()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        spans.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(spans)


def log_timings(table: KernelTable, times: dict[int, dict[str, float]]) -> None:
    names = list(next(iter(times.values())))
    log.info("MoE kernel auto, timed at start-up on layer 0's experts (ms per call):\n%s\n-> %s",
             "\n".join(f"  {n:>5} tokens: " + "  ".join(f"{k} {row[k]:.3f}" for k in names)
                       for n, row in times.items()), table)


# Compute capabilities where PyTorch's _grouped_mm is one fused kernel (in bfloat16); elsewhere
# on CUDA it loops over the groups, one matmul each: slower than sorted, and no error says so.
GROUPED_MM_FUSED = ((9, 0), (10, 0))
PROBE_COUNTS = (3, 0, 5)  # rows per expert of the probe's call: an empty group among them


def grouped_mm_unsupported(shape: tuple[int, int], device: torch.device,
                           dtype: torch.dtype) -> str | None:
    """Why torch._grouped_mm should not run experts of this (expert hidden, model) shape here,
    or None. On CUDA it must be the fused kernel (bfloat16, GROUPED_MM_FUSED). Then one real
    call on random weights and input (support depends on the build, the device, the dtype and
    the shape's alignment), synchronized inside the check so an asynchronous fault is caught,
    and compared with the sorted kernel's output."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if dtype != torch.bfloat16 or capability not in GROUPED_MM_FUSED:
            return (f"its fused kernel needs bfloat16 on compute capability 9.0 or 10.0; "
                    f"{str(dtype).removeprefix('torch.')} on {capability[0]}.{capability[1]} "
                    "would loop over the experts, one matmul each")
    i, d = shape
    n = len(PROBE_COUNTS)
    gen = torch.Generator().manual_seed(0)
    w13 = (torch.randn(n, 2 * i, d, generator=gen) / d ** 0.5).to(device, dtype)
    w2 = (torch.randn(n, d, i, generator=gen) / i ** 0.5).to(device, dtype)
    xs = torch.randn(sum(PROBE_COUNTS), d, generator=gen).to(device, dtype)
    try:
        got = grouped_mm_experts(xs, PROBE_COUNTS, range(n), w13, w2)
        want = sorted_experts(xs, PROBE_COUNTS, range(n), w13, w2)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    if not torch.allclose(got.float(), want.float(), rtol=tolerance, atol=tolerance):
        worst = (got.float() - want.float()).abs().max().item()
        return f"its output differs from the sorted kernel's by up to {worst:.3g}"
    return None


def resolve_kernel(name: str, shape: tuple[int, int], device: torch.device, dtype: torch.dtype,
                   cached: bool) -> str:
    """The name of the kernel to run for `name`, logged with why. auto: on CUDA, grouped_mm in
    bfloat16 where the probe passes, else batched; sorted on the CPU (where batched's padding
    is real work: docs/measured.md) and with the expert cache (which computes one resident
    slot at a time). grouped_mm falls back to sorted."""
    if name not in ("auto", "grouped_mm"):
        return name
    if name == "auto" and (device.type != "cuda" or cached):
        log.info("MoE kernel sorted (--moe-kernel auto: %s)",
                 "the expert cache computes one resident slot at a time" if cached else
                 f"on {device.type}, where batched's padding rows cost real compute; grouped_mm "
                 "and batched are chosen on CUDA")
        return "sorted"
    reason = "the expert cache is on (resident slots are not in expert order)" if cached \
        else grouped_mm_unsupported(shape, device, dtype)
    if reason and name == "auto":
        log.info("MoE kernel batched (--moe-kernel auto: grouped_mm unavailable: %s)", reason)
        return "batched"
    if reason:
        log.warning("MoE kernel sorted (--moe-kernel grouped_mm: grouped_mm unavailable: %s)",
                    reason)
        return "sorted"
    log.info("MoE kernel grouped_mm (--moe-kernel %s: its probe passed on %s)", name, device)
    return "grouped_mm"
