"""Reference servers with known delays, one per protocol the load generator speaks (--protocol:
every target's), to check its numbers against the truth (the tests and `make bench-loadgen`).

Every stream follows one schedule: its first token after --ttft-ms, then one every --itl-ms;
tokens go out --tokens-per-chunk at a time (the first alone, as vLLM's stream interval does),
so TTFT, TPOT and the per-token ITL are known and a message's ITL is the chunk's. At most
--capacity streams run at once (the rest queue, so the capacity in requests/s is known);
optionally every stream stalls from --stall-at-s after the first stream arrived for --stall-s
(a hiccup a closed loop would hide; timed from the first arrival, so a client's start-up does
not decide whether its requests meet it). --faults KIND,... spoils streams in turn (every
len+1-th is left whole; `none` leaves one whole too, to space them out) in one of the
protocol's ways (loadgen/reference/), for the tests of bad replies.

Each serves /metrics as the engine it stands for would (the openai one vLLM's, on its own
port; the vllm-grpc and sglang-grpc ones vLLM's and SGLang's on a side HTTP port,
--metrics-port-file), from what it did: its queue, running streams, KV tokens held against
--kv-tokens, preemptions (--preempt-every), prefix-cache hits, tokens, its own TTFT and
inter-token times, and for SGLang a seeded expert balance (loadgen/reference/tally.py).

    python -m loadgen.delay_server --port-file PATH [--protocol openai --ttft-ms 20 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from loadgen.reference.pacer import PROTOCOLS, Pacer
from loadgen.reference.seeded_routing import SHAPE
from records.cli import Parser
from records.expert_routes import moe_shape_problem

SIDE_METRICS = ("vllm-grpc", "sglang-grpc")  # gRPC servers with /metrics on a side port


def write_port(path: str, port: int) -> None:
    with open(f"{path}.tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(f"{path}.tmp", path)  # readers never see a half-written file


async def serve(args) -> None:
    pacer = Pacer(args)
    if args.protocol == "openai":
        from loadgen.reference.http_server import start
    else:
        from loadgen.reference.grpc_servers import start
    port, stop_server = await start(args.protocol, pacer)
    stops = [stop_server]
    if args.metrics_port_file and args.protocol in SIDE_METRICS:
        from loadgen.reference.http_server import metrics_app, serve_app
        metrics_port, stop_metrics = await serve_app(metrics_app(args.protocol, pacer), 0)
        stops.append(stop_metrics)
        write_port(args.metrics_port_file, metrics_port)
    write_port(args.port_file, port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for stop_one in stops:
        await stop_one()


def shape(text: str) -> str:
    if problem := moe_shape_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def main() -> None:
    p = Parser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port-file", required=True)
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--protocol", choices=PROTOCOLS, default="moe")
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--capacity", type=int, default=10_000, help="streams served at once")
    p.add_argument("--stall-at-s", type=float, default=0.0)
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--faults", default="", help="comma-separated faults, in turn")
    p.add_argument("--kv-tokens", type=int, default=65536,
                   help="/metrics: the KV pool its running streams' tokens fill")
    p.add_argument("--preempt-every", type=int, default=0,
                   help="/metrics: every Nth stream is preempted once (0: none)")
    p.add_argument("--seed", type=int, default=0, help="/metrics: the expert load's seed")
    p.add_argument("--reasoning-tokens", type=int, default=0,
                   help="openai chat: each stream's first N tokens are reasoning "
                   "(reasoning_content deltas), the rest the answer")
    p.add_argument("--routed-experts", choices=("off", "vllm", "sglang"), default="off",
                   help="openai: return each request's seeded routed experts as vLLM or SGLang "
                   "does, serve SGLang's recorder endpoints and /expert_truth")
    p.add_argument("--moe-shape", default=SHAPE, type=shape,
                   help="the routed experts' LAYERSxEXPERTSxTOP_K (default %(default)s)")
    p.add_argument("--recorder-fault", choices=("none", "error", "garbage"), default="none",
                   help="the recorder's dump answers HTTP 500, or writes a file that is not one")
    p.add_argument("--no-health", dest="health", action="store_false",
                   help="moe: leave out the standard grpc.health.v1 service (a user's own "
                   "moe.v1 server, an older build)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="/metrics: count prefix-cache queries, never a hit")
    p.add_argument("--metrics-port-file", default="",
                   help=f"{', '.join(SIDE_METRICS)}: serve /metrics on a side HTTP port, "
                   "written here")
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
