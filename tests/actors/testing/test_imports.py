"""The testing kit stays out of the way: ``import sojourn.actors`` loads neither the kit nor
pytest, and the kit itself (all but its pytest plugin) needs neither pytest nor pydantic-ai."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("processes")

PROBE = """
import json, sys
import {module}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest")
                        or m == "pydantic_ai" or m.startswith("sojourn.actors.testing"))))
"""


def _loaded_by(module: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def test_importing_the_actors_loads_no_kit_and_no_pytest() -> None:
    assert _loaded_by("sojourn.actors") == []


def test_the_kit_loads_no_pytest() -> None:
    loaded = _loaded_by("sojourn.actors.testing")
    assert "pytest" not in loaded and "_pytest" not in loaded
    assert "sojourn.actors.testing.plugin" not in loaded
    assert "sojourn.actors.testing.env" in loaded
    # pydantic-ai is optional: the kit imports it only for a mock of a Pydantic AI object.
    assert "pydantic_ai" not in loaded and "sojourn.actors.testing._pydantic_ai" not in loaded
    assert "sojourn.actors.testing.models" in loaded and "sojourn.actors.testing.tools" in loaded
