"""Reference servers with known delays, one per protocol the load generator speaks (--protocol:
every target's), to check its numbers against the truth (the tests and `make bench-loadgen`).

Every stream follows one schedule: its first token after --ttft-ms, then one every --itl-ms;
tokens go out --tokens-per-chunk at a time (the first alone, as vLLM's stream interval does),
so TTFT, TPOT and the per-token ITL are known and a message's ITL is the chunk's. At most
--capacity streams run at once (the rest queue, so the capacity in requests/s is known);
optionally every stream stalls from --stall-at-s after the first stream arrived for --stall-s
(a hiccup a closed loop would hide; timed from the first arrival, so a client's start-up does
not decide whether its requests meet it). --faults KIND,... spoils streams in turn (every
len+1-th is left whole) in one of the protocol's ways (delay_grpc.py, delay_http.py), for the
tests of bad replies.

    python -m loadgen.delay_server --port-file PATH [--protocol openai --ttft-ms 20 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

PROTOCOLS = ("moe", "openai", "vllm-grpc", "sglang-grpc", "trtllm-grpc", "triton")


@dataclass(frozen=True)
class Message:
    """One message of a stream, when it is due."""

    tokens: int  # tokens it carries
    index: int  # of its first token in the stream
    last: bool
    elapsed_us: int  # since the stream's request arrived


class Pacer:
    """The known schedule, shared by every protocol's server."""

    def __init__(self, args):
        self.args = args
        self.started = time.monotonic()
        self.first_arrival: float | None = None  # the stall is timed from it
        self.slots = asyncio.Semaphore(args.capacity)
        self.faults = [f for f in args.faults.split(",") if f]
        self.arrivals = itertools.count()
        self.finished = 0

    def fault(self) -> str:
        """The fault of the stream arriving now ("" for none): each in turn, then a whole one."""
        if not self.faults:
            return ""
        turn = next(self.arrivals) % (len(self.faults) + 1)
        return self.faults[turn] if turn < len(self.faults) else ""

    async def wait_until(self, due_s: float) -> float:
        """Sleeps until due_s (monotonic), plus whatever of the stall window the wake-up falls
        into; returns the stall it waited, by which every later message of the stream moves."""
        await asyncio.sleep(max(0.0, due_s - time.monotonic()))
        stall_from = self.first_arrival + self.args.stall_at_s
        now = time.monotonic()
        if self.args.stall_s and stall_from <= now < stall_from + self.args.stall_s:
            await asyncio.sleep(stall_from + self.args.stall_s - now)
            return stall_from + self.args.stall_s - now
        return 0.0

    async def messages(self, max_tokens: int) -> AsyncIterator[Message]:
        """A stream of max_tokens tokens, each message at its time."""
        received = time.monotonic_ns()
        if self.first_arrival is None:
            self.first_arrival = received / 1e9
        per_chunk = self.args.tokens_per_chunk
        async with self.slots:
            # Deadlines from the moment the stream got its slot, not from the previous wake-up:
            # a late wake-up (a busy machine) does not push back every later message.
            start_s, stalled_s = time.monotonic(), 0.0
            sent = 0
            while sent < max_tokens:
                n = 1 if sent == 0 else min(per_chunk, max_tokens - sent)
                last_token = sent + n - 1
                due_s = start_s + stalled_s + (self.args.ttft_ms
                                               + last_token * self.args.itl_ms) / 1e3
                stalled_s += await self.wait_until(due_s)
                elapsed_us = (time.monotonic_ns() - received) // 1000
                yield Message(n, sent, sent + n == max_tokens, elapsed_us)
                sent += n
        self.finished += 1


def write_port(path: str, port: int) -> None:
    with open(f"{path}.tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(f"{path}.tmp", path)  # readers never see a half-written file


async def serve(args) -> None:
    pacer = Pacer(args)
    if args.protocol == "openai":
        from loadgen.delay_http import start
    else:
        from loadgen.delay_grpc import start
    port, stop_server = await start(args.protocol, pacer)
    write_port(args.port_file, port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await stop_server()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
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
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
