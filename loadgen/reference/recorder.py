"""SGLang's expert distribution recorder, as the reference servers serve it (--routed-experts):
POST (or GET) /start_expert_distribution_record, /stop_expert_distribution_record and
/dump_expert_distribution_record answer a line of text as SGLang does. The dump is SGLang's
`stat` mode file, written where SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR says: a torch file
holding `logical_count`, [passes, layers, experts] tokens (a pass here: a request's tokens
routed between start and stop), and `rank` 0. --recorder-fault error answers the dump with
HTTP 500, garbage writes a file that is not one."""

from __future__ import annotations

import os
import time
from pathlib import Path

from aiohttp import web

from loadgen.reference.pacer import Pacer

DEFAULT_DIR = "/tmp/sglang_expert_distribution_recorder"  # SGLang's default


def dump_dir() -> Path:
    return Path(os.environ.get("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", DEFAULT_DIR))


def recorder_routes(pacer: Pacer) -> list:
    truth = pacer.truth

    async def start(request: web.Request) -> web.Response:
        truth.recording, truth.recorded = True, []
        return web.Response(text="Start recording the expert distribution.\n")

    async def stop(request: web.Request) -> web.Response:
        truth.recording = False
        return web.Response(text="Stop recording the expert distribution.\n")

    async def dump(request: web.Request) -> web.Response:
        fault = pacer.args.recorder_fault
        if fault == "error":
            return web.Response(status=500, text="Internal Server Error\n")
        folder = dump_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"expert_distribution_recorder_{time.time()}.pt"
        if fault == "garbage":
            path.write_bytes(b"not a torch file")
        else:
            import numpy as np
            import torch  # only a dump pays for the import

            passes = truth.recorded or [np.zeros_like(truth.prompt)]
            torch.save({"rank": 0, "logical_count": torch.tensor(np.stack(passes))}, path)
        return web.Response(text="Dump expert distribution record.\n")

    return [web.route(method, f"/{verb}_expert_distribution_record", handler)
            for verb, handler in (("start", start), ("stop", stop), ("dump", dump))
            for method in ("GET", "POST")]
