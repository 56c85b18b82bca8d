"""`python -m loadgen.events_bench.sweep`: how many stream events a second the load generator
times well, against a mock that is not the limit (`make bench-loadgen` runs it after
loadgen/bench_loadgen.py).

The mock is this project's own C program (loadgen/events_bench/sse_mock.c, built by the
Makefile): an OpenAI-compatible server streaming one event per token, the first TTFT_MS after a
request arrived, then one every 1/PER_STREAM s, each carrying its write time from the request's
arrival, and the stream's usage its true TTFT; at the end it writes its own account (its
lateness, the true gaps' spread, its CPU). Our generator runs as users run it (`locust -f
loadgen/moe.py --headless`, open loop, its default client), with one process and with
`--processes N` (N: the machine's cores), at each of EVENTS_PER_S (streams of `--tokens`
events at the arrival rate that asks for it). For each run: the events/s it achieved; the
share of its schedule it sent (its own schedule, recomputed here), and whether scheduled = sent
+ not sent exactly; each request's TTFT (from its scheduled send) less the mock's true TTFT for
it, at p50 and p99; the spread (standard deviation) of the gaps it timed between events against
the mock's own; its senders' CPU and the mock's; and the figures its summary called
generator-limited. A fresh mock serves each run. Prints a table, then one line of JSON.
Nothing here is asserted.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hdrh.histogram import HdrHistogram

from loadgen.bench_loadgen import REPO, pct
from loadgen.events_bench.native import native_mock, ttft_errors
from loadgen.traffic.arrivals import worker_arrivals
from records.cli import Parser

TTFT_MS = 50.0
EVENTS_PER_S = (5_000, 10_000, 25_000, 50_000, 100_000)  # the sweep's settings
PER_STREAM = 100  # events/s a stream (one every 10 ms)


def streams_of(events_per_s: float, tokens: int) -> float:
    """The streams in flight, on average, at events_per_s in streams of `tokens` events."""
    return events_per_s / tokens * (TTFT_MS / 1e3 + (tokens - 1) / PER_STREAM)


def scheduled(summary: dict) -> int:
    """The arrivals each sending process's own schedule had due in its window (time zero to
    its stop)."""
    config = summary["config"]
    windows = ([w["window_s"] for w in sorted(summary["workers"], key=lambda w: w["worker"])]
               if summary.get("workers") else [summary["throughput"]["window_s"]])
    return sum(sum(1 for _ in itertools.takewhile(
        lambda a, w=window: a[1] < w,
        worker_arrivals(config["rate"], config["arrival"], config["seed"], len(windows), i)))
        for i, window in enumerate(windows))


def itl_sd_ms(run_dir: Path) -> float:
    """The spread of the gaps the generator timed between a stream's events."""
    encoded = json.loads((run_dir / "histograms.json").read_text())["itl"]
    return HdrHistogram.decode(encoded).get_stddev() / 1e3


def one_run(tmp: Path, events_per_s: int, processes: int, tokens: int,
            duration_s: float) -> dict:
    name = f"{events_per_s}-p{processes}"
    run_dir = tmp / name
    with native_mock("sse_mock", tmp, TTFT_MS, 1e3 / PER_STREAM) as (port, stats):
        workers = ["--processes", str(processes), "-u", str(processes)] if processes > 1 else []
        done = subprocess.run(
            [str(Path(sys.executable).parent / "locust"), "-f", "loadgen/moe.py", "--host",
             f"http://127.0.0.1:{port}", "--target", "openai",
             "--headless", "--only-summary", "-t", f"{round(duration_s)}s", "--rate",
             f"{events_per_s / tokens:.3f}", "--prompt-tokens", "4", "--max-tokens", str(tokens),
             "--max-request-rows", "10000000", "--run-dir", str(run_dir), *workers],
            cwd=REPO, capture_output=True, text=True, timeout=duration_s + 120)
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"locust wrote no summary (exit {done.returncode}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return {"asked_events_per_s": events_per_s, "streams": streams_of(events_per_s, tokens),
            "processes": processes, **figures(run_dir, json.loads(stats.read_text()))}


def figures(run_dir: Path, mock: dict) -> dict:
    """What one run measured, against the mock's account (mock)."""
    s = json.loads((run_dir / "summary.json").read_text())
    due, requests = scheduled(s), s["requests"]
    errors = ttft_errors(run_dir)
    cpu = ([w["cpu_percent"] for w in s["workers"]] if s.get("workers")
           else [s["generator"]["cpu_percent"]])
    return {"events_per_s": s["throughput"]["output_tokens_per_s"],
            "scheduled": due, "sent": requests["sent"], "not_sent": requests["not_sent"],
            "sent_percent": 100 * requests["sent"] / max(due, 1),
            "accounted": requests["sent"] + requests["not_sent"] == due,
            "ttft_error_p50_ms": pct(errors, 50), "ttft_error_p99_ms": pct(errors, 99),
            "itl_sd_ms": itl_sd_ms(run_dir), "true_itl_sd_ms": mock["itl_us"]["sd"] / 1e3,
            "sender_cpu_percent": sum(cpu),
            "mock_cpu_percent": 100 * mock["cpu_s"] / s["throughput"]["window_s"],
            "mock_late_p99_ms": mock["late_us"]["p99"] / 1e3,
            "generator_limited": s["generator"].get("limited", {})}


def print_rows(rows: list[dict]) -> None:
    print(f"{'asked ev/s':>10} {'streams':>7} {'procs':>5} {'events/s':>9} {'sent %':>7} "
          f"{'counted':>8} "
          f"{'TTFT err p50':>12} {'p99':>8} {'ITL sd':>7} {'truth':>6} {'sender CPU':>10} "
          f"{'mock CPU':>8} {'mock late p99':>13}  limited")
    for r in rows:
        print(f"{r['asked_events_per_s']:>10,} {r['streams']:>7.0f} {r['processes']:>5} "
              f"{r['events_per_s']:>9,.0f} {r['sent_percent']:>7.1f} "
              f"{'exact' if r['accounted'] else 'NO':>8} {r['ttft_error_p50_ms']:>12.2f} "
              f"{r['ttft_error_p99_ms']:>8.2f} {r['itl_sd_ms']:>7.2f} "
              f"{r['true_itl_sd_ms']:>6.2f} {r['sender_cpu_percent']:>9.0f}% "
              f"{r['mock_cpu_percent']:>7.0f}% {r['mock_late_p99_ms']:>13.2f}  "
              f"{', '.join(r['generator_limited']) or '-'}")


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m loadgen.events_bench.sweep", description=__doc__)
    p.add_argument("--duration-s", type=float, default=20)
    p.add_argument("--tokens", type=int, default=100, help="events a stream")
    p.add_argument("--processes", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                   help="sending processes of each run (1: Locust's own, no --processes)")
    p.add_argument("--events-per-s", type=int, nargs="+", default=list(EVENTS_PER_S),
                   help="the events/s each run asks for")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-events-"))
    rows = [one_run(tmp, events, processes, args.tokens, args.duration_s)
            for events in args.events_per_s for processes in args.processes]
    print(f"mock: TTFT {TTFT_MS:g} ms, then an event every {1e3 / PER_STREAM:g} ms, "
          f"{args.tokens} events a stream; {args.duration_s:g} s "
          f"a run, open loop (Poisson), the openai target, {os.cpu_count()} cores here")
    print_rows(rows)
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
