"""Runs side by side, typically one per batching policy on the same seeded workload: one
table of throughput, goodput, latency percentiles and the server's batching figures."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from analysis.latency import stats_ms
from analysis.rundir import Run, RunDirError, load_run
from analysis.server_stats import server_view
from analysis.tables import fmt_ms, markdown_table, text_table

HEADER = ["run", "policy", "out tok/s", "goodput req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
          "batch", "experts/step", "padded %"]


def figures(run: Run) -> dict:
    """The numbers of one row, None where the run has none."""
    ttft, tpot = stats_ms(run.histograms.get("ttft")) or {}, stats_ms(run.histograms.get("tpot")) or {}
    throughput = run.section("throughput")
    view = server_view(run.section("server"))
    return {
        "run": run.path.name,
        "policy": view.policy if view else None,
        "output_tokens_per_s": throughput.get("output_tokens_per_s"),
        "goodput_requests_per_s": throughput.get("goodput_requests_per_s"),
        "ttft_p50_ms": ttft.get("p50"), "ttft_p99_ms": ttft.get("p99"),
        "tpot_p50_ms": tpot.get("p50"), "tpot_p99_ms": tpot.get("p99"),
        "mean_batch_size": view.mean_batch_size if view else None,
        "distinct_experts_per_step": view.distinct_experts_per_step if view else None,
        "prefill_padded_share": view.prefill_padded_share if view else None,
        "failed": run.section("requests").get("failed"),
    }


def _cells(f: dict) -> list[str]:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    return [f["run"], f["policy"] or "-", num(f["output_tokens_per_s"], ".1f"), num(f["goodput_requests_per_s"], ".2f"),
            fmt_ms(f["ttft_p50_ms"]), fmt_ms(f["ttft_p99_ms"]), fmt_ms(f["tpot_p50_ms"]), fmt_ms(f["tpot_p99_ms"]),
            num(f["mean_batch_size"], ".2f"), num(f["distinct_experts_per_step"], ".2f"),
            num(None if f["prefill_padded_share"] is None else 100 * f["prefill_padded_share"], ".1f")]


def slo_line(runs: list[Run]) -> str:
    slos = {(r.section("config").get("slo_ttft_ms"), r.section("config").get("slo_tpot_ms")) for r in runs}
    if len(slos) != 1:
        return "goodput: the runs used different SLOs, so their goodput does not compare"
    ttft, tpot = slos.pop()
    if ttft is None and tpot is None:
        return "goodput: no SLO was set, so it equals the ok requests/s"
    parts = [f"TTFT <= {ttft:g} ms" if ttft is not None else "", f"TPOT <= {tpot:g} ms" if tpot is not None else ""]
    return "goodput: requests/s meeting " + " and ".join(p for p in parts if p)


def compare(runs: list[Run], out_dir: Path) -> tuple[str, list[dict]]:
    """Prints nothing; returns the text table and the rows, and writes compare.md to out_dir."""
    rows = [figures(r) for r in runs]
    note = slo_line(runs)
    text = text_table(HEADER, [_cells(f) for f in rows]) + "\n" + note + "\nlatency in ms"
    md = "\n\n".join(["# Comparison", markdown_table(HEADER, [_cells(f) for f in rows]),
                      note + "; latency in ms; experts/step: distinct experts a step activated, mean over layers; "
                      "padded %: padding in batched prefill attention."])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.md").write_text(md + "\n")
    return text, rows


def headline(rows: list[dict], out_dir: Path) -> str:
    return json.dumps({"compare_md": str(out_dir / "compare.md"), "runs": rows})


def add_command(commands) -> None:
    parser = commands.add_parser("compare", help="runs side by side (e.g. one per batching policy)")
    parser.add_argument("run_dirs", nargs="+", help="run directories")
    parser.add_argument("--out", help="where compare.md goes (default: the runs' common parent)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    runs = [load_run(d) for d in args.run_dirs]
    out_dir = Path(args.out) if args.out else Path(os.path.commonpath([r.path.resolve() for r in runs]))
    try:
        text, rows = compare(runs, out_dir)
    except OSError as e:
        raise RunDirError(f"cannot write the comparison: {e}") from None
    print(text)
    print(f"\ncompare: {out_dir / 'compare.md'}")
    print(headline(rows, out_dir))
