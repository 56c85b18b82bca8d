"""A run's report as data: what each section reads, computed once from the run directory, and
the figures it has the data for."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.diagnosis import rules
from analysis.plots.cdf import plot_latency_cdf
from analysis.plots.experts import plot_experts
from analysis.plots.sla import plot_sla
from analysis.plots.stress import plot_stress
from analysis.plots.timeline import Imbalance, Phases, plot_over_time, plot_stages
from analysis.plots.ttft_split import plot_ttft_split
from analysis.readers.latency import stats_ms
from analysis.readers.rundir import Run
from analysis.readers.samples import ServerSeries
from analysis.readers.server_metrics import ServerSide
from analysis.readers.server_stats import ServerView, server_view
from analysis.readers.timeseries import ClientSeries, client_series
from analysis.report.server import (
    EXPERTS_PNG,
    STAGES_PNG,
)
from analysis.report.sla import SLA_PNG
from analysis.routing.section import (
    ROUTING_PNG,
    RoutingReport,
    draw_routing,
    routing_report,
)
from analysis.rules.expert_parallel import EpView, ep_view
from analysis.rules.finding import Finding
from analysis.rules.spikes import signals_of
from analysis.slo_claims import (
    Claim,
    claims,
)
from analysis.ttft_split import TtftSplit, ttft_split
from records.load_settings.choices import Mode
from records.summary import Stats

LATENCY_ROWS = ("ttft", "ttft_service", "tpot", "itl", "itl_token", "e2e", "e2e_service")


REPORT_MD = "report.md"


CDF_PNG = "latency_cdf.png"


SPLIT_PNG = "ttft_split.png"


OVER_TIME_PNG = "over_time.png"


STRESS_PNG = "stress.png"


@dataclass(frozen=True)
class Report:
    run: Run
    latency: dict[str, Stats | None]  # LATENCY_ROWS name -> stats in ms, None without samples
    server: ServerView | None
    split: TtftSplit | None  # from requests.jsonl
    client: ClientSeries | None  # from the interval logs
    series: ServerSeries | None  # from server_stats.jsonl
    findings: list[Finding]  # the diagnosis rules, fired or not
    imbalance: Imbalance | None = None  # what the diagnosis judged, for the over-time figure
    ep: EpView | None = None  # the exchanges between expert-parallel ranks (--ep)
    scraped: ServerSide | None = None  # from server_metrics.jsonl
    routing: RoutingReport | None = None  # routed_experts.jsonl, the engines' expert records
    claims: list[Claim] = dataclasses.field(default_factory=list)  # the objectives, judged

    @classmethod
    def of(cls, run: Run) -> Report:
        latency = {name: stats_ms(run.histograms.get(name)) for name in LATENCY_ROWS}
        signals = signals_of(run)  # shared with the diagnosis
        view = server_view(run.summary.server)
        tokens = view.expert_tokens if view is not None else None
        run_wide = (float((tokens.max(axis=1) / tokens.mean(axis=1)).max())
                    if tokens is not None and tokens.mean() > 0 else None)
        return cls(run, latency, view, ttft_split(run.rows), client_series(run), signals.series,
                   rules(signals), Imbalance(signals.imbalance, run_wide),
                   ep_view(run.summary.server), signals.scraped, routing_report(run),
                   claims(run))


def figures(report: Report) -> dict[str, Callable[[Path], None]]:
    """PNG file name -> what draws it, for the figures this run has the data for."""
    run, drawn = report.run, {CDF_PNG: lambda path: plot_latency_cdf(report.run.histograms, path)}
    if report.split:
        drawn[SPLIT_PNG] = lambda path: plot_ttft_split(report.split, path)
    if report.client or report.series:
        config = run.summary.config
        phases = Phases(config.recording.warmup_s, run.summary.duration_s,
                        not Mode(config.traffic.mode).open_loop)
        drawn[OVER_TIME_PNG] = lambda path: plot_over_time(report.client, report.series, phases,
                                                           path, report.imbalance)
    if report.series and report.series.stage_ms:
        drawn[STAGES_PNG] = lambda path: plot_stages(report.series, path)
    if report.server and report.server.expert_tokens is not None:
        drawn[EXPERTS_PNG] = lambda path: plot_experts(report.server.expert_tokens,
                                                       report.server.active_experts_steps, path)
    if report.routing is not None and report.routing.view is not None:
        drawn[ROUTING_PNG] = lambda path: draw_routing(report.routing, path)
    stress = run.summary.stress
    if stress is not None and stress.steps:
        drawn[STRESS_PNG] = lambda path: plot_stress(stress.steps, stress.knee_rps, path)
    if (sla := run.summary.sla) is not None and sla.probes:
        drawn[SLA_PNG] = lambda path: plot_sla(sla, path)
    return drawn
