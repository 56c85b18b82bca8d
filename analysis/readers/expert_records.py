"""The engines' own expert statistics a run directory holds (expert_records/, see
docs/run-directory.md): tokens per layer and expert for each step (a forward pass, an
iteration) the engine recorded.

- sglang/: the expert distribution recorder's `stat` dumps (expert_distribution_recorder_*.pt,
  torch files): `logical_count`, [passes, layers, experts].
- trtllm/: TensorRT-LLM's EXPERT_STATISTIC_PATH: meta_info.json (num_experts,
  num_experts_per_token) and rank{N}.safetensors, one [experts] count per "{iteration}_{layer}"
  key; the ranks' counts are summed.

A file that does not read is named with why, and the rest are read."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from records.rundir import EXPERT_RECORDS

KEY = re.compile(r"^(\d+)_(\d+)$")


@dataclass
class ExpertRecords:
    engine: str  # "sglang" or "trtllm"
    steps: np.ndarray  # [steps, layers, experts] tokens
    unread: list[str] = field(default_factory=list)  # "file: why"

    def lines(self) -> list[str]:
        out = [f"{self.engine} expert statistics: unreadable {u}" for u in self.unread]
        if not self.steps.size:
            return out
        n, layers, experts = self.steps.shape
        step = "passes" if self.engine == "sglang" else "iterations"
        ran = self.steps.sum(-1) > 0  # [steps, layers]
        if not ran.any():
            out.append(f"{self.engine} expert statistics: {n} {step}, {layers} layers x "
                       f"{experts} experts, no token recorded")
            return out
        touched = (self.steps > 0).sum(-1)[ran]
        loads = self.steps.astype(float)
        mean = loads.mean(-1)[ran]
        top = loads.max(-1)[ran]
        out.append(f"{self.engine} expert statistics: {n} {step}, {layers} layers x {experts} "
                   f"experts: experts touched per step {touched.mean():.1f} a layer (of "
                   f"{experts}); hottest/mean expert per step {np.mean(top / mean):.2f}, over "
                   f"the whole record {_run_wide(self.steps):.2f}")
        return out


def _run_wide(steps: np.ndarray) -> float:
    total = steps.sum(0).astype(float)
    used = total.sum(-1) > 0
    return float((total.max(-1)[used] / total.mean(-1)[used]).mean()) if used.any() else 1.0


def read_expert_records(run_dir: Path) -> ExpertRecords | None:
    folder = Path(run_dir) / EXPERT_RECORDS
    if (folder / "sglang").is_dir():
        return read_sglang(folder / "sglang")
    if (folder / "trtllm").is_dir():
        return read_trtllm(folder / "trtllm")
    return None


def read_sglang(folder: Path) -> ExpertRecords:
    import torch  # only runs with a dump pay for the import

    parts, unread = [], []
    for path in sorted(folder.glob("*.pt")):
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            count = np.asarray(data["logical_count"], dtype=np.int64)
            if count.ndim == 2:
                count = count[None]
            if count.ndim != 3:
                raise ValueError(f"logical_count of {count.ndim} dimensions")
            parts.append(count)
        except Exception as exc:  # a file that is not a dump: named, the rest read
            unread.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:120]}")
    shapes = {p.shape[1:] for p in parts}
    if len(shapes) > 1:
        unread.append(f"dumps of different shapes {sorted(shapes)}: only the first kept")
        parts = [p for p in parts if p.shape[1:] == parts[0].shape[1:]]
    steps = np.concatenate(parts) if parts else np.zeros((0, 0, 0), np.int64)
    return ExpertRecords("sglang", steps, unread)


def read_trtllm(folder: Path) -> ExpertRecords:
    from safetensors.numpy import load_file

    unread = []
    try:
        meta = json.loads((folder / "meta_info.json").read_text())
        experts = int(meta["num_experts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return ExpertRecords("trtllm", np.zeros((0, 0, 0), np.int64),
                             [f"meta_info.json: {type(exc).__name__}: {exc}"])
    counts: dict[tuple[int, int], np.ndarray] = {}
    for path in sorted(folder.glob("rank*.safetensors")):
        try:
            for key, value in load_file(str(path)).items():
                match = KEY.match(key)
                if match is None or value.shape != (experts,):
                    raise ValueError(f"entry {key!r} of shape {value.shape}, not "
                                     f"'ITER_LAYER' of ({experts},)")
                where = (int(match[1]), int(match[2]))
                counts[where] = counts.get(where, 0) + value.astype(np.int64)
        except Exception as exc:  # as read_sglang
            unread.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:120]}")
    if not counts:
        return ExpertRecords("trtllm", np.zeros((0, 0, 0), np.int64), unread)
    iterations = sorted({i for i, _ in counts})
    layers = sorted({layer for _, layer in counts})
    steps = np.zeros((len(iterations), len(layers), experts), np.int64)
    for (i, layer), value in counts.items():
        steps[iterations.index(i), layers.index(layer)] = value
    return ExpertRecords("trtllm", steps, unread)
