"""Agents with durable waits, for tests that run workers in their own processes.

Steps append ``<event> <step> <idempotency key> <attempt>`` lines to ``$SOJOURN_TEST_LOG`` (when
set), so a test can count how often each step body ran, across processes and crashes.
``$SOJOURN_SLOW_STEP`` sets how long the ``slow`` step takes (the window to kill a worker in).
"""

from __future__ import annotations

import os
import time

from sojourn.actors import Context, agent, current_step


def _log(event: str) -> None:
    path = os.environ.get("SOJOURN_TEST_LOG")
    if not path:
        return
    info = current_step()
    with open(path, "a") as f:
        f.write(f"{event} {info.name} {info.idempotency_key} {info.attempt}\n")
        f.flush()
        os.fsync(f.fileno())


def after_nap(tag: str) -> str:
    _log("exec")
    return f"woke {tag}"


def slow(n: int) -> int:
    """Announces itself, then takes a while."""
    _log("exec")
    deadline = time.monotonic() + float(os.environ.get("SOJOURN_SLOW_STEP", "3"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _log("done")
    return n


def times(a: int, b: int) -> int:
    _log("exec")
    return a * b


@agent("napper")
async def napper(ctx: Context, seconds: float) -> str:
    """Sleeps durably for ``seconds``, then runs one step."""
    await ctx.sleep(seconds)
    return await ctx.step(after_nap, "up")


@agent("gated_kid")
async def gated_kid(ctx: Context, n: int) -> int:
    """A child that waits for the signal ``go`` (an int) and returns ``n * go``."""
    factor = await ctx.wait_for("go", type=int)
    assert factor is not None  # no timeout: the wait ends only with the signal
    return await ctx.step(times, n, factor)


@agent("guardian")
async def guardian(ctx: Context, n: int) -> int:
    """Starts a ``gated_kid`` child, runs a slow step, then waits for the child's result."""
    handle = await ctx.start_child("gated_kid", n)
    await ctx.step(slow, n)
    result: int = await handle.result(type=int)
    return result
