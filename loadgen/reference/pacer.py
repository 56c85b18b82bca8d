"""The known schedule every reference server follows (loadgen/delay_server.py describes it):
each stream's messages, when each is due, the stall window and the faults in turn; what it did
is counted in its Tally (loadgen/reference/tally.py) for its /metrics."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from loadgen.reference.seeded_routing import POOL, Asked, Shape, Truth, draw
from loadgen.reference.tally import Tally

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
        self.tally = Tally(args.kv_tokens, args.preempt_every, args.seed, args.prefix_cache)
        self.shape = Shape.of(args.moe_shape)
        self.truth = Truth(self.shape)  # the routed experts sent (--routed-experts)
        self.routed_numbers = itertools.count()

    def routing(self, body: dict, prompt_tokens: int, max_tokens: int,
                fault: str) -> tuple[dict, dict]:
        """A request's routed experts as --routed-experts sends them (loadgen/reference/
        routing.py): (fields of its last choice, of a response-level event)."""
        mode = self.args.routed_experts
        if mode == "off":
            return {}, {}
        request = Asked(prompt_tokens, max_tokens, mode, bool(body.get("return_routed_experts")),
                        body.get("stream") is False, fault)
        sent = draw(self.shape, self.args.seed, next(self.routed_numbers) % POOL, request)
        if any(sent.fields) and not fault.startswith("routing-"):
            self.truth.add(sent)
        return sent.fields

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

    async def messages(self, max_tokens: int, prompt: Sequence = ()) -> AsyncIterator[Message]:
        """A stream of max_tokens tokens, each message at its time; prompt: its token ids (or
        words), for the tally."""
        received = time.monotonic_ns()
        if self.first_arrival is None:
            self.first_arrival = received / 1e9
        per_chunk = self.args.tokens_per_chunk
        tally = self.tally
        admitted = arrived = False
        sent = 0
        try:
            tally.arrived(prompt)
            arrived = True
            async with self.slots:
                stream = tally.admitted(len(prompt), (time.monotonic_ns() - received) / 1e9)
                admitted = True
                # Deadlines from the moment the stream got its slot, not from the previous
                # wake-up: a late wake-up (a busy machine) does not push back every later message.
                start_s, stalled_s = time.monotonic(), 0.0
                last_ns = received
                while sent < max_tokens:
                    n = 1 if sent == 0 else min(per_chunk, max_tokens - sent)
                    last_token = sent + n - 1
                    due_s = start_s + stalled_s + (self.args.ttft_ms
                                                   + last_token * self.args.itl_ms) / 1e3
                    stalled_s += await self.wait_until(due_s)
                    now_ns = time.monotonic_ns()
                    tally.sent(stream, sent, n, max_tokens, (now_ns - last_ns) / 1e9)
                    last_ns = now_ns
                    sent += n  # counted before the yield: a client that leaves there held them
                    yield Message(n, sent - n, sent == max_tokens, (now_ns - received) // 1000)
        finally:  # a stream the client left, or a fault ended, counts as ended too
            if admitted:
                tally.ended(len(prompt) + sent, (time.monotonic_ns() - received) / 1e9)
            elif arrived:
                tally.waiting -= 1
        self.finished += 1
