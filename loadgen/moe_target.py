"""The `moe` target: this project's own contract, moe.v1.MoEInference over gRPC (proto/moe.proto).

Requests go as token ids with ignore_eos, so their lengths are exact; every message carries
the server's time since it received the request (delivery lag) and the last one its own
account of the request (queue, prefill, decode, TTFT). GetStats is sampled during the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadgen.target import Chunk, RequestSpec, failure_of
from proto import moe_pb2, moe_pb2_grpc
from records.jsonform import from_json
from records.load_settings import TargetSettings
from records.server_stats import ServerStats

SERVICE = moe_pb2.DESCRIPTOR.services_by_name["MoEInference"].full_name
CONNECT_S = 2.0  # the aio sender waits this long for a channel before its first send


@dataclass(frozen=True)
class Conn:
    """A channel and the stub of the service on it."""

    channel: grpc.Channel | grpc.aio.Channel
    stub: object


async def ready(channel: grpc.aio.Channel) -> None:
    """Connected before the first send is due, so the first requests do not pay for it; with no
    server yet, requests wait for it (wait_for_ready) and count their lateness."""
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout=CONNECT_S)
    except TimeoutError:
        pass


class MoeTarget:
    name = "moe"
    over_http = False
    streams_text = False

    def __init__(self, settings: TargetSettings):
        self.settings = settings

    def request(self, spec: RequestSpec) -> moe_pb2.GenerateRequest:
        prompt = ({"prompt_token_ids": spec.prompt_ids} if spec.prompt_ids
                  else {"prompt": spec.prompt_text})
        return moe_pb2.GenerateRequest(request_id=spec.request_id, max_tokens=spec.max_tokens,
                                       ignore_eos=True, **prompt)

    def connect(self, host: str) -> Conn:
        channel = grpc.insecure_channel(host)
        return Conn(channel, moe_pb2_grpc.MoEInferenceStub(channel))

    def stream(self, conn: Conn, spec: RequestSpec, timeout_s: float) -> Iterator[Chunk]:
        for msg in conn.stub.Generate(self.request(spec), timeout=timeout_s, wait_for_ready=True):
            yield chunk_of(msg)

    async def aconnect(self, host: str) -> Conn:
        channel = grpc.aio.insecure_channel(host)
        await ready(channel)
        return Conn(channel, moe_pb2_grpc.MoEInferenceStub(channel))

    async def astream(self, conn: Conn, spec: RequestSpec,
                      timeout_s: float) -> AsyncIterator[Chunk]:
        call = conn.stub.Generate(self.request(spec), timeout=timeout_s, wait_for_ready=True)
        async for msg in call:
            yield chunk_of(msg)

    def close(self, conn: Conn) -> None:
        conn.channel.close()

    async def aclose(self, conn: Conn) -> None:
        await conn.channel.close()

    def failure(self, exc: BaseException) -> tuple[str, str]:
        return grpc_failure(exc)

    def probe(self, host: str) -> str:
        return grpc_probe(host, SERVICE, "moe")

    def stats(self, host: str) -> ServerStats:
        return server_stats(host)


def chunk_of(msg: moe_pb2.GenerateResponse) -> Chunk:
    if not msg.finish_reason:
        return Chunk(tokens=len(msg.token_ids), server_elapsed_us=msg.server_elapsed_us)
    return Chunk(tokens=len(msg.token_ids), server_elapsed_us=msg.server_elapsed_us,
                 finish_reason=moe_pb2.GenerateResponse.FinishReason.Name(msg.finish_reason),
                 usage=message_dict(msg.usage))


def grpc_failure(exc: BaseException) -> tuple[str, str]:
    """A gRPC error's code name and details, else what every target shares."""
    if isinstance(exc, grpc.RpcError):
        return exc.code().name, exc.details() or ""
    return failure_of(exc)


def grpc_probe(host: str, service: str, protocol: str) -> str:
    """The standard gRPC health check of one service; "" when it is serving."""
    try:
        with grpc.insecure_channel(host) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5)
    except grpc.RpcError as exc:
        return f"{protocol} server at {host} is not answering: {exc.code().name}: {exc.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return f"{protocol} server at {host} is not serving ({status})"
    return ""


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

