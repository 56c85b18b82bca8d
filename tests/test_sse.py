"""Server-sent events read from their bytes, however the reads split them."""

import pytest

from loadgen.targets.sse import EventStream

STREAM = (b"data: {\"a\": 1}\n\n: a comment\n\nevent: x\r\ndata: two\r\ndata: lines\r\n\r\n"
          b"data:no space\n\ndata: \n\ndata: [DONE]\n\n")
EVENTS = ['{"a": 1}', "two\nlines", "no space", "", "[DONE]"]


@pytest.mark.parametrize("size", [1, 2, 5, 13, len(STREAM)])
def test_events_read_the_same_however_the_bytes_are_split(size):
    events = EventStream()
    got = [data for at in range(0, len(STREAM), size) for data in events.feed(STREAM[at:at + size])]
    assert got == EVENTS and events.end() is None


def test_a_whole_event_a_read_matches_the_line_by_line_reading():
    for event in (b"data: x\n\n", b"data: x\r\n\n", b"data:  x\n\n", b"data: \xff\n\n"):
        fed, lines = EventStream(), EventStream()
        by_lines = [d for line in event.splitlines(keepends=True)
                    if (d := lines.line(line)) is not None]
        assert fed.feed(event) == by_lines


def test_an_event_the_stream_left_open_is_read_at_its_end():
    events = EventStream()
    assert events.feed(b"data: last") == []
    assert events.end() == "last" and events.end() is None
