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
from records.declare import SettingsError, flat, text
from records.server_settings import Limits, ServerSettings
from server.errors import ServerError, ShutdownError
from server.frontends.admission import Admission, Ask
from server.frontends.security import Guard, Tokens, client_of, metadata_value, peer_host
from server.frontends.statuses import retry_after_s, status_of
from server.scheduling.engine_thread import EngineThread
from server.scheduling.policies import knobs
from server.telemetry.window import gpu_stats, imbalance, process_rss_bytes

log = logging.getLogger(__name__)

SERVICE_NAME = moe_pb2.DESCRIPTOR.services_by_name["MoEInference"].full_name
RETRY_PUSHBACK = "grpc-retry-pushback-ms"  # gRPC's retry hint (A6), honoured by its retries
KEEPALIVE_TIMEOUT_MS = 20_000  # an unanswered keepalive ping this long drops the connection
FINISH_REASONS = {"LENGTH": moe_pb2.GenerateResponse.LENGTH,
                  "STOP": moe_pb2.GenerateResponse.STOP}


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


def ask_of(request: moe_pb2.GenerateRequest) -> Ask:
    return Ask(request_id=request.request_id, prompt=request.prompt,
               prompt_ids=tuple(request.prompt_token_ids), max_tokens=request.max_tokens,
               ignore_eos=request.ignore_eos, temperature=request.temperature, seed=request.seed,
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
        return stats_message(self.engine_thread.snapshot(), self.engine_thread, self.settings_fields)

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





def histogram_message(h) -> moe_pb2.Histogram:
    return moe_pb2.Histogram(bounds=h.bounds, counts=h.counts, count=h.count, sum=h.sum, max=h.max)


def settings_fields(settings: ServerSettings) -> dict:
    """GetStats' `settings` map, and the older EngineStats fields that carry a setting of the same
    name (an unset one keeps the field's default)."""
    values = flat(settings)
    names = moe_pb2.EngineStats.DESCRIPTOR.fields_by_name
    older = {name: value for name, value in values.items() if name in names and value is not None}
    return older | {"settings": {name: text(value) for name, value in values.items()}}


def stats_message(snap, engine_thread: EngineThread, settings: dict) -> moe_pb2.EngineStats:
    """settings: settings_fields() of the server's settings."""
    t = snap.telemetry
    engine = engine_thread.engine
    args = engine.args
    layers = []
    for i in range(args.n_layers):
        tokens = t.expert_tokens[i].tolist()
        max_over_mean, cv = imbalance(tokens)
        layer = moe_pb2.LayerStats(expert_tokens=tokens, dropped=t.dropped[i].tolist(),
                                   imbalance_max_over_mean=max_over_mean, imbalance_cv=cv,
                                   active_experts_steps=t.active_steps[i].tolist())
        if snap.cache:
            layer.cache.CopyFrom(moe_pb2.CacheStats(**vars(snap.cache[i])))
        if t.exchange is not None:
            layer.rank_pairs.extend(t.exchange.computed[i].tolist())
        layers.append(layer)
    gpu = gpu_stats(engine.device)
    return moe_pb2.EngineStats(
        **settings,
        uptime_s=(time.monotonic_ns() - engine_thread.started_ns) / 1e9,
        window_s=t.window_s,
        requests_admitted=t.requests_admitted, requests_finished=t.requests_finished,
        requests_aborted=t.requests_aborted, requests_rejected=t.requests_rejected,
        steps=t.steps, tokens_generated=t.tokens_generated, prompt_tokens=t.prompt_tokens,
        running=snap.running, waiting=snap.waiting, kv_slots_in_use=snap.kv_slots_in_use,
        kv_slots_total=engine.kv_slots,
        mean_batch_size=t.batch_size.mean, step_time_mean_ms=t.step_ms.mean,
        num_layers=args.n_layers, num_experts=args.n_experts, top_k=args.top_k,
        hidden_size=args.dim,
        expert_tokens=[moe_pb2.LayerExpertTokens(tokens=row) for row in t.expert_tokens.tolist()],
        max_seq_len=args.max_seq_len, policy_knobs=knobs(engine_thread.policy),
        layers=layers,
        stages=[moe_pb2.StageTime(stage=name, ms=histogram_message(h))
                for name, h in t.stage_ms.items()],
        step_ms=histogram_message(t.step_ms), batch_size=histogram_message(t.batch_size),
        tokens_per_step=histogram_message(t.tokens_per_step),
        write_ms=histogram_message(t.write_ms),
        kv_positions_useful=t.kv_positions_useful, kv_positions_computed=t.kv_positions_computed,
        prefill_tokens=t.prefill_tokens, prefill_padded_tokens=t.prefill_padded_tokens,
        expert_bytes_read=t.expert_bytes_read, expert_compute_ms=t.expert_compute_ms,
        expert_bandwidth_gb_s=(t.expert_bytes_read / t.expert_compute_ms / 1e6
                               if t.expert_compute_ms else 0.0),
        process_cpu_percent=t.cpu_percent, process_rss_bytes=process_rss_bytes(),
        gpu_utilization_percent=gpu.utilization_percent, gpu_memory_bytes=gpu.allocated_bytes,
        gpu_memory_reserved_bytes=gpu.reserved_bytes,
        heap_trims=engine_thread.heap.trims, heap_trim_ms=engine_thread.heap.trim_ms,
        faults=moe_pb2.FaultCounts(**vars(engine_thread.faults.snapshot())),
        expert_parallel=exchange_message(t.exchange))


def exchange_message(x) -> moe_pb2.ExpertParallelStats | None:
    """The exchanges between ranks (server/telemetry/window.py ExchangeTotals); None with one rank."""
    if x is None:
        return None
    pairs = [moe_pb2.RankPair(source=s, destination=d, dispatch_bytes=int(x.bytes[0, s, d]),
                              combine_bytes=int(x.bytes[1, s, d]))
             for s in range(x.ranks) for d in range(x.ranks) if s != d]
    ms = x.ms
    return moe_pb2.ExpertParallelStats(
        ranks=x.ranks, pairs=pairs, dispatch_ms=ms["dispatch_measured"],
        combine_ms=ms["combine_measured"], dispatch_exposed_ms=ms["dispatch_exposed"],
        combine_exposed_ms=ms["combine_exposed"], dispatch_modelled_ms=ms["dispatch_modelled"],
        combine_modelled_ms=ms["combine_modelled"], exchanges=x.exchanges,
        placements=x.placements, experts_moved=x.experts_moved)
