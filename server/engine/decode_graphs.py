"""Decode steps at the GPU's speed: each step of only decoding sequences replays a CUDA graph
captured at start-up, one per batch-size bucket, the batch padded up to its bucket (as vLLM and
SGLang do). A replay is one launch for the whole forward pass, where an eager step launches
every kernel from Python (about 100 a layer), so the GPU no longer waits for the host between
them (docs/design.md, "Decode graphs").

What makes a step capturable is that nothing in it depends on the host's view of its data:
- fixed shapes: the bucket's rows, whatever the sequences' lengths. Attention reads each row's
  own positions with the lengths on the device (server/engine/decode_attention.py); padding rows
  decode token 0 at position 0 of the pool's scratch slot and route to row 0's experts, so they
  read no weights the real rows do not (server/engine/moe.py) and are left out of every count;
- no host sync: the experts run through grouped_mm with their counts on the device;
- static memory: the step's inputs (tokens, positions, slots, lengths, which rows are real) are
  built on the host and copied into one device buffer the graphs read, in one copy; the
  routing statistics land in the graph's own output tensors.
Sampling stays outside the graph (a sequence's generator is its own), and the sampled tokens'
read with the statistics, in one transfer, is the step's only host sync.

`mode` "eager" runs the same fixed-shape step without capturing it: the CPU's way to test the
path, token for token against the dynamic one.

Shape letters: N rows (the bucket), B sequences, L layers, E experts, V vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from server.engine.decode_attention import DecodeAttention
from server.engine.kernels import grouped_mm_experts
from server.engine.layouts import DecodeLayout
from server.engine.model import KVCache, Transformer
from server.engine.moe import StepContext
from server.engine.stages import NullTimer, StageTimer

log = logging.getLogger(__name__)

# Batch buckets (vLLM's capture sizes start the same way): every decode batch pads up to the
# smallest one that holds it; a pool larger than the last adds its own size.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
WARM_UP_RUNS = 2  # eager runs of each bucket on a side stream before its capture (torch's advice)
TOKEN, POSITION, SLOT, LENGTH, VALID = range(5)  # the rows of the inputs buffer


def bucket_sizes(most: int) -> list[int]:
    """The buckets a pool of `most` sequences needs, ascending, the last one `most` itself."""
    return [b for b in BUCKETS if b < most] + [most]


def fixed_shape_problem(*, grouped: str | None, cached: bool, capacity: bool, spread: bool,
                        router: str, attention: str | None) -> str | None:
    """Why this engine's decode steps cannot take fixed shapes without a host sync, or None.
    grouped: why grouped_mm cannot run the experts here, or None; attention: why decode
    attention over each sequence's own positions cannot, or None."""
    checks = (
        (grouped is not None, f"grouped_mm, the one MoE kernel that keeps its expert counts on "
                              f"the device, is unavailable: {grouped}"),
        (cached, "the expert cache decides on the host which experts to copy in"),
        (capacity, "--capacity-factor sizes each expert's kept tokens on the host"),
        (spread, "experts spread over ranks exchange tokens with host-sized splits"),
        (router != "topk", f"the {router} router is not capturable (its noise draws or host "
                           "heap)"),
        (attention is not None, f"decode attention over each sequence's own positions is "
                                f"unavailable: {attention}"),
    )
    return next((why for bad, why in checks if bad), None)


@dataclass
class Replay:
    """One bucket's step: its graph (None when run eagerly) and the tensors it leaves."""

    graph: torch.cuda.CUDAGraph | None
    outputs: tuple[Tensor, ...]  # logits [N, V], routed [L, E], seq_experts [N, L, E], active [L]


