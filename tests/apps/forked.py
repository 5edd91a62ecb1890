"""An agent of ten steps for the fork tests (``tests/actors/agents/test_fork.py``).

Every step records its execution as a row in a SQLite database the test owns (path in
``$SOJOURN_TEST_FORK_DB``): how often each position ran, for which run, at which attempt.
The step at position 7 has a bug while the file named by ``$SOJOURN_TEST_FORK_BUG`` exists:
it raises a ``TerminalError`` (never retried), which fails the run. Deleting the file is the
"code fix": a worker reads it on every execution.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sojourn.actors import Context, TerminalError, agent, current_step

BUGGY = 7
"""The position of the step with the bug."""


def _record() -> None:
    info = current_step()
    with sqlite3.connect(os.environ["SOJOURN_TEST_FORK_DB"], timeout=30) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS effects (run TEXT, position INTEGER, attempt INTEGER)"
        )
        db.execute(
            "INSERT INTO effects VALUES (?, ?, ?)", (info.run_id, info.position, info.attempt)
        )


def work(i: int, tag: str) -> str:
    """One step: its effect is recorded first, then the bug (at ``BUGGY``) may strike."""
    _record()
    if i == BUGGY and Path(os.environ["SOJOURN_TEST_FORK_BUG"]).exists():
        raise TerminalError(f"bug in step {i}")
    return f"{tag}:{i}"


@agent("ten")
async def ten(ctx: Context, tag: str) -> list[str]:
    """Ten steps, one after the other; the fork tests signal-free, input ``tag``."""
    out = []
    for i in range(10):
        out.append(await ctx.step(work, i, tag))
    return out


@agent("waiter")
async def waiter(ctx: Context, tag: str) -> list[str]:
    """Three steps, then a wait for the signal ``go``, then one more step with its payload:
    a run that stays live (to fork while it waits) and whose fork may start with the signal."""
    out = [await ctx.step(work, i, tag) for i in range(3)]
    go = await ctx.wait_for("go", timeout=3600)
    out.append(await ctx.step(work, 3, str(go)))
    return out
