"""`python -m loadgen.bench_sla` (`make bench-sla`, after the three seeds' tests): how long the
SLA search takes against a stress run that finds the same capacity to the same resolution.

Against the known-delay oracle of tests/test_sla.py (20 slots of 35 ms each, an M/D/20 queue;
about 517 requests/s hold E2E p99 <= 80 ms), for each seed: a stress run from the search's
first rate, its rate multiplied by 1 + --sla-resolution a step, each step as long as a probe
(warm-up plus the shortest judged length), its SLO on TTFT (stress judges TTFT and TPOT; the
E2E bound less the three 5 ms token gaps); then the SLA search. Prints each run's answer and
time, and whether the search took at most the stress run's time plus one probe. Nothing here
is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from loadgen.bench_loadgen import REPO, on_port
from records.cli import Parser

ORACLE = ["loadgen.delay_server", "--protocol", "moe", "--capacity", "20", "--ttft-ms", "20",
          "--itl-ms", "5"]
START_RPS, GROWTH, WARMUP_S, PROBE_MIN_S, SLO_E2E_MS = 400, 1.5, 0.5, 3.0, 80.0
TOKEN_GAPS_MS = 15.0  # three 5 ms gaps after the first token
LOAD = ["--max-tokens", "4", "--prompt-tokens", "8", "-t", "300"]


def locust(port: str, run_dir: Path, flags: list[str]) -> dict:
    subprocess.run([str(Path(sys.executable).parent / "locust"), "-f", "loadgen/moe.py",
                    "--host", f"127.0.0.1:{port}", "--headless", "--only-summary",
                    "--run-dir", str(run_dir), *LOAD, *flags],
                   cwd=REPO, capture_output=True, text=True, timeout=600)
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"locust wrote no summary in {run_dir}")
    return json.loads((run_dir / "summary.json").read_text())


def one_seed(seed: int, resolution: float, tmp: Path) -> dict:
    with on_port(ORACLE, tmp / f"stress-{seed}.port", 15) as port:
        run = locust(port, tmp / f"stress-{seed}", [
            "--mode", "stress", "--rate-start", str(START_RPS), "--rate-mult", str(1 + resolution),
            "--step-s", str(WARMUP_S + PROBE_MIN_S), "--max-steps", "40", "--seed", str(seed),
            "--slo-ttft-ms", str(SLO_E2E_MS - TOKEN_GAPS_MS)])
    stress, stress_s = run["stress"], run["duration_s"]
    with on_port(ORACLE, tmp / f"sla-{seed}.port", 15) as port:
        sla = locust(port, tmp / f"sla-{seed}", [
            "--mode", "sla", "--rate", str(START_RPS), "--sla-growth", str(GROWTH),
            "--sla-warmup-s", str(WARMUP_S), "--sla-probe-min-s", str(PROBE_MIN_S),
            "--sla-resolution", str(resolution), "--slo-e2e-ms", str(SLO_E2E_MS),
            "--seed", str(seed)])["sla"]
    bound_s = stress_s + WARMUP_S + PROBE_MIN_S
    return {"seed": seed, "stress_knee_rps": stress["knee_rps"],
            "stress_steps": len(stress["steps"]),
            "stress_s": stress_s, "sla_rps": sla["rate_rps"], "sla_failed_rps": sla["failed_rps"],
            "sla_probes": len(sla["probes"]), "sla_search_s": sla["search_s"],
            "bound_s": bound_s, "within": sla["search_s"] <= bound_s}


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m loadgen.bench_sla", description=__doc__)
    p.add_argument("--seeds", default="1,2,3", help="comma-separated arrival seeds")
    p.add_argument("--resolution", type=float, default=0.05,
                   help="the search's --sla-resolution, and the stress run's step (1 + it)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_seed(int(s), args.resolution, Path(tmp)) for s in args.seeds.split(",")]
    print("| seed | stress knee (steps, s) | SLA rate, lowest failing (probes, s) | "
          "stress s + one probe | search within |")
    print("| --- | --- | --- | ---: | --- |")
    for r in rows:
        print(f"| {r['seed']} | {r['stress_knee_rps']:.4g} ({r['stress_steps']}, "
              f"{r['stress_s']:.1f}) | {r['sla_rps']}, {r['sla_failed_rps']} "
              f"({r['sla_probes']}, {r['sla_search_s']:.1f}) | {r['bound_s']:.1f} | "
              f"{'yes' if r['within'] else 'NO'} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
