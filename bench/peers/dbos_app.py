"""The DBOS process of bench.peers (imported only in it): async ``@DBOS.workflow``s whose steps
are async ``@DBOS.step``s, on the Postgres system database given on the command line.

``python -m bench.peers.dbos_app bench URL JSON`` runs the throughput workloads in this process
(DBOS is a library: the application starts its workflows and awaits their results itself) and
prints ``result {...}``. ``python -m bench.peers.dbos_app serve URL`` launches DBOS (which
recovers this executor's pending workflows) and then obeys stdin lines: ``slow RUN STEPS
SECONDS`` starts the kill workload with workflow id RUN; ``result RUN`` prints ``done RUN`` once
that workflow has a result.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from bench.util import pct

from .common import ainc, app_main, mark, repeated, slow_step


@DBOS.step()
async def inc(x: int) -> int:
    return await ainc(x)


@DBOS.workflow()
async def chain(n: int) -> int:
    x = 0
    for _ in range(n):
        x = await inc(x)
    return x


@DBOS.workflow()
async def one() -> int:
    return await inc(0)


@DBOS.step()
async def slow_dbos_step(run: str, index: int, seconds: float) -> int:
    return await slow_step(run, index, seconds)


@DBOS.workflow()
async def slow(run: str, steps: int, seconds: float) -> int:
    mark("enter", run, 0)
    x = 0
    for i in range(steps):
        x = await slow_dbos_step(run, i, seconds)
    return x


def configure(url: str) -> None:
    config: DBOSConfig = {"name": "peers", "system_database_url": url}
    DBOS(config=config)


async def run_chain(n: int) -> int:
    h = await DBOS.start_workflow_async(chain, n)
    return int(await h.get_result())


async def bench(url: str, spec: dict[str, Any]) -> dict[str, float]:
    configure(url)
    DBOS.launch()

    async def seq(n: int) -> float:
        t0 = time.perf_counter()
        assert await run_chain(n) == n
        return (time.perf_counter() - t0) / n

    async def conc(runs: int, m: int) -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(run_chain(m) for _ in range(runs)))
        return runs * m / (time.perf_counter() - t0)

    async def lat(k: int) -> float:
        xs = []
        for _ in range(k):
            await asyncio.sleep(spec["latency_gap"])
            t0 = time.perf_counter()
            h = await DBOS.start_workflow_async(one)
            await h.get_result()
            xs.append(time.perf_counter() - t0)
        return pct(xs, 50)

    figures = await repeated(seq, conc, lat, spec)
    DBOS.destroy()
    return figures


async def serve(url: str) -> None:
    print(f"imported {time.time():.6f}", flush=True)
    configure(url)
    DBOS.launch()
    print("ready", flush=True)
    tasks: set[asyncio.Task[None]] = set()

    async def result(run: str) -> None:
        await DBOS.get_result_async(run)
        print(f"done {run}", flush=True)

    while line := await asyncio.to_thread(sys.stdin.readline):
        cmd, run, *rest = line.split()
        if cmd == "slow":
            with SetWorkflowID(run):
                await DBOS.start_workflow_async(slow, run, int(rest[0]), float(rest[1]))
        elif cmd == "result":
            t = asyncio.create_task(result(run))
            tasks.add(t)
            t.add_done_callback(tasks.discard)


if __name__ == "__main__":
    app_main(bench, serve)
