"""docs/architecture.md's module map names every module of the library, and nothing that is
not one: a newcomer reading it finds each module in the room it names.

A module is named by its path in a row of its own (``| `actors/core/state.py` | ...``), or,
for a folder described in one row (``| `actors/cli/` | ...``), by its file name inside that
row. ``__init__.py`` and ``__main__.py`` are a package's face and need no row.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("schemas", "broker", "projections", "actors")
DOC = ROOT / "docs" / "architecture.md"
FACES = {"__init__.py", "__main__.py"}


def modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if p.name not in FACES
    }


def map_rows() -> list[str]:
    """The table rows of the module map and of the gateway's section (its modules' table)."""
    text = DOC.read_text(encoding="utf-8")
    rows = []
    for heading in ("## Module map", "## The HTTP gateway"):
        start = text.index(heading)
        end = text.find("\n## ", start + len(heading))
        rows += [ln for ln in text[start:end].splitlines() if ln.startswith("| `")]
    return rows


def named(rows: list[str]) -> set[str]:
    """Every module path the rows name, folder rows expanded by the file names they list."""
    found: set[str] = set()
    for row in rows:
        head = row.split("|")[1].strip().strip("`")
        if head.endswith(".py"):
            found.add(head)
        elif head.endswith("/"):
            found |= {head + name for name in re.findall(r"`(\w+\.py)`", row)}
    return found


def test_every_module_is_on_the_map() -> None:
    missing = sorted(modules() - named(map_rows()))
    assert missing == [], f"modules docs/architecture.md's module map does not name: {missing}"


def test_the_map_names_no_module_that_does_not_exist() -> None:
    stale = sorted(named(map_rows()) - modules())
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"
