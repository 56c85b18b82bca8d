"""Trace replay (--trace FILE): the requests of a production trace, each at its time with its
prompt and output lengths, in the public formats (docs/workloads.md):

- Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (a block of
  --trace-block-tokens tokens each; equal ids are equal blocks, so the trace's prefix sharing
  reaches the server);
- BurstGPT CSV: `Timestamp` (s), `Request tokens`, `Response tokens` (a row with 0 response
  tokens is a failure in the trace: skipped and counted);
- Azure LLM inference CSV: `TIMESTAMP` (a date-time), `ContextTokens`, `GeneratedTokens`;
- our JSONL: `t_s`, `prompt_tokens` or `prompt` (text), `max_tokens`, optional `session`.

The format is told from the first line (--trace-format names it instead). Times start at 0 at
the first request; requests out of time order are sorted, and the run says how many. A slice
(--trace-start-s, --trace-window-s) and --trace-speedup reshape the times; --trace-loop repeats
the slice for soaks longer than the trace. Distributed runs split the requests across workers
by index, each keeping its time.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from records.load_settings import TrafficSettings
from records.load_settings.choices import TRACE_FORMATS


@dataclass(frozen=True)
class TraceRequest:
    t_s: float  # send time, seconds after the trace's first request
    prompt_tokens: int
    max_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake's prompt blocks
    prompt: str = ""  # our JSONL's text prompt
    session: str = ""


@dataclass(frozen=True)
class Trace:
    path: str
    format: str
    requests: tuple[TraceRequest, ...]
    skipped: int  # rows the trace itself marks failed (BurstGPT's 0 response tokens)
    unsorted: int  # requests found out of time order, sorted

    @property
    def notes(self) -> tuple[str, ...]:
        """What the run's summary says of the trace."""
        notes = [f"trace {self.path} ({self.format}): {len(self.requests)} requests"]
        if self.skipped:
            notes.append(f"trace: {self.skipped} rows with no output (failed in the trace) "
                         "skipped")
        if self.unsorted:
            notes.append(f"trace: {self.unsorted} requests were out of time order, sorted")
        return tuple(notes)


def _detect(path: str, first: str) -> str:
    if first.startswith("{"):
        try:
            keys = json.loads(first)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:1: not JSON") from None
        if "input_length" in keys or "hash_ids" in keys:
            return "mooncake"
        if "t_s" in keys:
            return "jsonl"
    if "Request tokens" in first and "Response tokens" in first:
        return "burstgpt"
    if "ContextTokens" in first and "GeneratedTokens" in first:
        return "azure"
    raise ValueError(f"{path}: unknown trace format (line 1: {first[:60]!r}); give "
                     f"--trace-format, one of {', '.join(TRACE_FORMATS[1:])}")


def _count(value, what: str, where: str, low: int = 0) -> int:
    try:
        n = int(float(value))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {what} {value!r} is not a number of tokens") from None
    if n < low:
        raise ValueError(f"{where}: {what} must be at least {low}, got {n}")
    return n


def _time(value, where: str, scale: float = 1.0) -> float:
    try:
        t = float(value) * scale
    except (TypeError, ValueError):
        raise ValueError(f"{where}: time {value!r} is not a number") from None
    if t < 0:
        raise ValueError(f"{where}: time {value!r} is negative")
    return t


def _azure_time(value: str, where: str) -> float:
    """'2023-11-16 18:15:46.6805900' (7 fractional digits: Python takes 6) as seconds."""
    text = value.strip()
    head, dot, frac = text.partition(".")
    try:
        moment = datetime.fromisoformat(head + (dot + frac[:6] if dot else ""))
    except ValueError:
        raise ValueError(f"{where}: TIMESTAMP {value!r} is not a date-time") from None
    return moment.timestamp()


