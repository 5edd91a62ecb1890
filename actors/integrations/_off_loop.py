"""Run an agent framework's coroutine to its end on a private event loop, in a thread of its
own: for ``sojourn replay`` and the golden-history tests, which drive agent code by hand with
no event loop, while a framework (Pydantic AI, the OpenAI Agents SDK, LangGraph) needs one."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, cast

__all__ = ["REPLAY_TIMEOUT", "off_loop"]

R = TypeVar("R")

REPLAY_TIMEOUT = 60.0
"""Seconds a replay-only run of the framework may take before it is reported as awaiting
something that never comes."""


def off_loop(run: Callable[[], Coroutine[Any, Any, R]]) -> R:
    """Run ``run()`` to its end on an event loop of its own, in a thread of its own, and
    return its result (or raise what it raised, the replay's control flow included). Nothing
    in it does I/O: the replay's context refuses it."""
    context = contextvars.copy_context()
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(context.run(asyncio.run, _bounded(run())))
        except BaseException as e:  # the replay's control flow (frontier, park) included
            outcome.append(_Raised(e))

    thread = threading.Thread(target=target, name="sojourn-framework-replay", daemon=True)
    thread.start()
    thread.join()
    (got,) = outcome
    if isinstance(got, _Raised):
        raise got.error
    return cast(R, got)


async def _bounded(coro: Coroutine[Any, Any, R]) -> R:
    return await asyncio.wait_for(coro, REPLAY_TIMEOUT)


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException
