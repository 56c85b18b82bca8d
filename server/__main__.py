"""`python -m server`: serve a seeded random MoE model over gRPC until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

import torch

from server.config import DTYPES, ConfigError, ServerConfig
from server.engine import Engine
from server.model import PRESETS
from server.policies import POLICIES
from server.scheduler import Scheduler
from server.service import Limits, MoEService, create_server, drain

log = logging.getLogger("server")


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    d = ServerConfig()
    p = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    p.add_argument("--host", default=d.host, help="address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="port; 0 = any free port (default %(default)s)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--preset", default=d.preset, help=f"model shape: {', '.join(PRESETS)} (default %(default)s)")
    p.add_argument("--device", default=d.device, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=d.dtype,
                   help=f"{', '.join(DTYPES)} (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the random weights")
    p.add_argument("--policy", default=d.policy, help=f"batching policy: {', '.join(POLICIES)}")
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size,
                   help="most requests in one engine step (default %(default)s)")
    p.add_argument("--kv-slots", type=int, default=d.kv_slots,
                   help="sequences the KV cache pool holds (default: --max-batch-size)")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="waiting requests before RESOURCE_EXHAUSTED (default %(default)s)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens_limit,
                   help="largest max_tokens a request may ask for (default %(default)s)")
    p.add_argument("--torch-threads", type=int, default=d.torch_threads,
                   help="torch intra-op threads; 0 = torch's default")
    p.add_argument("--grace-s", type=float, default=d.grace_s,
                   help="on SIGTERM, seconds in-flight streams get to finish (default %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = vars(p.parse_args(argv))
    logging.basicConfig(level=args.pop("log_level"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return ServerConfig(**args)
    except ConfigError as exc:
        p.error(str(exc))


async def serve(config: ServerConfig) -> None:
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    device, dtype = config.resolved_device, config.resolved_dtype
    log.info("building %s on %s (%s), seed %d", config.preset, device, dtype, config.seed)
    engine = Engine(config.preset, config.resolved_kv_slots, device, DTYPES[dtype], config.seed)
    scheduler = Scheduler(engine, POLICIES[config.policy](), config.max_batch_size, config.max_queue)
    scheduler.start()
    limits = Limits(engine.args.vocab_size, engine.args.max_seq_len, config.max_tokens_limit)
    service = MoEService(scheduler, limits, {"policy": config.policy, "preset": config.preset,
                                             "device": device, "dtype": dtype})
    server, port, health_servicer = await create_server(service, f"{config.host}:{config.port}")
    if config.port_file:
        tmp = f"{config.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, config.port_file)  # readers never see a half-written file
    log.info("serving %s with policy %s on %s:%d", config.preset, config.policy, config.host, port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining: up to %.1f s for in-flight streams", config.grace_s)
    await drain(server, service, health_servicer, config.grace_s)
    log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
