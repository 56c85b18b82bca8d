"""`python -m analysis sweep RUN_DIR...`: runs that differ in their experts per layer and
communication overlap, side by side (make sweep-experts: the seed's experiment, section 4):
output tokens/s, TPOT and TTFT mean and p99, and the exchanges' share of step time, each run's
experts and overlap read from its server's GetStats; the seed article's own figures beside
the rows for 8, 16 and 32 experts, and the overlap's effect beside its claim (throughput +27%,
latency -15%, communication overhead -40%). Writes sweep.json beside the first run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from analysis.readers.files import RunDirError
from analysis.readers.rundir import load_run
from analysis.rules.expert_parallel import ep_view
from analysis.tables import text_table
from records.jsonform import dumps

SEED = {8: (1250, 45, 89), 16: (2100, 38, 75), 32: (2850, 42, 112)}  # tok/s, mean, P99 ms
SWEEP_JSON = "sweep.json"


@dataclass(frozen=True)
class Row:
    run_dir: str
    experts: int
    overlap: str
    tokens_per_s: float
    tpot_mean_ms: float | None
    tpot_p99_ms: float | None
    ttft_mean_ms: float | None
    ttft_p99_ms: float | None
    comm_share: float | None  # exchanges' measured time / step time
    exposed_share: float | None


def row_of(run_dir: Path) -> Row:
    run = load_run(run_dir)
    end = run.summary.server.latest
    if end is None or not end.num_experts:
        raise RunDirError(f"{run_dir}: summary.json has no server snapshot with num_experts")
    m, ep = run.summary.metrics, ep_view(run.summary.server)
    tpot, ttft = m.get("tpot_ms"), m.get("ttft_ms")
    return Row(str(run_dir), end.num_experts, end.reported_settings().get("ep_overlap", "none"),
               run.summary.throughput.output_tokens_per_s, tpot and tpot.mean, tpot and tpot.p99,
               ttft and ttft.mean, ttft and ttft.p99, ep and ep.share("measured"),
               ep and ep.share("exposed"))


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    header = ["experts", "overlap", "out tok/s", "TPOT mean", "TPOT p99", "TTFT mean",
              "TTFT p99", "comm share", "exposed", "seed tok/s", "seed mean", "seed P99"]
    cells = []
    for r in sorted(rows, key=lambda r: (r.experts, r.overlap)):
        seed = [str(v) for v in SEED[r.experts]] if r.experts in SEED else ["-"] * 3
        cells.append([str(r.experts), r.overlap, _f(r.tokens_per_s, ".1f"),
                      _f(r.tpot_mean_ms, ".1f"), _f(r.tpot_p99_ms, ".1f"),
                      _f(r.ttft_mean_ms, ".1f"), _f(r.ttft_p99_ms, ".1f"),
                      _f(r.comm_share, ".1%"), _f(r.exposed_share, ".1%"), *seed])
    return text_table(header, cells)


def overlap_effects(rows: list[Row]) -> list[str]:
    """Per expert count run with and without overlap: what overlapping changed, beside the
    seed's claim."""
    out = []
    by = {(r.experts, r.overlap): r for r in rows}
    for experts in sorted({r.experts for r in rows}):
        plain, over = by.get((experts, "none")), by.get((experts, "two-batch"))
        if plain is None or over is None:
            continue
        parts = [f"throughput {over.tokens_per_s / plain.tokens_per_s - 1:+.0%} (seed +27%)"]
        if plain.tpot_mean_ms and over.tpot_mean_ms:
            parts.append(f"TPOT mean {over.tpot_mean_ms / plain.tpot_mean_ms - 1:+.0%} "
                         "(seed latency -15%)")
        if plain.exposed_share and over.exposed_share is not None:
            change = over.exposed_share / plain.exposed_share - 1
            parts.append(f"exposed communication {change:+.0%} (seed overhead -40%)")
        out.append(f"{experts} experts, two-batch overlap against none: " + ", ".join(parts))
    return out


def main(args: argparse.Namespace) -> None:
    rows = [row_of(Path(d)) for d in args.run_dirs]
    print(table(rows))
    for line in overlap_effects(rows):
        print(line)
    path = Path(args.run_dirs[0]).parent / SWEEP_JSON
    path.write_text(dumps([r.__dict__ for r in rows]) + "\n")
    print(f"sweep: {path}")


def add_command(commands) -> None:
    parser = commands.add_parser("sweep", help="runs over expert counts and overlap, side by "
                                 "side with the seed's figures (make sweep-experts)",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run directories")
    parser.set_defaults(func=main)
