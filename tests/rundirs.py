"""Building run directories in tests from known values, in the files the load generator
writes: summary.json (complete, from its record, with the sections a test cares about laid
over it), histograms, interval logs, GetStats samples and request rows."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogWriter

from records.declare import build
from records.jsonform import from_json, to_json
from records.load_settings import LoadSettings
from records.requests import RequestRow
from records.server_stats import ServerSample
from records.summary import Accounting, Generator, ServerSnapshots, SloShares, Summary, Throughput

HIGHEST_US = 3_600_000_000


def summary_json(**sections) -> dict:
    """A complete summary.json of a quiet 25 s fixed-rate run, as JSON, with the given top-level
    sections (JSON) over it; `config` is laid over the defaults key by key."""
    base = to_json(Summary(
        run_dir="run", started_at="2026-11-30T14:00:00Z", duration_s=30.2, window_s=25.0,
        config=build(LoadSettings, {"host": "127.0.0.1:50051"}), metrics={}, server_time_ms={},
        throughput=Throughput(window_s=25.0, output_tokens_per_s=0.0, requests_per_s=0.0,
                              goodput_requests_per_s=0.0),
        slo=SloShares(objectives_ms={}, requests=0, met_share={"all": None}),
        requests=Accounting(sent=0, ok=0, failed=0, not_sent=0, failed_by_code={}, warmup=0),
        generator=Generator(late_sends=0, late_threshold_ms=5.0, cpu_percent=3.0, warnings=[]),
        classes={}))
    return base | sections | {"config": base["config"] | sections.get("config", {})}


def snapshots(start: dict | None, end: dict | None) -> ServerSnapshots:
    """summary.json's server section from GetStats snapshots given as JSON (checked as it is
    read)."""
    given = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    return from_json(ServerSnapshots, given, "test:")


def samples(snapshots: list[dict], interval_s: float = 1.0) -> list[ServerSample]:
    """server_stats.jsonl's records of these GetStats snapshots (JSON, checked as read), snapshot i
    at (i + 1) x interval_s, as write_samples places them."""
    return [from_json(ServerSample, {"t_unix_s": 1.8e9 + (i + 1) * interval_s,
                                     "t_run_s": (i + 1) * interval_s, "stats": stats}, "test:")
            for i, stats in enumerate(snapshots)]


def step_row(**fields) -> dict:
    """A stress step as summary.json holds it, the fields a test does not give at neutral values."""
    return {"step": 0, "offered_rps": 1.0, "sent_rps": 1.0, "achieved_rps": 1.0,
            "output_tokens_per_s": 10.0, "goodput_rps": 1.0, "ttft_p50_ms": 20.0,
            "ttft_p99_ms": 40.0, "tpot_p50_ms": 10.0, "tpot_p99_ms": 15.0,
            "in_flight_slope_per_s": 0.0, "saturated": ""} | fields


def write_summary(run_dir: Path, **sections) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary_json(**sections)))


def histogram(values_ms) -> HdrHistogram:
    hist = HdrHistogram(1, HIGHEST_US, 3)
    for value_ms in values_ms:
        assert hist.record_value(int(value_ms * 1000))  # False would mean the value was dropped
    return hist


def encoded(values_ms) -> str:
    return histogram(values_ms).encode().decode("ascii")


def write_hlog(path: Path, intervals_ms: list, interval_s: float = 1.0,
               start_unix_s: float = 1.8e9) -> None:
    """One interval of `interval_s` per list of values (ms), as the load generator writes them
    (loadgen/recording/intervals.py)."""
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


def request_row(i: int, ttft_ms: float, tpot_ms: float | None, e2e_ms: float, *,
                sent_ms: float | None = None, status: str = "OK", warmup: bool = False,
                output_tokens: int = 32, **server_us) -> dict:
    """A requests.jsonl row; server_us sets server_queue_us, server_prefill_us, ..."""
    scheduled = 100.0 * i
    return {"request_id": f"0-{i}", "class": "", "status": status, "details": "", "warmup": warmup,
            "scheduled_ms": scheduled, "sent_ms": scheduled if sent_ms is None else sent_ms,
            "output_tokens": output_tokens, "messages": output_tokens,
            "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2e_ms": e2e_ms} | server_us


def rows_of(rows: list[dict]) -> list[RequestRow]:
    """requests.jsonl rows given as JSON, as the analysis reads them."""
    return [from_json(RequestRow, row, "test:") for row in rows]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])
