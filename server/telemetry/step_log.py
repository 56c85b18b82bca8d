"""The optional per-step log (--step-log): one JSON line per engine step."""

from __future__ import annotations

import json
import time

from server.engine.interface import StepResult


class StepLog:
    """One JSON line per engine step (--step-log): wall and monotonic timestamps, so steps
    line up with a load generator's records on the same host."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)

    def write(self, step: int, result: StepResult, batch: int, admitted: int) -> None:
        record = {"t_unix_s": time.time(), "t_monotonic_s": time.monotonic(), "step": step,
                  "batch": batch, "admitted": admitted, "tokens": result.tokens,
                  "stage_ms": result.stage_ms and {k: round(v, 4)
                                                   for k, v in result.stage_ms.items()},
                  "gpu_busy_ms": round(result.gpu_busy_ms, 4),
                  "gpu_timed_ms": round(result.gpu_timed_ms, 4),
                  "active_experts": result.active, "expert_tokens": result.routed.tolist()}
        if result.dropped is not None:
            record["dropped"] = int(result.dropped.sum())
        if result.comm:  # experts over ranks: each layer's exchange, and who routed where
            record["routed_by_rank"] = result.routed_by_rank.tolist()
            record["exchanges"] = [{"dispatch_bytes": x.dispatch_bytes,
                                    "combine_bytes": x.combine_bytes, "computed": x.computed,
                                    "measured_ms": x.measured_ms, "exposed_ms": x.exposed_ms,
                                    "modelled_ms": x.modelled_ms} for x in result.comm]
        self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.file.close()
