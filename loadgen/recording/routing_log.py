"""routed_experts.jsonl as the run goes (records/expert_routes.py): a line per finished request,
with the routing its reply carried or why there was none, and the count of each for the run's
warnings. A distributed run's worker writes its own, in its directory."""

from __future__ import annotations

import json
from pathlib import Path

from loadgen.targets.client import StreamResult
from records.expert_routes import RoutedRow
from records.jsonform import to_json
from records.rundir import ROUTED


class RoutingLog:
    def __init__(self, run_dir: Path, asked: bool, sample: float):
        """asked: the requests asked for routing (--routed-experts on, or auto and the server
        is one that answers); sample: the share sent non-streamed (--routed-experts-sample)."""
        self.file = open(run_dir / ROUTED, "w")
        self.asked, self.sample = asked, sample
        self.read = self.lacking = 0

    def add(self, r: StreamResult, start_ns: int, warmup: bool) -> None:
        """The request's line; none for a streamed one without routing in a run that reads it
        from the replies not streamed (vLLM streams none)."""
        if self.sample and r.streamed and not r.routing.get("source"):
            return
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
        if not self.sample and not self.read:
            return (f"routed experts: none of {self.lacking} streamed replies carried them: "
                    "vLLM and this project's server put them only in a reply not streamed, "
                    "so --routed-experts-sample 0 reads nothing from them (0.1 sends a tenth "
                    "of the requests non-streamed); SGLang streams them",)
        return (f"routed experts: {self.lacking} of {self.read + self.lacking} requests came "
                "without readable routing (routed_experts.jsonl says why each): is the server "
                "started with --enable-return-routed-experts?",)
