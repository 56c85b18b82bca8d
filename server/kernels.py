"""Expert kernels: each expert's SwiGLU over its tokens, the tokens already sorted by expert.

Every kernel takes (xs [M, D] sorted by group, counts: tokens per group (host ints),
index: the weight row of each group, w13 [S, 2I, D] (gate then up projection, fused as
transformers keeps them, so one matmul computes both), w2 [S, D, I]) and returns ys [M, D] in
the same order. A group is one expert; S is the number of experts, or of resident slots when
the expert cache is on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

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


def grouped_mm_experts(xs: Tensor, counts: Sequence[int], index: Sequence[int], w13: Tensor,
                       w2: Tensor) -> Tensor:
    """All groups in two torch._grouped_mm calls; groups must cover w's rows in order."""
    if list(index) != list(range(w13.shape[0])):
        raise ValueError("grouped_mm needs one group per weight row, in row order")
    offs = torch.tensor(counts, dtype=torch.int32, device=xs.device).cumsum(0, dtype=torch.int32)
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


KERNELS = {"sorted": sorted_experts, "grouped_mm": grouped_mm_experts,
           "reference": per_token_experts}


def grouped_mm_unsupported(shape: tuple[int, int], device: torch.device,
                           dtype: torch.dtype) -> str | None:
    """Why torch._grouped_mm cannot run experts of this (expert hidden, model) shape here, or
    None. Probes one real call on zero weights of one expert, since support depends on the
    torch build, the device, the dtype and the alignment of the shape."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no _grouped_mm"
    i, d = shape
    w13 = torch.zeros(1, 2 * i, d, device=device, dtype=dtype)
    w2 = torch.zeros(1, d, i, device=device, dtype=dtype)
    try:
        grouped_mm_experts(torch.zeros(2, d, device=device, dtype=dtype), [2], range(1), w13, w2)
    except (RuntimeError, ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def resolve_kernel(name: str, shape: tuple[int, int], device: torch.device, dtype: torch.dtype,
                   cached: bool) -> str:
    """The name of the kernel to run for `name`: grouped_mm falls back to sorted, logging why."""
    if name != "grouped_mm":
        return name
    reason = "the expert cache is on (resident slots are not in expert order)" if cached \
        else grouped_mm_unsupported(shape, device, dtype)
    if reason:
        log.warning("--moe-kernel grouped_mm unavailable, using sorted: %s", reason)
        return "sorted"
    return name
