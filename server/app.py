"""Wiring: server settings become an engine (server/build.py), the engine thread that batches
for it, a started gRPC server and, with --http-port, the OpenAI-compatible HTTP API beside it,
and, with --metrics-port, the Prometheus endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field

import grpc
import torch
from aiohttp import web
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry

from records.declare import SettingsError
from records.server_settings import ServerSettings
from server.build import build_engine
from server.engine.interface import Engine
from server.frontends.admission import Admission, RequestLimits
from server.frontends.grpc_service import SERVICE_NAME, MoEService, create_server, server_options
from server.frontends.http_api import start_http
from server.frontends.prometheus import metrics_registry, serve_metrics
from server.frontends.security import Guard, guard_of
from server.scheduling.batching_loop import BatchingLoop, LoopOptions
from server.scheduling.engine_thread import EngineThread
from server.scheduling.faults import Injector
from server.scheduling.heap import HeapTrimmer
from server.scheduling.policies import build_policy
from server.scheduling.prefix_cache import PrefixCache
from server.settings import Startup
from server.telemetry.step_log import StepLog

log = logging.getLogger(__name__)
FLUSH_S = 2.0  # after the engine stops, for the streams it ended to send their last message


@dataclass
class App:
    server: grpc.aio.Server
    port: int
    service: MoEService
    health: health.aio.HealthServicer
    engine: Engine  # stopped after the drain; over ranks, a failed one stops the server
    step_failed: asyncio.Event  # set when an engine step raised: health goes NOT_SERVING
    metrics_server: object | None = None  # the Prometheus HTTP server, when on
    metrics_port: int | None = None
    http: web.AppRunner | None = None  # the OpenAI-compatible API, when on
    http_port: int | None = None
    failed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self):
        self._watch = asyncio.get_running_loop().create_task(self._on_step_failure())

    async def _on_step_failure(self) -> None:
        await self.step_failed.wait()
        await self.not_serving()

    async def not_serving(self) -> None:
        """Tells health checks the engine is gone, so load balancers stop sending here; an
        expert-parallel engine cannot go on without its ranks, so the server stops."""
        log.error("engine failed: health set to NOT_SERVING")
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.engine.world > 1:
            self.failed.set()

    async def drain(self, grace_s: float) -> None:
        """Health checks say NOT_SERVING and both front ends refuse new requests themselves
        (UNAVAILABLE, HTTP 503: the listeners stay open), while open streams get grace_s to
        finish; then the engine stops, the streams still open end with finish reason ABORT,
        and only then do the listeners close, with no call left to cancel."""
        admission = self.service.admission
        admission.draining = True
        await self.health.enter_graceful_shutdown()
        await admission.idle(grace_s)
        admission.engine_thread.stop("the server shut down before the request finished")
        await admission.idle(FLUSH_S)
        await self.server.stop(FLUSH_S)
        if self.http is not None:
            await self.http.cleanup()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)
        self._watch.cancel()


async def start(startup: Startup) -> App:
    """Builds the model and starts serving (startup: server/settings.py prepare's); call from
    the event loop that will serve."""
    settings = startup.settings
    model, serving = settings.model, settings.serving
    if model.torch_threads:
        torch.set_num_threads(model.torch_threads)
    name = model.checkpoint or model.preset
    log.info("building %s on %s (%s), seed %d", name, model.device, model.dtype, model.seed)
    engine = build_engine(startup)
    resolved_moe = dataclasses.replace(settings.moe, moe_kernel=engine.kernel_name)
    settings = dataclasses.replace(settings, moe=resolved_moe)
    step_failed = asyncio.Event()  # set from the engine thread when a step raises
    engine_thread = start_engine_thread(settings, engine, step_failed)
    limits = RequestLimits(engine.args.vocab_size, engine.args.max_seq_len,
                           serving.max_tokens_limit, serving.max_streams_per_client)
    admission = Admission(engine_thread, limits)
    guard = guard_of(settings.security)
    service = MoEService(admission, settings, guard.tokens)
    server, port, health_servicer = await create_server(
        service, f"{serving.host}:{serving.port}", server_options(settings.limits, serving.grace_s),
        guard)
    app = App(server, port, service, health_servicer, engine, step_failed)
    log.info("serving %s with policy %s on %s:%d", name, settings.batching.policy,
             serving.host, port)
    registry = metrics_registry(engine_thread, settings)
    await open_side_ports(app, admission, registry, name, settings, guard)
    return app


def start_engine_thread(settings: ServerSettings, engine: Engine,
                        step_failed: asyncio.Event) -> EngineThread:
    """The engine's thread, running the batching loop the settings describe; a step that raises
    sets step_failed, on the calling event loop."""
    serving, batching = settings.serving, settings.batching
    step_log = StepLog(serving.step_log) if serving.step_log else None
    prefix_cache = (PrefixCache(batching.prefix_block_tokens, engine.slots,
                                batching.prefix_cache_tokens) if batching.prefix_cache else None)
    faults = Injector(settings.faults, engine.seed, time.monotonic_ns())
    loop_of_steps = BatchingLoop(engine, build_policy(batching), LoopOptions(
        serving.max_queue, batching.max_prefill_tokens, prefix_cache, faults, step_log))
    loop = asyncio.get_running_loop()
    engine_thread = EngineThread(loop_of_steps, HeapTrimmer(settings.model.heap_trim_s),
                                 lambda: loop.call_soon_threadsafe(step_failed.set))
    engine_thread.start()
    return engine_thread


async def open_side_ports(app: App, admission: Admission, registry: CollectorRegistry,
                          name: str, settings: ServerSettings, guard: Guard) -> None:
    """Prometheus metrics (registry's) and the OpenAI-compatible HTTP API, where the settings
    ask for them; a port taken since the settings were checked drains the app and names its
    flag."""
    serving = settings.serving
    metrics_host = settings.security.metrics_host or serving.host
    try:
        if serving.metrics_port is not None:
            app.metrics_server, app.metrics_port = serve_metrics(registry, metrics_host,
                                                                 serving.metrics_port)
        if serving.http_port is not None:
            app.http, app.http_port = await start_http(admission, name, serving,
                                                       settings.limits.max_message_bytes, guard,
                                                       registry)
    except OSError as exc:  # taken since server/settings.py checked the ports
        await app.drain(0)
        flag = "http-port" if app.metrics_port or serving.metrics_port is None else "metrics-port"
        raise SettingsError(f"--{flag}: cannot listen: {exc.strerror or exc}; pick another "
                            f"--{flag} (0 = any free port)") from None
    if app.metrics_port is not None:
        log.info("Prometheus metrics on http://%s:%d/metrics", metrics_host, app.metrics_port)
    if app.http_port is not None:
        log.info("OpenAI-compatible API on %s://%s:%d/v1 (model %s)",
                 "https" if guard.ssl_context else "http", serving.host, app.http_port, name)
