"""Every target (--target) against its known-delay reference server (loadgen/delay_server.py
--protocol), with both clients where they differ (PAIRS): TTFT, TPOT and the per-token ITL
within a stated error of the truth, a stall of every stream seen in TTFT p99, streams of
two-token chunks counted right; bad replies each counted with their own status and nothing
lost; the `openai` target against this project's own server over its HTTP port; settings a
target cannot run with, a server that speaks another protocol and the reference servers'
--protocol refused before any request, in one line; token ids asked of the servers that send
them."""

import json
import logging

import pytest

from analysis.readers.rundir import load_run
from analysis.rules.delivery import write_delay
from loadgen.settings import check
from loadgen.targets.client import StreamResult
from loadgen.targets.moe import MoeTarget
from loadgen.targets.openai import OpenAITarget
from loadgen.targets.target import TARGETS, RequestSpec, target_of
from proto import moe_pb2
from records.declare import SettingsError, build
from records.jsonform import to_json
from records.load_settings import LoadSettings
from tests.conftest import delay_server_process, server_process
from tests.test_end_to_end import locust
from tests.tokenizer_files import write_word_tokenizer

# Locust's gevent clients add delivery lag at this light load (docs/measured.md), and the
# reference server's own wake-ups a few ms more.
TOLERANCE_MS = 8
TTFT_MS, ITL_MS, TOKENS = 20, 10, 7
STALL_S = 0.6


def host_of(target: str, port: int) -> str:
    return f"http://127.0.0.1:{port}" if target == "openai" else f"127.0.0.1:{port}"


def run(tmp_path, target: str, *flags: str, server: tuple[str, ...] = (), seconds: int = 3):
    """One run against the target's reference server: (summary, requests.jsonl rows, stdout)."""
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", target, "--ttft-ms", str(TTFT_MS),
                              "--itl-ms", str(ITL_MS), *server) as (_, port):
        done = locust(host_of(target, port), run_dir, "--target", target, "-t", f"{seconds}s",
                      "--prompt-tokens", "4", "--max-tokens", str(TOKENS), *flags)
    assert done.returncode in (0, 1), done.stdout  # 1: Locust's own exit for failed requests
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    return summary, rows, done.stdout


# Per target, what it needs beyond --host and how a run with it is told apart: the openai
# target counts text by a tokenizer with greenlets and asks for token ids on the chat endpoint
# with aio; Triton runs as its vLLM backend with greenlets and as TensorRT-LLM's with aio.
EXTRA = {("openai", "gevent"): ("--tokenizer", "{tokenizer}"),
         ("openai", "aio"): ("--endpoint", "/v1/chat/completions", "--token-ids"),
         ("triton", "gevent"): ("--model", "llm"),
         ("triton", "aio"): ("--model", "llm", "--triton-backend", "trtllm")}


# Each target with each client, but where the two clients share every line of a target's own
# code: the three gRPC engines' requests and messages are one class's (EngineTarget; their
# streams are loadgen/targets/grpc_stream.py's, which moe's pair tests), so each runs once,
# alternating, sglang-grpc's with aio through its messages' fast path (`plain`).
PAIRS = [(target, client) for target in TARGETS for client in ("gevent", "aio")
         if (target, client) not in {("vllm-grpc", "aio"), ("sglang-grpc", "gevent"),
                                     ("trtllm-grpc", "aio")}]


