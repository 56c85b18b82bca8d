"""The `moe` target: this project's own contract, moe.v1.MoEInference over gRPC
(proto/moe.proto).

Requests go as token ids with ignore_eos, so their lengths are exact; every message carries
the server's time since it received the request (delivery lag) and the last one its own
account of the request (queue, prefill, decode, TTFT). GetStats is sampled during the run.
"""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loadgen.targets.grpc_stream import PROBE_S, GrpcTarget
from loadgen.targets.target import Chunk, RequestSpec
from proto import moe_pb2, moe_pb2_grpc
from records.jsonform import from_json
from records.server_stats import ServerStats

SERVICE = moe_pb2.DESCRIPTOR.services_by_name["MoEInference"].full_name
# the health check's answers from a server without the standard service (or without the
# service named in it): an answer all the same
NO_HEALTH_SERVICE = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)
log = logging.getLogger("loadgen")


class MoeTarget(GrpcTarget):
    name = "moe"
    stub_class = moe_pb2_grpc.MoEInferenceStub

    def request(self, spec: RequestSpec) -> moe_pb2.GenerateRequest:
        prompt = ({"prompt_token_ids": spec.prompt_ids} if spec.prompt_ids
                  else {"prompt": spec.prompt_text})
        return moe_pb2.GenerateRequest(request_id=spec.request_id, max_tokens=spec.max_tokens,
                                       ignore_eos=True, **prompt)

    def plain(self, msg: moe_pb2.GenerateResponse) -> tuple[int, int] | None:
        if msg.finish_reason or not (tokens := len(msg.token_ids)):
            return None
        return tokens, msg.server_elapsed_us

    def chunk_of(self, msg: moe_pb2.GenerateResponse, seen: int) -> Chunk:
        if not msg.finish_reason:
            return Chunk(tokens=len(msg.token_ids), server_elapsed_us=msg.server_elapsed_us,
                         ids=msg.token_ids, history_text=msg.text)
        return Chunk(tokens=len(msg.token_ids), server_elapsed_us=msg.server_elapsed_us,
                     ids=msg.token_ids, history_text=msg.text,
                     finish_reason=moe_pb2.GenerateResponse.FinishReason.Name(msg.finish_reason),
                     usage=message_dict(msg.usage))

    def probe(self, host: str) -> str:
        """The standard gRPC health check of the service."""
        try:
            with self.credentials.channel(host) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE), timeout=PROBE_S,
                    metadata=self.credentials.metadata)
        except grpc.RpcError as exc:
            if exc.code() in NO_HEALTH_SERVICE:  # it answered: it is up
                log.warning("moe server at %s answers but has no grpc.health.v1 check for %s "
                            "(%s): readiness could not be checked; going on", host, SERVICE,
                            exc.code().name)
                return ""
            return self.not_answering(host, exc)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return f"moe server at {host} is not serving ({status})"
        return ""

    def not_answering(self, host: str, exc: grpc.RpcError) -> str:
        if wrong := self.wrong_protocol(host, exc):
            return wrong
        port = host.rpartition(":")[2]
        return (f"{super().not_answering(host, exc)} (start one with: python -m server --port "
                f"{port}; or check --host)")

    def stats(self, host: str) -> ServerStats:
        """GetStats (expert_tokens as [layer][expert]), or why it could not be had: the run goes
        on without it."""
        try:
            reply = self.ask(host, "GetStats", moe_pb2.GetStatsRequest())
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

