"""Multi-turn sessions (--mode sessions): the draws of turns and think times, each session's
plan from its seed, the history each turn re-sends (token ids while every part is ids, else
text; chat endpoints as alternating messages), the session's id on the wire, the figures by
turn and by session; end to end against the reference servers, each turn's prompt exactly the
last one's plus its reply plus the new message, and a session ending at its failed turn."""

import json
from collections import defaultdict

import pytest

from loadgen.recording.recorder import Recorder
from loadgen.settings import check
from loadgen.targets.client import StreamResult
from loadgen.targets.moe import MoeTarget
from loadgen.targets.openai import OpenAITarget
from loadgen.traffic.draws import Draw
from loadgen.traffic.sessions import History, Part, SessionPlanner
from loadgen.traffic.workload import Workload
from records.declare import SettingsError, build
from records.load_settings import LoadSettings
from tests.cli import analysis
from tests.conftest import delay_server_process
from tests.test_end_to_end import locust


def settings(**flat) -> LoadSettings:
    return build(LoadSettings, {"mode": "sessions", **flat})


@pytest.mark.parametrize("spec, whole, values", [
    ("3", True, {3}), ("2-4", True, {2, 3, 4}), ("0.5", False, {0.5}),
])
def test_draws_give_what_they_say(spec, whole, values):
    import random
    rng = random.Random(1)
    draw = Draw.parse(spec, whole)
    seen = {draw(rng) for _ in range(200)}
    assert seen == values


def test_exponential_and_uniform_times_keep_their_mean_and_bounds():
    import random
    rng = random.Random(2)
    exp = [Draw.parse("exp:2")(rng) for _ in range(4000)]
    assert sum(exp) / len(exp) == pytest.approx(2, rel=0.1)
    uniform = [Draw.parse("1-3")(rng) for _ in range(1000)]
    assert 1 <= min(uniform) and max(uniform) <= 3


@pytest.mark.parametrize("flag, value, message", [
    ("session_turns", "0", "--session-turns: '0': values at least 1"),
    ("session_turns", "2.5", "--session-turns: '2.5': a count is a whole number"),
    ("session_turns", "exp:3", "--session-turns: 'exp:3' is not N or MIN-MAX"),
    ("session_turns", "5-2", "MIN up to MAX"),
    ("think_time_s", "soon", "--think-time-s: 'soon' is not N or MIN-MAX or exp:MEAN"),
    ("think_time_s", "exp:0", "the mean must be above 0"),
])
def test_bad_draws_are_refused_naming_the_flag(flag, value, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        check(settings(**{flag: value}))


def test_a_dataset_session_over_an_ids_only_protocol_asks_for_a_tokenizer(tmp_path):
    data = tmp_path / "chats.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"},
                                                   {"from": "gpt", "value": "hello"}]}]))
    with pytest.raises(SettingsError, match="--tokenizer: the vllm-grpc target streams"):
        check(settings(target="vllm-grpc", dataset=str(data)))
    check(settings(target="moe", dataset=str(data)))  # its replies carry their text


def test_a_plan_repeats_from_its_seed_and_draws_turns_and_think_times():
    s = settings(session_turns="2-5", think_time_s="0.5-1.5", prompt_tokens=8, max_tokens=4,
                 shared_prefix_tokens=6)
    planner = SessionPlanner(s, Workload(s))
    plans = [planner.plan(i) for i in range(30)]
    assert plans[7] == SessionPlanner(s, Workload(s)).plan(7)
    assert {len(p.messages) for p in plans} == {2, 3, 4, 5}
    for p in plans:
        assert len(p.think_s) == len(p.messages) - 1
        assert all(0.5 <= t <= 1.5 for t in p.think_s)
        assert len(p.messages[0].ids) == 6 + 8  # the shared prefix opens the session only
        assert all(len(m.ids) == 8 for m in p.messages[1:])
        assert p.messages[0].text == bytes(p.messages[0].ids).decode()
    assert len({p.messages[0].ids for p in plans}) == 30