@pytest.mark.slow
@pytest.mark.timing  # measured against known delays: make test runs them alone
@pytest.mark.parametrize(("target", "client"), PAIRS)
def test_a_target_measures_its_reference_server_truthfully(tmp_path, target, client):
    tokenizer = write_word_tokenizer(tmp_path / "tokenizer.json", ["tok"])
    extra = [f.format(tokenizer=tokenizer) for f in EXTRA.get((target, client), ())]
    summary, rows, out = run(tmp_path, target, "--rate", "10", "--arrival", "constant",
                             "--client", client, *extra,
                             server=("--tokens-per-chunk", "2", "--stall-at-s", "1.5",
                                     "--stall-s", str(STALL_S)))
    m, req = summary["metrics"], summary["requests"]
    assert req["sent"] == req["ok"] >= 20, out  # 10/s, less the aio sender's start-up
    # chunks of two tokens (the first alone): every token counted, whatever the protocol says
    assert all(r["output_tokens"] == TOKENS and r["messages"] == 4 for r in rows)
    assert TTFT_MS <= m["ttft_ms"]["p50"] <= TTFT_MS + TOLERANCE_MS
    assert m["ttft_ms"]["p99"] >= STALL_S * 1000 / 2  # requests arriving in the stall wait it
    assert ITL_MS - 1 <= m["tpot_ms"]["p50"] <= ITL_MS + TOLERANCE_MS / 2
    assert ITL_MS - 1 <= m["itl_token_ms"]["p50"] <= ITL_MS + TOLERANCE_MS / 2
    assert 2 * ITL_MS - 1 <= m["itl_ms"]["p50"] <= 2 * ITL_MS + TOLERANCE_MS / 2
    estimated = any("estimated" in w for w in summary["generator"].get("notes", []))
    assert estimated == (target == "triton" and client == "aio")  # text, no tokenizer
    if target in ("moe", "openai"):  # their servers say when each message left
        assert m["delivery_lag_ms"]["count"] == sum(r["messages"] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_bad_openai_replies_are_each_counted_with_their_own_status(tmp_path, client):
    faults = "http-500,not-sse,no-done,bad-json,error-event,drop"
    summary, rows, out = run(tmp_path, "openai", "--rate", "14", "--client", client,
                             server=("--faults", faults))
    req = summary["requests"]
    assert req["sent"] == req["ok"] + req["failed"] and req["ok"] >= 2, out
    assert set(req["failed_by_code"]) == {"HTTP_500", "BAD_STREAM", "INCOMPLETE",
                                          "SERVER_ERROR", "UNAVAILABLE"}, out
    details = {r["status"]: r["details"] for r in rows}
    assert "injected fault" in details["HTTP_500"] and "[DONE]" in details["INCOMPLETE"]
    assert "Traceback" not in out


@pytest.mark.slow
def test_a_grpc_stream_that_breaks_or_ends_early_is_counted_failed(tmp_path):
    summary, _, out = run(tmp_path, "vllm-grpc", "--rate", "10",
                          server=("--faults", "abort,no-final"))
    req = summary["requests"]
    assert req["sent"] == req["ok"] + req["failed"] and req["ok"] >= 2, out
    assert set(req["failed_by_code"]) == {"INTERNAL", "INCOMPLETE"}


@pytest.mark.slow
def test_a_wrong_endpoint_fails_every_request_and_a_dead_host_stops_the_run(tmp_path):
    summary, rows, out = run(tmp_path, "openai", "--rate", "5", "--endpoint", "/v1/nowhere",
                             seconds=2)
    assert set(summary["requests"]["failed_by_code"]) == {"HTTP_404"} and rows, out
    # a dead host: the pre-flight stops the run in one line, before any request
    done = locust("http://127.0.0.1:9", tmp_path / "dead", "--target", "openai", "-t", "2s",
                  "--rate", "5")
    assert done.returncode == 2 and not (tmp_path / "dead" / "summary.json").exists()
    lines = done.stdout.strip().splitlines()
    assert "openai server at http://127.0.0.1:9" in lines[-1]
    assert lines[-1].endswith("; not starting") and "Traceback" not in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_the_openai_target_runs_against_this_projects_server(tmp_path, client):
    http_port_file = tmp_path / "http.port"
    run_dir = tmp_path / "run"
    with server_process(tmp_path, "--http-port", "0", "--http-port-file",
                        str(http_port_file)) as (_, _port):
        done = locust(f"http://127.0.0.1:{http_port_file.read_text().strip()}", run_dir,
                      "--target", "openai", "--token-ids", "-t", "3s", "--rate", "4",
                      "--prompt-tokens", "16", "--max-tokens", "8", "--client", client)
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert summary["requests"]["sent"] == summary["requests"]["ok"] >= 8
    assert all(r["output_tokens"] == 8 and r["server_completion_tokens"] == 8 for r in rows)
    assert all(r["server_prompt_tokens"] == 16 for r in rows)  # sent as ids: exact
    assert summary["metrics"]["delivery_lag_ms"]["count"] > 0
    assert summary["config"]["target"] == "openai"
    # two-sided as over gRPC: the server's own times in the usage, its /metrics scraped
    assert summary["server_time_ms"]["queue"]["count"] == summary["requests"]["ok"]
    assert summary["server_time_ms"]["prefill"]["count"] == summary["requests"]["ok"]
    assert (run_dir / "server_metrics.jsonl").read_text().count('"moe_steps"') >= 2
    assert write_delay(load_run(run_dir)).count > 0  # scraped: no GetStats over HTTP


@pytest.mark.parametrize(("target", "values", "says"), [
    ("vllm-grpc", {"host": "http://127.0.0.1:1"}, "--host: the vllm-grpc target speaks gRPC"),
    ("openai", {"host": "http://127.0.0.1:1/v1"}, "--host: must be HOST:PORT or http://HOST:PORT"),
    ("openai", {"host": "ftp://127.0.0.1:1"}, "--host: must be http://HOST:PORT"),
    ("triton", {}, "--model: the triton target needs it"),
    ("sglang-grpc", {"dataset": "{dataset}"}, "--dataset: the sglang-grpc target takes token"),
    ("openai", {"endpoint": "v1/completions"}, "--endpoint: must be a path"),
    ("openai", {"headers": ("X-Token",)}, "--header: must be NAME:VALUE"),
    ("grpc", {}, "--target: unknown 'grpc'"),
])
def test_settings_a_target_cannot_run_with_are_refused_naming_the_flag(tmp_path, target,
                                                                       values, says):
    dataset = tmp_path / "chats.json"
    dataset.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"},
                                                      {"from": "gpt", "value": "hello"}]}]))
    values = {k: str(dataset) if v == "{dataset}" else v for k, v in values.items()}
    with pytest.raises(SettingsError) as err:
        check(build(LoadSettings, {"target": target} | values))
    assert str(err.value).startswith(says), err.value


