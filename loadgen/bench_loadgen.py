"""`python -m loadgen.bench_loadgen`: how much load one generator process can time well.

Against servers with known delays (first token after 20 ms, then one every 10 ms): on the moe
target (gRPC) the project's native mock (loadgen/events_bench/grpc_mock.c, built by `make
bench-loadgen`, niced, its true TTFT in each stream's usage), on the openai target (HTTP
server-sent events) the reference server (loadgen/delay_server.py); side by side in one run at
rising streamed-message rates: our Locust generator (one process, as users run it) with its
default client (no --client: the aio sender in this open-loop mode) and with the gevent one,
and a plain `grpc.aio` asyncio client doing the same open-loop schedule. For each: the
messages/s it achieved, the share of its schedule it sent, its send lateness (scheduled ->
actual send) and its delivery lag (server emit, from `server_elapsed_us`, -> client timestamp)
at p50/p99, the TTFT error (its TTFT less the mock's true one; less the known 20 ms on the
openai target), and its CPU. The default on the moe target and bare grpc.aio run --rounds
times at each rate, interleaved (the order turned each round), their medians compared: up to
8,000 messages/s the default's TTFT error p50 and p99 must be within 1.2x bare grpc.aio's.
Then the highest rate each run held, whether the default holds what docs/design.md ("The
default client") asks of it, and the openai target's TTFT error beside the moe target's.
Last, a row against this project's real server (`small`, batch up to 8) at about the demo's
load: who is late, the delivery lag in three parts (the generator's own loop lag, the server's
write delay from its GetStats, the rest). Before it, at rest (10 requests/s, --rest-s each,
--rest-repeats interleaved rounds, medians): the default on both targets, bare grpc.aio, and
AIPerf and GuideLLM on the openai target where installed (loadgen/bench_peers.py), each row's
TTFT p50/p99 error. Prints tables, then one line of JSON.
Nothing here is asserted."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from loadgen.bench_peers import PEERS, peer_runs
from loadgen.events_bench.native import native_mock, ttft_errors
from loadgen.traffic.arrivals import worker_arrivals
from proto import moe_pb2, moe_pb2_grpc
from records.cli import Parser
from records.server_stats import Histogram, bucket_stats

TOKENS = 20  # messages per stream
TTFT_MS, ITL_MS = 20.0, 10.0
REPO = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


async def aio_run(port: int, rate: float, duration_s: float, seed: int) -> dict:
    """Open loop on grpc.aio against the native mock: a task per request at its scheduled
    time."""
    send_lag, delivery, ttft_err, messages = [], [], [], 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = moe_pb2_grpc.MoEInferenceStub(channel)

        async def one(due: float, i: int):
            nonlocal messages
            sent = time.monotonic()
            send_lag.append((sent - due) * 1e3)
            request = moe_pb2.GenerateRequest(request_id=f"aio-{i}", prompt_token_ids=[65] * 4,
                                              max_tokens=TOKENS, ignore_eos=True)
            first = None
            async for msg in stub.Generate(request, timeout=60):
                now = time.monotonic()
                messages += 1
                delivery.append((now - sent) * 1e3 - msg.server_elapsed_us / 1e3)
                first = first or now
                if msg.HasField("usage"):  # the last: the mock's true TTFT
                    ttft_err.append((first - due) * 1e3 - msg.usage.ttft_us / 1e3)

        rng, tasks = random.Random(seed), []
        start = time.monotonic()
        cpu0 = time.process_time()
        t, i = 0.0, 0
        while t < duration_s:
            t += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, start + t - time.monotonic()))
            tasks.append(asyncio.create_task(one(start + t, i)))
            i += 1
        await asyncio.gather(*tasks)
        wall = time.monotonic() - start
        cpu = 100 * (time.process_time() - cpu0) / wall
    return {"messages_per_s": messages / duration_s, "sent_percent": 100.0, "client": "grpc.aio",
            "send_lag_p99_ms": pct(send_lag, 99),
            "delivery_lag_p50_ms": pct(delivery, 50), "delivery_lag_p99_ms": pct(delivery, 99),
            "ttft_error_p50_ms": pct(ttft_err, 50), "ttft_error_p99_ms": pct(ttft_err, 99),
            "cpu_percent": cpu}


@dataclass(frozen=True)
class Load:
    """What a run sends: requests/s (Poisson), for how long, drawn from which seed."""

    rate: float
    duration_s: float
    seed: int


def locust_run(host: str, target: str, client: str, load: Load, run_dir: Path) -> dict:
    locust = str(Path(sys.executable).parent / "locust")
    done = subprocess.run([locust, "-f", "loadgen/moe.py", "--host", host, "--target", target,
                           "--headless", "--only-summary", "-t", f"{round(load.duration_s)}s",
                           "--rate", str(load.rate), "--prompt-tokens", "4", "--max-tokens",
                           str(TOKENS), "--seed", str(load.seed), "--run-dir", str(run_dir),
                           "--client", client],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    if not (run_dir / "summary.json").exists():
        raise SystemExit(f"locust wrote no summary (exit {done.returncode}):\n"
                         f"{done.stdout[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    m = s["metrics"]
    # the arrivals due in its window (time zero to the stop; no warm-up): its own schedule
    config = s["config"]
    due = itertools.takewhile(lambda arrival: arrival[1] < s["window_s"],
                              worker_arrivals(config["rate"], config["arrival"], config["seed"]))
    return {"messages_per_s": s["throughput"]["output_tokens_per_s"],
            "sent_percent": 100 * s["requests"]["sent"] / max(sum(1 for _ in due), 1),
            "client": s["generator"]["client"],
            "send_lag_p99_ms": m["send_lag_ms"]["p99"],
            "delivery_lag_p50_ms": m["delivery_lag_ms"]["p50"],
            "delivery_lag_p99_ms": m["delivery_lag_ms"]["p99"],
            **ttft_error(run_dir, m["ttft_ms"]),
            "cpu_percent": s["generator"]["cpu_percent"]}


def ttft_error(run_dir: Path, ttft: dict) -> dict:
    """TTFT error p50 and p99 (ms): against each request's true TTFT where the server reported
    one (the native mock), else against the known TTFT_MS."""
    errors = ttft_errors(run_dir)
    if errors:
        return {"ttft_error_p50_ms": pct(errors, 50), "ttft_error_p99_ms": pct(errors, 99)}
    return {"ttft_error_p50_ms": ttft["p50"] - TTFT_MS, "ttft_error_p99_ms": ttft["p99"] - TTFT_MS}


@contextmanager
def on_port(module_args: list[str], port_file: Path, wait_s: float) -> Iterator[str]:
    """`python -m ...` that writes its port to port_file; yields the port, ends it on exit."""
    proc = subprocess.Popen([sys.executable, "-m", *module_args, "--port-file", str(port_file)],
                            cwd=REPO)
    try:
        deadline = time.monotonic() + wait_s
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield port_file.read_text().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def delay_server(tmp: Path, protocol: str) -> Iterator[int]:
    """The known-delay reference server of one protocol; yields its port."""
    with on_port(["loadgen.delay_server", "--protocol", protocol, "--ttft-ms", str(TTFT_MS),
                  "--itl-ms", str(ITL_MS)], tmp / f"{protocol}.port", 15) as port:
        yield int(port)


REAL_SERVER = ("--preset", "small", "--max-batch-size", "8", "--torch-threads", "1",
               "--dtype", "float32")
REAL_LOAD = ("--rate", "3", "--prompt-tokens", "64", "--max-tokens", "32", "--warmup-s", "3")


def real_server_run(tmp: Path, duration_s: float, seed: int) -> dict:
    """The real small server at about the demo's load (batch near 8): the delivery lag in its
    three parts."""
    run_dir = tmp / "real"
    with on_port(["server", *REAL_SERVER, "--port", "0"], tmp / "real.port", 60) as port:
        locust = str(Path(sys.executable).parent / "locust")
        subprocess.run([locust, "-f", "loadgen/moe.py", "--host", f"127.0.0.1:{port}",
                        "--headless", "--only-summary", "-t", f"{round(duration_s)}s", *REAL_LOAD,
                        "--seed", str(seed), "--run-dir", str(run_dir)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    s = json.loads((run_dir / "summary.json").read_text())
    m, end = s["metrics"], s["server"]["end"]
    before = s["server"]["start"].get("write_ms")
    write = bucket_stats(Histogram(**end["write_ms"]), before and Histogram(**before))
    write_mean, write_p99 = (write.mean, write.p99) if write else (float("nan"), float("nan"))
    rest = m["delivery_lag_ms"]["mean"] - m["loop_lag_ms"]["mean"] - write_mean
    return {"mean_batch_size": end["mean_batch_size"],
            "delivery_lag_mean_ms": m["delivery_lag_ms"]["mean"],
            "delivery_lag_p99_ms": m["delivery_lag_ms"]["p99"],
            "loop_lag_mean_ms": m["loop_lag_ms"]["mean"],
            "loop_lag_p99_ms": m["loop_lag_ms"]["p99"],
            "write_mean_ms": write_mean, "write_p99_ms": write_p99, "rest_mean_ms": rest,
            "tpot_p50_ms": m["tpot_ms"]["p50"], "server_cpu_percent": end["process_cpu_percent"]}


# (row name, target, client): the default (what a user gets without --client) on the moe and
# openai targets, then the gevent client
DEFAULT_RUNS = (("moe", "moe", "auto"), ("openai", "openai", "auto"))
LOCUST_RUNS = (*DEFAULT_RUNS, ("moe_gevent", "moe", "gevent"),
               ("openai_gevent", "openai", "gevent"))
# what the default must hold (docs/design.md, "The default client"): its share of the schedule
# sent at every rate, and up to TTFT_UP_TO messages/s on the moe target its TTFT error p50 and
# p99 within TTFT_RATIO of bare grpc.aio's (medians of the rounds), on the openai target its
# TTFT p50 error at most TTFT_MOST_MS
SENT_PERCENT, TTFT_UP_TO, TTFT_RATIO, TTFT_MOST_MS = 97.0, 8_000, 1.2, 5.0


def default_holds(row: dict, name: str) -> list[str]:
    """Where the default run `name` misses what it must hold at this row's rate ([] if none)."""
    r, bare = row[name], row["grpc_aio"]
    misses = [] if r["sent_percent"] >= SENT_PERCENT else [f"sent {r['sent_percent']:.1f}%"]
    if row["target_messages_per_s"] > TTFT_UP_TO:
        return misses
    limits = ({q: TTFT_RATIO * bare[f"ttft_error_{q}_ms"] for q in ("p50", "p99")}
              if name == "moe" else {"p50": TTFT_MOST_MS})
    return misses + [f"TTFT {q} error {r[f'ttft_error_{q}_ms']:.2f} ms > {limit:.2f}"
                     for q, limit in limits.items() if r[f"ttft_error_{q}_ms"] > limit]


