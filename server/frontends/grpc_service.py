"""The gRPC face of the server: validation, streaming, status codes, health, reflection.

This module, server/app.py and server/frontends/security.py (TLS, tokens) are the server's only
ones that know gRPC. Requests are checked and submitted by server/frontends/admission.py,
shared with the HTTP front end; domain errors become status codes by the table both front ends
share (server/frontends/statuses.py); a cancelled call or an expired deadline leaves its stream,
which frees its KV slot before the next engine step.
"""

from __future__ import annotations

import logging
import time

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from proto import moe_pb2, moe_pb2_grpc
from records.declare import SettingsError
from records.server_settings import Limits, ServerSettings
from server.errors import ServerError, ShutdownError
from server.frontends.admission import Admission, GenerationRequest
from server.frontends.getstats import settings_fields, stats_message
from server.frontends.security import Guard, Tokens, client_of, metadata_value, peer_host
from server.frontends.statuses import retry_after_s, status_of
from server.scheduling.policies import knobs
from server.scheduling.requests import FinishReason

log = logging.getLogger(__name__)

SERVICE_NAME = moe_pb2.DESCRIPTOR.services_by_name["MoEInference"].full_name
RETRY_PUSHBACK = "grpc-retry-pushback-ms"  # gRPC's retry hint (A6), honoured by its retries
KEEPALIVE_TIMEOUT_MS = 20_000  # an unanswered keepalive ping this long drops the connection
FINISH_REASONS = {FinishReason.LENGTH: moe_pb2.GenerateResponse.LENGTH,
                  FinishReason.STOP: moe_pb2.GenerateResponse.STOP}


