"""The one counting rule for every target (docs/metrics.md, "Counting tokens"): TTFT to the first
message with a token, an ITL value per gap and a per-token view spreading each gap over its
tokens; text messages counted by a tokenizer, by the server's total spread over them, or by
an estimate; a message left with no token merges into the next; a stream that ends badly is
not ok;
a server that ends a request short of the length asked is counted and warned about."""

import pytest

from loadgen.recording.cpu import GeneratorCpu
from loadgen.recording.health import generator_health
from loadgen.recording.recorder import Recorder
from loadgen.recording.timing import stream_timing
from loadgen.targets.client import StreamResult
from loadgen.targets.target import Chunk
from loadgen.targets.text_tokens import TextCounter
from tests.tokenizer_files import write_word_tokenizer

MS = 1_000_000  # ns


def test_a_gap_is_spread_over_the_tokens_that_ended_it():
    # messages at 50, 60, 90 ms carrying 2, 1 and 3 tokens
    t = stream_timing(0, 0, [50 * MS, 60 * MS, 90 * MS], [2, 1, 3])
    assert t.ttft_us == 50_000
    assert t.itl_us == [10_000, 30_000]
    assert t.itl_token_us == [10_000, 10_000, 10_000, 10_000]
    assert t.tpot_us == (90_000 - 50_000) / (6 - 1)


def test_a_tokenizer_counts_each_token_where_its_last_character_arrived(tmp_path):
    count = TextCounter(str(write_word_tokenizer(tmp_path / "tokenizer.json",
                                                 ["hello", "world", "again"])))
    assert count(["hel", "lo wor", "ld", " again"], {}) == [0, 1, 1, 1]
    assert "--tokenizer" in count.how


def test_without_a_tokenizer_the_servers_total_is_spread_by_characters():
    count = TextCounter()
    # 10 tokens over three messages with text: one each, the other 7 by characters (2:4:8)
    assert count(["ab", "", "abcd", "abcdefgh"], {"completion_tokens": 10}) == [2, 0, 3, 5]
    assert sum(count(["x"] * 7 + ["y" * 30], {"completion_tokens": 40})) == 40


def test_with_neither_four_characters_make_a_token_and_a_message_at_least_one():
    assert TextCounter()(["A", "four", "a longer message"], {}) == [1, 1, 4]
    assert "estimated" in TextCounter().how


ESTIMATE = TextCounter()


def result_of(chunks: list[Chunk], count: TextCounter = ESTIMATE) -> StreamResult:
    r = StreamResult("r", 0, sent_ns=0)
    for i, chunk in enumerate(chunks):
        r.received(chunk, (i + 1) * 10 * MS)
    r.close(count)
    return r


def test_messages_without_tokens_do_not_count_and_a_tokenless_text_merges_forward(tmp_path):
    role = Chunk()  # a role event: no token, no text
    r = result_of([role, Chunk(tokens=2), Chunk(tokens=1, finish_reason="length",
                                                usage={"completion_tokens": 3})])
    assert r.ok and r.recv_ns == [20 * MS, 30 * MS] and r.tokens == [2, 1]
    count = TextCounter(str(write_word_tokenizer(tmp_path / "tokenizer.json", ["hello"])))
    r = result_of([Chunk(text="hel"), Chunk(text="lo"), Chunk(finish_reason="stop")], count)
    assert r.ok and r.recv_ns == [20 * MS] and r.tokens == [1] and not r.texts


@pytest.mark.parametrize(("chunks", "status"), [
    ([Chunk(tokens=1), Chunk(tokens=1)], "INCOMPLETE"),
    ([Chunk(finish_reason="stop")], "NO_OUTPUT"),
    ([Chunk(tokens=1), Chunk(finish_reason="ABORT")], "ABORTED"),  # a server's shutdown
])
def test_a_stream_that_ends_badly_is_not_ok(chunks, status):
    assert result_of(chunks).status == status


def test_an_output_length_other_than_asked_is_counted_and_warned_about():
    rec = Recorder(start_ns=0, warmup_s=0)
    for i, done in enumerate([8, 8, 5]):  # the server ended the third at end-of-sequence
        rec.add(StreamResult(f"r{i}", 0, max_tokens=8, sent_ns=0, recv_ns=[MS], tokens=[done],
                             finish_reason="stop", usage={"completion_tokens": done}))
    rec.add(StreamResult("no-usage", 0, max_tokens=8, sent_ns=0, recv_ns=[MS], tokens=[3]))
    assert rec.off_length == 1
    warnings = generator_health(rec, GeneratorCpu(1.0)).warnings
    assert any(w.startswith("1 of 4 ok requests got another output length") for w in warnings)