REST_RATE = 10.0  # requests/s: the at-rest comparison's
GRPC_WITHIN_MS = 1.0  # at rest, the moe target's TTFT p50 error within this of the openai one's


def at_rest(tmp: Path, hosts: dict[str, str], moe_port: int, duration_s: float,
            seed: int, repeats: int) -> dict[str, dict]:
    """At REST_RATE requests/s: our default on both targets, bare grpc.aio, and the peers
    (loadgen/bench_peers.py) on the openai target, in `repeats` interleaved rounds; each row's
    median TTFT errors over its rounds, or why it is skipped."""
    rounds: dict[str, list[dict]] = {}
    for n in range(repeats):
        round_dir = tmp / f"rest-{n}"
        round_dir.mkdir()
        for name, target, client in DEFAULT_RUNS:
            rounds.setdefault(name, []).append(locust_run(
                hosts[target], target, client, Load(REST_RATE, duration_s, seed + n),
                round_dir / name))
        rounds.setdefault("grpc_aio", []).append(
            asyncio.run(aio_run(moe_port, REST_RATE, duration_s, seed + n)))
        peers = peer_runs(hosts["openai"], REST_RATE, round(REST_RATE * duration_s), TOKENS,
                          seed + n, round_dir)
        for name, peer in peers.items():
            rounds.setdefault(name, []).append(peer if "skipped" in peer else {
                "client": name, "ttft_error_p50_ms": peer["ttft_p50_ms"] - TTFT_MS,
                "ttft_error_p99_ms": peer["ttft_p99_ms"] - TTFT_MS})
    rows = {}
    for name, runs in rounds.items():
        skipped = [r["skipped"] for r in runs if "skipped" in r]
        rows[name] = {"skipped": skipped[0]} if skipped else {
            "client": runs[0]["client"], "rounds": len(runs),
            **{key: statistics.median(r[key] for r in runs)
               for key in ("ttft_error_p50_ms", "ttft_error_p99_ms")},
            "ttft_error_p50_ms_each": [r["ttft_error_p50_ms"] for r in runs]}
    return rows