def test_a_dataset_session_is_one_conversation_up_to_the_turns_drawn(tmp_path):
    turns = [{"from": "human", "value": "one"}, {"from": "gpt", "value": "uno!"},
             {"from": "human", "value": "two"}, {"from": "gpt", "value": "dos"},
             {"from": "human", "value": "three"}, {"from": "gpt", "value": "tres"}]
    data = tmp_path / "chats.json"
    data.write_text(json.dumps([{"conversations": turns}]))
    s = settings(dataset=str(data), session_turns="2", max_tokens=3)
    plan = SessionPlanner(s, Workload(s)).plan(0)
    assert [m.text for m in plan.messages] == ["one", "two"]
    assert plan.max_tokens == (3, 3)  # the replies' bytes, capped by --max-tokens
    assert plan.messages[0].ids is None


def history_of(**flat) -> tuple[History, SessionPlanner]:
    s = settings(prompt_tokens=4, max_tokens=3, session_turns="3", **flat)
    planner = SessionPlanner(s, Workload(s))
    return History(planner.plan(0), planner.workload), planner


def test_the_history_goes_as_ids_while_every_part_is_ids():
    history, planner = history_of()
    plan = history.plan
    first = history.ask(1)
    assert first.prompt_ids == plan.messages[0].ids and first.turn == 1
    assert first.session == plan.session_id and first.request_id == f"{plan.session_id}-t1"
    history.answered(first, Part((500, 501, 502), "xyz"))
    second = history.ask(2)
    assert second.prompt_ids == plan.messages[0].ids + (500, 501, 502) + plan.messages[1].ids
    assert second.dialogue == (plan.messages[0].text, "xyz", plan.messages[1].text)


def test_a_reply_streamed_as_text_turns_the_history_into_text():
    history, _ = history_of()
    plan = history.plan
    first = history.ask(1)
    history.answered(first, Part(None, " a reply "))
    second = history.ask(2)
    assert not second.prompt_ids
    assert second.prompt_text == plan.messages[0].text + " a reply " + plan.messages[1].text
    body = json.loads(chat_target().body(second))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == " a reply "


def chat_target() -> OpenAITarget:
    return OpenAITarget(build(LoadSettings, {"endpoint": "/v1/chat/completions"}).target)


def test_the_session_goes_on_the_wire_for_affinity():
    history, _ = history_of()
    spec = history.ask(1)
    assert chat_target().headers_of(spec)["X-Session-ID"] == spec.session
    moe = MoeTarget(build(LoadSettings, {"auth_token": "t"}).target)
    assert ("session_id", spec.session) in moe.metadata_of(spec)
    assert ("authorization", "Bearer t") in moe.metadata_of(spec)
    plain = Workload(settings()).request(0)
    assert "X-Session-ID" not in chat_target().headers_of(plain)
    assert all(key != "session_id" for key, _ in moe.metadata_of(plain))


def turn_result(turn: int, ttft_ms: int, status: str = "OK") -> StreamResult:
    r = StreamResult(f"s-t{turn}", scheduled_ns=0, max_tokens=2, sent_ns=1, session="s",
                     turn=turn, finish_reason="length", status=status)
    if status == "OK":
        r.recv_ns += [ttft_ms * 1_000_000, (ttft_ms + 10) * 1_000_000]
        r.tokens += [1, 1]
        r.server_elapsed_us += [0, 0]
        r.reasoning += [False, False]
    return r


def test_turns_and_sessions_are_figured_and_merge_across_workers():
    parts = []
    for ttft in (10, 30):
        rec = Recorder(start_ns=0, warmup_s=0.0)
        rec.add(turn_result(1, ttft))
        rec.add(turn_result(2, 2 * ttft))
        rec.add(turn_result(3, 0, status="INTERNAL"))
        rec.end_session("failed", 3, 2, None)
        rec.end_session("completed", 2, 2, 1_500_000)
        parts.append(rec)
    merged = Recorder(start_ns=0, warmup_s=0.0)
    for rec in parts:
        merged.absorb(rec.export())
    figures = merged.sessions()
    assert (figures.started, figures.completed, figures.failed, figures.stopped) == (4, 2, 2, 0)
    assert figures.turns_asked == 2.5 and figures.turns_ok == 2
    assert figures.duration_ms.count == 2 and figures.duration_ms.p50 == pytest.approx(1500, 0.01)
    assert list(figures.by_turn) == ["1", "2", "3"]
    assert figures.by_turn["2"].ttft_ms.p50 == pytest.approx(20, rel=0.01)
    assert (figures.by_turn["3"].sent, figures.by_turn["3"].ok) == (2, 0)
    assert merged.rows[0].session == "s" and merged.rows[1].turn == 2
    assert Recorder(start_ns=0, warmup_s=0.0).sessions() is None


