"""routed_experts.jsonl: the experts a server's router chose for each request, as the server
returned them (vLLM's and SGLang's routed experts, this project's server's HTTP API), one line per
request in the order they finished (docs/run-directory.md).

A line keeps, per layer, how many of the request's tokens each expert took, for its prompt and
for its output apart: never one number per token. The counts are a [layers, experts] array of
unsigned integers, as narrow as the largest count allows, little-endian with the bytes grouped
by significance (every count's lowest byte, then every count's next: the high bytes, mostly
zero, compress away), compressed (zlib's fastest level: lines are written as the run goes) and
written as base64 after its type ("u1:", "u2:" or "u4:"). A request whose reply came without
routing, or with routing that could not be read, keeps only why (`lacking`).
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass

import numpy as np

from records.jsonform import field

WIDTHS = {"u1": np.uint8, "u2": np.uint16, "u4": np.uint32}


def moe_shape_problem(value: str) -> str | None:
    """What is wrong with a model's LAYERSxEXPERTSxTOP_K (--moe-shape), None when nothing is."""
    parts = value.split("x") if value else []
    if value and (len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts)):
        return f"must be LAYERSxEXPERTSxTOP_K, three positive integers (48x128x8), got {value!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class RoutedRow:
    request_id: str
    warmup: bool  # scheduled during the warm-up
    sent_ms: float | None  # ms from the run's start; None: never sent
    finish_ms: float | None  # when its last message came; None: it did not end with one
    # the reply's form: "npy" (vLLM's base64 .npy), "lists" (older vLLM's [tokens][layers]
    # [top-k] ids), "base64" (SGLang's flat int32 ids); "" none came
    source: str
    lacking: str = field("", omit="")  # why the routing is missing or was not read
    layers: int = 0
    experts: int = 0  # the width of the counts: --moe-shape's, else the highest id seen + 1
    top_k: int = 0
    prompt_tokens: int = 0  # prompt tokens with routing
    output_tokens: int = 0  # output tokens with routing (vLLM's last token has none)
    prompt_counts: str = ""  # encode_counts of [layers, experts]
    output_counts: str = ""

    @property
    def read(self) -> bool:
        return bool(self.source) and not self.lacking


def encode_counts(counts: np.ndarray) -> str:
    """[layers, experts] non-negative integers as text."""
    top = int(counts.max(initial=0))
    width = "u1" if top < 2**8 else "u2" if top < 2**16 else "u4"
    size = np.dtype(WIDTHS[width]).itemsize
    planes = np.ascontiguousarray(counts).astype(f"<{width}").view(np.uint8).reshape(-1, size).T
    return f"{width}:{base64.b64encode(zlib.compress(planes.tobytes(), 1)).decode()}"


def decode_counts(text: str, layers: int, experts: int) -> np.ndarray:
    """encode_counts' text back as int64 [layers, experts]; ValueError if it is not one."""
    width, _, body = text.partition(":")
    if width not in WIDTHS:
        raise ValueError(f"counts of an unknown type {width!r}")
    try:
        raw = zlib.decompress(base64.b64decode(body, validate=True))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"counts that do not decode: {exc}") from None
    size = np.dtype(WIDTHS[width]).itemsize
    if len(raw) != layers * experts * size:
        raise ValueError(f"{len(raw) // size} counts for {layers} layers x {experts} experts")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(size, -1)
    values = np.ascontiguousarray(planes.T).view(f"<{width}").ravel()
    return values.astype(np.int64).reshape(layers, experts)


def counts_of(ids: np.ndarray, experts: int) -> np.ndarray:
    """[tokens, layers, top_k] expert ids -> [layers, experts] tokens per expert (-1, a slot
    without a routed expert, skipped)."""
    layers = ids.shape[1]
    flat = ids.transpose(1, 0, 2).reshape(layers, -1)
    keep = flat >= 0
    index = (np.arange(layers)[:, None] * experts + flat)[keep]
    return np.bincount(index, minlength=layers * experts).reshape(layers, experts)
