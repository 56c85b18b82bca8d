"""Server-sent events (the WHATWG event-stream format), whoever reads the socket: fed the
stream's bytes as they come (`feed`) or one line at a time (`line`), it hands back each event's
data when the blank line that ends the event arrives. Only `data` matters here; comments,
`event`, `id` and `retry` are skipped.
"""

from __future__ import annotations


class EventStream:
    def __init__(self):
        self._data: list[str] = []
        self._tail = b""  # the start of a line fed and not yet ended

    def feed(self, raw: bytes) -> list[str]:
        """Bytes of the stream, as they came: the data of each event they end."""
        if (not self._tail and not self._data and raw.startswith(b"data: ")
                and raw.find(b"\n") == len(raw) - 2 and raw.endswith(b"\n\n")):
            # one whole event of one data line, as servers send them: read at once
            return [raw[6:-2].rstrip(b"\r").decode("utf-8", errors="replace")]
        *lines, self._tail = (self._tail + raw).split(b"\n")
        return [data for line in lines if (data := self.line(line)) is not None]

    def line(self, raw: bytes) -> str | None:
        """One line (its end of line included or not); the event's data when it ends one."""
        line = raw.rstrip(b"\r\n")
        if not line:
            return self._event()
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append(value.removeprefix(b" ").decode("utf-8", errors="replace"))
        return None

    def end(self) -> str | None:
        """At the stream's end: the data of an event still open (a server that did not close
        its last event with a blank line, or its last line with an end), or None."""
        tail, self._tail = self._tail, b""
        if tail and (data := self.line(tail)) is not None:
            return data
        return self._event()

    def _event(self) -> str | None:
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data
