"""Per-request rows from `requests.jsonl`: one JSON object per request the generator sent
(the first --max-request-rows of them), warm-up requests flagged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.rundir import RunDirError, read_lines

REQUESTS = "requests.jsonl"


def read_rows(run_dir: Path) -> list[dict]:
    """Every row, in file order; [] when the file does not exist."""
    path = run_dir / REQUESTS
    rows = []
    for number, line in read_lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunDirError(f"{path}:{number}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise RunDirError(f"{path}:{number}: expected a JSON object per line")
        rows.append(row)
    return rows


def measured_ok(rows: list[dict]) -> list[dict]:
    """The rows the latency histograms hold: finished OK and scheduled after the warm-up."""
    return [row for row in rows if row.get("status") == "OK" and not row.get("warmup")]


def column(rows: list[dict], key: str) -> np.ndarray:
    """One field as floats, nan where a row lacks it (e.g. tpot_ms of a one-token answer)."""
    return np.asarray([np.nan if row.get(key) is None else float(row[key]) for row in rows], dtype=float)
