"""The run directory, the interface between measuring and analysing (docs/run-directory.md):
summary.json, histograms.json (HdrHistogram encodings, microseconds), requests.jsonl."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file


def write_run_dir(run_dir: str, summary: dict, histograms: dict[str, str], rows: list[dict]) -> Path:
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / "histograms.json", histograms)
    with open(path / "requests.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    write_json(path / "summary.json", summary)  # last: its presence means the run is complete
    return path
