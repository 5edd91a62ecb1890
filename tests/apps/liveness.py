"""Agents for the liveness tests (workers in their own processes, really stopped and killed)."""

from __future__ import annotations

import time

from sojourn.actors import Context, agent, current_step, heartbeat


def long_task(n: int) -> int:
    """The first attempt runs until its process is killed (it reports progress as it goes); a
    re-run after the crash finishes at once."""
    if current_step().attempt > 1:
        return n
    started = time.monotonic()
    while True:
        heartbeat({"done": int(time.monotonic() - started)})
        time.sleep(0.1)


@agent("longstep")
async def longstep(ctx: Context, n: int) -> int:
    return await ctx.step(long_task, n)
