"""A run's routed experts (routed_experts.jsonl, records/expert_routes.py; a distributed run's
workers' files too), decoded into arrays: per request, per layer, the tokens each expert took.

The requests kept are those whose routing was read and whose shape is the run's (the layer
count and top-k most requests reported; the width, the most experts any of them did): a reply
that changed its layer count mid-run is left out and counted, never stretched to fit. Every
request left out is counted under its reason."""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from records.expert_routes import RoutedRow, decode_counts
from records.jsonform import RecordError, from_json
from records.rundir import ROUTED


@dataclass
class Routing:
    layers: int
    experts: int
    top_k: int
    rows: list[RoutedRow]  # the requests read, in the order they finished
    # [requests, layers, experts] int32 (10,000 requests of a 48-layer model of 128 experts:
    # 250 MB each)
    prompt: np.ndarray  # prompt tokens per expert
    output: np.ndarray  # output tokens per expert
    lacking: collections.Counter = field(default_factory=collections.Counter)  # reason -> n

    @property
    def requests(self) -> int:
        return len(self.rows)

    def load(self, requests: np.ndarray) -> np.ndarray:
        """[layers, experts]: the tokens (prompt and output) of these requests."""
        return (self.prompt[requests].sum(0, dtype=np.int64)
                + self.output[requests].sum(0, dtype=np.int64))

    def measured(self) -> np.ndarray:
        """The indexes of the requests scheduled after the warm-up."""
        return np.asarray([i for i, r in enumerate(self.rows) if not r.warmup], dtype=int)


def routing_files(run_dir: Path) -> list[Path]:
    return [p for p in [run_dir / ROUTED, *sorted(run_dir.glob(f"worker-*/{ROUTED}"))]
            if p.exists()]


def read_routing(run_dir: Path) -> Routing | None:
    """None when the run did not capture routing (no routed_experts.jsonl)."""
    files = routing_files(Path(run_dir))
    if not files:
        return None
    rows, lacking = [], collections.Counter()
    for file in files:
        for number, line in enumerate(file.read_text().splitlines(), 1):
            try:
                row = from_json(RoutedRow, json.loads(line), f"{file.name}:{number}")
            except (ValueError, RecordError) as exc:
                lacking[f"unreadable line: {str(exc)[:120]}"] += 1
                continue
            if row.read:
                rows.append(row)
            else:
                lacking[row.lacking or "no routing"] += 1
    shapes = collections.Counter((r.layers, r.top_k) for r in rows)
    if not shapes:
        return Routing(0, 0, 0, [], np.zeros((0, 0, 0)), np.zeros((0, 0, 0)), lacking)
    (layers, top_k), _ = shapes.most_common(1)[0]
    for (other_layers, other_k), n in shapes.items():
        if (other_layers, other_k) != (layers, top_k):
            lacking[f"{other_layers} layers top-{other_k}, not the run's {layers} layers "
                    f"top-{top_k}"] += n
    rows = [r for r in rows if (r.layers, r.top_k) == (layers, top_k)]
    rows.sort(key=lambda r: r.finish_ms if r.finish_ms is not None else float("inf"))
    experts = max(r.experts for r in rows)
    kept, prompt, output = [], [], []
    for r in rows:
        try:
            p = _counts(r.prompt_counts, layers, r.experts, experts)
            o = _counts(r.output_counts, layers, r.experts, experts)
        except ValueError as exc:
            lacking[f"counts unreadable: {exc}"] += 1
            continue
        kept.append(r)
        prompt.append(p)
        output.append(o)
    return Routing(layers, experts, top_k, kept, np.asarray(prompt, dtype=np.int32),
                   np.asarray(output, dtype=np.int32), lacking)


def _counts(text: str, layers: int, width: int, experts: int) -> np.ndarray:
    out = np.zeros((layers, experts), dtype=np.int32)
    if text:
        out[:, :width] = decode_counts(text, layers, width)
    return out
