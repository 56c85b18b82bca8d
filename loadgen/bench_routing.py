"""`python -m loadgen.bench_routing` (`make bench-routing`): what capturing routed experts costs
the load generator's timing.

Against the known-delay openai reference server answering as vLLM does with
--enable-return-routed-experts (loadgen/delay_server.py --routed-experts vllm: every reply
carries its request's routed experts), for each model shape of --shapes (default a small one,
4 layers of 16 experts top-2, and a 48-layer top-8 model of 128 experts, whose last chunk
carries some 8,000 ids), the same open-loop schedule at --messages-per-s with the openai
target's default client, routing capture off and on (--routed-experts), in --rounds interleaved
pairs: each run's TTFT p50 and p99 error against the known TTFT, its delivery lag and the
sender's CPU, and with capture on the bytes of routed_experts.jsonl a request. The server sends
the same replies either way, so the difference is the client's own work: the sender notes which
messages carry routing, the recording process decodes them. Prints a table, each shape's
medians' difference against the bar (TTFT p50 error within 0.2 ms), then one line of JSON.
Nothing here is asserted."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loadgen.bench_loadgen import ITL_MS, REPO, TOKENS, TTFT_MS, on_port
from records.cli import Parser

SHAPES = ("4x16x2", "48x128x8")
BAR_MS = 0.2


def run(host: str, shape: str, mode: str, args: argparse.Namespace, run_dir: Path) -> dict:
    """One Locust run with routing capture on or off (mode), at the command line's rate,
    duration and seed."""
    locust = str(Path(sys.executable).parent / "locust")
    rate = args.messages_per_s / TOKENS
    subprocess.run([locust, "-f", "loadgen/moe.py", "--host", host, "--target", "openai",
                    "--headless", "--only-summary", "-t", f"{args.duration_s}s", "--rate",
                    str(rate), "--prompt-tokens", "4", "--max-tokens", str(TOKENS), "--seed",
                    str(args.seed),
                    "--run-dir", str(run_dir), "--routed-experts", mode, "--moe-shape", shape],
                   cwd=REPO, capture_output=True, text=True, timeout=300)
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"locust wrote no summary in {run_dir}")
    s = json.loads((run_dir / "summary.json").read_text())
    m = s["metrics"]
    routed = run_dir / "routed_experts.jsonl"
    rows = routed.read_text().count("\n") if routed.exists() else 0
    return {"shape": shape, "mode": mode, "messages_per_s": s["throughput"]["output_tokens_per_s"],
            "ttft_error_p50_ms": m["ttft_ms"]["p50"] - TTFT_MS,
            "ttft_error_p99_ms": m["ttft_ms"]["p99"] - TTFT_MS,
            "delivery_lag_p50_ms": m["delivery_lag_ms"]["p50"],
            "cpu_percent": s["generator"]["cpu_percent"],
            "routed_rows": rows,
            "bytes_per_request": routed.stat().st_size / rows if rows else 0.0}


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m loadgen.bench_routing", description=__doc__)
    p.add_argument("--messages-per-s", type=float, default=2000)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES),
                   help="the models' LAYERSxEXPERTSxTOP_K")
    p.add_argument("--duration-s", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    runs = []
    for shape in args.shapes:
        with on_port(["loadgen.delay_server", "--protocol", "openai", "--ttft-ms", str(TTFT_MS),
                      "--itl-ms", str(ITL_MS), "--routed-experts", "vllm", "--moe-shape",
                      shape], tmp / f"{shape}.port", 15) as port:
            for r in range(args.rounds):
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    runs.append(run(f"http://127.0.0.1:{port}", shape, mode, args,
                                    tmp / f"{shape}-{mode}-{r}"))
    print(f"openai reference answering as vLLM with routed experts, TTFT {TTFT_MS:g} ms, "
          f"{TOKENS} messages a stream, {args.messages_per_s:g} messages/s, {args.duration_s} s "
          "a run\n")
    print(f"{'shape':>9} {'capture':>8} {'achieved':>9} {'TTFT err p50':>13} {'p99':>7} "
          f"{'deliv p50':>10} {'CPU %':>6} {'bytes/request':>14}")
    for r in runs:
        print(f"{r['shape']:>9} {r['mode']:>8} {r['messages_per_s']:>9.0f} "
              f"{r['ttft_error_p50_ms']:>13.3f} {r['ttft_error_p99_ms']:>7.2f} "
              f"{r['delivery_lag_p50_ms']:>10.3f} {r['cpu_percent']:>6.0f} "
              f"{r['bytes_per_request']:>14.0f}")
    gaps = {}
    for shape in args.shapes:
        median = {mode: statistics.median(r["ttft_error_p50_ms"] for r in runs
                                          if r["mode"] == mode and r["shape"] == shape)
                  for mode in ("off", "on")}
        gaps[shape] = median["on"] - median["off"]
        print(f"{shape}: TTFT p50 error, medians: off {median['off']:.3f} ms, on "
              f"{median['on']:.3f} ms; on minus off {gaps[shape]:+.3f} ms (within {BAR_MS:g} "
              f"ms: {'yes' if abs(gaps[shape]) <= BAR_MS else 'NO'})")
    print(json.dumps({"runs": runs, "gap_ms": gaps}))


if __name__ == "__main__":
    main()
