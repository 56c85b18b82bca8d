"""Server-sent events (the WHATWG event-stream format) read line by line, whoever reads the
socket: fed one line at a time, it hands back each event's data when the blank line that ends
the event arrives. Only `data` matters here; comments, `event`, `id` and `retry` are skipped.
"""

from __future__ import annotations


class EventStream:
    def __init__(self):
        self._data: list[str] = []

    def line(self, raw: bytes) -> str | None:
        """One line (its end of line included or not); the event's data when it ends one."""
        line = raw.rstrip(b"\r\n")
        if not line:
            return self.end()
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append(value.removeprefix(b" ").decode("utf-8", errors="replace"))
        return None

    def end(self) -> str | None:
        """The data of an event still open (at the end of the body, a server that did not close
        its last event with a blank line), or None."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data
