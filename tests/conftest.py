"""Shared fixtures: a real server on 127.0.0.1:0 in a background event loop."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

import grpc
import pytest

from proto import moe_pb2_grpc
from server.app import start
from server.config import ServerConfig


@contextmanager
def running_server(**overrides):
    """Yields (port, stub) of a real server in this process, drained on exit."""
    config = ServerConfig(preset="tiny", port=0, torch_threads=1, **overrides)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    app = asyncio.run_coroutine_threadsafe(start(config), loop).result(timeout=60)
    channel = grpc.insecure_channel(f"127.0.0.1:{app.port}")
    try:
        yield app.port, moe_pb2_grpc.MoEInferenceStub(channel)
    finally:
        channel.close()
        asyncio.run_coroutine_threadsafe(app.drain(0.5), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server():
    with running_server(max_batch_size=4, max_tokens_limit=512) as served:
        yield served
