"""`python -m server`: serve a seeded random MoE model over gRPC until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from server.app import start
from server.config import DTYPES, ConfigError, ServerConfig
from server.model import PRESETS
from server.policies import POLICIES

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
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="static/dynamic: longest wait for a batch to fill; expert_aware: age bound "
                        "(default %(default)s)")
    p.add_argument("--max-step-tokens", type=int, default=d.max_step_tokens,
                   help="latency_sensitive: tokens per step, decodes first, then prompt chunks (default %(default)s)")
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
    g = p.add_argument_group("MoE layer")
    g.add_argument("--router", default=d.router,
                   help="topk, noisy_topk, balanced (least-loaded), or a custom module:Class (default %(default)s)")
    g.add_argument("--noise-scale", type=float, default=d.noise_scale, help="noisy_topk noise multiplier")
    g.add_argument("--renormalize", action=argparse.BooleanOptionalAction, default=None,
                   help="renormalise top-k router weights to sum to 1 (default: as the preset's model does)")
    g.add_argument("--routing-skew", default=d.routing_skew,
                   help="uniform, zipf:S, hot:F or affinity:ALPHA, a logit bias on top of the router")
    g.add_argument("--capacity-factor", type=float, default=None,
                   help="expert capacity = ceil(tokens x k / experts x CF) per step; omit for dropless")
    g.add_argument("--moe-kernel", default=d.moe_kernel, help="sorted, grouped_mm or reference (default %(default)s)")
    g.add_argument("--expert-cache", type=int, default=d.expert_cache,
                   help="experts per layer resident in fast memory, the rest in host memory; 0 = off")
    g.add_argument("--cache-policy", default=d.cache_policy, help="lru, lfu or random eviction (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port at /metrics (0 = any free port); off by default")
    p.add_argument("--step-log", default=None, help="append one JSON line per engine step to this file")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = vars(p.parse_args(argv))
    logging.basicConfig(level=args.pop("log_level"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return ServerConfig(**args)
    except ConfigError as exc:
        p.error(str(exc))


async def serve(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = await start(config)
    if config.port_file:
        tmp = f"{config.port_file}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{app.port}\n")
        os.replace(tmp, config.port_file)  # readers never see a half-written file

    await stop.wait()
    log.info("draining: up to %.1f s for in-flight streams", config.grace_s)
    await app.drain(config.grace_s)
    log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
