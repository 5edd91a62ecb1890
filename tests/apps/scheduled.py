"""Agents for schedule tests, run in worker processes: each run appends a line to the file in
$SOJOURN_TEST_LOG when its step executes, so a test sees what really ran."""

from __future__ import annotations

import asyncio
import os
import time

from sojourn.actors import Context, agent


def _log(line: str) -> None:
    with open(os.environ["SOJOURN_TEST_LOG"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@agent("ticker")
async def ticker(ctx: Context, n: int) -> float:
    """One step that records the run, its fire time and when it ran."""
    at = ctx.scheduled_at
    assert at is not None and ctx.schedule is not None

    def note() -> float:
        _log(f"exec {ctx.run_id} {at.timestamp():.0f} {time.time():.3f}")
        return at.timestamp()

    return await ctx.step(note)


@agent("slowpoke")
async def slowpoke(ctx: Context, seconds: float) -> str:
    """Takes ``seconds`` in a step: longer than its schedule's interval."""

    async def work() -> str:
        _log(f"begin {ctx.run_id} {time.time():.3f}")
        await asyncio.sleep(seconds)
        _log(f"end {ctx.run_id} {time.time():.3f}")
        return "done"

    return await ctx.step(work)