def print_at_rest(rows: dict[str, dict], duration_s: float) -> None:
    print(f"\nat rest ({REST_RATE:g} requests/s, poisson, {duration_s:g} s each, medians of "
          "interleaved rounds; ours timed from each request's scheduled time, the peers from "
          "their own sends):")
    for name, r in rows.items():
        if "skipped" in r:
            print(f"  {name:>9}: skipped, {r['skipped']}")
        else:
            each = " / ".join(f"{v:.2f}" for v in r["ttft_error_p50_ms_each"])
            print(f"  {name:>9} {r['client']:>8}: TTFT error p50 {r['ttft_error_p50_ms']:.2f} ms "
                  f"({each}), p99 {r['ttft_error_p99_ms']:.2f} ms")
    ours = rows["openai"]["ttft_error_p50_ms"]
    peers = {name: rows[name]["ttft_error_p50_ms"] for name in PEERS
             if "skipped" not in rows[name]}
    if peers:
        best = min(peers, key=peers.get)
        print(f"  openai TTFT p50 error {ours:.2f} ms against the closest peer's ({best}) "
              f"{peers[best]:.2f} ms: {'no larger' if ours <= peers[best] else 'LARGER'}")
    gap = rows["moe"]["ttft_error_p50_ms"] - ours
    print(f"  moe minus openai TTFT p50 error: {gap:+.2f} ms (within {GRPC_WITHIN_MS:g} ms: "
          f"{'yes' if gap <= GRPC_WITHIN_MS else 'NO'})")


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="python -m loadgen.bench_loadgen", description=__doc__)
    p.add_argument("--messages-per-s", type=float, nargs="+", default=[2000, 5000, 8000])
    p.add_argument("--duration-s", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3,
                   help="runs of the default on the moe target and of bare grpc.aio at each "
                   "rate, interleaved, their medians compared")
    p.add_argument("--rest-s", type=float, default=10,
                   help=f"each at-rest run's length ({REST_RATE:g} requests/s; 0: none)")
    p.add_argument("--rest-repeats", type=int, default=3,
                   help="interleaved at-rest rounds, their medians compared")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds: at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    with native_mock("grpc_mock", tmp, TTFT_MS, ITL_MS) as (moe_port, _), \
            delay_server(tmp, "openai") as openai_port:
        hosts = {"moe": f"127.0.0.1:{moe_port}", "openai": f"http://127.0.0.1:{openai_port}"}
        rows = [rate_row(tmp, hosts, moe_port, messages,
                         Load(messages / TOKENS, args.duration_s, args.seed), args.rounds)
                for messages in args.messages_per_s]
        rest = (at_rest(tmp, hosts, moe_port, args.rest_s, args.seed, args.rest_repeats)
                if args.rest_s and args.rest_repeats > 0 else {})
    real = real_server_run(tmp, max(args.duration_s, 20), args.seed)
    print(f"known delays: TTFT {TTFT_MS:g} ms, then {ITL_MS:g} ms per message, "
          f"{TOKENS} messages a stream; {args.duration_s:g} s per run, one process each\n")
    held, misses = print_rates(rows)
    if rest:
        print_at_rest(rest, args.rest_s)
    print_real_server(real)
    aio_delivery_p99_ms = statistics.median(r["grpc_aio"]["delivery_lag_p99_ms"] for r in rows)
    print(json.dumps({"rows": rows, "held_messages_per_s": held, "default_misses": misses,
                      "median_aio_delivery_p99_ms": aio_delivery_p99_ms, "at_rest": rest,
                      "real_server": real}))


