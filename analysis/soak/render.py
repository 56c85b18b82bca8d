"""The soak's words and figures: the table, each series' sentence, soak.md, soak.png, the
accounting of the run's requests and the headline JSON."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from analysis.readers.files import RunDirError
from analysis.readers.rundir import load_run
from analysis.slo_claims import runs_lines
from analysis.soak.series import CANNOT_JUDGE, NO_DATA, Series, Windows
from analysis.soak.trend import MIN_WINDOWS, S_PER_H, Horizon, Judging, Trend
from analysis.tables import fmt_ms, markdown_table, text_table

SOAK_MD, SOAK_PNG = "soak.md", "soak.png"
# soak.png draws these from 0, where an empty queue sits. The others (RSS ~1.3 GB, latencies)
# would be flattened by a 0 baseline: their axes fit the data, but never narrower than
# --min-change of the level, so a change at the drift bar fills the axis and noise far under it
# stays flat.
FROM_ZERO = ("waiting", "scraped_waiting", "kv_usage_percent", "preemptions_per_min")
MOST_TELLING_SHARE = 10.0  # a projected rise past 1000% of the start is said in its unit only


def header(horizon: Horizon) -> list[str]:
    return ["series", "windows", "start", "end", "change", "slope /h", "95% CI /h",
            f"over {horizon.hours:g} h [95% CI]", "budget", "verdict"]


def _cells(s: Series, windows: Windows) -> list[str]:
    used = f"{len(s.values)}/{windows.count}"
    if s.trend is None:
        return [f"{s.title} ({s.unit})", used, "-", "-", "-", "-", "-", "-", "-", s.verdict]
    tr = s.trend
    share = "" if tr.change_share is None else f" ({100 * tr.change_share:+.1f}%)"
    lo, hi = (S_PER_H * v for v in tr.ci_per_s)
    return [f"{s.title} ({s.unit})", used, fmt_ms(tr.start), fmt_ms(tr.end),
            f"{fmt_ms(tr.change, '+')}{share}", fmt_ms(S_PER_H * tr.slope_per_s, "+"),
            f"[{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]", _projection(tr),
            "-" if tr.budget is None else f"{tr.budget:g}", s.verdict]


def _projection(tr: Trend) -> str:
    lo, hi = tr.projected_ci
    return f"{fmt_ms(tr.projected, '+')} [{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]"


def _horizon_words(s: Series) -> str:
    """What the slope amounts to over the horizon, beside the start and the budget."""
    tr = s.trend
    hours = f"{tr.horizon_s / S_PER_H:g} h"
    # a share of a start near 0 (a queue that was empty), or of a line held at 0, says nothing
    telling = (tr.projected_share is not None and not tr.below_zero
               and abs(tr.projected_share) <= MOST_TELLING_SHARE)
    share = f", {100 * tr.projected_share:+.0f}% of the start" if telling else ""
    words = f"over {hours}: {_projection(tr)} {s.unit}{share}"
    if tr.budget is None:
        return words
    budget = f"the {tr.budget:g} {s.unit} budget"
    if tr.over_budget:
        return (f"{words}: past {budget} within {hours} even at the CI's slow end (after "
                f"{fmt_ms(tr.hours_to_budget)} h)")
    if tr.projected_ci[1] > tr.budget:
        return f"{words}: within {budget} at the CI's slow end, not at its fast end"
    return f"{words}: within {budget}"


def sentence(s: Series, min_change: float) -> str:
    """The verdict in words people use: how fast, per hour and over the run."""
    if s.trend is None:
        reason = (f"{s.source} missing or without it" if s.verdict == NO_DATA
                  else f"fewer than {MIN_WINDOWS} usable windows"
                  + (f"; {s.skipped} had too few requests: use a larger --window-s or a smaller "
                     "--min-samples" if s.skipped else "")
                  + (f"; {s.excluded} left out ({s.note}): soak longer" if s.excluded else ""))
        return f"{s.title}: {s.verdict} ({reason})"
    tr = s.trend
    lo, hi = (S_PER_H * v for v in tr.ci_per_s)
    rate = (f"{fmt_ms(S_PER_H * tr.slope_per_s, '+')} {s.unit}/h "
            f"[{fmt_ms(lo, '+')}, {fmt_ms(hi, '+')}]")
    minutes = (s.t_s[-1] - s.t_s[0]) / 60
    over = ("" if tr.change_share is None
            else f", {100 * tr.change_share:+.1f}% over the run ({minutes:.0f} min measured)")
    if tr.below_zero:
        over += ("; the fitted line falls below 0, held at 0: a straight line does not describe "
                 "this series (see soak.png)")
    ahead = _horizon_words(s)
    if tr.undecided:
        longer = ("; its fitted slope alone reaches past the budget: a longer soak would tell"
                  if tr.longer_by is None else
                  f"; a soak about {tr.longer_by:.1f} times as long ({tr.longer_by * minutes:.0f} "
                  "min), were the fitted slope to hold, would tell")
        return (f"{s.title}: {CANNOT_JUDGE} ({rate}{over}; {ahead}: the interval cannot tell "
                f"drift from none against the budget{longer})")
    if tr.drift:
        return (f"{s.title}: drift, {'rising' if tr.slope_per_s > 0 else 'falling'} {rate}"
                f"{over}; {ahead}")
    if not tr.significant:
        return f"{s.title}: no drift ({rate}{over}; the slope's 95% CI includes 0; {ahead})"
    return (f"{s.title}: no drift ({rate}{over}; a real slope, but under "
            f"{100 * min_change:g}% of the starting level over the run; {ahead})")


def render_text(run_dir: Path, windows: Windows, series: list[Series], judging: Judging,
                accounted: str | None = None) -> str:
    min_samples, min_change, horizon = judging.min_samples, judging.min_change, judging.horizon
    rows = [_cells(s, windows) for s in series]
    lines = [f"soak {run_dir}: {windows.count} windows of {windows.window_s:g} s from "
             f"{windows.start_s:g} s to {windows.end_s:.0f} s; projected over {horizon.hours:g} h",
             text_table(header(horizon), rows)]
    lines += [sentence(s, min_change) for s in series]
    lines += [f"{s.title}: {s.skipped} windows skipped ({_skip_reason(s, min_samples)})"
              for s in series if s.skipped]
    lines += [f"{s.title}: {s.excluded} windows left out ({s.note})" for s in series
              if s.note]
    if accounted is not None:
        lines.append(accounted)
    return "\n".join(lines)


def _skip_reason(s: Series, min_samples: int) -> str:
    return f"fewer than {min_samples} requests" if s.unit == "ms" else "no samples"


def render_markdown(run_dir: Path, windows: Windows, series: list[Series], judging: Judging,
                    accounted: str | None = None) -> str:
    min_samples, min_change, horizon = judging.min_samples, judging.min_change, judging.horizon
    rows = [_cells(s, windows) for s in series]
    parts = [f"# Soak: {run_dir.resolve().name}",
             f"{windows.count} windows of {windows.window_s:g} s, from {windows.start_s:g} s "
             f"(after the warm-up) to {windows.end_s:.0f} s into the run; each slope projected "
             f"over a {horizon.hours:g} h horizon.",
             markdown_table(header(horizon), rows),
             "\n".join(f"- {sentence(s, min_change)}" for s in series)]
    if skipped := [s for s in series if s.skipped]:
        parts.append("\n".join(f"- {s.title}: {s.skipped} windows skipped "
                               f"({_skip_reason(s, min_samples)})" for s in skipped))
    if excluded := [s for s in series if s.note]:
        parts.append("\n".join(f"- {s.title}: {s.excluded} windows left out ({s.note})"
                                for s in excluded))
    if accounted is not None:
        parts.append(accounted)
    budgets = ", ".join(f"{v:g} {unit}" for unit, v in horizon.budgets.items())
    parts += [f"Method: per window, p99 of the interval histograms added together (HDR add) for "
              f"TTFT and TPOT, the mean of the GetStats samples for RSS and queue depth. Ordinary "
              f"least squares of each series on time (window centres for latency, the samples' "
              f"mean time for RSS and queue depth); 95% CI of the slope from Student's t with "
              f"n - 2 degrees of freedom. Drift: the CI excludes 0 and the fitted change exceeds "
              f"{100 * min_change:g}% of the fitted starting level (of the series mean where that "
              f"start is not above 0), or the CI's slow end continued for {horizon.hours:g} h "
              f"rises past the budget ({budgets}). A straight line is an assumption: a leak "
              f"that levels off projects too high, one that accelerates too low. Windows are "
              f"not independent (a slow server stays slow), so treat a borderline CI with care.",
              f"![soak]({SOAK_PNG})"]
    return "\n\n".join(parts) + "\n"


def plot_soak(series: list[Series], windows: Windows, path: Path, min_change: float) -> None:
    soak_figure(series, windows, min_change).savefig(path, dpi=100)


def soak_figure(series: list[Series], windows: Windows, min_change: float) -> Figure:
    """One panel per series, in order: its windows' values and the fitted trend."""
    minutes = windows.end_s >= 600
    scale, unit = (60.0, "min") if minutes else (1.0, "s")
    rows = math.ceil(len(series) / 2)
    fig = Figure(figsize=(11, 3.75 * rows), layout="constrained")
    axes = list(fig.subplots(rows, 2).flat)
    for ax in axes[len(series):]:
        ax.remove()
    for ax, s in zip(axes, series, strict=False):
        ax.set_title(f"{s.title}: {s.verdict}")
        ax.set_xlabel(f"time into the run ({unit})")
        ax.set_ylabel(f"{s.title} ({s.unit})")
        ax.grid(True, alpha=0.3)
        ax.set_xlim(windows.start_s / scale, windows.end_s / scale)
        if not len(s.values):
            ax.text(0.5, 0.5, s.verdict, ha="center", va="center", transform=ax.transAxes)
            continue
        ax.plot(s.t_s / scale, s.values, "o", label=f"per {windows.window_s:g} s window")
        if s.trend is not None:
            ends = np.asarray([s.t_s[0], s.t_s[-1]])
            rate = f"{fmt_ms(S_PER_H * s.trend.slope_per_s, '+')} {s.unit}/h"
            share = ("" if s.trend.change_share is None
                     else f", {100 * s.trend.change_share:+.1f}% over the run")
            ax.plot(ends / scale, [s.trend.start, s.trend.end], "--",
                    color="C3" if s.trend.drift else "C2", label=f"OLS trend {rate}{share}")
        if s.key in FROM_ZERO:
            ax.set_ylim(bottom=0)
        else:
            _widen(ax, s, min_change)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle("Soak: drift over the run")
    return fig


