"""Figures over the run's time axis: client rates and latency percentiles per interval beside
the server's queue, expert imbalance and cache misses (over_time.png), and where a step's
time went, stage by stage (stages.png)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.plots.cdf import log_scale
from analysis.readers.samples import ServerSeries
from analysis.readers.timeseries import ClientSeries
from analysis.rules.experts import IMBALANCE_MAX_OVER_MEAN


@dataclass(frozen=True)
class Imbalance:
    """What the diagnosis judged of expert imbalance, drawn with the per-interval values."""

    judged: np.ndarray  # per interval, as the diagnosis reads it: nan where too few tokens
    run_wide: float | None  # the worst layer's max/mean over the whole run


def plot_over_time(client: ClientSeries | None, server: ServerSeries | None, phases: Phases,
                   path: Path, imbalance: Imbalance | None = None) -> None:
    spread = server is not None and bool(server.ep_bytes.any())  # experts over ranks (--ep)
    fig = Figure(figsize=(12, 13 if spread else 10), layout="constrained")
    axes = fig.subplots(4 if spread else 3, 2, sharex=True).ravel()
    rates, tokens, ttft, tpot, queue, experts = axes[:6]
    if spread:
        _exchanges(*axes[6:], server)
    if server is not None:
        tokens.plot(server.t_s - server.length_s / 2, server.tokens / server.length_s, "o-", ms=3,
                    color="C2", label="generated (server)")
    if client is not None:
        _client_panels(axes[:4], client, phases)
    _titles(rates, "Requests", "requests/s")
    _titles(tokens, "Output tokens", "tokens/s")
    _titles(ttft, "TTFT per interval", "ms (log scale)")
    _titles(tpot, "TPOT per interval", "ms (log scale)")
    if server is not None:
        _server_panels(queue, experts, server, imbalance)
    _titles(queue, "Server queue", "requests")
    _titles(experts, "Expert load imbalance", "max/mean")
    ends = ([float(client.start_s[-1] + client.length_s[-1])]
            if client is not None and len(client) else []) + \
        ([float(server.t_s[-1])] if server is not None else [])
    _frame(axes, phases, max(ends, default=1.0))
    for ax in (queue, experts):
        ax.set_xlabel("time since the run started (s)")
    shaded = [f"grey: {phases.warmup_s:g} s warm-up"] if phases.warmup_s > 0 else []
    shaded += ["orange: the drain after the last send"] if phases.drain_from_s is not None else []
    fig.suptitle("Over time" + (f" ({'; '.join(shaded)})" if shaded else ""))
    fig.savefig(path, dpi=90)


def _client_panels(axes, client: ClientSeries, phases: Phases) -> None:
    """Requests sent and achieved, the client's view of output tokens, TTFT and TPOT."""
    rates, tokens, ttft, tpot = axes
    t = client.mid_s
    rates.plot(t, client.offered_rps, "o-", ms=3,
               label="sent (closed loop)" if phases.closed else "offered (scheduled)")
    rates.plot(t, client.achieved_rps, "s-", ms=3, label="achieved (finished ok)")
    tokens.plot(t, client.output_tokens_per_s, ":", color="C7",
                label="in requests finishing (client)")
    for ax, p50, p99 in ((ttft, client.ttft_p50_ms, client.ttft_p99_ms),
                         (tpot, client.tpot_p50_ms, client.tpot_p99_ms)):
        ax.plot(t, p50, "o-", ms=3, label="p50")
        ax.plot(t, p99, "s-", ms=3, label="p99")
        if np.isfinite(np.concatenate([p50, p99])).any():
            log_scale(ax, "y")


def _server_panels(queue, experts, server: ServerSeries, imbalance: Imbalance | None) -> None:
    """The server's queue, its expert imbalance and, with an expert cache, its misses."""
    queue.plot(server.t_s, server.waiting, "o-", ms=3, label="waiting")
    queue.plot(server.t_s, server.running, "s-", ms=3, label="running")
    _imbalance(experts, server, imbalance)
    if server.cache_misses.any():
        misses = experts.twinx()
        misses.bar(server.t_s - server.length_s / 2, server.cache_misses / server.length_s,
                   width=server.length_s, alpha=0.3, color="C4", label="cache misses/s")
        misses.set_ylabel("expert-cache misses/s")
        experts.set_zorder(misses.get_zorder() + 1)  # the imbalance line in front of the bars
        experts.patch.set_visible(False)
        misses.legend(loc="upper right", fontsize="small")


