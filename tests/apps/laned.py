"""Agents for priority and fairness tests (decision 0049), run in-process: ``laned`` records
the order its steps begin in (``BEGUN``) and takes ``seconds`` each; ``laned_parent`` starts a
``laned`` child and then sleeps, so its child's start and its own timer show their lane."""

from __future__ import annotations

import asyncio

from sojourn.actors import Context, agent

BEGUN: list[str] = []
"""Run ids, in the order their step began (the test clears it)."""


async def _work(run_id: str, seconds: float) -> None:
    BEGUN.append(run_id)
    await asyncio.sleep(seconds)


@agent("laned")
async def laned(ctx: Context, seconds: float) -> float:
    await ctx.step(_work, ctx.run_id, seconds)
    return seconds


@agent("laned_parent")
async def laned_parent(ctx: Context, sleep: float) -> float:
    got: float = await ctx.child("laned", 0.0, type=float)
    await ctx.sleep(sleep)
    return got
