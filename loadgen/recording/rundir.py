"""Writing the run directory (docs/run-directory.md, records/rundir.py): summary.json,
histograms.json (HdrHistogram encodings, microseconds), requests.jsonl, from their records."""

from __future__ import annotations

import os
from pathlib import Path

from records.jsonform import dumps, to_json
from records.requests import RequestRow
from records.rundir import HISTOGRAMS, REQUESTS, SUMMARY
from records.summary import Summary


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(to_json(data), indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file


def write_run_dir(run_dir: str, summary: Summary, histograms: dict[str, str],
                  rows: list[RequestRow]) -> Path:
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    write_json(path / HISTOGRAMS, histograms)
    with open(path / REQUESTS, "w") as f:
        for row in rows:
            f.write(dumps(to_json(row)) + "\n")
    write_json(path / SUMMARY, summary)  # last: its presence means the run is complete
    return path
