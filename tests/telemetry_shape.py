"""What a GetStats reply and a /metrics scrape hold after a fixed, sequential workload, with the
values that depend on the machine's timing masked: every field, family, label and
deterministic count, compared field by field by tests/test_telemetry_shape.py against the
fixtures in tests/fixtures/telemetry/, which were written by the server before its telemetry
was declared in records/engine_telemetry.py.

`python -m tests.telemetry_shape DIR` writes the fixtures anew into DIR.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from prometheus_client.parser import text_string_to_metric_families

from proto import moe_pb2
from tests.conftest import running_server

TIMED = "<timed>"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "telemetry"
# Two servers: one with capacity, the expert cache and skew switched on; one over two ranks.
SCENARIOS = {
    "one_rank": {"capacity_factor": 0.5, "expert_cache": 2, "cache_policy": "lru",
                 "routing_skew": "zipf:1.0", "heap_trim_s": 0.0},
    "two_ranks": {"ep": 2, "heap_trim_s": 0.0},
}
# GetStats fields whose values are times, or read off the process: their presence is compared
TIMED_FIELDS = {"uptime_s", "window_s", "step_time_mean_ms", "expert_compute_ms",
                "expert_bandwidth_gb_s", "process_cpu_percent", "process_rss_bytes",
                "heap_trim_ms", "copy_ms", "wait_ms", "dispatch_ms", "combine_ms",
                "dispatch_exposed_ms", "combine_exposed_ms", "dispatch_modelled_ms",
                "combine_modelled_ms"}
TIMED_HISTOGRAMS = {"step_ms", "ms"}  # ms histograms: bounds and count compared
# a stream's last write is counted after its client may have read it: only the bounds compared
RACED = {"write_ms", "moe_write_seconds"}


def masked(value, key: str = ""):
    if isinstance(value, dict):
        if key in TIMED_HISTOGRAMS | RACED:
            kept = ("bounds",) if key in RACED else ("bounds", "count")
            return {k: (v if k in kept else TIMED) for k, v in value.items()}
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, key) for v in value]
    return TIMED if key in TIMED_FIELDS else value


def stats_shape(reply: moe_pb2.EngineStats) -> dict:
    data = MessageToDict(reply, preserving_proto_field_name=True,
                         always_print_fields_with_no_presence=True)
    return masked(data)


def metrics_shape(text: str) -> dict:
    """family -> its type, help and samples ("name{labels}" -> value, timed ones masked)."""
    out = {}
    for family in text_string_to_metric_families(text):
        timed = (family.name.startswith(("process_", "python_"))
                 or family.name.endswith("_seconds"))
        samples = {}
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            keep = not timed or (s.name.endswith("_count") and family.name not in RACED)
            samples[f"{s.name}{{{labels}}}"] = s.value if keep else TIMED
        out[family.name] = {"type": family.type, "help": family.documentation,
                            "samples": samples}
    return out


def observe(scenario: str) -> dict:
    """The reply and the scrape after five requests sent one after another (so every step is
    the same on any machine), on a tiny server with the scenario's settings."""
    with running_server(metrics_port=0, seed=7, **SCENARIOS[scenario]) as served:
        for i in range(5):
            request = moe_pb2.GenerateRequest(prompt_token_ids=[3 + i, 40, 41 + i, 99],
                                              max_tokens=6, ignore_eos=True)
            assert sum(len(m.token_ids) for m in served.stub.Generate(request)) == 6
        reply = served.stub.GetStats(moe_pb2.GetStatsRequest())
        url = f"http://127.0.0.1:{served.app.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {"getstats": stats_shape(reply), "metrics": metrics_shape(text)}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else FIXTURES
    out.mkdir(parents=True, exist_ok=True)
    for scenario in SCENARIOS:
        path = out / f"{scenario}.json"
        path.write_text(json.dumps(observe(scenario), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