def _json_rows(path: str, lines: list[str], fmt: str):
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: not JSON") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object")
        if fmt == "mooncake":
            for key in ("timestamp", "input_length", "output_length"):
                if key not in row:
                    raise ValueError(f"{where}: no {key!r}")
            hash_ids = row.get("hash_ids") or []
            if not isinstance(hash_ids, list):
                raise ValueError(f"{where}: hash_ids must be a list")
            yield (_time(row["timestamp"], where, 1e-3),
                   _count(row["input_length"], "input_length", where, 1),
                   _count(row["output_length"], "output_length", where),
                   tuple(_count(h, "a hash id", where) for h in hash_ids), "", "")
        else:
            for key in ("t_s", "max_tokens"):
                if key not in row:
                    raise ValueError(f"{where}: no {key!r}")
            prompt = row.get("prompt", "")
            if not isinstance(prompt, str):
                raise ValueError(f"{where}: prompt must be text")
            tokens = (len(prompt.split()) if prompt
                      else _count(row.get("prompt_tokens"), "prompt_tokens", where, 1))
            yield (_time(row["t_s"], where), tokens, _count(row["max_tokens"], "max_tokens",
                                                            where),
                   (), prompt, str(row.get("session", "")))


def _csv_rows(path: str, lines: list[str], fmt: str):
    columns = {"burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
               "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}[fmt]
    reader = csv.DictReader(lines)
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}:1: no column {missing[0]!r} (a {fmt} trace has "
                         f"{', '.join(columns)})")
    for n, row in enumerate(reader, 2):
        where = f"{path}:{n}"
        t, prompt, output = (row[c] for c in columns)
        if t is None or prompt is None or output is None:
            raise ValueError(f"{where}: too few columns")
        seconds = _azure_time(t, where) if fmt == "azure" else _time(t, where)
        yield (seconds, _count(prompt, columns[1], where),
               _count(output, columns[2], where), (), "", "")


@lru_cache(maxsize=8)
def _read(path: str, fmt: str, mtime_ns: int, size: int) -> Trace:
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read trace {path}: {e}") from None
    first = next((line for line in lines if line.strip()), "")
    if not first:
        raise ValueError(f"trace {path} is empty")
    fmt = _detect(path, first.strip()) if fmt == "auto" else fmt
    rows = (_json_rows if fmt in ("mooncake", "jsonl") else _csv_rows)(path, lines, fmt)
    kept, skipped = [], 0
    for t, prompt, output, hash_ids, text, session in rows:
        if output == 0 or prompt == 0:  # failed in the trace (BurstGPT marks them so)
            skipped += 1
            continue
        kept.append(TraceRequest(t, prompt, output, hash_ids, text, session))
    if not kept:
        raise ValueError(f"trace {path} has no request with output to replay")
    unsorted = sum(b.t_s < a.t_s for a, b in itertools.pairwise(kept))
    kept.sort(key=lambda r: r.t_s)
    start = kept[0].t_s
    requests = tuple(TraceRequest(r.t_s - start, r.prompt_tokens, r.max_tokens, r.hash_ids,
                                  r.prompt, r.session) for r in kept)
    return Trace(path, fmt, requests, skipped, unsorted)


def read_trace_file(path: str, fmt: str = "auto") -> Trace:
    """The trace, parsed once per file version; ValueError names the file (and the line)."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot read trace {path}: {e.strerror}") from None
    return _read(path, fmt, stat.st_mtime_ns, stat.st_size)


def replayed(traffic: TrafficSettings) -> tuple[TraceRequest, ...]:
    """The slice the run replays, its times from 0 and divided by --trace-speedup."""
    trace = read_trace_file(traffic.trace, traffic.trace_format)
    start, window = traffic.trace_start_s, traffic.trace_window_s
    kept = [r for r in trace.requests
            if r.t_s >= start and (not window or r.t_s < start + window)]
    if not kept:
        raise ValueError(f"--trace-start-s {start:g} / --trace-window-s {window:g}: no request "
                         f"of {traffic.trace} falls in that slice (it spans "
                         f"{trace.requests[-1].t_s:.1f} s)")
    first = kept[0].t_s
    return tuple(TraceRequest((r.t_s - first) / traffic.trace_speedup, r.prompt_tokens,
                              r.max_tokens, r.hash_ids, r.prompt, r.session) for r in kept)


def trace_arrivals(traffic: TrafficSettings, workers: int = 1,
                   index: int = 0) -> Iterator[tuple[int, float]]:
    """This process's share, as (run-wide request index, send time s): the slice once, or with
    --trace-loop again and again, each pass one mean gap after the last."""
    requests = replayed(traffic)
    n = len(requests)
    span = requests[-1].t_s
    period = span + (span / (n - 1) if n > 1 else 1.0)
    passes = itertools.count() if traffic.trace_loop else range(1)
    for k in passes:
        for i in range(n):
            run_index = k * n + i
            if run_index % workers == index:
                yield run_index, k * period + requests[i].t_s
