"""loadgen/events_bench/grpc_mock.c: the native moe.v1 mock answers our moe target (grpc.aio,
as the aio sender runs it) with known delays, its truth in every message and its account at the
end; it answers the health check, refuses what it does not serve with gRPC statuses, keeps to a
client's flow-control window, and ends a connection it cannot read without stopping."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import struct
import time
from pathlib import Path

import grpc
import pytest

from loadgen.targets.client import StreamResult, astream_request
from loadgen.targets.moe import MoeTarget
from loadgen.targets.target import RequestSpec
from loadgen.targets.text_tokens import TextCounter
from proto import moe_pb2, moe_pb2_grpc
from records.declare import build as build_settings
from records.load_settings import LoadSettings
from tests.native_mocks import build, check_account, check_truth, mock_on

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 7, 8


@pytest.fixture(scope="module")
def mock_binary(tmp_path_factory) -> Path:
    return build("grpc_mock", tmp_path_factory.mktemp("mock"))


def moe_target() -> MoeTarget:
    return MoeTarget(build_settings(LoadSettings, {}).target)


def test_the_mock_streams_generate_with_its_delays_and_its_truth(mock_binary, tmp_path):
    target = moe_target()

    async def main(port: int) -> list[StreamResult]:
        conn = await target.aconnect(f"127.0.0.1:{port}")

        async def one(i: int) -> StreamResult:
            spec = RequestSpec(f"r{i}", 5, prompt_ids=(65, 66, 67))
            result = StreamResult.of(spec, time.monotonic_ns())
            await astream_request(target, conn, spec, result, 10, TextCounter(""))
            return result

        results = [await one(0)] + list(await asyncio.gather(*(one(i) for i in range(1, 6))))
        await target.aclose(conn)
        return results

    with mock_on(mock_binary, tmp_path, ttft_ms=20, itl_ms=5) as (port, stats):
        results = asyncio.run(main(port))
        assert target.probe(f"127.0.0.1:{port}") == ""  # the health check: SERVING
        server = target.stats(f"127.0.0.1:{port}")
        assert server.error.startswith("GetStats failed: UNIMPLEMENTED: grpc_mock serves")
    for r in results:
        assert r.ok and r.tokens == [1] * 5 and r.finish_reason == "LENGTH", r.details
        assert r.usage["prompt_tokens"] == 3 and r.usage["completion_tokens"] == 5
    check_truth(results, ttft_ms=20, itl_ms=5)
    check_account(stats, requests=6, events=30)


def test_a_request_it_cannot_serve_gets_a_status_and_the_channel_serves_on(mock_binary,
                                                                          tmp_path):
    with mock_on(mock_binary, tmp_path, ttft_ms=1, itl_ms=1) as (port, _):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = moe_pb2_grpc.MoEInferenceStub(channel)
            with pytest.raises(grpc.RpcError) as bad:
                list(stub.Generate(moe_pb2.GenerateRequest(max_tokens=0), timeout=5))
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_tokens >= 1" in bad.value.details()
            with pytest.raises(grpc.RpcError) as other:
                stub.ResetStats(moe_pb2.ResetStatsRequest(), timeout=5)
            assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED
            good = list(stub.Generate(moe_pb2.GenerateRequest(max_tokens=2), timeout=5))
            assert [m.finish_reason for m in good] == [0, moe_pb2.GenerateResponse.LENGTH]


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def read_frames(sock: socket.socket, wait_s: float) -> list[tuple[int, int, bytes]]:
    """(type, stream, payload) of every frame that came within wait_s."""
    sock.settimeout(wait_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    frames = []
    while len(data) >= 9:
        n = int.from_bytes(data[:3], "big")
        frames.append((data[3], int.from_bytes(data[5:9], "big"), data[9:9 + n]))
        data = data[9 + n:]
    return frames


def generate_request(stream: int, max_tokens: int) -> bytes:
    """A Generate call by hand: HPACK literals (no Huffman), the request in one DATA frame."""
    path = b"/moe.v1.MoEInference/Generate"
    block = (b"\x83\x86" + bytes([0x44, len(path)]) + path + b"\x41\x09localhost"
             + b"\x5f\x10application/grpc" + b"\x40\x02te\x08trailers")
    body = moe_pb2.GenerateRequest(max_tokens=max_tokens).SerializeToString()
    return (frame(HEADERS, 4, stream, block)
            + frame(DATA, 1, stream, b"\x00" + struct.pack(">I", len(body)) + body))


def test_it_sends_no_more_than_the_clients_window_allows(mock_binary, tmp_path):
    with mock_on(mock_binary, tmp_path, ttft_ms=1, itl_ms=1) as (port, _):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            window = 30  # bytes of DATA a stream may be sent: two messages of 5 + ~9
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, window))
                         + generate_request(1, 5))
            sent = sum(len(p) for kind, stream, p in read_frames(sock, 0.3)
                       if kind == DATA and stream == 1)
            assert 0 < sent <= window
            sock.sendall(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1000)))
            rest = read_frames(sock, 0.3)
            assert sum(len(p) for kind, stream, p in rest if kind == DATA) > 3 * 14 - window
            assert any(kind == HEADERS and stream == 1 and b"grpc-status" in p
                       for kind, stream, p in rest)


def test_a_connection_it_cannot_read_ends_and_it_serves_on(mock_binary, tmp_path):
    with mock_on(mock_binary, tmp_path, ttft_ms=1, itl_ms=1) as (port, stats):
        with socket.create_connection(("127.0.0.1", port)) as huffman:
            block = b"\x83\x86\x44\x81\xff"  # :path, Huffman-coded
            huffman.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 5, 1, block))
            frames = read_frames(huffman, 0.5)
            (goaway,) = [p for kind, _, p in frames if kind == GOAWAY]
            assert int.from_bytes(goaway[4:8], "big") == 9  # COMPRESSION_ERROR
        with socket.create_connection(("127.0.0.1", port)) as garbage:
            garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 100)
            assert read_frames(garbage, 0.5) == [(SETTINGS, 0, bytes.fromhex("000401000000")),
                                                 (WINDOW_UPDATE, 0, bytes.fromhex("00ff0001"))]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = moe_pb2_grpc.MoEInferenceStub(channel)
            assert len(list(stub.Generate(moe_pb2.GenerateRequest(max_tokens=3), timeout=5))) == 3
    assert json.loads(stats.read_text())["requests"] == 1
