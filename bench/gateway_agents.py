"""The agents ``python -m bench.gateway`` drives, in a module of their own so that the worker
process (``python -m tests.apps.run_worker URL PREFIX bench.gateway_agents``) imports them
without the bench's HTTP client code."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from sojourn.actors import Context, agent

ONE_STEP = "gw_one"
FANOUT = "gw_fanout"


async def _once(_input: Any) -> int:
    return 1


@agent(ONE_STEP)
async def gw_one(ctx: Context, value: Any) -> int:
    """A 1-step run: what a start -> completed round trip is measured with."""
    return await ctx.step(_once, value)


class FanoutPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How one fan-out run streams: after ``phase`` seconds, ``chunks`` chunks ``gap`` apart.
    The bench gives each run its own phase, so the runs' chunks are spread over each gap rather
    than written in bursts."""

    chunks: int
    gap: float
    phase: float = 0.0


@agent(FANOUT)
async def gw_fanout(ctx: Context, plan: FanoutPlan) -> int:
    """Waits for the signal ``go`` (parked: the bench opens every watcher first), then one step
    streams ``plan.chunks`` timestamped chunks."""

    async def speak() -> int:
        await asyncio.sleep(plan.phase)
        for i in range(plan.chunks):
            # The text is the writer's clock just before the publish (the chunk's own ``at``
            # stamp is taken a moment later, inside ctx.stream): a watcher's lag is its
            # receive time minus either; both are this machine's clock.
            await ctx.stream(f"{time.time():.6f}")
            if i + 1 < plan.chunks:
                await asyncio.sleep(plan.gap)
        return plan.chunks

    await ctx.wait_for("go")
    return await ctx.step(speak)
