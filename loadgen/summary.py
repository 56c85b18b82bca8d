"""summary.json and histograms.json from a recorder: one process's, or several merged."""

from __future__ import annotations

import time

from loadgen.recorder import Recorder
from records.declare import flat
from records.load_settings import LoadSettings


def summarize(settings: LoadSettings, rec: Recorder, started_at: float, duration_s: float, window_s: float,
              cpu_percent: float) -> dict:
    return {
        "schema": 1,
        "run_dir": settings.recording.run_dir,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "duration_s": duration_s,  # start -> end of the schedule
        "window_s": window_s,  # measured: end of warm-up -> end of the schedule
        "config": flat(settings),
        "metrics": {f"{name}_ms": h.summary_ms() for name, h in rec.client.items()},
        "server_time_ms": {name: h.summary_ms() for name, h in rec.server.items()},
        "throughput": rec.throughput(window_s),
        "slo": rec.slo_summary(),
        "requests": rec.accounting(),
        "generator": rec.generator_health(cpu_percent, closed_loop=settings.traffic.mode == "closed"),
        "classes": rec.class_summary(),  # empty without request classes
    }


def histogram_encodings(rec: Recorder) -> dict[str, str]:
    hists = {**rec.client, **{f"server_{k}": v for k, v in rec.server.items()}}
    return {name: h.encode() for name, h in hists.items()}