def grpc_status(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The error's status code and details (server/frontends/statuses.py)."""
    status, details = status_of(error)
    return grpc.StatusCode[status.grpc], details


class Undecodable:
    """A request whose bytes are not its message: handed to the method, which refuses it as
    INVALID_ARGUMENT (gRPC's own deserializer would answer UNKNOWN and log a traceback)."""

    def __init__(self, message: str, error: DecodeError):
        self.details = f"the request is not a valid {message}: {error}"


def lenient(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Undecodable(message_class.DESCRIPTOR.full_name, exc)
    return parse


async def refuse_undecodable(request, context) -> None:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.details)


async def refuse(context, error: ServerError) -> None:
    """Aborts with the error's status; a retry hint goes with RESOURCE_EXHAUSTED, as gRPC's
    grpc-retry-pushback-ms trailer and in the message."""
    code, details = grpc_status(error)
    retry_s = retry_after_s(error)
    if retry_s is None:
        await context.abort(code, details)
    ms = round(retry_s * 1000)
    await context.abort(code, f"{details} (retry in about {ms} ms)",
                        trailing_metadata=((RETRY_PUSHBACK, str(ms)),))


def ask_of(request: moe_pb2.GenerateRequest) -> GenerationRequest:
    return GenerationRequest(request_id=request.request_id, prompt=request.prompt,
                             prompt_ids=tuple(request.prompt_token_ids),
                             max_tokens=request.max_tokens, ignore_eos=request.ignore_eos,
                             temperature=request.temperature, seed=request.seed,
                             priority=request.priority)


class MoEService(moe_pb2_grpc.MoEInferenceServicer):
    def __init__(self, admission: Admission, settings: ServerSettings,
                 tokens: Tokens | None = None):
        self.admission = admission
        self.tokens = tokens
        self.engine_thread = admission.engine_thread
        # the settings as resolved at start-up, made into fields once: GetStats runs on the loop
        self.settings_fields = settings_fields(settings)

    async def Generate(self, request, context):
        received_ns = time.monotonic_ns()
        await refuse_undecodable(request, context)
        client = client_of(metadata_value(context.invocation_metadata(), "authorization"),
                           peer_host(context.peer()), self.tokens)
        try:
            stream = self.admission.admit(ask_of(request), received_ns, client)
        except ServerError as exc:
            await refuse(context, exc)
        first_sent_ns = 0
        async with stream:
            async for batch in stream.batches():
                if isinstance(batch.error, ShutdownError):  # ends as a stream, not an error
                    await context.write(moe_pb2.GenerateResponse(
                        finish_reason=moe_pb2.GenerateResponse.ABORT,
                        server_elapsed_us=(time.monotonic_ns() - received_ns) // 1000))
                    return
                if batch.error is not None:
                    await context.abort(*grpc_status(batch.error))
                msg = moe_pb2.GenerateResponse(token_ids=batch.ids, text=batch.text)
                now_ns = time.monotonic_ns()
                first_sent_ns = first_sent_ns or now_ns
                if batch.finish_reason:
                    u = batch.usage
                    msg.finish_reason = FINISH_REASONS[batch.finish_reason]
                    msg.usage.CopyFrom(moe_pb2.Usage(
                        prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                        queue_us=u.queue_us, prefill_us=u.prefill_us, decode_us=u.decode_us,
                        ttft_us=(first_sent_ns - received_ns) // 1000))
                msg.server_elapsed_us = (now_ns - received_ns) // 1000
                await context.write(msg)
                # stamped -> the transport took it: the server's part of the delivery lag
                self.engine_thread.record_write((time.monotonic_ns() - now_ns) / 1e6)

    async def GetStats(self, request, context):
        await refuse_undecodable(request, context)
        return stats_message(self.engine_thread.readings(), self.engine_thread.engine.args,
                             self.settings_fields, knobs(self.engine_thread.policy))

    async def ResetStats(self, request, context):
        await refuse_undecodable(request, context)
        self.engine_thread.reset_stats()
        uptime_s = (time.monotonic_ns() - self.engine_thread.started_ns) / 1e9
        return moe_pb2.ResetStatsResponse(uptime_s=uptime_s)


def add_service(service: MoEService, server: grpc.aio.Server) -> None:
    """The generated registration (proto/moe_pb2_grpc.py), with lenient deserializers."""
    kinds = {"Generate": (grpc.unary_stream_rpc_method_handler, moe_pb2.GenerateRequest,
                          moe_pb2.GenerateResponse),
             "GetStats": (grpc.unary_unary_rpc_method_handler, moe_pb2.GetStatsRequest,
                          moe_pb2.EngineStats),
             "ResetStats": (grpc.unary_unary_rpc_method_handler, moe_pb2.ResetStatsRequest,
                            moe_pb2.ResetStatsResponse)}
    handlers = {name: handler(getattr(service, name), request_deserializer=lenient(request),
                              response_serializer=response.SerializeToString)
                for name, (handler, request, response) in kinds.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def server_options(limits: Limits, grace_s: float) -> list[tuple[str, int]]:
    """gRPC's channel arguments for the limits: message size, streams per connection,
    keepalive pings (and the client pings it accepts), connection age."""
    options = [("grpc.so_reuseport", 0),  # a busy port is refused, never shared
               ("grpc.max_receive_message_length", limits.max_message_bytes),
               ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
               ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000)]
    if limits.keepalive_s:
        options += [("grpc.keepalive_time_ms", int(limits.keepalive_s * 1000)),
                    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS)]
    if limits.max_connection_age_s:
        options += [("grpc.max_connection_age_ms", int(limits.max_connection_age_s * 1000)),
                    ("grpc.max_connection_age_grace_ms", int(grace_s * 1000))]
    return options


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def add_reflection(server: grpc.aio.Server) -> None:
    """Server reflection as grpc.reflection.v1 (grpcurl's first choice) and v1alpha. grpcio's
    package ships v1alpha only; v1's messages are the same on the wire, so one servicer answers
    both names."""
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             REFLECTION_V1, reflection.SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        REFLECTION_V1, {"ServerReflectionInfo": info}),))


async def create_server(service: MoEService, address: str, options: list[tuple[str, int]],
                        guard: Guard) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Builds a started server on address ("host:port", port 0 = any free port), over TLS and
    checking tokens where the guard says."""
    server = grpc.aio.server(options=options, interceptors=guard.interceptors)
    add_service(service, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    add_reflection(server)
    try:
        port = (server.add_secure_port(address, guard.grpc_credentials) if guard.grpc_credentials
                else server.add_insecure_port(address))
    except RuntimeError:  # taken since server/settings.py checked it
        port = 0
    if port == 0:
        raise SettingsError(f"--port: cannot listen on {address}; another server may be running "
                            f"there: stop it, or pick another --port (0 = any free port)")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer
