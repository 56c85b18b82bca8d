"""What the gRPC targets share (moe, vllm-grpc, sglang-grpc, trtllm-grpc, triton): a channel per
Locust user (grpc's gevent integration) or per aio sender (grpc.aio), one server-streaming call
per request with the deadline --request-timeout-s, and gRPC status codes as the statuses. TLS
and the bearer token come from loadgen/targets/credentials.py, on every call, probes included.

Calls fail fast: a server that is down or gone answers UNAVAILABLE at once (no
wait_for_ready: requests queued behind a dead server would fail late, as CUT_OFF), and the
channel tries to reconnect within a second (CHANNEL_OPTIONS), so a run recovers as soon as
the server is back.

A subclass names its stub (`stub_class`) and turns the workload's request into its protocol's
(`request(spec)`) and each message into a Chunk (`chunk_of(msg, seen)`, seen: the output tokens
of the request's earlier messages); `call` is Generate unless the protocol differs. `plain(msg)`
reads a message of tokens alone without a Chunk, where the protocol allows it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc

from loadgen.targets.credentials import Credentials
from loadgen.targets.sniff import HTTP1, spoken
from loadgen.targets.target import Chunk, Receiver, RequestSpec, failure_of
from records.load_settings import TargetSettings
from records.server_stats import ServerStats

CONNECT_S = 2.0  # the aio sender waits this long for a channel before its first send
PROBE_S = 5.0
# Reconnect within a second; and a connection of the channel's own (gRPC otherwise shares one
# among channels with the same arguments, so every user's streams would queue on one HTTP/2
# connection under the server's --max-concurrent-streams).
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
                   ("grpc.use_local_subchannel_pool", 1))


@dataclass(frozen=True)
class Conn:
    """A channel and the stub of the service on it."""

    channel: grpc.Channel | grpc.aio.Channel
    stub: Any


class GrpcTarget:
    over_http = False
    asks_routing = False
    takes_text = True
    replies_text = True
    required: tuple[str, ...] = ()
    streams_text = False
    stub_class: ClassVar[type]

    def __init__(self, settings: TargetSettings):
        self.settings = settings
        self.credentials = Credentials(settings)

    def call(self, stub, request, timeout_s: float, metadata: tuple):
        """The server's messages for one request (a response iterator, sync or aio)."""
        return stub.Generate(request, timeout=timeout_s, metadata=metadata)

    def metadata_of(self, spec: RequestSpec) -> tuple:
        """The call's metadata: the bearer token, the request's id (x-request-id, as the HTTP
        targets send it: requests.jsonl's request_id), and a session's turn its session_id."""
        session = (("session_id", spec.session),) if spec.session else ()
        return (*self.credentials.metadata, ("x-request-id", spec.request_id), *session)

    def connect(self, host: str) -> Conn:
        channel = self.credentials.channel(host, CHANNEL_OPTIONS)
        return Conn(channel, self.stub_class(channel))

    def stream(self, conn: Conn, spec: RequestSpec, timeout_s: float) -> Iterator[Chunk]:
        seen = 0
        call = self.call(conn.stub, self.request(spec), timeout_s, self.metadata_of(spec))
        try:
            for msg in call:
                chunk = self.chunk_of(msg, seen)
                chunk.size = msg.ByteSize()
                seen += chunk.tokens
                yield chunk
        finally:
            call.cancel()  # a no-op once it ended; frees the server's work when the caller left

    async def aconnect(self, host: str) -> Conn:
        """Connected before the first send is due, so the first requests do not pay for it."""
        channel = self.credentials.channel(host, CHANNEL_OPTIONS, aio=True)
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=CONNECT_S)
        except TimeoutError:
            pass
        return Conn(channel, self.stub_class(channel))

    def plain(self, msg) -> tuple[int, int] | None:
        """A message that carries output tokens and nothing else the run keeps: (its tokens,
        the server's time for it in us, 0 unknown), handed to the aio sender's receiver without
        a Chunk (its fast path: most of a stream's messages). None: read through chunk_of,
        as every message of a target without a fast path is."""
        return None

    async def apush(self, conn: Conn, spec: RequestSpec, timeout_s: float,
                    receiver: Receiver) -> bool:
        """The server's messages, each handed to the receiver, timed as gRPC hands it over,
        before it is decoded. Never kernel-timed: gRPC owns its socket."""
        seen, ended = 0, False
        fast = not spec.turn  # a session's turn keeps its reply: every message read whole
        call = self.call(conn.stub, self.request(spec), timeout_s, self.metadata_of(spec))
        try:
            async for msg in call:
                arrived_ns = time.monotonic_ns()
                if fast and (tokens := self.plain(msg)) is not None:
                    seen += tokens[0]
                    leaves = receiver.timed(arrived_ns, *tokens, msg.ByteSize())
                else:
                    chunk = self.chunk_of(msg, seen)
                    chunk.size, chunk.arrived_ns = msg.ByteSize(), arrived_ns
                    seen += chunk.tokens
                    leaves = receiver.take(chunk)
                if leaves:
                    break
            else:
                ended = True
        finally:
            if not ended:  # left early (or failed): the server's work freed now
                call.cancel()
        return False

    def close(self, conn: Conn) -> None:
        conn.channel.close()

    async def aclose(self, conn: Conn) -> None:
        await conn.channel.close()

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """A gRPC error's code name and details, else what every target shares."""
        if isinstance(exc, grpc.RpcError):
            return exc.code().name, exc.details() or ""
        return failure_of(exc)

    def ask(self, host: str, rpc: str, request) -> Any:
        """One unary call on a channel of its own (a probe, a telemetry sample)."""
        with self.credentials.channel(host) as channel:
            return getattr(self.stub_class(channel), rpc)(request, timeout=PROBE_S,
                                                          metadata=self.credentials.metadata)

    def not_answering(self, host: str, exc: grpc.RpcError) -> str:
        return self.wrong_protocol(host, exc) or (
            f"{self.name} server at {host} is not answering: {exc.code().name}: {exc.details()}")

    def wrong_protocol(self, host: str, exc: grpc.RpcError) -> str:
        """Where the call failed as unavailable and the server speaks HTTP/1.1: so saying."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and (other := spoken(host)) == HTTP1:
            return f"{self.name} server at {host} does not answer in gRPC: it speaks {other}"
        return ""

    def stats(self, host: str) -> ServerStats | None:
        return None
