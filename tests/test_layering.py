"""The arrows of docs/design.md hold, in every module of every folder: records and proto import
nothing of ours, analysis nothing but records (the what-if the server's policies and placement
planner besides), server and loadgen share only proto and records;
inside the server each room imports only the rooms below it (errors, parallel, engine,
telemetry, scheduling, front ends, the wiring, the tools), so the engine never imports
scheduling or a front end and expert parallelism's machinery never imports the engine; only the
gRPC front end and the wiring touch gRPC; inside the load generator the protocols, the traffic,
the recording and the reference servers never reach up into the web UI or the Locust glue, and
only the locustfile, its listener and its roles import locust; engines (the real-engine tier's
tools) import nothing else of ours; experiments run the server and Locust as processes and
import only analysis, records and the policy registry; no folder holds more than 20 modules; and no
module imports another that imports it back, however long the way round."""

import ast
import collections
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("records", "proto", "server", "loadgen", "analysis", "engines", "experiments")
MAX_MODULES = 20

# server: each room may import the rooms at its level and below (a module of the wiring is a
# room of its own: app, build, settings, __main__)
SERVER_LEVELS = {"server.errors": 0, "server.parallel": 1, "server.engine": 2,
                 "server.telemetry": 3, "server.scheduling": 4, "server.frontends": 5,
                 "server.app": 6, "server.build": 6, "server.settings": 6, "server.__main__": 7,
                 "server.tools": 7}
# loadgen: what each lower room may import of the load generator besides itself
LOADGEN_ROOMS = {"loadgen.reference": set(), "loadgen.targets": set(), "loadgen.scraping": set(),
                 "loadgen.traffic": {"loadgen.targets"},
                 "loadgen.recording": {"loadgen.targets"},
                 "loadgen.sla": {"loadgen.recording", "loadgen.targets", "loadgen.traffic"}}
GRPC = {"grpc", "grpc_health", "grpc_reflection"}
GRPC_IN_SERVER = {"server.frontends.grpc_service", "server.frontends.getstats",
                  "server.frontends.security", "server.app"}
LOCUST_IN_LOADGEN = {"loadgen.moe", "loadgen.listener", "loadgen.roles"}
# the what-if replays a foreign run's routing through the server's own policies and placement
# planner: the same code, no model (docs/design.md)
ANALYSIS_REPLAYS = {"analysis.routing.what_if": {"server.scheduling.policies",
                                                 "server.parallel.placement"}}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tracked_modules() -> dict[str, Path]:
    """Every module of our packages, at any depth (the generated stubs left out)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                found[module_name(path)] = path
    return found


MODULES = tracked_modules()


def imported(path: Path) -> set[str]:
    """The names a module imports, anywhere in it (function bodies too), `from a import b` as
    a.b where a.b is a module of ours."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                      else node.module for a in node.names}
    return names


IMPORTS = {name: imported(path) for name, path in MODULES.items()}


def ours(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in PACKAGES}


def room(name: str, rooms) -> str | None:
    """The room a module belongs to: the longest key of rooms it is, or is inside."""
    inside = [r for r in rooms if name == r or name.startswith(r + ".")]
    return max(inside, key=len, default=None)


def top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def of(package: str) -> list[str]:
    return [m for m in MODULES if m.split(".")[0] == package]


def test_every_module_is_seen_however_deep():
    assert "server.engine.local" in MODULES and "loadgen.targets.moe" in MODULES
    assert "analysis.readers.rundir" in MODULES and len(MODULES) > 100


@pytest.mark.parametrize("name", of("records") + of("proto") + of("engines"))
def test_records_proto_and_engines_import_nothing_of_ours(name):
    # engines/ drives real engines and our tools as processes, through their command lines
    assert top(ours(IMPORTS[name])) <= {name.split(".")[0]}


@pytest.mark.parametrize("name", of("analysis"))
def test_analysis_reads_files_only(name):
    replayed = ANALYSIS_REPLAYS.get(name, set())
    assert top(ours(IMPORTS[name]) - replayed) <= {"analysis", "records"}


@pytest.mark.parametrize("name", of("experiments"))
def test_experiments_run_the_rest_as_processes(name):
    # they start the server and Locust by their command lines and judge with analysis; the
    # policy registry names the policies to compare
    assert top(ours(IMPORTS[name]) - {"server.scheduling.policies"}) <= {
        "experiments", "analysis", "records"}


