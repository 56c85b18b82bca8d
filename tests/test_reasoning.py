"""Reasoning tokens on the openai target: a thinking model's reasoning deltas counted apart from
its answer, the times to the first token of each kind in the rows, the summary and the report,
TTFT still the first token of either kind, and a warning when reasoning spent every token
asked; end to end, the split is exact against the reference server's --reasoning-tokens."""

import json

import pytest

from loadgen.recording.recorder import Recorder
from loadgen.targets.client import StreamResult
from loadgen.targets.openai import OpenAITarget
from records.declare import build
from records.load_settings import LoadSettings
from tests.cli import analysis
from tests.conftest import delay_server_process
from tests.test_end_to_end import locust


def chat() -> OpenAITarget:
    return OpenAITarget(build(LoadSettings, {"endpoint": "/v1/chat/completions"}).target)


def event(delta: dict, **choice) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": delta, **choice}]})


def test_reasoning_deltas_are_told_apart_from_the_answer():
    target = chat()
    assert target.chunk_of(event({"reasoning_content": "let me think"})).reasoning
    assert target.chunk_of(event({"reasoning": "hmm"})).reasoning  # newer vLLM's name
    answer = target.chunk_of(event({"content": "42"}))
    assert not answer.reasoning and answer.text == "42"
    both = target.chunk_of(event({"content": "so", "reasoning_content": "."}))
    assert not both.reasoning  # the answer has begun
    held = target.chunk_of(event({"reasoning_content": ""}, token_ids=[195]))
    assert held.reasoning and held.tokens == 1  # a character held back: its token still came
    assert not target.chunk_of(event({"content": "x", "reasoning_content": None})).reasoning
    completions = OpenAITarget(build(LoadSettings, {}).target)
    assert not completions.chunk_of(json.dumps({"choices": [{"text": "x"}]})).reasoning


def result(kinds: list[bool], max_tokens: int = 4) -> StreamResult:
    r = StreamResult("r", scheduled_ns=0, max_tokens=max_tokens, sent_ns=1_000_000,
                     finish_reason="length")
    for i, thinking in enumerate(kinds):
        r.recv_ns.append((10 + 5 * i) * 1_000_000)
        r.tokens.append(1)
        r.server_elapsed_us.append(0)
        r.reasoning.append(thinking)
    return r


def test_the_row_and_the_summary_hold_the_split_and_the_times_of_each_kind():
    recorder = Recorder(start_ns=0, warmup_s=0.0)
    recorder.add(result([True, True, False, False]))
    recorder.add(result([True, True, True, True]))  # every token asked spent on reasoning
    first, second = recorder.rows
    assert (first.reasoning_tokens, first.answer_tokens) == (2, 2)
    assert (first.ttft_ms, first.ttfr_ms, first.ttfa_ms) == (10, 10, 20)
    assert second.ttfa_ms is None and second.answer_tokens == 0
    summary = recorder.reasoning()
    assert (summary.requests, summary.reasoning_tokens, summary.answer_tokens) == (2, 6, 2)
    assert summary.no_answer == 1 and summary.ttfa_ms.count == 1
    assert summary.ttfr_ms.p50 == pytest.approx(10, rel=1e-3)
    quiet = Recorder(start_ns=0, warmup_s=0.0)
    quiet.add(result([False, False]))
    assert quiet.reasoning() is None and quiet.rows[0].reasoning_tokens is None


@pytest.mark.slow
def test_the_split_is_exact_against_the_reference_and_a_spent_budget_warns(tmp_path):
    # one run of a trace of our own: requests asking 7 tokens, and some asking only 2
    trace = tmp_path / "asks.jsonl"
    trace.write_text("".join(json.dumps({"t_s": 0.15 * i, "prompt_tokens": 8,
                                         "max_tokens": 2 if i % 4 == 3 else 7}) + "\n"
                             for i in range(12)))
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "openai", "--reasoning-tokens", "2",
                              "--tokens-per-chunk", "2") as (_, port):
        done = locust(f"http://127.0.0.1:{port}", run_dir, "--target", "openai",
                      "--endpoint", "/v1/chat/completions", "--token-ids", "--trace",
                      str(trace))
    assert done.returncode == 0, done.stdout
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    answered = [r for r in rows if r["output_tokens"] == 7]
    # messages of 1, 2, 2, 2 tokens: the second crosses from reasoning to the answer, sent as
    # two events and counted exactly
    assert len(answered) == 9 and all((r["reasoning_tokens"], r["answer_tokens"]) == (2, 5)
                                      for r in answered)
    assert all(r["ttft_ms"] == pytest.approx(r["ttfr_ms"], abs=0.01) for r in rows)
    assert all(r["ttfa_ms"] > r["ttfr_ms"] for r in answered)
    spent = [r for r in rows if r["output_tokens"] == 2]
    assert len(spent) == 3 and all(r.get("ttfa_ms") is None for r in spent)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["reasoning"]["requests"], summary["reasoning"]["no_answer"]) == (12, 3)
    assert any("3 of 12 requests that reasoned spent every token asked" in w
               for w in summary["generator"]["warnings"])
    analysis("report", run_dir)
    assert "## Reasoning" in (run_dir / "report.md").read_text()
