"""Routed experts from the servers people deploy: vLLM's lists and SGLang's base64 read into
per-request counts (bad replies named, never guessed), stored compactly, and end to end against
the reference server the report's load, affinity and the what-if equal what it sent; SGLang's
recorder is driven over the run and its dump, like TensorRT-LLM's statistics, read."""

import base64
import io
import itertools
import json
import os
import urllib.request

import numpy as np
import pytest

from analysis.readers.routed_experts import Routing
from analysis.routing.views import affinity
from analysis.routing.what_if import distinct_experts, grouping, token_shares
from loadgen.targets.openai import OpenAITarget
from loadgen.targets.routed_experts import RoutingReader
from proto import moe_pb2
from records.declare import SettingsError, build
from records.expert_routes import RoutedRow, counts_of, decode_counts, encode_counts
from records.load_settings import LoadSettings
from records.server_settings import ServerSettings
from tests.cli import analysis
from tests.conftest import delay_server_process, running_server
from tests.test_end_to_end import locust


def reader(shape: str = "") -> RoutingReader:
    return RoutingReader(build(LoadSettings, {"target": "openai", "routed_experts": "on",
                                              "moe_shape": shape}).target)


IDS = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[0, 3], [-1, -1]]])  # 3 tokens, 2 layers


def npy(ids: np.ndarray, cut: int = 0) -> str:
    """ids as vLLM sends them, base64 of np.save's bytes (tests/engines build them with vLLM's
    own encoder and response models); cut: bytes left off the end."""
    buffer = io.BytesIO()
    np.save(buffer, ids, allow_pickle=False)
    raw = buffer.getvalue()
    return base64.b64encode(raw[:len(raw) - cut]).decode()


def test_vllm_npy_splits_by_the_output_count_and_needs_no_shape():
    # 5 prompt rows and 3 output tokens: rows for the prompt and the output's first 2 (the
    # last token never went through the model)
    rng = np.random.default_rng(1)
    ids = np.argsort(rng.random((7, 2, 16)), axis=2)[:, :, :2].astype(np.uint8)
    fields = reader().fields([("output", npy(ids))], {"prompt_tokens": 5,
                                                      "completion_tokens": 3})
    assert (fields["source"], fields["prompt_tokens"], fields["output_tokens"]) == ("npy", 5, 2)
    assert (decode_counts(fields["prompt_counts"], 2, fields["experts"])
            == counts_of(ids[:5].astype(np.int64), fields["experts"])).all()
    # routed_experts_prompt_start 3: the prompt's first 3 rows are not sent, the split holds
    started = reader("2x16x2").fields([("output", npy(ids[3:].astype(np.uint16)))],
                                      {"prompt_tokens": 5, "completion_tokens": 3})
    assert (started["prompt_tokens"], started["output_tokens"], started["experts"]) == (2, 2, 16)
    assert (decode_counts(started["output_counts"], 2, 16)
            == decode_counts(fields["output_counts"], 2, fields["experts"])[:, :16]).all()


def test_vllm_lists_and_sglang_base64_read_to_the_same_counts():
    lists = reader().fields([("prompt", IDS[:1].tolist()), ("output", IDS[1:].tolist())], {})
    flat = base64.b64encode(IDS.astype("<i4").tobytes()).decode()
    sglang = reader("2x4x2").fields([("all", flat)], {"prompt_tokens": 1})
    for fields in (lists, sglang):
        assert (fields["layers"], fields["top_k"], fields["prompt_tokens"],
                fields["output_tokens"]) == (2, 2, 1, 2)
        output = decode_counts(fields["output_counts"], 2, fields["experts"])
        assert output.tolist() == [[1, 1, 1, 1], [1, 0, 0, 1]]  # -1: a slot without an expert
    assert sglang["source"] == "base64" and lists["source"] == "lists"


def test_one_token_answers_repeated_pieces_and_cached_prompt_rows():
    # a one-token answer: vLLM's output routing is empty, the prompt's is not
    one = reader().fields([("prompt", IDS[:2].tolist()), ("output", [])], {})
    assert (one["prompt_tokens"], "output_tokens" in one) == (2, False)
    # the output's routing in two messages: their tokens in turn
    split = reader().fields([("output", IDS[:1].tolist()), ("output", IDS[1:].tolist())], {})
    assert split["output_tokens"] == 3
    # prompt tokens from the prefix cache are -1 rows: no token's routing
    cached = reader().fields([("prompt", [[[-1, -1], [-1, -1]]] + IDS[:1].tolist())], {})
    assert cached["prompt_tokens"] == 1


