"""The engine's telemetry is declared once (records/engine_telemetry.py) and everything else
follows it: each declared metric is a field of the proto message it names, of a type that fits
its kind and unit; each GetStats record of the run directory holds exactly its message's
fields; the server has a reading for every metric, on one rank and on several; a real server's
/metrics shows every declared family it has values for and nothing undeclared; and the analysis
reads every declared window counter over a run and over time."""

import ast
import collections
import dataclasses
import sys
import types
import typing
import urllib.request
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as D
from prometheus_client.parser import text_string_to_metric_families

from analysis.readers.rundir import load_run
from analysis.readers.samples import server_series
from analysis.readers.server_stats import server_view
from proto import moe_pb2
from records import server_stats
from records.engine_telemetry import (
    HISTOGRAM,
    MESSAGES,
    METRICS,
    families,
    metrics_of,
    window_counters,
)
from records.server_stats import FaultCounts
from server.telemetry.process import GpuStats
from server.telemetry.readings import Now, readings
from server.telemetry.window import Telemetry
from tests.conftest import running_server
from tests.test_records import FIXTURES

INTEGERS = {D.TYPE_UINT64, D.TYPE_UINT32, D.TYPE_INT64, D.TYPE_INT32}

REPO = Path(__file__).resolve().parent.parent


def test_names_are_unique_and_families_agree_on_kind_and_labels():
    names = collections.Counter(m.name for m in METRICS)
    assert [n for n, k in names.items() if k > 1] == []
    for name, kind, _, metrics in families():
        assert name.startswith("moe_")
        assert {(m.kind, m.dims, tuple(k for k, _ in m.labels)) for m in metrics} == {
            (kind, metrics[0].dims, tuple(k for k, _ in metrics[0].labels))}, name
        assert len({m.labels for m in metrics}) == len(metrics), f"{name}: samples collide"


@pytest.mark.parametrize("metric", [m for m in METRICS if m.message], ids=lambda m: m.name)
def test_every_metric_is_a_field_of_its_message_of_a_type_that_fits(metric):
    fields = getattr(moe_pb2, metric.message).DESCRIPTOR.fields_by_name
    assert metric.name in fields, f"proto/moe.proto {metric.message} has no {metric.name}"
    f = fields[metric.name]
    if metric.kind == HISTOGRAM:
        assert f.message_type is not None and f.message_type.name == "Histogram"
        assert not f.is_repeated
        return
    assert f.is_repeated == bool(metric.own_dims)
    expected = ({D.TYPE_BOOL} if metric.unit == "bool" else {D.TYPE_DOUBLE} if metric.fractional
                else INTEGERS)
    assert f.type in expected, f"{metric.name}: unit {metric.unit} in a field of type {f.type}"


@pytest.mark.parametrize("message", MESSAGES)
def test_each_getstats_record_holds_its_messages_fields_and_the_declared_ones(message):
    record = getattr(server_stats, "ServerStats" if message == "EngineStats" else message)
    proto = set(getattr(moe_pb2, message).DESCRIPTOR.fields_by_name)
    fields = {f.name for f in dataclasses.fields(record)} - {"error", "extra"}
    assert fields == proto
    hints = typing.get_type_hints(record)
    for m in metrics_of(message):
        expected = (server_stats.Histogram | None if m.kind == HISTOGRAM
                    else list[int] if m.own_dims and not m.fractional else None)
        if expected is not None:
            assert hints[m.name] == expected, m.name


def test_a_reading_for_every_metric_on_one_rank_and_on_several():
    now = Now(running=1, waiting=2, kv_slots_in_use=1, kv_slots_total=4, prefix_cache_blocks=0,
              uptime_s=1.0,
              gpu=GpuStats(-1.0, 0, 0), heap_trims=0, heap_trim_ms=0.0, faults=FaultCounts())
    declared = {m.name for m in METRICS}
    for ranks in (1, 2):
        values = readings(Telemetry(n_layers=2, n_experts=4, ranks=ranks), [], now)
        assert set(values) == declared
        assert (values["ranks"] is None) == (ranks == 1)
    assert values["gpu_utilization_percent"] is None and values["hits"] is None


def test_a_servers_metrics_are_the_declared_families_with_values():
    with running_server(metrics_port=0, expert_cache=2) as served:
        list(served.stub.Generate(moe_pb2.GenerateRequest(prompt="hi", max_tokens=3)))
        url = f"http://127.0.0.1:{served.app.metrics_port}/metrics"
        scraped = {f.name for f in text_string_to_metric_families(
            urllib.request.urlopen(url, timeout=10).read().decode())}
        values = served.app.service.engine_thread.lifetime_readings()
    declared = {name for name, *_ in families()}
    expected = {name for name, _, _, metrics in families()
                if any(values[m.name] is not None for m in metrics)}
    ours = {name for name in scraped if name.startswith("moe_")} - {"moe_server_info"}
    assert ours == expected and ours <= declared
    assert {"moe_cache_hits", "moe_requests", "moe_stage_seconds"} <= ours
    assert not {"moe_ep_bytes", "moe_gpu_utilization_percent"} & ours  # one rank, no GPU
    assert scraped - ours - {"moe_server_info"} == {n for n in scraped if n.startswith("process_")}


def test_the_analysis_reads_every_window_counter_over_a_run_and_over_time():
    run = load_run(FIXTURES / "fixed")
    names = {m.name for m in window_counters()}
    view = server_view(run.summary.server)
    series = server_series(run.samples)
    assert set(view.counters) == names and set(series.counters) == names
    start, end = run.summary.server.start, run.summary.server.end
    assert view.counters["tokens_generated"] == end.tokens_generated - start.tokens_generated
    assert series.steps.sum() == pytest.approx(
        run.samples[-1].stats.steps - run.samples[0].stats.steps)
    assert series.counters["prompt_tokens"].min() >= 0


def test_the_server_adds_to_its_counters_by_symbol():
    # counts["steps"] += 1 would make a misspelt name a new key, found only on its own path
    by_name = []
    for path in (REPO / "server").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and isinstance(node.slice.value, str)
                    and getattr(node.value, "attr", getattr(node.value, "id", "")) == "counts"):
                by_name.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not by_name


def test_a_misspelt_counter_symbol_fails_at_import(monkeypatch):
    source = (REPO / "records" / "engine_telemetry.py").read_text()
    misspelt = source.replace('STEPS = "steps"', 'STEPS = "stpes"')
    assert misspelt != source
    module = types.ModuleType("mutated_engine_telemetry")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # its dataclasses look it up
    with pytest.raises(ImportError, match=r"lacks \['steps'\].*undeclared counters \['stpes'\]"):
        exec(compile(misspelt, "engine_telemetry.py", "exec"), module.__dict__)
