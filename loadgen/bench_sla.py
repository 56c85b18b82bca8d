"""`python -m loadgen.bench_sla` (`make bench-sla`, after the M/D/20 seeds' tests): the SLA
search as a new user runs it, against the truth.

The server: the known-delay reference with 4 slots, 20 ms to the first token and 10 ms a token,
8 tokens (an M/D/4 queue of 90 ms a request, about 44 requests/s at most); the objective TTFT
p99 <= 200 ms. The truth: the highest rate whose p99 wait for a slot leaves the first token
within the bound, from the queueing model (loadgen/reference/queue_model.py), less the time
outside the slot measured at the ramp's first step. For each seed, the search from its own
start (no --sla-start-rps); for the first seed, also started from half the truth and from
twice it. Prints each search's answer, the bounds the limit lies between, the binding
objective and its fall, the probes and the time taken, beside the truth and how far the answer
is from it. Nothing here is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from loadgen.bench_loadgen import REPO, on_port
from loadgen.reference.queue_model import highest_rate
from records.cli import Parser

SLOTS, TTFT_MS, ITL_MS, TOKENS, SLO_TTFT_MS = 4, 20.0, 10.0, 8, 200.0
SERVICE_S = (TTFT_MS + (TOKENS - 1) * ITL_MS) / 1000
ORACLE = ["loadgen.delay_server", "--protocol", "moe", "--capacity", str(SLOTS), "--ttft-ms",
          str(TTFT_MS), "--itl-ms", str(ITL_MS)]
LOAD = ["--mode", "sla", "--slo-ttft-ms", str(SLO_TTFT_MS), "--prompt-tokens", "8",
        "--max-tokens", str(TOKENS), "-t", "380"]


def search(run_dir: Path, flags: list[str]) -> tuple[dict, float]:
    """One search against a fresh oracle: its summary.json's sla, and its wall time."""
    with on_port(ORACLE, run_dir.with_suffix(".port"), 15) as port:
        began = time.monotonic()
        subprocess.run([str(Path(sys.executable).parent / "locust"), "-f", "loadgen/moe.py",
                        "--host", f"127.0.0.1:{port}", "--headless", "--only-summary",
                        "--run-dir", str(run_dir), *LOAD, *flags],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
        took_s = time.monotonic() - began
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"locust wrote no summary in {run_dir}")
    return json.loads((run_dir / "summary.json").read_text())["sla"], took_s


def truth(run_dir: Path) -> float:
    """The model's answer, less the time outside the slot seen at the first ramp step."""
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    first = [r["ttft_ms"] for r in rows if r["ttft_ms"] is not None and r["scheduled_ms"] < 2000]
    outside_ms = float(np.median(first)) - TTFT_MS if first else 0.0
    return highest_rate((SLO_TTFT_MS - TTFT_MS - outside_ms) / 1000, SLOTS, SERVICE_S)


def row(label: str, sla: dict, took_s: float, true_rps: float) -> str:
    found, failed = sla["rate_rps"], sla["failed_rps"]
    off = "-" if found is None else f"{100 * (found / true_rps - 1):+.1f}%"
    above = "?" if failed is None else f"{failed:.4g}"
    bounds = "-" if found is None else f"[{found:.4g}, {above})"
    binds = f"{sla.get('binding', '') or '-'}, {sla.get('fall', '') or '-'}"
    return (f"| {label} | {'-' if found is None else f'{found:.4g}'} | {bounds} | {binds} | "
            f"{len(sla['probes'])} + {len(sla.get('ramp', []))} ramp | {took_s:.0f} | "
            f"{true_rps:.1f} | {off} |")


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m loadgen.bench_sla", description=__doc__)
    p.add_argument("--seeds", default="1,2,3", help="comma-separated arrival seeds")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    lines, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            run_dir = Path(tmp) / f"seed-{seed}"
            sla, took_s = search(run_dir, ["--seed", str(seed)])
            true_rps = truth(run_dir)
            lines.append(row(f"seed {seed}, its own start", sla, took_s, true_rps))
            records.append({"seed": seed, "start": "ramp", "sla": sla, "took_s": took_s,
                            "truth_rps": true_rps})
            if seed != seeds[0]:
                continue
            for name, start in (("half", true_rps / 2), ("twice", 2 * true_rps)):
                sla, took_s = search(Path(tmp) / f"{name}-{seed}",
                                     ["--seed", str(seed), "--sla-start-rps", f"{start:.3g}"])
                lines.append(row(f"seed {seed}, from {start:.3g} ({name})", sla, took_s, true_rps))
                records.append({"seed": seed, "start": start, "sla": sla, "took_s": took_s,
                                "truth_rps": true_rps})
    print("| search | found (requests/s) | the limit in | binding, fall | probes | s | truth | "
          "found vs truth |")
    print("| --- | ---: | --- | --- | --- | ---: | ---: | ---: |")
    print("\n".join(lines))
    print(json.dumps([{k: r[k] for k in ("seed", "start", "took_s", "truth_rps")}
                      | {k: r["sla"].get(k) for k in ("rate_rps", "failed_rps", "binding", "fall",
                                                      "search_s", "stopped_because")}
                      for r in records]))


if __name__ == "__main__":
    main()
