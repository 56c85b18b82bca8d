"""Locust master/worker runs: every worker records into its own histograms and sends an
export (encoded HDR histograms and counts) to the master, which merges them exactly (HDR
add, summed counts; percentiles are never averaged) into the run's one summary.json."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.recorder import Recorder
from loadgen.recording.rundir import write_json, write_run_dir
from loadgen.recording.summary import Span, histogram_encodings, summarize
from records.load_settings import LoadSettings
from records.rundir import WORKERS
from records.summary import ServerSnapshots, SlaResult, Summary, WorkerFigures

# worker -> master: {"worker", "export", "started_at", "duration_s", "window_s", ...}
MESSAGE = "moe_results"
STOP_MESSAGE = "moe_stop"  # master -> workers: stop sending, drain, report now
PART_GRACE_S = 15.0  # beyond --drain-s, how long the master waits for a worker's results


def worker_message(index: int, run) -> dict:
    return {"worker": index, "export": run.recorder.export(), "started_at": run.started_at,
            "duration_s": run.duration_s, "window_s": run.recorder.window_s,
            "cpu_percent": run.cpu.used_percent, "cpu_wait_percent": run.cpu.waited_percent,
            "warnings": list(run.warnings),
            "notes": list(run.notes)}


def merged_window_s(parts: list[dict], warmup_s: float) -> float:
    """The measured window of the whole run: from the earliest worker's end of warm-up to the
    latest worker's end of schedule. Workers start apart (--processes forks them one by one),
    and each counts completions inside its own window, so the run's rate is over the union of
    the windows, never their mean."""
    start = min(p["started_at"] for p in parts) + warmup_s
    end = max(p["started_at"] + p["duration_s"] for p in parts)
    return max(end - start, max(p["window_s"] for p in parts))


def merge_parts(settings: LoadSettings, parts: list[dict], expected: int,
                server: ServerSnapshots, sla: SlaResult | None = None) -> tuple[Summary, Recorder]:
    """The run's summary and merged recorder from the workers' messages."""
    merged = Recorder.for_settings(settings, 0)
    for part in parts:
        merged.absorb(part["export"])
    window_s = merged_window_s(parts, settings.recording.warmup_s)
    missing = [f"only {len(parts)} of {expected} workers reported results: the run is incomplete"] \
        if len(parts) < expected else []
    # once each, in order
    warnings = dict.fromkeys(w for p in parts for w in p.get("warnings", ()))
    notes = dict.fromkeys(note for p in parts for note in p["notes"])
    started_at = min(p["started_at"] for p in parts)
    duration_s = max(p["started_at"] + p["duration_s"] for p in parts) - started_at
    waits = [p["cpu_wait_percent"] for p in parts if p.get("cpu_wait_percent") is not None]
    cpu = GeneratorCpu(max(p["cpu_percent"] for p in parts), max(waits, default=None))
    summary = summarize(settings, merged, Span(started_at, max(duration_s, window_s), window_s),
                        cpu, (*missing, *warnings), tuple(notes))
    workers = [WorkerFigures(worker=p["worker"], sent=sum(p["export"]["statuses"].values()),
                             cpu_percent=p["cpu_percent"], window_s=p["window_s"]) for p in parts]
    return dataclasses.replace(summary, server=server, workers=workers, sla=sla), merged


def write_merged(settings: LoadSettings, parts: list[dict], expected: int,
                 server: ServerSnapshots, sla: SlaResult | None = None) -> tuple[Summary, Path]:
    """sla: the master's SLA search (--mode sla)."""
    summary, merged = merge_parts(settings, parts, expected, server, sla)
    path = write_run_dir(settings.recording.run_dir, summary, histogram_encodings(merged),
                         merged.rows)
    # Each worker's own histograms and counts, so anyone can check the merge.
    write_json(path / WORKERS, [{k: v for k, v in p["export"].items() if k != "rows"}
                                | {"worker": p["worker"]} for p in parts])
    return summary, path
