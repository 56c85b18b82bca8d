"""The docs' generated tables: docs/options.md's option tables from the settings declarations,
and docs/targets.md's table per engine from records/engine_maps.py.

    python -m records.readme docs/options.md docs/targets.md   # rewrites the blocks (make docs)

A block sits between `<!-- options: NAME -->` and `<!-- /options -->` (or `<!-- engine: NAME
-->` and `<!-- /engine -->`); tests/test_docs.py fails while one is stale, so a new setting or
a new name in an engine's table reaches the docs without a hand-written row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from records.declare import markdown_tables
from records.engine_maps import ENGINE_MAPS, EngineMap
from records.load_settings import LoadSettings
from records.metric_maps import BY_CONCEPT
from records.server_settings import ServerSettings

TABLES = {"server": ServerSettings, "load": LoadSettings}
ENGINES = {e.engine: e for e in ENGINE_MAPS}
BLOCK = re.compile(r"(<!-- options: (\w+) -->\n).*?(<!-- /options -->)", re.DOTALL)
ENGINE_BLOCK = re.compile(r"(<!-- engine: ([\w-]+) -->\n).*?(<!-- /engine -->)", re.DOTALL)


def engine_table(engine: EngineMap) -> str:
    """What we read of an engine: each concept, the families it comes from (the first found
    wins), since which release."""
    rows = ["| figure | from | since |", "| --- | --- | --- |"]
    for concept, sources in engine.reads.items():
        families = []
        for s in sources:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels)
            name = f"`{s.family}{{{labels}}}`" if labels else f"`{s.family}`"
            if s.per:
                per = ",".join(f'{k}="{v}"' for k, v in s.per_labels or s.labels)
                name += f" / `{s.per}{{{per}}}`" if per else f" / `{s.per}`"
            if s.balance:
                name += f" (balance over `{s.balance}`)"
            families.append(name)
        since = "; ".join(dict.fromkeys(s.since or "-" for s in sources))
        rows.append(f"| {BY_CONCEPT[concept].title} | {', else '.join(families)} | {since} |")
    return "\n".join(rows) + f"\n\nNames read from: {engine.cited}."


def render(text: str) -> str:
    """text with every block's table regenerated."""
    text = BLOCK.sub(lambda m: f"{m[1]}{markdown_tables(TABLES[m[2]])}\n{m[3]}", text)
    return ENGINE_BLOCK.sub(lambda m: f"{m[1]}{engine_table(ENGINES[m[2]])}\n{m[3]}", text)


def main(argv: list[str]) -> int:
    for path in map(Path, argv or ["docs/options.md"]):
        old = path.read_text()
        new = render(old)
        if new != old:
            path.write_text(new)
        print(f"{path}: {'rewritten' if new != old else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
