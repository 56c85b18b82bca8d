"""Decode attention that reads each sequence's own cached positions: one new query token per
sequence over the keys and values its slot holds, no row padded to the longest.

On CUDA this is FlashAttention's variable-length kernel as PyTorch ships it
(`aten::_flash_attention_forward` with `seqused_k`): the pool's layer [slots, G, S, K] is viewed
as slots x G sequences of S rows each (one per (slot, kv head), a row K wide), so the kernel starts
each sequence at its own slot's rows and stops at its own length, read from the device. Nothing
in it depends on the lengths' values on the host, so a CUDA graph captures it once per batch size
(server/engine/decode_graphs.py). `flash_decode_unsupported` probes it once against the reference
at start-up; where it fails the engine keeps the masked SDPA path (server/engine/model.py).

Each is planned once a step (`plan`: the index tensors every layer shares) and called per layer.
`GatheredDecode` is the reference: the same result from masked SDPA over the sequences' slots
gathered to a fixed width, the one the CPU runs in the fixed-shape decode path's tests.

Shape letters: B sequences, H query heads, G kv heads, K head dim, S cached positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from server.engine.model_args import ModelArgs

FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class FlashDecode:
    """One step's decode attention through FlashAttention's varlen kernel, planned once for
    every layer: one varlen "sequence" per (sequence, kv head), its query heads in one row."""

    cum_q: Tensor  # [B x G + 1] int32
    cum_k: Tensor  # [B x G + 1] int32: where each starts in the [slots x G x S] rows
    used: Tensor  # [B x G] int32: positions each reads
    rows: int  # S, the positions of a slot
    window: int  # at most this many latest positions (0: all)

    @classmethod
    def plan(cls, slots: Tensor, lens: Tensor, kv_heads: int, positions: int,
             window: int = 0) -> FlashDecode:
        """slots [B]: each sequence's slot; lens [B]: the positions it attends to, its new
        one included."""
        b = slots.shape[0]
        heads = torch.arange(kv_heads, device=slots.device, dtype=torch.int32)
        starts = ((slots.to(torch.int32)[:, None] * kv_heads + heads) * positions).flatten()
        return cls(torch.arange(b * kv_heads + 1, device=slots.device, dtype=torch.int32),
                   torch.cat([starts, starts[-1:] + positions]),  # the last is not read
                   lens.to(torch.int32)[:, None].expand(b, kv_heads).reshape(-1),
                   positions, window)

    def __call__(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """q [B, H, K] over k_cache/v_cache [slots, G, S, K] -> [B, H, K]."""
        b, h, d = q.shape
        n_slots, g, s, _ = k_cache.shape
        w = self.window
        out = torch.ops.aten._flash_attention_forward(
            q.reshape(b * g, h // g, d), k_cache.view(n_slots * g * s, 1, d),
            v_cache.view(n_slots * g * s, 1, d), self.cum_q, self.cum_k, 1, s, 0.0, False,
            False, window_size_left=w - 1 if w else None, window_size_right=0 if w else None,
            seqused_k=self.used)[0]
        return out.view(b, h, d)


@dataclass
class GatheredDecode:
    """FlashDecode's result from masked SDPA over the sequences' slots gathered [B, G, S, K]:
    every shape fixed by B and the cache, none by the lengths (the reference, and the CPU's
    fixed-shape decode)."""

    slots: Tensor  # [B]
    mask: Tensor  # [B, 1, 1, S]

    @classmethod
    def plan(cls, slots: Tensor, lens: Tensor, kv_heads: int, positions: int,
             window: int = 0) -> GatheredDecode:
        at = torch.arange(positions, device=slots.device)[None, :]
        mask = at < lens[:, None]
        if window:
            mask &= at >= lens[:, None] - window
        return cls(slots, mask[:, None, None, :])

    def __call__(self, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        keys, values = k_cache[self.slots], v_cache[self.slots]
        groups = q.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q[:, :, None], keys, values,
                                              attn_mask=self.mask)[:, :, 0]


DecodeAttention = type[FlashDecode] | type[GatheredDecode]

PROBE_POOL = 8  # slots of the probe's cache; its batches take them in a shuffled order
PROBE_BATCHES = (1, 8)  # one sequence (where the kernel splits the keys), and a full pool
PROBE_MOST_POSITIONS = 8192  # the probe's context: the model's, up to this


def flash_decode_unsupported(args: ModelArgs, device: torch.device,
                             dtype: torch.dtype) -> str | None:
    """Why FlashDecode should not run on this device and dtype for args's heads, context and
    sliding window, or None: real calls on random keys in a small pool of the model's context
    (up to PROBE_MOST_POSITIONS), one sequence and a full pool of mixed lengths, synchronized,
    each compared with GatheredDecode's."""
    head_dim, heads, kv_heads = args.head_dim, args.n_heads, args.n_kv_heads
    window = args.sliding_window
    if device.type != "cuda":
        return f"it is a CUDA kernel; this is {device.type}"
    if dtype not in FLASH_DTYPES:
        return f"FlashAttention takes float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    gen = torch.Generator().manual_seed(0)
    positions = min(args.max_seq_len, PROBE_MOST_POSITIONS)
    shape = (PROBE_POOL, kv_heads, positions, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    for batch in PROBE_BATCHES:
        q = torch.randn(batch, heads, head_dim, generator=gen).to(device, dtype)
        slots = torch.randperm(PROBE_POOL, generator=gen)[:batch].to(device)
        lens = torch.randint(1, positions + 1, (batch,), generator=gen)
        lens[0] = positions  # the longest a sequence can be
        lens = lens.to(device, torch.int32)
        try:
            got = FlashDecode.plan(slots, lens, kv_heads, positions, window)(q, k_cache, v_cache)
            torch.cuda.synchronize(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        want = GatheredDecode.plan(slots, lens, kv_heads, positions, window)(
            q.float(), k_cache.float(), v_cache.float())
        worst = (got.float() - want).abs().max().item()
        if not worst <= 2e-2:
            return (f"its output differs from masked SDPA's by up to {worst:.3g} "
                    f"({batch} sequences of up to {positions} positions)")
    return None
