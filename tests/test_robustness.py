"""The server against hostile and unlucky input: bytes that are no request, prompts too long
to be worth reading, a shutdown with streams still open. Each ends in a clear status, costs
no more than it must, and leaves the log clean."""

import json
import logging
import signal
import subprocess
import time

import grpc
import pytest
import torch

from proto import moe_pb2, moe_pb2_grpc
from records.server_settings import Limits
from server.engine.tokenizer import ByteTokenizer
from server.frontends.grpc_service import server_options
from tests.cli import analysis
from tests.conftest import (
    REPO,
    delay_server_process,
    running_server,
    server_process,
    stop_process,
)
from tests.test_end_to_end import free_port, locust
from tests.test_http_api import call
from tests.test_service import stats


def locust_process(port: int, run_dir, *flags: str) -> subprocess.Popen:
    """A headless run in the background: Popen with its output in .communicate()."""
    return subprocess.Popen([str(REPO / ".venv/bin/locust"), "-f", "loadgen/moe.py", "--host",
                             f"127.0.0.1:{port}", "--headless", "--only-summary", "--run-dir",
                             str(run_dir), *flags], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

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
    monkeypatch.setattr(ByteTokenizer, "encode", lambda self, text: encoded.append(text) or [0])
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


@pytest.mark.slow
def test_a_server_killed_mid_run_fails_requests_fast_and_the_run_recovers_when_it_returns(
        tmp_path):
    run_dir = tmp_path / "run"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    started = time.monotonic()
    with delay_server_process(first, "--ttft-ms", "20", "--itl-ms", "10") as (server, port):
        load = locust_process(port, run_dir, "-t", "7s", "--rate", "10", "--arrival", "constant",
                              "--prompt-tokens", "4", "--max-tokens", "20")
        time.sleep(3)
        stop_process(server)  # streams in flight break, new ones find nobody
        time.sleep(1.5)
        with delay_server_process(second, "--port", str(port), "--ttft-ms", "20",
                                  "--itl-ms", "10"):
            out, _ = load.communicate(timeout=60)
    assert time.monotonic() - started < 20, out  # nothing waited for the dead server
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    req = summary["requests"]
    assert req["sent"] == req["ok"] + req["failed"] and "CUT_OFF" not in req["failed_by_code"]
    assert req["failed_by_code"]["UNAVAILABLE"] >= 10, req  # ~1.5 s down at 10/s
    back = [r for r in rows if r["status"] == "OK" and r["scheduled_ms"] > 6000]
    assert back, "the run did not recover when the server returned"
    assert analysis("report", run_dir).returncode == 0
    report = (run_dir / "report.md").read_text()
    assert "the server could not be reached (UNAVAILABLE or GetStats failing) at " in report


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_the_pre_flight_stops_at_a_dead_server_in_one_line(tmp_path, client):
    port = free_port()
    started = time.monotonic()
    done = locust(port, tmp_path / "run", "-t", "20s", "--rate", "10", "--client", client)
    assert done.returncode == 2 and time.monotonic() - started < 15  # no run, no drain
    lines = done.stdout.strip().splitlines()
    errors = [line for line in lines if "not answering" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], done.stdout  # the last thing printed
    assert errors[0].startswith("loadgen/moe.py: --host: ")
    assert "Ramping" not in done.stdout
    assert f"moe server at 127.0.0.1:{port} is not answering: UNAVAILABLE" in errors[0]
    assert f"start one with: python -m server --port {port}" in errors[0]
    assert errors[0].endswith("; not starting")
    assert "Traceback" not in done.stdout


def test_a_request_over_max_message_bytes_is_refused_unread_on_both_ports():
    with running_server(max_message_bytes=4096, http_port=0) as s:
        with pytest.raises(grpc.RpcError) as err:
            list(s.stub.Generate(Req(prompt="x" * 5000, max_tokens=2), timeout=5))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status, _, text = call(s.app.http_port, "POST", "/v1/completions",
                               {"prompt": "x" * 5000, "max_tokens": 2})
        assert status == 413 and "--max-message-bytes" in json.loads(text)["error"]["message"]
        assert list(s.stub.Generate(Req(prompt="ok", max_tokens=2, ignore_eos=True)))


@pytest.mark.slow
def test_streams_over_max_concurrent_streams_wait_on_their_connection():
    # each message held back 2 s (--fault-slow): the two streams stay open for seconds
    with running_server(max_concurrent_streams=2, max_batch_size=4, fault_slow=1.0,
                        fault_slow_ms=2000) as s:
        long = [s.stub.Generate(Req(prompt="a", max_tokens=40, ignore_eos=True), timeout=30)
                for _ in range(2)]
        for call_ in long:
            next(call_)
        with pytest.raises(grpc.RpcError) as err:  # no stream slot on this connection
            list(s.stub.Generate(Req(prompt="b", max_tokens=2), timeout=0.5))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with grpc.insecure_channel(f"127.0.0.1:{s.port}",  # a connection of its own
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as other:
            seen = stats(moe_pb2_grpc.MoEInferenceStub(other))
        assert seen.requests_admitted == 2  # the third never reached the server
        long[0].cancel()
        assert list(s.stub.Generate(Req(prompt="c", max_tokens=2, ignore_eos=True), timeout=10))


def test_keepalive_and_connection_age_become_grpc_channel_arguments():
    options = dict(server_options(Limits(keepalive_s=30, max_connection_age_s=600), grace_s=5))
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.max_connection_age_ms"] == 600_000
    assert options["grpc.max_connection_age_grace_ms"] == 5_000
    assert "grpc.max_connection_age_ms" not in dict(server_options(Limits(), grace_s=5))


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_client_cancellations_are_counted_apart_and_free_the_server(tmp_path, client):
    with running_server(max_batch_size=8, max_tokens_limit=512) as s:
        done = locust(s.port, tmp_path / "run", "-t", "4s", "--rate", "10", "--max-tokens", "200",
                      "--prompt-tokens", "8", "--cancel-share", "0.5", "--seed", "3",
                      "--client", client)
        assert done.returncode == 0, done.stdout
        summary = json.loads((tmp_path / "run/summary.json").read_text())
        r = summary["requests"]
        assert r["failed"] == 0 and r["sent"] == r["ok"] + r["cancelled"]
        assert 0.25 * r["sent"] < r["cancelled"] < 0.75 * r["sent"]
        assert f"+ cancelled by the client {r['cancelled']}" in done.stdout
        rows = [json.loads(line) for line in (tmp_path / "run/requests.jsonl").open()]
        cut = [row for row in rows if row["status"] == "CLIENT_CANCELLED"]
        assert all(0 < row["output_tokens"] < 200 for row in cut)
        end = stats(s.stub)  # a cancel that crossed the last token counts as finished there
        assert end.requests_finished + end.requests_aborted == r["sent"]
        assert 0.8 * r["cancelled"] <= end.requests_aborted <= r["cancelled"]
        assert end.kv_slots_in_use == 0


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
], ids=["allocator", "cublas"])
def test_a_step_out_of_memory_fails_its_requests_only_and_the_server_serves_on(caplog, error):
    # No GPU to exhaust here: the engine's step raises once what a CUDA step over its memory
    # raises, from torch's allocator or from cuBLAS's.
    with running_server(max_batch_size=4) as served:
        engine = served.app.service.engine_thread.batching.engine
        step, failed = engine.step, []

        def step_once_out_of_memory(seqs):
            if not failed:
                failed.append(len(seqs))
                raise error
            return step(seqs)

        engine.step = step_once_out_of_memory
        request = moe_pb2.GenerateRequest(prompt="hello", max_tokens=4, ignore_eos=True)
        with caplog.at_level(logging.WARNING, logger="server.scheduling.engine_thread"):
            with pytest.raises(grpc.RpcError) as err:
                list(served.stub.Generate(request))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        prompt = len(ByteTokenizer().encode("hello"))
        assert (f"the engine ran out of memory in a step of 1 sequences ({prompt} prompt tokens); "
                "this request failed and its KV slot is free") in err.value.details()
        assert "engine step out of memory" in caplog.text
        msgs = list(served.stub.Generate(request))  # the server goes on, the slot free again
        assert sum(len(m.token_ids) for m in msgs) == 4
        s = stats(served.stub)
        assert (s.requests_aborted, s.requests_finished) == (1, 1)
