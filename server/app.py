"""Wiring: a ServerConfig becomes an engine, a scheduler and a started gRPC server."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
import torch
from grpc_health.v1 import health, health_pb2

from server.config import DTYPES, ServerConfig
from server.engine import Engine
from server.metrics import serve_metrics
from server.policies import POLICIES
from server.scheduler import Scheduler
from server.service import SERVICE_NAME, Limits, MoEService, create_server, drain
from server.telemetry import StepLog

log = logging.getLogger(__name__)


@dataclass
class App:
    server: grpc.aio.Server
    port: int
    service: MoEService
    health: health.aio.HealthServicer
    metrics_server: object | None = None  # the Prometheus HTTP server, when on
    metrics_port: int | None = None

    async def not_serving(self) -> None:
        """Tells health checks the engine is gone, so load balancers stop sending here."""
        log.error("engine failed: health set to NOT_SERVING")
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def drain(self, grace_s: float) -> None:
        await drain(self.server, self.service, self.health, grace_s)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()


async def start(config: ServerConfig) -> App:
    """Builds the model and starts serving; call from the event loop that will serve."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device, dtype = config.resolved_device, config.resolved_dtype
    log.info("building %s on %s (%s), seed %d", config.preset, device, dtype, config.seed)
    engine = Engine(config.preset, config.resolved_kv_slots, device, DTYPES[dtype], config.seed,
                    config.engine_options)
    step_log = StepLog(config.step_log) if config.step_log else None
    scheduler = Scheduler(engine, POLICIES[config.policy](config.policy_config), config.max_queue, step_log)
    scheduler.start()
    limits = Limits(engine.args.vocab_size, engine.args.max_seq_len, config.max_tokens_limit)
    service = MoEService(scheduler, limits, {"policy": config.policy, "preset": config.preset,
                                             "device": device, "dtype": dtype})
    server, port, health_servicer = await create_server(service, f"{config.host}:{config.port}")
    log.info("serving %s with policy %s on %s:%d", config.preset, config.policy, config.host, port)
    app = App(server, port, service, health_servicer)
    loop = asyncio.get_running_loop()
    scheduler.on_failure = lambda: loop.call_soon_threadsafe(loop.create_task, app.not_serving())
    if config.metrics_port is not None:
        app.metrics_server, app.metrics_port = serve_metrics(scheduler, config.host, config.metrics_port)
        log.info("Prometheus metrics on http://%s:%d/metrics", config.host, app.metrics_port)
    return app
