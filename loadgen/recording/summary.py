"""summary.json and histograms.json from a recorder: one process's, or several merged."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.health import generator_health
from loadgen.recording.recorder import Recorder
from records.load_settings import LoadSettings
from records.load_settings.choices import Mode
from records.summary import Summary


@dataclass(frozen=True)
class Span:
    """When the run went: its start (epoch s), how long it ran, and the measured window after
    its warm-up."""

    started_at: float
    duration_s: float
    window_s: float


def summarize(settings: LoadSettings, rec: Recorder, span: Span, cpu: GeneratorCpu,
              warnings: tuple[str, ...] = (), notes: tuple[str, ...] = ()) -> Summary:
    """The run's summary, without the server's snapshots, stress steps or workers (added by whoever
    has them); warnings: the caller's, after the recorder's own; notes: what the figures rest
    on (information, not a warning)."""
    window_s = span.window_s
    generator = generator_health(rec, cpu, closed_loop=not Mode(settings.traffic.mode).open_loop,
                                 client=settings.client)
    reasoning = rec.reasoning()
    if reasoning is not None and reasoning.no_answer:
        warnings = (*warnings, f"{reasoning.no_answer} of {reasoning.requests} requests that "
                    "reasoned spent every token asked (--max-tokens "
                    f"{settings.workload.max_tokens}) on reasoning, before any answer: their "
                    "TTFT and TPOT are the reasoning's; raise --max-tokens to measure answers")
    return Summary(
        run_dir=settings.recording.run_dir,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(span.started_at)),
        duration_s=span.duration_s,
        window_s=window_s,
        config=settings,
        metrics={f"{name}_ms": h.stats() for name, h in rec.client.items()},
        server_time_ms={name: h.stats() for name, h in rec.server.items()},
        throughput=rec.throughput(window_s),
        slo=rec.slo_shares(),
        requests=rec.accounting(),
        generator=dataclasses.replace(generator, warnings=[*generator.warnings, *warnings],
                                      notes=list(notes)),
        classes=rec.class_figures(),
        reasoning=reasoning,
        sessions=rec.sessions(),
    )


def histogram_encodings(rec: Recorder) -> dict[str, str]:
    hists = {**rec.client, **{f"server_{k}": v for k, v in rec.server.items()}}
    return {name: h.encode() for name, h in hists.items()}
