"""routed_experts.jsonl as the run goes (records/routing.py): a line per finished request, with
the routing its reply carried or why there was none, and the count of each for the run's
warnings. A distributed run's worker writes its own, in its directory."""

from __future__ import annotations

import json
from pathlib import Path

from loadgen.targets.client import StreamResult
from records.jsonform import to_json
from records.routing import RoutedRow
from records.rundir import ROUTED


class RoutingLog:
    def __init__(self, run_dir: Path, asked: bool):
        """asked: the requests asked for routing (--routed-experts on, or auto and the server
        is one that answers)."""
        self.file = open(run_dir / ROUTED, "w")
        self.asked = asked
        self.read = self.lacking = 0

    def add(self, r: StreamResult, start_ns: int, warmup: bool) -> None:
        finish_ns = r.recv_ns[-1] if r.recv_ns else 0
        row = RoutedRow(request_id=r.request_id, warmup=warmup,
                        sent_ms=(r.sent_ns - start_ns) / 1e6 if r.sent_ns else None,
                        finish_ms=(finish_ns - start_ns) / 1e6 if finish_ns else None,
                        **r.routing)
        self.read += row.read
        self.lacking += not row.read
        self.file.write(json.dumps(to_json(row), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self.file.close()

    @property
    def warnings(self) -> tuple[str, ...]:
        if not self.asked or not self.lacking:
            return ()
        return (f"routed experts: {self.lacking} of {self.read + self.lacking} requests came "
                "without readable routing (routed_experts.jsonl says why each): is the server "
                "started with --enable-return-routed-experts?",)
