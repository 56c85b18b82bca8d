"""`python -m server.tools.bench_prefix` (`make bench-prefix`): what the prefix cache
(server/scheduling/prefix_cache.py) buys and costs on a preset, measured side by side.

1. Over the wire: `python -m server` with the cache and with --no-prefix-cache, each under the
   same Locust run (requests sharing one --shared-prefix-tokens prefix at --rate); TTFT p50 of
   each and their ratio.
2. A hit's cost against the prefill it saves, on the engine: the step prefilling the whole
   prompt, the step prefilling only the part past the cached prefix, and what the hit adds
   (the lookup and the copy of the prefix's KV from another slot), medians of --repeats.
3. The bookkeeping's share of a decode step with no hits: the batching loop's plan, run and
   apply over decode-only steps, with the cache and without, rounds alternated, medians.

Prints a table, then one line of JSON with every number. Timings are information, never
asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from records.cli import Parser
from server.engine.interface import SeqInput
from server.engine.local import LocalEngine
from server.scheduling.batching_loop import BatchingLoop, LoopOptions
from server.scheduling.policies import Fcfs
from server.scheduling.prefix_cache import PrefixCache, block_keys
from server.scheduling.requests import Request

REPO = Path(__file__).resolve().parents[2]


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def hit_cost(engine: LocalEngine, prefix: int, rest: int, repeats: int) -> dict:
    """Prefill of prefix + rest tokens whole, of the rest after a cached prefix, and the hit's
    own cost: the lookup and the copy."""
    ids = [(7 * i) % 200 + 32 for i in range(prefix + rest)]
    engine.step([SeqInput(1, ids, 0)])  # slot 1 holds the prefix
    whole = median_ms(lambda: engine.step([SeqInput(0, ids, 0)]), repeats)
    after = median_ms(lambda: engine.step([SeqInput(0, ids[prefix:], prefix, prefix_from=0)]),
                      repeats)
    copy = median_ms(lambda: engine.copy_prefixes([SeqInput(0, [], prefix, prefix_from=1)]),
                     repeats)
    cache = PrefixCache(16, engine.slots)
    keys = block_keys(ids, 16)
    cache.computed(1, keys)

    def lookup() -> None:
        placement, _ = cache.place(block_keys(ids, 16), len(ids))
        engine.slots.give(placement.slot)

    return {"prefill_whole_ms": whole, "prefill_rest_ms": after, "copy_ms": copy,
            "lookup_ms": median_ms(lookup, repeats), "saved_ms": whole - after}


def decode_steps(engine: LocalEngine, cache: bool, batch: int, steps: int) -> float:
    """ms per decode-only step of the batching loop (plan, run, apply), batch requests
    running."""
    prefix = PrefixCache(16, engine.slots) if cache else None
    loop = BatchingLoop(engine, Fcfs(batch), LoopOptions(max_queue=100, prefix_cache=prefix))
    for i in range(batch):
        loop.enqueue(Request(request_id=f"r{i}", prompt_ids=[40 + i] * 32,
                             max_tokens=steps + 10, sink=lambda event: None, ignore_eos=True))
    loop.apply(plan := loop.plan(), *loop.run(plan))  # the prefills
    t0 = time.perf_counter()
    for _ in range(steps):
        plan = loop.plan()
        loop.apply(plan, *loop.run(plan))
    per_step = (time.perf_counter() - t0) * 1e3 / steps
    for req in list(loop.resident):
        loop.cancel(req)
    loop.plan()
    return per_step


def ttft_over_the_wire(preset: str, prefix: int, rate: float, duration_s: int) -> dict:
    """TTFT p50 of the same Locust run against the server with the cache and without."""
    load = ["-t", f"{duration_s}s", "--rate", str(rate), "--shared-prefix-tokens", str(prefix),
            "--prefix-groups", "1", "--prompt-tokens", "32", "--max-tokens", "16"]
    out = {}
    for name, flags in (("cache", []), ("no_cache", ["--no-prefix-cache"])):
        with tempfile.TemporaryDirectory() as tmp:
            port_file, run_dir = Path(tmp) / "port", Path(tmp) / "run"
            server = subprocess.Popen([sys.executable, "-m", "server", "--preset", preset,
                                       "--port", "0", "--port-file", str(port_file), *flags],
                                      cwd=REPO, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 120
                while not (port_file.exists() and port_file.read_text().strip()):
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit(f"the server ({name}) did not start")
                    time.sleep(0.1)
                host = f"127.0.0.1:{port_file.read_text().strip()}"
                done = subprocess.run([str(Path(sys.executable).parent / "locust"), "-f",
                                       "loadgen/moe.py", "--headless", "--only-summary",
                                       "--host", host, "--run-dir", str(run_dir), *load],
                                      cwd=REPO, capture_output=True, text=True,
                                      timeout=duration_s + 120)
                if not (run_dir / "summary.json").exists():
                    raise SystemExit(f"the {name} run wrote no summary:\n"
                                     f"{(done.stdout + done.stderr)[-3000:]}")
                summary = json.loads((run_dir / "summary.json").read_text())
                out[name] = summary["metrics"]["ttft_ms"]["p50"]
            finally:
                server.terminate()
                server.wait(timeout=30)
    return out


def main() -> None:
    p = Parser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small")
    p.add_argument("--prefix-tokens", type=int, default=192)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--duration-s", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--skip-wire", action="store_true", help="only the engine's parts (2, 3)")
    args = p.parse_args()
    torch.manual_seed(0)
    engine = LocalEngine.from_preset(args.preset, 8, "cpu", torch.float32, 0)
    hit = hit_cost(engine, args.prefix_tokens, 32, args.repeats)
    rounds = {True: [], False: []}
    for _ in range(args.repeats):  # alternated, so drift falls on both alike
        for cache in (True, False):
            rounds[cache].append(decode_steps(engine, cache, 4, 20))
    with_cache, without = statistics.median(rounds[True]), statistics.median(rounds[False])
    results = {"hit": hit, "hit_cost_share": (hit["copy_ms"] + hit["lookup_ms"]) / hit["saved_ms"],
               "decode_step_ms": {"cache": with_cache, "no_cache": without},
               "bookkeeping_share": with_cache / without - 1}
    if not args.skip_wire:
        wire = ttft_over_the_wire(args.preset, args.prefix_tokens, args.rate, args.duration_s)
        results["ttft_p50_ms"] = wire | {"ratio": wire["cache"] / wire["no_cache"]}
    rows = [("prefill, whole prompt (ms)", f"{hit['prefill_whole_ms']:.2f}"),
            ("prefill, after the cached prefix (ms)", f"{hit['prefill_rest_ms']:.2f}"),
            ("hit: lookup + copy (ms)", f"{hit['lookup_ms']:.3f} + {hit['copy_ms']:.3f}"),
            ("hit cost / prefill saved", f"{100 * results['hit_cost_share']:.2f}%"),
            ("decode step with the cache / without (ms)", f"{with_cache:.2f} / {without:.2f}"),
            ("bookkeeping's share of a decode step", f"{100 * results['bookkeeping_share']:+.2f}%")]
    if "ttft_p50_ms" in results:
        t = results["ttft_p50_ms"]
        rows.append(("TTFT p50 with the cache / without (ms)",
                     f"{t['cache']:.1f} / {t['no_cache']:.1f} ({t['ratio']:.2f}x)"))
    width = max(len(r[0]) for r in rows)
    print(f"prefix cache on {args.preset}, {args.prefix_tokens}-token shared prefix")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
