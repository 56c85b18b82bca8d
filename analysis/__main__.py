"""Command line: `python -m analysis report RUN_DIR`, `python -m analysis compare RUN_DIR...`."""

import argparse
import json
import os
import sys
from pathlib import Path

from analysis.compare import compare as compare_runs
from analysis.compare import headline as compare_headline
from analysis.plot import plot_latency_cdf
from analysis.report import CDF_PNG, REPORT_MD, Report, headline, render_markdown, render_text
from analysis.rundir import RunDirError, load_run


def report(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    result = Report.of(run)
    print(render_text(result))
    try:
        plot_latency_cdf(run.histograms, run.path / CDF_PNG)
        (run.path / REPORT_MD).write_text(render_markdown(result))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the report: {e}") from None
    print(f"\nreport: {run.path / REPORT_MD}")
    # Last line: machine-readable headline figures.
    print(json.dumps(headline(result)))


def compare(args: argparse.Namespace) -> None:
    runs = [load_run(d) for d in args.run_dirs]
    out_dir = Path(args.out) if args.out else Path(os.path.commonpath([r.path.resolve() for r in runs]))
    try:
        text, rows = compare_runs(runs, out_dir)
    except OSError as e:
        raise RunDirError(f"cannot write the comparison: {e}") from None
    print(text)
    print(f"\ncompare: {out_dir / 'compare.md'}")
    print(compare_headline(rows, out_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report_parser = commands.add_parser("report", help="percentile table, report.md and latency CDF of one run")
    report_parser.add_argument("run_dir", help="directory holding summary.json and histograms.json")
    report_parser.set_defaults(func=report)
    compare_parser = commands.add_parser("compare", help="runs side by side (e.g. one per batching policy)")
    compare_parser.add_argument("run_dirs", nargs="+", help="run directories")
    compare_parser.add_argument("--out", help="where compare.md goes (default: the runs' common parent)")
    compare_parser.set_defaults(func=compare)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
