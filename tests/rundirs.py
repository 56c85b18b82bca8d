"""Building run directories in tests from known values, in the files the load generator
writes: histograms, interval logs, GetStats samples and request rows."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

HIGHEST_US = 3_600_000_000


def histogram(values_ms) -> HdrHistogram:
    hist = HdrHistogram(1, HIGHEST_US, 3)
    for value_ms in values_ms:
        assert hist.record_value(int(value_ms * 1000))  # False would mean the value was dropped
    return hist


def encoded(values_ms) -> str:
    return histogram(values_ms).encode().decode("ascii")


def write_hlog(path: Path, intervals_ms: list, interval_s: float = 1.0, start_unix_s: float = 1.8e9) -> None:
    """One interval of `interval_s` per list of values (ms), as loadgen/intervals.py writes them."""
    with open(path, "w") as f:
        writer = HistogramLogWriter(f)
        writer.output_log_format_version()
        f.write(f"#[StartTime: {start_unix_s:.3f} (seconds since epoch)]\n")
        writer.output_base_time(start_unix_s * 1000)
        writer.base_time = start_unix_s * 1000
        writer.output_legend()
        for i, values in enumerate(intervals_ms):
            hist = histogram(values)
            hist.set_start_time_stamp(int((start_unix_s + i * interval_s) * 1000))
            hist.set_end_time_stamp(int((start_unix_s + (i + 1) * interval_s) * 1000))
            writer.output_interval_histogram(hist, max_value_unit_ratio=1000.0)


def write_samples(path: Path, snapshots: list[dict], interval_s: float = 1.0) -> None:
    """server_stats.jsonl: snapshot i taken at (i + 1) x interval_s after the run started."""
    with open(path, "w") as f:
        for i, stats in enumerate(snapshots):
            t = (i + 1) * interval_s
            f.write(json.dumps({"t_unix_s": 1.8e9 + t, "t_run_s": t, "stats": stats}) + "\n")


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def request_row(i: int, ttft_ms: float, tpot_ms: float | None, e2e_ms: float, *, sent_ms: float | None = None,
                status: str = "OK", warmup: bool = False, output_tokens: int = 32, **server_us) -> dict:
    """A requests.jsonl row; server_us sets server_queue_us, server_prefill_us, ..."""
    scheduled = 100.0 * i
    return {"request_id": f"0-{i}", "class": "", "status": status, "details": "", "warmup": warmup,
            "scheduled_ms": scheduled, "sent_ms": scheduled if sent_ms is None else sent_ms,
            "output_tokens": output_tokens, "messages": output_tokens,
            "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2e_ms": e2e_ms} | server_us


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])
