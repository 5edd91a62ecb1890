"""Shared rate limits under the testing kit's virtual time (decision 0046): runs of a limit of one
request a minute take their slots a virtual minute apart, and the test waits none of it."""

from __future__ import annotations

import itertools

import pytest

from sojourn.actors import Context, Limit, agent, step
from sojourn.actors.testing import SojournEnv
from sojourn.schemas.events import StepStarted


@step(limit="slow")
async def call() -> int:
    return 1


@agent("vt-limited", limits={"slow": Limit(requests="1/min")})
async def vt(ctx: Context) -> int:
    return await ctx.step(call)


@pytest.mark.usefixtures("processes")
async def test_virtual_time_skips_a_limits_waits() -> None:
    async with SojournEnv([vt]) as env:
        ids = [await env.start(vt) for _ in range(5)]
        for r in ids:
            assert await env.result(r, timeout=60) == 1
        slots: list[float] = []
        for r in ids:
            slots += [
                e.slot
                for e in await env.history(r)
                if isinstance(e, StepStarted) and e.slot is not None
            ]
        slots.sort()
        assert all(b - a >= 60 - 1e-6 for a, b in itertools.pairwise(slots))
