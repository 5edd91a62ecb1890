"""Variants files for ``python -m bench.paired``: each puts variant A's or B's code in place
(``toggle(side)``). These add CPU at one point of a 1-step run's path (``busier``), to see
what the run pays there."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any


def spin(seconds: float) -> None:
    """Keep this thread's CPU busy for ``seconds``."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def busier(fn: Callable[..., Any], seconds: float = 100e-6) -> Callable[..., Any]:
    """``fn`` (a function or a coroutine function) spending ``seconds`` of CPU more as it
    begins."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def busy_async(*args: Any, **kwargs: Any) -> Any:
            spin(seconds)
            return await fn(*args, **kwargs)

        return busy_async

    @functools.wraps(fn)
    def busy(*args: Any, **kwargs: Any) -> Any:
        spin(seconds)
        return fn(*args, **kwargs)

    return busy
