"""Where each token of an engine step goes: its sequence, position and KV slot, as the
forward pass reads them (server/engine/model.py). A step of prefill chunks and decodes has a
`StepLayout`; a decode step of a CUDA graph's fixed rows a `DecodeLayout`
(server/engine/decode_graphs.py).

Shape letters as in server/engine/model.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from server.engine.decode_attention import DecodeAttention
from server.engine.host_transfer import lists_to_device
from server.engine.model_args import ModelArgs


@dataclass
class StepLayout:
    """Where each sequence's tokens sit in the flattened step, and where its cache lives.

    Attention runs batched as a padding batching engine runs it: decode sequences (one new
    token) padded to the longest cached length (over the whole pool in place where at least
    half its slots decode), and new prompts' chunks padded to the longest chunk; the padding
    is counted, so batching efficiency is measured. A chunk resuming a prompt part-prefilled
    in an earlier step (--max-prefill-tokens, latency_sensitive) attends to its cached prefix
    on its own. Index tensors are built here, once per step, so no layer reads the device
    back to place its outputs.
    """

    positions: Tensor  # [N] position of each token in its sequence
    token_slots: Tensor  # [N] KV cache slot of each token
    groups: Tensor  # [N] index of each token's sequence in the step
    last_index: Tensor  # [B] index in N of each sequence's last token
    decode_index: Tensor  # [Bd] indices in N of the decode tokens
    decode_slots: Tensor  # [Bd]
    # Decode attends over R rows of keys: its sequences' slots gathered (R = Bd), or, where they
    # are at least half the pool, the whole pool in place (R = pool): no copy of their keys, the
    # other slots' rows computed on their first position and dropped (docs/measured.md)
    decode_pool: int  # the pool's slots, attended in place; 0: the decode slots gathered
    decode_lens: Tensor  # [R] each row's cached length after this step (1: a row dropped)
    decode_max_len: int
    # new prompts' chunks (from position 0, over one token): [P, T] indices in N of each one's
    # tokens, padded with its first, and each valid one's place in the flat [P x T] output and in N
    prefill_index: Tensor
    prefill_slots: Tensor  # [P]
    prefill_from: Tensor  # [n] indices into [P x T]
    prefill_to: Tensor  # [n] indices into N
    resumed: list[tuple[int, int, int, int]]  # (first index in N, tokens, slot, start position)
    kv_useful: int  # decode attention: cached positions needed
    kv_computed: int  # decode attention: positions computed (every row padded to the longest)
    prefill_tokens: int  # prefill chunks: tokens
    prefill_padded: int  # new prompts' chunks: padding added to reach the longest one
    # decode attention over each sequence's own positions (server/engine/decode_attention.py),
    # planned for the decode slots and lengths; None: masked SDPA over gathered or pooled rows
    attend: PlannedAttention | None = None

    @classmethod
    def build(cls, seqs: list[tuple[int, int, int]], device: torch.device,
              pool: int = 0, attend: DecodeAttention | None = None,
              args: ModelArgs | None = None) -> StepLayout:
        """seqs: (slot, start position, number of new tokens) per sequence, in step order;
        pool: the KV pool's slots (0: decode always gathers its slots); attend: decode
        attention that reads each sequence's own positions (the pool is then never attended),
        planned for the model of args."""
        positions, token_slots, groups, last_index = [], [], [], []
        decode_index, decode_slots, decode_lens = [], [], []
        fresh, resumed = [], []  # (first index in N, length, slot, start)
        offset = 0
        for i, (slot, start, n) in enumerate(seqs):
            positions.extend(range(start, start + n))
            token_slots.extend([slot] * n)
            groups.extend([i] * n)
            last_index.append(offset + n - 1)
            if n == 1:
                decode_index.append(offset)
                decode_slots.append(slot)
                decode_lens.append(start + 1)
            else:
                (resumed if start else fresh).append((offset, n, slot, start))
            offset += n
        width = max((n for _, n, _, _ in fresh), default=0)
        prefill_index = [[first + min(t, n - 1) for t in range(width)] for first, n, _, _ in fresh]
        valid = [(p * width + t, first + t) for p, (first, n, _, _) in enumerate(fresh)
                 for t in range(n)]
        pooled = pool if decode_slots and 2 * len(decode_slots) >= pool and not attend else 0
        row_lens = decode_lens
        if pooled:
            row_lens = [1] * pooled
            for slot, n in zip(decode_slots, decode_lens, strict=True):
                row_lens[slot] = n
        (positions, token_slots, groups, last_index, decode_index, decode_slots, row_lens_t,
         prefill_flat, prefill_slots, prefill_from, prefill_to) = lists_to_device(
            [positions, token_slots, groups, last_index, decode_index, decode_slots, row_lens,
             [i for row in prefill_index for i in row], [c[2] for c in fresh],
             [v[0] for v in valid], [v[1] for v in valid]], device)
        longest = max(decode_lens, default=0)
        useful = sum(n for _, n, _, _ in fresh)
        planned = attend.plan(decode_slots, row_lens_t, args.n_kv_heads, args.max_seq_len,
                              args.sliding_window) if attend and decode_slots.numel() else None
        return cls(positions, token_slots, groups, last_index, decode_index, decode_slots,
                   pooled, row_lens_t, longest, prefill_flat.reshape(len(fresh), width),
                   prefill_slots, prefill_from, prefill_to, resumed, sum(decode_lens),
                   sum(decode_lens) if attend else longest * len(row_lens),
                   useful + sum(n for _, n, _, _ in resumed), len(fresh) * width - useful, planned)


# one step's decode attention, planned (server/engine/decode_attention.py):
# (q [B, H, K], k and v cache [slots, G, S, K]) -> [B, H, K]
PlannedAttention = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass
class DecodeLayout:
    """A decode step of a fixed number of rows, one token each (a CUDA graph's batch bucket,
    server/engine/decode_graphs.py): every tensor's shape is the rows', whatever the sequences'
    lengths, so one captured graph serves every step of that many rows. Rows past the real
    sequences are padding: token 0 at position 0 of the pool's scratch slot, `valid` False."""

    positions: Tensor  # [N]
    token_slots: Tensor  # [N]
    last_index: Tensor  # [N] every row: each is its own sequence's last token
    attend: PlannedAttention  # planned for the rows' slots and lengths