def rate_row(tmp: Path, hosts: dict[str, str], moe_port: int, messages: float,
             load: Load, rounds: int) -> dict:
    """Every Locust run and bare grpc.aio at one rate (messages/s: load.rate x TOKENS); the
    default on the moe target and bare grpc.aio `rounds` times, interleaved (the order turned
    each round), each figure their median."""
    row = {"target_messages_per_s": messages, "requests_per_s": load.rate}
    for name, target, client in LOCUST_RUNS:
        if name != "moe":
            row[name] = locust_run(hosts[target], target, client, load,
                                   tmp / f"{name}-{messages:g}")
    pair: dict[str, list[dict]] = {"moe": [], "grpc_aio": []}
    for k in range(rounds):
        each = Load(load.rate, load.duration_s, load.seed + k)
        for name in ("moe", "grpc_aio")[::1 if k % 2 == 0 else -1]:
            pair[name].append(
                asyncio.run(aio_run(moe_port, each.rate, each.duration_s, each.seed))
                if name == "grpc_aio" else
                locust_run(hosts["moe"], "moe", "auto", each, tmp / f"moe-{messages:g}-{k}"))
    for name, runs in pair.items():
        row[name] = {key: statistics.median(r[key] for r in runs) if key != "client"
                     else runs[0][key] for key in runs[0]}
        row[name]["ttft_error_each_ms"] = [[r["ttft_error_p50_ms"], r["ttft_error_p99_ms"]]
                                           for r in runs]
    return row


