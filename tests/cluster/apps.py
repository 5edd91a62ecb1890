"""The agent of the cluster tests: a few slow steps, each leaving a line in a log file
(``$SOJOURN_TEST_LOG``), so a test counts how often each step body ran across node kills."""

from __future__ import annotations

import asyncio
import os

from sojourn.actors import Context, agent, current_step


def _record() -> None:
    info = current_step()
    with open(os.environ["SOJOURN_TEST_LOG"], "a") as f:
        f.write(f"exec {info.run_id} {info.position} {info.idempotency_key} {info.attempt}\n")


async def tick(i: int) -> int:
    """Records that it ran (with its idempotency key), then takes a moment: runs stay in
    flight long enough for a node to die under them."""
    _record()
    await asyncio.sleep(float(os.environ.get("SOJOURN_TICK", "0.3")))
    return i


@agent("clustered")
async def clustered(ctx: Context, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step(tick, i)
    return total
