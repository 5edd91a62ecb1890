"""Recorded histories as test fixtures: the replay gate as a call a test makes.

Save a run's history with ``sojourn history RUN --json > tests/histories/order.json`` (from a
staging deployment, or from the test environment), keep it with the tests, and assert that
today's code still replays it::

    from sojourn.actors.testing import replay
    import myapp.agents

    def test_recorded_orders_still_replay() -> None:
        replay(myapp.agents, "tests/histories")

``replay`` reads one file or every ``*.json`` below a directory, replays each history against
the agent its ``RunStarted`` names (``actors/core/replay.py``: no step runs, nothing is
written, no broker is needed), and raises ``ReplayFailed`` (an ``AssertionError``, so pytest
shows it as a failed assertion) naming, for each history that diverges, the file, the run,
the position and what history recorded there against what the code does now. A change made
behind ``ctx.patched`` replays old histories on their old branch, as in production.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from sojourn.schemas.events import RunStarted

from ..agents.agent import Agent
from ..core.replay import ReplayResult, decode_history_file, replay_run

__all__ = ["ReplayFailed", "replay"]

Agents = ModuleType | Agent[Any, Any] | Iterable[Agent[Any, Any]]
"""Whose code replays: a module (its module-level agents), one agent, or several."""


class ReplayFailed(AssertionError):
    """Histories today's code does not replay; ``failures`` holds ``(file, what)`` for each."""

    def __init__(self, failures: list[tuple[Path, str]]) -> None:
        self.failures = failures
        one = len(failures) == 1
        lines = [f"{len(failures)} recorded histor{'y' if one else 'ies'}"]
        lines[0] += f" no longer replay{'s' if one else ''}:"
        lines += [f"  {path}: {what}" for path, what in failures]
        super().__init__("\n".join(lines))


def replay(agents: Agents, path: str | os.PathLike[str]) -> list[ReplayResult]:
    """Replay the history in the file ``path`` (what ``sojourn history RUN --json`` prints),
    or every ``*.json`` file below the directory ``path``, against ``agents``' code; return
    each history's result when all replay.

    Raises:
        ReplayFailed: a history diverges, names an agent not among ``agents``, or is not a
            history; every such file is listed, with the position and both versions named.
        FileNotFoundError: ``path`` does not exist, or a directory holds no ``*.json`` file.
    """
    by_name = {a.name: a for a in _agents(agents)}
    root = Path(path)
    if root.is_dir():
        files = sorted(root.rglob("*.json"))
        if not files:
            raise FileNotFoundError(f"no *.json history below {root}")
    elif root.exists():
        files = [root]
    else:
        raise FileNotFoundError(f"no such history file or directory: {root}")
    results: list[ReplayResult] = []
    failures: list[tuple[Path, str]] = []
    for file in files:
        try:
            events = decode_history_file(file.read_bytes())
        except ValueError as e:
            failures.append((file, str(e)))
            continue
        start = next((e for e in events if isinstance(e, RunStarted)), None)
        if start is None:
            failures.append((file, "no run.started.v1 event: not the history of a run"))
            continue
        agent = by_name.get(start.agent)
        if agent is None:
            known = ", ".join(sorted(by_name)) or "none"
            failures.append((file, f"run {start.run_id}: agent {start.agent!r} (given: {known})"))
            continue
        result = replay_run(agent, events)
        if result.ok:
            results.append(result)
        else:
            failures.append((file, f"run {result.run_id} ({result.agent}) {result.describe()}"))
    if failures:
        raise ReplayFailed(failures)
    return results


def _agents(agents: Agents) -> list[Agent[Any, Any]]:
    if isinstance(agents, Agent):
        return [agents]
    if isinstance(agents, ModuleType):
        return [v for v in vars(agents).values() if isinstance(v, Agent)]
    found = list(agents)
    for a in found:
        if not isinstance(a, Agent):
            raise TypeError(f"not an agent: {a!r} (give a module, an Agent or Agents)")
    return found