def print_rates(rows: list[dict]) -> tuple[dict, dict]:
    """The table of every rate's runs and what it says; returns the rate each run held and
    where the default missed its targets."""
    print(f"{'msgs/s':>7} {'run':>13} {'sender':>8} {'achieved':>9} {'sent %':>7} "
          f"{'send p99':>9} {'deliv p50':>10} {'deliv p99':>10} "
          f"{'TTFT err p50':>13} {'p99':>7} {'CPU %':>6}")
    for row in rows:
        for name in (*(name for name, *_ in LOCUST_RUNS), "grpc_aio"):
            r = row[name]
            print(f"{row['target_messages_per_s']:>7g} {name:>13} {r['client']:>8} "
                  f"{r['messages_per_s']:>9.0f} {r['sent_percent']:>7.1f} "
                  f"{r['send_lag_p99_ms']:>9.2f} {r['delivery_lag_p50_ms']:>10.2f} "
                  f"{r['delivery_lag_p99_ms']:>10.2f} "
                  f"{r['ttft_error_p50_ms']:>13.2f} {r['ttft_error_p99_ms']:>7.2f} "
                  f"{r['cpu_percent']:>6.0f}")
    for row in rows:
        print(f"at {row['target_messages_per_s']:g} messages/s, TTFT error p50 / p99 (ms) each "
              "round: " + "; ".join(
                  f"{name} " + ", ".join(f"{p50:.2f} / {p99:.2f}"
                                         for p50, p99 in row[name]["ttft_error_each_ms"])
                  for name in ("moe", "grpc_aio")))
    held = {name: max((row["target_messages_per_s"] for row in rows
                       if row[name]["delivery_lag_p99_ms"] <= 5
                       and row[name]["send_lag_p99_ms"] <= 5),
                      default=None) for name, *_ in LOCUST_RUNS}
    print("\nsend and delivery lag p99 <= 5 ms up to (messages/s): "
          + ", ".join(f"{name} {rate}" for name, rate in held.items()))
    misses = {f"{name} at {row['target_messages_per_s']:g}": miss for row in rows
              for name, *_ in DEFAULT_RUNS if (miss := default_holds(row, name))}
    print(f"the default holds: sent >= {SENT_PERCENT:g}% at every rate; up to {TTFT_UP_TO:,} "
          f"messages/s, on moe TTFT error p50 and p99 <= {TTFT_RATIO:g}x bare grpc.aio's "
          f"(medians of the rounds), on openai TTFT p50 error <= {TTFT_MOST_MS:g} ms: "
          + ("yes" if not misses else "NO (" + "; ".join(
              f"{where}: {', '.join(miss)}" for where, miss in misses.items()) + ")"))
    for row in rows:
        gap = {suffix or "default": row[f"openai{suffix}"]["ttft_error_p50_ms"]
               - row[f"moe{suffix}"]["ttft_error_p50_ms"] for suffix in ("", "_gevent")}
        print(f"at {row['target_messages_per_s']:g} messages/s, openai TTFT p50 error minus "
              f"moe's: {gap['default']:+.2f} ms (default), {gap['_gevent']:+.2f} ms (gevent)")
    return held, misses


def print_real_server(real: dict) -> None:
    print(f"\nreal server ({' '.join(REAL_SERVER)}; {' '.join(REAL_LOAD)}): mean batch "
          f"{real['mean_batch_size']:.1f}, TPOT p50 {real['tpot_p50_ms']:.1f} ms, server CPU "
          f"{real['server_cpu_percent']:.0f}%")
    print(f"  delivery lag mean {real['delivery_lag_mean_ms']:.2f} ms, p99 "
          f"{real['delivery_lag_p99_ms']:.2f} ms =\n"
          f"  generator loop lag mean {real['loop_lag_mean_ms']:.2f} ms (p99 "
          f"{real['loop_lag_p99_ms']:.2f})\n"
          f"  + server write delay mean {real['write_mean_ms']:.2f} ms (p99 <= "
          f"{real['write_p99_ms']:g})\n"
          f"  + the rest (network, client decoding) mean {real['rest_mean_ms']:.2f} ms")

if __name__ == "__main__":
    main()
