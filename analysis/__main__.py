"""Command line: `python -m analysis report RUN_DIR`."""

import argparse
import json
import sys

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report_parser = commands.add_parser("report", help="percentile table, report.md and latency CDF of one run")
    report_parser.add_argument("run_dir", help="directory holding summary.json and histograms.json")
    report_parser.set_defaults(func=report)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
