"""Columns of requests.jsonl's rows (records/requests.py) for numpy."""

from __future__ import annotations

import numpy as np

from records.requests import RequestRow


def measured_ok(rows: list[RequestRow]) -> list[RequestRow]:
    """The rows the latency histograms hold: finished OK and scheduled after the warm-up."""
    return [row for row in rows if row.measured_ok]


def column(rows: list[RequestRow], name: str) -> np.ndarray:
    """One field as floats, nan where a row has none (e.g. tpot_ms of a one-token answer)."""
    return np.asarray([np.nan if (v := getattr(row, name)) is None else float(v) for row in rows],
                      dtype=float)
