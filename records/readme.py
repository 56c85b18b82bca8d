"""The README's option tables, generated from the settings declarations.

    python -m records.readme README.md      # rewrites the generated blocks (make docs)

A block sits between `<!-- options: NAME -->` and `<!-- /options -->`; tests/test_docs.py
fails while one is stale, so a new setting reaches the README without a hand-written row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from records.declare import markdown_tables
from records.load_settings import LoadSettings
from records.server_settings import ServerSettings

TABLES = {"server": ServerSettings, "load": LoadSettings}
BLOCK = re.compile(r"(<!-- options: (\w+) -->\n).*?(<!-- /options -->)", re.DOTALL)


def render(readme: str) -> str:
    """readme with every block's table regenerated."""
    return BLOCK.sub(lambda m: f"{m[1]}{markdown_tables(TABLES[m[2]])}\n{m[3]}", readme)


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    old = path.read_text()
    new = render(old)
    if new != old:
        path.write_text(new)
    print(f"{path}: {'rewritten' if new != old else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
