"""loadgen/events_bench/: the native streaming mock (built here with the machine's C compiler,
as the Makefile builds it) answers as an OpenAI server streaming with known delays, its truth
in every event and its account at the end; and the sweep's run measures our generator against
it, every arrival of the schedule accounted for."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from pathlib import Path

import pytest

from loadgen.events_bench import native, sweep
from loadgen.targets.client import StreamResult, astream_request
from loadgen.targets.openai import OpenAITarget
from loadgen.targets.target import RequestSpec
from loadgen.targets.text_tokens import TextCounter
from records.declare import build as build_settings
from records.load_settings import LoadSettings
from tests.native_mocks import build, check_account, check_truth, mock_on

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")


@pytest.fixture(scope="module")
def mock_binary(tmp_path_factory) -> Path:
    return build("sse_mock", tmp_path_factory.mktemp("mock"))


def test_the_mock_streams_with_its_delays_and_its_truth_and_accounts_for_them(
        mock_binary, tmp_path):
    target = OpenAITarget(build_settings(LoadSettings, {}).target)

    async def main(port: int) -> list[StreamResult]:
        pool = await target.aconnect(f"127.0.0.1:{port}")
        results = []
        for i in range(3):
            spec = RequestSpec(f"r{i}", 5, prompt_ids=(65, 66))
            result = StreamResult.of(spec, time.monotonic_ns())
            await astream_request(target, pool, spec, result, 10, TextCounter(""))
            results.append(result)
        await target.aclose(pool)
        return results

    with mock_on(mock_binary, tmp_path, ttft_ms=20, itl_ms=5) as (port, stats):
        results = asyncio.run(main(port))
        assert target.owner == "vllm" and target.model == "mock"  # so token ids are asked for
    for r in results:
        assert r.ok and r.tokens == [1] * 5 and r.finish_reason == "length", r.details
    check_truth(results, ttft_ms=20, itl_ms=5)
    check_account(stats, requests=3, events=15)


def test_a_request_it_cannot_read_closes_its_connection_and_it_serves_on(mock_binary, tmp_path):
    with mock_on(mock_binary, tmp_path, ttft_ms=1, itl_ms=1) as (port, _):
        with socket.create_connection(("127.0.0.1", port)) as bad:
            bad.sendall(b"x" * 70_000)  # no end of headers within what it reads
            try:
                assert bad.recv(10) == b""  # closed (reset, with bytes it left unread)
            except ConnectionResetError:
                pass
        with socket.create_connection(("127.0.0.1", port)) as good:
            good.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert good.recv(4096).startswith(b"HTTP/1.1 200 OK")


@pytest.mark.slow
def test_a_sweep_run_measures_our_generator_against_the_mocks_truth(mock_binary, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(native, "BUILD", mock_binary.parent)
    row = sweep.one_run(tmp_path, 1_000, 1, 20, 3.0)
    assert row["accounted"] and row["sent_percent"] == 100.0, row
    assert row["scheduled"] > 100
    assert 0 <= row["ttft_error_p50_ms"] < 20, row  # the mock's truth joined, not its design
    assert 0 < row["true_itl_sd_ms"] and 0 < row["itl_sd_ms"], row
    assert row["events_per_s"] > 500 and row["generator_limited"] == {}, row
