"""The experts a server's router chose for a request, as vLLM and SGLang return them
(docs/targets.md). While the stream runs, the receive loop only notes which messages carry them
(a few dictionary lookups) and keeps their JSON text; once the request has ended, the process
that records it (the aio sender's parent, not the sender) reads them again and decodes them into
the per-layer counts of records/routing.py, so the process that times the streams pays nothing
more for them.

- vLLM (--enable-return-routed-experts): `prompt_routed_experts` on the response and
  `routed_experts` on the choice, [tokens][layers][top-k] expert ids as JSON lists. Older
  versions sent one array for the prompt and the output together: its first usage.prompt_tokens
  rows are then the prompt's.
- SGLang (--enable-return-routed-experts and the request's `return_routed_experts`): base64 of
  int32 ids, [tokens, layers, top-k] flattened, in `sglext.routed_experts` (a chunk of its own,
  with no choices, when streaming) or the native API's `meta_info.routed_experts`; it covers the
  prompt and the output, and reading it needs the model's shape (--moe-shape).

An id of -1 is a layer or slot without a routed expert (a dense layer) and is skipped; any
other id outside 0..experts-1, rows of uneven width, a layer count other than --moe-shape's, or
base64 that does not decode to whole tokens leave the request's routing unread, with the reason.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from records.load_settings import TargetSettings
from records.routing import counts_of, encode_counts

ENGINES_THAT_ANSWER = ("vllm", "sglang", "moe-loadlab")  # /v1/models' owned_by, for auto
MAX_EXPERTS = 1 << 16  # ids above this are garbage, not a model's expert


def carries_routing(event: dict, choice: dict | None) -> bool:
    return bool(pieces_of(event, choice))


def pieces_of(event: dict, choice: dict | None) -> tuple[tuple[str, Any], ...]:
    """The routing an event carries, raw: ("prompt" | "output" | "all", value) pairs."""
    found = []
    if (value := event.get("prompt_routed_experts")) is not None:
        found.append(("prompt", value))
    if choice is not None and (value := choice.get("routed_experts")) is not None:
        found.append(("output", value))
    for holder in (event.get("sglext"), event.get("meta_info"),
                   choice.get("sglext") if choice is not None else None):
        if isinstance(holder, dict) and (value := holder.get("routed_experts")) is not None:
            found.append(("all", value))
    return tuple(found)


def reader_for(settings: TargetSettings) -> RoutingReader | None:
    """The reader of a run's routed experts; None with --routed-experts off."""
    return None if settings.routed_experts == "off" else RoutingReader(settings)


class RoutingReader:
    """Turns a finished request's raw pieces into a RoutedRow's fields."""

    def __init__(self, settings: TargetSettings):
        self.layers = self.experts = self.top_k = 0
        if settings.moe_shape:
            self.layers, self.experts, self.top_k = map(int, settings.moe_shape.split("x"))

    @staticmethod
    def pieces(text: str) -> tuple[tuple[str, Any], ...]:
        """The pieces of one event's JSON text (an OpenAI-style chunk or response)."""
        event = json.loads(text)
        choices = event.get("choices") or []
        return pieces_of(event, choices[0] if choices and isinstance(choices[0], dict)
                         else None)

    def fields(self, pieces: list, prompt_tokens: int) -> dict:
        """pieces: (kind, value) in the order they came (a kind in several messages: its
        tokens in turn); prompt_tokens: the server's count (usage), 0 unknown."""
        if not pieces:
            return {"source": "", "lacking": "the reply carried no routed experts"}
        source = "base64" if any(isinstance(v, str) for _, v in pieces) else "lists"
        parts: dict[str, list[np.ndarray]] = {}
        try:
            for kind, value in pieces:
                parts.setdefault(kind, []).append(self._ids(value))
            joined = {kind: joined_rows(arrays) for kind, arrays in parts.items()}
        except ValueError as exc:
            return {"source": source, "lacking": str(exc)}
        prompt, output = joined.get("prompt"), joined.get("output")
        if (whole := joined.get("all")) is not None and output is None:
            # SGLang's array covers the prompt and the output in turn
            cut = len(prompt) if prompt is not None else min(prompt_tokens, len(whole))
            prompt = whole[:cut] if prompt is None else prompt
            output = whole[cut:]
        arrays = [a for a in (prompt, output) if a is not None and len(a)]
        if not arrays:
            return {"source": source, "lacking": "the reply's routed experts held no token"}
        if len({a.shape[1:] for a in arrays}) > 1:
            return {"source": source, "lacking": "the prompt's and the output's routing differ "
                    f"in shape: {[a.shape[1:] for a in arrays]}"}
        layers, top_k = arrays[0].shape[1:]
        if self.top_k and top_k != self.top_k:
            return {"source": source, "lacking": f"routed experts top-{top_k}, --moe-shape says "
                    f"top-{self.top_k}"}
        experts = self.experts or max(int(a.max()) for a in arrays) + 1
        bad = [int(v) for a in arrays for v in (a.min(), a.max()) if v < -1 or v >= experts]
        if bad:
            return {"source": source, "lacking": f"expert id {bad[0]} out of range (0.."
                    f"{experts - 1}{', --moe-shape' if self.experts else ''})"}
        out = {"source": source, "layers": layers, "experts": experts, "top_k": top_k}
        for name, ids in (("prompt", prompt), ("output", output)):
            routed = int((ids >= 0).any(axis=(1, 2)).sum()) if ids is not None else 0
            if routed:  # rows of -1 alone (a prefix-cached prompt token) are no token's routing
                out[f"{name}_tokens"] = routed
                out[f"{name}_counts"] = encode_counts(counts_of(ids, experts))
        return out

    def _ids(self, value) -> np.ndarray:
        """One piece as int64 [tokens, layers, top_k] ([0, 0, 0] when it holds no token);
        ValueError saying what is wrong."""
        if isinstance(value, str):
            if not (self.layers and self.top_k):
                raise ValueError("flat base64 ids need the model's shape: give --moe-shape "
                                 "LAYERSxEXPERTSxTOP_K")
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("routed experts in malformed base64") from None
            per_token = 4 * self.layers * self.top_k
            if len(raw) % per_token:
                raise ValueError(f"truncated routed experts: {len(raw)} bytes is not a whole "
                                 f"number of tokens of {self.layers} layers x top-{self.top_k} "
                                 "int32 ids")
            return np.frombuffer(raw, "<i4").astype(np.int64).reshape(-1, self.layers,
                                                                       self.top_k)
        try:
            ids = np.asarray(value, dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            raise ValueError("routed experts that are not [tokens][layers][top-k] integers "
                             "(rows of uneven width?)") from None
        if ids.size == 0:
            return ids.reshape(0, 0, 0)
        if ids.ndim != 3:
            raise ValueError(f"routed experts of {ids.ndim} dimensions, not [tokens][layers]"
                             "[top-k]")
        if self.layers and ids.shape[1] != self.layers:
            raise ValueError(f"routed experts over {ids.shape[1]} layers, --moe-shape says "
                             f"{self.layers}")
        if (far := np.abs(ids).max()) >= MAX_EXPERTS:
            raise ValueError(f"expert id {int(far)} out of range")
        return ids


def joined_rows(arrays: list[np.ndarray]) -> np.ndarray:
    """A kind's pieces, its tokens in turn (the empty ones left out)."""
    held = [a for a in arrays if len(a)]
    if not held:
        return arrays[0]
    if len({a.shape[1:] for a in held}) > 1:
        raise ValueError(f"routed experts of shapes {sorted({a.shape[1:] for a in held})} in "
                         "one reply")
    return np.concatenate(held)
