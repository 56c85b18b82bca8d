"""Figures over the run's time axis: client rates and latency percentiles per interval beside
the server's queue, expert imbalance and cache misses (over_time.png), and where a step's
time went, stage by stage (stages.png)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.plot import log_scale
from analysis.samples import ServerSeries
from analysis.timeseries import ClientSeries


def plot_over_time(client: ClientSeries | None, server: ServerSeries | None, warmup_s: float, path: Path) -> None:
    fig = Figure(figsize=(12, 10), layout="constrained")
    axes = fig.subplots(3, 2, sharex=True).ravel()
    rates, tokens, ttft, tpot, queue, experts = axes
    if client is not None:
        t = client.mid_s
        rates.plot(t, client.offered_rps, "o-", ms=3, label="offered (scheduled)")
        rates.plot(t, client.achieved_rps, "s-", ms=3, label="achieved (finished ok)")
        tokens.plot(t, client.output_tokens_per_s, "o-", ms=3, color="C2", label="output tokens")
        for ax, p50, p99 in ((ttft, client.ttft_p50_ms, client.ttft_p99_ms), (tpot, client.tpot_p50_ms,
                                                                              client.tpot_p99_ms)):
            ax.plot(t, p50, "o-", ms=3, label="p50")
            ax.plot(t, p99, "s-", ms=3, label="p99")
            if np.isfinite(np.concatenate([p50, p99])).any():
                log_scale(ax, "y")
    _titles(rates, "Requests", "requests/s")
    _titles(tokens, "Output tokens", "tokens/s")
    _titles(ttft, "TTFT per interval", "ms (log scale)")
    _titles(tpot, "TPOT per interval", "ms (log scale)")
    if server is not None:
        queue.plot(server.t_s, server.waiting, "o-", ms=3, label="waiting")
        queue.plot(server.t_s, server.running, "s-", ms=3, label="running")
        experts.plot(server.t_s, server.imbalance, "o-", ms=3, color="C3", label="imbalance (max/mean, worst layer)")
        experts.axhline(1.0, color="grey", lw=0.8, ls=":")
        if server.cache_misses.any():
            misses = experts.twinx()
            misses.bar(server.t_s - server.length_s / 2, server.cache_misses / server.length_s, width=server.length_s,
                       alpha=0.3, color="C4", label="cache misses/s")
            misses.set_ylabel("expert-cache misses/s")
            misses.legend(loc="upper right", fontsize="small")
    _titles(queue, "Server queue", "requests")
    _titles(experts, "Expert load imbalance", "max/mean")
    for ax in axes:
        if warmup_s > 0:
            ax.axvspan(0, warmup_s, color="grey", alpha=0.12, lw=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
        elif not ax.has_data():
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in (queue, experts):
        ax.set_xlabel("time since the run started (s)")
    fig.suptitle("Over time" + (f" (grey: {warmup_s:g} s warm-up)" if warmup_s > 0 else ""))
    fig.savefig(path, dpi=90)


def plot_stages(server: ServerSeries, path: Path) -> None:
    """Mean time per step of each stage, interval by interval, stacked: the top edge is the step time."""
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.subplots()
    steps = np.where(server.steps > 0, server.steps, np.nan)
    names = list(server.stage_ms)
    ax.stackplot(server.t_s, *[server.stage_ms[name] / steps for name in names], labels=names, alpha=0.85)
    ax.plot(server.t_s, server.step_ms / steps, "k--", lw=1, label="step (measured)")
    _titles(ax, "Engine step time by stage", "ms per step")
    ax.set_xlabel("time since the run started (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", ncols=4)
    fig.savefig(path, dpi=90)


def _titles(ax, title: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_ylabel(ylabel)