class DecodeGraphs:
    """Fixed-shape decode steps of up to `most` sequences for one model and KV pool (the pool's
    scratch slot takes the padding rows), captured as CUDA graphs (mode "graphs") or run eagerly
    on the same buffers (mode "eager")."""

    def __init__(self, model: Transformer, kv: KVCache, most: int, attend: DecodeAttention,
                 device: torch.device, mode: str = "graphs"):
        if kv.scratch_slot is None:
            raise ValueError("fixed-shape decode steps need a KV pool with a scratch slot")
        self.model, self.kv, self.attend, self.device = model, kv, attend, device
        self.capture = mode == "graphs"
        self.sizes = bucket_sizes(most)
        rows = self.sizes[-1]
        self.host = torch.zeros(5, rows, dtype=torch.long,
                                pin_memory=device.type == "cuda")
        self.inputs = torch.zeros(5, rows, dtype=torch.long, device=device)
        self.rows = torch.arange(rows, device=device)
        self._pad(0)
        self.inputs.copy_(self.host)
        self.slot_bias: Tensor | None = None
        self.replays: dict[int, Replay] = {}

    def prepare(self, slot_bias: Tensor | None) -> None:
        """Captures (or readies) every bucket, largest first so the smaller ones reuse its
        memory; slot_bias [slots + 1, L, E]: the affinity skew's per-slot routing bias, read in
        place by every step."""
        self.slot_bias = slot_bias
        pool = torch.cuda.graph_pool_handle() if self.capture else None
        for size in reversed(self.sizes):
            self.replays[size] = self._capture(size, pool) if self.capture else \
                Replay(None, ())

    def bucket(self, n: int) -> int | None:
        """The bucket n sequences pad up to, or None when n is over the largest."""
        return next((b for b in self.sizes if b >= n), None)

    def run(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
            timer: StageTimer) -> tuple[Tensor, ...]:
        """One decode step of len(tokens) sequences (their last tokens, those tokens' positions
        and their slots): logits [B, V], routed [L, E], seq_experts [B, L, E], active [L], on the
        device, for the engine's sampling and its one read."""
        n = len(tokens)
        size = self.load(tokens, positions, slots)
        replay = self.replays[size]
        if replay.graph is None:
            outputs = self.forward(size, timer)
        else:
            timer.replay(replay.graph)
            outputs = replay.outputs
        logits, routed, seq_experts, active = outputs
        return logits[:n], routed, seq_experts[:n], active

    def load(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> int:
        """The step's inputs into the buffer the graphs read, padded up to their bucket, in one
        copy that does not wait (of the whole buffer: a part of it is not contiguous, and torch
        would stage it through pageable memory); returns the bucket."""
        n = len(tokens)
        size = self.bucket(n)
        for row, values in ((TOKEN, tokens), (POSITION, positions), (SLOT, slots)):
            self.host[row, :n] = torch.as_tensor(values)
        self.host[LENGTH, :n] = self.host[POSITION, :n] + 1
        self.host[VALID, :n] = 1
        self._pad(n)
        self.inputs.copy_(self.host, non_blocking=True)
        return size

    def _pad(self, n: int) -> None:
        """Rows n.. of the host buffer as padding: token 0 at position 0 of the scratch slot."""
        self.host[:, n:] = 0
        self.host[SLOT, n:] = self.kv.scratch_slot
        self.host[LENGTH, n:] = 1

    def forward(self, size: int, timer) -> tuple[Tensor, ...]:
        """The bucket's step on the loaded inputs, what a graph captures: logits [N, V],
        routed [L, E], seq_experts [N, L, E], active [L]."""
        inputs = self.inputs[:, :size]
        valid = inputs[VALID] > 0
        slots = inputs[SLOT]
        a = self.model.args
        ctx = StepContext(self.rows[:size], size, timer,
                          None if self.slot_bias is None else self.slot_bias[slots], valid=valid,
                          valid_pairs=inputs[VALID].repeat_interleave(a.top_k),
                          kernel=grouped_mm_experts)
        attend = self.attend.plan(slots, inputs[LENGTH], a.n_kv_heads, a.max_seq_len,
                                  a.sliding_window)
        layout = DecodeLayout(inputs[POSITION], slots, self.rows[:size], attend)
        logits = self.model(inputs[TOKEN], layout, self.kv, ctx)
        return (logits, torch.stack(ctx.routed), torch.stack(ctx.seq_experts, dim=1),
                torch.stack(ctx.active))

    def _capture(self, size: int, pool) -> Replay:
        """The bucket's graph, after warm-up runs on a side stream (the padding rows' inputs:
        they write only the scratch slot)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(WARM_UP_RUNS):
                self.forward(size, NullTimer())
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (the server's start-up) cannot spoil it
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            outputs = self.forward(size, NullTimer())
        return Replay(graph, outputs)
