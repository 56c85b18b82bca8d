"""Trace replay (--trace): each public format read from a small trace the test writes, the
slice, speed-up, loop and the split over workers, the prompts a Mooncake trace's hash ids
build, every bad trace refused in one line naming the file (and the line); end to end, each
format replayed against this project's server, every request at its time with its lengths."""

import json

import pytest

from loadgen.settings import check
from loadgen.traffic.traces import read_trace_file, trace_arrivals
from loadgen.traffic.workload import Workload
from records.declare import SettingsError, build
from records.load_settings import LoadSettings
from records.prefix_blocks import PrefixBlocks
from tests.conftest import server_process
from tests.test_end_to_end import locust


def write(path, lines: list) -> str:
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return str(path)


def mooncake(tmp_path) -> str:
    return write(tmp_path / "mooncake.jsonl", [
        {"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [7, 8]},
        {"timestamp": 250, "input_length": 30, "output_length": 2, "hash_ids": [7, 9]},
        {"timestamp": 500, "input_length": 50, "output_length": 4, "hash_ids": [7, 8, 10]}])


def burstgpt(tmp_path) -> str:
    return write(tmp_path / "burstgpt.csv", [
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        "5,ChatGPT,20,3,23,Conversation log", "5.3,GPT-4,12,0,12,Conversation log",
        "5.6,ChatGPT,16,2,18,API log"])


def azure(tmp_path) -> str:
    return write(tmp_path / "azure.csv", [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,24,3", "2023-11-16 18:15:46.9805900,10,2",
        "2023-11-16 18:15:47.1805900,18,4"])


def ours(tmp_path) -> str:
    return write(tmp_path / "ours.jsonl", [
        {"t_s": 0.0, "prompt_tokens": 12, "max_tokens": 3, "session": "a"},
        {"t_s": 0.4, "prompt": "what is a mixture of experts", "max_tokens": 2}])


def settings(**values) -> LoadSettings:
    return build(LoadSettings, {"host": "127.0.0.1:1"} | values)


# --- the formats ---------------------------------------------------------------------------

@pytest.mark.parametrize("make, fmt, times, lengths, skipped", [
    (mooncake, "mooncake", [0, 0.25, 0.5], [(40, 3), (30, 2), (50, 4)], 0),
    (burstgpt, "burstgpt", [0, 0.6], [(20, 3), (16, 2)], 1),  # 0 response tokens: failed
    (azure, "azure", [0, 0.3, 0.5], [(24, 3), (10, 2), (18, 4)], 0),
    (ours, "jsonl", [0, 0.4], [(12, 3), (6, 2)], 0),  # a text prompt: a word a token
])
def test_a_trace_of_each_format_is_read_with_its_times_and_lengths(tmp_path, make, fmt, times,
                                                                  lengths, skipped):
    trace = read_trace_file(make(tmp_path))
    assert trace.format == fmt and trace.skipped == skipped
    assert [r.t_s for r in trace.requests] == pytest.approx(times)
    assert [(r.prompt_tokens, r.max_tokens) for r in trace.requests] == lengths
    assert read_trace_file(make(tmp_path), fmt).requests == trace.requests  # named, the same


def test_requests_out_of_time_order_are_sorted_and_said(tmp_path):
    path = write(tmp_path / "t.jsonl", [{"t_s": 2, "prompt_tokens": 4, "max_tokens": 1},
                                        {"t_s": 1, "prompt_tokens": 5, "max_tokens": 1}])
    trace = read_trace_file(path)
    assert [r.prompt_tokens for r in trace.requests] == [5, 4] and trace.unsorted == 1
    assert "1 requests were out of time order, sorted" in " ".join(trace.notes)


@pytest.mark.parametrize("lines, says", [
    ([], "is empty"),
    (["hello,world", "1,2"], "unknown trace format"),
    ([{"t_s": 0, "prompt_tokens": 4, "max_tokens": 1}, "{not json"], "t.jsonl:2: not JSON"),
    ([{"t_s": -1, "prompt_tokens": 4, "max_tokens": 1}], "t.jsonl:1: time -1 is negative"),
    ([{"t_s": 0, "prompt_tokens": "many", "max_tokens": 1}],
     "t.jsonl:1: prompt_tokens 'many' is not a number"),
    ([{"t_s": 0, "prompt_tokens": 4}], "t.jsonl:1: no 'max_tokens'"),
    ([{"t_s": 0, "prompt_tokens": 4, "max_tokens": 0}], "no request with output to replay"),
])
def test_a_bad_trace_is_refused_in_one_line_naming_the_file_and_line(tmp_path, lines, says):
    path = write(tmp_path / "t.jsonl", lines) if lines else str(tmp_path / "t.jsonl")
    if not lines:
        (tmp_path / "t.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=says):
        read_trace_file(path)


def test_the_settings_refuse_a_missing_trace_or_a_mode_it_cannot_run_in(tmp_path):
    with pytest.raises(SettingsError, match="--trace: cannot read trace"):
        check(settings(trace=str(tmp_path / "nothing.jsonl")))
    with pytest.raises(SettingsError, match="--trace: replays the trace's own schedule"):
        settings(trace=ours(tmp_path), mode="closed")
    with pytest.raises(SettingsError, match="--trace: --trace-start-s 9 .* no request"):
        check(settings(trace=ours(tmp_path), trace_start_s=9))
    with pytest.raises(SettingsError, match="--trace: .*burstgpt trace has"):
        check(settings(trace=ours(tmp_path), trace_format="burstgpt"))


# --- the schedule and the prompts ------------------------------------------------------------

def test_slice_speedup_loop_and_workers_keep_every_send_time(tmp_path):
    traffic = settings(trace=azure(tmp_path), trace_start_s=0.2, trace_speedup=2.0).traffic
    assert list(trace_arrivals(traffic)) == [(0, 0.0), (1, pytest.approx(0.1))]
    looped = settings(trace=azure(tmp_path), trace_loop=True).traffic
    first = [t for _, (_, t) in zip(range(6), trace_arrivals(looped), strict=False)]
    assert first == pytest.approx([0, 0.3, 0.5, 0.75, 1.05, 1.25])  # a mean gap between passes
    whole = dict(trace_arrivals(settings(trace=azure(tmp_path)).traffic))
    split = [dict(trace_arrivals(settings(trace=azure(tmp_path)).traffic, 2, w)) for w in (0, 1)]
    assert split[0] | split[1] == whole and not set(split[0]) & set(split[1])


def test_a_mooncake_prompt_is_its_hash_ids_blocks_cut_to_its_length(tmp_path):
    workload = Workload(settings(trace=mooncake(tmp_path), trace_block_tokens=16))
    first, second, third = (workload.request(i) for i in range(3))
    assert [len(s.prompt_ids) for s in (first, second, third)] == [40, 30, 50]
    assert [s.max_tokens for s in (first, second, third)] == [3, 2, 4]
    block = workload.trace_block
    assert first.prompt_ids[:32] == block(7) + block(8)  # then its own 8 tokens
    assert second.prompt_ids == block(7) + block(9)[:14]  # the last block cut
    assert third.prompt_ids[:48] == block(7) + block(8) + block(10)
    shares = PrefixBlocks()
    for spec in (first, second, third):
        shares.add(spec.prompt_units)
    assert shares.hits == 16 + 32  # block 7 again, then blocks 7 and 8 again
    looped = Workload(settings(trace=mooncake(tmp_path), trace_loop=True))
    assert looped.request(3).prompt_ids[:512] == looped.request(0).prompt_ids[:512]


# --- end to end, against this project's server ------------------------------------------------

@pytest.mark.slow
def test_each_format_replays_against_a_real_server_at_its_times_with_its_lengths(tmp_path):
    traces = {fmt: make(tmp_path) for fmt, make in (("mooncake", mooncake),
                                                     ("burstgpt", burstgpt), ("azure", azure))}
    # ours, with a request longer than the server's context: refused by it, counted, and the
    # run goes on to the next
    traces["jsonl"] = write(tmp_path / "ours.jsonl", [
        *(json.loads(line) for line in open(ours(tmp_path))),
        {"t_s": 0.6, "prompt_tokens": 100_000, "max_tokens": 2},
        {"t_s": 0.8, "prompt_tokens": 8, "max_tokens": 2}])
    with server_process(tmp_path) as (_, port):
        for fmt, path in traces.items():
            run_dir = tmp_path / fmt
            done = locust(port, run_dir, "--trace", path, "--trace-block-tokens", "16",
                          timeout_s=60)  # no -t: the run ends with the trace
            assert "the trace is replayed: ending the run" in done.stdout, done.stdout
            trace = read_trace_file(path).requests
            rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text()
                    .splitlines()]
            assert len(rows) == len(trace), fmt
            for row, request in zip(sorted(rows, key=lambda r: r["scheduled_ms"]), trace,
                                    strict=True):
                if request.prompt_tokens > 1000:
                    assert row["status"] == "INVALID_ARGUMENT", row
                    continue
                assert row["status"] == "OK", row
                assert row["scheduled_ms"] == pytest.approx(request.t_s * 1e3, abs=0.01)
                assert row["sent_ms"] - row["scheduled_ms"] < 50
                assert row["output_tokens"] == request.max_tokens
                if not request.prompt:  # token ids, exact; a text prompt is the server's count
                    assert row["server_prompt_tokens"] == request.prompt_tokens
    summary = json.loads((tmp_path / "jsonl" / "summary.json").read_text())["requests"]
    assert (summary["sent"], summary["ok"], summary["failed"]) == (4, 3, 1)
    assert list(summary["failed_by_code"]) == ["INVALID_ARGUMENT"]