@pytest.mark.parametrize("name", of("loadgen"))
def test_loadgen_never_imports_the_server_and_its_rooms_import_downwards(name):
    names = IMPORTS[name]
    assert top(ours(names)) <= {"loadgen", "proto", "records"}
    if name not in LOCUST_IN_LOADGEN:
        assert "locust" not in top(names), \
            "only the locustfile, its listener and its roles import locust"
    mine = room(name, LOADGEN_ROOMS)
    if mine is not None:
        allowed = {mine, *LOADGEN_ROOMS[mine]}
        reached = {n for n in ours(names) if n.startswith("loadgen.")}
        assert all(room(n, allowed) for n in reached), \
            f"{name} reaches out of its room: {sorted(n for n in reached if not room(n, allowed))}"


@pytest.mark.parametrize("name", of("loadgen") + of("records"))
def test_the_load_generators_modules_never_import_scipy(name):
    # importing it into the Locust process slows its sends (docs/measured.md, Locust)
    assert "scipy" not in top(IMPORTS[name])


@pytest.mark.parametrize("name", of("server"))
def test_server_rooms_import_downwards(name):
    names = IMPORTS[name]
    assert top(ours(names)) <= {"server", "proto", "records"}
    assert "locust" not in top(names)
    if name not in GRPC_IN_SERVER:
        assert not top(names) & (GRPC | {"proto"}), "gRPC stays in the gRPC front end"
    level = SERVER_LEVELS[room(name, SERVER_LEVELS)] if name != "server" else 0
    for other in ours(names):
        if other.startswith("server.") and room(other, SERVER_LEVELS):
            assert SERVER_LEVELS[room(other, SERVER_LEVELS)] <= level, \
                f"{name} imports {other}, a room above it"


def test_no_import_cycle():
    """Depth-first over every import between our modules: a module met again while its own
    imports are being walked closes a cycle."""
    graph = {name: sorted(n for n in ours(IMPORTS[name]) if n in MODULES and n != name)
             for name in MODULES}
    state = collections.Counter()  # 1: on the path, 2: done
    path: list[str] = []

    def walk(name: str) -> None:
        state[name] = 1
        path.append(name)
        for nxt in graph[name]:
            if state[nxt] == 1:
                raise AssertionError("import cycle: " + " -> ".join(
                    path[path.index(nxt):] + [nxt]))
            if not state[nxt]:
                walk(nxt)
        path.pop()
        state[name] = 2

    for name in graph:
        if not state[name]:
            walk(name)


def test_no_folder_holds_more_than_twenty_modules():
    folders = collections.Counter(path.parent for path in MODULES.values())
    crowded = {str(folder.relative_to(REPO)): n for folder, n in folders.items()
               if n > MAX_MODULES}
    assert not crowded


# Sizes a newcomer reads in one go: a function takes at most 6 parameters (a declared record's
# constructor is a dataclass's and takes its fields), is under 50 lines, in a module of at most
# 450; the generated gRPC stubs left out.
MOST_PARAMETERS, MOST_FUNCTION_LINES, MOST_MODULE_LINES = 6, 49, 450


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    return len(names) - (bool(a.args) and a.args[0].arg in ("self", "cls"))


def sizes(source: str) -> list[str]:
    """What in source is over the sizes above, as name: figure."""
    over = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            if (n := parameters(fn)) > MOST_PARAMETERS:
                over.append(f"{fn.name}: {n} parameters")
            if (n := fn.end_lineno - fn.lineno + 1) > MOST_FUNCTION_LINES:
                over.append(f"{fn.name}: {n} lines")
    if (n := source.count("\n")) > MOST_MODULE_LINES:
        over.append(f"the module: {n} lines")
    return over


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_or_module_is_over_the_sizes(name):
    assert not sizes(MODULES[name].read_text())


def test_an_oversized_function_is_caught():
    many = "def f(a, b, c, d, e, f, g):\n    return a\n"
    long = "class K:\n    def g(self):\n" + "        x = 1\n" * 49
    assert sizes(many) == ["f: 7 parameters"]
    assert sizes(long) == ["g: 50 lines"]
    assert sizes("x = 1\n" * 451) == ["the module: 451 lines"]
    assert not sizes("class K:\n    def g(self, a, b, c, d, e, f):\n        return a\n")


