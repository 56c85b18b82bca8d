"""The docs keep up with the code: docs/options.md's tables are the settings' declarations
(records/readme.py), every batching policy the server registers is described, the README's
contents lead to its sections, nothing a user reads names a requirement tag or an issue
number, and nothing in the repository points at files outside it."""

import ast
import dataclasses
import re
import subprocess
import typing
from pathlib import Path

import pytest

from records.readme import render
from records.requests import RequestRow
from records.server_metrics import Family, Sample, Scrape
from records.server_stats import ServerSample
from records.summary import StepRow, Summary
from server.scheduling.policies import POLICIES

REPO = Path(__file__).resolve().parent.parent


def test_the_option_tables_are_generated_from_the_declarations():
    options = (REPO / "docs" / "options.md").read_text()
    assert "<!-- options: server -->" in options and "<!-- options: load -->" in options
    assert render(options) == options, "stale option tables: run make docs"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, - for space."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")


def test_the_readmes_contents_lead_to_its_sections_and_name_them_all():
    readme = (REPO / "README.md").read_text()
    headings = re.findall(r"^###? (.*)$", readme.split("Contents:")[1], flags=re.MULTILINE)
    listed = re.findall(r"^ *- \[[^]]*\]\(#([^)]+)\)$", readme, flags=re.MULTILINE)
    assert listed == [anchor(h) for h in headings]
    first = [h for h in headings if h.startswith(("Which", "What load", "Does it last"))]
    assert headings.index(first[0]) <= 2 and len(first) == 3  # the decisions come first


def user_facing() -> list[Path]:
    """What a user reads: the README, and the sources of every help text and report line."""
    return [REPO / "README.md", *sorted(p for top in ("loadgen", "records", "analysis", "server")
                                        for p in (REPO / top).rglob("*.py"))]


def test_no_requirement_tag_or_issue_number_reaches_a_user():
    tag = re.compile(r"\bseed \d+\.\d+|\bissues? #?\d+\b")
    found = [f"{p.relative_to(REPO)}: {m[0]}" for p in user_facing()
             for m in tag.finditer(p.read_text())]
    assert not found


def test_the_targets_doc_has_every_engine_table_generated_from_its_declaration():
    targets = (REPO / "docs" / "targets.md").read_text()
    assert render(targets) == targets, "stale engine tables: run make docs"
    for engine in ("vllm", "sglang", "triton", "tgi", "moe-loadlab", "nvml"):
        assert f"<!-- engine: {engine} -->\n| figure | from | since |" in targets, engine


def json_keys(kind) -> set[str]:
    """The JSON keys of a record and of the records it nests (settings and GetStats are documented
    where they are declared)."""
    keys = set()
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        keys.add(f.metadata.get("key") or f.name)
        for inner in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(inner) and inner.__module__ == "records.summary":
                keys |= json_keys(inner)
    return keys


def test_the_run_directory_doc_names_every_field():
    doc = (REPO / "docs" / "run-directory.md").read_text()
    for kind in (Summary, StepRow, RequestRow, ServerSample, Scrape, Family, Sample):
        missing = [key for key in json_keys(kind) if f"`{key}`" not in doc]
        assert not missing, f"docs/run-directory.md does not describe {kind.__name__}'s {missing}"


def test_every_policy_is_described_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for name in POLICIES:
        assert f"- `{name}`: " in readme, name


def outside_pointers() -> list[str]:
    """The pointers docs/design.md lists as outside the repository."""
    text = (REPO / "docs/design.md").read_text()
    block = text.split("<!-- outside-pointers -->")[1].split("<!-- /outside-pointers -->")[0]
    return re.findall(r"^- `([^`]+)`$", block, flags=re.MULTILINE)


def test_nothing_points_outside_the_repository():
    # the rule and its list: docs/design.md, "Documentation stays inside the repository"
    pointers = outside_pointers()
    assert len(pointers) >= 3
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (REPO / name).is_file() \
                and name.endswith((".py", ".md", ".proto", "Makefile", ".toml")) \
                and name != "docs/design.md":
            text = (REPO / name).read_text()
            for pointer in pointers:
                assert pointer not in text, f"{name} points at {pointer}, outside the repository"


def test_the_design_maps_every_module():
    """docs/design.md names every module (as its path, or its name in its folder's entry)."""
    doc = (REPO / "docs" / "design.md").read_text()
    named = set(re.findall(r"`([\w/.]+\.(?:py|js))`", doc))
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             "server", "loadgen", "analysis", "records", "experiments"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    unnamed = [path for path in listed if path.endswith((".py", ".js"))
               and not path.endswith("__init__.py") and (REPO / path).is_file()
               and path not in named and Path(path).name not in named]
    assert not unnamed, f"docs/design.md's module map does not name {unnamed}"


@pytest.mark.parametrize("section", ["One request's trip", "A load-generator run's trip"])
def test_each_trip_in_the_design_names_real_functions(section):
    """Each `file.py`: `Name` or `Class.method` of the trip exists in that file."""
    doc = (REPO / "docs" / "design.md").read_text()
    trip = doc.split(f"## {section}")[1].split("\n## ")[0]
    pairs = re.findall(r"`([\w/]+\.py)`:\s+`(\w+(?:\.\w+)?)`", trip)
    assert len(pairs) >= 10
    for path, name in pairs:
        tree = ast.parse((REPO / path).read_text())
        defined = {n.name: n for n in tree.body
                   if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}
        outer, _, inner = name.partition(".")
        assert outer in defined, f"{path} has no {outer}"
        if inner:
            members = {n.name for n in defined[outer].body
                       if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            assert inner in members, f"{path}: {outer} has no {inner}"
