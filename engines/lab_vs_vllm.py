"""The lab server beside vLLM: the same tiny Qwen3-MoE (engines/tiny_model.py: the same weights,
dims and dtype) served by this project's server (`python -m server --model DIR`, its OpenAI HTTP
API) and by a real `vllm serve`, each measured by our load generator the same way: TPOT at
concurrency 1 and 8 (closed loop), and the knee of a stress run; then each figure's ratio,
lab / vLLM. The lab server exists to make batching effects real; this says whether it is the slow
one.

    python -m engines.lab_vs_vllm [--dtype bfloat16] [--run-s 15] [--out DIR]

Both get one torch thread (vLLM's CPU worker takes one core, its own choice here) and the same
context (1024). Prints the table and a last line of JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engines.side_by_side import locust
from engines.tiny_model import write_model
from engines.vllm_server import REPO, VllmServer

CONCURRENCY = (1, 8)
LENGTHS = ("--prompt-tokens", "64", "--max-tokens", "32")
# the stress run: from 2 requests/s, x1.5 a step, until a step does not hold
STRESS = ["--mode", "stress", "--rate", "2", "--rate-mult", "1.5", "--max-steps", "9"]


@dataclass
class ServerFigures:
    server: str
    tpot_p50_ms: dict[int, float]  # by concurrency
    knee_rps: float | None


def measure(name: str, url: str, out: Path, run_s: float) -> ServerFigures:
    tpot = {}
    for users in CONCURRENCY:
        summary = locust(url, out / f"{name}-c{users}", *LENGTHS, "--mode", "closed", "-u",
                         str(users), "-r", str(users), "-t", f"{run_s:g}s",
                         timeout_s=run_s + 120)
        tpot[users] = summary["metrics"]["tpot_ms"]["p50"]
    step_s = run_s / 2
    stress = locust(url, out / f"{name}-stress", *LENGTHS, *STRESS, "--step-s", f"{step_s:g}",
                    "-t", f"{10 * step_s:g}s", timeout_s=10 * step_s + 180)
    return ServerFigures(name, tpot, (stress.get("stress") or {}).get("knee_rps"))


@contextmanager
def lab_server(model: Path, dtype: str, log: Path):
    """This project's server on the checkpoint, its HTTP API on a free port: yields its URL."""
    port_file = log.with_suffix(".port")
    command = [sys.executable, "-m", "server", "--model", str(model), "--port", "0",
               "--http-port", "0", "--http-port-file", str(port_file), "--dtype", dtype,
               "--device", "cpu", "--torch-threads", "1", "--max-seq-len", "1024",
               "--max-batch-size", "64"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the lab server did not start: see {log}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def table(lab: ServerFigures, vllm: ServerFigures) -> str:
    def ratio(a: float | None, b: float | None) -> str:
        return f"x{a / b:.2f}" if a and b else "-"

    def cell(value: float | None) -> str:
        return f"{value:10.2f}" if value is not None else f"{'-':>10}"

    lines = [f"{'':26}{'lab':>10}{'vLLM':>10}  lab / vLLM"]
    for users in CONCURRENCY:
        a, b = lab.tpot_p50_ms[users], vllm.tpot_p50_ms[users]
        lines.append(f"TPOT p50 (ms), {users} stream{'s' if users > 1 else ' '}  "
                     f"{cell(a)}{cell(b)}  {ratio(a, b)}")
    lines.append(f"knee (requests/s)         {cell(lab.knee_rps)}{cell(vllm.knee_rps)}  "
                 f"{ratio(vllm.knee_rps, lab.knee_rps)} (vLLM's over the lab's)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engines.lab_vs_vllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", help="of both servers (the model's own)")
    parser.add_argument("--run-s", type=float, default=15.0,
                        help="seconds of each concurrency; a stress step is half of it")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "lab-vs-vllm")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        model = write_model(Path(scratch) / "tiny-qwen3-moe")
        with lab_server(model, args.dtype, args.out / "lab.log") as url:
            lab = measure("lab", url, args.out, args.run_s)
        with VllmServer(model, args.out / "vllm.log", "--dtype", args.dtype) as server:
            vllm = measure("vllm", server.url, args.out, args.run_s)
    print(table(lab, vllm))
    print(json.dumps({"dtype": args.dtype, "lab": vars(lab), "vllm": vars(vllm)}))


if __name__ == "__main__":
    main()
