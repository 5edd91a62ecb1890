"""Ending tasks a stopping process cancelled: waited for, within a bound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["settle_cancelled"]

log = logging.getLogger("sojourn.worker")


async def settle_cancelled(tasks: Iterable[asyncio.Task[Any]], grace: float) -> None:
    """Wait for cancelled tasks to end, at most ``grace`` seconds: a cancel can be swallowed
    inside a library (``asyncio.wait_for`` in Python 3.11 may return a result that raced it),
    and a stop must not wait forever for such a task. One still running is logged and left."""
    pending = [t for t in tasks if not t.done()]
    if not pending:
        return
    _, still = await asyncio.wait(pending, timeout=grace)
    for t in still:
        log.warning("task %s did not end within %.0fs of being cancelled", t.get_name(), grace)
    for t in pending:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: not reported as never retrieved
