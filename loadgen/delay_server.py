"""A reference server that speaks the moe.v1 contract with known delays, to check a load
generator's numbers against the truth (the tests and `make bench-loadgen` use it): the
first token after --ttft-ms, then one every --itl-ms; at most --capacity streams at once
(the rest queue, so the capacity in requests/s is known); and, optionally, every stream
stalls from --stall-at-s after start for --stall-s (a hiccup a closed loop would hide).

    python -m loadgen.delay_server --port-file PATH [--ttft-ms 20 --itl-ms 10 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

import grpc

from proto import moe_pb2, moe_pb2_grpc


class DelayService(moe_pb2_grpc.MoEInferenceServicer):
    def __init__(self, args):
        self.args = args
        self.started = time.monotonic()
        self.slots = asyncio.Semaphore(args.capacity)
        self.finished = 0

    async def wait_until(self, due_s: float) -> float:
        """Sleeps until due_s (monotonic), plus whatever of the stall window the wake-up falls
        into; returns the stall it waited, by which every later message of the stream moves."""
        await asyncio.sleep(max(0.0, due_s - time.monotonic()))
        stall_from = self.started + self.args.stall_at_s
        now = time.monotonic()
        if self.args.stall_s and stall_from <= now < stall_from + self.args.stall_s:
            await asyncio.sleep(stall_from + self.args.stall_s - now)
            return stall_from + self.args.stall_s - now
        return 0.0

    async def Generate(self, request, context):
        received = time.monotonic_ns()
        async with self.slots:
            # Deadlines from the moment the stream got its slot, not from the previous wake-up:
            # a late wake-up (a busy machine) does not push back every later message.
            due_s = time.monotonic()
            for i in range(request.max_tokens):
                due_s += (self.args.ttft_ms if i == 0 else self.args.itl_ms) / 1e3
                due_s += await self.wait_until(due_s)
                elapsed_us = (time.monotonic_ns() - received) // 1000
                msg = moe_pb2.GenerateResponse(token_ids=[65], text="A",
                                               server_elapsed_us=elapsed_us)
                if i == request.max_tokens - 1:
                    msg.finish_reason = moe_pb2.GenerateResponse.LENGTH
                    msg.usage.completion_tokens = request.max_tokens
                yield msg
        self.finished += 1

    async def GetStats(self, request, context):
        return moe_pb2.EngineStats(policy="delay", requests_finished=self.finished,
                                   uptime_s=time.monotonic() - self.started)


async def serve(args) -> None:
    server = grpc.aio.server()
    moe_pb2_grpc.add_MoEInferenceServicer_to_server(DelayService(args), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    with open(f"{args.port_file}.tmp", "w") as f:
        f.write(f"{port}\n")
    os.replace(f"{args.port_file}.tmp", args.port_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port-file", required=True)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--capacity", type=int, default=10_000, help="streams served at once")
    p.add_argument("--stall-at-s", type=float, default=0.0)
    p.add_argument("--stall-s", type=float, default=0.0)
    asyncio.run(serve(p.parse_args()))


if __name__ == "__main__":
    main()
