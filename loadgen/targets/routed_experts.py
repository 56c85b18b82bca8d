"""The experts a server's router chose for a request, as vLLM and SGLang return them
(docs/targets.md). While the stream runs, the receive loop only notes which messages carry them
(a few dictionary lookups) and keeps their JSON text; once the request has ended, the process
that records it (the aio sender's parent, not the sender) reads them again and decodes them into
the per-layer counts of records/expert_routes.py, so the process that times the streams pays nothing
more for them.

- vLLM (--enable-return-routed-experts; vllm/entrypoints/openai/completion/serving.py and
  vllm/utils/serial_utils.py numpy2base64): only in a non-streamed reply, `routed_experts` on
  the choice: base64 of an `.npy` file (np.save), [rows, layers, top-k] of uint8 (up to 256
  experts) or uint16, one row per token from the request's routed_experts_prompt_start through
  the prompt and the output but the last token (never fed back through the model): its last
  usage.completion_tokens - 1 rows are the output's, the rows before them the prompt's. Older
  releases sent JSON lists, `prompt_routed_experts` on the response beside `routed_experts`;
  a base64 string and a list are told apart by type, and .npy from SGLang's raw ids by the .npy
  magic, never by a guess.
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
import io
import json
from typing import Any

import numpy as np

from records.expert_routes import counts_of, encode_counts
from records.load_settings import TargetSettings

ENGINES_THAT_ANSWER = ("vllm", "sglang", "moe-loadlab")  # /v1/models' owned_by, for auto
MAX_EXPERTS = 1 << 16  # ids above this are garbage, not a model's expert
NPY_MAGIC = b"\x93NUMPY"  # how every .npy file starts


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

    def fields(self, pieces: list, usage: dict[str, int]) -> dict:
        """pieces: (kind, value) in the order they came (a kind in several messages: its
        tokens in turn); usage: the server's counts (prompt_tokens, completion_tokens)."""
        if not pieces:
            return {"source": "", "lacking": "the reply carried no routed experts"}
        parts: dict[str, list[np.ndarray]] = {}
        # the form each piece came in (npy once read): base64 text or lists
        forms = ["base64" if isinstance(value, str) else "lists" for _, value in pieces]
        try:
            for i, (kind, value) in enumerate(pieces):
                ids, forms[i] = self._ids(value)
                # vLLM's .npy covers the prompt and the output, wherever it comes
                parts.setdefault("npy" if forms[i] == "npy" else kind, []).append(ids)
            joined = {kind: joined_rows(arrays) for kind, arrays in parts.items()}
        except ValueError as exc:
            return {"source": "/".join(sorted(set(forms))), "lacking": str(exc)}
        source = "/".join(sorted(set(forms)))
        prompt, output = split(joined, usage)
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

    def _ids(self, value) -> tuple[np.ndarray, str]:
        """One piece as int64 [tokens, layers, top_k] ([0, 0, 0] when it holds no token) and
        its form (npy, base64 or lists); ValueError saying what is wrong."""
        if isinstance(value, str):
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("routed experts in malformed base64") from None
            if raw.startswith(NPY_MAGIC):
                return self._checked(npy_ids(raw)), "npy"
            return self._flat(raw), "base64"
        try:
            ids = np.asarray(value, dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            raise ValueError("routed experts that are not [tokens][layers][top-k] integers "
                             "(rows of uneven width?)") from None
        return self._checked(ids), "lists"

    def _flat(self, raw: bytes) -> np.ndarray:
        """SGLang's int32 ids, flattened: shaped by --moe-shape."""
        if not (self.layers and self.top_k):
            raise ValueError("flat base64 ids need the model's shape: give --moe-shape "
                             "LAYERSxEXPERTSxTOP_K")
        per_token = 4 * self.layers * self.top_k
        if len(raw) % per_token:
            raise ValueError(f"truncated routed experts: {len(raw)} bytes is not a whole "
                             f"number of tokens of {self.layers} layers x top-{self.top_k} "
                             "int32 ids")
        return np.frombuffer(raw, "<i4").astype(np.int64).reshape(-1, self.layers, self.top_k)

    def _checked(self, ids: np.ndarray) -> np.ndarray:
        """[tokens, layers, top_k] ids, their layers against --moe-shape's."""
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


def npy_ids(raw: bytes) -> np.ndarray:
    """vLLM's .npy bytes as int64 ids; ValueError unless an integer array that loads without
    pickle."""
    try:
        ids = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"truncated or malformed routed experts (.npy): {exc}") from None
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"routed experts (.npy) of {ids.dtype}, not integer ids")
    return ids.astype(np.int64)


def split(joined: dict[str, np.ndarray], usage: dict[str, int]
          ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(prompt, output) rows of a reply's kinds: vLLM's .npy ends with the output's tokens but
    the last (usage.completion_tokens - 1 rows; the rows before are the prompt's from its
    routed_experts_prompt_start on); SGLang's array covers the prompt (usage.prompt_tokens
    rows) then the output; older vLLM's lists come apart."""
    prompt, output = joined.get("prompt"), joined.get("output")
    if (whole := joined.get("npy")) is not None:
        done = usage.get("completion_tokens", 0)
        cut = max(len(whole) - max(done - 1, 0), 0) if done else len(whole)
        return whole[:cut], whole[cut:]
    if (whole := joined.get("all")) is not None and output is None:
        cut = len(prompt) if prompt is not None else min(usage.get("prompt_tokens", 0),
                                                         len(whole))
        return (whole[:cut] if prompt is None else prompt), whole[cut:]
    return prompt, output


def joined_rows(arrays: list[np.ndarray]) -> np.ndarray:
    """A kind's pieces, its tokens in turn (the empty ones left out)."""
    held = [a for a in arrays if len(a)]
    if not held:
        return arrays[0]
    if len({a.shape[1:] for a in held}) > 1:
        raise ValueError(f"routed experts of shapes {sorted({a.shape[1:] for a in held})} in "
                         "one reply")
    return np.concatenate(held)
