"""Closing the process resources a stopping worker held (``on_stop``: MCP sessions and their
servers). Ending the tasks a stop cancels is ``sojourn.broker.tasks``."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable

__all__ = ["close_resources", "on_stop"]

log = logging.getLogger("sojourn.worker")


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
