"""Ending tasks a stopping process cancelled, for every layer above the broker (the worker,
the projector, the test kit): cancelled, waited for within a bound, and cancelled again while
one goes on. Not NATS: it is here because ``broker/`` is the one layer below both ``actors/``
and ``projections/``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final

__all__ = [
    "KILL_REAP",
    "RECANCEL_EVERY",
    "STOP_GRACE",
    "cancel_and_wait",
    "reap",
    "settle_cancelled",
]

log = logging.getLogger("sojourn.tasks")


RECANCEL_EVERY: Final = 0.5
"""Seconds between the cancels of a task that has not ended yet: in Python 3.11 a cancel can
be swallowed inside a library (``asyncio.wait_for`` returns a result that raced it), and a
loop that swallowed one goes on until it is cancelled again. Long enough for the clean-up a
cancel starts (a hand-back, a last write) to finish before the next cancel lands in it."""

STOP_GRACE: Final = 2.0
"""Seconds a stop waits, unless told otherwise, for a task it cancelled to end."""


async def settle_cancelled(tasks: Iterable[asyncio.Task[Any]], grace: float) -> None:
    """Cancel tasks and wait for them to end, at most ``grace`` seconds, cancelling again
    every ``RECANCEL_EVERY`` one that goes on (a swallowed cancel): a stop never waits forever
    for a task. One still running after ``grace`` is logged and left."""
    everyone = set(tasks)
    pending = {t for t in everyone if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while pending:
        left = deadline - loop.time()
        if left <= 0:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(left, RECANCEL_EVERY))
    for t in pending:
        log.warning("task %s did not end within %.0fs of being cancelled", t.get_name(), grace)
    for t in everyone - pending:
        if not t.cancelled():
            t.exception()  # retrieved: not reported as never retrieved


async def cancel_and_wait(task: asyncio.Task[Any] | None, grace: float = STOP_GRACE) -> bool:
    """``settle_cancelled`` for one task (``None``: nothing to do); whether it ended."""
    if task is None:
        return True
    await settle_cancelled((task,), grace)
    return task.done()


KILL_REAP: Final = 30.0
"""Seconds ``reap`` goes on cancelling the tasks of a killed worker that have not ended."""

_REAPERS: set[asyncio.Task[None]] = set()


def reap(tasks: Iterable[asyncio.Task[Any]], grace: float = KILL_REAP) -> None:
    """Cancel tasks now and, in the background, again until they end (``settle_cancelled``,
    at most ``grace`` seconds): for a kill, which cannot wait. A task that swallowed the first
    cancel would otherwise go on in a worker that is meant to be dead (running a step body
    again, counting as executing) where a SIGKILL leaves nothing."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    reaper = asyncio.get_running_loop().create_task(
        settle_cancelled(tasks, grace), name="sojourn-reaper"
    )
    _REAPERS.add(reaper)
    reaper.add_done_callback(_REAPERS.discard)
