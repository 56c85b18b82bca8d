"""The docs keep up with the code: the README's option tables are the settings' declarations
(records/readme.py), every batching policy the server registers is described, and nothing in
the repository points at files outside it."""

import subprocess
from pathlib import Path

from records.readme import render
from server.policies import POLICIES

REPO = Path(__file__).resolve().parent.parent


def test_readme_option_tables_are_generated_from_the_declarations():
    readme = (REPO / "README.md").read_text()
    assert "<!-- options: server -->" in readme and "<!-- options: load -->" in readme
    assert render(readme) == readme, "stale option tables: run make docs"


def test_every_policy_is_described_in_the_readme():
    readme = (REPO / "README.md").read_text()
    for name in POLICIES:
        assert f"- `{name}`: " in readme, name


def test_nothing_points_outside_the_repository():
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (REPO / name).is_file() and name.endswith((".py", ".md", ".proto", "Makefile", ".toml")) \
                and name != "tests/test_docs.py":
            text = (REPO / name).read_text()
            for pointer in ("DESIGN.md", "NOTES.md", "../shared"):
                assert pointer not in text, f"{name} points at {pointer}, outside the repository"