def rows_by_session(run_dir) -> dict[str, list[dict]]:
    sessions = defaultdict(list)
    for line in (run_dir / "requests.jsonl").read_text().splitlines():
        row = json.loads(line)
        sessions[row["session"]].append(row)
    return {s: sorted(rows, key=lambda r: r["turn"]) for s, rows in sessions.items()}


@pytest.mark.slow
def test_each_turn_resends_the_history_with_the_replies_over_grpc(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "moe", "--ttft-ms", "20",
                              "--itl-ms", "2") as (_, port):
        done = locust(port, run_dir, "-t", "3s", "--mode", "sessions", "--rate", "3",
                      "--session-turns", "3", "--think-time-s", "0.05-0.15",
                      "--prompt-tokens", "16", "--max-tokens", "8")
    assert done.returncode == 0, done.stdout
    sessions = rows_by_session(run_dir)
    assert len(sessions) >= 4
    for rows in sessions.values():
        assert [r["turn"] for r in rows] == list(range(1, len(rows) + 1))
        for before, after in zip(rows, rows[1:], strict=False):
            # exactly: the last prompt, its reply, then the new 16-token message
            assert after["server_prompt_tokens"] == (before["server_prompt_tokens"]
                                                     + before["output_tokens"] + 16)
            # the next turn is due its think time after the reply's end
            gap = after["scheduled_ms"] - before["scheduled_ms"] - before["e2e_ms"]
            assert 50 <= gap <= 150 + 1
    summary = json.loads((run_dir / "summary.json").read_text())
    figures, requests = summary["sessions"], summary["requests"]
    assert figures["started"] == len(sessions)
    assert figures["completed"] + figures["stopped"] == figures["started"]
    assert figures["completed"] == sum(len(rows) == 3 for rows in sessions.values())
    assert requests["sent"] == requests["ok"] == sum(len(r) for r in sessions.values())
    assert figures["by_turn"]["1"]["sent"] == len(sessions)
    report = analysis("report", str(run_dir))
    assert f"{figures['started']} sessions started" in report.stdout
    assert "TTFT p50 from turn 1 to turn 3" in report.stdout


@pytest.mark.slow
def test_a_session_ends_at_its_failed_turn_and_chat_carries_the_text_replies(tmp_path):
    run_dir = tmp_path / "run"
    with delay_server_process(tmp_path, "--protocol", "openai", "--ttft-ms", "10",
                              "--itl-ms", "2", "--faults", "none,none,http-500") as (_, port):
        done = locust(f"http://127.0.0.1:{port}", run_dir, "--target", "openai",
                      "--endpoint", "/v1/chat/completions", "-t", "3s", "--mode", "sessions",
                      "--rate", "4", "--session-turns", "4", "--think-time-s", "0.05",
                      "--max-tokens", "6")
    assert done.returncode == 1, done.stdout  # Locust's exit code when requests failed
    sessions = rows_by_session(run_dir)
    failed = 0
    for rows in sessions.values():
        statuses = [r["status"] for r in rows]
        if "OK" not in statuses[-1:]:
            failed += 1
        assert all(s == "OK" for s in statuses[:-1])  # nothing is sent after a failed turn
        answered = [r for r in rows if r["status"] == "OK"]
        for before, after in zip(answered, answered[1:], strict=False):
            assert after["server_prompt_tokens"] > (before["server_prompt_tokens"]
                                                    + before["output_tokens"])
    figures = json.loads((run_dir / "summary.json").read_text())["sessions"]
    assert failed >= 1 and figures["failed"] == failed
    assert any(len(rows) >= 3 for rows in sessions.values())  # two replies carried
    assert figures["started"] == len(sessions) == sum(
        figures[k] for k in ("completed", "failed", "cancelled", "stopped"))


def test_a_trace_requests_session_goes_with_it(tmp_path):
    trace = tmp_path / "mine.jsonl"
    trace.write_text('{"t_s": 0, "prompt_tokens": 4, "max_tokens": 2, "session": "u17"}\n'
                     '{"t_s": 1, "prompt_tokens": 4, "max_tokens": 2}\n')
    s = build(LoadSettings, {"trace": str(trace)})
    first, second = Workload(s).request(0), Workload(s).request(1)
    assert chat_target().headers_of(first)["X-Session-ID"] == "u17"
    assert second.session == "" and first.turn == 0  # not a turn: nothing kept of its reply