@pytest.mark.parametrize("pieces, shape, why", [
    ([], "", "carried no routed experts"),
    ([("all", "AAAA!!")], "2x4x2", "malformed base64"),
    ([("all", base64.b64encode(b"\0" * 12).decode())], "2x4x2", "truncated"),
    ([("all", "AAAA")], "", "give --moe-shape"),
    ([("output", [[[0, 9]]])], "1x4x2", "expert id 9 out of range"),
    ([("output", [[[0, 1], [2]]])], "", "uneven width"),
    ([("output", IDS.tolist())], "3x4x2", "over 2 layers, --moe-shape says 3"),
    ([("output", [[0, 1]])], "", "2 dimensions"),
    ([("output", [[[0, -5]]])], "", "expert id -5 out of range"),
    ([("output", [[[0, 1]]])], "1x4x3", "top-2, --moe-shape says top-3"),
    ([("output", []), ("prompt", [])], "", "held no token"),
    ([("output", npy(IDS[:2].astype(np.uint8), cut=3))], "", "truncated or malformed"),
    ([("output", npy(IDS[:2].astype(np.float32)))], "", "of float32, not integer ids"),
    ([("output", npy(np.full((2, 2, 2), 300, np.uint16)))], "2x16x2", "id 300 out of range"),
])
def test_bad_routing_is_named_and_never_guessed(pieces, shape, why):
    fields = reader(shape).fields(pieces, {})
    assert why in fields["lacking"] and "output_counts" not in fields


def test_the_openai_target_asks_as_the_mode_says_and_keeps_the_pieces_raw():
    def target(mode: str, owner: str = "") -> OpenAITarget:
        t = OpenAITarget(build(LoadSettings, {"target": "openai", "routed_experts": mode}).target)
        t.owner = owner
        return t

    asks = {(mode, owner): target(mode, owner).asks_routing
            for mode in ("off", "on", "auto") for owner in ("vllm", "openai")}
    assert asks == {("off", "vllm"): False, ("off", "openai"): False, ("on", "vllm"): True,
                    ("on", "openai"): True, ("auto", "vllm"): True, ("auto", "openai"): False}
    reading = target("on")
    last = reading.chunk_of(json.dumps({"prompt_routed_experts": [[[1, 2]]], "choices": [
        {"text": "x", "finish_reason": "length", "routed_experts": [[[3, 4]]]}]}))
    # kept as the event's text, read once the request has ended, in the recording process
    assert RoutingReader.pieces(last.routed) == (("prompt", [[[1, 2]]]), ("output", [[[3, 4]]]))
    own = reading.chunk_of(json.dumps({"choices": [], "sglext": {"routed_experts": "AAAA"}}))
    assert RoutingReader.pieces(own.routed) == (("all", "AAAA"),) and not own.tokens
    assert not reading.chunk_of(json.dumps({"choices": [{"text": "x"}]})).routed
    assert target("off").chunk_of(json.dumps({"choices": [], "sglext": {
        "routed_experts": "AAAA"}})).routed == ""


def test_counts_stay_compact_for_a_big_model():
    # a 48-layer top-8 model of 128 experts: 512 prompt and 256 output tokens a request
    rng = np.random.default_rng(0)
    ids = np.argsort(rng.random((768, 48, 128)), axis=2)[:, :, :8]
    row = RoutedRow(request_id="r-123456", warmup=False, sent_ms=1.0, finish_ms=2.0,
                    source="lists", layers=48, experts=128, top_k=8, prompt_tokens=512,
                    output_tokens=256, prompt_counts=encode_counts(counts_of(ids[:512], 128)),
                    output_counts=encode_counts(counts_of(ids[512:], 128)))
    line = len(json.dumps(row.__dict__))
    raw = ids.size * 2  # the ids themselves as int16
    assert line < 11_000 and line * 50 < raw, f"{line} bytes a request"
    assert (decode_counts(row.output_counts, 48, 128) == counts_of(ids[512:], 128)).all()


