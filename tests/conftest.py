"""Shared helpers: a real server on 127.0.0.1:0, in this process or as a subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch

from experiments import processes
from proto import moe_pb2_grpc
from records.declare import build
from records.server_settings import ServerSettings
from server.app import App, start
from server.settings import prepare

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Served:
    port: int
    stub: moe_pb2_grpc.MoEInferenceStub
    app: App


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu need CUDA: skipped, with the reason, where there is none."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextmanager
def running_server(**overrides):
    """Yields a real server in this process, drained on exit."""
    # float32 pinned: a CPU's default dtype depends on the machine (server/settings.py cpu_dtype)
    # the CPU unless a test asks: the suite means the same on a machine with a GPU
    settings = build(ServerSettings, {"preset": "tiny", "port": 0, "torch_threads": 1,
                                      "dtype": "float32", "device": "cpu"} | overrides)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    app = asyncio.run_coroutine_threadsafe(start(prepare(settings)), loop).result(timeout=60)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield Served(app.port, moe_pb2_grpc.MoEInferenceStub(channel), app)
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(app.drain(0.5), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server():
    with running_server(max_batch_size=4, max_tokens_limit=512) as served:
        yield served


def server_process(tmp_path, *flags: str):
    """Yields (process, port) of `python -m server` as a subprocess on 127.0.0.1:0."""
    return port_file_process(tmp_path, "server", "--preset", "tiny", "--port", "0",
                             "--torch-threads", "1", "--dtype", "float32", "--device", "cpu",
                             *flags)


def delay_server_process(tmp_path, *flags: str):
    """Yields (process, port) of the known-delay server (loadgen/delay_server.py)."""
    return port_file_process(tmp_path, "loadgen.delay_server", *flags)


@contextmanager
def port_file_process(tmp_path, module: str, *flags: str):
    port_file = tmp_path / "server.port"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", module, "--port-file", str(port_file), *flags],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "server did not start in 60 s"
            time.sleep(0.05)
        yield proc, int(port_file.read_text())
    finally:
        stop_process(proc)
        log.close()


def stop_process(proc: subprocess.Popen, timeout_s: float = 20) -> int:
    """SIGTERM, then SIGKILL if it does not end in time (experiments/processes.py)."""
    return processes.stop_process(proc, grace_s=timeout_s)