def _widen(ax, s: Series, min_change: float) -> None:
    """The autoscaled axis (points and trend), widened about its middle to min_change of the
    level."""
    low, high = ax.get_ylim()
    level = (s.trend.reference if s.trend is not None and s.trend.reference
             else float(np.abs(s.values).mean()))
    if high - low < min_change * level:
        middle, half = (low + high) / 2, min_change * level / 2
        ax.set_ylim(max(middle - half, 0.0) if low >= 0 else middle - half, middle + half)
    ax.ticklabel_format(axis="y", useOffset=False)  # 1342 MB, not +1.342e3 and offsets


def accounting(summary) -> tuple[bool, str] | None:
    """Whether every request the run scheduled ends in one place (summary.json's requests), and
    the sentence that says so; None while the run has no summary."""
    if summary is None:
        return None
    r = summary.requests
    closed = r.sent == r.ok + r.failed + r.cancelled
    codes = ", ".join(f"{code} {n}" for code, n in r.failed_by_code.items())
    told = (f"sent {r.sent} = ok {r.ok} + failed {r.failed}{f' ({codes})' if codes else ''}"
            f" + cancelled by the client {r.cancelled}; not sent {r.not_sent}")
    return closed, (f"requests: every one accounted for: {told}" if closed
                    else f"requests: NOT all accounted for: {told}")


