"""One streaming request through a target, timed with a monotonic clock. Never raises: the
result says what happened, so every request is accounted for.

The counting rule, the same for every target (docs/metrics.md): a message counts once it
carries at least one token; its receive time and token count are kept. Messages without
tokens (a role or usage event) are read for the finish reason and usage only. Where the
protocol sends text, each message's text is kept until the stream ends and then counted
(loadgen/targets/text_tokens.py); a message left with no token merges into the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadgen.targets.routed_experts import RoutingReader
from loadgen.targets.target import Chunk, RequestSpec, Target
from records.requests import CLIENT_CANCELLED, CUT_OFF

# (texts, usage) -> tokens of each text: loadgen/targets/text_tokens.py's TextCounter
Counter = Callable[[list[str], dict[str, int]], list[int]]


@dataclass
class StreamResult:
    request_id: str
    scheduled_ns: int
    request_class: str = ""  # the request class (mixed mode, dataset), "" without classes
    max_tokens: int = 0  # the output tokens asked for
    sent_ns: int = 0
    recv_ns: list[int] = field(default_factory=list)  # arrival of each message with tokens
    tokens: list[int] = field(default_factory=list)  # tokens in each of them
    # the server's time of each; 0 unknown
    server_elapsed_us: list[int] = field(default_factory=list)
    status: str = "OK"  # "OK", or the failure's status (docs/metrics.md)
    details: str = ""
    finish_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)  # the server's own account
    texts: list[str] = field(default_factory=list)  # a text protocol's messages, until counted
    reasoning: list[bool] = field(default_factory=list)  # each message: reasoning, not answer
    session: str = ""  # the session it is a turn of, "" none
    turn: int = 0
    # a session's turn keeps the reply for the next turn's history: its token ids where the
    # protocol streams them, its answer's text where it streams text
    reply_ids: list[int] = field(default_factory=list)
    reply_texts: list[str] = field(default_factory=list)
    received_bytes: int = 0  # the size of its messages (Chunk.size), all of them
    # the JSON text of each message that carried routed experts (Chunk.routed), until read: the
    # process that records the request reads it, not the one that times the streams
    routed_raw: list[str] = field(default_factory=list)
    routing: dict = field(default_factory=dict)  # RoutedRow's fields, once read (routing on)
    streamed: bool = True  # False: its reply came whole (Chunk.whole), so it is not timed
    # its messages were timed by the kernel's receipt, not by the client's read of them
    # (docs/metrics.md, "Arrival times")
    kernel_timed: bool = False
    cancel_after: int = 0  # RequestSpec.cancel_after: the client leaves after this many tokens

    @classmethod
    def of(cls, spec: RequestSpec, scheduled_ns: int) -> StreamResult:
        return cls(spec.request_id, scheduled_ns, spec.request_class, spec.max_tokens,
                   session=spec.session, turn=spec.turn, cancel_after=spec.cancel_after)

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    def received(self, chunk: Chunk, now_ns: int) -> None:
        """One streamed message: when it arrived, its tokens (one a text message, until it is
        counted), the server's time for it, its bytes, and on the stream's last messages its
        finish reason and usage."""
        if chunk.tokens or chunk.text:
            self.recv_ns.append(now_ns)
            self.tokens.append(chunk.tokens or 1)
            self.server_elapsed_us.append(chunk.server_elapsed_us)
            self.reasoning.append(chunk.reasoning)
            if chunk.text:
                self.texts.append(chunk.text)
            if self.turn and not chunk.reasoning:
                self.reply_ids.extend(chunk.ids)
                if chunk.text or chunk.history_text:
                    self.reply_texts.append(chunk.text or chunk.history_text)
        self.received_bytes += chunk.size
        self.streamed = self.streamed and not chunk.whole
        if chunk.routed:
            self.routed_raw.append(chunk.routed)
        self.finish_reason = chunk.finish_reason or self.finish_reason
        self.usage |= chunk.usage

    def take(self, chunk: Chunk) -> bool:
        """The aio sender's message (loadgen/targets/target.py's Receiver), at its arrival
        where its reader stamped it, else now; whether the client cancels now."""
        self.received(chunk, chunk.arrived_ns or time.monotonic_ns())
        return self.cancels()

    def timed(self, arrived_ns: int, tokens: int, server_elapsed_us: int, size: int) -> bool:
        """A message of output tokens and nothing else the run keeps, as `received` would
        record it, for a fraction of its cost (most messages of a stream come this way);
        whether the client cancels now."""
        self.recv_ns.append(arrived_ns)
        self.tokens.append(tokens)
        self.server_elapsed_us.append(server_elapsed_us)
        self.reasoning.append(False)
        self.received_bytes += size
        return self.cancel_after > 0 and self.cancels()

    def cancels(self) -> bool:
        """Whether the client cancels now, the tokens it waited for having arrived (and the
        stream not ended with them)."""
        if (not self.cancel_after or self.finish_reason
                or sum(self.tokens) < self.cancel_after):
            return False
        self.status = CLIENT_CANCELLED
        self.details = f"cancelled by the client after {sum(self.tokens)} tokens (--cancel-share)"
        return True

    def close(self, count: Counter) -> None:
        """After the stream's end, or its failure: a text stream's messages counted, and a
        stream that did not end as a stream should is not ok."""
        if self.texts:
            counted = count(self.texts, self.usage)
            kept = [i for i, n in enumerate(counted) if n]
            # a message without a token merges into the next one with tokens
            self.recv_ns = [self.recv_ns[i] for i in kept]
            self.server_elapsed_us = [self.server_elapsed_us[i] for i in kept]
            self.reasoning = [self.reasoning[i] for i in kept]
            self.tokens = [counted[i] for i in kept]
            self.texts = []
        if self.ok and not self.finish_reason:
            self.status, self.details = "INCOMPLETE", "stream ended without a finish reason"
        elif self.ok and self.finish_reason.lower() == "abort":
            self.status, self.details = "ABORTED", "the server gave up on the request " \
                                                   "(finish reason abort: a shutdown)"
        elif self.ok and not self.tokens:
            self.status, self.details = "NO_OUTPUT", "stream ended without a token"

    def read_routing(self, reader: RoutingReader) -> None:
        """Once it has ended: the routed experts that came, decoded (routing capture on)."""
        pieces = [piece for text in self.routed_raw for piece in reader.pieces(text)]
        self.routing = reader.fields(pieces, self.usage)
        if not self.ok and not self.routed_raw:
            self.routing["lacking"] = f"the request ended {self.status}"
        self.routed_raw = []


def stream_request(target: Target, conn, spec: RequestSpec, result: StreamResult,
                   timeout_s: float, count: Counter) -> None:
    """Sends spec and fills result in place, so a caller that has to abandon the call still
    holds what arrived before."""
    result.sent_ns = time.monotonic_ns()
    stream = target.stream(conn, spec, timeout_s)
    try:
        for chunk in stream:
            result.received(chunk, time.monotonic_ns())
            if result.cancels():
                break
    except Exception as exc:  # an error, a bad reply or a client bug: counted, never lost
        result.status, result.details = target.failure(exc)
    finally:
        stream.close()  # a cancelled call is cancelled now, not when collected
    result.close(count)


async def astream_request(target: Target, conn, spec: RequestSpec, result: StreamResult,
                          timeout_s: float, count: Counter) -> None:
    """stream_request on asyncio (the aio sender), through the target's apush: each message
    handed to the result as it arrives, timed where it arrived."""
    result.sent_ns = time.monotonic_ns()
    try:
        result.kernel_timed = await target.apush(conn, spec, timeout_s, result)
    except Exception as exc:  # as stream_request
        result.status, result.details = target.failure(exc)
    result.close(count)


def cut_off(result: StreamResult, drain_s: float) -> None:
    result.status = CUT_OFF
    result.details = f"still streaming {drain_s:g} s after the run ended (--drain-s)"
    result.texts = []  # its messages count a token each
