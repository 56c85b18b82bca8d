"""`python -m server`: serve a seeded random MoE model over gRPC (and, with --http-port, the
OpenAI-compatible HTTP API) until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from records.cli import Parser
from records.declare import SettingsError, add_arguments, from_options
from records.server_settings import ServerSettings
from server.app import start
from server.build import follow_rank_0
from server.parallel.group import launched
from server.settings import REGISTRIES, Startup, prepare

log = logging.getLogger("server")


def parse_args(argv: list[str] | None = None) -> Startup:
    """The settings from the command line, checked and resolved once before anything is built
    (server/settings.py prepare); a bad value exits 2 naming its flag. A rank other than 0 of
    an expert-parallel engine (started by --ep or torchrun) logs as that rank and does not
    check the ports, which only rank 0 opens."""
    p = Parser(prog="python -m server", description=__doc__)
    add_arguments(p, ServerSettings, REGISTRIES)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    options = p.parse_args(argv)
    rank = (launched() or (0, 1))[0]
    logging.basicConfig(level=options.log_level, format="%(asctime)s %(levelname)s "
                        + (f"rank {rank} " if rank else "") + "%(name)s: %(message)s")
    try:
        return prepare(from_options(ServerSettings, options), ports=rank == 0)
    except SettingsError as exc:
        p.error(str(exc))


async def serve(startup: Startup) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = startup.settings
    app = await start(startup)
    write_port(settings.serving.http_port_file, app.http_port)
    write_port(settings.serving.port_file, app.port)  # last: once it exists, both serve

    stopped = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(app.failed.wait())
    await asyncio.wait([stopped, failed], return_when=asyncio.FIRST_COMPLETED)
    if app.failed.is_set():
        log.error("a rank of the expert-parallel engine failed: stopping")
    log.info("draining: up to %.1f s for in-flight streams", settings.serving.grace_s)
    await app.drain(settings.serving.grace_s)
    log.info("stopped")
    return 1 if app.failed.is_set() else 0


def write_port(path: str | None, port: int | None) -> None:
    if path:
        with open(f"{path}.tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(f"{path}.tmp", path)  # readers never see a half-written file


def main(argv: list[str] | None = None) -> int:
    startup = parse_args(argv)
    try:
        if (launched() or (0, 1))[0]:
            follow_rank_0(startup)
            return 0
        return asyncio.run(serve(startup))
    except SettingsError as exc:  # a port taken between the check and the bind
        print(f"python -m server: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
