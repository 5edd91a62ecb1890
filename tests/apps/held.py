"""The agent of the agent-hold tests: steps that write each execution to a file the test owns
(``$SOJOURN_TEST_EFFECTS``), and one that blocks until the test creates ``$SOJOURN_TEST_GATE``,
so its worker can be killed in the middle of it."""

from __future__ import annotations

import asyncio
import os

from sojourn.actors import Context, agent


def _effect(run_id: str, name: str) -> None:
    with open(os.environ["SOJOURN_TEST_EFFECTS"], "a") as f:
        f.write(f"{run_id} {name}\n")


async def quick(run_id: str, name: str) -> str:
    _effect(run_id, name)
    return name


async def gated(run_id: str, name: str) -> str:
    _effect(run_id, name)
    gate = os.environ["SOJOURN_TEST_GATE"]
    while not os.path.exists(gate):  # noqa: ASYNC110, ASYNC240 (another process opens it)
        await asyncio.sleep(0.02)
    return name


@agent("held")
async def held(ctx: Context, gate: bool) -> list[str]:
    run_id = ctx.run_id
    out = [await ctx.step(quick, run_id, "a")]
    out.append(await ctx.step(gated if gate else quick, run_id, "b"))
    out.append(await ctx.step(quick, run_id, "c"))
    return out
