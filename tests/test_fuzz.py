"""Property-based fuzzing (hypothesis): the contract's fields and raw request bytes against a
real server, and the analysis on damaged run directories. Every input ends in a clear status
(never UNKNOWN or INTERNAL, and the server keeps serving) or, for the analysis, exit status 0
or 2 with a message naming the damaged file, never a traceback. Run with -s to see the counts
per status."""

import collections
import io
import json
import random
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.__main__ import main as analysis_main
from proto import moe_pb2
from tests.conftest import running_server

FIXTURE = Path(__file__).parent / "fixtures/schema1/fixed"
CLEAR = {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}
# derandomized: the same inputs on every run, so a failure repeats; no example database on disk


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

UINT32 = st.integers(0, 2**32 - 1)
requests = st.builds(
    moe_pb2.GenerateRequest,
    request_id=st.text(max_size=40),
    prompt=st.one_of(st.just(""), st.text(max_size=300)),
    prompt_token_ids=st.lists(UINT32 | st.integers(0, 300), max_size=40),
    max_tokens=st.one_of(UINT32, st.integers(0, 4)),
    ignore_eos=st.booleans(),
    temperature=st.floats(width=32) | st.floats(0, 2, width=32),
    seed=st.integers(0, 2**64 - 1),
    priority=st.integers(-2**31, 2**31 - 1))


@pytest.fixture(scope="module")
def fuzzed():
    with running_server(max_batch_size=4, max_tokens_limit=8, max_queue=64) as served:
        yield served


def outcome(calls) -> str:
    try:
        calls()
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def report(title: str, counts: collections.Counter) -> None:
    print(f"\n{title}: " + ", ".join(f"{code} {n}" for code, n in counts.most_common()))


def test_any_generate_request_gets_a_clear_status_and_the_server_keeps_serving(fuzzed):
    counts = collections.Counter()

    @fuzz(150)
    @given(requests)
    def check(request):
        counts[outcome(lambda: list(fuzzed.stub.Generate(request, timeout=30)))] += 1

    check()
    report("GenerateRequest fields", counts)
    assert set(counts) <= CLEAR, counts
    assert counts["OK"] and counts["INVALID_ARGUMENT"]
    assert list(fuzzed.stub.Generate(moe_pb2.GenerateRequest(prompt="ok", max_tokens=2)))


@pytest.mark.parametrize(("method", "kind"), [("Generate", "unary_stream"),
                                              ("GetStats", "unary_unary"),
                                              ("ResetStats", "unary_unary")])
def test_any_raw_bytes_get_a_clear_status(fuzzed, method, kind):
    counts = collections.Counter()
    with grpc.insecure_channel(f"127.0.0.1:{fuzzed.port}") as channel:
        raw = getattr(channel, kind)(f"/moe.v1.MoEInference/{method}")

        @fuzz(100)
        @given(st.binary(max_size=200))
        def check(data):
            call = (lambda: list(raw(data, timeout=30))) if kind == "unary_stream" \
                else (lambda: raw(data, timeout=30))
            counts[outcome(call)] += 1

        check()
    report(f"raw bytes to {method}", counts)
    assert set(counts) <= CLEAR, counts
    assert counts["INVALID_ARGUMENT"]


# --- the analysis on damaged run directories ----------------------------------------------------

FILES = sorted(p.name for p in FIXTURE.iterdir())
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                           | st.floats() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=6)


def json_paths(value, path=()):
    """Every (path, value) inside a JSON document."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, inner in items:
        yield from json_paths(inner, (*path, key))


def replace_at(document, path, new):
    if not path:
        return new
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = new
    return document


@st.composite
def damage(draw):
    """(file, kind, how): a file of the run directory and what is done to it."""
    name = draw(st.sampled_from(FILES))
    kind = draw(st.sampled_from(["truncate", "garble", "delete", "json_value", "empty"]))
    return name, kind, draw(st.randoms(use_true_random=False)), draw(JSON_VALUES)


def damaged_copy(tmp: Path, name: str, kind: str, rng: random.Random, value) -> Path:
    run = tmp / "run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(FIXTURE, run)
    path = run / name
    data = path.read_bytes()
    if kind == "delete":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncate":
        path.write_bytes(data[:rng.randrange(len(data))])
    elif kind == "garble":
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
    elif name.endswith(".json"):
        document = json.loads(data)
        target, _ = rng.choice(list(json_paths(document)))
        path.write_text(json.dumps(replace_at(document, target, value)))
    elif name.endswith(".jsonl"):
        lines = data.decode().splitlines()
        i = rng.randrange(len(lines))
        document = json.loads(lines[i])
        target, _ = rng.choice(list(json_paths(document)))
        lines[i] = json.dumps(replace_at(document, target, value))
        path.write_text("\n".join(lines) + "\n")
    else:  # an .hlog line's histogram replaced by the value's text
        lines = data.decode(errors="replace").splitlines()
        i = rng.randrange(len(lines))
        lines[i] = lines[i].rsplit(",", 1)[0] + "," + json.dumps(value)
        path.write_text("\n".join(lines) + "\n")
    return run


def run_analysis(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = analysis_main(list(argv))
    return code, err.getvalue()


@pytest.mark.parametrize(("command", "examples"), [pytest.param("diagnose", 120,
                                                                marks=pytest.mark.slow),
                                                   pytest.param("report", 5,
                                                                marks=pytest.mark.slow)])
def test_a_damaged_run_directory_is_read_or_refused_naming_the_file(tmp_path, command,
                                                                    examples):
    counts = collections.Counter()

    @fuzz(examples)
    @given(damage())
    def check(hurt):
        name, kind, rng, value = hurt
        run = damaged_copy(tmp_path, name, kind, rng, value)
        code, err = run_analysis(command, str(run))
        assert code in (0, 2)
        if code == 2:
            assert name in err or "summary.json" in err, (name, kind, err)
        counts[f"exit {code}"] += 1

    check()
    report(f"analysis {command} on damaged run directories", counts)
    assert counts["exit 2"]
