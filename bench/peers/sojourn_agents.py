"""The sojourn agents of bench.peers: the throughput workloads (named ``chain`` and ``single``,
the names bench/foundation.py's ``SojournBench`` starts, but with the peers' trivial step:
its input + 1) and the kill workload (``peer_slow``), which worker processes load with
``python -m tests.apps.run_worker URL PREFIX bench.peers.sojourn_agents``."""

from __future__ import annotations

from sojourn.actors import Context, agent

from .common import ainc, mark, slow_step


@agent("chain")
async def chain(ctx: Context, n: int) -> int:
    x = 0
    for _ in range(n):
        x = await ctx.step(ainc, x)
    return x


@agent("single")
async def single(ctx: Context) -> int:
    return await ctx.step(ainc, 0)


@agent("peer_slow")
async def peer_slow(ctx: Context, spec: list[str | int | float]) -> int:
    run, steps, seconds = str(spec[0]), int(spec[1]), float(spec[2])
    mark("enter", run, 0)
    x = 0
    for i in range(steps):
        x = await ctx.step(slow_step, run, i, seconds)
    return x