# Where a room hands an object to another, the parameter is typed: a read of `moe.experts.held`
# through an untyped parameter is a dependency neither the import rules above nor a reader can
# see. In these rooms a parameter whose attributes are read is annotated (with a type its
# imports, checked above, may name), and so is one that __init__ keeps and methods read through
# `self.x.y`.
TYPED_ROOMS = ("server.parallel", "server.engine", "server.telemetry", "server.scheduling",
               "loadgen.modes", "loadgen.sla")


def _untyped(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    return {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs
            if p.annotation is None and p.arg not in ("self", "cls")}


def _kept(init: ast.FunctionDef, untyped: set[str]) -> set[str]:
    """The attributes __init__ sets from its untyped parameters: self.run = run (or in a tuple)."""
    kept = set()
    for node in ast.walk(init):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = (zip(target.elts, node.value.elts, strict=False)
                     if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [(target, node.value)])
            for t, v in pairs:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self" and isinstance(v, ast.Name) and v.id in untyped):
                    kept.add(t.attr)
    return kept


def untyped_reads(source: str) -> list[str]:
    """"function: name.attribute" for each read through an untyped parameter, or through what
    __init__ kept of one (self.name.attribute)."""
    tree = ast.parse(source)
    found = []
    kept_by_method: dict[ast.AST, set[str]] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                     and f.name == "__init__"), None)
        kept = _kept(init, _untyped(init)) if init is not None else set()
        for f in cls.body:
            kept_by_method[f] = kept
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        untyped, kept = _untyped(fn), kept_by_method.get(fn, set())
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in untyped:
                found.append(f"{fn.name}: {v.id}.{node.attr}")
            elif (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)
                  and v.value.id == "self" and v.attr in kept):
                found.append(f"{fn.name}: self.{v.attr}.{node.attr}")
    return sorted(set(found))


@pytest.mark.parametrize("name", [m for m in MODULES if room(m, TYPED_ROOMS)])
def test_objects_handed_across_a_room_are_typed(name):
    assert not untyped_reads(MODULES[name].read_text())


def test_an_untyped_reach_into_another_rooms_object_is_caught():
    # the exchange reaching into the layer it serves, as it once did
    exchange = MODULES["server.parallel.exchange"].read_text()
    mutated = exchange.replace("experts: ExpertSlots,", "moe,").replace(
        "experts.slots", "len(moe.experts.held)")
    assert mutated != exchange
    assert "run: moe.experts" in untyped_reads(mutated)
    kept = "class S:\n    def __init__(self, run):\n        self.run = run\n" \
           "    def f(self):\n        return self.run.recorder.slo\n"
    assert untyped_reads(kept) == ["f: self.run.recorder"]


def test_a_class_name_names_one_thing():
    # a settings group and the object it configures, or two records of one name, mislead a
    # reader; the few left are far apart (HDR histograms beside GetStats', a run beside a run
    # directory read back)
    defined = collections.defaultdict(list)
    for name, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(name)
    shared = {cls: where for cls, where in defined.items() if len(where) > 1}
    assert len(shared) <= 3, shared


def literal_uses(source: str) -> list[str]:
    """String literals used where an enum member belongs: a verdict, finish reason or stage
    compared or marked, a mode compared with a `mode`."""
    from records.early_stopping import Verdict
    from records.engine_telemetry import Stage
    from records.load_settings.choices import Mode
    from server.scheduling.requests import FinishReason
    symbols = {str(v) for enum in (Verdict, Stage, FinishReason) for v in enum}
    modes = {str(m) for m in Mode}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            texts = {s.value for s in sides if isinstance(s, ast.Constant)
                     and isinstance(s.value, str)}
            named_mode = any(isinstance(s, ast.Attribute | ast.Name)
                             and getattr(s, "attr", getattr(s, "id", "")) == "mode" for s in sides)
            found += sorted(texts & symbols) + (sorted(texts & modes) if named_mode else [])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "mark" and node.args
              and isinstance(node.args[0], ast.Constant)):
            found.append(node.args[0].value)
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_verdicts_finish_reasons_stages_and_modes_are_enum_members(name):
    assert not literal_uses(MODULES[name].read_text())


def test_a_literal_where_a_member_belongs_is_caught():
    assert literal_uses('x = v == "PASS"\nt.mark("attention")\nif s.mode != "closed": pass') == [
        "PASS", "attention", "closed"]
