"""The server against hostile and unlucky input: bytes that are no request, prompts too long
to be worth reading, a shutdown with streams still open. Each ends in a clear status, costs
no more than it must, and leaves the log clean."""

import logging
import signal
import time

import grpc
import pytest

from proto import moe_pb2, moe_pb2_grpc
from server import tokenizer
from tests.conftest import server_process

Req = moe_pb2.GenerateRequest
BAD_UTF8 = bytes([0x12, 2, 0xFF, 0xFE, 0x20, 4])  # field 2 (prompt): invalid UTF-8
TRUNCATED = bytes([0x12, 5, 0x61])  # a field of 5 bytes that holds 1: no message at all


@pytest.mark.parametrize(("method", "kind", "garbage"), [
    ("Generate", "unary_stream", BAD_UTF8), ("Generate", "unary_stream", TRUNCATED),
    ("GetStats", "unary_unary", TRUNCATED), ("ResetStats", "unary_unary", TRUNCATED)])
def test_undecodable_request_bytes_are_invalid_argument_without_a_traceback(server, caplog,
                                                                            method, kind,
                                                                            garbage):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw = getattr(channel, kind)(f"/moe.v1.MoEInference/{method}")
        with caplog.at_level(logging.WARNING):
            for _ in range(5):
                with pytest.raises(grpc.RpcError) as err:
                    reply = raw(garbage, timeout=5)
                    list(reply) if kind == "unary_stream" else reply
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "is not a valid moe.v1." in err.value.details()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert list(server.stub.Generate(Req(prompt="ok", max_tokens=2, ignore_eos=True)))


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(server,
                                                                             monkeypatch):
    encoded = []
    monkeypatch.setattr(tokenizer, "encode", lambda text: encoded.append(text) or [0])
    with pytest.raises(grpc.RpcError) as err:
        list(server.stub.Generate(Req(prompt="x" * 3_000_000, max_tokens=4)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at least 3000001 tokens" in err.value.details() and not encoded


@pytest.mark.slow
def test_sigterm_refuses_new_calls_as_unavailable_and_ends_cut_streams_with_abort(tmp_path):
    # the small preset decodes ~25 tokens/s a stream on CPU: 400 tokens outlast the grace
    with server_process(tmp_path, "--preset", "small", "--grace-s", "1") as (proc, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = moe_pb2_grpc.MoEInferenceStub(channel)
            long = stub.Generate(Req(prompt="a", max_tokens=400, ignore_eos=True), timeout=60)
            next(long)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(Req(prompt="b", max_tokens=2), timeout=5))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in err.value.details()
            rest = list(long)
            assert rest[-1].finish_reason == moe_pb2.GenerateResponse.ABORT
        assert proc.wait(timeout=20) == 0
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log and "Cancelling all calls" not in log, log
