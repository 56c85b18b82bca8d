"""The arrows of docs/design.md hold: records imports nothing of ours, analysis nothing but
records, server and loadgen share only proto and records, only service.py and the wiring around
it touch grpc inside the server, the engine side never imports upward, and only the locustfile
and its listener import locust."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def modules(package: str):
    return sorted((REPO / package).glob("*.py"))


def top(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("path", modules("records"), ids=str)
def test_records_import_nothing_of_ours(path):
    assert not top(imports(path)) & {"server", "loadgen", "analysis", "proto"}


@pytest.mark.parametrize("path", modules("analysis"), ids=str)
def test_analysis_reads_files_only(path):
    assert not top(imports(path)) & {"server", "loadgen", "proto"}


@pytest.mark.parametrize("path", modules("loadgen"), ids=str)
def test_loadgen_never_imports_the_server(path):
    assert "server" not in top(imports(path))
    if path.name not in {"moe.py", "listener.py"}:
        assert "locust" not in top(imports(path)), \
            "only the locustfile and its listener import locust"


@pytest.mark.parametrize("path", modules("server"), ids=str)
def test_server_layers(path):
    names = imports(path)
    assert "loadgen" not in top(names) and "locust" not in top(names)
    if path.name not in {"service.py", "app.py", "security.py", "__main__.py"}:
        assert not top(names) & {"grpc", "grpc_health", "grpc_reflection", "proto"}, \
            "gRPC stays in the service"
    if path.name in {"model.py", "engine.py", "engine_thread.py", "policies.py", "tokenizer.py"}:
        assert not names & {"server.frontends.grpc_service", "server.app"}, "the engine side never imports upward"
