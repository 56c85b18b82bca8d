"""Latency CDF figure: one log-x panel per metric, drawn from the histograms' recorded buckets."""

from pathlib import Path

from hdrh.histogram import HdrHistogram

# Figure without pyplot: no global figure state and no GUI backend; PNG output renders through Agg.
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from analysis.latency import PERCENTILES, US_PER_MS, cdf_ms
from analysis.tables import fmt_ms

# Panel title -> histograms drawn in it; the service views (from the actual send) sit beside the
# open-loop ones (from the scheduled send), so generator lag shows as the gap between two curves.
PANELS = {"TTFT": ("ttft", "ttft_service"), "TPOT": ("tpot",), "ITL": ("itl",), "E2E": ("e2e", "e2e_service")}
MARKED = ("p50", "p99")


def plot_latency_cdf(histograms: dict[str, HdrHistogram], path: Path) -> None:
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    for ax, (title, names) in zip(fig.subplots(2, 2).flat, PANELS.items(), strict=True):
        ax.set_title(title)
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("fraction ≤ x")
        ax.set_ylim(0, 1.05)
        ax.grid(True, which="both", alpha=0.3)
        drawn = [name for name in names if name in histograms and histograms[name].get_total_count()]
        if not drawn:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        # The first curve's labels go left of its points, the second's right and below (clear of the
        # rising curve), so the two sets do not overprint.
        for name, side in zip(drawn, (-1, 1), strict=False):
            _draw_cdf(ax, name, histograms[name], side)
        log_scale(ax, "x")
        ax.legend(loc="lower right", fontsize="small")
    fig.suptitle("Latency CDF")
    fig.savefig(path, dpi=100)


def log_scale(ax, which: str) -> None:
    """A log scale on ax's "x" or "y" axis, labelled with plain numbers (20, 30, 1000) rather
    than 2x10^1; minor ticks get labels when the range is narrow."""
    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _draw_cdf(ax, name: str, hist: HdrHistogram, side: int) -> None:
    edges_ms, fraction = cdf_ms(hist)
    (line,) = ax.plot(edges_ms, fraction, drawstyle="steps-post", label=f"{name} (n={hist.get_total_count()})")
    by_percentile = hist.get_percentile_to_value_dict([PERCENTILES[key] for key in MARKED])
    for key in MARKED:
        value_ms = by_percentile[PERCENTILES[key]] / US_PER_MS
        y = PERCENTILES[key] / 100
        # p99 labels sit below their point to stay inside the axes at y = 1.
        below = side > 0 or key == "p99"
        ax.plot([value_ms], [y], "o", color=line.get_color())
        ax.annotate(f"{key} {fmt_ms(value_ms)} ms", (value_ms, y), textcoords="offset points",
                    xytext=(6 * side, -4 if below else 4), ha="right" if side < 0 else "left",
                    va="top" if below else "bottom", fontsize="small", color=line.get_color())
