"""The agent of the takeover tests: many short steps, so a run is always between two steps or
inside one when its worker dies, and its next recorded step shows when it was taken over."""

from __future__ import annotations

import asyncio
import os

from sojourn.actors import Context, agent


async def tick(i: int) -> int:
    await asyncio.sleep(float(os.environ.get("SOJOURN_TICK", "0.2")))
    return i


@agent("takeover")
async def takeover(ctx: Context, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step(tick, i)
    return total


async def hold(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@agent("long_step")
async def long_step(ctx: Context, seconds: float) -> float:
    """One step that takes ``seconds``: a run that is executing for all that time."""
    return await ctx.step(hold, seconds)
