"""Requests grouped by a key (their request class, their turn in a session): each group's
status counts and the TTFT, TPOT and end-to-end latency of its measured ok requests, merged
exactly across worker processes."""

from __future__ import annotations

from collections import Counter

from loadgen.recording.histograms import Histogram
from loadgen.recording.timing import StreamTiming
from records.summary import ClassFigures, Stats

METRICS = ("ttft", "tpot", "e2e")


class Groups:
    def __init__(self):
        self.hists: dict[str, dict[str, Histogram]] = {}
        self.statuses: dict[str, Counter] = {}

    def count(self, key: str, status: str) -> None:
        self.statuses.setdefault(key, Counter())[status] += 1

    def record(self, key: str, timing: StreamTiming) -> None:
        """A measured ok request of the group."""
        hists = self._hists(key)
        for name in METRICS:
            if getattr(timing, f"{name}_us") is not None:
                hists[name].record(getattr(timing, f"{name}_us"))

    def _hists(self, key: str) -> dict[str, Histogram]:
        """The group's histograms, made once: not a new set per request to throw away
        (loadgen/recording/histograms.py, Histogram.clear, says what one costs)."""
        if key not in self.hists:
            self.hists[key] = {m: Histogram() for m in METRICS}
        return self.hists[key]

    def figures(self, order=str) -> dict[str, ClassFigures]:
        """Each group on its own, keys sorted by `order` of the key."""
        def stats(key: str, metric: str) -> Stats:
            return self.hists[key][metric].stats() if key in self.hists else Stats(count=0)

        return {k: ClassFigures(sent=sum(counts.values()), ok=counts["OK"],
                                ttft_ms=stats(k, "ttft"), tpot_ms=stats(k, "tpot"),
                                e2e_ms=stats(k, "e2e"))
                for k, counts in sorted(self.statuses.items(), key=lambda kv: order(kv[0]))}

    def export(self) -> dict:
        return {"hists": {k: {m: [h.encode(), h.clamped] for m, h in hists.items()}
                          for k, hists in self.hists.items()},
                "statuses": {k: dict(v) for k, v in self.statuses.items()}}

    def absorb(self, part: dict) -> None:
        for key, hists in part["hists"].items():
            mine = self._hists(key)
            for name, (encoded, clamped) in hists.items():
                mine[name].merge(encoded, clamped)
        for key, counts in part["statuses"].items():
            self.statuses.setdefault(key, Counter()).update(counts)
