"""`python -m analysis soak RUN_DIR`: the soak's command line (analysis/soak/__init__.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import analysis.soak
from analysis.arguments import number
from analysis.readers.files import RunDirError
from analysis.readers.rundir import read_summary
from analysis.soak.render import (
    SOAK_MD,
    SOAK_PNG,
    accounting,
    headline,
    objectives,
    plot_soak,
    render_markdown,
    render_text,
)
from analysis.soak.series import soak
from analysis.soak.trend import DEFAULT_BUDGETS, DEFAULT_HORIZON_H, Horizon, Judging
from records.jsonform import dumps


def add_command(commands) -> None:
    parser = commands.add_parser(
        "soak", help="drift of p99 TTFT/TPOT, server RSS and queue depth over a long run: "
                     "soak.md, soak.png",
        description=analysis.soak.__doc__ + "\nExit status: 0 with a verdict per series; 2 when "
                                            "the run directory is unusable or spans fewer than "
                                            "3 windows.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir",
                        help="run directory with ttft.hlog, tpot.hlog and server_stats.jsonl")
    parser.add_argument("--window-s", type=number(float, 0), default=60.0,
                        help="window length in seconds (default 60)")
    parser.add_argument("--min-change", type=number(float, 0, strict=False), default=0.1,
                        help="smallest fitted change over the run, as a fraction of the fitted "
                             "starting level, that counts as drift (default 0.1)")
    parser.add_argument("--min-samples", type=number(int, 1, strict=False), default=50,
                        help="requests a window needs for its p99 to count (default 50; under "
                             "100 the p99 is the window's largest value or next to it)")
    parser.add_argument("--skip-s", type=number(float, 0, strict=False), default=None,
                        help="leave out the first seconds (default: the run's warm-up from "
                             "summary.json)")
    parser.add_argument("--horizon-h", type=number(float, 0), default=DEFAULT_HORIZON_H,
                        help="deployment horizon in hours: each slope and its 95%% CI is "
                             "projected over it and judged against the budgets (default "
                             f"{DEFAULT_HORIZON_H:g})")
    for unit, flag, what in (("MB", "--budget-mb", "server and load generator RSS"),
                             ("ms", "--budget-ms", "p99 TTFT and TPOT"),
                             ("requests", "--budget-requests", "queue depth"),
                             ("%", "--budget-kv-percent", "KV-cache usage from /metrics"),
                             ("per min", "--budget-preemptions", "preemptions per minute from "
                              "/metrics")):
        parser.add_argument(flag, type=number(float, 0), default=DEFAULT_BUDGETS[unit],
                            help=f"rise of {what} ({unit.replace('%', '%%')}) allowed over the "
                                 "horizon: drift when "
                                 "the slope's CI rises past it even at its slow end (default "
                                 f"{DEFAULT_BUDGETS[unit]:g})")
    parser.add_argument("--fail-on-drift", action="store_true",
                        help="exit 1 when a series drifts or cannot be judged (too few usable "
                             "windows, or an interval too wide against its budget), or a "
                             "request is unaccounted for (make soak)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir)
    horizon = Horizon(args.horizon_h, {"MB": args.budget_mb, "ms": args.budget_ms,
                                       "requests": args.budget_requests,
                                       "%": args.budget_kv_percent,
                                       "per min": args.budget_preemptions})
    judging = Judging(args.min_samples, args.min_change, horizon)
    windows, series = soak(run_dir, args.window_s, args.skip_s, judging)
    closed, accounted = accounting(read_summary(run_dir)) or (None, None)
    if closed is not None and (judged := objectives(run_dir)):
        accounted = "\n".join([accounted, *judged])
    print(render_text(run_dir, windows, series, judging, accounted))
    try:
        plot_soak(series, windows, run_dir / SOAK_PNG, args.min_change)
        (run_dir / SOAK_MD).write_text(render_markdown(run_dir, windows, series, judging,
                                                       accounted))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the soak report: {e}") from None
    print(f"\nsoak: {run_dir / SOAK_MD}")
    figures = headline(run_dir, windows, series, horizon, closed)
    print(dumps(figures))
    if args.fail_on_drift and (figures["drift"] or figures["cannot_judge"] or closed is False):
        raise SystemExit(1)
