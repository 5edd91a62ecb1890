"""The Restate service of bench.peers (imported only in the service processes): ``chain``
(N trivial steps), ``one`` (1 step) and ``slow`` (the kill workload), each step a
``ctx.run_typed``."""

from __future__ import annotations

from typing import Any

import restate

from .common import ainc, mark, slow_step

svc = restate.Service("peers")


@svc.handler()
async def chain(ctx: restate.Context, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.run_typed("inc", ainc, x=x)
    return x


@svc.handler()
async def one(ctx: restate.Context) -> int:
    return await ctx.run_typed("inc", ainc, x=0)


@svc.handler()
async def slow(ctx: restate.Context, spec: list[Any]) -> int:
    run, steps, seconds = str(spec[0]), int(spec[1]), float(spec[2])
    mark("enter", run, 0)
    x = 0
    for i in range(steps):
        x = await ctx.run_typed("slow", slow_step, run=run, index=i, seconds=seconds)
    return x


app = restate.app([svc])