def routing_of(tokens: list[np.ndarray], experts: int) -> Routing:
    """One request per array of [tokens, layers, top_k] ids, all in flight together."""
    rows = [RoutedRow(request_id=f"r{i}", warmup=False, sent_ms=float(i) / 10, finish_ms=100.0,
                      source="lists", layers=t.shape[1], experts=experts, top_k=t.shape[2],
                      output_tokens=len(t)) for i, t in enumerate(tokens)]
    output = np.stack([counts_of(t, experts) for t in tokens])
    return Routing(tokens[0].shape[1], experts, tokens[0].shape[2], rows,
                   np.zeros_like(output), output)


def brute_force(tokens: list[np.ndarray]) -> float:
    """Distinct experts per layer, over every way of taking one token from each request."""
    counts = [sum(len(set(np.concatenate([t[layer] for t in combo]).tolist()))
                  for layer in range(tokens[0].shape[1])) / tokens[0].shape[1]
              for combo in itertools.product(*tokens)]
    return float(np.mean(counts))


def test_the_what_if_counts_distinct_experts_as_a_brute_force_does():
    rng = np.random.default_rng(3)
    # two groups of requests: 0-2 use experts 0-3, 3-5 use experts 4-7
    # (the odd ones always the same two)
    tokens = [np.stack([rng.permutation(4)[:2] for _ in range(3)]).reshape(3, 1, 2)
              + 4 * (i // 3) for i in range(6)]
    tokens = [t[:1].repeat(3, 0) if i % 2 else t for i, t in enumerate(tokens)]
    routing = routing_of(tokens, 8)
    for batch in ([0, 1], [0, 3, 5], [1, 2, 4]):
        assert distinct_experts(token_shares(routing, batch)) == pytest.approx(
            brute_force([tokens[i] for i in batch]))
    result = grouping(routing, batch=3, step_ms=25.0)
    assert result.steps_with_choice == len(result.batches) >= 2
    by_id = {row.request_id: i for i, row in enumerate(routing.rows)}
    counted = [[brute_force([tokens[by_id[r]] for r in picked]) for picked in step]
               for step in result.batches]
    assert all(fcfs == ["r0", "r1", "r2"] for fcfs, _ in result.batches)  # the oldest
    groups = [{by_id[r] // 3 for r in aware} for _, aware in result.batches]
    assert all(len(g) == 1 for g in groups) and {1} in groups  # a group at a time, both
    assert result.fcfs == pytest.approx(np.mean([f for f, _ in counted]))
    assert result.expert_aware == pytest.approx(np.mean([a for _, a in counted]))


def truth(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/expert_truth", timeout=5) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
@pytest.mark.parametrize("client", ["auto", "gevent"])
def test_vllm_style_routing_end_to_end_equals_what_the_server_sent(tmp_path, client):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "openai", "--routed-experts", "vllm",
                              "--faults", "none,none,none,routing-none,routing-range",
                              "--tokens-per-chunk", "4") as (_, port):
        # half the requests not streamed: vLLM sends routing in those replies only
        done = locust(port, run_dir, "--target", "openai", "--routed-experts", "on",
                      "--moe-shape", "4x16x2", "--rate", "30", "-t", "3", "--max-tokens", "12",
                      "--prompt-tokens", "6", "--client", client, "--routed-experts-sample",
                      "0.5")
        sent = truth(port)
    assert done.returncode == 0, done.stdout
    lines = [json.loads(line) for line in (run_dir / "routed_experts.jsonl").read_text()
             .splitlines()]
    read = [r for r in lines if "lacking" not in r]
    lacking = sorted({r["lacking"][:30] for r in lines if "lacking" in r})
    assert len(read) == len(sent["sets"]) > 15
    assert lacking == ["expert id 9999 out of range (0", "the reply carried no routed ex"]
    assert {r["source"] for r in read} == {"npy"}
    prompt = sum(decode_counts(r["prompt_counts"], 4, 16) for r in read)
    output = sum(decode_counts(r["output_counts"], 4, 16) for r in read)
    assert prompt.tolist() == sent["prompt"] and output.tolist() == sent["output"]
    assert all(r["output_tokens"] == 11 for r in read)  # the last token never went through
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("came without readable routing" in w for w in summary["generator"]["warnings"])
    # the replies read whole are accounted, not timed; the streamed ones are
    requests = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text()
                .splitlines()]
    whole = [r for r in requests if r.get("streamed") is False]
    assert summary["requests"]["unstreamed"] == len(whole) == len(lines) > 15
    assert all(r["status"] == "OK" and r["ttft_ms"] is None for r in whole)
    assert summary["metrics"]["ttft_ms"]["count"] == summary["requests"]["ok"] - len(whole) > 15
    out = analysis("report", run_dir).stdout
    load = np.asarray(sent["prompt"]) + np.asarray(sent["output"])
    hottest = [int(np.argmax(layer)) for layer in load]
    assert hottest == [0, 1, 2, 3]  # the seeded skew: layer l's hottest expert is l
    assert all(f"L{layer} e{e} {load[layer, e] / load[layer].sum():.1%}" in out
               for layer, e in enumerate(hottest))
    # affinity against the sets the server sent (prompt and output together)
    sets = np.zeros((len(sent["sets"]), 4, 16), dtype=np.int64)
    for i, layers in enumerate(sent["sets"]):
        for layer, experts in enumerate(layers):
            sets[i, layer, experts] = 1
    both = [decode_counts(r["prompt_counts"], 4, 16) + decode_counts(r["output_counts"], 4, 16)
            for r in read]
    assert affinity(np.asarray(both)).shared == pytest.approx(affinity(sets).shared)
    assert (run_dir / "routed_experts.png").exists()
    assert f"{len(whole)} of the ok sent non-streamed for their routed experts" in out
    # the imbalance rule reads the same routing as the section (no GetStats here)
    assert "the routed experts of" in out and "not judged Expert load imbalance" not in out
    what_if = analysis("what-if", run_dir, "--max-batch-size", "2", "--ep-ranks", "4").stdout
    assert "expert_aware would cut distinct experts per decode step" in what_if
    assert "on 4 ranks: the hottest rank carries" in what_if
    last = json.loads(what_if.strip().splitlines()[-1])  # its figures, a line of JSON
    assert last["requests"] == len(read) and last["placement"]["ranks"] == 4
    grouped = last["grouping"]
    assert grouped["batch"] == 2 and grouped["max_in_flight"] > 2
    assert grouped["steps_with_choice"] > 0 and grouped["expert_aware_experts"] > 0
    roomy = analysis("what-if", run_dir, "--max-batch-size", "500").stdout
    assert f"at most {json.loads(roomy.splitlines()[-1])['grouping']['max_in_flight']} " \
        "requests were in flight" in roomy
    bad = analysis("what-if", run_dir, "--ep-ranks", "3")
    assert bad.returncode != 0 and "do not divide over 3 ranks" in bad.stderr


@pytest.mark.slow
def test_sglang_style_routing_and_its_recorder_around_the_measured_window(tmp_path):
    run_dir, dumps = tmp_path / "run", tmp_path / "dumps"
    os.environ["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"] = str(dumps)
    try:
        with delay_server_process(tmp_path, "--protocol", "openai", "--routed-experts",
                                  "sglang", "--faults", "none,routing-base64") as (_, port):
            done = locust(port, run_dir, "--target", "openai", "--routed-experts", "auto",
                          "--moe-shape", "4x16x2", "--rate", "20", "-t", "3", "--max-tokens",
                          "8", "--warmup-s", "1", "--expert-record-url",
                          f"http://127.0.0.1:{port}", "--expert-record-dir", str(dumps))
            sent = truth(port)
    finally:
        del os.environ["SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR"]
    assert done.returncode == 0, done.stdout
    lines = [json.loads(line) for line in (run_dir / "routed_experts.jsonl").read_text()
             .splitlines()]
    assert sum("lacking" not in r for r in lines) == len(sent["sets"])
    assert {r["lacking"] for r in lines if "lacking" in r} == {"routed experts in malformed "
                                                               "base64"}
    copied = list((run_dir / "expert_records" / "sglang").glob("*.pt"))
    assert len(copied) == 1
    out = analysis("report", run_dir).stdout
    assert "routing: sglang expert statistics: " in out and "passes, 4 layers x 16" in out


@pytest.mark.slow
def test_a_failing_dump_is_a_warning_and_trtllm_statistics_import(tmp_path):
    from safetensors.numpy import save_file

    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "openai", "--routed-experts", "sglang",
                              "--recorder-fault", "error") as (_, port):
        done = locust(port, run_dir, "--target", "openai", "--rate", "10", "-t", "1",
                      "--max-tokens", "4", "--expert-record-url", f"http://127.0.0.1:{port}")
    assert done.returncode == 0, done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("dump_expert_distribution_record answered HTTP 500" in w
               for w in summary["generator"]["warnings"])
    stats = tmp_path / "expert_statistic"
    stats.mkdir()
    (stats / "meta_info.json").write_text(json.dumps({"num_experts": 4,
                                                      "num_experts_per_token": 2}))
    for rank in range(2):
        save_file({f"{i}_{layer}": np.array([3, 1, 0, 0], dtype=np.int64) * (rank + 1)
                   for i in (10, 11) for layer in (3, 4)}, str(stats / f"rank{rank}.safetensors"))
    out = analysis("import-expert-stats", stats, run_dir).stdout
    assert "trtllm expert statistics: 2 iterations, 2 layers x 4 experts" in out
    assert "experts touched per step 2.0" in out and "hottest/mean expert per step 3.00" in out
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "meta_info.json").write_text("{}")
    bad = analysis("import-expert-stats", garbage, run_dir)
    assert bad.returncode != 0 and "no statistics read" in bad.stderr
    assert "trtllm expert statistics" in analysis("report", run_dir).stdout


def expert_tokens(served) -> np.ndarray:
    stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
    return np.asarray([list(layer.tokens) for layer in stats.expert_tokens])


def completion(port: int, **body) -> bytes:
    return urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST",
        data=json.dumps({"prompt": "hello", "max_tokens": 4, "ignore_eos": True} | body).encode(),
        headers={"Content-Type": "application/json"}), timeout=30).read()