def test_secrets_are_not_written_down():
    settings = build(LoadSettings, {"target": "openai", "api_key": "sk-1",
                                    "headers": ("X-Key: 2",)})
    config = to_json(settings)
    assert config["api_key"] == "<set>" and config["headers"] == "<set>"
    assert "sk-1" not in json.dumps(config)


def test_a_moe_server_without_the_health_service_is_still_a_server(tmp_path, caplog):
    target = MoeTarget(build(LoadSettings, {}).target)
    (tmp_path / "bare").mkdir()
    (tmp_path / "full").mkdir()
    with delay_server_process(tmp_path / "bare", "--protocol", "moe", "--no-health") as (_, port):
        with caplog.at_level(logging.WARNING, logger="loadgen"):
            assert target.probe(f"127.0.0.1:{port}") == ""
    assert "readiness could not be checked" in caplog.text and "UNIMPLEMENTED" in caplog.text
    with delay_server_process(tmp_path / "full", "--protocol", "moe") as (_, port):
        assert target.probe(f"127.0.0.1:{port}") == ""  # serving, said by its health service
    assert "not answering" in target.probe("127.0.0.1:9")  # nobody there


@pytest.mark.slow
def test_a_server_of_another_protocol_is_refused_in_one_line_naming_it(tmp_path):
    http_port_file = tmp_path / "http.port"
    with server_process(tmp_path, "--http-port", "0", "--http-port-file",
                        str(http_port_file)) as (_, grpc_port):
        http_port = http_port_file.read_text().strip()
        # the openai target at the gRPC port, the moe target at the HTTP port
        at_grpc = locust(f"http://127.0.0.1:{grpc_port}", tmp_path / "a", "--target", "openai",
                         "-t", "2s")
        at_http = locust(f"127.0.0.1:{http_port}", tmp_path / "b", "-t", "2s")
        # the reference servers' word for --target
        misnamed = locust(f"127.0.0.1:{grpc_port}", tmp_path / "c", "--protocol", "moe",
                          "-t", "2s")
    for done, says in ((at_grpc, "does not answer in HTTP/1.1: it speaks gRPC (HTTP/2)"),
                       (at_http, "does not answer in gRPC: it speaks HTTP/1.1"),
                       (misnamed, "--protocol: the server's protocol is --target here")):
        last = done.stdout.strip().splitlines()[-1]
        assert done.returncode == 2 and says in last, done.stdout
        assert "Traceback" not in done.stdout


