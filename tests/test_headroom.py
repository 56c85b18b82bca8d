"""The run says before it starts whether one generator process can time it: the streamed
messages/s asked of each process against what one process of its client held, and past that
how many processes to use."""

import pytest

from loadgen.headroom import HELD, asked_per_process, headroom
from records.declare import build
from records.load_settings import LoadSettings


def settings(**flat) -> LoadSettings:
    return build(LoadSettings, flat)


def test_the_messages_asked_are_rate_times_tokens_per_process():
    assert asked_per_process(settings(rate=10, max_tokens=32)) == 320
    assert asked_per_process(settings(rate=10, max_tokens=32), workers=4) == 80
    assert asked_per_process(settings(mode="sessions", rate=1, session_turns="2-6",
                                      max_tokens=10)) == 60
    assert asked_per_process(settings(mode="closed")) is None


def test_within_what_one_process_held_the_run_says_it_holds():
    holds, line = headroom(settings(rate=10, max_tokens=32))
    assert holds and "320 streamed messages/s" in line
    assert f"one aio process held {HELD['aio', 'gRPC']:,} over gRPC" in line
    holds, line = headroom(settings(mode="sessions", rate=1, max_tokens=32))  # auto: gevent's
    assert holds and f"one gevent process held {HELD['gevent', 'gRPC']:,}" in line
    holds, line = headroom(settings(target="openai", rate=300, max_tokens=20))  # 6,000
    assert holds and f"held {HELD['aio', 'HTTP']:,} over HTTP" in line


@pytest.mark.parametrize("flat, advice", [
    ({"rate": 250, "max_tokens": 20, "client": "gevent"},  # 5,000
     "use --processes 3 -u 3 or --client aio"),
    ({"rate": 400, "max_tokens": 20}, "use --processes 2 -u 2, or lower"),  # auto: aio
    ({"rate": 1000, "max_tokens": 20, "client": "gevent"}, "use --processes 10 -u 10, or lower"),
    ({"mode": "sessions", "rate": 100, "session_turns": "1", "max_tokens": 30},  # gevent's
     "use --processes 2 -u 2, or lower"),
    ({"target": "openai", "rate": 300, "max_tokens": 20, "client": "gevent"},  # 6,000
     "use --processes 2 -u 2 or --client aio"),
    ({"target": "openai", "rate": 1500, "max_tokens": 20}, "use --processes 2 -u 2, or lower"),
])
def test_past_it_the_run_says_how_many_processes(flat, advice):
    holds, line = headroom(settings(**flat))
    assert not holds and advice in line and "lag behind" in line