def npy_of(reply: bytes) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(json.loads(reply)["choices"][0]["routed_experts"])))


@pytest.mark.slow
def test_the_lab_server_answers_in_vllms_fields_and_a_run_agrees_with_getstats(tmp_path):
    with running_server(max_batch_size=4, http_port=0, enable_return_routed_experts=True,
                        max_wait_ms=5.0) as served:
        before = expert_tokens(served)
        run_dir = tmp_path / "run"
        done = locust(f"http://127.0.0.1:{served.app.http_port}", run_dir, "--target", "openai",
                      "--routed-experts", "auto", "--rate", "8", "-t", "2", "--max-tokens", "6",
                      "--prompt-tokens", "12", "--routed-experts-sample", "1")
        after = expert_tokens(served)
        port = served.app.http_port
        whole, started = completion(port), completion(port, routed_experts_prompt_start=2)
        streamed = completion(port, stream=True)
    assert done.returncode == 0, done.stdout
    # vLLM's field in a whole response: every prompt token, the output's tokens but the last
    prompt_tokens = json.loads(whole)["usage"]["prompt_tokens"]
    ids = npy_of(whole)
    assert ids.dtype == np.uint8 and ids.shape == (prompt_tokens + 3, after.shape[0], 2)
    assert (npy_of(started) == ids[2:]).all()
    assert b"routed_experts" not in streamed and b"prompt_routed_experts" not in whole
    with pytest.raises(SettingsError, match="--enable-return-routed-experts: is for one"):
        build(ServerSettings, {"enable_return_routed_experts": True, "ep": 2})
    lines = [json.loads(line) for line in (run_dir / "routed_experts.jsonl").read_text()
             .splitlines()]
    assert lines and all("lacking" not in r for r in lines)
    layers, experts = after.shape
    assert {(r["layers"], r["top_k"], r["output_tokens"]) for r in lines} == {(layers, 2, 5)}
    assert all(r["experts"] <= experts for r in lines)  # the width: the highest id seen + 1
    padded = [np.pad(decode_counts(r[k], layers, r["experts"]),
                     ((0, 0), (0, experts - r["experts"])))
              for r in lines for k in ("prompt_counts", "output_counts")]
    assert (sum(padded) == after - before).all()