def _frame(axes, phases: Phases, end_s: float) -> None:
    """Every panel: the warm-up and the drain shaded, the run's span, a grid, a legend or
    "no data"."""
    for ax in axes:
        if phases.warmup_s > 0:
            ax.axvspan(0, phases.warmup_s, color="grey", alpha=0.12, lw=0)
        if phases.drain_from_s is not None and phases.drain_from_s < end_s:
            ax.axvspan(phases.drain_from_s, end_s, color="C1", alpha=0.08, lw=0)
        ax.set_xlim(0, end_s)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
        elif not ax.has_data():
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _imbalance(ax, server: ServerSeries, imbalance: Imbalance | None) -> None:
    """Per interval, the worst layer's max/mean; intervals the diagnosis left out (too few
    routed tokens for a ratio to mean much) hollow; its threshold, and the whole run's figure
    the diagnosis judges."""
    values = server.imbalance
    judged = imbalance.judged if imbalance is not None else values
    sparse = np.isfinite(values) & ~np.isfinite(judged)
    ax.plot(server.t_s, judged, "o-", ms=3, color="C3",
            label="per interval (max/mean, worst layer)")
    if sparse.any():
        ax.plot(server.t_s[sparse], values[sparse], "o", ms=4, mfc="none", color="grey",
                label="too few routed tokens: left out")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(IMBALANCE_MAX_OVER_MEAN, color="C3", lw=0.8, ls="--",
               label=f"diagnosis threshold {IMBALANCE_MAX_OVER_MEAN:g}")
    if imbalance is not None and imbalance.run_wide is not None:
        ax.axhline(imbalance.run_wide, color="k", lw=1, ls="-.",
                   label=f"whole run {imbalance.run_wide:.2f} (what the diagnosis judges)")
    top = np.nanmax(values) if np.isfinite(values).any() else IMBALANCE_MAX_OVER_MEAN
    ax.set_ylim(0.9, max(top, IMBALANCE_MAX_OVER_MEAN) * 1.25)  # room for the legends


@dataclass(frozen=True)
class Phases:
    """The run's phases on its time axis, from summary.json."""

    warmup_s: float
    drain_from_s: float | None  # the schedule's end, after which in-flight requests drain
    closed: bool  # closed loop: requests were sent as earlier ones finished, not scheduled


def plot_stages(server: ServerSeries, path: Path) -> None:
    """Mean time per step of each stage, interval by interval, stacked: the top edge is the step
    time where every step is timed (a CPU); on CUDA the stages are the sampled steps' GPU work,
    under the step's wall time by what the GPU waited for the host."""
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.subplots()
    steps = np.where(server.steps > 0, server.steps, np.nan)
    timed = np.where(server.stage_steps > 0, server.stage_steps, np.nan)
    names = list(server.stage_ms)
    ax.stackplot(server.t_s, *[server.stage_ms[name] / timed for name in names], labels=names,
                 alpha=0.85)
    ax.plot(server.t_s, server.step_ms / steps, "k--", lw=1, label="step (measured)")
    _titles(ax, "Engine step time by stage", "ms per step")
    ax.set_xlabel("time since the run started (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small", ncols=4)
    fig.savefig(path, dpi=90)


def _exchanges(sent, share, server: ServerSeries) -> None:
    """The expert-parallel ranks' exchanges per interval: bytes between ranks, and the share of
    step time they took, measured and exposed (what the steps waited for)."""
    mid = server.t_s - server.length_s / 2
    sent.plot(mid, server.ep_bytes / server.length_s / 1e6, "o-", ms=3, color="C5",
              label="dispatch + combine")
    steps = np.where(server.step_ms > 0, server.step_ms, np.nan)
    share.plot(mid, server.ep_measured_ms / steps, "o-", ms=3, label="measured")
    share.plot(mid, server.ep_exposed_ms / steps, "s-", ms=3, label="exposed (waited for)")
    _titles(sent, "Bytes between expert-parallel ranks", "MB/s")
    _titles(share, "Exchange time / step time", "share")


def _titles(ax, title: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_ylabel(ylabel)