@pytest.mark.parametrize("name", ["moe", "sglang-grpc"])
def test_a_message_read_by_the_fast_path_is_recorded_as_its_chunk_would_be(name):
    """The aio sender reads a gRPC message of tokens alone without a Chunk (GrpcTarget.plain,
    StreamResult.timed): what it records is what the Chunk's way records; a message that ends
    the stream, or carries no token, goes the Chunk's way."""
    target = target_of(build(LoadSettings, {"target": name}).target)
    if name == "moe":
        messages = [moe_pb2.GenerateResponse(token_ids=ids, text="ab"[:len(ids)],
                                             server_elapsed_us=900 + len(ids))
                    for ids in ([97], [97, 98])]
        ends = [moe_pb2.GenerateResponse(token_ids=[97], finish_reason=1),
                moe_pb2.GenerateResponse(server_elapsed_us=5)]
    else:
        messages = [target.pb.GenerateResponse(chunk={"token_ids": ids}) for ids in ([7], [7, 8])]
        ends = [target.pb.GenerateResponse(complete={"finish_reason": "length"}),
                target.pb.GenerateResponse(chunk={})]
    spec = RequestSpec("r", 3, prompt_ids=(65,))
    fast, whole = StreamResult.of(spec, 0), StreamResult.of(spec, 0)
    seen = 0
    for arrived_ns, msg in enumerate(messages, start=10):
        tokens, server_us = target.plain(msg)
        assert not fast.timed(arrived_ns, tokens, server_us, msg.ByteSize())
        chunk = target.chunk_of(msg, seen)
        chunk.size, chunk.arrived_ns = msg.ByteSize(), arrived_ns
        assert not whole.take(chunk)
        seen += tokens
    assert vars(fast) == vars(whole) and fast.tokens == [1, 2] and fast.received_bytes > 0
    assert [target.plain(msg) for msg in ends] == [None, None]


def test_each_request_carries_its_id_on_the_wire_whatever_the_target():
    spec = RequestSpec("7-42", 4, (65,), session="s1")
    for name in TARGETS:
        target = target_of(build(LoadSettings, {"target": name}).target)
        if name == "openai":
            headers = target.headers_of(spec)
            assert headers["X-Request-Id"] == "7-42" and headers["X-Session-ID"] == "s1"
            assert "X-Request-Id" not in target.headers  # the shared headers stay the run's
        else:
            assert {("x-request-id", "7-42"), ("session_id", "s1")} <= set(target.metadata_of(spec))


def test_token_ids_are_asked_of_the_servers_that_send_them_unless_told():
    def target(owner: str, **values) -> OpenAITarget:
        t = OpenAITarget(build(LoadSettings, {"target": "openai"} | values).target)
        t.owner = owner
        return t

    asked = {(owner, str(values)): target(owner, **values).token_ids
             for owner in ("vllm", "moe-loadlab", "sglang", "")
             for values in ({}, {"token_ids": False}, {"token_ids": True})}
    assert {key for key, on in asked.items() if on} == {
        ("vllm", "{}"), ("moe-loadlab", "{}"), *((o, "{'token_ids': True}") for o in
                                                   ("vllm", "moe-loadlab", "sglang", ""))}
    assert b'"return_token_ids": true' in target("vllm").body(RequestSpec("r", 4, (65,)))
    assert not target("sglang").token_ids and target("sglang").streams_text