def objectives(run_dir: Path) -> list[str]:
    """The objectives' verdict over the whole run (analysis/slo_claims.py), once it has ended
    and its files are whole; [] otherwise."""
    try:
        return [f"objectives: {line}" for line in runs_lines(["the run"], [load_run(run_dir)])]
    except RunDirError:
        return []


def headline(run_dir: Path, windows: Windows, series: list[Series], horizon: Horizon,
             accounted: bool | None = None) -> dict:
    def figures(s: Series) -> dict:
        tr = s.trend
        return {"verdict": s.verdict, "unit": s.unit, "windows": len(s.values),
                "skipped": s.skipped, "excluded": s.excluded,
                "slope_per_h": None if tr is None else S_PER_H * tr.slope_per_s,
                "ci_per_h": None if tr is None else [S_PER_H * v for v in tr.ci_per_s],
                "start": None if tr is None else tr.start, "end": None if tr is None else tr.end,
                "change_pct": (None if tr is None or tr.change_share is None
                               else 100 * tr.change_share),
                "projected": None if tr is None else tr.projected,
                "projected_ci": None if tr is None else list(tr.projected_ci),
                "projected_pct": (None if tr is None or tr.projected_share is None
                                  else 100 * tr.projected_share),
                "budget": None if tr is None else tr.budget,
                "over_budget": None if tr is None else tr.over_budget,
                "hours_to_budget": None if tr is None else tr.hours_to_budget}

    return {"soak_md": str(run_dir / SOAK_MD), "soak_png": str(run_dir / SOAK_PNG),
            "window_s": windows.window_s, "windows": windows.count, "accounted": accounted,
            "horizon_h": horizon.hours, "budgets": horizon.budgets,
            "drift": [s.key for s in series if s.verdict == "drift"],
            "cannot_judge": [s.key for s in series if s.verdict == CANNOT_JUDGE],
            "series": {s.key: figures(s) for s in series}}

