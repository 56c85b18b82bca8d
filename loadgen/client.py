"""One streaming Generate call, timed with a monotonic clock. Never raises for RPC errors:
the result says what happened, so every request is accounted for."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from proto import moe_pb2, moe_pb2_grpc
from records.jsonform import from_json
from records.server_stats import ServerStats

CUT_OFF = "CUT_OFF"  # the status of a request still streaming when the run's drain ended


@dataclass
class StreamResult:
    request_id: str
    scheduled_ns: int
    klass: str = ""  # the request class (mixed mode, dataset), "" without classes
    sent_ns: int = 0
    recv_ns: list[int] = field(default_factory=list)  # arrival of each message
    tokens: list[int] = field(default_factory=list)  # tokens in each message
    server_elapsed_us: list[int] = field(default_factory=list)  # the server's time of each message
    status: str = "OK"  # "OK" or the gRPC status code name
    details: str = ""
    finish_reason: str = ""
    usage: dict[str, int] = field(default_factory=dict)  # the server's own account

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    def received(self, msg: moe_pb2.GenerateResponse, now_ns: int) -> None:
        """One stream message: when it arrived, its tokens, and the server's time for it."""
        self.recv_ns.append(now_ns)
        self.tokens.append(len(msg.token_ids))
        self.server_elapsed_us.append(msg.server_elapsed_us)


def stream_generate(stub, request: moe_pb2.GenerateRequest, result: StreamResult, timeout_s: float,
                    clock: Callable[[], int] = time.monotonic_ns) -> None:
    """Sends request and fills result in place, so a caller that has to abandon the call
    still holds what arrived before."""
    result.sent_ns = clock()
    try:
        last = None
        for msg in stub.Generate(request, timeout=timeout_s, wait_for_ready=True):
            result.received(msg, clock())
            last = msg
        close_stream(result, last)
    except Exception as exc:  # an RPC error, a bad reply or a client bug: counted, never lost
        fail(result, exc)


def fail(result: StreamResult, exc: Exception) -> None:
    """The status of a stream that raised: the gRPC code, or CLIENT_ERROR for anything else."""
    if isinstance(exc, grpc.RpcError):
        result.status, result.details = exc.code().name, exc.details() or ""
    else:
        result.status, result.details = "CLIENT_ERROR", repr(exc)


def cut_off(result: StreamResult, drain_s: float) -> None:
    result.status = CUT_OFF
    result.details = f"still streaming {drain_s:g} s after the run ended (--drain-s)"


def close_stream(result: StreamResult, last) -> None:
    """Status, finish reason and the server's own account from a stream's last message."""
    if last is None or not last.finish_reason:
        result.status, result.details = "INCOMPLETE", "stream ended without a finish_reason"
        return
    result.finish_reason = moe_pb2.GenerateResponse.FinishReason.Name(last.finish_reason)
    result.usage = message_dict(last.usage)


def server_stats(host: str) -> ServerStats:
    """GetStats (expert_tokens as [layer][expert]), or why it could not be had: the run goes on
    without it."""
    try:
        with grpc.insecure_channel(host) as channel:
            stub = moe_pb2_grpc.MoEInferenceStub(channel)
            reply = stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5)
    except grpc.RpcError as exc:
        return ServerStats(error=f"GetStats failed: {exc.code().name}: {exc.details()}")
    stats = message_dict(reply)
    stats["expert_tokens"] = [layer["tokens"] for layer in stats["expert_tokens"]]
    return from_json(ServerStats, stats, "GetStats")


def message_dict(msg) -> dict:
    """A protobuf message as plain JSON types (64-bit ints stay numbers, unlike MessageToDict)."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.message_type is None:
            out[f.name] = list(value) if f.is_repeated else value
        elif f.message_type.GetOptions().map_entry:
            out[f.name] = dict(value)
        elif f.is_repeated:
            out[f.name] = [message_dict(v) for v in value]
        elif msg.HasField(f.name):
            out[f.name] = message_dict(value)
    return out
