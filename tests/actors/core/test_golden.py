"""Golden histories: recorded runs of every example agent replay cleanly against today's code.

The files in tests/golden/ were written by ``python -m tests.golden.record`` (each is what
``sojourn history RUN --json`` prints). A change to an example that would strand runs recorded
before it fails here, with the position and both operations named.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from sojourn.actors import Agent
from sojourn.actors.core.replay import ReplayResult, decode_history_file, replay_run
from sojourn.actors.core.state import fold

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
FILES = sorted(GOLDEN.glob("*.json"))


def agents_of(module: str) -> dict[str, Agent[Any, Any]]:
    mod = importlib.import_module(module)
    return {a.name: a for a in vars(mod).values() if isinstance(a, Agent)}


def replay_file(path: Path, module: str) -> ReplayResult:
    events = decode_history_file(path.read_bytes())
    return replay_run(agents_of(module)[fold(events).agent], events)


def test_every_example_has_golden_histories() -> None:
    examples = {p.stem for p in (GOLDEN.parent.parent / "examples").glob("*.py")} - {"__init__"}
    recorded = {p.name.split("--")[0].removeprefix("examples.") for p in FILES}
    assert examples <= recorded, examples - recorded


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_golden_history_replays_cleanly(path: Path) -> None:
    result = replay_file(path, path.name.split("--")[0])
    assert result.ok, result.describe()
    state = fold(decode_history_file(path.read_bytes()))
    assert result.checked == len(state.ops)  # every recorded operation was checked
    assert result.describe() == "ok"


def test_a_changed_agent_is_reported_with_the_position_and_both_steps() -> None:
    for path in GOLDEN.glob("examples.onboarding--*.json"):
        if fold(decode_history_file(path.read_bytes())).agent != "onboarding":
            continue
        result = replay_file(path, "tests.apps.changed_onboarding")
        assert not result.ok and result.checked == 1  # the model step replayed
        assert result.describe() == (
            "diverges at position 1: recorded step 'send_welcome_packet', "
            "code now calls step 'send_welcome_email'"
        ), path.name


def test_a_history_file_that_is_not_one_is_refused_readably() -> None:
    for bad in (b"", b"{}", b"[1, 2]", b'[{"seq": 1, "writer": "w", "events": [{"type": "x"}]}]'):
        with pytest.raises(ValueError, match="not a history"):
            decode_history_file(bad)
    with pytest.raises(ValueError, match="empty"):
        decode_history_file(b"[]")
