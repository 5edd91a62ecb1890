"""Ending tasks a stopping process cancelled: waited for, within a bound; and closing the
process resources a stopping worker held (``on_stop``: MCP sessions and their servers)."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

__all__ = ["close_resources", "on_stop", "settle_cancelled"]

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


Closer = Callable[[], Awaitable[None]]

_CLOSERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Closer]] = (
    weakref.WeakKeyDictionary()
)


def on_stop(close: Closer) -> None:
    """Have ``close()`` awaited when a worker of the running event loop stops (a process
    resource its runs opened: an MCP session, whose stdio server process ends with it). It
    stays registered: every stop closes it again, and it may have been reopened since."""
    closers = _CLOSERS.setdefault(asyncio.get_running_loop(), [])
    if close not in closers:
        closers.append(close)


async def close_resources(grace: float) -> None:
    """Close the running loop's process resources (``on_stop``), each within ``grace``."""
    for close in list(_CLOSERS.get(asyncio.get_running_loop(), ())):
        try:
            async with asyncio.timeout(grace):
                await close()
        except Exception as e:  # a stop goes on whatever a resource does
            log.warning("closing %r on stop: %r", close, e)
