"""Scheduling knows an engine only through its protocol (server/engine/interface.py), and the
one-process engine, the engine over expert-parallel ranks and the tests' fake all follow it:
every member present, every method with the protocol's parameters; and nothing in the server
probes an engine or a policy for what it may lack (getattr)."""

import ast
import inspect
import typing

import pytest
import torch

from server.engine.distributed import DistributedEngine
from server.engine.interface import Engine
from server.engine.local import LocalEngine
from tests.conftest import REPO, running_server
from tests.test_policies import FakeClock, FakeEngine

METHODS = [name for name, member in vars(Engine).items()
           if inspect.isfunction(member) and not name.startswith("_")]
MEMBERS = set(typing.get_type_hints(Engine)) | set(METHODS) | {
    name for name, member in vars(Engine).items() if isinstance(member, property)}


def follows_the_protocol(engine) -> None:
    assert isinstance(engine, Engine)
    missing = {name for name in MEMBERS if not hasattr(engine, name)}
    assert not missing
    for name in METHODS:
        wanted = list(inspect.signature(getattr(Engine, name)).parameters)[1:]
        assert list(inspect.signature(getattr(engine, name)).parameters) == wanted, name


def test_the_protocol_names_what_scheduling_uses():
    assert {"args", "tokenizer", "device", "seed", "kv_slots", "slots", "world", "caches",
            "expert_bytes", "step", "stop"} <= MEMBERS


def test_the_one_process_engine_follows_it():
    engine = LocalEngine.from_preset("tiny", kv_slots=2, device="cpu", dtype=torch.float32,
                                     seed=0)
    follows_the_protocol(engine)
    assert engine.world == 1 and len(engine.slots) == 2


def test_the_tests_fake_follows_it():
    follows_the_protocol(FakeEngine(FakeClock(), kv_slots=3))


@pytest.mark.slow
def test_the_engine_over_ranks_follows_it():
    with running_server(ep=2) as served:
        engine = served.app.engine
        assert isinstance(engine, DistributedEngine)
        follows_the_protocol(engine)
        assert engine.world == 2


def test_nothing_probes_an_engine_or_a_policy():
    probes = []
    for path in sorted((REPO / "server").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args):
                probed = ast.unparse(node.args[0])
                if "engine" in probed or "policy" in probed:
                    probes.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert probes == []
