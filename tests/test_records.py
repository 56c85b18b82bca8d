"""The run directory's records (records/): runs written before the records existed
(tests/fixtures/schema1, by the load generator of commit e7cce68: a fixed-rate run with SLOs and a
warm-up, a stress run and a mixed run) read back into them and write out the same JSON, so the
format did not change (but for settings added since, at their defaults), and every analysis
command reads them; a missing or misnamed field is an
error naming the file and the field; the GetStats and request records follow the proto."""

import dataclasses
import json
import shutil
import typing
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from analysis.readers.rundir import load_run
from proto import moe_pb2
from records.declare import flat
from records.jsonform import dumps, from_json, to_json
from records.load_settings import LoadSettings
from records.requests import RequestRow
from records.server_stats import ServerStats
from tests.cli import analysis

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "schema1"
RUNS = ("fixed", "stress", "mixed")


def lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", RUNS)
def test_an_old_run_reads_into_the_records_and_writes_back_the_same(name):
    run = load_run(FIXTURES / name)
    written = json.loads((FIXTURES / name / "summary.json").read_text())
    # settings added since read as their defaults
    added = {k: v for k, v in to_json(flat(LoadSettings())).items() if k not in written["config"]}
    assert to_json(run.summary) == written | {"config": written["config"] | added}
    assert [to_json(row) for row in run.rows] == lines(FIXTURES / name / "requests.jsonl")
    assert ([to_json(sample) for sample in run.samples]
            == lines(FIXTURES / name / "server_stats.jsonl"))
    assert ((run.summary.stress is not None) == (name == "stress")
            and bool(run.summary.classes) == (name == "mixed"))


@pytest.mark.slow  # whole commands, figures and all, on real runs
@pytest.mark.parametrize("command", ["report fixed", "report stress", "report mixed",
                                     "capacity fixed", "soak fixed --window-s 1 --min-samples 1",
                                     "compare fixed stress mixed"])
def test_every_command_reads_old_runs(tmp_path, command):
    for name in RUNS:
        shutil.copytree(FIXTURES / name, tmp_path / name)
    name, *args = command.split()
    argv = [tmp_path / arg if arg in RUNS else arg for arg in args]
    done = analysis(name, *argv)  # report runs the diagnosis too
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout.strip().splitlines()[-1])
    if name == "compare":
        assert "the workloads differ" in done.stdout  # fixed, stress and mixed runs


@pytest.mark.parametrize("change, named", [
    (lambda s: s.pop("throughput"), "summary.json: throughput: missing"),
    (lambda s: s["metrics"]["ttft_ms"].update(p5O=s["metrics"]["ttft_ms"].pop("p50")),
     "summary.json: metrics.ttft_ms: unknown field(s) p5O"),
    (lambda s: s["requests"].update(sent="many"),
     "summary.json: requests.sent: expected an integer, got 'many'"),
    (lambda s: s["config"].update(rate=-1),
     "summary.json: config: --rate: must be above 0 requests/s, got -1"),
    (lambda s: s.update(window_s=float("nan")),
     "summary.json: window_s: expected a finite number, got nan"),
    (lambda s: s["throughput"].update(output_tokens_per_s=float("inf")),
     "summary.json: throughput.output_tokens_per_s: expected a finite number, got inf"),
    (lambda s: s.update(window_s=1e9),
     "summary.json: window_s: must be 0..duration_s (3.62856 s: the window is part of the run)"),
    (lambda s: s.update(window_s=-5), "summary.json: window_s: must be 0..duration_s"),
    (lambda s: s.update(duration_s=1e9, window_s=1e9),
     "summary.json: duration_s: must be 0..2.6784e+06 s, got 1e+09"),
])
def test_a_missing_or_misnamed_field_names_the_file_and_the_field(tmp_path, change, named):
    run_dir = shutil.copytree(FIXTURES / "fixed", tmp_path / "run")
    summary = json.loads((run_dir / "summary.json").read_text())
    change(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for command in ("report", "compare", "capacity", "soak"):
        done = analysis(command, run_dir)
        assert (done.returncode == 2 and f"{run_dir / named}" in done.stderr
                and "Traceback" not in done.stderr), done.stderr


def test_strict_json_has_no_nan():
    assert dumps({"p99": float("nan"), "rates": [1.0, float("inf")]}) == \
        '{"p99": null, "rates": [1.0, null]}'


def test_a_bad_request_row_names_its_line(tmp_path):
    run_dir = shutil.copytree(FIXTURES / "fixed", tmp_path / "run")
    rows = (run_dir / "requests.jsonl").read_text().splitlines()
    rows[2] = rows[2].replace('"ttft_ms"', '"ttft"')
    (run_dir / "requests.jsonl").write_text("\n".join(rows) + "\n")
    done = analysis("report", run_dir)
    assert (done.returncode == 2
            and f"{run_dir / 'requests.jsonl'}:3: ttft_ms: missing" in done.stderr)


D = FieldDescriptor
KINDS = {D.TYPE_DOUBLE: float, D.TYPE_FLOAT: float, D.TYPE_STRING: str, D.TYPE_BOOL: bool,
         D.TYPE_UINT64: int, D.TYPE_UINT32: int, D.TYPE_INT32: int, D.TYPE_INT64: int}


def test_the_getstats_record_follows_the_proto():
    """Every EngineStats field is declared (none of our server's lands in `extra`), with the
    type the load generator's JSON gives it."""
    proto = moe_pb2.EngineStats.DESCRIPTOR.fields_by_name
    hints = typing.get_type_hints(ServerStats)
    declared = {f.name for f in dataclasses.fields(ServerStats)} - {"error", "extra"}
    assert declared == set(proto)
    for name, f in proto.items():
        hint = hints[name]
        if f.message_type is not None or f.is_repeated:
            assert (typing.get_origin(hint) in (list, dict)
                    or dataclasses.is_dataclass(typing.get_args(hint)[0])), name
        else:
            assert hint is KINDS[f.type], name


def test_a_snapshot_that_failed_is_written_as_its_error_alone():
    failed = ServerStats(error="GetStats failed: UNAVAILABLE: connection refused")
    assert to_json(failed) == {"error": "GetStats failed: UNAVAILABLE: connection refused"}
    assert from_json(ServerStats, to_json(failed), "test:") == failed and not failed.ok


def test_request_rows_hold_the_servers_whole_usage():
    usage = {f"server_{name}" for name in moe_pb2.Usage.DESCRIPTOR.fields_by_name}
    assert usage == {f.name for f in dataclasses.fields(RequestRow) if f.name.startswith("server_")}


def test_a_distributed_run_is_measured_over_the_union_of_its_workers_windows():
    from loadgen.distributed import merged_window_s

    # two workers started 0.9 s apart (--processes forks them one by one), 7 s schedules
    parts = [{"started_at": 100.0, "duration_s": 7.0, "window_s": 6.0},
             {"started_at": 100.9, "duration_s": 6.1, "window_s": 5.1}]
    assert merged_window_s(parts, warmup_s=1.0) == 6.0  # 101.0 -> 107.0, not the mean 5.55
    parts[1]["duration_s"] = 7.0  # the later one ends later
    assert merged_window_s(parts, warmup_s=1.0) == pytest.approx(6.9)
